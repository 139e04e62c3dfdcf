"""Looking for processes a test started and expects gone (embedded redis-servers)."""

from __future__ import annotations

from pathlib import Path


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain ``text`` (pytest's own left out)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(cmdline)
    return found
