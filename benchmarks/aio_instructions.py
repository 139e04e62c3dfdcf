"""Instructions per asyncio write, one task: the bare asyncio socket beside both engines.

    python benchmarks/aio_instructions.py [--writes N] [--contenders bare,native,python]

What ``limits.py`` times as "asyncio, 1 task" (the same fenced SET: the
bare asyncio socket's pre-encoded EVALSHA, ``aio.Fencer.set`` on each
engine), counted in instructions instead of seconds: each contender runs in
a process of its own under valgrind's callgrind, once with ``--writes``
writes and once with four times as many, and the difference, divided by the
difference in writes, is what one more write costs the event loop's thread
(start-up, the other threads and redis-server itself are not counted).

The count is the same from run to run whatever else the host is doing, where
a one-task rate is a string of round trips that a busy host slows by a
quarter and more from one run to the next. It says how much of a write's
time is the client's own work; the wall-clock ratio to the bare socket is
then about ``1 - extra / (instructions a round trip is worth)``.

Needs valgrind on PATH. Prints a table and one ``JSON {...}`` line; asserts
nothing. Takes about a minute per contender.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import glob
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONTENDERS = ("bare", "native", "python")
LABELS = {
    "bare": "bare asyncio socket",
    "native": "aio.Fencer.set, native",
    "python": "aio.Fencer.set, python",
}


async def writes(contender: str, port: int, count: int) -> None:
    """``count`` fenced writes, one at a time, after a warm-up (the measured process)."""
    sys.path.insert(0, str(HERE))
    import redis.asyncio

    import redlease.aio
    from bench_aio_writes import NAME, SCRIPT, BareLoopSocket, wait_token

    client = redis.asyncio.Redis(host="127.0.0.1", port=port)
    await client.script_load(SCRIPT.source)
    applied = f"{NAME}-bare:fence:applied"
    await client.set(applied, 1)
    elector = None
    if contender == "bare":
        op = BareLoopSocket(asyncio.get_running_loop(), port, applied).write
    else:
        elector = redlease.aio.Elector(
            redis.asyncio.Redis(host="127.0.0.1", port=port),
            f"{NAME}-{contender}",
            ttl=30.0,  # under valgrind a renewal is slow; the lease must outlast the run
            engine=contender,
        ).start()
        fencer = redlease.aio.Fencer(elector, await wait_token(elector))
        # A C-level call in front, as the bare socket's bound method is: no
        # Python frame of the benchmark's own is counted against the library.
        op = functools.partial(fencer.set, f"{NAME}-{contender}:value")

    for n in range(200):
        await op(n)
    for n in range(count):
        await op(n)
    if elector is not None:
        await elector.stop()
    await client.aclose()


def main_thread_instructions(contender: str, port: int, count: int) -> int:
    """Instructions the event loop's thread ran in a process making ``count`` writes."""
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={out}/cg.%p",
                sys.executable,
                __file__,
                "--child",
                contender,
                str(port),
                str(count),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # The first thread's file is the main thread's, where the loop runs.
        (first,) = glob.glob(f"{out}/cg.*-01")
        for line in Path(first).read_text().splitlines():
            if line.startswith("totals:"):
                return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no totals for {contender}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=1000, help="writes of the shorter run")
    parser.add_argument(
        "--contenders", default=",".join(CONTENDERS), help="any of " + ", ".join(CONTENDERS)
    )
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        contender, port, count = opts.child
        asyncio.run(writes(contender, int(port), int(count)))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not on PATH: it counts the instructions")
    contenders = [c.strip() for c in opts.contenders.split(",") if c.strip()]
    unknown = [c for c in contenders if c not in CONTENDERS]
    if unknown:
        raise SystemExit(f"--contenders names {', '.join(unknown)}: any of {', '.join(CONTENDERS)}")
    from redlease._cli.bench import native_engine_available
    from redlease._testing import RedisServer

    if "native" in contenders and not native_engine_available()[0]:
        contenders.remove("native")
    import redlease._engine.contract.aiowriter as writer

    compiled = not writer.__file__.endswith(".py")
    short, long = opts.writes, 4 * opts.writes
    per_write: dict[str, float] = {}
    with RedisServer() as server:
        assert server.port is not None
        for contender in contenders:
            started = time.monotonic()
            a = main_thread_instructions(contender, server.port, short)
            b = main_thread_instructions(contender, server.port, long)
            per_write[contender] = (b - a) / (long - short)
            print(f"  {contender}: {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(
        f"instructions per fenced write, asyncio, 1 task (event loop thread; "
        f"{long - short} writes counted; asyncio writer {'compiled' if compiled else 'source'})\n"
    )
    base = per_write.get("bare")
    print(f"{'contender':<28}{'instructions':>14}{'/ bare':>10}{'extra':>10}")
    print("-" * 62)
    for contender, count in per_write.items():
        ratio = f"{count / base:.2f}" if base else "-"
        extra = f"{count - base:,.0f}" if base else "-"
        print(f"{LABELS[contender]:<28}{count:>14,.0f}{ratio:>10}{extra:>10}")
    print(
        "JSON "
        + json.dumps(
            {
                "writes": long - short,
                "writer_compiled": compiled,
                "instructions_per_write": per_write,
                "python": sys.version.split()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
