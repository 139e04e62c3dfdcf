# Release notices, read natively: one subscription connection per server and
# its pthread, which never takes the GIL. A release of a lease PUBLISHes on
# ``<lease key>:released`` (see redlease._notices); this thread reads those
# messages and wakes the waiters of the channel by writing their eventfds
# (and, for an elector, its keeper's eventfd, which its follower sleeps on),
# so a waiter is woken while another thread holds the GIL.
#
# ``rl_hub`` is the thread's state; ``rl_nsub`` one waiter's interest in one
# channel, with the payloads of the notices it has not taken yet. The hub's
# mutex ``mu`` guards the waiter list, the pending payloads and the outgoing
# commands; it is held only to copy a few bytes, never across I/O (see the
# lock discipline in _core.pyx), so a thread holding the GIL may block on it.
#
# What the thread does, as redlease._notices' Python listener does: connect
# (a fixed address, or the master the sentinels name, or one node of a
# Redis Cluster; TLS as the Target says), SUBSCRIBE every channel wanted
# (SSUBSCRIBE each on a cluster node with sharded pub/sub), read; on a
# cluster node, mark the waiters of a channel the node no longer carries
# (``hub_moved``) so that Python re-homes them; ping a silent connection and
# drop one silent for too long; reconnect with backoff after any failure and
# then wake every waiter once (notices may have been lost meanwhile); close
# the connection and end when no waiter is left for a while (the next
# waiter starts a new thread). Sending SUBSCRIBE / UNSUBSCRIBE for waiters that come and go is the
# thread's job too: Python appends the encoded command to ``out`` and kicks
# ``cmd_fd``; only this thread ever reads, writes or closes the socket.
#
# A waiter without a thread of its own (a run the process's driver steps)
# does not sleep on an eventfd of its own: its subscription rings a bell
# (``rl_bell``), one for many subscriptions of any hubs. The thread links
# the subscription into the bell's list of fired ones and writes the bell's
# fd, which the driver sleeps on with the GIL released; the driver takes the
# list (``NoticeBell.take()``: the tags of the fired subscriptions) and
# wakes just those. The bell's mutex is taken inside a hub's, never around one.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _replies, _pool, _lease (states, fd_signal).

cdef enum:
    NOTICE_PENDING = 8       # payloads a waiter keeps; more means "some were lost"
    NOTICE_PAYLOAD = 256     # longer payloads are kept as "lost" (None)

cdef int64_t NOTICE_SLICE_NS = 250000000      # one poll before the thread looks around
cdef int64_t NOTICE_PING_NS = 5000000000      # a silent connection is pinged after this ...
cdef int64_t NOTICE_DEAD_NS = 10000000000     # ... and dropped when silent this long
cdef int64_t NOTICE_IDLE_NS = 2000000000      # no waiter this long: close the connection
cdef int64_t NOTICE_BACKOFF_MIN_NS = 50000000
cdef int64_t NOTICE_BACKOFF_MAX_NS = 1000000000
cdef int64_t NOTICE_CONNECT_NS = 5000000000

cdef const char* PING_CMD = b"*1\r\n$4\r\nPING\r\n"

cdef extern from *:
    """
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <pthread.h>
    /* The reader thread's name, as ps and /proc show it (at most 15 bytes). */
    static void rl_name_notice_thread(void) {
    #if defined(__GLIBC__)
        pthread_setname_np(pthread_self(), "redlease-notice");
    #endif
    }
    """
    void rl_name_notice_thread() noexcept nogil


cdef struct rl_payload:
    int lost                 # 1: "look again" (a reconnect, an overflow, a long payload)
    int len
    char data[256]


cdef struct rl_nsub:
    char* channel
    size_t channel_len
    int fd                   # eventfd of its own: wait() polls it (-1 with a bell)
    int signal_fd            # another eventfd to write on a notice (a keeper's), or -1
    int npending
    bint unkept              # a notice came that could not be kept (no memory): "look again"
    bint moved               # a cluster node stopped serving its channel: re-home it (take_moved)
    int64_t notices          # how many notices reached it (a test hook)
    int64_t last_ns          # when the latest one did (rl_now_ns; a test hook)
    # NOTICE_PENDING slots, allocated by the first notice and freed by take():
    # thousands of waiters that hear nothing cost no payload space.
    rl_payload* pending
    int index                # where it is in the hub's ``subs``
    # With a bell (else NULL): guarded by the bell's mutex.
    void* bell               # the rl_bell rung on a notice
    int64_t tag              # what NoticeBell.take() names this subscription by
    bint fired               # linked into the bell's list of fired subscriptions
    rl_nsub* fired_prev
    rl_nsub* fired_next


