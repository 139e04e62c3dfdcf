"""The native engine on Sentinel and Cluster: renew lateness under a GIL hog,
and how soon an elector leads again after a failover.

    python benchmarks/topology_native.py [--seconds S] [--interval S] [--failovers N]

Starts its own Sentinel set (master, replica, three sentinels) and cluster
(three masters with a replica each) through the test harness. For each:

- renew lateness of a native elector while the main thread runs repeated
  ~200 ms C calls that hold the GIL (``redlease._cli.bench.lateness_under_load``):
  as the renewer saw it (send time minus schedule) and as the serving node saw
  it (MONITOR arrival gaps beyond one interval), p50 / p99 / max in ms;
- the Python engine under the same load, for contrast;
- the time from ``SENTINEL FAILOVER`` / ``CLUSTER FAILOVER`` being issued to the
  elector (TTL 1 s) holding its lease and fence on the new master, and how long
  the topology itself took to name the new master.

Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import redis

import redlease
from redlease._cli.bench import gil_call_size, lateness_under_load, percentile, wait_for_token
from redlease._testing import ClusterSet, RedisServer, SentinelSet, key_slot

TTL = 2.0
FAILOVER_TTL = 1.0


def _fmt(samples: list[float] | None) -> str:
    if not samples:
        return f"{'-':>8} {'-':>8} {'-':>8}"
    ms = [s * 1000 for s in samples]
    return f"{percentile(ms, 50):8.2f} {percentile(ms, 99):8.2f} {max(ms):8.2f}"


def lateness(
    client: Any, node: RedisServer, name: str, engine: str, seconds: float, interval: float, n: int
) -> str:
    errors: list[Exception] = []
    elector = redlease.Elector(
        client,
        name,
        ttl=TTL,
        renew_interval=interval,
        engine=engine,
        observer=redlease.Observer(on_error=errors.append),
    )
    with elector:
        token = wait_for_token(elector, timeout=10.0)
        window = lateness_under_load(elector, token, node.client(), "gil", seconds, n)
    return (
        f"{elector.engine:<7} {_fmt(window.own)}   {_fmt(window.server)}   "
        f"{'yes' if window.kept else 'NO':>4} {len(errors):>6}"
    )


def leads_on(node: RedisServer, elector: redlease.Elector) -> bool:
    token = elector.token()
    if token is None:
        return False
    name = elector.config.name
    c = node.client(socket_timeout=1, socket_connect_timeout=1, retry=None)
    try:
        holder, fence = c.get(f"{name}:leader"), c.get(f"{name}:fence")
    except redis.RedisError:
        return False
    finally:
        c.close()
    return holder == elector.instance_id.encode() and fence is not None and int(fence) == token


def time_failover(
    client: Any, name: str, fault: Callable[[], RedisServer], wait_node: Callable[[], RedisServer]
) -> str:
    stepped: list[int] = []
    elector = redlease.Elector(
        client,
        name,
        ttl=FAILOVER_TTL,
        observer=redlease.Observer(on_stepped_down=lambda: stepped.append(1)),
    )
    with elector:
        first = wait_for_token(elector, timeout=10.0)
        assert wait_node().client().wait(1, 2000) >= 1
        began = time.monotonic()
        new = fault()
        named = time.monotonic() - began
        deadline = time.monotonic() + 30
        while not leads_on(new, elector) and time.monotonic() < deadline:
            time.sleep(0.01)
        leading = time.monotonic() - began
        token = elector.token()
        lost = bool(stepped)
    ok = "yes" if leading < 30 else "NO"
    return (
        f"{elector.engine:<7} {named:9.2f} {leading:9.2f} {ok:>4}   "
        f"token {first} -> {token} ({'re-elected' if lost else 'kept'})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="GIL load per row")
    parser.add_argument("--interval", type=float, default=0.05, help="renew interval")
    parser.add_argument("--failovers", type=int, default=2, help="failovers per topology")
    args = parser.parse_args()
    n = gil_call_size()

    head = (
        f"{'engine':<7} {'own p50':>8} {'p99':>8} {'max':>8}   "
        f"{'srv p50':>8} {'p99':>8} {'max':>8}   {'kept':>4} {'errors':>6}"
    )
    fhead = f"{'engine':<7} {'named (s)':>9} {'leads (s)':>9} {'ok':>4}"
    with SentinelSet() as sentinel:
        print(f"\nSentinel: renew lateness (ms) under a GIL hog, interval {args.interval}s")
        print(head)
        for engine in ("native", "python"):
            client = sentinel.master_for(socket_timeout=1)
            name = f"bench-sn-{engine}"
            print(lateness(client, sentinel.master(), name, engine, args.seconds, args.interval, n))
        print("\nSentinel: SENTINEL FAILOVER -> native elector leading on the new master")
        print(fhead)
        for i in range(args.failovers):
            if i:
                sentinel.wait_settled(60)
            print(
                time_failover(
                    sentinel.master_for(socket_timeout=1, socket_connect_timeout=1),
                    f"bench-sn-fo{i}",
                    lambda: sentinel.node_at(sentinel.failover()),
                    sentinel.master,
                )
            )

    with ClusterSet() as cluster:
        print(f"\nCluster: renew lateness (ms) under a GIL hog, interval {args.interval}s")
        print(head)
        name = "{bench}"
        owner = cluster.node_for_key(name)
        for engine in ("native", "python"):
            client = cluster.client(socket_timeout=1)
            print(lateness(client, owner, name, engine, args.seconds, args.interval, n))
        print("\nCluster: CLUSTER FAILOVER of the slot -> native elector leading on the new owner")
        print(fhead)
        slot = key_slot("{bench-fo}")
        for i in range(args.failovers):
            if i:
                cluster.wait_healthy(60)
            print(
                time_failover(
                    cluster.client(socket_timeout=1, socket_connect_timeout=1),
                    f"{{bench-fo}}:{i}",
                    lambda: cluster.failover(slot),
                    lambda: cluster.master_for_slot(slot),
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
