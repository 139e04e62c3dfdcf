# The Python faces of the waiters: ``NoticeBell`` (the fired list of the
# subscriptions without a thread of their own) and ``NoticeSub`` (one
# waiter's interest in one channel of a NoticeHub: wait on its eventfd, take
# the queued payloads). GIL held.
#
# Needs: _posix, _process (ProcessBound), _discovery (copy_bytes), _pool (deadline_after), _notices_queue, _notices_session (drain_fd), _notices_hub_api (NoticeHub).

cdef class NoticeBell(ProcessBound):
    """Where subscriptions without a thread of their own report their notices.

    ``NoticeBell(fd)``: each notice to a ``NoticeSub`` made with this bell
    marks that subscription fired and writes ``fd`` (an eventfd or a pipe
    the caller owns and keeps open while any such subscription exists), on
    the hub's thread, without the GIL. ``take()`` then names the fired
    subscriptions by their tags, each once, however many notices it got.
    After ``os.fork()`` the child's copy is inert: it names nothing.
    """

    cdef rl_bell* b
    cdef object __weakref__

    def __cinit__(self):
        self.b = NULL

    def __init__(self, int fd):
        if self.b != NULL:
            raise RuntimeError("NoticeBell already initialised")
        if fd < 0:
            raise ValueError(f"a notice bell needs a file descriptor to write, got {fd}")
        self.b = <rl_bell*>calloc(1, sizeof(rl_bell))
        if self.b == NULL:
            raise MemoryError()
        pthread_mutex_init(&self.b.mu, NULL)
        self.b.fd = fd

    def __dealloc__(self):
        # Every subscription holds a reference: none is left to ring it now.
        if self.b != NULL:
            if not self.inherited():
                pthread_mutex_destroy(&self.b.mu)
            free(self.b)
            self.b = NULL

    cdef void forget_parent(self) noexcept:
        # The parent's subscriptions are not this process's, and a reader
        # thread of the parent (not copied) may have held the lock.
        if self.b == NULL:
            return
        pthread_mutex_init(&self.b.mu, NULL)
        self.b.fired = NULL
        rl_store(&self.b.nfired, 0)

    @property
    def fd(self):
        return -1 if self.b == NULL else self.b.fd

    @property
    def rings(self):
        """How many notices rang this bell so far (lost-notice wake-ups included)."""
        cdef int64_t n
        if self.b == NULL or self.inherited():
            return 0
        pthread_mutex_lock(&self.b.mu)
        n = self.b.rings
        pthread_mutex_unlock(&self.b.mu)
        return n

    def take(self):
        """The tags of the subscriptions that fired since the last call (each once); empties the list.

        Read the bell's fd empty before calling: a notice after that rings again.
        """
        cdef int64_t* tags
        cdef int n, i = 0
        cdef rl_nsub* s
        cdef rl_nsub* after
        if self.b == NULL or rl_load(&self.b.nfired) == 0:
            # Nothing fired (most wake-ups of a driver): no lock, no getpid(). A
            # subscription that fires after this rings the fd, so it is seen next time.
            return []
        if self.inherited():
            return []
        pthread_mutex_lock(&self.b.mu)
        n = <int>self.b.nfired
        if n == 0:
            pthread_mutex_unlock(&self.b.mu)
            return []
        tags = <int64_t*>malloc(<size_t>n * sizeof(int64_t))
        if tags == NULL:
            pthread_mutex_unlock(&self.b.mu)
            raise MemoryError()
        s = self.b.fired
        while s != NULL and i < n:
            tags[i] = s.tag
            i += 1
            after = s.fired_next
            s.fired = False
            s.fired_prev = s.fired_next = NULL
            s = after
        self.b.fired = NULL
        rl_store(&self.b.nfired, 0)
        pthread_mutex_unlock(&self.b.mu)
        try:
            return [tags[j] for j in range(i)]
        finally:
            free(tags)


