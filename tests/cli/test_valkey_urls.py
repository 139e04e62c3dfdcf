"""valkey:// and valkeys:// URLs on the command line: valkey-py clients, or one clear line."""

from __future__ import annotations

import subprocess
import sys

import pytest

import redlease
from cli_helpers import assert_one_line_error, redlease_cli
from helpers import require_valkey, wait_until
from redlease._testing import RedisServer

require_valkey()  # skips the module without valkey-py (fails with REDLEASE_REQUIRE_VALKEY=1)
import valkey  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_status_takes_a_valkey_url(redis_server: RedisServer) -> None:
    host, port = redis_server.address
    client = redis_server.client(family="valkey")
    e = redlease.Elector(client, "jobs", ttl=5, instance_id="box-1")
    with e:
        wait_until(e.token, 10, what="election")
        result = redlease_cli("status", "jobs", "--redis", f"valkey://{host}:{port}/0", "--json")
    assert result.returncode == 0, result.stderr
    assert '"leader": "box-1"' in result.stdout


def test_a_valkeys_url_is_tls(tls_server: RedisServer) -> None:
    from redlease._cli.redisurl import connect

    host, port = tls_server.address
    materials = tls_server.tls.materials  # type: ignore[union-attr]
    client = connect(f"valkeys://{host}:{port}/0?ssl_ca_certs={materials.ca_file}")
    assert isinstance(client, valkey.Valkey)
    assert client.ping() is True


def test_a_valkey_url_without_valkey_py_is_one_clear_line(redis_server: RedisServer) -> None:
    host, port = redis_server.address
    code = (
        "import sys; sys.modules['valkey'] = None; sys.modules['valkey.asyncio'] = None\n"
        "from redlease._cli import main\n"
        f"sys.exit(main(['status', 'jobs', '--redis', 'valkey://{host}:{port}/0']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    line = assert_one_line_error(done, 1)
    assert "pip install valkey" in line