cdef struct rl_bell:
    pthread_mutex_t mu
    int fd                   # the fd written when a subscription fires (not owned)
    # Guarded by mu.
    rl_nsub* fired           # the fired subscriptions not taken yet (a doubly linked list)
    int64_t nfired           # their number (written with rl_store: take() peeks without mu)
    int64_t rings            # how many times a subscription fired (a test hook)


cdef void bell_ring(rl_bell* b, rl_nsub* s) noexcept nogil:
    """Link ``s`` into the bell's fired list (once until taken) and write the bell's fd."""
    pthread_mutex_lock(&b.mu)
    if not s.fired:
        s.fired = True
        s.fired_prev = NULL
        s.fired_next = b.fired
        if b.fired != NULL:
            b.fired.fired_prev = s
        b.fired = s
        rl_store(&b.nfired, b.nfired + 1)
    b.rings += 1
    pthread_mutex_unlock(&b.mu)
    fd_signal(b.fd)


cdef void bell_unlink(rl_bell* b, rl_nsub* s) noexcept nogil:
    """Under the bell's mutex: take ``s`` out of the fired list, if it is in it."""
    if not s.fired:
        return
    if s.fired_prev != NULL:
        s.fired_prev.fired_next = s.fired_next
    else:
        b.fired = s.fired_next
    if s.fired_next != NULL:
        s.fired_next.fired_prev = s.fired_prev
    s.fired = False
    s.fired_prev = s.fired_next = NULL
    rl_store(&b.nfired, b.nfired - 1)


cdef struct rl_hub:
    rl_conn conn             # its ``w`` holds the SUBSCRIBE of a new session, ``e`` what ``out`` had
    pthread_t thread
    pthread_mutex_t mu
    int cmd_fd               # eventfd: ``out`` has commands to send
    int stop_fd              # eventfd: stop (the connection's cancel fd; never drained)
    # Guarded by mu.
    int thread_started
    int stop
    int exited
    int detached             # the Python object is gone: the thread frees this struct
    int cluster              # a cluster node's hub: channels live in slots that move (fixed)
    int sharded              # SSUBSCRIBE (a cluster node with sharded pub/sub), else SUBSCRIBE
    int64_t connects         # sessions established so far
    int64_t subscribed_at    # when the current session sent its SUBSCRIBE (0: none)
    rl_buf out               # SUBSCRIBE / UNSUBSCRIBE queued by Python for the thread
    rl_nsub** subs
    int nsubs
    int cap


cdef void hub_free(rl_hub* h) noexcept nogil:
    conn_free(&h.conn)
    buf_free(&h.out)
    if h.cmd_fd >= 0:
        close(h.cmd_fd)
    if h.stop_fd >= 0:
        close(h.stop_fd)
    free(h.subs)
    pthread_mutex_destroy(&h.mu)
    free(h)


cdef void sub_push(rl_nsub* s, const char* data, size_t n, bint lost) noexcept nogil:
    """Under the hub's mutex: queue one notice for the waiter and wake it."""
    cdef rl_payload* p
    if s.pending == NULL:
        s.pending = <rl_payload*>malloc(NOTICE_PENDING * sizeof(rl_payload))
    if s.pending == NULL:
        s.unkept = True
    elif s.npending >= NOTICE_PENDING:
        # Full: the waiter is told to look again, which covers every notice dropped.
        s.pending[NOTICE_PENDING - 1].lost = 1
    else:
        p = &s.pending[s.npending]
        s.npending += 1
        if lost or n > NOTICE_PAYLOAD:
            p.lost = 1
            p.len = 0
        else:
            p.lost = 0
            p.len = <int>n
            memcpy(p.data, data, n)
    s.notices += 1
    s.last_ns = rl_now_ns()
    fd_signal(s.fd)
    fd_signal(s.signal_fd)
    if s.bell != NULL:
        bell_ring(<rl_bell*>s.bell, s)


cdef void hub_wake_all(rl_hub* h) noexcept nogil:
    cdef int i
    pthread_mutex_lock(&h.mu)
    for i in range(h.nsubs):
        sub_push(h.subs[i], NULL, 0, True)
    pthread_mutex_unlock(&h.mu)


