"""The tooling uses the library the way its users do.

The command line (``redlease._cli``) and the benchmarks may use the public API
and, besides, the tooling's own helpers: the redis-server manager
(``redlease._testing``), the key schema (``redlease._keys``), the Lua scripts
(``redlease._scripts``) and the command's package itself (``redlease._cli``).
The examples use the public API only. No tooling reads a private attribute of
an object it did not define (``elector._run``). The exceptions are
``benchmarks/bench_native_writes.py`` and ``benchmarks/bench_tls.py``, which
measure the native core itself and so import ``redlease._engine``, and
``benchmarks/bench_aio_writes.py``, which sets the engine's write pool size to
measure what it is worth.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "src" / "redlease" / "_cli"

TOOLING_HELPERS = ("redlease._testing", "redlease._keys", "redlease._scripts", "redlease._cli")
ALLOWED: dict[str, tuple[str, ...]] = {
    "cli": TOOLING_HELPERS,
    "benchmarks": TOOLING_HELPERS,
    "examples": (),
}
EXCEPTIONS = {
    "benchmarks/bench_native_writes.py": ("redlease._engine",),
    "benchmarks/bench_tls.py": ("redlease._engine",),
    "benchmarks/bench_aio_writes.py": ("redlease._engine",),
}
# Private attributes a benchmark may read, and why: a lock's renew lateness
# has no public reader (an elector's has, ``renew_lateness()``).
ATTRIBUTE_EXCEPTIONS = {
    "benchmarks/many_leases.py": ("lock._keeper",),
}


def tooling_files() -> list[tuple[str, Path]]:
    files = [("cli", p) for p in sorted(CLI.glob("*.py"))]
    files += [("benchmarks", p) for p in sorted((ROOT / "benchmarks").glob("*.py"))]
    files += [("examples", p) for p in sorted((ROOT / "examples").glob("*.py"))]
    return files


def is_private(module: str) -> bool:
    """``redlease.<...>`` with a component starting with ``_`` (dunders aside)."""
    parts = module.split(".")
    return parts[0] == "redlease" and any(
        part.startswith("_") and not part.startswith("__") for part in parts[1:]
    )


def imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """Every module an import names (``from M import n``: ``M`` and ``M.n``), resolved."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def names_bound_from(tree: ast.AST, modules: tuple[str, ...]) -> set[str]:
    """Local names that ``from M import x [as y]`` binds for a module M in ``modules``."""
    bound = set()
    for node in ast.walk(tree):
        module = node.module if isinstance(node, ast.ImportFrom) else None
        if module and any(module == m or module.startswith(m + ".") for m in modules):
            assert isinstance(node, ast.ImportFrom)
            bound.update(alias.asname or alias.name for alias in node.names)
    return bound


def private_attribute_reads(
    tree: ast.AST, exempt: set[str] | frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or an exempt name."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (
                isinstance(node.value, ast.Name)
                and (node.value.id in ("self", "cls") or node.value.id in exempt)
            )
        ):
            found.append((node.lineno, ast.unparse(node)))
    return found


@pytest.mark.parametrize(
    ("kind", "path"), tooling_files(), ids=[str(p.relative_to(ROOT)) for _, p in tooling_files()]
)
def test_tooling_reaches_the_library_through_its_public_api(kind: str, path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    relative = str(path.relative_to(ROOT))
    allowed = ALLOWED[kind] + EXCEPTIONS.get(relative, ())

    private = [
        f"{relative}:{line}: {module}"
        for line, module in imported_modules(tree, "redlease._cli")
        if is_private(module)
        and not any(module == a or module.startswith(a + ".") for a in allowed)
    ]
    # A file allowed to measure a private module may use that module's own names.
    exempt = names_bound_from(tree, EXCEPTIONS.get(relative, ()))
    private += [
        f"{relative}:{line}: {text}"
        for line, text in private_attribute_reads(tree, exempt)
        if text not in ATTRIBUTE_EXCEPTIONS.get(relative, ())
    ]

    assert private == []


def test_the_boundary_check_sees_what_it_is_for(tmp_path: Path) -> None:
    source = (
        "from redlease._engine import native_available\n"
        "from .. import _elector\n"
        "from .. import _keys, __version__\n"
        "late = elector._run.keeper.lateness()\n"
        "self._mine = 1\n"
    )
    tree = ast.parse(source)

    modules = [m for _, m in imported_modules(tree, "redlease._cli") if is_private(m)]
    assert "redlease._engine" in modules and "redlease._elector" in modules
    assert "redlease._keys" in modules and "redlease.__version__" not in modules
    assert [text for _, text in private_attribute_reads(tree)] == ["elector._run"]
