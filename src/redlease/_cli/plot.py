"""``redlease bench --plot FILE.png``: the benchmark as one picture (the ``plot`` extra).

Left, the renew-lateness distribution of each engine under each load, as a
cumulative curve on a logarithmic time axis: the further left and the
steeper a curve, the more punctual the renewals; where a curve reaches the
top is the worst renewal. Right, fenced writes per second per engine, as bars.
Colour says the engine, the line style the load.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .redisurl import CliError

PLOT_EXTRA_HINT = "--plot needs matplotlib: pip install 'redlease[plot]'"

ENGINE_COLOURS = {"native": "#1f77b4", "python": "#d62728"}
LOAD_STYLES = {"idle": "-", "python": "--", "gil": ":"}

# Lateness below this is drawn at it: a log axis has no zero, and nothing a
# lease notices happens below a microsecond.
FLOOR_SECONDS = 1e-6


@dataclass
class Curve:
    """One engine's renew-lateness samples under one load."""

    engine: str
    load: str
    samples: Sequence[float]
    kept_lease: bool = True
    at_server: bool = False
    """Whether ``samples`` are the server's view (gaps between arrivals beyond one interval)."""


def require_matplotlib() -> Any:
    """``matplotlib.pyplot`` on a file-only backend, or CliError naming the extra."""
    try:
        import matplotlib
    except ImportError:
        raise CliError(PLOT_EXTRA_HINT) from None
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    return plt


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence."""
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def draw(
    path: str,
    curves: Sequence[Curve],
    writes_per_second: dict[str, float],
    subtitle: str,
) -> None:
    """Write the picture to ``path`` (PNG). CliError when matplotlib is missing."""
    plt = require_matplotlib()
    from matplotlib import ticker
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(12, 5.2), gridspec_kw={"width_ratios": [3.2, 1]}, layout="constrained"
    )
    for curve in curves:
        if not curve.samples:
            continue
        ordered = sorted(max(s, FLOOR_SECONDS) * 1000 for s in curve.samples)
        n = len(ordered)
        fraction = [(i + 1) / n for i in range(n)]
        p99 = percentile(ordered, 99)
        worst = ordered[-1]
        # The count matters: a renewer held up by the GIL sends fewer renewals.
        label = (
            f"{curve.engine}, {curve.load} load: {n} renewals, "
            f"p99 {p99:.3g} ms, max {worst:.3g} ms"
        )
        if not curve.kept_lease:
            label += " (LEASE LOST)"
        left.step(
            ordered,
            fraction,
            where="post",
            color=ENGINE_COLOURS.get(curve.engine, "black"),
            linestyle=LOAD_STYLES.get(curve.load, "-"),
            linewidth=2,
            label=label,
        )
    left.set_xscale("log")
    # Plain numbers (0.01, 1, 100) read faster than powers of ten.
    left.xaxis.set_major_formatter(ticker.FuncFormatter(lambda x, _pos: f"{x:g}"))
    left.set_ylim(0, 1.02)
    left.axhline(0.99, color="grey", linewidth=0.8, linestyle="--")
    left.text(left.get_xlim()[0], 0.99, " p99", va="bottom", ha="left", color="grey", fontsize=8)
    left.axhline(0.5, color="grey", linewidth=0.8, linestyle="--")
    left.text(left.get_xlim()[0], 0.5, " p50", va="bottom", ha="left", color="grey", fontsize=8)
    if curves and all(c.at_server for c in curves if c.samples):
        left.set_xlabel(
            "renewal reached Redis late by, ms (log scale; gap to the previous one beyond "
            "the interval, server's clock; 0.001 = on time)"
        )
    else:
        left.set_xlabel("renewal sent late by (ms, log scale; the renewer's own clock)")
    left.set_ylabel("fraction of renewals at most this late")
    left.set_title("Renew lateness: further left is better")
    left.grid(True, which="both", alpha=0.3)
    left.legend(loc="lower right", fontsize=8)

    engines: list[str] = [e for e in ("native", "python") if e in writes_per_second]
    engines += [e for e in writes_per_second if e not in engines]
    values = [writes_per_second[e] for e in engines]
    bars = right.bar(
        engines, values, color=[ENGINE_COLOURS.get(e, "grey") for e in engines], width=0.6
    )
    for bar, value in zip(bars, values, strict=True):
        right.annotate(
            f"{value:,.0f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    right.set_ylabel("fenced SETs per second")
    right.set_title("Fenced writes, one thread")
    right.margins(y=0.15)
    fig.suptitle(textwrap.fill(f"redlease bench — {subtitle}", 150), fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)
