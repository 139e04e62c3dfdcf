# The Python face of one renewed lease: ``Lease`` (the engine's Keeper
# protocol), its terms renewed by a shared ``Renewer``: begin, end and lose a
# term, wait on its eventfd, read its token, state, errors and lateness
# figures. GIL held; ``token`` and ``state`` are read as atomics.
#
# Needs: _posix, _process (ProcessBound), _resp_encode, _conn, _discovery, _pool (ScriptRef, exceptions), _lease, _renewer_heap, _renewer_api (Renewer).

cimport cython


cdef int lease_locate_parts(rl_lease* l, size_t tail) except -1:
    """Where the key and the owner of ``l``'s renewal lie in its EVALSHA (``tail``: its numkeys).

    renew_many calls are encoded from these parts of ``l.cmd`` (key, then
    owner and ttl), so a lease holds its renewal once.
    """
    cdef size_t at = tail
    cdef int i
    cdef long long size
    cdef size_t starts[2]
    for i in range(3):  # numkeys ("1"), the key, the owner
        if i > 0:
            starts[i - 1] = at
        at = bulk_after(l.cmd.data, l.cmd.len, at)
        if at == 0:
            raise RuntimeError("a renewal's EVALSHA without its parts")
    if starts[1] > 0xFFFFFFFF:
        raise ValueError("a key too long to be renewed together with others")
    l.key_at = <uint32_t>starts[0]
    l.owner_at = <uint32_t>starts[1]
    return 0


cdef size_t bulk_after(const char* p, size_t n, size_t at) noexcept:
    """Where the bulk string that starts at ``p[at]`` ends (0: none there)."""
    cdef size_t i = at + 1
    cdef long long size
    if at >= n or p[at] != c'$':
        return 0
    while i < n and p[i] != c'\r':
        i += 1
    if i >= n or parse_ll(p + at + 1, i - at - 1, &size) < 0 or size < 0:
        return 0
    i += 2 + <size_t>size + 2
    return i if i <= n else 0


