"""What the engines take from a user's client: address, credentials, TLS, sentinels.

Reading a client never connects, so these need no server; the engines'
behaviour on each kind of client is tested against real servers elsewhere.
Credentials never appear in a repr or an error message.
"""

from __future__ import annotations

import pytest
import redis
from redis.credentials import UsernamePasswordCredentialProvider
from redis.sentinel import Sentinel

import redlease
from redlease._engine.conn.client import native_endpoint
from redlease._engine.engines.select import native_available, native_features

SECRET = "s3cr3t-do-not-print"


def test_a_plain_client_gives_its_address_and_credentials_with_the_password_redacted() -> None:
    client = redis.Redis(
        host="127.0.0.1", port=7001, db=3, username="app", password=SECRET, client_name="svc"
    )
    endpoint, why = native_endpoint(client)
    assert endpoint is not None and why == ""
    assert (endpoint.host, endpoint.port, endpoint.db) == ("127.0.0.1", 7001, 3)
    assert (endpoint.username, endpoint.password, endpoint.client_name) == ("app", SECRET, "svc")
    assert endpoint.kind == "direct" and endpoint.tls is None
    assert SECRET not in repr(endpoint) and "<REDACTED>" in repr(endpoint)


def test_a_tls_client_gives_every_ssl_setting_and_hides_the_key_password() -> None:
    client = redis.Redis(
        host="localhost",
        port=7002,
        ssl=True,
        ssl_ca_certs="/ca.pem",
        ssl_ca_path="/cas",
        ssl_ca_data="-----BEGIN CERTIFICATE-----",
        ssl_certfile="/client.pem",
        ssl_keyfile="/client.key",
        ssl_password=SECRET,
        ssl_cert_reqs="optional",
        ssl_check_hostname=False,
    )
    endpoint, why = native_endpoint(client)
    assert endpoint is not None and why == ""
    tls = endpoint.tls
    assert tls is not None
    assert (tls.ca_certs, tls.ca_path, tls.certfile, tls.keyfile) == (
        "/ca.pem",
        "/cas",
        "/client.pem",
        "/client.key",
    )
    assert tls.ca_data == "-----BEGIN CERTIFICATE-----"
    assert (tls.key_password, tls.cert_reqs, tls.check_hostname) == (SECRET, "optional", False)
    assert SECRET not in repr(endpoint) and SECRET not in repr(tls)


def test_tls_options_the_native_connection_lacks_send_the_client_to_python() -> None:
    client = redis.Redis(port=7003, ssl=True, ssl_ciphers="ECDHE-RSA-AES256-GCM-SHA384")
    endpoint, why = native_endpoint(client)
    assert endpoint is None and "ssl_ciphers" in why


def test_a_sentinel_client_gives_the_sentinels_the_service_and_both_credentials() -> None:
    sentinel = Sentinel(
        [("127.0.0.1", 26001), ("127.0.0.1", 26002)],
        sentinel_kwargs={"password": SECRET + "-sentinel"},
    )
    client = sentinel.master_for("orders", password=SECRET, db=1)
    endpoint, why = native_endpoint(client)
    assert endpoint is not None and why == ""
    assert endpoint.kind == "sentinel" and endpoint.sentinels is not None
    assert endpoint.sentinels.addresses == (("127.0.0.1", 26001), ("127.0.0.1", 26002))
    assert endpoint.sentinels.service == "orders"
    assert endpoint.sentinels.password == SECRET + "-sentinel"
    assert (endpoint.password, endpoint.db) == (SECRET, 1)
    assert SECRET not in repr(endpoint)


def test_a_sentinel_replica_client_is_not_a_place_for_a_lease() -> None:
    client = Sentinel([("127.0.0.1", 26001)]).slave_for("orders")
    endpoint, why = native_endpoint(client)
    assert endpoint is None and "replica" in why


def test_a_credential_provider_is_refused_natively_with_the_reason() -> None:
    provider = UsernamePasswordCredentialProvider("app", SECRET)
    client = redis.Redis(port=7004, credential_provider=provider)
    endpoint, why = native_endpoint(client)
    assert endpoint is None and "credential_provider" in why
    e = redlease.Elector(client, "creds")
    assert e.engine == "python"
    if native_available()[0]:
        assert "credential_provider" in e.engine_reason
        with pytest.raises(redlease.ConfigError, match="credential_provider") as info:
            redlease.Elector(client, "creds", engine="native")
        assert SECRET not in str(info.value)


def test_engine_reason_is_empty_when_the_python_engine_was_asked_for() -> None:
    e = redlease.Elector(redis.Redis(port=7005, ssl=True), "asked", engine="python")
    assert e.engine == "python" and e.engine_reason == ""


def test_auto_on_a_tls_client_runs_natively_or_says_why_not() -> None:
    client = redis.Redis(port=7006, ssl=True, password=SECRET)
    e = redlease.Elector(client, "tls-auto")
    if native_available()[0] and "tls" in native_features():
        assert (e.engine, e.engine_reason) == ("native", "")
    else:
        assert e.engine == "python"
        assert e.engine_reason and SECRET not in e.engine_reason
        assert SECRET not in repr(e)
