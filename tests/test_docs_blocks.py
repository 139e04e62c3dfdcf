"""Every fenced code block of README.md and docs/**/*.md, run or checked as its language says.

The blocks are found afresh at each run (a new page under docs/ is picked
up by itself); each is one test, named by file and line (``README.md:90``),
against a redis-server of its own that the test starts. The rules:

* **Every block names its language.** A fence with no language fails: a
  block is either a program (```python), commands (```sh, ```bash,
  ```console) or a listing, which says what it is (```text for synopses,
  sample output and diagrams, ```json, ```toml, ```ini, ```yaml, ```sql ...).
  ```json blocks must parse as JSON; other listings are not checked.
* **```python blocks are complete programs.** Each runs alone, as
  ``python block.py`` in a temporary directory, in a subprocess that keeps
  ``PYTHONPATH`` (the tree under test), within ``TIMEOUT`` seconds, and must
  exit 0. Write them against the default address, as a reader would:
  ``redis.Redis()``, ``redis.asyncio.Redis()``,
  ``redis.Redis.from_url("redis://localhost:6379/0")``, a Celery broker
  ``redis://localhost:6379/0``, ``REDIS_URL``. A ``sitecustomize`` module on
  the subprocess's path (``PRELUDE``) points every redis-py and valkey-py
  connection pool (sync and asyncio, ``from_url`` included) made for port
  6379 on a loopback name at the test's server, sets ``REDIS_URL`` to it,
  refuses any Python socket connect to port 6379 on loopback (the machine's
  own Redis is never reached), and binds a server a block starts on a fixed
  TCP port (``HealthServer(port=8080)``, ``start_http_server(9100)``) to a
  free loopback port instead, so blocks never collide with each other or
  with the machine's services. Processes a block starts inherit all of it.
  Keep blocks to a few seconds (short ttls and durations).
* **A block that cannot run alone** may take a named prelude from
  ``PRELUDES``, the one table of such exceptions: an HTML comment
  ``<!-- docs-test: prelude=NAME -->`` on the line before the fence runs the
  prelude's code first, in the same program. Keep them few; prefer a
  complete program wherever the block shows usage.
* **Shell blocks** (```sh, ```bash, ```shell; in ```console only the lines
  after a ``$ `` prompt, the rest being output): each command (a line, with
  ``\\`` continuations joined, split at ``&&``, ``||``, ``;`` and ``|``,
  leading ``VAR=value`` assignments set aside) is run or skipped by its
  program. ``redlease ...`` (and ``python -m redlease ...``) runs, through
  ``bash`` with ``REDIS_URL`` pointing at the test's server (a ``--redis
  URL`` it names is replaced by the test's) and the same prelude, each
  command on its own, on an empty server, within ``TIMEOUT`` seconds, and
  must exit 0; its output is not compared with a ```console block's.
  ``SKIPPED`` lists every other program a docs page may name and why it is
  not run here; a command whose program is in neither fails, so a
  new kind of command is a decision made in that table (or the block is a
  ```text listing).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from redlease._testing import RedisServer

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0
"""Seconds a block (or one shell command) may take before it fails."""

PYTHON = frozenset({"python", "py", "python3"})
SHELLS = frozenset({"sh", "bash", "shell", "console"})

SKIPPED: dict[str, str] = {
    "pip": "installs into the reader's environment; the test runs the tree it was given",
    "pipx": "installs into the reader's environment",
    "pytest": "the test suite itself (CI runs it); run from here it would recurse",
    "celery": "a worker or beat runs until stopped; tests/test_integrations_celery.py runs real "
    "workers and beats",
    "python": "a script of the checkout (benchmarks, examples, setup.py): each has its own test "
    "(test_examples.py, test_benchmarks_run.py) or is a build step",
    "git": "changes the reader's checkout",
    "cd": "moves the shell, nothing to run",
    "export": "sets the reader's shell up, nothing to run",
    "redis-server": "a server of the reader's; the tests start their own",
    "redis-cli": "talks to the reader's server",
    "docker": "starts containers on the reader's machine",
    "kubectl": "talks to the reader's cluster",
    "curl": "talks to a service the reader runs",
    "cibuildwheel": "a release build (CI builds the wheels)",
    "auditwheel": "inspects a built wheel (CI checks the wheels)",
    "gcc": "a build step",
    "make": "a build step",
    "build": "a release build (python -m build; CI builds and checks the wheels)",
    "twine": "publishes a release",
    "sudo": "changes the reader's machine",
    "apt-get": "changes the reader's machine",
}
"""Programs a shell block may run that this test does not, and why (see the module doc)."""

PRELUDES: dict[str, tuple[str, str]] = {
    "fencer": (
        "docs/fenced-writes.md's running example: the fencer of a leading elector (the "
        "page's first block makes one), and body, a Lua write of one key and one argument",
        """
        import atexit
        import time

        import redis
        import redlease

        client = redis.Redis()
        elector = redlease.Elector(client, "report-builder", ttl=5).start()
        atexit.register(elector.stop)
        deadline = time.monotonic() + 10
        while elector.token() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        token = elector.token()
        assert token is not None, "the prelude's elector did not lead"
        fencer = elector.fencer()
        body = "redis.call('set', KEYS[2], ARGV[2])"
        """,
    ),
}
"""The named preludes a block may ask for: name -> (what a reader has by then, code)."""

PRELUDE = '''
"""Points a docs block at the test's redis-server; never at the machine's port 6379."""
import os
import socket

_HOST = os.environ["REDLEASE_DOCS_REDIS_HOST"]
_PORT = int(os.environ["REDLEASE_DOCS_REDIS_PORT"])
_LOOPBACK = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", "ip6-localhost"}
_DEFAULT_PORT = 6379


def _redirected(kwargs):
    if kwargs.get("path") or kwargs.get("unix_socket_path"):
        return kwargs
    host = str(kwargs.get("host", "localhost") or "localhost")
    try:
        port = int(kwargs.get("port", _DEFAULT_PORT) or _DEFAULT_PORT)
    except (TypeError, ValueError):
        return kwargs
    if host in _LOOPBACK and port == _DEFAULT_PORT:
        kwargs["host"], kwargs["port"] = _HOST, _PORT
    return kwargs


def _patch_pool(module_name):
    try:
        module = __import__(module_name, fromlist=["ConnectionPool"])
    except Exception:
        return
    pool = module.ConnectionPool
    original = pool.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **_redirected(kwargs))

    pool.__init__ = __init__


for _name in ("redis.connection", "redis.asyncio.connection",
              "valkey.connection", "valkey.asyncio.connection"):
    _patch_pool(_name)


def _refused(address):
    return (isinstance(address, tuple) and len(address) >= 2
            and address[1] == _DEFAULT_PORT and str(address[0]) in _LOOPBACK | {"127.0.1.1"})


_connect = socket.socket.connect
_connect_ex = socket.socket.connect_ex
_bind = socket.socket.bind


def connect(self, address):
    if _refused(address):
        raise ConnectionRefusedError(
            f"docs test: {address!r} is the machine's own Redis; a block reaches the test's "
            "server through the default address instead")
    return _connect(self, address)


def connect_ex(self, address):
    if _refused(address):
        raise ConnectionRefusedError(f"docs test: {address!r} is off limits")
    return _connect_ex(self, address)


def bind(self, address):
    if (self.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple)
            and len(address) >= 2 and address[1]):
        loopback = "::1" if self.family == socket.AF_INET6 else "127.0.0.1"
        address = (loopback, 0, *address[2:])
    return _bind(self, address)


socket.socket.connect = connect
socket.socket.connect_ex = connect_ex
socket.socket.bind = bind
'''


# -- finding the blocks -----------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    path: str  # relative to the checkout
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    prelude: str | None

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_MARK = re.compile(r"<!--\s*docs-test:\s*prelude=(?P<name>[\w-]+)\s*-->")


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
    return [p for p in found if p.is_file()]


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of the page at ``path``, in order (a list item's block included)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    rel = path.relative_to(root).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        info = opening["info"].strip()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            # a block inside a list item is indented: drop the fence's indentation
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        before = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = _MARK.search(before)
        found.append(
            Block(
                rel,
                i + 1,
                info.split()[0].lower() if info else "",
                "\n".join(body) + "\n",
                mark["name"] if mark else None,
            )
        )
        i = j + 1
    return found


BLOCKS = [block for page in pages() for block in blocks_of(page)]


# -- running them -----------------------------------------------------------------------------


def environment(server: RedisServer, prelude_dir: Path, bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    host, port = server.address
    paths = [str(prelude_dir), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        PYTHONPATH=os.pathsep.join(paths),
        PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]),
        REDIS_URL=f"redis://{host}:{port}/0",
        REDLEASE_DOCS_REDIS_HOST=str(host),
        REDLEASE_DOCS_REDIS_PORT=str(port),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def sandbox(tmp_path: Path, redis_server: RedisServer) -> tuple[Path, dict[str, str]]:
    """A working directory and the environment a block runs in (see the module doc)."""
    prelude_dir, bin_dir, work = tmp_path / "prelude", tmp_path / "bin", tmp_path / "work"
    for each in (prelude_dir, bin_dir, work):
        each.mkdir()
    (prelude_dir / "sitecustomize.py").write_text(PRELUDE, encoding="utf-8")
    shim = bin_dir / "redlease"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m redlease "$@"\n')
    shim.chmod(0o755)
    return work, environment(redis_server, prelude_dir, bin_dir)


def run(argv: list[str], cwd: Path, env: dict[str, str], what: str) -> None:
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired as exc:
        output = _tail(exc.stdout, exc.stderr)
        pytest.fail(f"{what} did not finish within {TIMEOUT:g} s\n{output}")
    if done.returncode != 0:
        pytest.fail(f"{what} exited {done.returncode}\n{_tail(done.stdout, done.stderr)}")


def _tail(stdout: object, stderr: object, chars: int = 4000) -> str:
    def text(value: object) -> str:
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return value if isinstance(value, str) else ""

    return f"--- stdout ---\n{text(stdout)[-chars:]}\n--- stderr ---\n{text(stderr)[-chars:]}"


def commands(block: Block) -> list[str]:
    """The commands of a shell block: continuations joined, prompts and output dropped."""
    joined: list[str] = []
    pending = ""
    for raw in block.code.splitlines():
        line = raw.rstrip()
        if block.language == "console" and not pending:
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    if pending:
        joined.append(pending)
    found: list[str] = []
    for line in joined:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        for token in [*lexer, ";"]:
            if token and set(token) <= set(";&|"):
                if command:
                    found.append(shlex.join(command))
                command = []
            else:
                command.append(token)
    return found


def program(command: str) -> tuple[str, list[str]]:
    """``(program, arguments)`` of a command, its leading ``VAR=value`` set aside."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words = words[1:]
    if not words:
        return "", []
    name = os.path.basename(words[0])
    if re.fullmatch(r"python(3(\.\d+)?)?", name):
        if words[1:3] == ["-m", "redlease"]:
            return "redlease", words[3:]
        if len(words) > 2 and words[1] == "-m":
            return os.path.basename(words[2]), words[3:]  # python -m pip / pytest / ...
        return "python", words[1:]
    return name, words[1:]


