"""Fencing a write that does not go to Redis: a conditional UPDATE in SQL (sqlite3).

redlease mints the tokens; the database enforces them. Every row carries the
token of the term that last wrote it, and a leader writes with

    UPDATE report SET status = ?, fence = ? WHERE id = ? AND fence <= ?

so a write carrying an older token than the row's updates nothing (0 rows):
that leader has been fenced out, by the database itself, atomically with the
write. No Redis round trip is involved in the check.

The scenario: worker A leads and starts a slow job under its token. A goes
away before the job finishes (a deploy, a long pause); worker B is elected
with a greater token and writes. Then A's job finishes and tries to write
its result with the old token: the UPDATE matches no row.

    python examples/sql_fencing.py [--redis URL]

Without --redis (or REDIS_URL) it starts a throwaway embedded redis-server
(``pip install 'redlease[embedded]'``).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from contextlib import closing

import redlease
from _redis_client import redis_client

NAME = "report-builder"


def fenced_update(db: sqlite3.Connection, token: int, report_id: int, status: str) -> bool:
    """Write ``status`` only if ``token`` is at least the row's fence; True when it was written."""
    with db:  # one transaction: the check and the write are one statement anyway
        cursor = db.execute(
            "UPDATE report SET status = ?, fence = ? WHERE id = ? AND fence <= ?",
            (status, token, report_id, token),
        )
    return cursor.rowcount == 1


def elected(elector: redlease.Elector) -> int:
    deadline = time.monotonic() + 5
    while (token := elector.token()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"{elector.instance_id} was not elected")
        time.sleep(0.01)
    return token


def show(db: sqlite3.Connection) -> None:
    status, fence = db.execute("SELECT status, fence FROM report WHERE id = 1").fetchone()
    print(f"    row now: status={status!r}, fence={fence}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL") or None)
    args = parser.parse_args()

    with redis_client(args.redis) as client, closing(sqlite3.connect(":memory:")) as db:
        db.execute("CREATE TABLE report (id INTEGER PRIMARY KEY, status TEXT, fence INTEGER)")
        db.execute("INSERT INTO report VALUES (1, 'pending', 0)")
        db.commit()

        a = redlease.Elector(client, NAME, ttl=1.0, instance_id="worker-A").start()
        token_a = elected(a)
        b = redlease.Elector(client, NAME, ttl=1.0, instance_id="worker-B").start()
        print(f"worker-A leads with token {token_a}")
        ok = fenced_update(db, token_a, 1, "building (A)")
        print(f"  A: UPDATE ... fence <= {token_a}: {'1 row' if ok else '0 rows'}")
        show(db)

        print(f"worker-A starts a slow job under token {token_a}, then goes away")
        a.stop()
        token_b = elected(b)
        print(f"worker-B is elected with token {token_b}")
        ok_b = fenced_update(db, token_b, 1, "built (B)")
        print(f"  B: UPDATE ... fence <= {token_b}: {'1 row' if ok_b else '0 rows'}")
        show(db)

        print(f"worker-A's slow job finishes and writes with its old token {token_a}")
        stale = fenced_update(db, token_a, 1, "built (A, stale)")
        if stale:
            print("  A: 1 row: the stale result overwrote the newer one!")
        else:
            print(f"  A: 0 rows: REJECTED, token {token_a} < the row's fence {token_b}; "
                  "A was fenced out by the database")
        show(db)

        b.stop()
        client.delete(f"{NAME}:leader", f"{NAME}:fence", f"{NAME}:fence:applied")

    return 0 if ok and ok_b and not stale else 1


if __name__ == "__main__":
    raise SystemExit(main())
