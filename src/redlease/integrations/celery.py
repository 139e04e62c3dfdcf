"""Celery: tasks that run only while they hold a lease, and a beat of which one sends.

```python
from redlease.integrations.celery import FencedTask

@app.task(base=FencedTask, bind=True, lock_key="report:{customer_id}", lock_ttl=10.0)
def report(self, customer_id):
    self.lock.fencing_token        # this run's lease, renewed while the task runs
```

``celery beat -S redlease.integrations.celery:LeaderScheduler`` runs any
number of beats, of which the one whose Elector leads sends.

Both find Redis the same way: ``app.conf.redlease_url`` when set, else the
broker URL when it is a Redis one (``redis://``, ``rediss://``, ``unix://``,
kombu's ``redis+socket://``) or a ``valkey://`` one; anything else is a
``redlease.ConfigError`` naming the setting. Celery is imported by this
module only (``pip install 'redlease[celery]'``).
"""

from __future__ import annotations

import inspect
import logging
import math
import os
import string
import threading
import urllib.parse
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

try:
    from celery import Task  # type: ignore[import-untyped]
    from celery.beat import Scheduler  # type: ignore[import-untyped]
    from celery.utils.imports import symbol_by_name  # type: ignore[import-untyped]
    from celery.utils.threads import LocalStack  # type: ignore[import-untyped]
except ImportError:  # pragma: no cover - exercised in a process without the extra
    raise ImportError(
        "redlease.integrations.celery needs Celery: pip install 'redlease[celery]'"
    ) from None

import redlease
from redlease import ConfigError

__all__ = ["FencedTask", "LeaderScheduler", "redis_client"]

logger = logging.getLogger(__name__)

ON_LOCKED = ("skip", "retry", "raise")
DEFAULT_LOCK_TTL = 10.0
DEFAULT_BEAT_TTL = 10.0
DEFAULT_BEAT_SCHEDULER = "celery.beat:PersistentScheduler"

# How often a following beat looks whether it leads now (a local read, no
# round trip): the pushed handover is only as quick as this.
_FOLLOWER_POLL = 0.25

_SOCKET_SCHEMES = ("redis+socket", "socket")  # kombu's spelling of unix://
_URL_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys", *_SOCKET_SCHEMES)
_CERT_REQS = {"CERT_NONE": "none", "CERT_OPTIONAL": "optional", "CERT_REQUIRED": "required"}


# -- where Redis is ----------------------------------------------------------------------


def redis_client(app: Any) -> Any:
    """A new Redis client for ``app``: ``redlease_url``, else a Redis broker URL.

    ``app.conf.redlease_url`` wins when set; else ``broker_url`` is used when
    its scheme is ``redis``, ``rediss``, ``unix``, ``redis+socket``,
    ``valkey`` or ``valkeys`` (with a ``rediss`` broker, ``broker_use_ssl``
    applies too). Anything else (AMQP, SQS, Sentinel, a failover list, no
    broker set) is a ``ConfigError`` that says to set ``redlease_url``.
    """
    url = app.conf.get("redlease_url")
    if url:
        return _client_from_url(url, "redlease_url", {})
    broker = app.conf.get("broker_url")
    if not broker:
        raise ConfigError(
            "neither redlease_url nor broker_url is set (Celery's default broker is AMQP, "
            f"which holds no leases): {_SET_URL}"
        )
    tls = app.conf.get("broker_use_ssl")
    extra = dict(tls) if str(broker).startswith("rediss:") and isinstance(tls, Mapping) else {}
    return _client_from_url(broker, "broker_url", extra)


_SET_URL = "set app.conf.redlease_url to the redis:// URL of the server to lease on"