cdef void hub_moved(rl_hub* h, const char* channel, size_t n) noexcept nogil:
    """A cluster node no longer carries ``channel`` (NULL: maybe none of its channels).

    Its waiters are told to look again (a poll now instead of at their next
    one) and marked moved: their subscriptions are re-homed, in Python, to
    the node that owns the slot now.
    """
    cdef rl_nsub* s
    cdef int i
    pthread_mutex_lock(&h.mu)
    for i in range(h.nsubs):
        s = h.subs[i]
        if channel == NULL or (s.channel_len == n and memcmp(s.channel, channel, n) == 0):
            s.moved = True
            sub_push(s, NULL, 0, True)
    pthread_mutex_unlock(&h.mu)


cdef int hub_read_some(rl_conn* c) noexcept nogil:
    """Read what the socket has now, without waiting: 1 read, 0 nothing yet, -1 failed (dropped)."""
    cdef char msg[300]
    cdef size_t got = 0
    cdef int st, sys_errno = 0
    cdef ssize_t k
    if buf_reserve(&c.r, READ_CHUNK) < 0:
        conn_fail(c, RL_ENOMEM, "out of memory reading a notice")
        conn_drop(c)
        return -1
    if c.ssl != NULL:
        st = rl_tls_read(c.ssl, c.r.data + c.r.len, c.r.cap - c.r.len, &got,
                         &sys_errno, msg, TLS_MSG)
        if st == RL_TLS_OK:
            c.r.len += got
            return 1
        if st == RL_TLS_WANT_READ or st == RL_TLS_WANT_WRITE:
            return 0      # TLS housekeeping (a session ticket), no application byte
        return tls_fail(c, st, sys_errno, "reading from", msg)
    k = recv(c.fd, c.r.data + c.r.len, c.r.cap - c.r.len, MSG_DONTWAIT)
    if k > 0:
        c.r.len += <size_t>k
        return 1
    if k == 0:
        conn_fail(c, RL_ECONN, "Connection closed by server.")
        conn_drop(c)
        return -1
    if errno == EINTR or rl_would_block(errno):
        return 0
    return conn_io_error(c, errno, "reading from")


cdef bint node_is(rl_conn* c, rl_node* n, const char* text) noexcept nogil:
    cdef size_t k = strlen(text)
    return n.kind == c'$' and <size_t>n.ival == k and memcmp(c.r.data + n.off, text, k) == 0


cdef inline char ascii_lower(char ch) noexcept nogil:
    return ch + 32 if c'A' <= ch <= c'Z' else ch


cdef bint error_has(rl_conn* c, rl_node* n, const char* text) noexcept nogil:
    """Whether the error reply ``n`` contains ``text`` (ASCII, any case)."""
    cdef size_t k = strlen(text)
    cdef size_t i, j
    cdef const char* p = c.r.data + n.off
    if n.kind != c'-' or n.ival < 0 or <size_t>n.ival < k:
        return False
    for i in range(<size_t>n.ival - k + 1):
        j = 0
        while j < k and ascii_lower(p[i + j]) == ascii_lower(text[j]):
            j += 1
        if j == k:
            return True
    return False


cdef enum:
    HUB_RESUBSCRIBE = 1      # hub_dispatch: subscribe every channel again, with SUBSCRIBE