@cython.no_gc_clear
cdef class NoticeSub:
    """One waiter's interest in one channel of a NoticeHub.

    The hub's thread queues each notice's payload here and writes this
    subscription's eventfd, and ``signal_fd`` too when given (a keeper's
    ``fileno()``, which its follower sleeps on). ``wait()`` sleeps on the
    eventfd with the GIL released; ``take()`` hands the queued payloads over
    (None for "notices may have been lost: look again").

    With a ``bell`` the subscription has no eventfd of its own (a waiter
    with no thread to sleep on one): each notice rings the bell instead,
    which names it by ``tag``, and ``wait()`` is not available.
    """

    cdef rl_nsub* s
    cdef readonly NoticeHub hub
    cdef NoticeBell bell
    cdef bint _registered
    cdef object __weakref__

    def __cinit__(self):
        self.s = NULL
        self._registered = False

    def __init__(
        self,
        NoticeHub hub not None,
        bytes channel not None,
        int signal_fd=-1,
        NoticeBell bell=None,
        int64_t tag=0,
    ):
        cdef rl_nsub* s
        if self.s != NULL:
            raise RuntimeError("NoticeSub already initialised")
        s = <rl_nsub*>calloc(1, sizeof(rl_nsub))
        if s == NULL:
            raise MemoryError()
        s.fd = -1
        s.signal_fd = signal_fd
        self.s = s
        s.channel = copy_bytes(channel)
        s.channel_len = <size_t>len(channel)
        if s.channel == NULL:
            raise ValueError("a notice channel must not be empty")
        if bell is not None:
            if bell.b == NULL or bell.inherited():
                raise RuntimeError("the NoticeBell belongs to another process")
            self.bell = bell
            s.bell = bell.b
            s.tag = tag
        else:
            s.fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
            if s.fd < 0:
                raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        self.hub = hub
        hub.add(s)
        self._registered = True

    def __dealloc__(self):
        self.cancel()
        if self.s != NULL:
            if self.s.fd >= 0:
                close(self.s.fd)
            free(self.s.channel)
            free(self.s.pending)
            free(self.s)
            self.s = NULL

    def cancel(self):
        """Stop listening; once it returns the hub's thread never touches this again. Idempotent."""
        cdef rl_bell* b
        if self._registered:
            self._registered = False
            self.hub.remove(self.s)
            if self.s.signal_fd >= 0:
                self.s.signal_fd = -1
            # The hub's thread is done with it: out of the bell's list too.
            if self.bell is not None and not self.bell.inherited():
                b = self.bell.b
                pthread_mutex_lock(&b.mu)
                bell_unlink(b, self.s)
                pthread_mutex_unlock(&b.mu)

    @property
    def notices(self):
        """How many notices reached this subscription (lost-notice wake-ups included)."""
        return 0 if self.s == NULL else self.s.notices

    @property
    def refused(self):
        """True once the server refused its channel (an ACL user without it): it only polls."""
        cdef bint refused
        if self.s == NULL or not self._registered:
            return False
        self.hub.inherited()
        pthread_mutex_lock(&self.hub.h.mu)
        refused = self.s.refused
        pthread_mutex_unlock(&self.hub.h.mu)
        return refused

    @property
    def last_notice(self):
        """When the latest notice reached it (``time.monotonic()`` seconds), 0.0 before any."""
        return 0.0 if self.s == NULL else self.s.last_ns / 1e9

    def wait(self, double timeout):
        """Sleep with the GIL released until a notice is pending, up to ``timeout`` seconds.

        True when one is (it stays queued for ``take()``), False on timeout.
        """
        cdef int64_t deadline = deadline_after(timeout)
        cdef int64_t now
        cdef pollfd pfd
        cdef int rc, err
        cdef int pending
        if self.s == NULL:
            return False
        if self.s.fd < 0:
            raise RuntimeError("a subscription that rings a NoticeBell is not waited on")
        pfd.fd = self.s.fd
        pfd.events = POLLIN
        while True:
            pending = self.pending()
            if pending:
                drain_fd(self.s.fd)
                return True
            pfd.revents = 0
            with nogil:
                now = rl_now_ns()
                rc = rl_ppoll(&pfd, 1, deadline - now if deadline > now else 0)
                err = errno
            if rc > 0:
                drain_fd(self.s.fd)
                continue
            if rc == 0:
                if rl_now_ns() >= deadline:
                    return False
                continue
            if err == EINTR:
                PyErr_CheckSignals()
                continue
            raise OSError(err, strerror(err).decode("utf-8", "replace"))

    cdef int pending(self) noexcept:
        cdef int n
        if not self._registered:
            return 0
        self.hub.inherited()
        pthread_mutex_lock(&self.hub.h.mu)
        n = self.s.npending + (1 if self.s.unkept else 0)
        pthread_mutex_unlock(&self.hub.h.mu)
        return n

    def take_moved(self):
        """True once after its cluster node stopped carrying the channel (see ``NoticeHub``)."""
        cdef bint moved
        if self.s == NULL or not self._registered:
            return False
        self.hub.inherited()
        pthread_mutex_lock(&self.hub.h.mu)
        moved, self.s.moved = self.s.moved, False
        pthread_mutex_unlock(&self.hub.h.mu)
        return moved

    def take(self):
        """The queued notices' payloads, oldest first (None: look again); empties the queue."""
        cdef rl_payload copy[8]
        cdef rl_payload* held
        cdef int n, i
        cdef bint unkept
        if self.s == NULL or not self._registered:
            return []
        self.hub.inherited()
        pthread_mutex_lock(&self.hub.h.mu)
        n = self.s.npending
        held = self.s.pending
        for i in range(n):
            copy[i] = held[i]
        self.s.npending = 0
        self.s.pending = NULL  # the next notice allocates again: an idle waiter keeps none
        unkept, self.s.unkept = self.s.unkept, False
        pthread_mutex_unlock(&self.hub.h.mu)
        free(held)
        taken = [
            None if copy[i].lost else PyBytes_FromStringAndSize(copy[i].data, copy[i].len)
            for i in range(n)
        ]
        if unkept:
            taken.append(None)
        return taken
