"""What one ``redlease bench`` run is: its settings and each engine's result.

Shared by the command that measures (``bench``) and the report that prints
and draws what it measured (``benchreport``).
"""

from __future__ import annotations

from dataclasses import dataclass

TTL = 2.0
"""Lease TTL of the benchmark's electors: long enough to survive a 200 ms GIL hold."""

RENEW_INTERVAL = 0.02
"""Renewal period: many samples per second, far below the TTL."""

GIL_CALL_SECONDS = 0.2

LOAD_DESCRIPTIONS = {
    "idle": "the main thread sleeps",
    "python": "the main thread runs a pure-Python busy loop",
    "gil": f"the main thread makes ~{GIL_CALL_SECONDS * 1000:.0f} ms C calls that hold the GIL, "
    "sum(range(n))",
}


@dataclass
class Result:
    """One engine's measurements, or why it could not be measured."""

    engine: str
    unavailable: str | None = None
    lateness: list[float] | None = None
    server_lateness: list[float] | None = None
    kept_lease: bool = False
    writes_per_second: float = 0.0