def against(args: list[str], url: str) -> list[str]:
    """``args`` with the URL of any ``--redis URL`` (or ``--redis=URL``) replaced by ``url``:
    a page may name the reader's server (``redis://ops-redis:6379/0``); the test's is used."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--redis="):
            out.append(f"--redis={url}")
        elif i > 0 and args[i - 1] == "--redis":
            out.append(url)
        else:
            out.append(arg)
    return out


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_block(block: Block, request: pytest.FixtureRequest) -> None:
    if not block.language:
        pytest.fail(
            f"{block.id}: a fenced block without a language; say what it is "
            "(python, sh, console, text, json, toml, ...): see tests/test_docs_blocks.py"
        )
    if block.prelude is not None and block.prelude not in PRELUDES:
        pytest.fail(f"{block.id}: unknown prelude {block.prelude!r}; known: {sorted(PRELUDES)}")
    if block.language == "json":
        try:
            json.loads(block.code)
        except ValueError as exc:
            pytest.fail(f"{block.id}: a ```json block that is not JSON ({exc}); ```text it")
        return
    if block.language in PYTHON:
        work, env = request.getfixturevalue("sandbox")
        code = block.code
        if block.prelude is not None:
            code = textwrap.dedent(PRELUDES[block.prelude][1]) + "\n" + code
        script = work / "block.py"
        script.write_text(code, encoding="utf-8")
        run([sys.executable, str(script)], work, env, f"{block.id} (```python)")
        return
    if block.language in SHELLS:
        runnable: list[str] = []
        skipped: dict[str, str] = {}
        for command in commands(block):
            name, _ = program(command)
            if name == "redlease":
                runnable.append(command)
            elif name in SKIPPED:
                skipped[name] = SKIPPED[name]
            else:
                pytest.fail(
                    f"{block.id}: the command {command!r} runs {name!r}, which the docs test "
                    "neither runs nor skips; add it to SKIPPED in tests/test_docs_blocks.py with "
                    "its reason, or make the block ```text"
                )
        if runnable:
            work, env = request.getfixturevalue("sandbox")
            for command in runnable:
                _, args = program(command)
                args = against(args, env["REDIS_URL"])
                argv = ["bash", "-c", shlex.join(["redlease", *args])]
                run(argv, work, env, f"{block.id}: {command!r}")
        elif skipped:  # every command checked, none of them one this test runs: say why
            pytest.skip("; ".join(f"{name}: {why}" for name, why in skipped.items()))
        return
    # a listing (text, toml, ini, yaml, sql, ...): nothing to run


# -- the rules themselves -----------------------------------------------------------------------


def test_blocks_are_found_in_every_page_including_new_ones(tmp_path: Path) -> None:
    assert any(b.path == "README.md" for b in BLOCKS)
    assert any(b.path.startswith("docs/") for b in BLOCKS)
    page = tmp_path / "page.md"
    page.write_text(
        "# t\n\n```python\nprint(1)\n```\n\n- item\n\n  ~~~sh\n  redlease status x\n  ~~~\n\n"
        "<!-- docs-test: prelude=fencer -->\n```\nbare\n```\n",
        encoding="utf-8",
    )
    found = [(b.line, b.language, b.code, b.prelude) for b in blocks_of(page, tmp_path)]
    assert found == [
        (3, "python", "print(1)\n", None),
        (9, "sh", "redlease status x\n", None),
        (14, "", "bare\n", "fencer"),
    ]


def test_shell_commands_are_split_and_named_by_their_program() -> None:
    block = Block(
        "x.md",
        1,
        "sh",
        "pip install -e '.[embedded]' && redlease demo  # comment\n"
        'LD_PRELOAD="a b" ASAN=1 pytest -k "not python" \\\n  tests/engine\n'
        "python -m redlease status x | head\n",
        None,
    )
    found = [program(c)[0] for c in commands(block)]
    assert found == ["pip", "redlease", "pytest", "redlease", "head"]
    console = Block("x.md", 1, "console", "$ redlease locks\nname  holder\n", None)
    assert commands(console) == ["redlease locks"]
    assert against(["evict", "x", "--redis", "redis://ops:6379/0"], "redis://t:1/0") == [
        "evict",
        "x",
        "--redis",
        "redis://t:1/0",
    ]
    assert against(["locks", "--redis=redis://ops:6379/0"], "U") == ["locks", "--redis=U"]


def test_the_prelude_keeps_blocks_off_port_6379(sandbox: tuple[Path, dict[str, str]]) -> None:
    work, env = sandbox
    probe = textwrap.dedent(
        """
        import os, socket
        import redis

        client = redis.Redis()
        kwargs = client.connection_pool.connection_kwargs
        assert (kwargs["host"], kwargs["port"]) != ("localhost", 6379), kwargs
        assert client.ping()
        assert redis.Redis.from_url("redis://localhost:6379/0").ping()
        assert redis.Redis.from_url(os.environ["REDIS_URL"]).ping()
        try:
            socket.create_connection(("127.0.0.1", 6379), timeout=1)
        except ConnectionRefusedError as exc:
            assert "docs test" in str(exc)
        else:
            raise AssertionError("port 6379 was reached")
        listener = socket.socket()
        listener.bind(("0.0.0.0", 8080))
        assert listener.getsockname()[1] != 8080

        import asyncio
        import time

        import redis.asyncio
        import redlease


        async def aio() -> None:
            client = redis.asyncio.Redis.from_url("redis://localhost:6379")
            assert await client.ping()
            await client.aclose()


        asyncio.run(aio())
        try:
            import valkey
        except ImportError:
            pass
        else:
            assert valkey.Valkey().ping()
        # The engine (native on auto, where built) reads the pool's address: its lease
        # lands on the test's server.
        own = redis.Redis(host=os.environ["REDLEASE_DOCS_REDIS_HOST"],
                          port=int(os.environ["REDLEASE_DOCS_REDIS_PORT"]))
        with redlease.Elector(redis.Redis(), "probe") as elector:
            deadline = time.monotonic() + 10
            while elector.token() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            assert elector.token() is not None
            assert own.exists("probe:leader"), (elector.engine, own.keys())
        print("engine", elector.engine)
        """
    )
    (work / "probe.py").write_text(probe, encoding="utf-8")
    run([sys.executable, str(work / "probe.py")], work, env, "the probe")
