# Release notices, read natively: what the reader thread and Python share.
# ``rl_hub`` is one subscription connection's state; ``rl_nsub`` one waiter's
# interest in one channel, with the payloads of the notices it has not taken
# yet. The hub's mutex ``mu`` guards the waiter list, the pending payloads and
# the outgoing commands; it is held only to copy a few bytes, never across
# I/O (see the lock discipline in _core.pyx), so a thread holding the GIL may
# block on it.
#
# A waiter without a thread of its own (a run the process's driver steps)
# does not sleep on an eventfd of its own: its subscription rings a bell
# (``rl_bell``), one for many subscriptions of any hubs. The thread links
# the subscription into the bell's list of fired ones and writes the bell's
# fd, which the driver sleeps on with the GIL released; the driver takes the
# list (``NoticeBell.take()``: the tags of the fired subscriptions) and
# wakes just those. The bell's mutex is taken inside a hub's, never around one.
#
# Here: the bell's fired list, queueing a notice for a waiter (sub_push) and
# waking a hub's waiters; those structs are declared in _notices_queue.pxd.
# The threads are in _notices_session.pxi and _notices_reader.pxi, the Python faces in
# _notices_hub_api.pxi and _notices_sub_api.pxi.
#
# Needs: _posix, _resp_encode, _conn, _lease (fd_signal).

cdef enum:
    NOTICE_PENDING = 8       # payloads a waiter keeps; more means "some were lost"
    NOTICE_PAYLOAD = 256     # longer payloads are kept as "lost" (None)


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


cdef void hub_free(rl_hub* h) noexcept nogil:
    conn_free(&h.conn)
    buf_free(&h.out)
    buf_free(&h.out_subs)
    buf_free(&h.inflight)
    if h.cmd_fd >= 0:
        close(h.cmd_fd)
    if h.stop_fd >= 0:
        close(h.stop_fd)
    free(h.subs)
    free(h.buckets)
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


# ---------------------------------------------------------------- the channel index (mu held)

cdef uint64_t channel_hash(const char* channel, size_t n) noexcept nogil:
    """FNV-1a of the channel's bytes."""
    cdef uint64_t x = 14695981039346656037ULL
    cdef size_t i
    for i in range(n):
        x = (x ^ <unsigned char>channel[i]) * 1099511628211ULL
    return x


cdef int hub_index_add(rl_hub* h, rl_nsub* s) noexcept nogil:
    """Under mu: index ``s`` by its channel; -1 when there is no memory (nothing changed).

    The table doubles when it holds more waiters than buckets, so a lookup
    stays a few comparisons however many waiters the hub has.
    """
    cdef size_t size, i, b
    cdef rl_nsub** grown
    cdef rl_nsub* t
    cdef rl_nsub* nxt
    if h.nbuckets == 0 or <size_t>h.nsubs >= h.nbuckets:
        size = 64 if h.nbuckets == 0 else h.nbuckets * 2
        grown = <rl_nsub**>calloc(size, sizeof(rl_nsub*))
        if grown == NULL:
            if h.nbuckets == 0:
                return -1
        else:
            for i in range(h.nbuckets):
                t = h.buckets[i]
                while t != NULL:
                    nxt = t.hnext
                    b = t.hash & (size - 1)
                    t.hnext = grown[b]
                    grown[b] = t
                    t = nxt
            free(h.buckets)
            h.buckets = grown
            h.nbuckets = size
    s.hash = channel_hash(s.channel, s.channel_len)
    b = s.hash & (h.nbuckets - 1)
    s.hnext = h.buckets[b]
    h.buckets[b] = s
    return 0


cdef void hub_index_remove(rl_hub* h, rl_nsub* s) noexcept nogil:
    """Under mu: take ``s`` out of the index (a no-op when it is not in it)."""
    cdef rl_nsub** at
    if h.nbuckets == 0:
        return
    at = &h.buckets[s.hash & (h.nbuckets - 1)]
    while at[0] != NULL:
        if at[0] == s:
            at[0] = s.hnext
            s.hnext = NULL
            return
        at = &at[0].hnext


cdef inline bint sub_is_for(rl_nsub* s, const char* channel, size_t n, uint64_t x) noexcept nogil:
    return s.hash == x and s.channel_len == n and memcmp(s.channel, channel, n) == 0


cdef rl_nsub* hub_index_first(rl_hub* h, const char* channel, size_t n) noexcept nogil:
    """Under mu: the first waiter on ``channel``, or NULL; ``hub_index_next`` gives the rest."""
    cdef uint64_t x
    cdef rl_nsub* s
    if h.nbuckets == 0:
        return NULL
    x = channel_hash(channel, n)
    s = h.buckets[x & (h.nbuckets - 1)]
    while s != NULL and not sub_is_for(s, channel, n, x):
        s = s.hnext
    return s


cdef rl_nsub* hub_index_next(rl_nsub* s, const char* channel, size_t n) noexcept nogil:
    """Under mu: the next waiter on ``s``'s channel after ``s``, or NULL."""
    cdef uint64_t x = s.hash
    s = s.hnext
    while s != NULL and not sub_is_for(s, channel, n, x):
        s = s.hnext
    return s


cdef void hub_moved(rl_hub* h, const char* channel, size_t n) noexcept nogil:
    """A cluster node no longer carries ``channel`` (NULL: maybe none of its channels).

    Its waiters are told to look again (a poll now instead of at their next
    one) and marked moved: their subscriptions are re-homed, in Python, to
    the node that owns the slot now.
    """
    cdef rl_nsub* s
    cdef int i
    pthread_mutex_lock(&h.mu)
    if channel == NULL:
        for i in range(h.nsubs):
            s = h.subs[i]
            s.moved = True
            sub_push(s, NULL, 0, True)
    else:
        s = hub_index_first(h, channel, n)
        while s != NULL:
            s.moved = True
            sub_push(s, NULL, 0, True)
            s = hub_index_next(s, channel, n)
    pthread_mutex_unlock(&h.mu)