cdef int hub_dispatch(rl_hub* h) noexcept nogil:
    """One buffered reply: a message wakes its channel's waiters.

    On a cluster node, a ``sunsubscribe`` the hub did not ask for (the slot
    moved away) or a MOVED error (its owner changed before the subscription
    came) re-homes the channel's waiters (``hub_moved``); "unknown command"
    (a server without sharded pub/sub, whose releases PUBLISH) turns the hub
    to SUBSCRIBE: the answer is HUB_RESUBSCRIBE, else 0. Subscribe
    confirmations, PONGs and other error replies (a user not allowed to
    subscribe) change nothing: the waiters poll as the fallback.
    """
    cdef rl_conn* c = &h.conn
    cdef rl_node* top = &c.nodes.items[0]
    cdef rl_node* ch
    cdef rl_node* payload
    cdef rl_nsub* s
    cdef int i, rc
    if top.kind == c'-':
        if not h.cluster:
            return 0
        if error_has(c, top, b"unknown command"):
            # Once: what was queued after the switch is plain SUBSCRIBE, and
            # what was sent before it is in the SUBSCRIBE of them all.
            pthread_mutex_lock(&h.mu)
            rc = HUB_RESUBSCRIBE if h.sharded else 0
            h.sharded = 0
            pthread_mutex_unlock(&h.mu)
            return rc
        rc = reply_node_class(c.r.data, top, EXPECT_ANY)
        if rc == REPLY_MOVED or rc == REPLY_ASK:
            hub_moved(h, NULL, 0)
        return 0
    if top.kind != c'*' or top.ival != 3 or c.nodes.len < 4:
        return 0
    ch = &c.nodes.items[2]
    if h.cluster and ch.kind == c'$' and node_is(c, &c.nodes.items[1], b"sunsubscribe"):
        # Wanted still (else the hub asked for it): the node gave the slot up.
        hub_moved(h, c.r.data + ch.off, <size_t>ch.ival)
        return 0
    if not (node_is(c, &c.nodes.items[1], b"message") or node_is(c, &c.nodes.items[1], b"smessage")):
        return 0
    payload = &c.nodes.items[3]
    if ch.kind != c'$' or payload.kind != c'$' or payload.ival < 0:
        return 0
    pthread_mutex_lock(&h.mu)
    for i in range(h.nsubs):
        s = h.subs[i]
        if s.channel_len == <size_t>ch.ival and memcmp(s.channel, c.r.data + ch.off, s.channel_len) == 0:
            sub_push(s, c.r.data + payload.off, <size_t>payload.ival, False)
    pthread_mutex_unlock(&h.mu)
    return 0


cdef int hub_queue(rl_hub* h, bint unsubscribe, const char* channel, size_t n) noexcept nogil:
    """Under mu: queue (UN)SUBSCRIBE, or SSUBSCRIBE / SUNSUBSCRIBE, of ``channel`` in ``out``.

    Chosen under the lock, as the thread turns a hub from sharded to plain
    under it: whatever reaches the server after the switch is plain.
    """
    cdef size_t before = h.out.len
    cdef const char* name
    if unsubscribe:
        name = b"SUNSUBSCRIBE" if h.sharded else b"UNSUBSCRIBE"
    else:
        name = b"SSUBSCRIBE" if h.sharded else b"SUBSCRIBE"
    if (buf_put_prefix(&h.out, c'*', 2) < 0 or buf_put_bulk(&h.out, name, strlen(name)) < 0
            or buf_put_bulk(&h.out, channel, n) < 0):
        h.out.len = before
        return -1
    return 0


cdef int hub_build_subscribe(rl_hub* h, rl_buf* w) noexcept nogil:
    """Under mu: subscribe every wanted channel, into ``w``; what ``out`` had is moot.

    ``SUBSCRIBE`` takes them all at once; ``SSUBSCRIBE`` one at a time (its
    channels must share a slot).
    """
    cdef int i
    w.len = 0
    h.out.len = 0
    if h.nsubs == 0:
        return 0
    if h.sharded:
        for i in range(h.nsubs):
            if (buf_put_prefix(w, c'*', 2) < 0 or buf_put_bulk(w, b"SSUBSCRIBE", 10) < 0
                    or buf_put_bulk(w, h.subs[i].channel, h.subs[i].channel_len) < 0):
                return -1
        return 0
    if buf_put_prefix(w, c'*', h.nsubs + 1) < 0 or buf_put_bulk(w, b"SUBSCRIBE", 9) < 0:
        return -1
    for i in range(h.nsubs):
        if buf_put_bulk(w, h.subs[i].channel, h.subs[i].channel_len) < 0:
            return -1
    return 0


cdef void drain_fd(int fd) noexcept nogil:
    cdef uint64_t value
    read(fd, &value, 8)


