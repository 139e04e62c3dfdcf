"""Engine selection: ``auto`` / ``native`` / ``python`` and ``REDLEASE_ENGINE``."""

from __future__ import annotations

import os

from .._errors import ConfigError
from .base import Engine
from .client import native_endpoint, write_timeout

ENGINES = ("auto", "native", "python")


def native_available() -> tuple[bool, str]:
    """Whether the compiled extension imports, and why not when it does not."""
    try:
        from ._native import _core  # noqa: F401
    except ImportError as exc:
        return False, f"the native extension is not built ({exc})"
    return True, ""


def resolve_engine_name(client: object, engine: str | None) -> str:
    """Which engine ``engine`` means for ``client``: ``"native"`` or ``"python"``."""
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
        return "python"
    ok, why = native_available()
    endpoint, why_client = native_endpoint(client)
    if engine == "native":
        if not ok:
            raise ConfigError(f'{source}="native" is unavailable: {why}')
        if endpoint is None:
            raise ConfigError(f'{source}="native" cannot serve this client: {why_client}')
        return "native"
    return "native" if ok and endpoint is not None else "python"


def make_engine(client: object, engine: str | None) -> Engine:
    """Build the engine ``engine`` names for ``client`` (see ``resolve_engine_name``)."""
    name = resolve_engine_name(client, engine)
    if name == "native":
        from .native import NativeEngine

        endpoint, _ = native_endpoint(client)
        assert endpoint is not None
        return NativeEngine(endpoint, write_timeout=write_timeout(client))
    from .python import PythonEngine

    return PythonEngine(client, write_timeout=write_timeout(client))
