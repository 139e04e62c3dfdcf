# The Python faces of release notices' native side: ``NoticeReader`` owns
# the process's reader and connector threads (one rl_reader), ``NoticeHub``
# one subscription connection to one server, which registers and removes
# waiters, queues their SUBSCRIBE / UNSUBSCRIBE for the reader to send, has
# the reader serve it from the first waiter on, and is let go at close().
# GIL held.
#
# Needs: _posix, _process (ProcessBound), _conn, _tls, _pool (Target), _notices_queue, _notices_session (hub_queue), _notices_reader (reader_want, reader_let_go).

# ---------------------------------------------------------------- Python faces (GIL held)

cdef class NoticeReader(ProcessBound):
    """The process's notice threads: one reader for every hub, and a connector.

    Made once per process (``notice_reader()``); every NoticeHub holds it.
    The reader thread starts with the first waiter of any hub and ends when
    no hub has a session or wants one; the connector lives only while a hub
    wants a session. After ``os.fork()`` the child's copy is inert and the
    child makes its own.
    """

    def __cinit__(self):
        self.r = NULL

    def __init__(self):
        cdef rl_reader* r
        if self.r != NULL:
            raise RuntimeError("NoticeReader already initialised")
        r = <rl_reader*>calloc(1, sizeof(rl_reader))
        if r == NULL:
            raise MemoryError()
        r.wake_fd = r.connect_fd = -1
        pthread_mutex_init(&r.mu, NULL)
        rl_cond_init(&r.released)
        self.r = r
        r.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        r.connect_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if r.wake_fd < 0 or r.connect_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        _live.add(self)

    def __dealloc__(self):
        # Every hub holds a reference: none is listed any more.
        cdef rl_reader* r = self.r
        cdef int reader, connector
        if r == NULL:
            return
        self.r = NULL
        if self.inherited():
            return            # the parent's threads may have held its lock: left as it is
        pthread_mutex_lock(&r.mu)
        r.stop = 1
        reader = r.thread_started
        connector = r.connector_started
        pthread_mutex_unlock(&r.mu)
        fd_signal(r.wake_fd)
        fd_signal(r.connect_fd)
        with nogil:
            if reader:
                pthread_join(r.thread, NULL)
            if connector:
                pthread_join(r.connector, NULL)
        for fd in (r.wake_fd, r.connect_fd):
            if fd >= 0:
                close(fd)
        free(r.hubs)
        pthread_cond_destroy(&r.released)
        pthread_mutex_destroy(&r.mu)
        free(r)

    cdef void forget_parent(self) noexcept:
        # Neither thread was copied; the parent's hubs are inert here.
        if self.r == NULL:
            return
        pthread_mutex_init(&self.r.mu, NULL)
        rl_cond_init(&self.r.released)
        self.r.thread_started = self.r.connector_started = 0
        self.r.nhubs = 0
        self.r.stop = 1

    cdef tuple _counts(self):
        cdef rl_reader* r = self.r
        cdef tuple t
        if r == NULL or self.inherited():
            return (False, False, 0, 0)
        pthread_mutex_lock(&r.mu)
        t = (r.thread_started != 0 and not r.exited,
             r.connector_started != 0 and not r.connector_exited, r.nhubs, r.connectors)
        pthread_mutex_unlock(&r.mu)
        return t

    @property
    def running(self):
        """True while the reader thread runs (some hub has a session or wants one)."""
        return self._counts()[0]

    @property
    def connecting(self):
        """True while the connector thread runs (some hub wants a session)."""
        return self._counts()[1]

    @property
    def hubs(self):
        """How many hubs have a session or want one."""
        return self._counts()[2]

    @property
    def connectors(self):
        """How many connector threads were started so far."""
        return self._counts()[3]


cdef NoticeReader _reader = None


def notice_reader():
    """The process's NoticeReader (a forked child makes its own)."""
    global _reader
    if _reader is None or _reader.inherited():
        _reader = NoticeReader()
    return _reader


