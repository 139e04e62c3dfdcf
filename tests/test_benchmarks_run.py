"""The benchmarks of the wire's limit and of many leases run, and print what they promise.

``benchmarks/limits.py --quick`` and ``benchmarks/many_leases.py --leases``
each start their own redis-server; these tests run them as a user would and
read the one ``JSON`` line each prints: every figure is there and was
measured. How fast anything was is the benchmarks' business, never asserted
here.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from typing import Any

from helpers import BENCHMARKS, load_benchmark, require_native

CPU_SPLIT = {"sync_cpu_user_us_per_write", "sync_cpu_kernel_us_per_write"}
FIGURES = {
    *CPU_SPLIT,
    "sync_writes_per_s",
    "sync_cpu_us_per_write",
    "pipeline_writes_per_s",
    "pipeline_set_writes_per_s",
    "asyncio_1_task_writes_per_s",
    "asyncio_64_tasks_writes_per_s",
    "threads_8_writes_per_s",
}
WITH_A_LIMIT = {
    "sync_writes_per_s",
    "sync_cpu_us_per_write",
    "pipeline_writes_per_s",
    "pipeline_set_writes_per_s",
    "asyncio_1_task_writes_per_s",
}
TARGETS = {
    "pipeline_writes_per_s",
    "pipeline_set_writes_per_s",
    "sync_cpu_us_per_write",
    "asyncio_1_task_writes_per_s",
}


def run(script: str, *args: str, timeout: float = 50) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_line(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.startswith("JSON ")]
    assert len(lines) == 1, stdout
    report: dict[str, Any] = json.loads(lines[0].removeprefix("JSON "))
    return report


def measured(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_limits_quick_run_measures_every_figure_beside_the_hosts_limit() -> None:
    require_native()
    result = run("limits.py", "--quick")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json_line(result.stdout)

    assert set(report["figures"]) == FIGURES
    for key, figure in report["figures"].items():
        assert set(figure) == {"limit", "native", "python", "redis-py"}, key
        if key in CPU_SPLIT:
            # Tick-sampled on some kernels: a short run may see none of one kind.
            assert all(figure[c] >= 0 for c in figure), (key, figure)
            continue
        assert all(measured(figure[c]) for c in ("native", "python", "redis-py")), (key, figure)
        assert measured(figure["limit"]) if key in WITH_A_LIMIT else figure["limit"] is None
    assert set(report["ratios"]) == WITH_A_LIMIT
    assert set(report["targets"]) == TARGETS
    for target in report["targets"].values():
        assert isinstance(target["met"], bool) and measured(target["measured"])
    assert isinstance(report["pinned"], bool)
    assert ("pinned: this process on CPU" in result.stdout) == report["pinned"]
    for key in TARGETS:
        ratio = report["figures"][key]["native"] / report["figures"][key]["limit"]
        assert report["targets"][key]["measured"] == ratio


def test_many_leases_measures_each_size_and_holds_it_to_the_targets() -> None:
    require_native()
    result = run("many_leases.py", "--leases", "200")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json_line(result.stdout)

    [row] = report["leases"]
    assert row["server"] == "plain" and row["leases"] == 200
    assert row["leading"] == 200
    for key in ("to_lead_s", "stop_all_s", "us_per_lease_to_lead", "us_per_lease_to_stop"):
        assert measured(row[key]), key
    assert row["us_per_lease_to_lead"] == row["to_lead_s"] / 200 * 1e6
    assert isinstance(row["threads_added"], int) and isinstance(row["rss_added_mib"], float)
    assert row["kib_per_lease"] == row["rss_added_mib"] * 1024 / 200
    targets = {t["target"]: t for t in report["targets"]}
    # The memory bound is the for 100,000 leases (see the next test).
    assert set(targets) == {
        "all leading",
        "threads added",
        "to lead, per lease",
        "stop all, per lease",
        "stop() one by one, per stop",
    }
    assert targets["all leading"]["met"] is True
    assert all(isinstance(t["met"], bool) for t in targets.values())


def test_many_leases_holds_memory_per_lease_to_its_bound_from_100000_leases() -> None:
    module = load_benchmark("many_leases.py", "redlease_many_leases")

    def checks(count: int, rss_mib: float) -> dict[str, Any]:
        row = module.Row(
            module.PLAIN_LEASES,
            count,
            to_lead=1.0,
            rss=rss_mib,
            stop_all=1.0,
            stopped_all=count,
            extra={"leading": f"{count}/{count}"},
        )
        return {check.what: check for check in module.lease_targets(row)}

    assert "memory, per lease" not in checks(99_999, 400.0)
    memory = checks(100_000, 300.0)["memory, per lease"]
    assert memory.bound == 3.0 and memory.measured == 300.0 * 1024 / 100_000
    assert memory.met is False  # 3.07 KiB a lease
    assert checks(100_000, 290.0)["memory, per lease"].met is True


def test_bad_options_are_refused_naming_the_rule_and_the_value() -> None:
    rounds = run("limits.py", "--rounds", "0", timeout=20)
    assert rounds.returncode == 2
    assert "--rounds must be at least 1, got 0" in rounds.stderr
    seconds = run("limits.py", "--seconds", "nan", timeout=20)
    assert seconds.returncode == 2
    assert "--seconds must be a finite number of seconds above 0, got nan" in seconds.stderr
    leases = run("many_leases.py", "--leases", "1000,10k", timeout=20)
    assert leases.returncode == 2
    assert "--leases takes whole numbers" in leases.stderr and "'10k'" in leases.stderr
    hold = run("many_leases.py", "--leases", "10", "--cluster", "--hold", "0", timeout=20)
    assert hold.returncode == 2
    assert "--hold must be a positive number of seconds, got 0.0" in hold.stderr


def test_many_leases_holds_a_million_on_the_cluster_to_the_million_lease_targets() -> None:
    module = load_benchmark("many_leases.py", "redlease_many_leases")

    def checks(count: int, to_lead: float, rss_mib: float, threads: int, lost: int) -> dict:
        row = module.Row(
            module.CLUSTER_LEASES,
            count,
            to_lead=to_lead,
            threads=threads,
            rss=rss_mib,
            extra={"leading": f"{count}/{count}", "lost": str(lost)},
        )
        return {check.what: check for check in module.lease_targets(row)}

    small = checks(10_000, 1.0, 20.0, 5, 0)
    # Below a million: the 10,000-in-2-s rate and 4 threads, no memory bound.
    assert small["to lead, per lease"].bound == 200.0
    assert small["threads added"].met is False
    assert "memory, per lease" not in small and small["lost while renewing"].met is True
    million = checks(1_000_000, 59.0, 2_400.0, 6, 0)
    assert million["all leading within"].bound == 60.0 and million["all leading within"].met
    assert million["threads added"].met is True  # 6 allowed at a million
    assert million["memory, per lease"].measured == 2_400.0 * 1024 / 1_000_000
    assert million["memory, per lease"].met is True
    assert checks(1_000_000, 61.0, 2_400.0, 2, 0)["all leading within"].met is False
    assert checks(1_000_000, 50.0, 2_600.0, 2, 0)["memory, per lease"].met is False  # 2.66 KiB
    assert checks(1_000_000, 50.0, 2_400.0, 2, 1)["lost while renewing"].met is False
