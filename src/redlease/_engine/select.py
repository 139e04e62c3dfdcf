"""Engine selection: ``auto`` / ``native`` / ``python`` and ``REDLEASE_ENGINE``."""

from __future__ import annotations

import functools
import os
import weakref
from typing import Any

from .._errors import ConfigError
from .base import Engine
from .client import Endpoint, native_endpoint, write_timeout
from .family import threaded
from .forksafe import ForkSafeLock

ENGINES = ("auto", "native", "python")

# What each kind of endpoint needs from the build of the extension, and the
# sentence that says why a build without it cannot serve the client.
_NEEDS = {
    "sentinel": "the native extension of this build cannot follow a Sentinel-managed master",
    "cluster": "the native extension of this build cannot route a RedisCluster client by slot",
}


def native_available() -> tuple[bool, str]:
    """Whether the compiled extension imports, and why not when it does not."""
    try:
        from ._native import _core  # noqa: F401
    except ImportError as exc:
        return False, f"the native extension is not built ({exc})"
    return True, ""


def native_features() -> frozenset[str]:
    """What this build of the extension can serve beyond plain TCP and unix sockets."""
    try:
        from ._native import _core
    except ImportError:
        return frozenset()
    features: frozenset[str] = frozenset(getattr(_core, "FEATURES", ()))
    return features


def native_tls() -> tuple[bool, str]:
    """Whether the native engine can speak TLS here, and why not when it cannot.

    The extension links no OpenSSL: it uses the one Python's ssl module has
    loaded, found when it is imported (``_core.tls_available()``).
    """
    try:
        from ._native import _core
    except ImportError as exc:
        return False, f"the native extension is not built ({exc})"
    ok, why = _core.tls_available()
    return bool(ok), str(why)


def _gap(endpoint: Endpoint) -> str:
    features = native_features()
    sentinel_tls = endpoint.sentinels is not None and endpoint.sentinels.tls is not None
    if endpoint.tls is not None or sentinel_tls:
        ok, why = native_tls()
        if not ok:
            return f"the client uses TLS and the native engine has no OpenSSL to use: {why}"
    if endpoint.kind != "direct" and endpoint.kind not in features:
        return _NEEDS[endpoint.kind]
    return ""


def choose_engine(client: object, engine: str | None) -> tuple[str, str, Endpoint | None]:
    """``(name, reason, endpoint)``: which engine ``engine`` means for ``client``.

    ``name`` is ``"native"`` or ``"python"``; ``reason`` says in one sentence
    why a client asked to run natively (``auto`` or ``native``) got the
    Python engine, and is empty otherwise. ``engine="native"`` on a client the
    native engine cannot serve raises ConfigError with that sentence.
    """
    source = "engine"
    if engine is None or engine == "auto":
        # "auto" is the default, and REDLEASE_ENGINE says what the default means.
        env = os.environ.get("REDLEASE_ENGINE", "")
        if env:
            engine, source = env, "REDLEASE_ENGINE"
        else:
            engine = "auto"
    if not isinstance(engine, str) or engine not in ENGINES:
        raise ConfigError(f"{source} must be one of auto, native, python; got {engine!r}")
    if engine == "python":
        return "python", "", None
    ok, why = native_available()
    endpoint, why_client = native_endpoint(client)
    if ok and endpoint is not None:
        why_client = _gap(endpoint)
    reason = why if not ok else why_client
    if engine == "native":
        if not ok:
            raise ConfigError(f'{source}="native" is unavailable: {why}')
        if reason:
            raise ConfigError(f'{source}="native" cannot serve this client: {reason}')
        return "native", "", endpoint
    if reason:
        return "python", reason, None
    return "native", "", endpoint


def make_engine(client: object, engine: str | None) -> Engine:
    """Build the engine ``engine`` names for ``client`` (see ``choose_engine``).

    The engine's ``reason`` says why an ``auto`` choice fell back to Python.
    Engines run on a threaded redis-py client: an asyncio or valkey-py one is
    served through its twin (``family.threaded``).
    """
    client = threaded(client).client
    name, reason, endpoint = choose_engine(client, engine)
    built: Engine
    if name == "native":
        from .native import NativeEngine

        assert endpoint is not None
        built = NativeEngine(endpoint, write_timeout=write_timeout(client))
    else:
        from .python import PythonEngine

        built = PythonEngine(client, write_timeout=write_timeout(client))
    built.reason = reason
    return built


# The engines electors share, per client object and engine name. An engine
# lives as long as an election holds it (the values are weak), and forgets
# its client when the client goes.
_shared: dict[int, tuple[weakref.ref[Any], weakref.WeakValueDictionary[str, Any]]] = {}
_shared_lock = ForkSafeLock()


def shared_engine(client: object, engine: str | None) -> Engine:
    """The engine ``engine`` names for ``client``, shared by every caller with that client.

    Electors on one client then share one control pool, one fenced-write
    pool and (natively) one renewal thread and connection, whatever their
    number. Clients that cannot be weakly referenced get an engine each.
    """
    client = threaded(client).client
    name, reason, _endpoint = choose_engine(client, engine)
    kind = f"{name}:{reason}"
    key = id(client)
    with _shared_lock:
        entry = _shared.get(key)
        if entry is not None and entry[0]() is not client:
            entry = None  # a dead client's id reused
        if entry is None:
            try:
                ref = weakref.ref(client, functools.partial(_forget, key))
            except TypeError:
                return make_engine(client, engine)
            entry = (ref, weakref.WeakValueDictionary())
            _shared[key] = entry
        built: Engine | None = entry[1].get(kind)
        if built is None:
            built = make_engine(client, engine)
            entry[1][kind] = built
        return built


def _forget(key: int, ref: weakref.ref[Any]) -> None:
    # No lock: this runs from the garbage collector, maybe inside
    # shared_engine() on this very thread. Reads and a pop are atomic.
    entry = _shared.get(key)
    if entry is not None and entry[0] is ref:
        _shared.pop(key, None)
