"""``redlease bench --plot``: a picture of the measurements, or one line naming the extra."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_helpers import assert_one_line_error, cli_env
from redlease._testing import RedisServer


def test_bench_plot_writes_a_png_with_something_drawn(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "bench.png"
    result = subprocess.run(
        [sys.executable, "-m", "redlease", "bench", "--seconds", "0.3", "--load", "all",
         "--redis", redis_server.url, "--plot", str(out)],
        capture_output=True, text=True, env=cli_env(), timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert f"plot written to {out}" in result.stdout
    for load in ("'idle'", "'python'", "'gil'"):
        assert f"load {load}" in result.stdout  # one table per load

    from matplotlib import image

    pixels = image.imread(str(out))
    height, width = pixels.shape[:2]
    assert width >= 800 and height >= 400
    # Not blank: many distinct colours (curves, bars, text), not a white sheet.
    flat = pixels.reshape(-1, pixels.shape[2])[:, :3]
    assert len({tuple(p) for p in flat[:: 7].tolist()}) > 50
    assert (flat < 0.5).any(axis=1).mean() > 0.01  # a fair share of ink


def test_bench_plot_without_matplotlib_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    # A fresh interpreter where matplotlib cannot be imported; it fails
    # before measuring anything.
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from redlease._cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "bench", "--plot", str(tmp_path / "x.png")],
        capture_output=True, text=True, env=cli_env(), timeout=60,
    )
    line = assert_one_line_error(result, 1)
    assert line == "redlease: --plot needs matplotlib: pip install 'redlease[plot]'"
    assert not (tmp_path / "x.png").exists()


def test_plot_draws_from_results_alone(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from redlease._cli.plot import Curve, draw

    out = tmp_path / "p.png"
    curves = [
        Curve("native", "gil", [0.0, 0.0001, 0.0002, 0.002]),
        Curve("python", "gil", [0.001, 0.05, 0.2, 0.21], kept_lease=False),
        Curve("python", "idle", []),  # nothing measured: no curve, no crash
    ]
    draw(str(out), curves, {"native": 40000.0, "python": 12000.0}, "a test")
    assert out.stat().st_size > 10_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_counts_down_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from redlease._cli.bench import Progress

    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    progress = Progress(total_phases=4, seconds_per_phase=10.0)
    tick = progress.phase("native: renew lateness, gil load", 10.0)
    start = time.monotonic()
    tick(start + 4.0)
    progress.finish()
    out = terminal.getvalue()
    assert "bench [1/4] native: renew lateness, gil load (10 s)" in out
    assert "native: renew lateness, gil load: 6 s left (about 36 s in all)" in out
    assert out.endswith("\r\033[K")


def test_progress_is_plain_lines_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from redlease._cli.bench import Progress

    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    progress = Progress(total_phases=2, seconds_per_phase=10.0)
    tick = progress.phase("python: fenced writes, one thread", 10.0)
    tick(time.monotonic() + 6.0)
    progress.finish()
    assert "\r" not in log.getvalue() and "\033" not in log.getvalue()
    assert log.getvalue().splitlines()[-1].endswith("... 6 s")
