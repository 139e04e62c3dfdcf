"""The engine line ``redlease status`` and ``redlease demo`` print (``redlease.engine_info()``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import ConfigError, EngineInfo, engine_info
from .redisurl import CliError


def _info() -> EngineInfo:
    try:
        return engine_info()
    except ConfigError as exc:  # a bad REDLEASE_ENGINE: what every elector would raise
        raise CliError(str(exc)) from None


def engine_line(info: EngineInfo | None = None) -> str:
    """``engine: native (TLS: yes), redlease 0.1.0``, or the Python engine and why."""
    info = _info() if info is None else info
    if info.engine == "native":
        tls = "yes" if info.tls else f"no, {info.reason}"
        return f"engine: native (TLS: {tls}), redlease {info.version}"
    return f"engine: python \N{EM DASH} {info.reason}, redlease {info.version}"


def engine_json() -> dict[str, Any]:
    """``engine_info()`` as the ``engine`` object of ``redlease status --json``."""
    return dataclasses.asdict(_info())
