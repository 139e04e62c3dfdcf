"""TLS test material the harness does not mint: encrypted keys, DER CAs, broken files.

Built on ``redlease._testing.TLSMaterials`` (whose certificates the test
servers use); each helper writes into a directory the test owns.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis

import redlease
from helpers import Events, require_native, stays, wait_until
from redlease._testing import RedisServer, TLSMaterials

# A key password no message, repr or log line may ever show.
SECRET_KEY_PASSWORD = "kp-7f3a9c1e-never-printed"

NOT_PEM = "this is not a certificate\n"


def encrypted_client_key(materials: TLSMaterials, directory: Path, password: str) -> Path:
    """The test client key, re-written encrypted with ``password`` (PEM, PKCS#8)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(
        materials.client_key_file.read_bytes(), password=None
    )
    path = directory / "client-encrypted.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(password.encode()),
        )
    )
    return path


def ca_der(materials: TLSMaterials) -> bytes:
    """The test CA as DER bytes (``ssl_ca_data`` given as bytes is DER, as in Python's ssl)."""
    return ssl.PEM_cert_to_DER_cert(materials.ca_data)


def garbage_file(directory: Path, name: str = "garbage.pem") -> Path:
    """A file that exists and is not PEM."""
    path = directory / name
    path.write_text(NOT_PEM)
    return path


def tls_client(server: RedisServer, **kwargs: Any) -> redis.Redis:
    """A client of a TLS test server with short timeouts; ``kwargs`` override any setting."""
    kwargs.setdefault("socket_timeout", 2)
    kwargs.setdefault("socket_connect_timeout", 2)
    return server.client(**kwargs)


def require_native_tls() -> ModuleType:
    """The native core, with OpenSSL found; else skip (fail where the native build is required).

    ``REDLEASE_REQUIRE_NATIVE=1`` makes a core without TLS fail here too,
    unless it was asked to leave OpenSSL out (``REDLEASE_NO_OPENSSL=1``).
    """
    core = require_native()
    ok, why = core.tls_available()
    if not ok:
        reason = f"the native engine has no OpenSSL: {why}"
        required = os.environ.get("REDLEASE_REQUIRE_NATIVE") == "1"
        if required and os.environ.get("REDLEASE_NO_OPENSSL") != "1":
            pytest.fail(f"REDLEASE_REQUIRE_NATIVE=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return core


def never_elected(e: redlease.Elector, events: Events, timeout: float = 10) -> BaseException:
    """Wait for the elector's first error, check it stays a follower; that error."""
    wait_until(lambda: events.count("error") >= 1, timeout=timeout, what="an error reported")
    assert stays(lambda: e.token() is None, 0.5)
    assert events.count("elected") == 0
    error: BaseException = events.values("error")[0]
    return error
