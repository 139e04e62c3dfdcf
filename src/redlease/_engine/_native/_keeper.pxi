# Keeper: the Python face of one keeper thread. Its methods run with the GIL
# and take the keeper's mutex only briefly (the thread never holds it across
# a wait for the server); they wait for wake-ups in ppoll with the GIL
# released.

cdef class Keeper:
    """Keeps one lease alive from a native thread that never takes the GIL.

    ``begin(token, acquired_at)`` starts a term: the renewal script is sent at
    once and then every ``interval`` seconds on absolute CLOCK_MONOTONIC
    deadlines, on the keeper's own connection. A reply of 1 extends the lease
    to (send time + ``ttl``); 0 loses it at once; errors are tolerated until
    the lease deadline, which a timer enforces even while a renewal is in
    flight. ``token`` and ``state`` are atomics: reading them never waits,
    and they change the moment the thread sees the loss. Every state change
    and every failed renewal makes ``fileno()`` readable.

    The thread starts on the first ``begin()`` and is joined by ``close()``.
    After ``os.fork()`` the child's copy is inert: token 0, not ACTIVE, no
    thread, its socket dropped without a byte sent; ``begin()`` raises there.
    """

    cdef rl_keeper* k
    cdef bint _closed
    cdef bint _forked
    # Threads inside wait(): close() leaves the eventfds to the last of them,
    # so none polls or reads a descriptor number that may already be reused.
    cdef int _waiters
    cdef readonly double interval
    cdef readonly double ttl
    cdef object __weakref__

    def __cinit__(self):
        self.k = NULL
        self._closed = False
        self._forked = False
        self._waiters = 0

    def __init__(self, Target target not None, ScriptRef ref not None, keys, args,
                 double interval, double ttl):
        cdef rl_keeper* k
        cdef rl_script_cmd cmd
        cdef int rc
        if self.k != NULL:
            raise RuntimeError("Keeper already initialised")
        if not (interval > 0 and interval < 1e6) or not (ttl > 0 and ttl < 1e6):
            raise ValueError("interval and ttl must be positive numbers of seconds")
        self.interval = interval
        self.ttl = ttl
        k = <rl_keeper*>calloc(1, sizeof(rl_keeper))
        if k == NULL:
            raise MemoryError()
        k.wake_fd = -1
        k.ctl_fd = -1
        k.conn.fd = -1
        k.conn.cancel_fd = -1
        pthread_mutex_init(&k.mu, NULL)
        rl_cond_init(&k.cv)
        self.k = k
        target.init_conn(&k.conn)
        k.conn.slot = disco_slot_for(k.conn.disco, keys)
        k.conn.failover_is_final = 1
        k.interval_ns = <int64_t>(interval * 1e9)
        k.ttl_ns = <int64_t>(ttl * 1e9)
        # The renewal command and its EVAL twin are built once, here: the
        # thread sends them as they are and never allocates for them.
        put_evalsha(&k.conn.w, ref.sha, ref.source, keys, args, &cmd)
        if build_eval(&k.conn.e, &k.conn.w, &cmd) < 0:
            raise MemoryError()
        k.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        k.ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if k.wake_fd < 0 or k.ctl_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        k.conn.cancel_fd = k.ctl_fd
        # Resolve now, on the caller's thread: name lookups have no deadline,
        # and the keeper's thread must never block past its lease.
        # (Through sentinels or on a cluster the address is only known later,
        # and is given as an IP address, which resolves without a lookup.)
        if k.conn.disco == NULL:
            with nogil:
                rc = conn_resolve(&k.conn)
            if rc < 0:
                raise conn_exception(&k.conn)
        k.conn.keep_addrs = 1
        _live.add(self)

    def __dealloc__(self):
        cdef rl_keeper* k = self.k
        cdef pthread_t tid
        cdef int exited
        if k == NULL:
            return
        self.k = NULL
        if not k.thread_started:
            keeper_free(k)
            return
        # Nobody called close(): stop the thread without waiting for it; the
        # last of the two to let go frees the struct.
        tid = k.thread
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.stop = 1
        k.gen += 1
        k.detached = 1
        exited = k.exited
        fd_signal(k.ctl_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        if exited:
            with nogil:
                pthread_join(tid, NULL)
            keeper_free(k)
        else:
            pthread_detach(tid)

    @property
    def token(self):
        """The running term's token, or 0 when no term is ACTIVE."""
        if self.k == NULL:
            return 0
        return rl_load(&self.k.token)

    @property
    def state(self):
        """IDLE, ACTIVE, LOST or ENDED."""
        if self.k == NULL:
            return ST_ENDED
        return rl_load(&self.k.state)

    @property
    def renewed_at(self):
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        if self.k == NULL:
            return 0.0
        return <double>rl_load(&self.k.renewed_at) / 1e9

    @property
    def renewals(self):
        """How many renewals succeeded since the keeper was made."""
        if self.k == NULL:
            return 0
        return rl_load(&self.k.renewals)

    @property
    def closed(self):
        return self._closed

    def begin(self, token, double acquired_at):
        """Start a term; ``acquired_at`` is the ``time.monotonic()`` send time of the acquire."""
        cdef rl_keeper* k = self.k
        cdef long long tok = token
        cdef int rc
        if k == NULL:
            raise RuntimeError("Keeper is not initialised")
        if self._forked:
            raise RuntimeError("this keeper was inherited across fork(); make a new one in the child")
        if self._closed:
            raise RuntimeError("Keeper is closed")
        if tok < 1:
            raise ValueError("token must be >= 1")
        pthread_mutex_lock(&k.mu)
        k.gen += 1
        k.lease_deadline = <int64_t>(acquired_at * 1e9) + k.ttl_ns
        k.next_send = rl_now_ns()
        rl_store(&k.token, tok)
        rl_store(&k.state, ST_ACTIVE)
        if not k.thread_started:
            rc = rl_spawn(&k.thread, keeper_main, k)
            if rc != 0:
                rl_store(&k.token, 0)
                rl_store(&k.state, ST_ENDED)
                pthread_mutex_unlock(&k.mu)
                raise OSError(rc, "cannot start the keeper thread: " + strerror(rc).decode())
            k.thread_started = 1
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        fd_signal(k.wake_fd)

    def end(self):
        """End the term (token cleared first); idempotent; a LOST term stays LOST."""
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.gen += 1
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
            fd_signal(k.wake_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)

    def lose(self, error):
        """End an ACTIVE term as LOST now; ``error``'s text is reported as a ConnectionError."""
        cdef rl_keeper* k = self.k
        cdef bytes msg = str(error).encode("utf-8", "replace")[:ERR_MSG - 1]
        if k == NULL:
            return
        pthread_mutex_lock(&k.mu)
        if rl_load(&k.state) == ST_ACTIVE:
            k.gen += 1
            keeper_record_error(k, RL_ECONN, msg)
            keeper_lose(k)
            pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)

    def wait(self, timeout=None):
        """Block until woken (loss, error, ``notify()``); False on timeout. Consumes the wake-up."""
        cdef rl_keeper* k = self.k
        cdef int64_t deadline = -1
        cdef int64_t now
        cdef int64_t left
        cdef pollfd pfd[2]
        cdef int rc
        cdef int err
        cdef uint64_t value
        cdef ssize_t got
        if k == NULL or self._closed:
            return True
        if timeout is not None:
            deadline = deadline_after(timeout)
        pfd[0].fd = k.wake_fd
        pfd[0].events = POLLIN
        # close() signals ctl_fd and nothing ever drains it, so every waiter
        # sees it, not just the one that would consume the wake-up.
        pfd[1].fd = k.ctl_fd
        pfd[1].events = POLLIN
        self._waiters += 1
        try:
            while True:
                pfd[0].revents = 0
                pfd[1].revents = 0
                with nogil:
                    if deadline < 0:
                        left = -1
                    else:
                        now = rl_now_ns()
                        left = deadline - now if deadline > now else 0
                    rc = rl_ppoll(pfd, 2, left)
                    err = errno
                    got = -1
                    if rc > 0 and pfd[1].revents == 0:
                        got = read(pfd[0].fd, &value, 8)
                if rc > 0:
                    if got == 8 or self._closed:
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
                self.close_fds()

    def notify(self):
        """Wake the waiter."""
        if self.k != NULL and not self._closed:
            fd_signal(self.k.wake_fd)

    def fileno(self):
        """An eventfd that is readable while a wake-up is pending (-1 once closed)."""
        if self.k == NULL or self._closed:
            return -1
        return self.k.wake_fd

    def pop_errors(self):
        """redis-py exceptions of the failed renewals since the last call, oldest first."""
        cdef rl_keeper* k = self.k
        cdef rl_err copy[32]
        cdef int n = 0
        cdef int i
        if k == NULL:
            return []
        # Copy out under the lock; build Python objects after releasing it,
        # so the keeper thread is never held up by Python code.
        pthread_mutex_lock(&k.mu)
        n = k.err_count
        for i in range(n):
            copy[i] = k.errs[(k.err_head + i) % ERR_RING]
        k.err_head = 0
        k.err_count = 0
        pthread_mutex_unlock(&k.mu)
        return [make_exception(copy[i].kind, PyBytes_FromString(copy[i].msg)) for i in range(n)]

    def lateness(self):
        """Seconds each renewal was sent after its scheduled time (up to the last 65536)."""
        cdef rl_keeper* k = self.k
        cdef double* copy
        cdef size_t n
        cdef size_t start = 0
        cdef size_t i
        if k == NULL:
            return []
        copy = <double*>realloc(NULL, LATE_MAX * sizeof(double))
        if copy == NULL:
            raise MemoryError()
        try:
            pthread_mutex_lock(&k.mu)
            if k.late_count <= LATE_MAX:
                n = <size_t>k.late_count
            else:
                n = LATE_MAX
                start = <size_t>(k.late_count % LATE_MAX)
            for i in range(n):
                copy[i] = k.late[(start + i) % LATE_MAX] if start else k.late[i]
            pthread_mutex_unlock(&k.mu)
            return [copy[i] for i in range(n)]
        finally:
            free(copy)

    def lateness_totals(self):
        """``(counts, sum)``: renew lateness since the keeper was made, as a histogram.

        ``counts[i]`` is how many renewals were sent at most
        ``LATENESS_BUCKETS[i]`` seconds late (and more than the bound
        before); the last entry counts the rest. Cumulative and never reset,
        also after ``close()``, so a scrape can read them at any time.
        """
        cdef rl_keeper* k = self.k
        cdef uint64_t copy[17]
        cdef double total
        cdef int i
        if k == NULL:
            return [0] * (LATE_BOUNDS_N + 1), 0.0
        pthread_mutex_lock(&k.mu)
        for i in range(LATE_BOUNDS_N + 1):
            copy[i] = k.late_hist[i]
        total = k.late_sum
        pthread_mutex_unlock(&k.mu)
        return [copy[i] for i in range(LATE_BOUNDS_N + 1)], total

    def close(self):
        """End any term, stop and join the thread, close the socket and both eventfds. Idempotent."""
        cdef rl_keeper* k = self.k
        cdef int started
        if k == NULL or self._closed:
            return
        self._closed = True
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.gen += 1
        k.stop = 1
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
        started = k.thread_started
        fd_signal(k.ctl_fd)
        fd_signal(k.wake_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        if started:
            with nogil:
                pthread_join(k.thread, NULL)
            k.thread_started = 0
        conn_drop(&k.conn)
        if self._waiters == 0:
            self.close_fds()

    cdef void close_fds(self) noexcept:
        """Close both eventfds; only once closed and no thread is inside wait()."""
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        if k.ctl_fd >= 0:
            close(k.ctl_fd)
            k.ctl_fd = -1
            k.conn.cancel_fd = -1
        if k.wake_fd >= 0:
            close(k.wake_fd)
            k.wake_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef void after_fork_in_child(self) noexcept:
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        # The renewer thread was not copied; its lock may have been held.
        pthread_mutex_init(&k.mu, NULL)
        rl_cond_init(&k.cv)
        k.thread_started = 0
        k.stop = 1
        k.gen += 1
        rl_store(&k.token, 0)
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
        self._forked = True
        # Threads that were waiting in the parent do not exist here.
        self._waiters = 0
        tls_forget_after_fork(&k.conn)
        conn_drop(&k.conn)
        if k.ctl_fd >= 0:
            close(k.ctl_fd)
            k.ctl_fd = -1
            k.conn.cancel_fd = -1
        if k.wake_fd >= 0:
            # The eventfd is shared with the parent; waking it would wake the parent.
            close(k.wake_fd)
            k.wake_fd = -1 if self._closed else eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
