"""What this process holds, for the soak scripts: threads, open fds and RSS."""

from __future__ import annotations

import gc
import os

PAGE = os.sysconf("SC_PAGE_SIZE")


def snapshot() -> tuple[int, int, float]:
    """``(threads, fds, RSS MiB)`` after a collection (native threads counted too)."""
    gc.collect()
    fds = len(os.listdir("/proc/self/fd"))
    tasks = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as f:
        rss_mib = int(f.read().split()[1]) * PAGE / 2**20
    return tasks, fds, rss_mib
