"""What the threaded and the asyncio ``Elector`` share: their arguments and their identity.

The keyword list of an elector is written here once; ``redlease.Elector`` and
``redlease.aio.Elector`` take it as theirs. Each face says how its client
reaches the engines (``_engine_client``), what fencer its terms hand out
(``_fencer_face``) and what else it keeps (``_shell_init``).
"""

from __future__ import annotations

from typing import Any

from .._config import Config, Duration, named_for
from .election import Election, FencerSource
from .fence import FencedWrites, check_token
from .term import Observer


class ElectorShell:
    """The base of both public electors: one signature, one core (``_core``)."""

    __slots__ = ("__weakref__", "_core")

    _face = "Elector"  # how the face names itself (a wrong call's TypeError)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # The signature below is every face's: each gets a copy named for it, so a
        # wrong call names ``aio.Elector.__init__()``, not this base.
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:
            cls.__init__ = named_for(  # type: ignore[method-assign]
                ElectorShell.__init__, f"{cls._face}.__init__"
            )

    def __init__(
        self,
        client: Any,
        name: str,
        *,
        ttl: Duration | None = None,
        renew_interval: Duration | None = None,
        acquire_interval: Duration | None = None,
        instance_id: str | None = None,
        observer: Observer | None = None,
        engine: str | None = "auto",
        min_replicas: int = 0,
        replica_timeout: Duration | None = None,
    ) -> None:
        self._core = Election(
            self._engine_client(client),
            name,
            ttl=ttl,
            renew_interval=renew_interval,
            acquire_interval=acquire_interval,
            instance_id=instance_id,
            observer=observer,
            engine=engine,
            face=self._fencer_face(),
            min_replicas=min_replicas,
            replica_timeout=replica_timeout,
        )
        self._shell_init(client)

    @property
    def _fence(self) -> FencedWrites:
        """The core's fenced writes, made by the first write (not one per elector up front)."""
        return self._core.fence

    # -- what each face says ---------------------------------------------------

    def _engine_client(self, client: Any) -> Any:
        """The client the engines use: the user's own (the threaded face)."""
        return client

    def _fencer_face(self) -> FencerSource | None:
        """Who makes a term's fencer (``_fencer_of``), or None: the leader gets None."""
        return None

    def _shell_init(self, client: Any) -> None:
        """What the face keeps besides its core."""

    # -- identity --------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The validated, resolved settings (``redlease.Config``)."""
        return self._core.config

    @property
    def instance_id(self) -> str:
        """This elector's identity: the lock's value while it leads."""
        return self._core.config.instance_id

    @property
    def engine(self) -> str:
        """The engine that runs this elector: ``"native"`` or ``"python"``."""
        return self._core.engine.name

    @property
    def engine_reason(self) -> str:
        """Why the native engine does not run this elector, in one sentence ("" when it does).

        Set when ``engine="auto"`` fell back to the Python engine for this
        client (a TLS client where no OpenSSL was found, a
        ``credential_provider``, ...); empty on the native engine and when the
        Python engine was asked for.
        """
        return self._core.engine.reason

    # -- leadership state ------------------------------------------------------

    def token(self) -> int | None:
        """The current term's fencing token while this instance leads, else None.

        A snapshot: leadership can change right after. Acting on it is safe
        because a stale token is rejected by the fenced writes.
        """
        return self._core.token()

    def is_leader(self) -> bool:
        """Whether this instance leads right now. Advisory: never gate a write on it."""
        return self._core.token() is not None

    def renew_lateness(self) -> list[float]:
        """How late each renewal of the current run was sent, in seconds, oldest first.

        Measured by the keeper itself: the time between a renewal's scheduled
        moment and its send. Read-only figures for benchmarks and monitoring;
        empty when the elector is not running. The keeper keeps the newest
        128 samples only; ``renew_lateness_count()`` counts them all.
        """
        return self._core.renew_lateness()

    def renew_lateness_count(self) -> int:
        """How many renewals of the current run had their lateness recorded (0 when not running).

        Every one, held or not: the samples recorded since a moment are the
        newest (count now - count then) of ``renew_lateness()``, as many of
        them as it still holds (read the count first).
        """
        return self._core.renew_lateness_count()


class FencerShell:
    """What the threaded and the asyncio ``Fencer`` share: a term's token bound to a fence.

    Each face says which electors it binds to (``_elector``, checked) and how
    it names itself (``_face``); its writes are its own (plain calls or
    coroutines).
    """

    __slots__ = ("_fence", "_name", "token")

    _face = "Fencer"
    _elector: type[ElectorShell] = ElectorShell

    def __init__(self, elector: ElectorShell, token: int) -> None:
        if not isinstance(elector, self._elector):
            raise TypeError(
                f"elector must be a redlease.{self._face.replace('Fencer', 'Elector')}, "
                f"got {type(elector).__name__}"
            )
        self._fence: FencedWrites = elector._fence
        self._name = elector.config.name
        self.token = check_token(token)

    def __bool__(self) -> bool:
        return self.token > 0

    def __repr__(self) -> str:
        return f"<redlease.{self._face} {self._name!r} token={self.token}>"
