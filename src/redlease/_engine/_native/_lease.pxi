# One lease's state, defined once: its atomics (what Python reads without a
# lock), its error ring and its lateness figures (a histogram over the
# engine's LATENESS_BUCKETS bounds, and the last LATE_MAX lateness values).
# The renewer (_renewer_heap.pxi) keeps every lease of an engine in a timer heap
# and changes this state under its mutex; nothing here does I/O.
#
# Needs: the atomics, eventfds and clock of _posix.pxi, ERR_MSG of _conn.pxi.

# Lease states, as C atomics. The values are those of redlease._engine
# (IDLE, ACTIVE, LOST, ENDED), which ``Lease.state`` returns.
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
# redlease._engine.base.LATENESS_BUCKETS, which the import checks. The
# thread counts into fixed buckets so that metrics can read cumulative
# figures at scrape time without a Python call per renewal.
cdef double LATE_BOUNDS[16]
LATE_BOUNDS[:] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                  0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
LATENESS_BUCKETS = tuple([LATE_BOUNDS[i] for i in range(LATE_BOUNDS_N)])

from redlease._engine.base import LATENESS_BUCKETS as _ENGINE_LATENESS_BUCKETS

if LATENESS_BUCKETS != _ENGINE_LATENESS_BUCKETS:
    raise ImportError("the native lateness buckets differ from redlease._engine.base.LATENESS_BUCKETS")


cdef struct rl_err:
    int kind
    char msg[400]


cdef enum:
    LEASE_LATE_START = 16


cdef inline void fd_signal(int fd) noexcept nogil:
    cdef uint64_t one = 1
    if fd >= 0:
        write(fd, &one, 8)


cdef struct rl_lease:
    # Read by Python without the lock: atomics only.
    int64_t state
    int64_t token
    int64_t renewed_at
    int64_t renewals
    int64_t err_count_atomic
    # Guarded by the renewer's mu.
    uint64_t gen
    int64_t interval_ns
    int64_t ttl_ns
    int64_t lease_deadline
    int64_t next_send
    int heap_idx          # position in the heap, -1 when not in it
    int inflight          # part of the batch on the wire
    int detached          # the Python object is gone: whoever lets go last frees
    int closed
    int wake_fd           # eventfd made on first use by Python (-1 until then)
    int wake_pending      # a wake-up happened before the eventfd existed
    uint64_t sent_gen     # the term the renewal on the wire is for
    int64_t sched         # when that renewal was due
    int64_t t_send
    rl_buf cmd            # its EVALSHA, built once
    double* late
    size_t late_cap
    uint64_t late_count
    uint64_t late_hist[17]
    double late_sum
    int err_head
    int err_count
    rl_err* errs          # ERR_RING entries, allocated on the first error
    int64_t* changes      # the renewer's change counter
    # On a cluster (the renewer's thread only).
    int slot              # its key's slot (-1: keyless)
    int node              # the node connection its renewal of this batch went to
    int ask_node          # an ASK redirection: the next renewal goes there, after ASKING
    int asking            # this batch's renewal is preceded by ASKING (its reply is owed)
    int redirects         # MOVED / ASK followed since the last answer


# ---------------------------------------------------------------- lease helpers (mu held)

cdef void lease_wake(rl_lease* l) noexcept nogil:
    # mu held: one counter tells a driver that some lease of the renewer
    # changed, so it need not look at each of them to find out.
    rl_store(l.changes, rl_load(l.changes) + 1)
    if l.wake_fd >= 0:
        fd_signal(l.wake_fd)
    else:
        l.wake_pending = 1


cdef void lease_free(rl_lease* l) noexcept nogil:
    if l.wake_fd >= 0:
        close(l.wake_fd)
        l.wake_fd = -1
    buf_free(&l.cmd)
    free(l.late)
    free(l.errs)
    free(l)


cdef void lease_lose(rl_lease* l) noexcept nogil:
    rl_store(&l.token, 0)
    rl_store(&l.state, ST_LOST)
    l.gen += 1
    lease_wake(l)


cdef void lease_record_error(rl_lease* l, int kind, const char* msg) noexcept nogil:
    cdef int slot
    if l.errs == NULL:
        l.errs = <rl_err*>calloc(ERR_RING, sizeof(rl_err))
        if l.errs == NULL:
            return
    slot = (l.err_head + l.err_count) % ERR_RING
    if l.err_count == ERR_RING:
        l.err_head = (l.err_head + 1) % ERR_RING
        l.err_count -= 1
    l.errs[slot].kind = kind
    strncpy(l.errs[slot].msg, msg, ERR_MSG - 1)
    l.errs[slot].msg[ERR_MSG - 1] = 0
    l.err_count += 1
    rl_store(&l.err_count_atomic, l.err_count)


cdef void lease_record_lateness(rl_lease* l, double seconds) noexcept nogil:
    cdef uint64_t idx = l.late_count
    cdef size_t cap
    cdef double* grown
    cdef int b = 0
    while b < LATE_BOUNDS_N and seconds > LATE_BOUNDS[b]:
        b += 1
    l.late_hist[b] += 1
    l.late_sum += seconds
    if idx < LATE_MAX:
        if idx >= l.late_cap:
            cap = l.late_cap * 2 if l.late_cap else LEASE_LATE_START
            if cap > LATE_MAX:
                cap = LATE_MAX
            grown = <double*>realloc(l.late, cap * sizeof(double))
            if grown == NULL:
                return
            l.late = grown
            l.late_cap = cap
        l.late[idx] = seconds
    else:
        l.late[idx % LATE_MAX] = seconds
    l.late_count += 1


