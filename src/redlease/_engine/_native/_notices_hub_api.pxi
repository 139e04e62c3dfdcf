# The Python face of one subscription connection: ``NoticeHub``, which owns
# an rl_hub, registers and removes waiters, queues their SUBSCRIBE /
# UNSUBSCRIBE for the reader thread to send, and starts that thread with the
# first waiter and joins it at close(). GIL held.
#
# Needs: _posix, _process (ProcessBound), _conn, _tls, _pool (Target), _notices_queue, _notices_thread (hub_main, hub_queue).

# ---------------------------------------------------------------- Python faces (GIL held)

cdef class NoticeHub(ProcessBound):
    """One subscription connection to one server and its native reader thread.

    Made from a Target (a fixed address, or a Sentinel-managed master; TLS
    as the Target says). ``sharded``: the Target is one node of a Redis
    Cluster, which carries each channel in its slot: it listens with
    SSUBSCRIBE (SUBSCRIBE once the node answers that it has no sharded
    pub/sub), and when the node stops carrying a channel (its slot moved
    away, or the node cannot be reached) the channel's waiters are told to
    look again and marked moved (``NoticeSub.take_moved()``), so that they
    subscribe on the slot's new owner. ``NoticeSub`` objects register with it; the thread
    starts with the first, and ends (closing its connection) once no waiter
    has been left for a while, or at ``close()``. After ``os.fork()`` the child's copy
    is inert: no thread, its socket dropped unsent; a new hub is made there.
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
        h = <rl_hub*>calloc(1, sizeof(rl_hub))
        if h == NULL:
            raise MemoryError()
        h.cluster = sharded
        h.sharded = sharded
        h.cmd_fd = -1
        h.stop_fd = -1
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
        cdef pthread_t tid
        cdef int exited
        if h == NULL:
            return
        self.inherited()
        self.h = NULL
        if self._forked or not h.thread_started:
            if not self._forked:
                hub_free(h)
            return
        tid = h.thread
        pthread_mutex_lock(&h.mu)
        h.stop = 1
        h.detached = 1
        exited = h.exited
        fd_signal(h.stop_fd)
        pthread_mutex_unlock(&h.mu)
        if exited:
            with nogil:
                pthread_join(tid, NULL)
            hub_free(h)
        else:
            pthread_detach(tid)

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
    def connects(self):
        """How many times a subscription connection was established."""
        cdef int64_t n
        if self.h == NULL or self.inherited():
            return 0
        pthread_mutex_lock(&self.h.mu)
        n = self.h.connects
        pthread_mutex_unlock(&self.h.mu)
        return n

    @property
    def running(self):
        """True while the native reader thread runs (it ends when no waiter is left)."""
        cdef bint alive
        if self.h == NULL or self.inherited():
            return False
        pthread_mutex_lock(&self.h.mu)
        alive = self.h.thread_started and not self.h.exited
        pthread_mutex_unlock(&self.h.mu)
        return alive

    @property
    def idle(self):
        """True when no waiter is registered and the reader thread has ended."""
        cdef bint idle
        if self.h == NULL or self.inherited():
            return True
        pthread_mutex_lock(&self.h.mu)
        idle = self.h.nsubs == 0 and (not self.h.thread_started or self.h.exited)
        pthread_mutex_unlock(&self.h.mu)
        return idle

    cdef int add(self, rl_nsub* s) except -1:
        cdef rl_hub* h = self.h
        cdef rl_nsub** grown
        cdef int rc = 0
        cdef pthread_t old
        cdef bint joining = False
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
        s.index = h.nsubs
        h.subs[h.nsubs] = s
        h.nsubs += 1
        if h.subscribed_at != 0 and wanted == 0:
            # Else subscribed already (or by the session's SUBSCRIBE to come).
            rc = hub_queue(h, False, s.channel, s.channel_len)
        if h.thread_started and h.exited:
            # The last one ended for want of waiters: start another, and
            # join the old one once the lock is let go.
            old = h.thread
            h.thread_started = 0
            h.exited = 0
            joining = True
        if not h.thread_started:
            rc = rl_spawn(&h.thread, hub_main, h)
            if rc != 0:
                h.nsubs -= 1
                pthread_mutex_unlock(&h.mu)
                if joining:
                    with nogil:
                        pthread_join(old, NULL)
                raise OSError(rc, "cannot start the notice thread: " + strerror(rc).decode())
            h.thread_started = 1
        self._counts[channel] = wanted + 1
        pthread_mutex_unlock(&h.mu)
        if wanted == 0:
            fd_signal(h.cmd_fd)
        if joining:
            with nogil:
                pthread_join(old, NULL)
        return 0

    cdef void remove(self, rl_nsub* s) noexcept:
        """Take ``s`` off the hub (in constant time: thousands of runs stop together)."""
        cdef rl_hub* h = self.h
        cdef int j
        cdef bint others = False
        cdef bint found = False
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
            found = True
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
                if h.subscribed_at != 0 and not inherited:
                    hub_queue(h, True, s.channel, s.channel_len)
        pthread_mutex_unlock(&h.mu)
        if found and not others and not self._forked:
            fd_signal(h.cmd_fd)

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
        """Stop and join the thread, close the connection. Idempotent. Waiters then only poll."""
        cdef rl_hub* h = self.h
        cdef int started
        if h == NULL or self._closed or self.inherited():
            self._closed = True
            return
        self._closed = True
        pthread_mutex_lock(&h.mu)
        h.stop = 1
        started = h.thread_started
        fd_signal(h.stop_fd)
        pthread_mutex_unlock(&h.mu)
        if started:
            with nogil:
                pthread_join(h.thread, NULL)
            h.thread_started = 0
        conn_drop(&h.conn)

    cdef void forget_parent(self) noexcept:
        cdef rl_hub* h = self.h
        if h == NULL:
            return
        # The reader thread was not copied and its lock may have been held.
        # The struct stays allocated: freeing what a vanished thread may
        # have been using is not safe.
        pthread_mutex_init(&h.mu, NULL)
        h.thread_started = 0
        h.stop = 1
        tls_forget_after_fork(&h.conn)
        conn_drop(&h.conn)