@cython.no_gc_clear
cdef class Lease(ProcessBound):
    """One lease renewed by a shared ``Renewer`` (the engine's ``Keeper`` protocol).

    ``begin()`` sends the first renewal at once, then one every ``interval``
    on absolute deadlines; a reply of 1 extends the lease to (send time +
    ``ttl``), 0 loses it at once, a failover reply (READONLY, MASTERDOWN,
    NOREPLICAS) loses it at once; errors, a reply of any other shape
    included, are tolerated until the lease deadline. ``token`` and
    ``state`` are atomics: reading them never waits. ``fileno()`` makes the lease's
    eventfd on first use, so a lease nobody waits on costs no descriptor.
    """

    def __cinit__(self):
        self.l = NULL
        self._closed = False
        self._waiters = 0

    def __init__(self, Renewer renewer not None, ScriptRef ref not None, keys, args,
                 double interval, double ttl, str together=None, ScriptRef many=None):
        cdef rl_lease* l
        cdef rl_script_cmd cmd
        cdef char* trimmed
        if together is not None and (
            together not in ("s", "h") or many is None or len(keys) != 1 or len(args) != 2
        ):
            raise ValueError(
                "a lease renewed together with others is one key, its owner and its ttl, "
                "of kind 's' (a string lease) or 'h' (a lock hash), with the renew_many script; "
                f"got kind {together!r}, {len(keys)} keys, {len(args)} args"
            )
        if renewer.r == NULL or renewer._closed:
            raise RuntimeError("the renewer is closed")
        if not (interval > 0 and interval * 1e9 <= MAX_TTL_NS) or not (
            ttl > 0 and ttl * 1e9 <= MAX_TTL_NS
        ):
            raise ValueError(
                "interval and ttl must be positive numbers of seconds, at most MAX_TTL "
                f"({_timing.MAX_TTL} s); got interval {interval!r}, ttl {ttl!r}"
            )
        self.interval = interval
        self.ttl = ttl
        l = <rl_lease*>calloc(1, sizeof(rl_lease))
        if l == NULL:
            raise MemoryError()
        l.heap_idx = -1
        l.wake_fd = -1
        l.interval_ns = <int64_t>(interval * 1e9)
        l.ttl_ns = <int64_t>(ttl * 1e9)
        self.l = l
        self.renewer = renewer
        l.changes = &renewer.r.changes
        pthread_mutex_lock(&renewer.r.mu)
        renewer.r.changes.handles += 1
        l.handle = renewer.r.changes.handles
        pthread_mutex_unlock(&renewer.r.mu)
        l.slot = disco_slot_for(renewer.r.conn.disco, keys)
        l.ask_node = -1
        put_evalsha(&l.cmd, ref.sha, ref.source, keys, args, &cmd)
        # Built once and never grown again: its exact size, not the encoder's
        # spare room (100,000 leases).
        trimmed = <char*>realloc(l.cmd.data, l.cmd.len)
        if trimmed != NULL:
            l.cmd.data = trimmed
            l.cmd.cap = l.cmd.len
        renewer.add_script(ref)
        if together is not None:
            lease_locate_parts(l, cmd.tail)
            l.batch_kind = ord(together)
            renewer.renew_many_with(many)
        # Not in _live: 100,000 leases should not cost a weak reference each.
        # In a forked child each one is made inert by the first thing that
        # reaches it (every method goes through _r(), token and state ask too).

    def __dealloc__(self):
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL:
            return
        self.inherited()  # before the renewer's lock is taken: in a forked child it is re-made
        self.l = NULL
        if self.renewer is None or self.renewer.r == NULL:
            lease_free(l)
            return
        r = self.renewer.r
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        l.closed = 1
        heap_remove(r, l)
        l.watched = 0
        lease_unlist(l)
        if l.inflight:
            l.detached = 1  # the thread frees it when the batch is done
            l = NULL
        pthread_mutex_unlock(&r.mu)
        if l != NULL:
            lease_free(l)

    @property
    def token(self):
        """The running term's token, or 0 when no term is ACTIVE (or its deadline passed)."""
        if self.l == NULL or self.inherited() or self._expired():
            return 0
        return rl_load(&self.l.token)

    @property
    def state(self):
        """IDLE, ACTIVE, LOST or ENDED (LOST from the deadline on)."""
        if self.l == NULL or self.inherited():
            return ST_ENDED
        if self._expired():
            return ST_LOST
        return rl_load(&self.l.state)

    @property
    def renewed_at(self):
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        if self.l == NULL:
            return 0.0
        return <double>rl_load(&self.l.renewed_at) / 1e9

    @property
    def renewals(self):
        """How many renewals succeeded since the lease was made."""
        if self.l == NULL:
            return 0
        return rl_load(&self.l.renewals)

    @property
    def handle(self):
        """This lease's number among its renewer's: what ``Renewer.take_changed()`` names."""
        if self.l == NULL:
            return 0
        return self.l.handle

    def watch_changes(self, bint on):
        """List this lease's wake-ups for ``Renewer.take_changed()`` (``on``), or stop."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        l.watched = on
        if not on:
            lease_unlist(l)
        pthread_mutex_unlock(&r.mu)

    @property
    def closed(self):
        """True once ``close()`` ran, or the renewer was closed (the engine's close)."""
        return self._closed or self.renewer._closed

    def begin(self, token, double acquired_at):
        """Start a term; ``acquired_at`` is the ``time.monotonic()`` send time of the acquire."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef long long tok = token
        if l == NULL:
            raise RuntimeError("Lease is not initialised")
        if self.inherited() or self.renewer.inherited():
            raise RuntimeError("this lease was inherited across fork(); make a new one in the child")
        if self._closed or self.renewer._closed:
            raise RuntimeError("Lease is closed")
        if tok < 1:
            raise ValueError("token must be >= 1")
        r = self._r()
        pthread_mutex_lock(&r.mu)
        try:
            self.renewer.start_thread()
        except BaseException:
            pthread_mutex_unlock(&r.mu)
            raise
        l.gen += 1
        rl_store(&l.lease_deadline, <int64_t>(acquired_at * 1e9) + l.ttl_ns)
        l.next_send = rl_now_ns()
        rl_store(&l.token, tok)
        rl_store(&l.state, ST_ACTIVE)
        if not l.inflight:
            heap_fix(r, l)
        pthread_cond_signal(&r.cv)
        lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def end(self):
        """End the term (token cleared first); idempotent; a LOST term stays LOST."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        heap_remove(r, l)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
            lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def lose(self, error):
        """End an ACTIVE term as LOST now; ``error``'s text is reported as a ConnectionError."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef bytes msg = str(error).encode("utf-8", "replace")[:ERR_MSG - 1]
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        if rl_load(&l.state) == ST_ACTIVE:
            heap_remove(r, l)
            lease_record_error(l, RL_ECONN, msg)
            lease_lose(l)
        pthread_mutex_unlock(&r.mu)

    cdef int _wake_fd(self) except -2:
        """The lease's eventfd, made now if it does not exist yet (-1 once closed)."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef int fd
        if l == NULL or self._closed:
            return -1
        self.inherited()  # a forked child's copy: the parent's eventfd is let go first
        if l.wake_fd >= 0:
            return l.wake_fd
        fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        r = self._r()
        pthread_mutex_lock(&r.mu)
        l.wake_fd = fd
        if l.wake_pending:
            l.wake_pending = 0
            fd_signal(fd)
        pthread_mutex_unlock(&r.mu)
        return fd

    def wait(self, timeout=None):
        """Block until woken (loss, error, ``notify()``); False on timeout. Consumes the wake-up."""
        cdef int64_t deadline = -1
        cdef int64_t now, left
        cdef pollfd pfd
        cdef int rc, err
        cdef uint64_t value
        cdef ssize_t got
        cdef int fd = self._wake_fd()
        if fd < 0:
            return True
        if timeout is not None:
            deadline = deadline_after(timeout)
        pfd.fd = fd
        pfd.events = POLLIN
        self._waiters += 1
        try:
            while True:
                pfd.revents = 0
                with nogil:
                    if deadline < 0:
                        left = -1
                    else:
                        now = rl_now_ns()
                        left = deadline - now if deadline > now else 0
                    rc = rl_ppoll(&pfd, 1, left)
                    err = errno
                if self._closed:
                    # close() leaves the eventfd readable for every waiter.
                    return True
                if rc > 0:
                    got = read(fd, &value, 8)
                    if got == 8:
                        return True
                    continue  # another waiter took it
                if rc == 0:
                    if deadline >= 0 and rl_now_ns() >= deadline:
                        return False
                    continue
                if err == EINTR:
                    PyErr_CheckSignals()
                    continue
                raise OSError(err, strerror(err).decode("utf-8", "replace"))
        finally:
            self._waiters -= 1
            if self._closed and self._waiters == 0:
                self.close_fd()

    def notify(self):
        """Wake the waiter."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL or self._closed:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def fileno(self):
        """An eventfd that is readable while a wake-up is pending (-1 once closed)."""
        return self._wake_fd()

    def pop_errors(self):
        """redis-py exceptions of the failed renewals since the last call, oldest first."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef rl_err copy[32]
        cdef int n = 0
        cdef int i
        if l == NULL or rl_load(&l.err_count_atomic) == 0:
            return []
        r = self._r()
        pthread_mutex_lock(&r.mu)
        n = l.err_count
        for i in range(n):
            copy[i] = l.errs[(l.err_head + i) % ERR_RING]
        l.err_head = 0
        l.err_count = 0
        rl_store(&l.err_count_atomic, 0)
        pthread_mutex_unlock(&r.mu)
        return [make_exception(copy[i].kind, PyBytes_FromString(copy[i].msg)) for i in range(n)]

    def lateness(self):
        """Seconds each renewal was sent after its scheduled time: the newest 128, oldest first."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef double* copy = NULL
        cdef size_t n
        cdef size_t start = 0
        cdef size_t i
        if l == NULL:
            return []
        r = self._r()
        pthread_mutex_lock(&r.mu)
        if l.late_count <= LATE_MAX:
            n = <size_t>l.late_count
        else:
            n = LATE_MAX
            start = <size_t>(l.late_count % LATE_MAX)
        if n:
            # As many as it holds; copied under the lock, made into floats after.
            copy = <double*>realloc(NULL, n * sizeof(double))
            if copy != NULL:
                for i in range(n):
                    copy[i] = l.late[(start + i) % LATE_MAX]
        pthread_mutex_unlock(&r.mu)
        if n and copy == NULL:
            raise MemoryError()
        try:
            return [copy[i] for i in range(n)]
        finally:
            free(copy)

    def lateness_count(self):
        """How many lateness samples were recorded since the lease was made, held or not."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef uint64_t n
        if l == NULL:
            return 0
        r = self._r()
        pthread_mutex_lock(&r.mu)
        n = l.late_count
        pthread_mutex_unlock(&r.mu)
        return n

    def lateness_totals(self):
        """``(counts, sum)``: renew lateness since the lease was made, as a histogram."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef uint64_t copy[17]
        cdef double total
        cdef int i
        if l == NULL:
            return [0] * (LATE_BOUNDS_N + 1), 0.0
        r = self._r()
        pthread_mutex_lock(&r.mu)
        for i in range(LATE_BOUNDS_N + 1):
            copy[i] = l.late_hist[i]
        total = l.late_sum
        pthread_mutex_unlock(&r.mu)
        return [copy[i] for i in range(LATE_BOUNDS_N + 1)], total

    def close(self):
        """End any term and take the lease off the renewer. Idempotent."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL or self._closed:
            return
        self._closed = True
        r = self._r()
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        l.closed = 1
        heap_remove(r, l)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
        if l.wake_fd >= 0:
            fd_signal(l.wake_fd)
        pthread_mutex_unlock(&r.mu)
        if self._waiters == 0:
            self.close_fd()

    cdef void close_fd(self) noexcept:
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef int fd
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        fd = l.wake_fd
        l.wake_fd = -1
        pthread_mutex_unlock(&r.mu)
        if fd >= 0:
            close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef void forget_parent(self) noexcept:
        cdef rl_lease* l = self.l
        if self.renewer is not None:
            self.renewer.inherited()  # its mutex re-made first
        if l == NULL:
            return
        # The lease is the parent's business: never renewed or released here.
        rl_store(&l.token, 0)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
        l.gen += 1
        l.heap_idx = -1
        l.inflight = 0
        l.watched = 0
        l.listed = 0
        self._waiters = 0
        l.wake_pending = 0  # the parent's wake-ups, not the child's
        if l.wake_fd >= 0:
            # Shared with the parent: waking it would wake the parent.
            close(l.wake_fd)
            l.wake_fd = -1
