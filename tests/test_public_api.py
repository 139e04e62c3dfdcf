# ruff: noqa: E501 - the table holds each signature whole, one per line
"""The public API's signatures and constants, pinned: changing one changes the contract.

Every class, function and method reached from ``redlease``, ``redlease.aio``,
``redlease.lock``, ``redlease.metrics`` and ``redlease.otel`` (their ``__all__``), with each
parameter's name, kind and default (annotations aside: they may name other
internals), and every constant they export with its value. A public name
added, removed or changed fails this test; if the change is meant, DESIGN.md
changes with it, and so do the tables.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import redlease
import redlease.aio
import redlease.lock
import redlease.metrics
import redlease.otel

FACES = (redlease, redlease.aio, redlease.lock, redlease.metrics, redlease.otel)
DUNDERS = ("__enter__", "__exit__", "__aenter__", "__aexit__")

PINNED: dict[str, str | None] = {
    "redlease.Config": "(name, ttl, renew_interval, acquire_interval, instance_id, min_replicas=0, replica_timeout=0.1)",
    "redlease.Config.resolve": "(name, *, ttl=None, renew_interval=None, acquire_interval=None, instance_id=None, min_replicas=0, replica_timeout=None)",
    "redlease.Elector": "(client, name, *, ttl=None, renew_interval=None, acquire_interval=None, instance_id=None, observer=None, engine='auto', min_replicas=0, replica_timeout=None)",
    "redlease.Elector.__enter__": "(self)",
    "redlease.Elector.__exit__": "(self, exc_type, exc, tb)",
    "redlease.Elector.fence_eval": "(self, token, body, keys=(), args=())",
    "redlease.Elector.fence_hset": "(self, token, key, field, value)",
    "redlease.Elector.fence_pipeline": "(self, token)",
    "redlease.Elector.fence_set": "(self, token, key, value)",
    "redlease.Elector.fencer": "(self)",
    "redlease.Elector.is_leader": "(self)",
    "redlease.Elector.leader": "(self)",
    "redlease.Elector.renew_lateness": "(self)",
    "redlease.Elector.renew_lateness_count": "(self)",
    "redlease.Elector.resign": "(self)",
    "redlease.Elector.run": "(self, fn=None, stop=None)",
    "redlease.Elector.start": "(self, fn=None)",
    "redlease.Elector.stop": "(self, timeout=None)",
    "redlease.Elector.token": "(self)",
    "redlease.EngineInfo": "(engine, native_available, reason, tls, version)",
    "redlease.FencedPipeline": "(fence, token)",
    "redlease.FencedPipeline.eval": "(self, body, keys=(), args=())",
    "redlease.FencedPipeline.execute": "(self)",
    "redlease.FencedPipeline.hset": "(self, key, field, value)",
    "redlease.FencedPipeline.hset_many": "(self, key, mapping)",
    "redlease.FencedPipeline.set": "(self, key, value)",
    "redlease.FencedPipeline.set_many": "(self, items)",
    "redlease.Fencer": "(elector, token)",
    "redlease.Fencer.eval": "(self, body, keys=(), args=())",
    "redlease.Fencer.hset": "(self, key, field, value)",
    "redlease.Fencer.pipeline": "(self)",
    "redlease.Fencer.set": "(self, key, value)",
    "redlease.Leader": "(instance_id, ttl_ms)",
    "redlease.Lock": "(locker, name, owner, fencing_token, ttl_ms)",
    "redlease.Lock.refresh": "(self)",
    "redlease.Lock.release": "(self)",
    "redlease.LockHolder": "(holder, fencing_token, ttl_ms)",
    "redlease.Locker": "()",
    "redlease.Locker.__enter__": "(self)",
    "redlease.Locker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.Locker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.Locker.close": "(self)",
    "redlease.Locker.force_release": "(self, name)",
    "redlease.Locker.held": "(self)",
    "redlease.Locker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.Locker.holder": "(self, name)",
    "redlease.Locker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.MemoryLocker": "(*, holder=None)",
    "redlease.MemoryLocker.__enter__": "(self)",
    "redlease.MemoryLocker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.MemoryLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.MemoryLocker.close": "(self)",
    "redlease.MemoryLocker.force_release": "(self, name)",
    "redlease.MemoryLocker.held": "(self)",
    "redlease.MemoryLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.MemoryLocker.holder": "(self, name)",
    "redlease.MemoryLocker.semaphore": "(self, name, permits)",
    "redlease.MemoryLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.Observer": "(on_elected=None, on_stepped_down=None, on_follower=None, on_error=None, on_new_leader=None)",
    "redlease.Partitions": "(client, name, partitions, *, ttl=None, member_id=None, on_assigned=None, on_revoked=None, observer=None, engine='auto')",
    "redlease.Partitions.__enter__": "(self)",
    "redlease.Partitions.__exit__": "(self, exc_type, exc, tb)",
    "redlease.Partitions.assignment": "(self)",
    "redlease.Partitions.fencer": "(self, partition)",
    "redlease.Partitions.members": "(self)",
    "redlease.Partitions.owned": "(self)",
    "redlease.Partitions.start": "(self)",
    "redlease.Partitions.stop": "(self, timeout=None)",
    "redlease.Partitions.wait_owned": "(self, timeout=None)",
    "redlease.RedisLocker": "(client, prefix='redlease:lock:', engine='auto', holder=None, *, min_replicas=0, replica_timeout=None)",
    "redlease.RedisLocker.__enter__": "(self)",
    "redlease.RedisLocker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.RedisLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.RedisLocker.close": "(self)",
    "redlease.RedisLocker.force_release": "(self, name)",
    "redlease.RedisLocker.held": "(self)",
    "redlease.RedisLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.RedisLocker.holder": "(self, name)",
    "redlease.RedisLocker.key": "(self, name)",
    "redlease.RedisLocker.semaphore": "(self, name, permits)",
    "redlease.RedisLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.Semaphore": "(store, name, permits, holders)",
    "redlease.Semaphore.acquire": "(self, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.Semaphore.hold": "(self, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.Semaphore.holders": "(self)",
    "redlease.Semaphore.try_acquire": "(self, *, ttl=30.0, auto_renew=False)",
    "redlease.Term": "(token)",
    "redlease.Term.ended": "(self)",
    "redlease.Term.wait": "(self, timeout=None)",
    "redlease.aio.Elector": "(client, name, *, ttl=None, renew_interval=None, acquire_interval=None, instance_id=None, observer=None, engine='auto', min_replicas=0, replica_timeout=None)",
    "redlease.aio.Elector.__aenter__": "(self)",
    "redlease.aio.Elector.__aexit__": "(self, exc_type, exc, tb)",
    "redlease.aio.Elector.fence_eval": "(self, token, body, keys=(), args=())",
    "redlease.aio.Elector.fence_hset": "(self, token, key, field, value)",
    "redlease.aio.Elector.fence_pipeline": "(self, token)",
    "redlease.aio.Elector.fence_set": "(self, token, key, value)",
    "redlease.aio.Elector.fencer": "(self)",
    "redlease.aio.Elector.is_leader": "(self)",
    "redlease.aio.Elector.leader": "(self)",
    "redlease.aio.Elector.renew_lateness": "(self)",
    "redlease.aio.Elector.renew_lateness_count": "(self)",
    "redlease.aio.Elector.resign": "(self)",
    "redlease.aio.Elector.run": "(self, fn=None, stop=None)",
    "redlease.aio.Elector.start": "(self, fn=None)",
    "redlease.aio.Elector.stop": "(self)",
    "redlease.aio.Elector.token": "(self)",
    "redlease.aio.FencedPipeline": "(fence, token)",
    "redlease.aio.FencedPipeline.eval": "(self, body, keys=(), args=())",
    "redlease.aio.FencedPipeline.execute": "(self)",
    "redlease.aio.FencedPipeline.hset": "(self, key, field, value)",
    "redlease.aio.FencedPipeline.hset_many": "(self, key, mapping)",
    "redlease.aio.FencedPipeline.set": "(self, key, value)",
    "redlease.aio.FencedPipeline.set_many": "(self, items)",
    "redlease.aio.Fencer": "(elector, token)",
    "redlease.aio.Fencer.eval": "(self, body, keys=(), args=())",
    "redlease.aio.Fencer.hset": "(self, key, field, value)",
    "redlease.aio.Fencer.pipeline": "(self)",
    "redlease.aio.Fencer.set": "(self, key, value)",
    "redlease.aio.Lock": "(inner)",
    "redlease.aio.Lock.refresh": "(self)",
    "redlease.aio.Lock.release": "(self)",
    "redlease.aio.MemoryLocker": "(*, holder=None)",
    "redlease.aio.MemoryLocker.__aenter__": "(self)",
    "redlease.aio.MemoryLocker.__aexit__": "(self, *exc_info)",
    "redlease.aio.MemoryLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.aio.MemoryLocker.close": "(self)",
    "redlease.aio.MemoryLocker.force_release": "(self, name)",
    "redlease.aio.MemoryLocker.held": "(self)",
    "redlease.aio.MemoryLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.aio.MemoryLocker.holder": "(self, name)",
    "redlease.aio.MemoryLocker.semaphore": "(self, name, permits)",
    "redlease.aio.MemoryLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.aio.Observer": "(on_elected=None, on_stepped_down=None, on_follower=None, on_error=None, on_new_leader=None)",
    "redlease.aio.Partitions": "(client, name, partitions, *, ttl=None, member_id=None, on_assigned=None, on_revoked=None, observer=None, engine='auto')",
    "redlease.aio.Partitions.__aenter__": "(self)",
    "redlease.aio.Partitions.__aexit__": "(self, exc_type, exc, tb)",
    "redlease.aio.Partitions.assignment": "(self)",
    "redlease.aio.Partitions.fencer": "(self, partition)",
    "redlease.aio.Partitions.members": "(self)",
    "redlease.aio.Partitions.owned": "(self)",
    "redlease.aio.Partitions.start": "(self)",
    "redlease.aio.Partitions.stop": "(self, timeout=None)",
    "redlease.aio.Partitions.wait_owned": "(self, timeout=None)",
    "redlease.aio.RedisLocker": "(client, prefix='redlease:lock:', engine='auto', holder=None, *, min_replicas=0, replica_timeout=None)",
    "redlease.aio.RedisLocker.__aenter__": "(self)",
    "redlease.aio.RedisLocker.__aexit__": "(self, *exc_info)",
    "redlease.aio.RedisLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.aio.RedisLocker.close": "(self)",
    "redlease.aio.RedisLocker.force_release": "(self, name)",
    "redlease.aio.RedisLocker.held": "(self)",
    "redlease.aio.RedisLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.aio.RedisLocker.holder": "(self, name)",
    "redlease.aio.RedisLocker.semaphore": "(self, name, permits)",
    "redlease.aio.RedisLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.aio.Semaphore": "(inner, permits)",
    "redlease.aio.Semaphore.acquire": "(self, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.aio.Semaphore.hold": "(self, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.aio.Semaphore.holders": "(self)",
    "redlease.aio.Semaphore.try_acquire": "(self, *, ttl=30.0, auto_renew=False)",
    "redlease.aio.Term": "(token)",
    "redlease.aio.Term.ended": "(self)",
    "redlease.aio.Term.wait": "(self, timeout=None)",
    "redlease.aio.with_lock": "(locker, name, fn, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.default_locker": "(client=None, *, prefix='redlease:lock:', engine='auto')",
    "redlease.engine_info": "()",
    "redlease.evict": "(client, name)",
    "redlease.stop_all": "(electors, timeout=None)",
    "redlease.lock.Lock": "(locker, name, owner, fencing_token, ttl_ms)",
    "redlease.lock.Lock.refresh": "(self)",
    "redlease.lock.Lock.release": "(self)",
    "redlease.lock.LockHolder": "(holder, fencing_token, ttl_ms)",
    "redlease.lock.Locker": "()",
    "redlease.lock.Locker.__enter__": "(self)",
    "redlease.lock.Locker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.lock.Locker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.lock.Locker.close": "(self)",
    "redlease.lock.Locker.force_release": "(self, name)",
    "redlease.lock.Locker.held": "(self)",
    "redlease.lock.Locker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.lock.Locker.holder": "(self, name)",
    "redlease.lock.Locker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.lock.MemoryLocker": "(*, holder=None)",
    "redlease.lock.MemoryLocker.__enter__": "(self)",
    "redlease.lock.MemoryLocker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.lock.MemoryLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.lock.MemoryLocker.close": "(self)",
    "redlease.lock.MemoryLocker.force_release": "(self, name)",
    "redlease.lock.MemoryLocker.held": "(self)",
    "redlease.lock.MemoryLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.lock.MemoryLocker.holder": "(self, name)",
    "redlease.lock.MemoryLocker.semaphore": "(self, name, permits)",
    "redlease.lock.MemoryLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.lock.RedisLocker": "(client, prefix='redlease:lock:', engine='auto', holder=None, *, min_replicas=0, replica_timeout=None)",
    "redlease.lock.RedisLocker.__enter__": "(self)",
    "redlease.lock.RedisLocker.__exit__": "(self, exc_type, exc, tb)",
    "redlease.lock.RedisLocker.acquire": "(self, name, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.lock.RedisLocker.close": "(self)",
    "redlease.lock.RedisLocker.force_release": "(self, name)",
    "redlease.lock.RedisLocker.held": "(self)",
    "redlease.lock.RedisLocker.hold": "(self, name, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.lock.RedisLocker.holder": "(self, name)",
    "redlease.lock.RedisLocker.key": "(self, name)",
    "redlease.lock.RedisLocker.semaphore": "(self, name, permits)",
    "redlease.lock.RedisLocker.try_acquire": "(self, name, *, ttl=30.0, auto_renew=False)",
    "redlease.lock.Semaphore": "(store, name, permits, holders)",
    "redlease.lock.Semaphore.acquire": "(self, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=False, fair=False)",
    "redlease.lock.Semaphore.hold": "(self, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.lock.Semaphore.holders": "(self)",
    "redlease.lock.Semaphore.try_acquire": "(self, *, ttl=30.0, auto_renew=False)",
    "redlease.lock.default_locker": "(client=None, *, prefix='redlease:lock:', engine='auto')",
    "redlease.lock.with_lock": "(locker, name, fn, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
    "redlease.metrics.instrument": "(target, registry=None)",
    "redlease.otel.instrument": "(tracer_provider=None, meter_provider=None)",
    "redlease.otel.uninstrument": "()",
    "redlease.with_lock": "(locker, name, fn, *, ttl=30.0, wait=0.0, retry_interval=0.1, auto_renew=True)",
}

# The constants, each with its value. ``DEFAULT_TTL`` is the first name of each
# face's own default and stays: the elector's on ``redlease``, the lock's on
# ``redlease.lock``; the names that say whose default it is are the other two.
PINNED_CONSTANTS: dict[str, object] = {
    "redlease.DEFAULT_RETRY_INTERVAL": 0.1,
    "redlease.DEFAULT_TTL": 5.0,
    "redlease.ELECTOR_DEFAULT_TTL": 5.0,
    "redlease.LOCK_DEFAULT_TTL": 30.0,
    "redlease.MIN_AUTO_RENEW_TTL": 0.03,
    "redlease.lock.DEFAULT_PREFIX": "redlease:lock:",
    "redlease.lock.DEFAULT_RETRY_INTERVAL": 0.1,
    "redlease.lock.DEFAULT_TTL": 30.0,
    "redlease.lock.LOCK_DEFAULT_TTL": 30.0,
    "redlease.lock.MIN_AUTO_RENEW_TTL": 0.03,
}


def bare(obj: Any) -> str | None:
    """``obj``'s signature without annotations, or None when it has none to show."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    empty = inspect.Parameter.empty
    params = [p.replace(annotation=empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=empty))


