# Release notices, read natively: one subscription session to one server.
# A release of a lease PUBLISHes on ``<lease key>:released``; a session
# SUBSCRIBEs every channel its hub's waiters want (SSUBSCRIBE each on a
# cluster node with sharded pub/sub) and wakes a channel's waiters by writing
# their eventfds (and, for an elector, its keeper's eventfd, which its
# follower sleeps on), so a waiter is woken while another thread holds the
# GIL. On a cluster node a channel the node no longer carries marks its
# waiters moved (``hub_moved``), so that Python re-homes them. Each channel
# is subscribed by a command of its own, and the hub remembers which are in
# flight: a channel the server refuses (NOPERM, an ACL user without it) marks
# its waiters refused, and they poll while the other channels carry on.
#
# Here: what one session does, in two parts: ``hub_open`` (connect and
# subscribe: blocking, under NOTICE_CONNECT_NS, done by the connector
# thread) and ``hub_serve`` (one non-blocking look at a live session: send
# the (UN)SUBSCRIBE Python queued, read, dispatch, ping a silent connection,
# drop one silent too long; done by the reader thread). The threads that
# run them for every hub of the process are in _notices_reader.pxi.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _replies, _notices_queue.

# The timings, from redlease._engine.rules.timing (read when the module is imported).
cdef int64_t NOTICE_SLICE_NS = _timing.ns(_timing.NOTICE_READ_SLICE)  # one poll, then look around
cdef int64_t NOTICE_PING_NS = _timing.ns(_timing.NOTICE_PING_AFTER)   # silent: pinged after this ...
cdef int64_t NOTICE_DEAD_NS = _timing.ns(_timing.NOTICE_DEAD_AFTER)   # ... dropped when silent this long
cdef int64_t NOTICE_IDLE_NS = _timing.ns(_timing.NOTICE_IDLE_CLOSE)   # no waiter this long: close it
cdef int64_t NOTICE_UNSUBSCRIBE_NS = _timing.ns(_timing.NOTICE_UNSUBSCRIBE_DELAY)  # unsubscribes wait this long
cdef int64_t NOTICE_BACKOFF_MIN_NS = _timing.ns(_timing.NOTICE_BACKOFF_MIN)
cdef int64_t NOTICE_BACKOFF_MAX_NS = _timing.ns(_timing.NOTICE_BACKOFF_MAX)
cdef int64_t NOTICE_CONNECT_NS = _timing.ns(_timing.NOTICE_CONNECT_TIMEOUT)

cdef const char* PING_CMD = b"*1\r\n$4\r\nPING\r\n"

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


cdef bint error_has(rl_conn* c, rl_node* n, const char* text) noexcept nogil:
    """Whether the error reply ``n`` contains ``text`` (ASCII, any case)."""
    return node_has(c.r.data, n, text, True)


cdef enum:
    HUB_RESUBSCRIBE = 1      # hub_dispatch: subscribe every channel again, with SUBSCRIBE


cdef int subs_put(rl_buf* b, const char* channel, size_t n) noexcept nogil:
    """Append ``channel`` to a list of subscribed channels (``out_subs``, ``inflight``)."""
    cdef size_t before = b.len
    if buf_put(b, <const char*>&n, sizeof(size_t)) < 0 or buf_put(b, channel, n) < 0:
        b.len = before
        return -1
    return 0


cdef void hub_answered(rl_hub* h, bint refused) noexcept nogil:
    """Under mu: the oldest (S)SUBSCRIBE in flight got its answer.

    ``refused``: the server refused its channel (NOPERM: the user may not
    use it): the channel's waiters are marked refused; they poll.
    """
    cdef size_t n
    cdef const char* channel
    cdef rl_nsub* s
    cdef int i
    cdef bint found = False
    if h.inflight_head + sizeof(size_t) <= h.inflight.len:
        memcpy(&n, h.inflight.data + h.inflight_head, sizeof(size_t))
        channel = h.inflight.data + h.inflight_head + sizeof(size_t)
        h.inflight_head += sizeof(size_t) + n
        if refused:
            s = hub_index_first(h, channel, n)
            while s != NULL:
                s.refused = True
                found = True
                s = hub_index_next(s, channel, n)
            if found:
                h.refusals += 1
    if h.inflight_head >= h.inflight.len:
        h.inflight.len = 0
        h.inflight_head = 0


