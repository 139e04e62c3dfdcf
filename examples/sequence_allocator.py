"""A fenced sequence allocator: numbers that never repeat, even across a leader change.

Token-driven style: each allocator instance keeps itself elected with
``elector.start()`` (no callback) and its request handlers read
``elector.token()``. The leader hands out numbers from memory and persists the
next free number with ``fence_set`` *before* handing a number out; only a
persisted number is ever returned.

The interesting part is a handler that started under an old term. Allocator A
reads its token and the next number, then is delayed (a slow request, a
pause). Meanwhile A shuts down and B takes over, loads the persisted next number
and hands out numbers itself. When A's delayed handler finally persists, its
token is stale and the fence rejects it, so the number it was about to return
is never handed out twice. (Within one term the leader serves its own requests
one at a time; the fence is what guards against a *previous* term.)

    python examples/sequence_allocator.py [--redis URL]

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

NAME = "invoice-numbers"
NEXT_KEY = f"{NAME}:next"


class Allocator:
    """One allocator instance. ``allocate()`` works only while it leads."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client = client
        self.name = name
        self.elector = redlease.Elector(client, NAME, ttl=1.0, instance_id=name)

    def begin(self) -> tuple[int, int] | None:
        """First half of a request: our token and the next number, or None when not leading."""
        token = self.elector.token()
        if token is None:
            return None
        return token, int(self.client.get(NEXT_KEY) or 1)

    def commit(self, token: int, number: int) -> int | None:
        """Second half: persist number + 1 under the fence; the number is ours only if applied."""
        if self.elector.fence_set(token, NEXT_KEY, number + 1):
            return number
        return None

    def allocate(self) -> int | None:
        started = self.begin()
        return None if started is None else self.commit(*started)


def wait_for_leadership(allocator: Allocator) -> int:
    deadline = time.monotonic() + 5
    while (token := allocator.elector.token()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"{allocator.name} was not elected")
        time.sleep(0.01)
    return token


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or None)
    args = parser.parse_args()

    handed_out: list[tuple[str, int]] = []
    with redis_client(args.redis) as client:
        client.delete(NEXT_KEY)
        a, b = Allocator(client, "alloc-A"), Allocator(client, "alloc-B")
        a.elector.start()
        print(f"alloc-A leads with token {wait_for_leadership(a)}")
        b.elector.start()

        for _ in range(3):
            number = a.allocate()
            assert number is not None
            handed_out.append((a.name, number))
            print(f"  alloc-A hands out {number}")

        delayed = a.begin()  # a request that reads token and number, then stalls
        assert delayed is not None
        print(f"alloc-A starts a request with token {delayed[0]}, about to hand out "
              f"{delayed[1]} ... and stalls")

        a.elector.stop()  # A goes away (deploy, crash); B takes over
        print(f"alloc-A stops; alloc-B leads with token {wait_for_leadership(b)}")
        for _ in range(3):
            number = b.allocate()
            assert number is not None
            handed_out.append((b.name, number))
            print(f"  alloc-B hands out {number}")

        print(f"alloc-A's stalled request resumes with token {delayed[0]} ...")
        number = a.commit(*delayed)
        if number is None:
            print(f"  REJECTED by the fence: token {delayed[0]} is stale, {delayed[1]} is NOT "
                  "handed out a second time")
        else:
            handed_out.append((a.name, number))
            print(f"  alloc-A hands out {number}")

        b.elector.stop()
        client.delete(NEXT_KEY, f"{NAME}:leader", f"{NAME}:fence", f"{NAME}:fence:applied")

    numbers = [n for _, n in handed_out]
    print(f"\nhanded out: {numbers}")
    unique = len(numbers) == len(set(numbers))
    print("every number handed out once" if unique else "DUPLICATE numbers handed out")
    return 0 if unique and number is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
