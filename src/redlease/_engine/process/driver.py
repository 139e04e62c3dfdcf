"""One thread that drives every started election, partition group member and lock watchdog.

A run started with ``Elector.start()`` used to own a thread that spent its
life asleep: polling as a follower, waiting on its keeper as a leader. The
driver runs all of them as scheduled steps on one thread instead:

* a contending run is a timer: one acquire per step, the next step when the
  poll delay says;
* a leading run (and a lock's watchdog) is a *watch*: nothing happens until
  its keeper reports something (a loss, an error, ``notify()``). A native
  renewer lists its watched leases as they are woken, so a sweep looks at
  the ones that changed and at no other (what a sweep costs follows what
  changed, not how many leases there are); other keepers are looked at
  every ``TICK``.

With a leader function, the function runs on a thread of its own, as the
contract says; nothing else of the run has a thread. A partition group's
member is a timer too (``_election.memberloop``), its heartbeat watched; its
callbacks, when it has any, run on a thread of its own. Callbacks (observer,
events) run on the driver thread, or on the thread that calls ``stop()``
when the run is ended there.

The driver sleeps on a doorbell (an eventfd, else a pipe) with the GIL
released, until the next item is due. ``schedule``/``poke``/``watch`` ring
it from Python; a native notice reader rings it without the GIL (see
``_engine.nativenotices.DriverNotices``), and what rang is found by the
driver's ring hooks, which run on the driver thread after every wake-up.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import select
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol, cast

from .forksafe import ForkSafeLock

TICK = 0.05
"""How often watched keepers are looked at (seconds), at most."""

BATCH = 512
"""At most this many acquires share one round trip."""

BATCH_TIMEOUT = 2.0
"""The bound of one batched round trip (seconds)."""

_SMALL_DICT = 4096
"""An empty dict larger than this (bytes) is replaced by a new one."""


class Watched(Protocol):
    """Something the driver looks at when its keeper reports a change."""

    keeper: Any

    def check(self) -> bool:
        """Handle what happened; True when the item needs no more watching."""
        ...


class Timed(Protocol):
    """Something the driver steps on a schedule."""

    def step(self) -> float | None:
        """One step; the ``time.monotonic()`` of the next one, or None for none."""
        ...


class Contender(Timed, Protocol):
    """A timed item whose next step sends an acquire, which the driver may batch.

    An item offers this by having ``hold_acquire``; the driver sends the
    acquires of due contenders on one engine in shared round trips, and each
    step then reads its own reply.
    """

    def hold_acquire(self) -> tuple[object, Any, Any] | None:
        """``(route, engine, request)`` of the acquire the next step would send now, or None.

        Acquires of one ``route`` (hashable: an engine, or an engine and a
        cluster node) share round trips on ``engine``. When it returns a
        request the item is held (no step or stop of it runs) until
        ``prefetch`` or ``unhold``; when it returns None it is not held.
        """
        ...

    def prefetch(self, reply: Any, sent: float) -> None:
        """The batched acquire's reply (or the exception in its place); ends the hold.

        A reply that says the acquire did not run and belongs to another node
        is dropped: the step sends the acquire alone."""
        ...

    def unhold(self) -> None:
        """End the hold without a reply (the batch was not sent)."""
        ...


def execute_batch(engine: Any, requests: list[Any]) -> list[Any]:
    """At most ``BATCH`` calls in one round trip: a reply each, or the exception in
    its place (one that failed the whole batch is each call's)."""
    try:
        replies: list[Any] = engine.execute(requests, timeout=BATCH_TIMEOUT)[0]
        if len(replies) != len(requests):
            raise RuntimeError(f"a batch of {len(requests)} calls got {len(replies)} replies")
    except Exception as exc:
        replies = [exc] * len(requests)
    return replies


def _lister(keeper: Any) -> Any:
    """The native renewer that lists ``keeper``'s wake-ups, or None (look at it every tick)."""
    renewer = getattr(keeper, "renewer", None)
    return renewer if hasattr(renewer, "take_changed") else None


class _Group:
    """The watched items whose keepers one renewer lists (or, without one, every other)."""

    __slots__ = ("fresh", "items", "lister")

    def __init__(self, lister: Any) -> None:
        self.lister = lister
        # By their keeper's handle on a lister, else by themselves.
        self.items: dict[Any, Watched] = {}
        # Watched since the last sweep: looked at once whatever was listed,
        # as a change before the watch began is in no list.
        self.fresh: dict[Watched, None] = {}

    @staticmethod
    def key(item: Watched, lister: Any) -> Any:
        return item.keeper.handle if lister is not None else item


class _Doorbell:
    """A file descriptor the driver sleeps on; any thread (or native code) writes it to wake it.

    An eventfd where there is one (``fd`` is then what a writer writes 8
    bytes to), else a pipe.
    """

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self.read_fd = self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - platforms without eventfd
            self.read_fd, self.fd = os.pipe()
            for fd in (self.read_fd, self.fd):
                os.set_blocking(fd, False)
        self._poller = select.poll()
        self._poller.register(self.read_fd, select.POLLIN)

    def ring(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: it rings already
            os.write(self.fd, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    def sleep(self, seconds: float | None) -> None:
        """Sleep (GIL released) until rung or ``seconds`` passed (None: no limit); then quiet it."""
        self._poller.poll(None if seconds is None else max(seconds, 0.0) * 1000.0)
        # Emptied before the ring hooks look: a ring after this is seen by
        # the next sleep, which then returns at once.
        with contextlib.suppress(BlockingIOError):
            while os.read(self.read_fd, 4096) and self.read_fd != self.fd:
                pass

    def close(self) -> None:
        for fd in {self.read_fd, self.fd}:
            with contextlib.suppress(OSError):
                os.close(fd)


class Driver:
    """The one driver thread of the process (see the module doc). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bell = _Doorbell()
        # True while the driver sleeps (or is about to) on its doorbell: the
        # next wake-up from Python must ring it. Guarded by the lock.
        self._sleeping = False
        self._ring_hooks: tuple[Callable[[], object], ...] = ()
        # Entries ``[when, seq, item]``; an entry an item's later schedule or
        # poke replaced has its item cleared (None), so a stopped run is not
        # kept alive (its engine, renewer thread and connections with it) until
        # a time it was scheduled for long ago passes.
        self._heap: list[list[Any]] = []
        self._ready: deque[Timed] = deque()
        self._seq = itertools.count()
        # Each item's latest heap entry: an entry an earlier schedule left
        # (the item was poked or rescheduled since) is cleared and skipped, so
        # a poke never doubles an item's polling.
        self._latest: dict[Timed, list[Any]] = {}
        # Watched items, grouped by the renewer that lists their changes (0: none).
        self._watched: dict[int, _Group] = {}
        self._thread: threading.Thread | None = None
        self._last_sweep = 0.0
        self.batched_acquires = 0
        """Acquires sent in shared round trips so far (for tests and benchmarks)."""

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def doorbell(self) -> int:
        """The descriptor that wakes the driver when 8 bytes (a count of 1) are written to it."""
        return self._bell.fd

    def on_ring(self, hook: Callable[[], object]) -> None:
        """Call ``hook()`` on the driver thread after every wake-up (to find what rang)."""
        with self._lock:
            self._ring_hooks = (*self._ring_hooks, hook)
            self._ensure_thread()

    def schedule(self, item: Timed, when: float) -> None:
        """Step ``item`` at ``when`` (``time.monotonic()``)."""
        with self._lock:
            self._unschedule(item)
            entry = [when, next(self._seq), item]
            self._latest[item] = entry
            heapq.heappush(self._heap, entry)
            self._ensure_thread()
            if self._heap[0][2] is item:
                self._wake()

    def poke(self, item: Timed) -> None:
        """Step ``item`` as soon as the driver can."""
        with self._lock:
            self._unschedule(item)
            self._ready.append(item)
            self._ensure_thread()
            self._wake()

    def watch(self, item: Watched) -> None:
        """Call ``item.check()`` whenever its keeper reports a change, until it returns True."""
        lister = _lister(item.keeper)
        source = id(lister) if lister is not None else 0
        with self._lock:
            group = self._watched.get(source)
            if group is None:
                group = self._watched[source] = _Group(lister)
            group.items[_Group.key(item, lister)] = item
            group.fresh[item] = None  # looked at on the next sweep
            if lister is not None:
                item.keeper.watch_changes(True)
            self._ensure_thread()
            self._wake()  # it may be waiting with nothing to watch

    def forget(self, item: Watched) -> None:
        """``item`` has ended: neither its watch nor a step it was scheduled for holds it.

        A run stopped on the caller's thread while scheduled far ahead (a
        contender's next acquire) is then let go at once, with what only it
        holds (its engine, renewer and connections), not when that time comes.
        """
        with self._lock:
            # A watched item that is also stepped (a run) may have a schedule.
            self._unschedule(cast(Timed, item))
        self.unwatch(item)

    def _unschedule(self, item: Timed) -> None:
        """Clear ``item``'s heap entry, if it has one (lock held): it is skipped when due."""
        entry = self._latest.pop(item, None)
        if entry is not None:
            entry[2] = None

    def unwatch(self, item: Watched) -> None:
        lister = _lister(item.keeper)
        source = id(lister) if lister is not None else 0
        with self._lock:
            group = self._watched.get(source)
            if group is None:
                return
            key = _Group.key(item, lister)
            if group.items.get(key) is item:
                del group.items[key]
                if lister is not None:
                    item.keeper.watch_changes(False)
            group.fresh.pop(item, None)
            if not group.items:
                del self._watched[source]

    def _ensure_thread(self) -> None:
        # Caller holds the lock.
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name="redlease-driver", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        # Caller holds the lock. One ring per sleep: the driver looks at
        # everything that came meanwhile once it holds the lock again.
        if self._sleeping:
            self._sleeping = False
            self._bell.ring()

    def _main(self) -> None:
        while True:
            for hook in self._ring_hooks:
                try:
                    hook()
                except Exception:  # never the driver's end: the runs poll meanwhile
                    logging.getLogger("redlease").warning("a ring hook failed", exc_info=True)
            due, sweep, wait = self._due()
            if due is None:
                # Unlocked: a wake-up from now on rings the bell, and the sleep returns at once.
                self._bell.sleep(wait)
                continue
            # In a method of its own: no item stepped stays referenced from this
            # frame while the driver sleeps (a stopped run, and with it its
            # engine's renewer and connections, would live on until the next wake).
            self._run_due(due, sweep)

    def _due(self) -> tuple[list[Timed] | None, bool, float | None]:
        """What to step now and whether to sweep; or None, False and how long to sleep."""
        with self._lock:
            now = time.monotonic()
            sweep = bool(self._watched) and now - self._last_sweep >= TICK
            if self._ready or (self._heap and self._heap[0][0] <= now) or sweep:
                self._sleeping = False
                due: list[Timed] = list(self._ready)
                self._ready.clear()
                while self._heap and self._heap[0][0] <= now:
                    item = heapq.heappop(self._heap)[2]
                    if item is not None:  # else replaced by a later schedule or a poke
                        del self._latest[item]
                        due.append(item)
                if not self._latest and sys.getsizeof(self._latest) > _SMALL_DICT:
                    # A dict keeps the room of its largest size: after 100,000
                    # runs contended together, let it go.
                    self._latest = {}
                return due, sweep, None
            wait = TICK if self._watched else None
            if self._heap:
                until = self._heap[0][0] - now
                wait = until if wait is None else min(wait, until)
            self._sleeping = True
            return None, False, wait

    def _run_due(self, due: list[Timed], sweep: bool) -> None:
        self._prefetch(due)
        for item in due:
            self._step(item)
        if sweep:
            self._last_sweep = time.monotonic()
            self._sweep()

    def _prefetch(self, due: list[Timed]) -> None:
        """Send the acquires that due contending runs are about to make, a batch per route.

        A run that contends now hands over its acquire (``Contender``); runs
        of one route (an engine; an engine and a node on a cluster) share a
        round trip, and each step then reads its own
        reply. A lone acquire is left to its step. Each run is held from its
        request to its reply, so a ``stop()`` meanwhile waits and then finds
        the reply (and gives back a lease it won).
        """
        groups: dict[object, tuple[Any, list[tuple[Contender, Any]]]] = {}
        held: dict[Contender, None] = {}  # insertion-ordered, O(1) removal
        try:
            for item in due:
                hold = getattr(item, "hold_acquire", None)  # a Contender's
                want = hold() if hold is not None else None
                if want is None:
                    continue
                contender: Contender = item  # type: ignore[assignment]
                held[contender] = None
                route, engine, request = want
                groups.setdefault(route, (engine, []))[1].append((contender, request))
            for engine, entries in groups.values():
                if len(entries) < 2:
                    continue
                for start in range(0, len(entries), BATCH):
                    chunk = entries[start : start + BATCH]
                    sent = time.monotonic()
                    replies = execute_batch(engine, [request for _, request in chunk])
                    for (contender, _), reply in zip(chunk, replies, strict=True):
                        del held[contender]
                        contender.prefetch(reply, sent)
                    self.batched_acquires += len(chunk)
        except Exception:  # never the driver's end: the steps acquire one by one instead
            logging.getLogger("redlease").debug("batched acquires failed", exc_info=True)
        finally:
            for contender in held:
                contender.unhold()

    def _step(self, item: Timed) -> None:
        when = item.step()
        if when is not None:
            self.schedule(item, when)

    def _sweep(self) -> None:
        """Look at every watched item whose keeper changed since the last look.

        A native renewer names the watched leases woken since its list was
        last taken, each once: only their items, and those watched since the
        last sweep, are checked, so a sweep among 100,000 leading runs costs
        what changed, not a look at each. Other keepers are checked every
        sweep. The lists are taken before looking: a change during the sweep
        is seen next time.
        """
        with self._lock:
            due: dict[Watched, None] = {}
            for group in self._watched.values():
                lister = group.lister
                if lister is None:
                    due.update(dict.fromkeys(group.items.values()))
                    continue
                due.update(group.fresh)
                group.fresh.clear()
                handles, everything = lister.take_changed()
                if everything:
                    due.update(dict.fromkeys(group.items.values()))
                    continue
                items = group.items
                for handle in handles:
                    item = items.get(handle)
                    if item is not None:
                        due[item] = None
        for item in due:
            if item.check():
                self.unwatch(item)


_driver: Driver | None = None
_driver_lock = ForkSafeLock()


def driver() -> Driver:
    """The process's driver (made on first use)."""
    global _driver
    made = _driver
    if made is not None:
        return made  # every later call: no lock to take
    with _driver_lock:
        if _driver is None:
            _driver = Driver()
        return _driver


def _reset_after_fork() -> None:
    # The driver thread does not exist in a forked child, and the runs it
    # drove are the parent's: the child starts with a fresh, empty driver.
    global _driver
    if _driver is not None:
        _driver._bell.close()
    _driver = None


os.register_at_fork(after_in_child=_reset_after_fork)
