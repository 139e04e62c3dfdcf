"""``redlease status NAME``: who leads, the fence, and whether the server can keep it sound."""

from __future__ import annotations

import json
from typing import Any

import redis

from .. import EngineInfo
from .._keys import ElectionKeys
from . import schema
from .engineline import engine_json, engine_line
from .redisurl import (
    CliError,
    errors,
    on_redis,
    one_line,
    redact,
    reply_text,
)


def collect(client: redis.Redis, name: str, url: str) -> dict[str, Any]:
    """Everything ``status`` reports, as one JSON-able dict."""
    keys = ElectionKeys(name)
    pipe = client.pipeline(transaction=False)
    pipe.get(keys.leader)
    pipe.pttl(keys.leader)
    pipe.get(keys.fence)
    pipe.get(keys.applied)
    leader, pttl, fence, applied = pipe.execute()
    return schema.record(
        schema.STATUS,
        name=name,
        leader=reply_text(leader),
        # PTTL: -2 no key (no leader), -1 a key without expiry (not one of ours)
        ttl_ms=int(pttl) if leader is not None and int(pttl) >= 0 else None,
        fence=_int(fence),
        applied=_int(applied),
        server=server_boundary(client, url),
        # What this process's electors would run on (engine="auto"), and why.
        engine=engine_json(),
    )


def server_boundary(client: redis.Redis, url: str) -> dict[str, Any]:
    """The server settings that decide whether fence tokens can go backwards, with warnings."""
    info: dict[str, Any] = {}
    try:
        info = dict(client.info("server"))
        info.update(client.info("replication"))
        info.update(client.info("cluster"))
    except errors("ResponseError"):
        pass  # INFO renamed or restricted on some managed services; report what we have
    config: dict[str, str] = {}
    config_error: str | None = None
    for param in ("appendonly", "appendfsync", "save", "maxmemory-policy"):
        try:
            config.update({str(k): str(v) for k, v in client.config_get(param).items()})
        except errors("ResponseError") as exc:
            config_error = one_line(exc)
    role = info.get("role")
    replicas = info.get("connected_slaves")
    server: dict[str, Any] = {
        "url": redact(url),
        "version": info.get("redis_version"),
        "role": role,
        "connected_replicas": int(replicas) if replicas is not None else None,
        "cluster": bool(info.get("cluster_enabled", 0)),
        "appendonly": config.get("appendonly"),
        "appendfsync": config.get("appendfsync"),
        "save": config.get("save"),
        "maxmemory_policy": config.get("maxmemory-policy"),
    }
    warnings = boundary_warnings(server)
    if config_error is not None:
        warnings.append(
            f"CONFIG GET is not allowed here ({config_error}); persistence and eviction "
            "settings could not be checked"
        )
    server["warnings"] = warnings
    server["tokens_can_regress"] = bool(warnings)
    return server


def boundary_warnings(server: dict[str, Any]) -> list[str]:
    """One sentence for every setting under which the fence counter can go backwards."""
    warnings: list[str] = []
    aof, fsync, save = server["appendonly"], server["appendfsync"], server["save"]
    if aof == "no" and save is not None:
        if save.strip():
            warnings.append(
                f"persistence is RDB snapshots only (save {save!r}): a crash-restart can bring "
                "back an older fence counter; use appendonly yes + appendfsync always"
            )
        else:
            warnings.append(
                "no persistence (appendonly no, save ''): a restart loses the fence and tokens "
                "start again at 1; use appendonly yes + appendfsync always"
            )
    elif aof == "yes" and fsync == "everysec":
        warnings.append(
            "appendfsync everysec: a crash can lose the last second of writes, fence "
            "increments included; only appendfsync always makes the counter durable"
        )
    elif aof == "yes" and fsync == "no":
        warnings.append(
            "appendfsync no: the OS decides when the AOF reaches disk, so a crash can lose "
            "fence increments; use appendfsync always"
        )
    policy = server["maxmemory_policy"]
    if policy is not None and policy.startswith("allkeys-"):
        warnings.append(
            f"maxmemory-policy {policy} may evict the fence keys (they have no TTL) and "
            "reset the counter; use noeviction or a volatile-* policy"
        )
    role = server["role"]
    if role in ("slave", "replica"):
        warnings.append(
            "this server is a replica: writes go to its primary, and replication is "
            "asynchronous, so a failover can lose the newest tokens"
        )
    elif server["connected_replicas"]:
        warnings.append(
            f"this primary has {server['connected_replicas']} replica(s): replication is "
            "asynchronous, so a failover can lose the newest tokens"
        )
    if server["cluster"]:
        warnings.append(
            "cluster mode: a failover can lose the newest tokens, and the name must carry a "
            "{hash tag} so its keys share a slot"
        )
    return warnings


def run(url: str, name: str, as_json: bool) -> str:
    """The text ``redlease status`` prints (CliError when Redis cannot be read)."""
    if not name:
        raise CliError("the elector name must not be empty")
    report = on_redis(
        url, f"elector {name!r}", lambda client: collect(client, name, url), cluster=False
    )
    if as_json:
        return json.dumps(report, sort_keys=True)
    return render(report)


def render(report: dict[str, Any]) -> str:
    """The human-readable form of a status report."""
    server = report["server"]
    leader = report["leader"]
    ttl_ms = report["ttl_ms"]
    if leader is None:
        who = "none (no live lease)"
    elif ttl_ms is None:
        who = f"{leader} (the key has no expiry: not a lease this library wrote)"
    else:
        who = f"{leader} (lease expires in {ttl_ms / 1000:.3f} s)"
    lines = [
        f"elector    {report['name']}",
        f"leader     {who}",
        f"fence      {_show(report['fence'])}   (tokens minted so far; the next term gets more)",
        f"applied    {_show(report['applied'])}   (high-water mark: writes below it are rejected)",
        "",
        f"server     {server['url']}"
        + (f"  redis {server['version']}" if server["version"] else "")
        + (f"  role {server['role']}" if server["role"] else ""),
        f"persist    appendonly {_show(server['appendonly'])}, "
        f"appendfsync {_show(server['appendfsync'])}, save {_show_save(server['save'])}",
        f"eviction   maxmemory-policy {_show(server['maxmemory_policy'])}",
    ]
    lines.append(engine_line(EngineInfo(**report["engine"])))
    if server["warnings"]:
        lines.append("")
        lines.append("correctness boundary: tokens CAN go backwards on this server")
        lines.extend(f"  ! {w}" for w in server["warnings"])
    else:
        lines.append("")
        lines.append("correctness boundary: ok (durable AOF, no key eviction, no replication)")
    return "\n".join(lines)


def _int(value: Any) -> int | None:
    text = reply_text(value)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        try:
            return int(float(text))
        except ValueError:
            return None


def _show(value: Any) -> str:
    return "-" if value is None else str(value)


def _show_save(value: str | None) -> str:
    if value is None:
        return "-"
    return repr(value) if value.strip() else "'' (no snapshots)"
