"""The ``redlease`` command (also ``python -m redlease``): demo, status, locks, evict,
partitions, bench.

Every failure is one line on stderr and a non-zero exit status: 2 for bad
arguments, 1 for everything else (a bad URL, an unreachable server, no
redis-server binary), 130 for Ctrl-C, 143 for SIGTERM. Never a traceback.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

from .. import __version__
from .._keys import ElectionKeys
from ..lock import DEFAULT_PREFIX
from . import schema
from .redisurl import DEFAULT_STATUS_URL, CliError, one_line, url_from
from .topology import TOPOLOGIES


class _Parser(argparse.ArgumentParser):
    """argparse, but an error is one line (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _ttl(text: str) -> float:
    value = _positive_float(text)
    if value < 0.1:
        raise argparse.ArgumentTypeError(f"{text!r} is below the minimum lease TTL of 0.1 s")
    return value


def _contenders(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 2 <= value <= 16:
        raise argparse.ArgumentTypeError(
            f"{value} is out of range: the demo needs 2 to 16 contenders (one must take over)"
        )
    return value


def _token(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a fencing token (a whole number)"
        ) from None
    if not 1 <= value < 2**53:
        raise argparse.ArgumentTypeError(f"{value} is not a fencing token (1 to 2**53 - 1)")
    return value


def _named_command(
    sub: Any, command: str, summary: str, description: str, name_help: str, json_help: str
) -> argparse.ArgumentParser:
    """A command that reads one name at a Redis URL: ``NAME [--redis URL] [--json]``."""
    parser: argparse.ArgumentParser = sub.add_parser(command, help=summary, description=description)
    parser.add_argument("name", metavar="NAME", help=name_help)
    parser.add_argument("--redis", metavar="URL",
                        help=f"Redis URL (default: REDIS_URL, else {DEFAULT_STATUS_URL})")
    parser.add_argument("--json", action="store_true", help=json_help)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``redlease`` command."""
    parser = _Parser(
        prog="redlease",
        description=(
            "Lease-based leader election on Redis with fencing tokens. "
            "--redis defaults to the REDIS_URL environment variable when it is set."
        ),
    )
    parser.add_argument("--version", action="version", version=f"redlease {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    demo = sub.add_parser(
        "demo",
        help="watch contenders elect a leader, freeze it past its lease, and fence it out",
        description=(
            "Runs N contenders (child processes) for one leadership name and prints a timeline: "
            "elections with each term's fencing token, fenced writes, and a leader frozen with "
            "SIGSTOP past its lease whose write on waking is rejected by the fence. Without "
            "--redis (or REDIS_URL) it starts an embedded redis-server on a private unix socket "
            "and removes it afterwards."
        ),
    )
    demo.add_argument("--redis", metavar="URL",
                      help="Redis URL (default: REDIS_URL, else embedded)")
    demo.add_argument("--contenders", type=_contenders, default=3, metavar="N",
                      help="number of contending processes, 2-16 (default 3)")
    demo.add_argument("--ttl", type=_ttl, default=2.0, metavar="S",
                      help="lease TTL in seconds (default 2)")
    demo.add_argument("--duration", type=_positive_float, default=10.0, metavar="S",
                      help="run for about this many seconds; the freeze scenario always "
                      "completes (default 10)")

    keys = ElectionKeys("NAME")
    _named_command(
        sub,
        "status",
        "show an elector's leader, lease, fence and the server's correctness boundary",
        (
            f"Reads {keys.leader}, its PTTL, {keys.fence} and {keys.applied}, and checks the "
            "server settings under which fencing tokens can go backwards (persistence, "
            f"eviction, replication). --redis defaults to REDIS_URL, else {DEFAULT_STATUS_URL}."
        ),
        "the elector's name",
        "print one JSON object: " + ", ".join(schema.STATUS),
    )

    locks = sub.add_parser(
        "locks",
        help="list the locks and semaphores held under a prefix: holder, fencing token, TTL",
        description=(
            "Walks <prefix>key:* (locks) and <prefix>sem:* (semaphores) with SCAN (on a Redis "
            "Cluster, on every master; never KEYS) and reads each lease: the holder's label, "
            "the fencing token and the time left; a semaphore with its permits held out of "
            "its limit, one row per live permit. "
            f"--redis defaults to REDIS_URL, else {DEFAULT_STATUS_URL}."
        ),
    )
    locks.add_argument("--prefix", default=DEFAULT_PREFIX, metavar="P",
                       help=f"the lockers' key prefix (default {DEFAULT_PREFIX})")
    locks.add_argument("--redis", metavar="URL",
                       help=f"Redis URL (default: REDIS_URL, else {DEFAULT_STATUS_URL})")
    locks.add_argument("--json", action="store_true",
                       help="print a JSON list of objects: " + ", ".join(schema.LOCKS)
                       + "; with --release one object: " + ", ".join(schema.RELEASE))
    locks.add_argument("--release", metavar="NAME",
                       help="take the lock NAME from its holder now and fence it out (prints "
                            "who held it and the fencing counter); a semaphore's permit is "
                            "taken with --permit")
    locks.add_argument("--permit", type=_token, metavar="TOKEN",
                       help="with --release NAME: take the permit with this fencing token "
                            "(as listed) of the semaphore NAME")

    _named_command(
        sub,
        "partitions",
        "show who owns each partition of a group, its fencing token and TTL",
        (
            "Reads NAME:partitions (the group's partition set), NAME:members and each "
            "partition's lease NAME:p:<partition>:leader with its PTTL and token, in one round "
            f"trip. --redis defaults to REDIS_URL, else {DEFAULT_STATUS_URL}."
        ),
        "the partition group's name",
        "print a JSON list of objects: " + ", ".join(schema.PARTITIONS),
    )
    _named_command(
        sub,
        "evict",
        "end an elector's term at Redis now: its leader is fenced out at once",
        (
            f"Deletes {keys.leader} and raises {keys.applied} above every token granted, in "
            "one script: the evicted leader's fenced writes are rejected from that moment and "
            "its next renewal ends its term; the contenders are told at once. "
            f"--redis defaults to REDIS_URL, else {DEFAULT_STATUS_URL}."
        ),
        "the elector's name",
        "print one JSON object: " + ", ".join(schema.EVICT),
    )

    bench = sub.add_parser(
        "bench",
        help="renew lateness and fenced-write throughput, engines side by side",
        description=(
            "Measures how late lease renewals are sent while the main thread runs a load "
            "(idle: sleeping; python: a pure-Python busy loop; gil: ~200 ms C calls that hold "
            "the GIL), and how many fenced writes per second one thread gets. Without --redis "
            "(or REDIS_URL) it uses an embedded redis-server."
        ),
    )
    bench.add_argument("--engine", choices=("native", "python", "both"), default="both")
    bench.add_argument("--load", choices=("idle", "python", "gil", "all"), default="gil",
                       help="the main thread's load while renewals are timed; all: each "
                       "in turn (default gil)")
    bench.add_argument("--seconds", type=_positive_float, default=3.0, metavar="S",
                       help="seconds per measurement and engine (default 3)")
    bench.add_argument("--redis", metavar="URL",
                      help="Redis URL (default: REDIS_URL, else embedded)")
    bench.add_argument("--topology", choices=TOPOLOGIES,
                       default="plain",
                       help="plain: --redis or an embedded server; tls, sentinel, cluster, "
                       "tls-sentinel, tls-cluster: private servers of that kind started for "
                       "the run (default plain)")
    bench.add_argument("--plot", metavar="FILE.png",
                       help="also draw the renew-lateness distributions and fenced writes/s "
                       "as a PNG (needs the plot extra: matplotlib)")
    bench.add_argument("--writers", action="store_true",
                       help="also compare fenced writers with redis-py on the same script: "
                       "one thread, asyncio (64 tasks, 1 task), pipelines of 100, and the "
                       "CPU per write (plain or tls topology)")
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C so embedded servers and demo contenders are cleaned up."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run(args: argparse.Namespace) -> int:
    """Dispatch a parsed command line; CliError for reportable failures."""
    if args.command == "status":
        from . import status as _status

        print(_status.run(url_from(args.redis) or DEFAULT_STATUS_URL, args.name, args.json))
        return 0
    if args.command == "locks":
        url = url_from(args.redis) or DEFAULT_STATUS_URL
        if args.release is not None:
            from . import evict as _evict

            print(_evict.run_release(url, args.prefix, args.release, args.permit, args.json))
            return 0
        from . import locks as _locks

        print(_locks.run(url, args.prefix, args.json))
        return 0
    if args.command == "partitions":
        from . import partitions as _partitions

        url = url_from(args.redis) or DEFAULT_STATUS_URL
        print(_partitions.run(url, args.name, args.json))
        return 0
    if args.command == "evict":
        from . import evict as _evict

        print(_evict.run_evict(url_from(args.redis) or DEFAULT_STATUS_URL, args.name, args.json))
        return 0
    if args.command == "demo":
        from . import demo as _demo

        return _demo.main(
            url_from(args.redis),
            contenders=args.contenders,
            ttl=args.ttl,
            duration=args.duration,
        )
    if args.command == "bench":
        from . import bench as _bench

        return _bench.main(
            url_from(args.redis),
            engine=args.engine,
            load=args.load,
            seconds=args.seconds,
            topology=args.topology,
            plot=args.plot,
            writers=args.writers,
        )
    raise CliError(f"unknown command {args.command!r}")  # pragma: no cover - argparse stops it


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``redlease`` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "locks" and args.permit is not None and args.release is None:
        parser.error("locks --permit TOKEN takes a semaphore's permit: add --release NAME")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return run(args)
    except CliError as exc:
        print(f"redlease: {exc}", file=sys.stderr)
        return 1
    except _Terminated:
        print("redlease: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("redlease: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:  # a failure we did not foresee: still one line, no traceback
        print(f"redlease: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
