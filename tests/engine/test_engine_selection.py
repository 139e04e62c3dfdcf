"""Which engine runs: engine=, REDLEASE_ENGINE, and what each client allows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import redis

import redlease
from helpers import require_native
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
