# Release notices, read natively: the two threads that serve every hub of
# the process (each hub is one subscription session to one server; see
# _notices_session.pxi). The reader thread reads every live session in one
# poll and never blocks on one server: a frozen node cannot hold up the
# notices of the others. The connector thread makes the sessions (connect,
# TLS, AUTH, asking the sentinels, SUBSCRIBE), one at a time, each under
# NOTICE_CONNECT_NS, and lives only while some hub wants one; after a lost
# session it waits out the hub's backoff. Neither takes the GIL, ever.
#
# A hub's life (``state``, under the reader's mutex): HUB_IDLE (not listed)
# -> HUB_WANT (a waiter came: reader_want) -> HUB_CONNECTING (the
# connector's) -> HUB_LIVE (the reader's) -> back to HUB_WANT when the
# session fails (its waiters look again: notices may have been lost), or to
# HUB_IDLE when its last waiter has been gone for NOTICE_IDLE_NS (the
# connection closed) or it is stopped (reader_let_go). Only the reader
# thread unlists a hub while it runs, so a hub it is reading stays valid;
# close() waits for that. The reader ends when no hub is listed; the next
# waiter starts another. Lock order: the reader's mutex, then a hub's,
# then a bell's.
#
# Needs: _posix, _conn, _tls, _lease (fd_signal), _notices_queue, _notices_session.

cdef extern from *:
    """
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <pthread.h>
    /* The threads' names, as ps and /proc show them (at most 15 bytes). */
    static void rl_name_notice_thread(void) {
    #if defined(__GLIBC__)
        pthread_setname_np(pthread_self(), "redlease-notice");
    #endif
    }
    static void rl_name_connect_thread(void) {
    #if defined(__GLIBC__)
        pthread_setname_np(pthread_self(), "redlease-nconn");
    #endif
    }
    """
    void rl_name_notice_thread() noexcept nogil
    void rl_name_connect_thread() noexcept nogil



cdef int hub_waiters(rl_hub* h, bint* stop) noexcept nogil:
    cdef int n
    pthread_mutex_lock(&h.mu)
    n = h.nsubs
    stop[0] = h.stop != 0
    pthread_mutex_unlock(&h.mu)
    return n


cdef void reader_unlist(rl_reader* r, rl_hub* h) noexcept nogil:
    """Under r.mu: ``h`` leaves the reader's list, with no session (HUB_IDLE)."""
    cdef int i = h.index
    if h.state == HUB_IDLE:
        return
    r.hubs[i] = r.hubs[r.nhubs - 1]
    r.hubs[i].index = i
    r.nhubs -= 1
    h.state = HUB_IDLE
    h.index = -1
    pthread_cond_broadcast(&r.released)


cdef void hub_session_lost(rl_reader* r, rl_hub* h, bint failed) noexcept nogil:
    """Under r.mu: the session of ``h`` ended (``failed``: by a failure); it wants another."""
    cdef int64_t now = rl_now_ns()
    conn_drop(&h.conn)
    pthread_mutex_lock(&h.mu)
    h.subscribed_at = 0
    pthread_mutex_unlock(&h.mu)
    if failed and h.cluster:
        # The node may be gone for good (a failover): its waiters look
        # again, and look up who owns their slots now.
        hub_moved(h, NULL, 0)
    if h.state == HUB_LIVE and now - h.live_since >= NOTICE_DEAD_NS:
        h.backoff = NOTICE_BACKOFF_MIN_NS     # it had been up a while: not a flapping server
    h.state = HUB_WANT
    h.connect_at = now + h.backoff
    h.backoff = h.backoff * 2 if h.backoff * 2 < NOTICE_BACKOFF_MAX_NS else NOTICE_BACKOFF_MAX_NS
    h.lost = True     # the next session follows a gap