def public_signatures() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for face in FACES:
        names = getattr(face, "__all__", None) or [n for n in vars(face) if not n.startswith("_")]
        for name in sorted(names):
            obj = getattr(face, name)
            key = f"{face.__name__}.{name}"
            if inspect.ismodule(obj) or (inspect.isclass(obj) and issubclass(obj, BaseException)):
                continue
            if not inspect.isclass(obj):
                if callable(obj):
                    found[key] = bare(obj)
                continue
            found[key] = bare(obj)
            for member in sorted(dir(obj)):
                if member.startswith("_") and member not in DUNDERS:
                    continue
                if isinstance(inspect.getattr_static(obj, member), property):
                    continue
                value = getattr(obj, member)
                if callable(value):
                    found[f"{key}.{member}"] = bare(value)
    return found


def test_every_public_signature_is_the_pinned_one() -> None:
    found = public_signatures()
    changed = sorted(
        f"{key}: {found[key]} (pinned: {PINNED[key]})"
        for key in found.keys() & PINNED.keys()
        if found[key] != PINNED[key]
    )
    added = sorted(found.keys() - PINNED.keys())
    gone = sorted(PINNED.keys() - found.keys())
    assert not changed, "signatures changed:\n" + "\n".join(changed)
    assert not added, "public callables not pinned:\n" + "\n".join(added)
    assert not gone, "pinned callables gone:\n" + "\n".join(gone)


