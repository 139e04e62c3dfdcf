"""``benchmarks/partitions.py`` runs, reports every figure it promises, and draws its picture.

The benchmark starts its own redis-server; this runs its ``--quick`` version
as a user would and reads the one ``JSON`` line it prints. How fast anything
balanced is the benchmark's business, never asserted here.
"""

from __future__ import annotations

import math
from pathlib import Path

from helpers import require_native
from test_benchmarks_run import json_line, run

SIZE_KEYS = {
    "partitions",
    "members",
    "engine",
    "ttl_s",
    "start_to_balanced_s",
    "threads_added",
    "threads",
    "join_s",
    "leave_s",
    "kill_s",
    "rolling",
}
ROLLING_KEYS = {
    "seconds",
    "looks",
    "longest_unowned_s",
    "most_unowned",
    "restarts_balanced",
    "restarts",
}


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def test_the_quick_run_measures_join_leave_and_kill_and_plots_a_rolling_restart(
    tmp_path: Path,
) -> None:
    require_native()
    picture = tmp_path / "ownership.png"
    result = run("partitions.py", "--quick", "--plot", str(picture), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json_line(result.stdout)

    assert [size["partitions"] for size in report["sizes"]] == [16, 64]
    for size in report["sizes"]:
        assert set(size) == SIZE_KEYS
        assert size["members"] == 8 and size["engine"] == "native"
        assert finite(size["start_to_balanced_s"])
        for change in ("join_s", "leave_s", "kill_s"):
            assert len(size[change]) == 1 and all(finite(s) for s in size[change]), change
        # The driver, the renewer, the notice reader: never a thread per member.
        assert size["threads_added"] == len(size["threads"]) <= 4, size["threads"]
        rolling = size["rolling"]
        assert set(rolling) == ROLLING_KEYS
        assert rolling["restarts_balanced"] == 8 and len(rolling["restarts"]) == 8
        assert rolling["looks"] > 0 and finite(rolling["longest_unowned_s"])
        stopped = [old for _, old, _ in rolling["restarts"]]
        assert len(set(stopped)) == 8, "every member restarted once"
    assert {t["what"].split(":")[0] for t in report["targets"]} == {
        "16 partitions",
        "64 partitions",
    }
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    assert "kill (SIGKILL)" in result.stdout and "rolling restart" in result.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {picture}" in result.stdout


def test_bad_options_are_refused_naming_the_rule_and_the_value() -> None:
    for args, message in [
        (["--partitions", "64,0"], "--partitions takes whole numbers of partitions from 1 to"),
        (["--members", "1"], "--members must be at least 2"),
        (["--ttl", "nan"], "--ttl must be a finite number of seconds of at least 0.1, got nan"),
        (["--rounds", "0"], "--rounds must be at least 1, got 0"),
        (["--plot", "out.svg"], "--plot takes a .png file name, got 'out.svg'"),
    ]:
        result = run("partitions.py", *args, timeout=30)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert message in result.stderr, (args, result.stderr)
