"""The ``redlease bench`` report: the side-by-side table and the plot of a run.

``render`` is one load's table, both engines side by side with their
ratios; ``draw_plot`` the picture of every load (``_cli.plot`` draws it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .benchrun import LOAD_DESCRIPTIONS, RENEW_INTERVAL, TTL, Result
from .redisurl import CliError, one_line
from .topology import BenchServer


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def render(results: list[Result], load: str, seconds: float, target: BenchServer) -> str:
    """The side-by-side table."""
    lines = [
        f"redlease bench: {seconds:g} s per measurement; load {load!r}: {LOAD_DESCRIPTIONS[load]}",
        f"server: {target.description}",
        f"elector: lease TTL {TTL:g} s, renewal every {RENEW_INTERVAL * 1000:g} ms",
        "",
    ]
    headers = [r.engine for r in results]
    both = len(results) == 2 and all(r.lateness for r in results)
    width = 14
    lines.append(
        f"{'':<26}" + "".join(f"{h:>{width}}" for h in headers)
        + (f"{'python/native':>{width + 2}}" if both else "")
    )

    def row(label: str, cells: list[str], ratio: str = "") -> None:
        lines.append(f"{label:<26}" + "".join(f"{c:>{width}}" for c in cells)
                     + (f"{ratio:>{width + 2}}" if both else ""))

    def cells(fn: Callable[[Result], str]) -> list[str]:
        out = []
        for r in results:
            if r.unavailable is not None:
                out.append("unavailable")
            elif not r.lateness:
                out.append("no samples")
            else:
                out.append(fn(r))
        return out

    def ratio(python: float | None, native: float | None) -> str:
        if not both or python is None or native is None or native <= 0:
            return ""
        return f"{python / native:,.1f}x"

    by_engine = {r.engine: r for r in results}
    row("renewals sent", cells(lambda r: str(len(r.lateness or []))))
    row("renewals at the server", cells(
        lambda r: str(len(r.server_lateness) + 1) if r.server_lateness is not None else "-"))
    for label, q in (("late at the server p50", 50.0), ("late at the server p99", 99.0),
                     ("late at the server max", 100.0)):
        def at_server(r: Result, q: float = q) -> float | None:
            return percentile(r.server_lateness, q) if r.server_lateness else None

        row(label, cells(lambda r: _ms(at_server(r))),
            ratio(*(at_server(by_engine[e]) if e in by_engine else None
                    for e in ("python", "native"))))
    for label, q in (("late by own clock p50", 50.0), ("late by own clock p99", 99.0),
                     ("late by own clock max", 100.0)):
        def at(r: Result, q: float = q) -> float | None:
            return percentile(r.lateness, q) if r.lateness else None

        row(label, cells(lambda r: _ms(at(r))),
            ratio(*(at(by_engine[e]) if e in by_engine else None for e in ("python", "native"))))
    row("lease kept under load", cells(lambda r: "yes" if r.kept_lease else "LOST"))
    row("fenced writes/s", cells(lambda r: f"{r.writes_per_second:,.0f}"),
        ratio(*(by_engine[e].writes_per_second if e in by_engine else None
                for e in ("python", "native"))))
    lines.append("")
    lines.append(
        "late at the server: how much more than one renew interval passed between two "
        "renewals as Redis received them (MONITOR); own clock: send time minus the "
        "renewer's schedule."
    )
    for r in results:
        if r.unavailable is not None:
            lines.append("")
            lines.append(f"{r.engine}: unavailable: {r.unavailable}")
    return "\n".join(line.rstrip() for line in lines)


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    ms = value * 1000
    return f"{ms:.3f} ms" if ms < 10 else f"{ms:.1f} ms"


def draw_plot(
    path: str, by_load: dict[str, list[Result]], seconds: float, target: BenchServer
) -> None:
    """The picture of ``by_load``'s measurements (see ``_cli.plot``)."""
    from . import plot as _plot

    # The server's view when every measurement has it (what the lease
    # feels), else the renewers' own clocks throughout: one scale per picture.
    measured = [
        (this_load, r) for this_load, results in by_load.items() for r in results
        if r.unavailable is None
    ]
    at_server = bool(measured) and all(r.server_lateness is not None for _, r in measured)
    curves = [
        _plot.Curve(
            r.engine,
            this_load,
            (r.server_lateness or []) if at_server else (r.lateness or []),
            r.kept_lease,
            at_server=at_server,
        )
        for this_load, r in measured
    ]
    writes: dict[str, list[float]] = {}
    for results in by_load.values():
        for r in results:
            if r.unavailable is None:
                writes.setdefault(r.engine, []).append(r.writes_per_second)
    subtitle = (
        f"{target.description}; lease TTL {TTL:g} s, renewal every "
        f"{RENEW_INTERVAL * 1000:g} ms, {seconds:g} s per measurement"
    )
    try:
        _plot.draw(path, curves, {e: sum(v) / len(v) for e, v in writes.items()}, subtitle)
    except OSError as exc:
        raise CliError(f"cannot write the plot to {path}: {one_line(exc)}") from None