cdef void* connector_main(void* arg) noexcept nogil:
    """Connect the hubs that want a session, one at a time, then hand each to the reader.

    Connecting blocks (TCP, TLS, AUTH / HELLO, asking the sentinels), under
    NOTICE_CONNECT_NS and the hub's stop fd, so it is done here and never
    on the reader thread: a node that does not answer delays only other
    hubs' reconnects, never a notice on a live session. The thread ends
    when no hub wants a session; the reader starts another when one does.
    """
    cdef rl_reader* r = <rl_reader*>arg
    cdef rl_hub* h
    cdef rl_hub* due
    cdef int64_t now, soonest
    cdef int i, rc
    cdef bint stop, lost
    cdef pollfd pfd
    rl_name_connect_thread()
    pthread_mutex_lock(&r.mu)
    while not r.stop:
        now = rl_now_ns()
        due = NULL
        soonest = 0
        for i in range(r.nhubs):
            h = r.hubs[i]
            if h.state != HUB_WANT or hub_waiters(h, &stop) == 0 or stop:
                continue      # the reader lets it go
            if h.connect_at <= now:
                due = h
                break
            if soonest == 0 or h.connect_at < soonest:
                soonest = h.connect_at
        if due != NULL:
            due.state = HUB_CONNECTING
            lost = due.lost
            pthread_mutex_unlock(&r.mu)
            rc = hub_open(due, lost)
            pthread_mutex_lock(&r.mu)
            if rc < 0:
                hub_session_lost(r, due, True)
            else:
                now = rl_now_ns()
                due.heard = due.pinged = due.live_since = now
                due.idle_since = 0
                due.state = HUB_LIVE
            pthread_cond_broadcast(&r.released)     # a close() may wait for it
            fd_signal(r.wake_fd)
            continue
        if soonest == 0:
            break         # nothing to connect: the thread ends
        pthread_mutex_unlock(&r.mu)
        pfd.fd = r.connect_fd
        pfd.events = POLLIN
        pfd.revents = 0
        if rl_ppoll(&pfd, 1, soonest - now) > 0:
            drain_fd(r.connect_fd)
        pthread_mutex_lock(&r.mu)
    r.connector_exited = 1
    pthread_mutex_unlock(&r.mu)
    return NULL


cdef int reader_start_connector(rl_reader* r) noexcept nogil:
    """Under r.mu: make sure the connector runs (joining one that ended)."""
    cdef int rc
    if r.connector_started and not r.connector_exited:
        fd_signal(r.connect_fd)
        return 0
    if r.connector_started:
        pthread_join(r.connector, NULL)   # it ended: nothing of it waits for mu
        r.connector_started = 0
    rc = rl_spawn(&r.connector, connector_main, r)
    if rc != 0:
        return -1     # waiters poll; the next round tries again
    r.connector_started = 1
    r.connector_exited = 0
    r.connectors += 1
    return 0


cdef int reader_round(rl_reader* r, rl_hub** live, int cap, int64_t now,
                      int64_t* timeout) noexcept nogil:
    """Under r.mu: look at every hub; the live sessions to read go into ``live`` (their count).

    At most ``cap`` of them (the rest wait a round: memory ran short).

    Lets go a hub stopped, a hub that wants a session but no longer has a
    waiter, and a live one with no waiter for NOTICE_IDLE_NS (its
    connection closed); starts the connector when a hub's connect is due.
    """
    cdef int i = 0
    cdef int n = 0
    cdef int waiters
    cdef rl_hub* h
    cdef bint stop, connect = False
    cdef int64_t due
    while i < r.nhubs:
        h = r.hubs[i]
        if h.state == HUB_CONNECTING:
            i += 1        # the connector's; a stop ends its I/O at once
            continue
        waiters = hub_waiters(h, &stop)
        if h.state == HUB_LIVE and waiters == 0 and not stop:
            if h.idle_since == 0:
                h.idle_since = now
            stop = now - h.idle_since >= NOTICE_IDLE_NS
        elif h.state == HUB_LIVE:
            h.idle_since = 0
        if stop or (h.state == HUB_WANT and waiters == 0):
            if h.state == HUB_LIVE:
                conn_drop(&h.conn)
                pthread_mutex_lock(&h.mu)
                h.subscribed_at = 0
                pthread_mutex_unlock(&h.mu)
            reader_unlist(r, h)
            continue
        if h.state == HUB_WANT:
            if h.connect_at <= now:
                connect = True
            elif h.connect_at - now < timeout[0]:
                timeout[0] = h.connect_at - now
        elif n < cap:
            live[n] = h
            n += 1
            due = hub_unsubscribe_due(h, now)
            if 0 <= due < timeout[0]:
                timeout[0] = due
            if h.conn.ssl != NULL and rl_tls_has_pending(h.conn.ssl):
                timeout[0] = 0
        i += 1
    if connect:
        reader_start_connector(r)
    return n


cdef void hub_pause_fd(int fd, int64_t ns) noexcept nogil:
    """Sleep ``ns`` or until ``fd`` is readable."""
    cdef pollfd pfd
    pfd.fd = fd
    pfd.events = POLLIN
    pfd.revents = 0
    rl_ppoll(&pfd, 1, ns)