def _client_from_url(url: object, setting: str, extra: dict[str, Any]) -> Any:
    if not isinstance(url, str) or ";" in url:
        raise ConfigError(f"{setting} must be one URL, got {url!r}: {_SET_URL}")
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _URL_SCHEMES:
        raise ConfigError(
            f"{setting} has the scheme {scheme!r}, not a Redis one ({', '.join(_URL_SCHEMES)}): "
            f"{_SET_URL}"
        )
    # kombu writes redis+socket:// and ssl_cert_reqs=CERT_REQUIRED; redis-py does not.
    scheme = "unix" if scheme in _SOCKET_SCHEMES else scheme
    query = [
        (k, _CERT_REQS.get(v, v) if k == "ssl_cert_reqs" else v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    ]
    url = f"{scheme}://{parts.netloc}{parts.path}?{urllib.parse.urlencode(query)}"
    if scheme.startswith("valkey"):
        try:
            import valkey
        except ImportError:
            raise ConfigError(f"{setting} is a {scheme}:// URL: pip install valkey") from None
        return valkey.Valkey.from_url(url, **extra)
    import redis

    return redis.Redis.from_url(url, **extra)


_lockers: weakref.WeakKeyDictionary[Any, tuple[int, redlease.RedisLocker]] = (
    weakref.WeakKeyDictionary()
)
_lockers_mutex = threading.Lock()


def _locker(app: Any) -> redlease.RedisLocker:
    """``app``'s RedisLocker in this process (a forked worker child makes its own)."""
    pid = os.getpid()
    with _lockers_mutex:
        found = _lockers.get(app)
        if found is None or found[0] != pid:
            found = _lockers[app] = (pid, redlease.RedisLocker(redis_client(app)))
        return found[1]


def _after_fork() -> None:
    global _lockers_mutex
    _lockers_mutex = threading.Lock()  # the parent may have held it as it forked


os.register_at_fork(after_in_child=_after_fork)


# -- FencedTask ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _LockSettings:
    """A FencedTask class's lock settings, validated."""

    template: str | None
    fields: tuple[str, ...]
    ttl: float
    wait: float
    on_locked: str

    @classmethod
    def of(cls, task: type[Any]) -> _LockSettings:
        where = f"FencedTask {getattr(task, 'name', None) or task.__name__}"
        template = getattr(task, "lock_key", None)
        fields: tuple[str, ...] = ()
        if template is not None:
            if not isinstance(template, str) or not template:
                raise ConfigError(
                    f"{where}: lock_key must be a non-empty str template such as "
                    f"'report:{{customer_id}}', got {template!r}"
                )
            fields = _template_fields(template, where)
        on_locked = getattr(task, "on_locked", "skip")
        if on_locked not in ON_LOCKED:
            raise ConfigError(
                f"{where}: on_locked must be one of {', '.join(ON_LOCKED)}, got {on_locked!r}"
            )
        ttl = _seconds(getattr(task, "lock_ttl", DEFAULT_LOCK_TTL), f"{where}: lock_ttl")
        if not math.isfinite(ttl) or ttl < redlease.MIN_AUTO_RENEW_TTL:
            raise ConfigError(
                f"{where}: lock_ttl must be a finite number of seconds of at least "
                f"{redlease.MIN_AUTO_RENEW_TTL} (auto-renewed leases), got {ttl!r}"
            )
        wait = _seconds(getattr(task, "lock_wait", 0.0), f"{where}: lock_wait", zero=True)
        return cls(template, fields, ttl, wait, on_locked)


def _template_fields(template: str, where: str) -> tuple[str, ...]:
    """The argument names ``template`` formats (``{a.b}`` and ``{a[0]}`` name ``a``)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(
            f"{where}: lock_key {template!r} is not a format template: {exc}"
        ) from None
    names = []
    for _, field, _, _ in parsed:
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root.isidentifier():
            raise ConfigError(
                f"{where}: lock_key {template!r} has the field {{{field}}}; each "
                "field must name an argument of the task, as in {customer_id}"
            )
        names.append(root)
    return tuple(dict.fromkeys(names))


def _seconds(value: object, what: str, *, zero: bool = False) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(
            f"{what} must be a number of seconds, got {type(value).__name__} {value!r}"
        )
    if value < 0 or (value == 0 and not zero):
        rule = "at least 0" if zero else "positive"
        raise ConfigError(f"{what} must be {rule}, got {value!r}")
    return float(value)


class FencedTask(Task):  # type: ignore[misc]  # Celery has no type information
    """A Celery task that runs only while it holds its redlease lock.

    Options (task decorator keywords or class attributes):

    - ``lock_key``: a ``str.format`` template of the task's arguments, bound
      to its signature with defaults applied (``"report:{customer_id}"``);
      None (the default) locks on the task's name. A field the signature
      lacks is a ``redlease.ConfigError``, raised by ``apply_async`` and
      ``delay`` before anything is queued, and by the worker for a message
      that bypassed them.
    - ``lock_ttl`` (default 10 s): the lease. It is renewed while the task
      runs, however long it runs, so it only bounds how long a killed
      worker keeps the key.
    - ``lock_wait`` (default 0): how long a run waits for a held key.
    - ``on_locked``: what a run does when the key is held elsewhere:
      ``"skip"`` (the default) returns None without running (logged at
      INFO), ``"retry"`` calls ``self.retry()`` with the task's own retry
      settings, ``"raise"`` raises ``redlease.NotAcquired``.

    The lease is taken when the task starts on a worker, not when it is
    queued, and released on every way out (return, exception, retry). While
    it runs, ``self.lock`` is that run's own ``redlease.Lock`` (concurrent
    runs never share one): its ``fencing_token`` fences writes, and its
    ``done`` event is set when the lease is lost (a WARNING is logged; the
    run's result stands, but another run may have held the key meanwhile).
    """

    lock_key: str | None = None
    lock_ttl: float = DEFAULT_LOCK_TTL
    lock_wait: float = 0.0
    on_locked: str = "skip"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _LockSettings.of(cls)  # a bad option fails when the task is made, loudly
        # Each thread's (or greenlet's) runs of this task, innermost last, as
        # Celery keeps its requests: concurrent runs never see each other's.
        cls._held = LocalStack()

    @property
    def lock(self) -> redlease.Lock:
        """This run's held lock; only inside the task's body."""
        held = self._held.top
        if not isinstance(held, redlease.Lock):
            raise RuntimeError(f"{self.name}.lock is set only while the task runs, in its body")
        return held

    def lock_name(
        self, args: tuple[Any, ...] | list[Any] = (), kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The lock name a run with ``args`` and ``kwargs`` takes (``lock_key`` formatted)."""
        settings = _LockSettings.of(type(self))
        kwargs = dict(kwargs or {})
        if settings.template is None:
            return str(self.name)
        signature = inspect.signature(self.run)
        parameters = signature.parameters
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            missing = [f for f in settings.fields if f not in parameters]
            if missing:
                raise ConfigError(
                    f"FencedTask {self.name}: lock_key {settings.template!r} names "
                    f"{', '.join(missing)}, which the task's signature "
                    f"({', '.join(parameters)}) lacks"
                )
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(
                f"{self.name}{signature} called with args={list(args)!r} kwargs={kwargs!r}: {exc}"
            ) from None
        bound.apply_defaults()
        values = dict(bound.arguments)
        for p in parameters.values():
            if p.kind is p.VAR_KEYWORD:
                values.update(values.pop(p.name, {}))
        try:
            return settings.template.format_map(values)
        except (KeyError, AttributeError, IndexError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"FencedTask {self.name}: lock_key {settings.template!r} cannot be formatted "
                f"with the arguments {values!r}: {type(exc).__name__}: {exc}"
            ) from None

    def apply_async(self, args: Any = None, kwargs: Any = None, *more: Any, **options: Any) -> Any:
        """Queue the task once its lock name is made (else ``ConfigError``: nothing queued)."""
        self.lock_name(tuple(args or ()), dict(kwargs or {}))
        return super().apply_async(args, kwargs, *more, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self.lock_name(args, kwargs)
        settings = _LockSettings.of(type(self))
        locker = _locker(self.app)
        try:
            held = locker.acquire(name, ttl=settings.ttl, wait=settings.wait, auto_renew=True)
        except redlease.NotAcquired as exc:
            if settings.on_locked == "skip":
                logger.info(
                    "%s[%s] skipped: %r is held elsewhere", self.name, self.request.id, name
                )
                return None
            if settings.on_locked == "retry":
                raise self.retry(exc=exc) from None
            raise
        self._held.push(held)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._held.pop()
            self._release(held)

    def _release(self, held: redlease.Lock) -> None:
        run = f"{self.name}[{self.request.id}]"
        lost = held.done.is_set()
        try:
            held.release()
        except redlease.NotHeld:
            lost = True
        except Exception as exc:  # a Redis error: the lease ends on its own within its ttl
            logger.warning(
                "%s could not release %r (%r); it expires by itself", run, held.name, exc
            )
        if lost:
            logger.warning(
                "%s lost its lease on %r (fencing token %d) while it ran: another run may have "
                "held the key meanwhile; writes fenced with this token are rejected",
                *(run, held.name, held.fencing_token),
            )


# -- LeaderScheduler -------------------------------------------------------------------------


class LeaderScheduler(Scheduler):  # type: ignore[misc]  # Celery has no type information
    """A ``celery beat`` scheduler of which any number may run and one sends.

    ``celery beat -S redlease.integrations.celery:LeaderScheduler``. It wraps
    the scheduler named by ``app.conf.redlease_beat_scheduler`` (default
    ``celery.beat:PersistentScheduler``) and ticks it only while its
    ``redlease.Elector`` leads: name ``app.conf.redlease_beat_name`` (default
    ``celery-beat:<app.main>``), ttl ``app.conf.redlease_beat_ttl`` (default
    10 s), client as for ``FencedTask``. The Elector starts on the first
    tick, not when the scheduler is made (``celery beat`` makes throwaway
    ones for its banner). Leadership is checked again before every send: a
    beat that lost its lease sends nothing more from that moment. ``close()``
    (beat's shutdown) releases the lease, so a waiting beat takes over at
    once; a killed one is replaced within the ttl.

    Each beat keeps the wrapped scheduler's own state: with the default
    ``PersistentScheduler`` (one schedule file per beat), a beat that takes
    over sends each entry that fell due while it followed once, at once, as
    a beat that was down does. Wrap a scheduler with a shared store for
    continuity across beats.
    """

    def __init__(self, app: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(app, max_interval=kwargs.get("max_interval"), lazy=True)
        wrapped = app.conf.get("redlease_beat_scheduler") or DEFAULT_BEAT_SCHEDULER
        base = symbol_by_name(wrapped) if isinstance(wrapped, str) else wrapped
        if not (isinstance(base, type) and issubclass(base, Scheduler)) or issubclass(
            base, LeaderScheduler
        ):
            raise ConfigError(
                f"redlease_beat_scheduler must name a celery beat Scheduler class other than "
                f"LeaderScheduler, got {wrapped!r}"
            )
        self.wrapped = base
        self.inner: Any = _gated(base)(app, *args, **kwargs)
        self.inner.redlease_gate = self
        self.max_interval = self.inner.max_interval
        self._mutex = threading.Lock()
        self._elector: redlease.Elector | None = None
        self._leading: bool | None = None
        self._closed = False

    @property
    def elector(self) -> redlease.Elector | None:
        """This beat's Elector, once the first tick started it (None before)."""
        return self._elector

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Tick the wrapped scheduler while leading; else look again soon."""
        elector = self._started()
        if elector is None:  # closed: beat is shutting down
            return _FOLLOWER_POLL
        leading = elector.is_leader()
        if leading != self._leading:
            self._leading = leading
            state = "leads: sending due tasks" if leading else "follows: sending nothing"
            logger.info("beat %r %s", elector.config.name, state)
        if not leading:
            return min(float(self.max_interval), _FOLLOWER_POLL)
        return float(self.inner.tick())

    def may_send(self, entry: Any) -> bool:
        """Whether this beat leads now; checked by the wrapped scheduler before each send."""
        elector = self._elector
        if elector is not None and elector.is_leader() and not self._closed:
            return True
        logger.warning(
            "beat %r does not lead: not sending %s (%s)", self._name(), entry.name, entry.task
        )
        return False

    def _started(self) -> redlease.Elector | None:
        with self._mutex:
            if self._closed:
                return None
            if self._elector is None:
                name = self._name()
                ttl = self.app.conf.get("redlease_beat_ttl")
                ttl = DEFAULT_BEAT_TTL if ttl is None else ttl
                self._elector = redlease.Elector(redis_client(self.app), name, ttl=ttl).start()
                logger.info("beat %r contends as %s", name, self._elector.instance_id)
            return self._elector

    def get_schedule(self) -> Any:
        return self.inner.schedule

    def set_schedule(self, schedule: Any) -> None:
        self.inner.schedule = schedule

    schedule = property(get_schedule, set_schedule)

    def sync(self) -> None:
        if not self._closed:
            self.inner.sync()

    def close(self) -> None:
        """Release the lease (a waiting beat takes over at once), then close the wrapped one."""
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            elector = self._elector
        try:
            if elector is not None:
                elector.stop()
        finally:
            self.inner.close()

    @property
    def info(self) -> str:
        """What ``celery beat`` prints in its banner."""
        inner = self.inner.info
        text = f"redlease leader election {self._name()!r}, wrapping {self.wrapped.__name__}"
        return f"{text} ({inner})" if inner else text

    def _name(self) -> str:
        name = self.app.conf.get("redlease_beat_name")
        return str(name) if name else f"celery-beat:{self.app.main or 'celery'}"


_gated_classes: dict[type[Any], type[Any]] = {}


def _gated(base: type[Any]) -> type[Any]:
    """``base`` with an ``apply_async`` that sends only while its LeaderScheduler leads."""
    found = _gated_classes.get(base)
    if found is not None:
        return found

    def apply_async(
        self: Any, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any
    ) -> Any:
        gate: LeaderScheduler | None = self.redlease_gate
        if gate is not None and not gate.may_send(entry):
            return None
        return base.apply_async(self, entry, producer=producer, advance=advance, **kwargs)

    attributes = {"apply_async": apply_async, "redlease_gate": None, "__doc__": base.__doc__}
    return _gated_classes.setdefault(base, type(base.__name__, (base,), attributes))