@cython.no_gc_clear
cdef class NoticeHub(ProcessBound):
    """One subscription connection to one server, served by the process's NoticeReader.

    Made from a Target (a fixed address, or a Sentinel-managed master; TLS
    as the Target says). ``sharded``: the Target is one node of a Redis
    Cluster, which carries each channel in its slot: it listens with
    SSUBSCRIBE (SUBSCRIBE once the node answers that it has no sharded
    pub/sub), and when the node stops carrying a channel (its slot moved
    away, or the node cannot be reached) the channel's waiters are told to
    look again and marked moved (``NoticeSub.take_moved()``), so that they
    subscribe on the slot's new owner. ``NoticeSub`` objects register with
    it; the reader serves it from the first, and lets it go (closing its
    connection) once no waiter has been left for a while, or at
    ``close()``. After ``os.fork()`` the child's copy is inert: its socket
    dropped unsent; a new hub is made there.
    """

    def __cinit__(self):
        self.h = NULL
        self._counts = {}
        self._closed = False

    def __init__(self, Target target not None, bint sharded=False):
        cdef rl_hub* h
        if self.h != NULL:
            raise RuntimeError("NoticeHub already initialised")
        self.target = target
        self.reader = notice_reader()
        h = <rl_hub*>calloc(1, sizeof(rl_hub))
        if h == NULL:
            raise MemoryError()
        h.cluster = sharded
        h.sharded = sharded
        h.cmd_fd = -1
        h.stop_fd = -1
        h.index = -1
        h.reader = self.reader.r
        pthread_mutex_init(&h.mu, NULL)
        self.h = h
        target.init_conn(&h.conn)
        h.cmd_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        h.stop_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if h.cmd_fd < 0 or h.stop_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        h.conn.cancel_fd = h.stop_fd
        _live.add(self)

    def __dealloc__(self):
        cdef rl_hub* h = self.h
        if h == NULL:
            return
        self.inherited()
        self.h = NULL
        if self._forked:
            return            # the parent's reader may be using it: left as it is
        with nogil:
            reader_let_go(<rl_reader*>h.reader, h)
        hub_free(h)

    @property
    def closed(self):
        return self._closed or self.inherited()

    @property
    def sharded(self):
        """True while it listens with SSUBSCRIBE (a cluster node with sharded pub/sub)."""
        cdef bint on
        if self.h == NULL or self.inherited():
            return False
        pthread_mutex_lock(&self.h.mu)
        on = self.h.sharded
        pthread_mutex_unlock(&self.h.mu)
        return on

    @property
    def subscribed(self):
        """True while a session is connected and has sent its subscriptions."""
        cdef bint on
        if self.h == NULL or self.inherited():
            return False
        pthread_mutex_lock(&self.h.mu)
        on = self.h.subscribed_at != 0
        pthread_mutex_unlock(&self.h.mu)
        return on

    @property
    def refusals(self):
        """How many subscriptions the server refused (NOPERM: an ACL user without the channel)."""
        cdef int64_t n
        if self.h == NULL or self.inherited():
            return 0
        pthread_mutex_lock(&self.h.mu)
        n = self.h.refusals
        pthread_mutex_unlock(&self.h.mu)
        return n

    @property
    def connects(self):
        """How many times a subscription connection was established."""
        cdef int64_t n
        if self.h == NULL or self.inherited():
            return 0
        pthread_mutex_lock(&self.h.mu)
        n = self.h.connects
        pthread_mutex_unlock(&self.h.mu)
        return n

    cdef int _state(self) noexcept:
        cdef rl_reader* r
        cdef int state
        if self.h == NULL or self.inherited():
            return HUB_IDLE
        r = <rl_reader*>self.h.reader
        pthread_mutex_lock(&r.mu)
        state = self.h.state
        pthread_mutex_unlock(&r.mu)
        return state

    @property
    def running(self):
        """True while the reader serves it: a session is up or wanted (until no waiter is left)."""
        return self._state() != HUB_IDLE

    @property
    def idle(self):
        """True when no waiter is registered and the reader has let it go."""
        cdef int nsubs
        if self.h == NULL or self.inherited():
            return True
        pthread_mutex_lock(&self.h.mu)
        nsubs = self.h.nsubs
        pthread_mutex_unlock(&self.h.mu)
        return nsubs == 0 and self._state() == HUB_IDLE

    cdef int add(self, rl_nsub* s) except -1:
        cdef rl_hub* h = self.h
        cdef rl_nsub** grown
        cdef rl_nsub* other
        cdef int rc = 0
        cdef bytes channel
        cdef Py_ssize_t wanted
        if h == NULL or self._closed or self.inherited():
            raise RuntimeError("NoticeHub is closed")
        channel = PyBytes_FromStringAndSize(s.channel, <Py_ssize_t>s.channel_len)
        pthread_mutex_lock(&h.mu)
        # Under mu with the GIL held and nothing in between that could let
        # it go: the count and the order of the queued commands agree.
        wanted = self._counts.get(channel, 0)
        if h.nsubs == h.cap:
            grown = <rl_nsub**>realloc(h.subs, <size_t>(h.cap * 2 + 4) * sizeof(rl_nsub*))
            if grown == NULL:
                pthread_mutex_unlock(&h.mu)
                raise MemoryError()
            h.subs = grown
            h.cap = h.cap * 2 + 4
        if hub_index_add(h, s) < 0:
            pthread_mutex_unlock(&h.mu)
            raise MemoryError()
        s.index = h.nsubs
        h.subs[h.nsubs] = s
        h.nsubs += 1
        if h.subscribed_at != 0 and wanted == 0:
            # Else subscribed already (or by the session's SUBSCRIBE to come).
            rc = hub_queue(h, False, s.channel, s.channel_len)
        elif wanted:
            # Subscribed already: refused as the others are, if they are.
            other = hub_index_next(s, s.channel, s.channel_len)
            if other != NULL:
                s.refused = other.refused
        self._counts[channel] = wanted + 1
        pthread_mutex_unlock(&h.mu)
        if wanted == 0:
            fd_signal(h.cmd_fd)
        with nogil:
            rc = reader_want(<rl_reader*>h.reader, h)
        if rc != 0:
            # Nobody would read it: the waiter is not kept (it polls instead).
            self.remove(s)
            raise OSError(rc, "cannot start the notice reader thread: " + strerror(rc).decode())
        return 0

    cdef void remove(self, rl_nsub* s) noexcept:
        """Take ``s`` off the hub (in constant time: thousands of runs stop together)."""
        cdef rl_hub* h = self.h
        cdef int j
        cdef bint others = False
        cdef bytes channel
        cdef Py_ssize_t wanted
        cdef bint inherited
        if h == NULL:
            return
        channel = PyBytes_FromStringAndSize(s.channel, <Py_ssize_t>s.channel_len)
        inherited = self.inherited()
        pthread_mutex_lock(&h.mu)
        j = s.index
        if 0 <= j < h.nsubs and h.subs[j] == s:
            hub_index_remove(h, s)
            h.subs[j] = h.subs[h.nsubs - 1]
            h.subs[j].index = j
            h.nsubs -= 1
            # As in add(): the count changes under mu, with the GIL held throughout.
            wanted = self._counts.get(channel, 0)
            others = wanted > 1
            if others:
                self._counts[channel] = wanted - 1
            else:
                self._counts.pop(channel, None)
                if not self._counts:
                    self._counts = {}  # not the room of the most channels it ever had
                if h.subscribed_at != 0 and not inherited:
                    # Not signalled: the reader sends it with the next
                    # subscribe or once it is NOTICE_UNSUBSCRIBE_NS old, so
                    # thousands of runs stopping together cost one write,
                    # not a wake-up of the reader each.
                    if hub_queue(h, True, s.channel, s.channel_len) == 0 and h.unsubscribe_since == 0:
                        h.unsubscribe_since = rl_now_ns()
        pthread_mutex_unlock(&h.mu)

    def resubscribe(self, bytes channel not None):
        """Subscribe ``channel`` once more on the current session (its server dropped it).

        Nothing when no session is up: the next one subscribes every channel.
        """
        cdef rl_hub* h = self.h
        cdef int rc = 0
        if h == NULL or self._closed or self.inherited():
            return
        pthread_mutex_lock(&h.mu)
        if h.subscribed_at != 0:
            rc = hub_queue(h, False, channel, <size_t>len(channel))
        pthread_mutex_unlock(&h.mu)
        if rc < 0:
            raise MemoryError()
        fd_signal(h.cmd_fd)

    def close(self):
        """Let the reader drop the connection; waiters then only poll. Idempotent."""
        cdef rl_hub* h = self.h
        if h == NULL or self._closed or self.inherited():
            self._closed = True
            return
        self._closed = True
        with nogil:
            reader_let_go(<rl_reader*>h.reader, h)

    cdef void forget_parent(self) noexcept:
        cdef rl_hub* h = self.h
        if h == NULL:
            return
        # The reader thread was not copied and its lock may have been held.
        # The struct stays allocated: freeing what a vanished thread may
        # have been using is not safe.
        pthread_mutex_init(&h.mu, NULL)
        h.state = HUB_IDLE
        h.stop = 1
        tls_forget_after_fork(&h.conn)
        conn_drop(&h.conn)