cdef void* reader_main(void* arg) noexcept nogil:
    """Read every live session of the process's hubs, in one poll, without the GIL.

    Ends once no hub is left in its list (decided under the lock, so that
    a hub wanted after that starts another reader: reader_want).
    """
    cdef rl_reader* r = <rl_reader*>arg
    cdef rl_hub** live = NULL
    cdef rl_hub** grown_live
    cdef pollfd* fds = NULL
    cdef pollfd* grown_fds
    cdef int cap = 0
    cdef int n, k, rc
    cdef int64_t now, timeout
    rl_name_notice_thread()
    while True:
        pthread_mutex_lock(&r.mu)
        if r.stop or r.nhubs == 0:
            # A connector still running ends by itself (nothing to connect);
            # whoever starts the next one, or the reader's owner, joins it.
            r.exited = 1
            pthread_mutex_unlock(&r.mu)
            break
        if r.nhubs > cap:
            grown_live = <rl_hub**>realloc(live, <size_t>r.nhubs * sizeof(rl_hub*))
            if grown_live != NULL:
                live = grown_live
            grown_fds = <pollfd*>realloc(fds, <size_t>(2 * r.nhubs + 1) * sizeof(pollfd))
            if grown_fds != NULL:
                fds = grown_fds
            if grown_live != NULL and grown_fds != NULL:
                cap = r.nhubs
        now = rl_now_ns()
        timeout = NOTICE_SLICE_NS
        n = reader_round(r, live, cap, now, &timeout)
        pthread_mutex_unlock(&r.mu)
        if fds == NULL:
            hub_pause_fd(r.wake_fd, NOTICE_SLICE_NS)     # out of memory: waiters poll meanwhile
            continue
        fds[0].fd = r.wake_fd
        fds[0].events = POLLIN
        fds[0].revents = 0
        for k in range(n):
            fds[1 + 2 * k].fd = live[k].conn.fd
            fds[1 + 2 * k].events = POLLIN
            fds[1 + 2 * k].revents = 0
            fds[2 + 2 * k].fd = live[k].cmd_fd
            fds[2 + 2 * k].events = POLLIN
            fds[2 + 2 * k].revents = 0
        rc = rl_ppoll(fds, <unsigned long>(1 + 2 * n), timeout)
        if rc < 0 and errno != EINTR:
            hub_pause_fd(r.wake_fd, NOTICE_SLICE_NS)
            continue
        if fds[0].revents != 0:
            drain_fd(r.wake_fd)
        now = rl_now_ns()
        for k in range(n):
            # Only this thread touches a live session, and only it unlists
            # a hub (close() waits for that): ``live[k]`` stays valid here.
            if hub_serve(live[k], fds[1 + 2 * k].revents != 0, fds[2 + 2 * k].revents != 0, now) < 0:
                pthread_mutex_lock(&r.mu)
                hub_session_lost(r, live[k], True)
                pthread_mutex_unlock(&r.mu)
                fd_signal(r.wake_fd)
    free(live)
    free(fds)
    return NULL


cdef int reader_want(rl_reader* r, rl_hub* h) noexcept nogil:
    """A waiter came to ``h``: it wants a session (if it had none), and the reader runs.

    0, or an errno when the reader thread cannot be started (the hub is
    then back to HUB_IDLE). Joins a reader that had ended.
    """
    cdef rl_hub** grown
    cdef pthread_t old
    cdef bint joining = False
    cdef int rc = 0
    pthread_mutex_lock(&r.mu)
    if r.stop:
        pthread_mutex_unlock(&r.mu)
        return EINVAL
    if h.state == HUB_IDLE:
        if r.nhubs == r.cap:
            grown = <rl_hub**>realloc(r.hubs, <size_t>(r.cap * 2 + 4) * sizeof(rl_hub*))
            if grown == NULL:
                pthread_mutex_unlock(&r.mu)
                return ENOMEM
            r.hubs = grown
            r.cap = r.cap * 2 + 4
        h.index = r.nhubs
        r.hubs[r.nhubs] = h
        r.nhubs += 1
        h.state = HUB_WANT
        h.connect_at = 0
        h.backoff = NOTICE_BACKOFF_MIN_NS
        h.lost = False    # nobody listened while it was idle: nothing was lost
    if r.thread_started and r.exited:
        old = r.thread
        joining = True
        r.thread_started = 0
    if not r.thread_started:
        rc = rl_spawn(&r.thread, reader_main, r)
        if rc != 0:
            reader_unlist(r, h)
        else:
            r.thread_started = 1
            r.exited = 0
    pthread_mutex_unlock(&r.mu)
    fd_signal(r.wake_fd)
    if joining:
        pthread_join(old, NULL)
    return rc


cdef void reader_let_go(rl_reader* r, rl_hub* h) noexcept nogil:
    """Stop ``h`` and wait until the reader and the connector let it go (HUB_IDLE).

    The hub's stop fd cancels whatever I/O of it is under way, so this is short.
    """
    pthread_mutex_lock(&h.mu)
    h.stop = 1
    pthread_mutex_unlock(&h.mu)
    fd_signal(h.stop_fd)
    pthread_mutex_lock(&r.mu)
    while h.state == HUB_CONNECTING or (h.state != HUB_IDLE and r.thread_started and not r.exited):
        fd_signal(r.wake_fd)
        pthread_cond_wait(&r.released, &r.mu)
    if h.state != HUB_IDLE:
        reader_unlist(r, h)   # no reader to do it (one could not be started)
    pthread_mutex_unlock(&r.mu)
    conn_drop(&h.conn)
