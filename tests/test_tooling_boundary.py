"""The tooling uses the library the way its users do, and the library keeps its shape.

The command line (``redlease._cli``) and the benchmarks may use the public API
and, besides, the tooling's own helpers: the redis-server manager
(``redlease._testing``), the key schema (``redlease._keys``), the Lua scripts
(``redlease._scripts``) and the command's package itself (``redlease._cli``).
The examples use the public API only. No tooling reads a private attribute of
an object it did not define (``elector._run``). The exceptions are
``benchmarks/bench_native_writes.py`` and ``benchmarks/bench_tls.py``, which
measure the native core itself and so import ``redlease._engine``, and
``benchmarks/bench_aio_writes.py``, which sets the engine's write pool size to
measure what it is worth, and ``benchmarks/aio_instructions.py``, which says
whether the asyncio writer it counts is the compiled one.

Inside ``src/redlease`` (the second half of this file): no import cycle, every
import points down the layers (faces, rooms, support, engine, leaves) and no
room imports another, at most 14 modules at the package top, no engine
importing above ``_engine`` but a few leaf modules, no library module
importing the tooling, no room touching another room's private names; each
with an exact list of what is still wrong today.
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
    "benchmarks/aio_instructions.py": ("redlease._engine",),
}
# Private attributes a benchmark may read, and why: a lock's renew lateness
# has no public reader (an elector's has, ``renew_lateness()``), nor which
# connections an engine's renewer holds on each master of a cluster (read
# through the shells' one internal attribute, ``_core``).
ATTRIBUTE_EXCEPTIONS = {
    "benchmarks/many_leases.py": ("lock._keeper", "group[0]._core"),
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


# -- the library's own shape -------------------------------------------------------------
#
# The same rules hold inside ``src/redlease``, so that its layering stays
# visible as the code grows: no import cycle (lazy and type-only imports
# count too), an engine never reaches up into the modules that use it, the
# tooling is never imported by the library, no module touches another's
# private names, and no file grows past what a reader takes in at once.
# Each allowlist names what is still wrong today and why; a test fails when
# an entry no longer happens, so the lists only shrink.

SRC = ROOT / "src"
LIBRARY = SRC / "redlease"

KNOWN_CYCLES: dict[frozenset[str], str] = {}

# What ``redlease._engine`` may import from the rest of the package: leaf
# modules that import nothing of ``redlease`` but each other.
ENGINE_LEAVES: dict[str, str] = {
    "redlease._errors": "the exceptions the engines raise (ConfigError)",
    "redlease._scripts": "the Lua scripts the engines run (Script)",
    "redlease._log": "the library's logger (the notice listeners' records)",
    "redlease._version": "the version engine_info() reports beside the engine",
}

# The layers, top first: a module imports its own layer and the ones below,
# never one above; a room imports no other room. The faces are what users
# import; the rooms hold one concern each; support is what both rooms and the
# faces share; the engine keeps leases and talks to Redis; the leaves import
# nothing of the package. (The tooling, below, is checked on its own.)
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "face",
        (
            "redlease",
            "redlease.aio",
            "redlease.lock",
            "redlease.metrics",
            "redlease.otel",
            "redlease.health",
            "redlease.integrations",
        ),
    ),
    ("room", ("redlease._election", "redlease._locks")),
    ("support", ("redlease._offload", "redlease._config", "redlease._on_exit")),
    ("engine", ("redlease._engine",)),
    (
        "leaf",
        (
            "redlease._errors",
            "redlease._keys",
            "redlease._log",
            "redlease._scripts",
            "redlease._version",
        ),
    ),
)
MAX_TOP_MODULES = 14

# Modules of the tooling: the command line and the test servers. The library
# never imports them.
TOOLING = ("redlease._cli", "redlease._testing", "redlease.__main__")

# Private names of another module touched across modules: "path: text" -> why.
PRIVATE_EXCEPTIONS: dict[str, str] = {
    "redlease/metrics.py: target._core": (
        "the shells' one documented internal attribute: an Election, or a locker's LockerCore"
    ),
    "redlease/otel/_writes.py: shell._fence": (
        "a wrapped write's elector, Fencer or pipeline: its fence says whose write it is "
        "(the fence's Events: the elector's name, engine and client)"
    ),
    "redlease/health.py: elector._core": (
        "the same attribute: an elector's Election says, without a round trip, whether its run "
        "is going and when its lease was last confirmed (Election.health)"
    ),
    "redlease/_engine/notices/pynotices.py: conn._sock": (
        "redis-py >= 5 has no public 'is this connection open' (is_connected came later)"
    ),
    "redlease/_engine/conn/pyconn.py: conn._sock": "the same, for a bounded connection's socket",
    "redlease/_engine/contract/aiowriter.py: loop._thread_id": (
        "asyncio's own loops record the thread they run on there (set and cleared by "
        "run_forever); asyncio.get_running_loop() makes a getpid() system call per call on "
        "Python 3.11, once per fenced write"
    ),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(LIBRARY.rglob("*.py"))}


def import_edges(
    tree: ast.AST, name: str, is_package: bool, modules: set[str] | dict[str, Path]
) -> dict[str, int]:
    """The ``redlease`` modules ``name`` imports, each with a line it does so on.

    Every import counts, at the top or inside a function or an ``if
    TYPE_CHECKING`` block. ``from M import n`` is an edge to ``M.n`` when that is
    a module, else to ``M`` (or the nearest package above it that exists).
    """

    def existing(module: str) -> str:
        while module and module not in modules:
            module = module.rpartition(".")[0]
        return module

    package = name if is_package else name.rpartition(".")[0]
    edges: dict[str, int] = {}
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [existing(alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                targets.append(full if full in modules else existing(module))
        for target in targets:
            if target.startswith("redlease") and target != name:
                edges.setdefault(target, node.lineno)
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    modules = library_modules()
    return {
        name: import_edges(ast.parse(path.read_text()), name, path.stem == "__init__", modules)
        for name, path in modules.items()
    }


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Each set of modules that import each other (strongly connected, two or more), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.get(module, {}):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def cycle_path(graph: dict[str, dict[str, int]], group: list[str], start: str = "") -> str:
    """One way round ``group`` from ``start`` (default: its first): ``a:line -> b:line -> a``.

    Each hop names the line of its import: the shortest way back to ``start``.
    """
    start, members = start or group[0], set(group)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        module = frontier.pop(0)
        for other in sorted(graph[module]):
            if other == start:
                path = [module]
                while path[-1] != start:
                    path.append(came[path[-1]])
                path.reverse()
                hops = [f"{a}:{graph[a][b]}" for a, b in zip(path, [*path[1:], start], strict=True)]
                return " -> ".join([*hops, start])
            if other in members and other not in came and other != start:
                came[other] = module
                frontier.append(other)
    return " <-> ".join(group)


def test_no_import_cycle_among_the_library_modules() -> None:
    graph = import_graph()
    found = {frozenset(group): group for group in cycles(graph)}
    known = set().union(*KNOWN_CYCLES)
    new = []
    for members, group in found.items():
        if members not in KNOWN_CYCLES:
            # Shown through a module no known cycle has, when there is one.
            start = next((m for m in group if m not in known), group[0])
            new.append(f"{', '.join(group)}: {cycle_path(graph, group, start)}")
    gone = [", ".join(sorted(group)) for group in KNOWN_CYCLES if group not in found]
    assert not new, "import cycles:\n" + "\n".join(new)
    assert not gone, "no longer import each other, drop from KNOWN_CYCLES:\n" + "\n".join(gone)


def test_the_engines_import_nothing_above_them_but_leaf_modules() -> None:
    def in_engine(module: str) -> bool:
        return module == "redlease._engine" or module.startswith("redlease._engine.")

    graph = import_graph()
    upward = [
        (module, other, line)
        for module, edges in graph.items()
        if in_engine(module)
        for other, line in edges.items()
        if not in_engine(other)
    ]
    beyond = [f"{m}:{line} -> {o}" for m, o, line in upward if o not in ENGINE_LEAVES]
    assert not beyond, "an engine imports from above it:\n" + "\n".join(sorted(beyond))
    unused = sorted(set(ENGINE_LEAVES) - {other for _, other, _ in upward})
    assert not unused, "no engine imports these now, drop from ENGINE_LEAVES: " + ", ".join(unused)
    # A leaf stays a leaf: it imports no other module of the package but leaves.
    above = [
        f"{leaf} -> {other}"
        for leaf in ENGINE_LEAVES
        for other in sorted(graph[leaf])
        if other not in ENGINE_LEAVES
    ]
    assert not above, "an engine's leaf imports a module that is not one:\n" + "\n".join(above)


def test_the_library_never_imports_its_tooling() -> None:
    def tooling(module: str) -> bool:
        return any(module == t or module.startswith(t + ".") for t in TOOLING)

    graph = import_graph()
    found = sorted(
        f"{module} -> {other} (line {line})"
        for module, edges in graph.items()
        if not tooling(module)
        for other, line in edges.items()
        if tooling(other)
    )
    assert not found, "the library imports its tooling:\n" + "\n".join(found)


def names_defined(tree: ast.AST) -> set[str]:
    """The names a module defines for its own objects.

    Functions and classes (at any depth), module- and class-level assignments,
    ``__slots__`` entries and attributes set on ``self`` or ``cls``; not a
    name set on some other object, which would make any write legitimate.
    """
    defined: set[str] = set()

    def bodies(node: ast.AST) -> list[ast.stmt]:
        return list(getattr(node, "body", []))

    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for scope in scopes:
        for stmt in bodies(scope):
            targets: list[ast.expr] = []
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, ast.AnnAssign | ast.AugAssign):
                targets = [stmt.target]
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        defined.add(name.id)
            if isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in stmt.targets
            ):
                defined.update(
                    c.value
                    for c in ast.walk(stmt.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            defined.add(node.attr)
    return defined


def foreign_private_names(
    tree: ast.AST, room: set[str] | frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """``x._name`` (read, set or deleted; also ``getattr(x, "_name")``) of a name not defined here.

    ``x`` is anything but ``self`` or ``cls``; dunders are not private. Names
    in ``room`` (defined by the other modules of this module's room) count as
    defined here.
    """

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    defined = names_defined(tree) | room
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if private(node.attr) and node.attr not in defined:
                found.append((node.lineno, ast.unparse(node)))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and node.args[1].value not in defined
        ):
            found.append((node.lineno, f"{ast.unparse(node.args[0])}.{node.args[1].value}"))
    return found


def room_of(module: str) -> str:
    """The room a module shares its private names with (``_election``, ``_locks``), else itself.

    Elsewhere (the engine too, whose modules wrap the client libraries' own
    private names) each module keeps its own.
    """
    found = place(module)
    if found is not None and LAYERS[found[0]][0] == "room":
        return found[1]
    return module


def test_no_room_touches_another_rooms_private_names() -> None:
    modules = library_modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in modules.items()}
    rooms: dict[str, set[str]] = {}
    for name, tree in trees.items():
        rooms.setdefault(room_of(name), set()).update(names_defined(tree))
    found: dict[str, list[int]] = {}
    for name, path in modules.items():
        relative = str(path.relative_to(SRC))
        for line, text in foreign_private_names(trees[name], rooms[room_of(name)]):
            found.setdefault(f"{relative}: {text}", []).append(line)
    new = sorted(
        f"{entry} (line {lines[0]})"
        for entry, lines in found.items()
        if entry not in PRIVATE_EXCEPTIONS
    )
    gone = sorted(set(PRIVATE_EXCEPTIONS) - set(found))
    assert not new, "private names of another module:\n" + "\n".join(new)
    assert not gone, "no longer happen, drop from PRIVATE_EXCEPTIONS:\n" + "\n".join(gone)


def place(module: str) -> tuple[int, str] | None:
    """``module``'s layer (its index, top first) and its room: the ``LAYERS`` entry it is under."""
    best: tuple[int, str] | None = None
    for index, (_, members) in enumerate(LAYERS):
        for member in members:
            under = module == member or module.startswith(member + ".")
            if under and (best is None or len(member) > len(best[1])):
                best = (index, member)
    return best


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import that points up the layers, or from one room into another."""
    found = []
    for module, edges in graph.items():
        here = place(module)
        if here is None:
            continue
        for other, line in edges.items():
            there = place(other)
            if there is None:
                continue
            if there[0] < here[0]:
                found.append(
                    f"{module}:{line} -> {other} ({LAYERS[there[0]][0]} above {LAYERS[here[0]][0]})"
                )
            elif there[0] == here[0] == 1 and there[1] != here[1]:
                found.append(f"{module}:{line} -> {other} (another room)")
    return sorted(found)


def test_every_import_points_down_the_layers_and_no_room_imports_another() -> None:
    graph = import_graph()
    unplaced = sorted(
        m
        for m in graph
        if place(m) is None and not any(m == t or m.startswith(t + ".") for t in TOOLING)
    )
    assert not unplaced, "modules in no layer (add each to LAYERS):\n" + "\n".join(unplaced)
    found = upward_imports(graph)
    assert not found, "imports against the layers:\n" + "\n".join(found)


def test_the_package_top_holds_the_faces_and_a_few_shared_modules() -> None:
    top = sorted(p.name for p in LIBRARY.glob("*.py"))
    assert len(top) <= MAX_TOP_MODULES, f"{len(top)} modules at the package top: {top}"


def test_the_shape_checks_see_what_they_are_for() -> None:
    graph = {"p.a": {"p.b": 3}, "p.b": {"p.c": 4}, "p.c": {"p.a": 9}, "p.d": {"p.a": 1}}
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]
    assert cycle_path(graph, ["p.a", "p.b", "p.c"]) == "p.a:3 -> p.b:4 -> p.c:9 -> p.a"

    layered = {
        "redlease._engine.python": {"redlease._locks.lock": 7, "redlease._errors": 2},
        "redlease._locks.lock": {"redlease._election.term": 5, "redlease._locks.args": 3},
        "redlease.lock": {"redlease._locks.lock": 1},
    }
    assert upward_imports(layered) == [
        "redlease._engine.python:7 -> redlease._locks.lock (room above engine)",
        "redlease._locks.lock:5 -> redlease._election.term (another room)",
    ]
    assert room_of("redlease._locks.aiolocks") == "redlease._locks"
    assert room_of("redlease._config") == "redlease._config"

    lazy = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from .base import Keeper\n"
        "def f():\n"
        "    from .. import _notices, _scripts\n"
        "    from .native import NativeEngine\n"
    )
    modules = {
        "redlease",
        "redlease._notices",
        "redlease._scripts",
        "redlease._engine",
        "redlease._engine.base",
        "redlease._engine.native",
    }
    edges = import_edges(lazy, "redlease._engine.python", False, modules)
    assert edges == {
        "redlease._engine.base": 3,
        "redlease._notices": 5,
        "redlease._scripts": 5,
        "redlease._engine.native": 6,
    }

    source = ast.parse(
        "class Sub:\n"
        "    __slots__ = ('_hub',)\n"
        "    def swap(self, other):\n"
        "        self._mine = other._hub\n"  # defined here: same module
        "        return other._mine\n"  # likewise
        "def peek(sub, conn):\n"
        "    sub._router = None\n"  # another module's: a write counts too
        "    return sub._tag, getattr(conn, '_sock', None), sub.__class__\n"
    )
    assert [text for _, text in foreign_private_names(source)] == [
        "sub._router",
        "sub._tag",
        "conn._sock",
    ]
