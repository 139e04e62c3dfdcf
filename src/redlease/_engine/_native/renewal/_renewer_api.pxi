# The Python face of the shared renewer: ``Renewer``, which owns an
# rl_renewer (its connection, or one per cluster node, and the scripts every
# new connection loads), starts the thread with the first term and joins it
# at close(). GIL held.
#
# Needs: _posix, _process (ProcessBound), _resp_encode, _conn, _tls, _discovery, _pool (Target, ScriptRef, conn_exception), _lease, _renewer_heap, _renewer_thread (renewer_main).

# ---------------------------------------------------------------- Python faces

cdef class Renewer(ProcessBound):
    """One native thread that renews every ``Lease`` made from it.

    On a fixed address or behind Sentinel it renews over one connection
    (which follows the master the sentinels name); on a cluster over one
    connection per slot-owning master, each lease sent to its key's slot's
    owner, MOVED and ASK followed per lease. Renewals falling due together
    are pipelined in one write per connection. The thread
    starts with the first term begun and is joined by ``close()``. After
    ``os.fork()`` the child's copy is inert: no thread, its socket dropped
    without a byte sent, and every lease of it ended.
    """

    def __cinit__(self):
        self.r = NULL
        self._closed = False

    def __init__(self, Target target not None):
        cdef rl_renewer* r = <rl_renewer*>calloc(1, sizeof(rl_renewer))
        cdef int rc, j
        if r == NULL:
            raise MemoryError()
        r.ctl_fd = -1
        pthread_mutex_init(&r.mu, NULL)
        rl_cond_init(&r.cv)
        self.r = r
        target.init_conn(&r.conn)
        r.conn.slot = -1
        r.need_load = 1
        r.ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if r.ctl_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        r.conn.cancel_fd = r.ctl_fd
        if r.conn.disco != NULL and (<rl_disco*>r.conn.disco).kind == DISCO_CLUSTER:
            # A cluster's leases live on as many masters as their slots: one
            # connection per node, made here (the thread never takes the GIL
            # to make one), opened when a lease's slot first needs it. The
            # renewer's own connection only asks for the slot map.
            r.cluster = 1
            r.nodes = <rl_rnode*>calloc(RENEW_NODES_MAX, sizeof(rl_rnode))
            if r.nodes == NULL:
                raise MemoryError()
            for j in range(RENEW_NODES_MAX):
                target.init_conn(&r.nodes[j].conn)
                r.nodes[j].conn.cancel_fd = r.ctl_fd
        elif r.conn.disco == NULL:
            # Resolve now, on the caller's thread: name lookups have no
            # deadline. (Behind Sentinel the address comes from the
            # sentinels, as an IP address, when the thread connects.)
            with nogil:
                rc = conn_resolve(&r.conn)
            if rc < 0:
                raise conn_exception(&r.conn)
        r.conn.keep_addrs = 1
        _live.add(self)

    def __dealloc__(self):
        cdef rl_renewer* r = self.r
        cdef int j
        if r == NULL:
            return
        self.inherited()  # a forked child's copy: its locks re-made before they are touched
        self.stop_thread()
        self.r = NULL
        conn_free(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                conn_free(&r.nodes[j].conn)
            free(r.nodes)
        for j in range(r.nscripts):
            buf_free(&r.loads[j])
        buf_free(&r.out)
        free(r.heap)
        free(r.heap_keys)
        free(r.changes.items)
        if r.ctl_fd >= 0:
            close(r.ctl_fd)
        pthread_mutex_destroy(&r.mu)
        pthread_cond_destroy(&r.cv)
        free(r)

    cdef int add_script(self, ScriptRef ref) except -1:
        """Make sure the renewer loads ``ref`` on every new connection; its index among the scripts.

        The SCRIPT LOAD command is encoded before the lock is taken: Python
        allocations may run the garbage collector, and a lease freed there
        takes the same (non-recursive) lock.
        """
        cdef rl_renewer* r = self.r
        cdef rl_buf load
        cdef int j
        cdef int found = 0
        cdef int full = 0
        cdef const char* sha = PyBytes_AS_STRING(ref.sha)
        memset(&load, 0, sizeof(rl_buf))
        put_command(&load, (b"SCRIPT", b"LOAD", ref.source))
        pthread_mutex_lock(&r.mu)
        for j in range(r.nscripts):
            if strncmp(r.shas[j], sha, 40) == 0:
                found = 1
                break
        if not found:
            if r.nscripts == RENEW_SCRIPTS_MAX:
                full = 1
            else:
                j = r.nscripts
                r.loads[j] = load
                memset(&load, 0, sizeof(rl_buf))
                strncpy(r.shas[j], sha, 40)
                r.shas[j][40] = 0
                r.nscripts += 1
                r.need_load = 1
        pthread_mutex_unlock(&r.mu)
        buf_free(&load)
        if full:
            raise RuntimeError("too many distinct renewal scripts for one renewer")
        return j

    cdef int renew_many_with(self, ScriptRef many) except -1:
        """Renew the leases that may be renewed together in calls of ``many`` (lua/renew_many.lua)."""
        cdef int j = self.add_script(many)
        pthread_mutex_lock(&self.r.mu)
        self.r.many_at = j + 1
        pthread_mutex_unlock(&self.r.mu)
        return 0

    cdef void stop_thread(self) noexcept:
        cdef rl_renewer* r = self.r
        cdef int started
        if r == NULL:
            return
        pthread_mutex_lock(&r.mu)
        r.stop = 1
        started = r.thread_started
        r.thread_started = 0
        fd_signal(r.ctl_fd)
        pthread_cond_signal(&r.cv)
        pthread_mutex_unlock(&r.mu)
        if started:
            with nogil:
                pthread_join(r.thread, NULL)

    cdef int start_thread(self) except -1:
        """Start the thread if it is not running (mu held by the caller)."""
        cdef rl_renewer* r = self.r
        cdef int rc
        if r.thread_started:
            return 0
        rc = rl_spawn(&r.thread, renewer_main, r)
        if rc != 0:
            raise OSError(rc, "cannot start the renewer thread: " + strerror(rc).decode())
        r.thread_started = 1
        return 0

    @property
    def running(self):
        """Whether the renewal thread is running."""
        return self.r != NULL and self.r.thread_started != 0

    @property
    def leases(self):
        """How many leases wait in the timer heap right now."""
        if self.r == NULL:
            return 0
        return self.r.heap_len

    @property
    def sent(self):
        """``(renewals, batches)`` written since the renewer was made."""
        if self.r == NULL:
            return 0, 0
        return self.r.sent_total, self.r.batches_total

    @property
    def connections(self):
        """``[(server address, fd)]`` of the renewer's open connections (a snapshot)."""
        cdef rl_renewer* r = self.r
        cdef int j
        out = []
        if r == NULL:
            return out
        pthread_mutex_lock(&r.mu)
        try:
            if r.nodes != NULL:
                for j in range(RENEW_NODES_MAX):
                    if r.nodes[j].conn.fd >= 0:
                        out.append((r.nodes[j].conn.address.decode("utf-8", "replace"),
                                    r.nodes[j].conn.fd))
            elif r.conn.fd >= 0:
                out.append((r.conn.address.decode("utf-8", "replace"), r.conn.fd))
        finally:
            pthread_mutex_unlock(&r.mu)
        return out

    def take_changed(self):
        """``(handles, all)``: the watched leases woken since the last call, and whether
        every watched lease must be looked at instead (a wake-up could not be listed).

        Each lease is named once, by its ``handle``, however often it was
        woken; the list starts empty again.
        """
        cdef rl_renewer* r = self.r
        cdef rl_changes* ch
        cdef int64_t* copy = NULL
        cdef size_t i, n = 0
        cdef bint overflow
        cdef rl_lease* l
        if r == NULL:
            return [], False
        ch = &r.changes
        pthread_mutex_lock(&r.mu)
        if ch.len:
            copy = <int64_t*>realloc(NULL, ch.len * sizeof(int64_t))
            if copy == NULL:
                ch.overflow = 1
        for i in range(ch.len):
            l = ch.items[i]
            if l != NULL:
                l.listed = 0
                if copy != NULL:
                    copy[n] = l.handle
                    n += 1
        ch.len = 0
        overflow = ch.overflow != 0
        ch.overflow = 0
        pthread_mutex_unlock(&r.mu)
        try:
            return [copy[i] for i in range(n)], overflow
        finally:
            free(copy)

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Stop and join the thread and close the connection. Idempotent.

        Leases made from this renewer are ended first by their owners; any
        still running are ended here (LOST is kept).
        """
        cdef rl_renewer* r = self.r
        cdef rl_lease* l
        cdef int j
        if r == NULL or self._closed:
            return
        self._closed = True
        self.inherited()  # a forked child's copy: inert before its lock is taken
        pthread_mutex_lock(&r.mu)
        while r.heap_len:
            l = heap_pop(r)
            rl_store(&l.token, 0)
            l.gen += 1
            if rl_load(&l.state) == ST_ACTIVE:
                rl_store(&l.state, ST_ENDED)
                lease_wake(l)
        pthread_mutex_unlock(&r.mu)
        self.stop_thread()
        conn_drop(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                conn_drop(&r.nodes[j].conn)

    cdef void forget_parent(self) noexcept:
        cdef rl_renewer* r = self.r
        cdef int j
        if r == NULL:
            return
        pthread_mutex_init(&r.mu, NULL)
        rl_cond_init(&r.cv)
        r.thread_started = 0
        r.stop = 1
        r.heap_len = 0
        r.batch_len = 0
        r.changes.len = 0
        # The eventfd is the parent's too: written here (by close() or the
        # copy being freed), it would cancel every round trip of the
        # parent's thread from then on, as nothing drains it.
        if r.ctl_fd >= 0:
            close(r.ctl_fd)
            r.ctl_fd = -1
        r.conn.cancel_fd = -1
        tls_forget_after_fork(&r.conn)
        conn_drop(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                r.nodes[j].conn.cancel_fd = -1
                tls_forget_after_fork(&r.nodes[j].conn)
                conn_drop(&r.nodes[j].conn)