cdef int hub_session(rl_hub* h, bint reconnect) noexcept nogil:
    """One connection's life: 0 when it ended by itself (stop, idle), -1 on a failure.

    ``reconnect``: an earlier session of this thread was lost, and notices with it.
    """
    cdef rl_conn* c = &h.conn
    cdef pollfd fds[3]
    cdef int64_t now, heard, pinged, idle_since = 0
    cdef int rc, nsubs
    cdef Py_ssize_t parsed
    now = rl_now_ns()
    if c.disco != NULL and (<rl_disco*>c.disco).kind != DISCO_SENTINEL:
        return conn_fail(c, RL_EUNEXPECTED, "a cluster's notices are read per node, by its own hub")
    if c.disco != NULL:
        rc = sentinel_prepare(c, <rl_disco*>c.disco, now + NOTICE_CONNECT_NS)
    else:
        rc = conn_ready(c, now + NOTICE_CONNECT_NS)
    if rc < 0:
        return -1
    pthread_mutex_lock(&h.mu)
    drain_fd(h.cmd_fd)
    rc = hub_build_subscribe(h, &c.w)
    h.connects += 1
    h.subscribed_at = rl_now_ns()
    pthread_mutex_unlock(&h.mu)
    if rc < 0:
        return conn_fail(c, RL_ENOMEM, "out of memory encoding SUBSCRIBE")
    if c.w.len and conn_send(c, c.w.data, c.w.len, rl_now_ns() + NOTICE_CONNECT_NS) < 0:
        return -1
    if reconnect:
        # Notices sent while the connection was down are lost: every waiter
        # looks once now instead of at its next poll.
        hub_wake_all(h)
    heard = pinged = rl_now_ns()
    while True:
        if c.r.len > 0:
            parsed = resp_parse(c.r.data, c.r.len, &c.nodes)
            if parsed > 0:
                c.reply_len = <size_t>parsed
                heard = rl_now_ns()
                rc = hub_dispatch(h)
                conn_consume(c)
                if rc == HUB_RESUBSCRIBE:
                    pthread_mutex_lock(&h.mu)
                    rc = hub_build_subscribe(h, &c.e)
                    pthread_mutex_unlock(&h.mu)
                    if rc < 0:
                        return conn_fail(c, RL_ENOMEM, "out of memory encoding SUBSCRIBE")
                    if c.e.len and conn_send(c, c.e.data, c.e.len, rl_now_ns() + NOTICE_CONNECT_NS) < 0:
                        return -1
                continue
            if parsed < 0:
                conn_fail(c, RL_EPROTO, "Protocol error: the server sent a malformed reply")
                conn_drop(c)
                return -1
        if c.ssl != NULL and rl_tls_has_pending(c.ssl):
            if hub_read_some(c) < 0:
                return -1
            continue
        fds[0].fd = c.fd
        fds[0].events = POLLIN
        fds[0].revents = 0
        fds[1].fd = h.cmd_fd
        fds[1].events = POLLIN
        fds[1].revents = 0
        fds[2].fd = h.stop_fd
        fds[2].events = POLLIN
        fds[2].revents = 0
        rc = rl_ppoll(fds, 3, NOTICE_SLICE_NS)
        if rc < 0 and errno != EINTR:
            return conn_io_error(c, errno, "waiting for")
        if fds[2].revents != 0:
            return 0
        if fds[1].revents != 0:
            pthread_mutex_lock(&h.mu)
            drain_fd(h.cmd_fd)
            c.e.len = 0
            rc = buf_put(&c.e, h.out.data, h.out.len) if h.out.len else 0
            h.out.len = 0
            pthread_mutex_unlock(&h.mu)
            if rc < 0:
                return conn_fail(c, RL_ENOMEM, "out of memory queueing a subscription")
            if c.e.len and conn_send(c, c.e.data, c.e.len, rl_now_ns() + NOTICE_CONNECT_NS) < 0:
                return -1
        if fds[0].revents != 0:
            if hub_read_some(c) < 0:
                return -1
            continue
        now = rl_now_ns()
        pthread_mutex_lock(&h.mu)
        nsubs = h.nsubs
        pthread_mutex_unlock(&h.mu)
        if nsubs == 0:
            if idle_since == 0:
                idle_since = now
            elif now - idle_since >= NOTICE_IDLE_NS:
                return 0
        else:
            idle_since = 0
        if now - heard >= NOTICE_DEAD_NS:
            conn_fail(c, RL_ECONN, "the notice connection went silent")
            return -1
        if now - heard >= NOTICE_PING_NS and now - pinged >= NOTICE_PING_NS:
            pinged = now
            if conn_send(c, PING_CMD, strlen(PING_CMD), now + NOTICE_CONNECT_NS) < 0:
                return -1