def public_constants() -> dict[str, object]:
    """Every exported name that is neither a module, a class nor a callable (the version aside)."""
    found: dict[str, object] = {}
    for face in FACES:
        for name in sorted(getattr(face, "__all__", ())):
            obj = getattr(face, name)
            if name == "__version__" or inspect.ismodule(obj) or inspect.isclass(obj):
                continue
            if not callable(obj):
                found[f"{face.__name__}.{name}"] = obj
    return found


def test_every_public_constant_is_the_pinned_one() -> None:
    assert public_constants() == PINNED_CONSTANTS


def test_each_default_ttl_is_the_one_its_name_says() -> None:
    """The old names are the new ones, not copies that could drift apart."""
    assert redlease.DEFAULT_TTL is redlease.ELECTOR_DEFAULT_TTL
    assert redlease.lock.DEFAULT_TTL is redlease.lock.LOCK_DEFAULT_TTL
    assert redlease.LOCK_DEFAULT_TTL is redlease.lock.LOCK_DEFAULT_TTL
    assert redlease.Config.resolve("svc").ttl == redlease.ELECTOR_DEFAULT_TTL
    assert inspect.signature(redlease.MemoryLocker.acquire).parameters["ttl"].default == (
        redlease.LOCK_DEFAULT_TTL
    )


