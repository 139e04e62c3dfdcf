# The keeper thread: one pthread per Keeper renewing one lease on absolute
# CLOCK_MONOTONIC deadlines. No GIL, ever, and no Python object: it talks to
# Python through atomics (state, token, renewed_at, renewals) and eventfds,
# and keeps everything else in ``rl_keeper`` under its mutex ``mu``. The
# mutex is never held across a wait for the server (see the lock discipline
# in _core.pyx): a Python thread may lock it with the GIL held.

# Keeper states, as C atomics. The values are those of redlease._engine
# (IDLE, ACTIVE, LOST, ENDED), which ``Keeper.state`` returns.
cdef enum:
    ST_IDLE = 0
    ST_ACTIVE = 1
    ST_LOST = 2
    ST_ENDED = 3

cdef enum:
    ERR_RING = 32
    LATE_MAX = 65536
    LATE_BOUNDS_N = 16


# Renew-lateness histogram bounds (seconds): the same as
# redlease._engine.base.LATENESS_BUCKETS, which a test holds them to. The
# thread counts into fixed buckets so that metrics can read cumulative
# figures at scrape time without a Python call per renewal.
cdef double LATE_BOUNDS[16]
LATE_BOUNDS[:] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                  0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
LATENESS_BUCKETS = tuple([LATE_BOUNDS[i] for i in range(LATE_BOUNDS_N)])


cdef struct rl_err:
    int kind
    char msg[400]


cdef struct rl_keeper:
    rl_conn conn           # its w and e hold the renewal's EVALSHA and EVAL, built once
    pthread_t thread
    pthread_mutex_t mu
    pthread_cond_t cv
    # Read by Python without the lock: atomics only.
    int64_t state
    int64_t token
    int64_t renewed_at     # send time (ns) of the last good renewal
    int64_t renewals
    # Guarded by mu.
    int thread_started
    int stop
    int detached           # the Python object is gone: the thread frees this struct
    int exited
    uint64_t gen           # bumped by begin/end/close so a late reply cannot touch a newer term
    int64_t interval_ns
    int64_t ttl_ns
    int64_t lease_deadline
    int64_t next_send
    int wake_fd            # eventfd: Python waits on it
    int ctl_fd             # eventfd: close() aborts a round trip in flight
    double* late
    size_t late_cap
    uint64_t late_count
    # Lateness histogram since the keeper was made (cumulative, never reset):
    # one count per LATE_BOUNDS bucket plus the +Inf one, and the sum.
    uint64_t late_hist[17]
    double late_sum
    int err_head
    int err_count
    rl_err errs[32]


cdef void keeper_free(rl_keeper* k) noexcept nogil:
    conn_free(&k.conn)
    if k.wake_fd >= 0:
        close(k.wake_fd)
        k.wake_fd = -1
    if k.ctl_fd >= 0:
        close(k.ctl_fd)
        k.ctl_fd = -1
    free(k.late)
    pthread_mutex_destroy(&k.mu)
    pthread_cond_destroy(&k.cv)
    free(k)


cdef inline void fd_signal(int fd) noexcept nogil:
    cdef uint64_t one = 1
    if fd >= 0:
        write(fd, &one, 8)


cdef void keeper_lose(rl_keeper* k) noexcept nogil:
    # Token first: anyone who sees LOST must never still see a token.
    rl_store(&k.token, 0)
    rl_store(&k.state, ST_LOST)
    fd_signal(k.wake_fd)


cdef void keeper_record_lateness(rl_keeper* k, double seconds) noexcept nogil:
    cdef uint64_t idx = k.late_count
    cdef size_t cap
    cdef double* grown
    cdef int b = 0
    while b < LATE_BOUNDS_N and seconds > LATE_BOUNDS[b]:
        b += 1
    k.late_hist[b] += 1
    k.late_sum += seconds
    if idx < LATE_MAX:
        if idx >= k.late_cap:
            cap = k.late_cap * 2 if k.late_cap else 256
            if cap > LATE_MAX:
                cap = LATE_MAX
            grown = <double*>realloc(k.late, cap * sizeof(double))
            if grown == NULL:
                return
            k.late = grown
            k.late_cap = cap
        k.late[idx] = seconds
    else:
        k.late[idx % LATE_MAX] = seconds
    k.late_count += 1


cdef void keeper_record_error(rl_keeper* k, int kind, const char* msg) noexcept nogil:
    cdef int slot = (k.err_head + k.err_count) % ERR_RING
    if k.err_count == ERR_RING:
        # Full: the oldest goes.
        k.err_head = (k.err_head + 1) % ERR_RING
        k.err_count -= 1
    k.errs[slot].kind = kind
    strncpy(k.errs[slot].msg, msg, ERR_MSG - 1)
    k.errs[slot].msg[ERR_MSG - 1] = 0
    k.err_count += 1


cdef enum:
    ROUND_RENEWED = 1
    ROUND_LOST = 0
    ROUND_ERROR = -1
    ROUND_SKIPPED = -2
    ROUND_CANCELLED = -3
    ROUND_FAILOVER = -4    # READONLY / MASTERDOWN / NOREPLICAS: the term ends now


cdef struct rl_round:
    rl_keeper* k
    uint64_t gen           # the term this renewal is for
    int64_t t_send         # when its EVALSHA went out (0: not sent)


