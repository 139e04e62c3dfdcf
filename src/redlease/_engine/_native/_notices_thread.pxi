# Release notices, read natively: one subscription connection per server and
# its pthread, which never takes the GIL. A release of a lease PUBLISHes on
# ``<lease key>:released`` (see redlease._notices); this thread reads those
# messages and wakes the waiters of the channel by writing their eventfds
# (and, for an elector, its keeper's eventfd, which its follower sleeps on),
# so a waiter is woken while another thread holds the GIL.
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
# Needs: _posix, _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _replies, _notices_queue.

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
            parsed = conn_parse(c, 0)
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