def test_the_pin_sees_a_changed_default() -> None:
    def acquire(name: str, *, ttl: float = 30.0) -> None: ...

    def acquire_changed(name: str, *, ttl: float = 10.0) -> None: ...

    assert bare(acquire) == "(name, *, ttl=30.0)"
    assert bare(acquire) != bare(acquire_changed)


def test_lock_faces_are_what_they_say_they_are() -> None:
    """The lock faces take their parameters from one list each, and stay what users detect:
    the asyncio ones coroutine functions (``hold``: a context manager), named as written."""
    import redlease.aio

    for face in (redlease.aio.RedisLocker, redlease.aio.MemoryLocker):
        assert inspect.iscoroutinefunction(face.acquire)
        assert inspect.iscoroutinefunction(face.try_acquire)
        assert not inspect.iscoroutinefunction(face.hold)
    for sem in (redlease.aio.Semaphore.acquire, redlease.aio.Semaphore.try_acquire):
        assert inspect.iscoroutinefunction(sem)
    for face in (redlease.RedisLocker, redlease.MemoryLocker, redlease.Semaphore):
        assert not inspect.iscoroutinefunction(face.acquire)
        assert face.acquire.__name__ == "acquire"
        assert "fair" in (face.acquire.__doc__ or "")


def test_a_misspelled_lock_argument_is_a_type_error_and_takes_nothing() -> None:
    locker = redlease.MemoryLocker()
    with pytest.raises(
        TypeError, match=r"^MemoryLocker\.acquire\(\) got an unexpected keyword argument 'tll'"
    ):
        locker.acquire("job", tll=5)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="tll"), locker.hold("job", tll=5):  # type: ignore[call-arg]
        pass
    with pytest.raises(TypeError, match=r"^MemoryLocker\.try_acquire\(\) .* 'fair'"):
        locker.try_acquire("job", fair=True)  # type: ignore[call-arg]
    assert locker.holder("job") is None
    locker.acquire(name="job", ttl=5).release()  # the name by keyword, as before