cdef int hub_dispatch(rl_hub* h) noexcept nogil:
    """One buffered reply: a message wakes its channel's waiters.

    On a cluster node, a ``sunsubscribe`` the hub did not ask for (the slot
    moved away) or a MOVED error (its owner changed before the subscription
    came) re-homes the channel's waiters (``hub_moved``); "unknown command"
    (a server without sharded pub/sub, whose releases PUBLISH) turns the hub
    to SUBSCRIBE: the answer is HUB_RESUBSCRIBE, else 0. A subscribe
    confirmation or an error reply answers the oldest subscribe in flight;
    NOPERM (a user not allowed the channel) marks its waiters refused, and
    they poll as the fallback. PONGs and other error replies change nothing.
    """
    cdef rl_conn* c = &h.conn
    cdef rl_node* top = &c.nodes.items[0]
    cdef rl_node* ch
    cdef rl_node* payload
    cdef rl_nsub* s
    cdef int i, rc
    if top.kind == c'-':
        pthread_mutex_lock(&h.mu)
        hub_answered(h, node_is_noperm(c.r.data, top))
        pthread_mutex_unlock(&h.mu)
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
    if node_is(c, &c.nodes.items[1], b"subscribe") or node_is(c, &c.nodes.items[1], b"ssubscribe"):
        pthread_mutex_lock(&h.mu)
        hub_answered(h, False)
        pthread_mutex_unlock(&h.mu)
        return 0
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
    s = hub_index_first(h, c.r.data + ch.off, <size_t>ch.ival)
    while s != NULL:
        sub_push(s, c.r.data + payload.off, <size_t>payload.ival, False)
        s = hub_index_next(s, c.r.data + ch.off, <size_t>ch.ival)
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
            or buf_put_bulk(&h.out, channel, n) < 0
            or (not unsubscribe and subs_put(&h.out_subs, channel, n) < 0)):
        h.out.len = before
        return -1
    return 0


cdef int hub_build_subscribe(rl_hub* h, rl_buf* w) noexcept nogil:
    """Under mu: subscribe every wanted channel, into ``w``; what ``out`` had is moot.

    One command a channel (the server may refuse one and not the others;
    an ``SSUBSCRIBE``'s channels must share a slot besides), each put in
    flight as it will be sent.
    """
    cdef int i
    cdef const char* name = b"SSUBSCRIBE" if h.sharded else b"SUBSCRIBE"
    w.len = 0
    h.out.len = 0
    h.out_subs.len = 0
    h.unsubscribe_since = 0
    for i in range(h.nsubs):
        if (buf_put_prefix(w, c'*', 2) < 0 or buf_put_bulk(w, name, strlen(name)) < 0
                or buf_put_bulk(w, h.subs[i].channel, h.subs[i].channel_len) < 0
                or subs_put(&h.inflight, h.subs[i].channel, h.subs[i].channel_len) < 0):
            return -1
    return 0


cdef void drain_fd(int fd) noexcept nogil:
    cdef uint64_t value
    read(fd, &value, 8)


cdef int hub_open(rl_hub* h, bint reconnect) noexcept nogil:
    """The connector's part of a session: connect, SUBSCRIBE every wanted channel. 0 or -1.

    ``reconnect``: an earlier session of this hub was lost, and notices with
    it: every waiter looks once now instead of at its next poll.
    """
    cdef rl_conn* c = &h.conn
    cdef int64_t now = rl_now_ns()
    cdef int rc
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
    h.inflight.len = 0       # a new connection: nothing of it is in flight yet
    h.inflight_head = 0
    rc = hub_build_subscribe(h, &c.w)
    h.connects += 1
    h.subscribed_at = rl_now_ns()
    pthread_mutex_unlock(&h.mu)
    if rc < 0:
        return conn_fail(c, RL_ENOMEM, "out of memory encoding SUBSCRIBE")
    if c.w.len and conn_send(c, c.w.data, c.w.len, rl_now_ns() + NOTICE_CONNECT_NS) < 0:
        return -1
    if reconnect:
        hub_wake_all(h)
    return 0


