"""Engine selection: ``auto`` / ``native`` / ``python`` and ``REDLEASE_ENGINE``.

The one place that decides which engine runs and why: ``choose_engine`` for a
client, ``engine_info`` for the process (what ``auto`` gives a plain TCP
client), and the one WARNING a process logs when ``auto`` falls back to the
Python engine.
"""

from __future__ import annotations

import functools
import importlib
import os
import weakref
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import redis

from ..._errors import ConfigError
from ..._log import logger
from ..._version import __version__
from ..conn.client import Endpoint, native_endpoint, write_timeout
from ..conn.clientfamily import threaded
from ..contract.interface import Engine
from ..process.forksafe import ForkSafeLock

ENGINES = ("auto", "native", "python")

CORE = "redlease._engine._native._core"

# What each kind of endpoint needs from the build of the extension, and the
# sentence that says why a build without it cannot serve the client.
_NEEDS = {
    "sentinel": "the native extension of this build cannot follow a Sentinel-managed master",
    "cluster": "the native extension of this build cannot route a RedisCluster client by slot",
}


@functools.cache
def _import_core() -> tuple[ModuleType | None, str]:
    # Once per process: a missing extension would otherwise be searched for
    # on sys.path again by every elector made.
    try:
        # By its full name: ``from ._native import _core`` would report a
        # missing file as a failed import of the package ("cannot import name").
        core = importlib.import_module(CORE)
    except ModuleNotFoundError as exc:
        if exc.name != CORE:
            return None, f"the native extension failed to import: {exc}"
        return None, f"the native extension was not built (no {CORE} for this Python)"
    except ImportError as exc:
        # Built, but it cannot load: a missing shared library, another
        # Python's build, an undefined symbol.
        return None, f"the native extension failed to import: {exc}"
    return core, ""


def native_available() -> tuple[bool, str]:
    """Whether the compiled extension imports, and why not when it does not."""
    core, why = _import_core()
    return core is not None, why


def native_features() -> frozenset[str]:
    """What this build of the extension can serve beyond plain TCP and unix sockets."""
    core, _why = _import_core()
    if core is None:
        return frozenset()
    features: frozenset[str] = frozenset(getattr(core, "FEATURES", ()))
    return features


def native_tls() -> tuple[bool, str]:
    """Whether the native engine can serve TLS clients, and why not when it cannot.

    The one place that reads it from the extension, which links no OpenSSL: it
    uses the one Python's ssl module has loaded, found when it is imported
    (``_core.tls_available()``).
    """
    core, why = _import_core()
    if core is None:
        return False, why
    ok, why = core.tls_available()
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
    engine, source = _asked(engine)
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


def _asked(engine: str | None) -> tuple[str, str]:
    """``(engine, source)``: the engine asked for, and who asked (``engine`` or the variable)."""
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
    return engine, source


@dataclass(frozen=True)
class EngineInfo:
    """What ``engine="auto"`` picks in this process, and why (``redlease.engine_info()``).

    ``engine`` is ``"native"`` or ``"python"``: the engine a plain TCP
    client gets by default, ``REDLEASE_ENGINE`` honoured. ``native_available``
    says whether the compiled extension imports. ``tls`` says whether the
    native engine can serve TLS clients. ``reason`` is one sentence: why the
    default is not the native engine (the extension not built, failing to
    import, or ``REDLEASE_ENGINE=python``), or, when it is, why TLS clients
    still run on the Python engine; it is ``""`` when nothing is missing.
    ``version`` is redlease's version.
    """

    engine: str
    native_available: bool
    reason: str
    tls: bool
    version: str


def engine_info() -> EngineInfo:
    """What ``engine="auto"`` picks in this process for a plain TCP client, and why.

    Read from the same decision every ``Elector`` and lock makes: a bad
    ``REDLEASE_ENGINE`` value is the ``ConfigError`` they raise, and
    ``REDLEASE_ENGINE=native`` without the extension raises it too.
    """
    asked, source = _asked(None)
    available, _why = native_available()
    tls, why_tls = native_tls()
    plain = redis.Redis()  # never connects: only its settings are read
    try:
        name, reason, _endpoint = choose_engine(plain, None)
    finally:
        plain.close()
    if asked == "python":
        reason = f"{source}=python"
    elif name == "native" and not tls:
        reason = f"TLS clients run on the Python engine: {why_tls}"
    return EngineInfo(
        engine=name, native_available=available, reason=reason, tls=tls, version=__version__
    )


# Whether this process has logged its fallback WARNING: one in all, however
# many electors, locks or clients fell back, and for whatever reason (the
# first one met is named; ``engine_info()`` and ``e.engine_reason`` tell each).
_warned: list[bool] = [False]
_warned_lock = ForkSafeLock()

_HOW_TO_GET_NATIVE = (
    "To get the native engine, install a redlease wheel built for this platform, or install "
    "from source with a C compiler and Python's headers (REDLEASE_REQUIRE_NATIVE=1 makes a "
    "build without the extension fail loudly)"
)


def _warn_fallback(reason: str) -> None:
    """Log, once per process, that ``auto`` fell back to the Python engine, and why."""
    with _warned_lock:
        if _warned[0]:
            return
        _warned[0] = True
    hint = f" {_HOW_TO_GET_NATIVE}." if not native_available()[0] else ""
    logger.warning(
        "engine='auto' runs on the pure-Python engine: %s. Its renewals run on a Python "
        "thread that must wait for the GIL, so a busy process can make them late.%s "
        "engine='python' (or REDLEASE_ENGINE=python) chooses it without this warning.",
        reason,
        hint,
    )


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
    if reason:  # only "auto" falls back: "native" raises, "python" has no reason
        _warn_fallback(reason)
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
