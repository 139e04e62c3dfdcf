"""docs/code-layout.md names every source file of the package, and only files that exist.

The page has a section per folder of ``src/redlease`` (its heading names the
folder, ``### Locks: `src/redlease/_locks/```) and in each a table whose first
column names files relative to it: ``lock.py``, ``_cli/demo.py``, or a
shorthand for the previous name's stem or folder (``_conn.pxi``, ``.pxd``;
``_testing/_common.py``, ``_cluster_nodes.py``). A source file added without a
line there, or a line left behind by a rename, fails here. So does a path in a
"where to look first" table that matches nothing.
"""

from __future__ import annotations

import re
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "code-layout.md"
PACKAGE = ROOT / "src" / "redlease"
SOURCE_SUFFIXES = frozenset({".py", ".pyx", ".pxi", ".pxd", ".pyi", ".h"})

HEADING = re.compile(r"^#{2,3} ")
CODE = re.compile(r"`([^`]+)`")


def source_files() -> set[str]:
    """Every source file of the package as a path under ``src/redlease`` (generated C aside)."""
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*")
        if p.is_file() and p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts
    }


def sections(text: str) -> list[tuple[str, list[str]]]:
    """Each section's heading and its lines."""
    found: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines():
        if HEADING.match(line):
            found.append((line, []))
        else:
            found[-1][1].append(line)
    return found


def folders(heading: str) -> list[str]:
    """The package folders a heading names (``src/redlease/_cli/`` -> ``_cli``), top one ``""``."""
    return [
        name.removeprefix("src/redlease").strip("/")
        for name in CODE.findall(heading)
        if name.startswith("src/redlease")
    ]


def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def file_rows(lines: list[str]) -> list[list[str]]:
    """The rows of the file tables (headed ``| file | its one job |``), header and rule aside."""
    found = []
    header: str | None = None
    for line in lines:
        if not line.startswith("|"):
            header = None
        elif header is None:
            header = cells(line)[0]
        elif header == "file" and not set(cells(line)[0]) <= set("-: "):
            found.append(cells(line))
    return found


def named_files(cell: str, folder: str) -> list[str]:
    """The files a first cell names, as paths under ``src/redlease``.

    ``.pxd`` after ``_conn.pxi`` is ``_conn.pxd``; a bare name after one with a
    folder (``_cluster_nodes.py`` after ``_testing/_common.py``) is in that folder.
    """
    found: list[str] = []
    previous: PurePosixPath | None = None
    for name in CODE.findall(cell):
        if name.startswith(".") and previous is not None:
            path = previous.with_suffix(name)
        elif "/" not in name and previous is not None and previous.parent.name:
            path = previous.parent / name
        else:
            path = PurePosixPath(folder) / name
        found.append(path.as_posix())
        previous = path
    return found


def documented_files() -> dict[str, str]:
    """Each file the page's file tables name, with the heading it is under."""
    found: dict[str, str] = {}
    for heading, lines in sections(PAGE.read_text()):
        names = folders(heading)
        if not names:
            continue
        # A section of two folders (the tooling's) names its files with their folder.
        folder = names[0] if len(names) == 1 else ""
        for row in file_rows(lines):
            for path in named_files(row[0], folder):
                found.setdefault(path, heading)
    return found


def where_to_look_paths() -> list[str]:
    """The paths in the second column of the "where to look first" table."""
    text = PAGE.read_text()
    start = text.index("| for | look in |")
    table = text[start:].split("\n\n", 1)[0]
    found = []
    for line in table.splitlines()[2:]:
        found += [
            name
            for name in CODE.findall(cells(line)[1])
            if "/" in name or PurePosixPath(name).suffix in (*SOURCE_SUFFIXES, ".lua")
        ]
    return found


def test_every_source_file_of_the_package_has_a_line() -> None:
    # A folder's own line (``_cli/``: "the command line (below)") covers none of its files.
    missing = sorted(source_files() - documented_files().keys())
    assert not missing, "files docs/code-layout.md does not name:\n" + "\n".join(missing)


def test_every_file_the_page_names_exists() -> None:
    stale = sorted(
        f"{path} (under {heading!r})"
        for path, heading in documented_files().items()
        if not (PACKAGE / path).exists()
    )
    assert not stale, "docs/code-layout.md names files that do not exist:\n" + "\n".join(stale)


def test_every_place_to_look_first_exists() -> None:
    def exists(name: str) -> bool:
        """Somewhere in the package (a folder's own name may be left out), or in the checkout."""
        pattern = name.rstrip("/")
        return any(any(base.glob(pattern)) for base in (PACKAGE, ROOT)) or any(
            PACKAGE.rglob(pattern)
        )

    stale = sorted(name for name in where_to_look_paths() if not exists(name))
    assert not stale, "places to look first that match nothing:\n" + "\n".join(stale)


def test_the_check_reads_the_shorthands() -> None:
    assert named_files("`_conn.pxi`, `.pxd`", "_engine/_native") == [
        "_engine/_native/_conn.pxi",
        "_engine/_native/_conn.pxd",
    ]
    assert named_files("`_testing/_common.py`, `_cluster_nodes.py`", "") == [
        "_testing/_common.py",
        "_testing/_cluster_nodes.py",
    ]
    assert named_files("`election.py`", "_election") == ["_election/election.py"]
    assert folders("### Locks: `src/redlease/_locks/`") == ["_locks"]
    assert folders("## Tooling: `src/redlease/_cli/` and `src/redlease/_testing/`") == [
        "_cli",
        "_testing",
    ]