cdef bint hub_pause(rl_hub* h, int64_t ns) noexcept nogil:
    """Sleep ``ns`` unless stopped meanwhile (True)."""
    cdef pollfd pfd
    cdef int64_t until = rl_now_ns() + ns
    cdef int64_t now
    while True:
        now = rl_now_ns()
        if now >= until:
            return False
        pfd.fd = h.stop_fd
        pfd.events = POLLIN
        pfd.revents = 0
        if rl_ppoll(&pfd, 1, until - now) > 0:
            return True


cdef void* hub_main(void* arg) noexcept nogil:
    cdef rl_hub* h = <rl_hub*>arg
    cdef int64_t backoff = NOTICE_BACKOFF_MIN_NS
    cdef int rc, detached
    cdef bint lost = False
    rl_name_notice_thread()
    while True:
        pthread_mutex_lock(&h.mu)
        if h.stop or h.nsubs == 0:
            # Nobody listens (any more): the thread ends. Decided and marked
            # under one hold of the lock, so a waiter that comes now sees it
            # ended and starts another (NoticeHub.add).
            detached = h.detached
            h.exited = 1
            pthread_mutex_unlock(&h.mu)
            break
        pthread_mutex_unlock(&h.mu)
        rc = hub_session(h, lost)
        lost = True       # whatever ended it, the next session follows a gap
        conn_drop(&h.conn)
        pthread_mutex_lock(&h.mu)
        h.subscribed_at = 0
        pthread_mutex_unlock(&h.mu)
        if rc < 0:
            if h.cluster:
                # The node may be gone for good (a failover): its waiters look
                # again, and look up who owns their slots now.
                hub_moved(h, NULL, 0)
            # Waiters poll meanwhile; the connection is tried again after a backoff.
            if hub_pause(h, backoff):
                continue      # stopped: the top of the loop ends the thread
            backoff = backoff * 2 if backoff * 2 < NOTICE_BACKOFF_MAX_NS else NOTICE_BACKOFF_MAX_NS
        else:
            backoff = NOTICE_BACKOFF_MIN_NS
    if detached:
        hub_free(h)
    return NULL


# ---------------------------------------------------------------- Python faces (GIL held)

from posix.unistd cimport getpid


cdef class NoticeHub:
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

    cdef rl_hub* h
    cdef bint _closed
    cdef bint _forked
    cdef int _pid            # the process that made it: in any other, it is inert
    cdef dict _counts        # channel -> how many subscriptions want it (GIL-guarded)
    cdef readonly Target target
    cdef object __weakref__

    def __cinit__(self):
        self.h = NULL
        self._counts = {}
        self._closed = False
        self._forked = False
        self._pid = getpid()

    cdef bint inherited(self) noexcept:
        """True in a forked child, made inert on first sight whichever fork handler ran first."""
        if not self._forked and getpid() != self._pid:
            self.after_fork_in_child()
        return self._forked

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

    cdef void after_fork_in_child(self) noexcept:
        cdef rl_hub* h = self.h
        if h == NULL or self._forked:
            return
        # The reader thread was not copied and its lock may have been held.
        # The struct stays allocated: freeing what a vanished thread may
        # have been using is not safe.
        pthread_mutex_init(&h.mu, NULL)
        h.thread_started = 0
        h.stop = 1
        self._forked = True
        tls_forget_after_fork(&h.conn)
        conn_drop(&h.conn)


cdef class NoticeBell:
    """Where subscriptions without a thread of their own report their notices.

    ``NoticeBell(fd)``: each notice to a ``NoticeSub`` made with this bell
    marks that subscription fired and writes ``fd`` (an eventfd or a pipe
    the caller owns and keeps open while any such subscription exists), on
    the hub's thread, without the GIL. ``take()`` then names the fired
    subscriptions by their tags, each once, however many notices it got.
    After ``os.fork()`` the child's copy is inert: it names nothing.
    """

    cdef rl_bell* b
    cdef int _pid
    cdef bint _forked
    cdef object __weakref__

    def __cinit__(self):
        self.b = NULL
        self._pid = getpid()
        self._forked = False

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

    cdef bint inherited(self) noexcept:
        """True in a forked child: the parent's subscriptions are not this process's."""
        if not self._forked and getpid() != self._pid:
            # A reader thread of the parent may have held the lock: it is not copied.
            pthread_mutex_init(&self.b.mu, NULL)
            self.b.fired = NULL
            rl_store(&self.b.nfired, 0)
            self._forked = True
        return self._forked

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