cdef int hub_send_queued(rl_hub* h) noexcept nogil:
    """Send the (UN)SUBSCRIBE that Python queued in ``out``. 0 or -1."""
    cdef rl_conn* c = &h.conn
    cdef int rc
    pthread_mutex_lock(&h.mu)
    drain_fd(h.cmd_fd)
    c.e.len = 0
    rc = buf_put(&c.e, h.out.data, h.out.len) if h.out.len else 0
    if rc == 0 and h.out_subs.len:
        # In flight from here: their answers come after those sent before.
        rc = buf_put(&h.inflight, h.out_subs.data, h.out_subs.len)
    h.out.len = 0
    h.out_subs.len = 0
    h.unsubscribe_since = 0
    pthread_mutex_unlock(&h.mu)
    if rc < 0:
        return conn_fail(c, RL_ENOMEM, "out of memory queueing a subscription")
    if c.e.len and conn_send(c, c.e.data, c.e.len, rl_now_ns() + NOTICE_CONNECT_NS) < 0:
        return -1
    return 0


cdef int64_t hub_unsubscribe_due(rl_hub* h, int64_t now) noexcept nogil:
    """How long until the unsubscribes queued without a signal are due: <= 0 now, -1 none."""
    cdef int64_t since
    pthread_mutex_lock(&h.mu)
    since = h.unsubscribe_since
    pthread_mutex_unlock(&h.mu)
    if since == 0:
        return -1
    return since + NOTICE_UNSUBSCRIBE_NS - now if since + NOTICE_UNSUBSCRIBE_NS > now else 0


cdef int hub_dispatch_buffered(rl_hub* h) noexcept nogil:
    """Dispatch every whole reply buffered. 0 or -1 (a malformed reply: the session fails)."""
    cdef rl_conn* c = &h.conn
    cdef Py_ssize_t parsed
    cdef int rc
    while c.r.len > 0:
        parsed = conn_parse(c, 0)
        if parsed == 0:
            return 0
        if parsed < 0:
            return -1
        c.reply_len = <size_t>parsed
        h.heard = rl_now_ns()
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
    return 0


cdef int hub_serve(rl_hub* h, bint readable, bint queued, int64_t now) noexcept nogil:
    """The reader's look at one live session. 0, or -1 when the session failed.

    Sends what Python queued (unsubscribes that nobody signalled for once
    they are NOTICE_UNSUBSCRIBE_NS old), reads one chunk (more while TLS holds
    decrypted bytes) and dispatches every whole reply; a silent connection
    is pinged, and dropped when silent too long. One chunk per session per
    round: a busy server cannot keep the others waiting.
    """
    cdef rl_conn* c = &h.conn
    cdef int rc
    if (queued or hub_unsubscribe_due(h, now) == 0) and hub_send_queued(h) < 0:
        return -1
    if readable or (c.ssl != NULL and rl_tls_has_pending(c.ssl)):
        rc = hub_read_some(c)
        if rc < 0:
            return -1
        if rc > 0 and hub_dispatch_buffered(h) < 0:
            return -1
        return 0
    if now - h.heard >= NOTICE_DEAD_NS:
        return conn_fail(c, RL_ECONN, "the notice connection went silent")
    if now - h.heard >= NOTICE_PING_NS and now - h.pinged >= NOTICE_PING_NS:
        h.pinged = now
        if conn_send(c, PING_CMD, strlen(PING_CMD), now + NOTICE_CONNECT_NS) < 0:
            return -1
    return 0
