"""Which engine runs: engine=, REDLEASE_ENGINE, and what each client allows."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import redis

import redlease
from helpers import require_native
from redlease._engine import select
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
    if "tls" not in core.FEATURES:
        pytest.skip("the native extension was built without OpenSSL")
    tls = redis.Redis(host="127.0.0.1", port=redis_server.port, ssl=True)
    assert redlease.Elector(tls, "sel", engine="native").engine == "native"
    auto = redlease.Elector(tls, "sel")
    assert (auto.engine, auto.engine_reason) == ("native", "")


def test_a_build_without_openssl_refuses_tls_natively_and_auto_says_why(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a build without OpenSSL's headers reports: no "tls" in FEATURES.
    require_native()
    monkeypatch.setattr(select, "native_features", lambda: frozenset())
    tls = redis.Redis(host="127.0.0.1", port=redis_server.port, ssl=True)
    sentence = "built without OpenSSL (install OpenSSL's headers, e.g. Debian's libssl-dev"
    with pytest.raises(redlease.ConfigError, match="TLS") as info:
        redlease.Elector(tls, "sel", engine="native")
    assert sentence in str(info.value)
    auto = redlease.Elector(tls, "sel")
    assert auto.engine == "python"
    assert sentence in auto.engine_reason
    # A plain client still runs natively in such a build.
    assert redlease.Elector(redis_server.client(), "sel").engine == "native"


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
