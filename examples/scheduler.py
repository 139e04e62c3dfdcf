"""A scheduler singleton: three replicas, exactly one of them fires the periodic job.

Callback style: each replica runs ``elector.start(lead)``; ``lead`` runs only
while that replica leads and fires the job every 0.2 s, recording each run
through the fence. Half-way through, the leading replica is shut down (as in a
rolling deploy): it releases the lease on its way out and another replica takes
over at once, with a greater token.

    python examples/scheduler.py [--redis URL]

Without --redis (or REDIS_URL) it starts a throwaway embedded redis-server
(``pip install 'redlease[embedded]'``).
"""

from __future__ import annotations

import argparse
import os
import time

import redis

import redlease
from _redis_client import redis_client

NAME = "nightly-report"
RUN_LOG = f"{NAME}:runs"
TICK = 0.2


class Replica:
    """One instance of the service; it fires the job only while it leads."""

    def __init__(self, client: redis.Redis, name: str, t0: float) -> None:
        self.name = name
        self.t0 = t0
        self.fired = 0
        observer = redlease.Observer(
            on_elected=lambda token: self.say(f"elected, token {token}"),
            on_stepped_down=lambda: self.say("stepped down"),
        )
        self.elector = redlease.Elector(
            client, NAME, ttl=1.0, instance_id=name, observer=observer
        )

    def say(self, text: str) -> None:
        print(f"{time.monotonic() - self.t0:5.2f}s  {self.name:<9} {text}", flush=True)

    def lead(self, term: redlease.Term, fencer: redlease.Fencer) -> None:
        # term.wait returns True as soon as the term ends (lost, stopped, resigned).
        while not term.wait(TICK):
            entry = f"{self.name} token {fencer.token} at {time.monotonic() - self.t0:.2f}s"
            applied = fencer.eval("redis.call('rpush', KEYS[2], ARGV[2])", [RUN_LOG], [entry])
            if not applied:
                self.say("fenced out: a newer leader exists, stop firing")
                return
            self.fired += 1
            self.say(f"fired the job (token {fencer.token})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or None)
    args = parser.parse_args()

    with redis_client(args.redis) as client:
        client.delete(RUN_LOG)
        t0 = time.monotonic()
        replicas = [Replica(client, f"replica-{i}", t0) for i in (1, 2, 3)]
        for replica in replicas:
            replica.elector.start(replica.lead)

        time.sleep(0.8)
        leader = next((r for r in replicas if r.elector.is_leader()), None)
        if leader is not None:
            leader.say("shutting down (rolling deploy): releases the lease")
            leader.elector.stop()
        time.sleep(0.8)
        for replica in replicas:
            replica.elector.stop()

        log = client.lrange(RUN_LOG, 0, -1)
        runs = [e.decode() if isinstance(e, bytes) else str(e) for e in log]
        client.delete(RUN_LOG, f"{NAME}:leader", f"{NAME}:fence", f"{NAME}:fence:applied")

    print(f"\n{len(runs)} runs recorded, one replica at a time:")
    for entry in runs:
        print(f"  {entry}")
    firing = [r.name for r in replicas if r.fired]
    print(f"replicas that fired: {', '.join(firing)}, each only while it held the lease")
    return 0 if runs and len(firing) >= 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
