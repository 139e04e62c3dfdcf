"""``--json`` speaks one language across commands: one key per concept, as docs/cli.md says."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import redlease
from cli_helpers import redlease_cli
from helpers import require_valkey, wait_until
from redlease._testing import RedisServer

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

# Each command's keys, as the contract and docs/cli.md name them: a fencing token is
# `token` everywhere, a lease's time left `ttl_ms`, a lock's or permit's label `holder`.
EXPECTED = {
    "status": ["name", "leader", "ttl_ms", "fence", "applied", "server", "engine"],
    "locks": ["name", "kind", "holder", "token", "ttl_ms", "permits"],
    "locks --release": ["name", "kind", "evicted", "mark"],
    "evict": ["name", "evicted", "mark"],
    "partitions": ["partition", "member", "token", "ttl_ms"],
}


def _keys(value: Any) -> set[str]:
    """Every key of every object in ``value``, nested ones too."""
    if isinstance(value, dict):
        return set(value) | set().union(*map(_keys, value.values()))
    if isinstance(value, list):
        return set().union(*map(_keys, value)) if value else set()
    return set()


def _url(server: RedisServer, scheme: str) -> str:
    host, port = server.address
    return f"{scheme}://{host}:{port}/0"


@pytest.mark.parametrize("scheme", ["redis", "valkey"])
def test_every_command_json_uses_one_key_per_concept(
    redis_server: RedisServer, scheme: str
) -> None:
    if scheme == "valkey":
        require_valkey()
    url = _url(redis_server, scheme)
    client = redis_server.client()
    elector = redlease.Elector(client, "keys-job", ttl=30.0, instance_id="box-1")
    group = redlease.Partitions(client, "keys-group", 2, member_id="m1", ttl=5.0)
    with redlease.RedisLocker(client, holder="keys-user") as locker:
        lock = locker.acquire("nightly", ttl=30.0)
        permit = locker.semaphore("pool", 2).try_acquire(ttl=30.0)
        try:
            elector.start()
            group.start()
            wait_until(elector.is_leader, 10.0, what="the elector leads")
            wait_until(lambda: len(group.owned()) == 2, 10.0, what="the group owns both")
            out = {
                "status": redlease_cli("status", "keys-job", "--redis", url, "--json"),
                "locks": redlease_cli("locks", "--redis", url, "--json"),
                "partitions": redlease_cli("partitions", "keys-group", "--redis", url, "--json"),
                "locks --release": redlease_cli(
                    "locks", "--redis", url, "--release", "nightly", "--json"
                ),
                "evict": redlease_cli("evict", "keys-job", "--redis", url, "--json"),
            }
            owned = group.owned()
        finally:
            group.stop(10.0)
            elector.stop(timeout=10.0)
            permit.release()
    client.close()
    parsed = {}
    for command, result in out.items():
        assert result.returncode == 0, (command, result.stderr)
        parsed[command] = json.loads(result.stdout)
    for command, value in parsed.items():
        objects = value if isinstance(value, list) else [value]
        assert objects, command
        for each in objects:
            assert sorted(each) == sorted(EXPECTED[command]), command
        assert "fencing_token" not in _keys(value), command
    # The shared concepts carry the same values under the same keys.
    locks = {(r["kind"], r["name"]): r for r in parsed["locks"]}
    assert locks["lock", "nightly"]["token"] == lock.fencing_token
    assert locks["semaphore", "pool"]["token"] == permit.fencing_token
    assert locks["semaphore", "pool"]["permits"] == 2
    assert {r["partition"]: r["token"] for r in parsed["partitions"]} == owned
    assert parsed["status"]["leader"] == "box-1" and parsed["evict"]["evicted"] == "box-1"
    assert parsed["locks --release"]["evicted"] == "keys-user"
    for command in ("status", "locks", "partitions"):
        rows = parsed[command] if isinstance(parsed[command], list) else [parsed[command]]
        assert all(isinstance(r["ttl_ms"], int) and r["ttl_ms"] > 0 for r in rows), command
    # A concept two commands share has one key: no command names it another way.
    for command, keys in EXPECTED.items():
        assert not {"fencing_token", "ttl", "pttl", "label"} & set(keys), command


def _doc_section(title: str) -> str:
    text = DOCS.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _doc_table(section: str, caption: str) -> list[str]:
    """The first column of the key table after the line ``caption`` in ``section``."""
    after = section[section.index(caption) :]
    rows = re.findall(r"^\| `([a-z_]+)` \|", after.split("\n\n", 2)[1], re.MULTILINE)
    return rows


@pytest.mark.parametrize(
    ("command", "section", "caption"),
    [
        ("status", "status", "`redlease status NAME --json` prints one object:"),
        ("locks", "locks", "`redlease locks --json` prints a list, one object per"),
        ("locks --release", "evict", "`redlease locks --release NAME --json` prints one object:"),
        ("evict", "evict", "`redlease evict NAME --json` prints one object:"),
        ("partitions", "partitions", "`redlease partitions NAME --json` prints a list"),
    ],
)
def test_docs_table_lists_each_commands_json_keys(command: str, section: str, caption: str) -> None:
    assert _doc_table(_doc_section(section), caption) == EXPECTED[command]


def test_docs_synopsis_lists_every_command_and_flag() -> None:
    from redlease._cli import build_parser

    text = DOCS.read_text()
    start = text.index("```text\n") + len("```text\n")
    synopsis = text[start : text.index("```", start)]
    # One entry per line starting "redlease", continued on the indented lines after it.
    entries: dict[str, str] = {}
    for line in synopsis.splitlines():
        if line.startswith("redlease "):
            command = line.split()[1]
        entries[command] = entries.get(command, "") + " " + line
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(entries) == {*sub.choices, "--version"}  # type: ignore[union-attr]
    for name, command in sub.choices.items():  # type: ignore[union-attr]
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in entries[name].split() or f"[{flag}" in entries[name], (
                        name, flag,
                    )
