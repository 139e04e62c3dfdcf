"""What a broken or hostile server costs one fenced write: time to the outcome, and peak RSS.

    python benchmarks/hostile.py [--engine native|python|both] [--bound 1.0]

Each row is one way of answering a fenced write (the fake server of
``redlease._testing.fake`` answers the handshake as Redis does, then the
write with the bytes of the row, at the row's pace). The write runs on a
new Elector with the client's ``socket_timeout`` as its bound; the table
says what it raised (or returned) and after how long, and how far this
process's RSS rose above where it was before the row (sampled every 5 ms).
Prints a Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

import redis

import redlease
from redlease._cli.bench import native_engine_available
from redlease._testing.fake import HOSTILE, FakeRedis, Reply

PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 1 << 20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


class PeakRSS:
    """The highest RSS seen while the block runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, rss())

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss())


def one_write(engine: str, reply: Reply, bound: float) -> str:
    """``"<outcome> at <s> s, +<n> MiB"`` for one fenced write answered with ``reply``."""
    with FakeRedis() as fake:
        fake.script("fence_set", reply)
        client = redis.Redis(
            host="127.0.0.1", port=fake.port, socket_timeout=bound, socket_connect_timeout=bound
        )
        elector = redlease.Elector(client, "hostile", engine=engine)
        before = rss()
        with PeakRSS() as peak:
            started = time.monotonic()
            try:
                outcome: Any = f"returned {elector.fence_set(1, 'k', 'v')!r}"
            except Exception as exc:
                outcome = type(exc).__name__
            took = time.monotonic() - started
        client.close()
    grew = (peak.peak - before) / MIB
    return f"{outcome} at {took:.2f} s, +{grew:.0f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--engine", choices=["native", "python", "both"], default="both")
    parser.add_argument("--bound", type=float, default=1.0, help="the client's socket_timeout")
    args = parser.parse_args()
    engines = ["native", "python"] if args.engine == "both" else [args.engine]
    if "native" in engines and not native_engine_available()[0]:
        engines.remove("native")
    print(f"one fenced write, socket_timeout={args.bound:g} s: the outcome, when, peak RSS rise")
    print()
    print("| the server answers | " + " | ".join(f"{e} engine" for e in engines) + " |")
    print("| --- |" + " --- |" * len(engines))
    for label, make in HOSTILE.items():
        cells = [one_write(engine, make(), args.bound) for engine in engines]
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