cdef int keeper_send(rl_conn* c, const char* data, size_t n, int64_t deadline,
                     void* ctx, bint first) noexcept nogil:
    """The renewal's ``rl_sender``: nothing is sent once the round's term has ended.

    The first write happens under the lock right after re-checking the term,
    so once end() has returned nothing more is ever sent for that term.
    ROUND_SKIPPED when the term is over; the send time of the EVALSHA is the
    one a good reply extends the lease from.
    """
    cdef rl_round* trip = <rl_round*>ctx
    cdef rl_keeper* k = trip.k
    cdef ssize_t sent = 0
    cdef int err = 0
    pthread_mutex_lock(&k.mu)
    if k.gen != trip.gen or k.stop:
        pthread_mutex_unlock(&k.mu)
        return ROUND_SKIPPED
    if first:
        trip.t_send = rl_now_ns()
    if c.ssl != NULL:
        # What the TLS connection takes now; a failure is recorded (and the
        # connection dropped) already.
        sent = tls_try_send(c, data, n)
        pthread_mutex_unlock(&k.mu)
        if sent < 0:
            return -1
        if <size_t>sent < n:
            return conn_send(c, data + sent, n - <size_t>sent, deadline)
        return 0
    while True:
        sent = send(c.fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT)
        if sent >= 0 or errno != EINTR:
            break
    if sent < 0:
        err = errno
    pthread_mutex_unlock(&k.mu)
    if sent < 0:
        if not rl_would_block(err):
            return conn_io_error(c, err, "writing to")
        sent = 0
    if <size_t>sent < n:
        return conn_send(c, data + sent, n - <size_t>sent, deadline)
    return 0


cdef int keeper_round(rl_keeper* k, uint64_t gen, int64_t deadline, int64_t* t_send) noexcept nogil:
    """One renewal round trip (EVALSHA, EVAL on NOSCRIPT), bounded by ``deadline``."""
    cdef rl_conn* c = &k.conn
    cdef rl_round trip
    cdef rl_node* top
    cdef int rc
    trip.k = k
    trip.gen = gen
    trip.t_send = 0
    rc = route_run(c, deadline, NULL, keeper_send, &trip, True)
    t_send[0] = trip.t_send
    if rc == ROUND_SKIPPED:
        return ROUND_SKIPPED
    if rc < 0:
        return ROUND_CANCELLED if c.err_kind == RL_ECANCELLED else ROUND_ERROR
    top = &c.nodes.items[0]
    if top.kind == c':' and top.ival == 1:
        conn_consume(c)
        return ROUND_RENEWED
    if top.kind == c':' and top.ival == 0:
        conn_consume(c)
        return ROUND_LOST
    if top.kind == c'-':
        conn_fail_with_reply(c)
        if reply_is_failover(c):
            conn_consume(c)
            # Whatever answers next on this address is not the lease's master.
            conn_drop(c)
            return ROUND_FAILOVER
    else:
        conn_fail(c, RL_EUNEXPECTED, "unexpected reply to a renewal (expected 1 or 0)")
    conn_consume(c)
    return ROUND_ERROR


cdef void* keeper_main(void* arg) noexcept nogil:
    cdef rl_keeper* k = <rl_keeper*>arg
    cdef int64_t now, sched, deadline, t_send, wake_at
    cdef uint64_t gen
    cdef int rc, detached
    pthread_mutex_lock(&k.mu)
    while not k.stop:
        if rl_load(&k.state) != ST_ACTIVE:
            pthread_cond_wait(&k.cv, &k.mu)
            continue
        now = rl_now_ns()
        if now >= k.lease_deadline:
            keeper_lose(k)
            continue
        if now < k.next_send:
            wake_at = k.next_send if k.next_send < k.lease_deadline else k.lease_deadline
            rl_cond_wait_until(&k.cv, &k.mu, wake_at)
            continue
        gen = k.gen
        sched = k.next_send
        # A round trip may never outlive the lease: at the deadline it is
        # abandoned and the term is lost, whatever is still in flight.
        deadline = now + k.interval_ns
        if deadline > k.lease_deadline:
            deadline = k.lease_deadline
        pthread_mutex_unlock(&k.mu)
        rc = keeper_round(k, gen, deadline, &t_send)
        pthread_mutex_lock(&k.mu)
        if t_send != 0:
            keeper_record_lateness(k, <double>(t_send - sched) / 1e9)
        if rc == ROUND_SKIPPED or rc == ROUND_CANCELLED:
            continue
        if k.gen != gen or rl_load(&k.state) != ST_ACTIVE:
            continue
        if rc == ROUND_RENEWED:
            if t_send + k.ttl_ns > k.lease_deadline:
                k.lease_deadline = t_send + k.ttl_ns
            rl_store(&k.renewed_at, t_send)
            rl_store(&k.renewals, rl_load(&k.renewals) + 1)
        elif rc == ROUND_LOST:
            keeper_lose(k)
            continue
        elif rc == ROUND_FAILOVER:
            # Not the master the lease was granted on any more: end the term
            # now rather than lead on until the deadline.
            keeper_record_error(k, k.conn.err_kind, k.conn.err_msg)
            keeper_lose(k)
            continue
        else:
            keeper_record_error(k, k.conn.err_kind, k.conn.err_msg)
            fd_signal(k.wake_fd)
        k.next_send = sched + k.interval_ns
        now = rl_now_ns()
        if k.next_send < now:
            # Behind schedule (a slow or failed round trip): go again at once
            # rather than skip ahead, the lease deadline is what bounds us.
            k.next_send = now
    detached = k.detached
    k.exited = 1
    pthread_mutex_unlock(&k.mu)
    if detached:
        keeper_free(k)
    return NULL
