"""Which engine runs: engine=, REDLEASE_ENGINE, and what each client allows."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

import redlease
from helpers import require_native
from redlease._engine.engines import select
from redlease._testing import RedisServer


def test_auto_picks_native_for_a_plain_tcp_or_unix_client(redis_server: RedisServer) -> None:
    require_native()
    assert redlease.Elector(redis_server.client(), "sel").engine == "native"
    with RedisServer(unix=True) as unix_server:
        assert redlease.Elector(unix_server.client(), "sel").engine == "native"


def test_explicit_python_engine_is_honoured(client: redis.Redis) -> None:
    assert redlease.Elector(client, "sel", engine="python").engine == "python"


def test_unknown_engine_name_is_a_config_error(client: redis.Redis) -> None:
    with pytest.raises(redlease.ConfigError, match=r"auto, native, python.*'turbo'"):
        redlease.Elector(client, "sel", engine="turbo")


@pytest.mark.parametrize("value", ["python", "native"])
def test_redlease_engine_sets_what_auto_means(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    if value == "native":
        require_native()
    monkeypatch.setenv("REDLEASE_ENGINE", value)
    assert redlease.Elector(client, "sel").engine == value
    assert redlease.RedisLocker(client).engine == value


def test_an_explicit_engine_overrides_redlease_engine(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_native()
    monkeypatch.setenv("REDLEASE_ENGINE", "python")
    assert redlease.Elector(client, "sel", engine="native").engine == "native"


def test_a_bad_redlease_engine_value_is_a_config_error_naming_the_variable(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDLEASE_ENGINE", "fast")
    with pytest.raises(redlease.ConfigError, match=r"REDLEASE_ENGINE.*'fast'"):
        redlease.Elector(client, "sel")


def test_a_build_with_tls_runs_a_tls_client_natively(redis_server: RedisServer) -> None:
    core = require_native()
    if not core.tls_available()[0]:
        pytest.skip(f"the native engine has no OpenSSL: {core.tls_available()[1]}")
    tls = redis.Redis(host="127.0.0.1", port=redis_server.port, ssl=True)
    assert redlease.Elector(tls, "sel", engine="native").engine == "native"
    auto = redlease.Elector(tls, "sel")
    assert (auto.engine, auto.engine_reason) == ("native", "")


def _libssl_mapped() -> set[str]:
    with open("/proc/self/maps") as maps:
        return {line.split()[-1] for line in maps if "/libssl" in line}


def test_the_native_engine_speaks_tls_with_the_openssl_of_pythons_ssl_module() -> None:
    # No OpenSSL of its own: the one ssl loaded, the same version, and no
    # second libssl mapped into the process.
    core = require_native()
    import ssl

    assert core.tls_available() == (True, "")
    assert "tls" in core.FEATURES
    assert core.OPENSSL_VERSION == ssl.OPENSSL_VERSION
    assert len(_libssl_mapped()) <= 1, _libssl_mapped()


def _fresh_interpreter(code: str, **env: str) -> list[str]:
    """Run ``code`` in a new interpreter (this one's PYTHONPATH) with ``env`` added."""
    environ = {**os.environ, **env}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        env=environ,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_without_openssl_tls_clients_run_on_python_and_auto_says_why(
    redis_server: RedisServer,
) -> None:
    # REDLEASE_NO_OPENSSL=1: the core does not look for OpenSSL when imported,
    # as where Python's ssl module has none the core can use.
    require_native()
    lines = _fresh_interpreter(
        f"""
        import redis, redlease
        from redlease._engine._native import _core
        print(_core.tls_available())
        tls = redis.Redis(host="127.0.0.1", port={redis_server.port}, ssl=True)
        auto = redlease.Elector(tls, "sel")
        print(auto.engine)
        print(auto.engine_reason)
        try:
            redlease.Elector(tls, "sel", engine="native")
        except redlease.ConfigError as exc:
            print("native:", exc)
        plain = redis.Redis(host="127.0.0.1", port={redis_server.port})
        print(redlease.Elector(plain, "sel").engine)
        """,
        REDLEASE_NO_OPENSSL="1",
    )
    assert lines[0] == "(False, 'REDLEASE_NO_OPENSSL=1 is set')"
    sentence = "the client uses TLS and the native engine has no OpenSSL to use"
    assert lines[1] == "python"
    assert sentence in lines[2] and "REDLEASE_NO_OPENSSL=1" in lines[2]
    assert lines[3].startswith("native:") and sentence in lines[3]
    # A plain client still runs natively.
    assert lines[4] == "native"


def test_a_python_without_ssl_leaves_the_native_engine_without_tls_and_says_why() -> None:
    require_native()
    lines = _fresh_interpreter(
        """
        import sys
        import redis, redlease  # redis-py itself needs ssl: it comes first
        assert "redlease._engine._native._core" not in sys.modules
        sys.modules["_ssl"] = None  # import now raises ImportError, as on a Python without ssl
        from redlease._engine._native import _core
        print(_core.tls_available()[0])
        print(_core.tls_available()[1])
        print(repr(_core.OPENSSL_VERSION))
        """
    )
    assert lines[0] == "False"
    assert lines[1].startswith("this Python has no ssl module")
    assert lines[2] == "''"


def test_without_the_extension_auto_runs_python_and_native_says_why(
    redis_server: RedisServer,
) -> None:
    # A fresh interpreter in which the extension cannot be imported, as on a
    # machine where it was never built.
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["redlease._engine._native._core"] = None  # import now raises ImportError
        import redis, redlease
        client = redis.Redis(host="127.0.0.1", port={redis_server.port})
        e = redlease.Elector(client, "sel", ttl=0.5)
        print("auto", e.engine)
        with e:
            import time
            deadline = time.monotonic() + 5
            while e.token() is None and time.monotonic() < deadline:
                time.sleep(0.01)
            print("elected", e.token() is not None)
        try:
            redlease.Elector(client, "sel", engine="native")
        except redlease.ConfigError as exc:
            print("native", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "auto python"
    assert lines[1] == "elected True"
    assert lines[2].startswith("native ") and "not built" in lines[2]


def test_engine_info_on_a_native_build_names_the_native_engine_and_its_tls() -> None:
    core = require_native()
    info = redlease.engine_info()
    assert isinstance(info, redlease.EngineInfo)
    assert (info.engine, info.native_available) == ("native", True)
    tls, why = core.tls_available()
    assert info.tls == tls
    if info.tls:
        assert info.reason == ""
    else:
        assert why in info.reason
    assert info.version == redlease.__version__
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.engine = "python"  # type: ignore[misc]


def test_engine_info_without_openssl_says_tls_clients_run_on_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    require_native()
    why = "this Python has no ssl module"
    monkeypatch.setattr(select, "native_tls", lambda: (False, why))
    info = redlease.engine_info()
    assert (info.engine, info.native_available, info.tls) == ("native", True, False)
    assert info.reason == f"TLS clients run on the Python engine: {why}"


def test_engine_info_honours_redlease_engine_and_a_chosen_python_engine_does_not_warn(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("REDLEASE_ENGINE", "python")
    info = redlease.engine_info()
    assert (info.engine, info.reason) == ("python", "REDLEASE_ENGINE=python")
    with caplog.at_level(logging.DEBUG, logger="redlease"):
        for _ in range(2):
            assert redlease.Elector(redis_server.client(), "sel").engine == "python"
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_a_bad_redlease_engine_makes_engine_info_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REDLEASE_ENGINE", "fast")
    with pytest.raises(redlease.ConfigError, match=r"REDLEASE_ENGINE.*'fast'"):
        redlease.engine_info()


# A fresh interpreter whose extension cannot be imported: {block} runs before
# redlease is imported; the WARNING records of the "redlease" logger are printed.
FALLBACK = """
import sys, logging, json
{block}
import redis, redlease

warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("redlease").addHandler(Keep())

def client():
    return redis.Redis(host="127.0.0.1", port={port})

info = redlease.engine_info()
chosen = [redlease.Elector(client(), "sel", engine="python").engine for _ in range(2)]
after_chosen = len(warnings)
auto = [redlease.Elector(client(), "sel").engine, redlease.RedisLocker(client()).engine]
with redlease.Elector(client(), "sel", ttl=0.5) as e:
    import time
    deadline = time.monotonic() + 10
    while e.token() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    elected = e.token() is not None
print(json.dumps(dict(
    info=[info.engine, info.native_available, info.reason, info.tls],
    chosen=chosen, after_chosen=after_chosen, auto=auto, elected=elected,
    warnings=warnings,
)))
"""

# As a build that cannot load: a shared library it links is missing.
CANNOT_LOAD = """
class Broken:
    def find_spec(self, name, path=None, target=None):
        if name == "redlease._engine._native._core":
            raise ImportError("libssl.so.3: cannot open shared object file")
        return None
sys.meta_path.insert(0, Broken())
"""


def unbuilt_copy(where: Path) -> Path:
    """This checkout's package without its compiled modules, as pip installs it
    from the sdist where no compiler is found."""
    package = Path(redlease.__file__).parent
    shutil.copytree(
        package, where / "redlease", ignore=shutil.ignore_patterns("*.so", "*.c", "__pycache__")
    )
    if not (where / "redlease" / "lua").is_dir():  # a checkout keeps them at its top
        shutil.copytree(Path(__file__).resolve().parents[2] / "lua", where / "redlease" / "lua")
    return where


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("not-built", "the native extension was not built (no redlease._engine._native._core"),
        ("cannot-load", "the native extension failed to import: libssl.so.3: cannot open"),
    ],
)
def test_without_the_extension_engine_info_says_why_and_auto_warns_once(
    redis_server: RedisServer, tmp_path: Path, case: str, cause: str
) -> None:
    env = dict(os.environ)
    if case == "not-built":
        env["PYTHONPATH"] = str(unbuilt_copy(tmp_path))
        block = ""
    else:
        block = textwrap.dedent(CANNOT_LOAD)
    script = FALLBACK.format(block=block, port=redis_server.port)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    engine, available, reason, tls = got["info"]
    assert (engine, available, tls) == ("python", False, False)
    assert reason.startswith(cause), reason
    # engine="python" chosen: no warning; then auto, three times: one warning.
    assert got["chosen"] == ["python", "python"]
    assert got["after_chosen"] == 0
    assert got["auto"] == ["python", "python"]
    assert got["elected"] is True
    assert len(got["warnings"]) == 1, got["warnings"]
    warning = got["warnings"][0]
    assert cause in warning
    assert "wheel" in warning and "C compiler" in warning
    assert "REDLEASE_REQUIRE_NATIVE=1" in warning
