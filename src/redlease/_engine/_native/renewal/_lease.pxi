# One lease's state, declared once (in _lease.pxd): its atomics (what Python
# reads without a lock), its error ring and its lateness figures (a histogram
# over the engine's LATENESS_BUCKETS bounds, and the last LATE_MAX lateness
# values).
# The renewer (_renewer_heap.pxi) keeps every lease of an engine in a timer heap
# and changes this state under its mutex; nothing here does I/O.
#
# Needs: the atomics, eventfds and clock of _posix, ERR_MSG of _conn.

# Renew-lateness histogram bounds (seconds): the same as
# redlease._engine.contract.interface.LATENESS_BUCKETS, which the import checks. The
# thread counts into fixed buckets so that metrics can read cumulative
# figures at scrape time without a Python call per renewal.
cdef double LATE_BOUNDS[16]
LATE_BOUNDS[:] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                  0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]
LATENESS_BUCKETS = tuple([LATE_BOUNDS[i] for i in range(LATE_BOUNDS_N)])

from redlease._engine.contract.interface import LATENESS_BUCKETS as _ENGINE_LATENESS_BUCKETS

if LATENESS_BUCKETS != _ENGINE_LATENESS_BUCKETS:
    raise ImportError("the native lateness buckets differ from redlease._engine.contract.interface.LATENESS_BUCKETS")

# How many of its newest lateness samples a lease holds (its ring, grown from
# LEASE_LATE_START up to LATE_MAX): the same as
# redlease._engine.contract.interface.LATENESS_SAMPLES, the Python keeper's, which the import checks.
LATENESS_SAMPLES = LATE_MAX

from redlease._engine.contract.interface import LATENESS_SAMPLES as _ENGINE_LATENESS_SAMPLES

if LATENESS_SAMPLES != _ENGINE_LATENESS_SAMPLES:
    raise ImportError("the native lateness ring differs from redlease._engine.contract.interface.LATENESS_SAMPLES")


cdef enum:
    LEASE_LATE_START = 16


# ---------------------------------------------------------------- lease helpers (mu held)

cdef void lease_wake(rl_lease* l) noexcept nogil:
    # mu held: a watched lease is listed (once until the driver takes the
    # list), so the driver looks at the leases that changed and at no other:
    # its look costs what changed, not how many leases there are.
    if l.watched and not l.listed:
        lease_list(l)
    if l.wake_fd >= 0:
        fd_signal(l.wake_fd)
    else:
        l.wake_pending = 1


cdef void lease_list(rl_lease* l) noexcept nogil:
    cdef rl_changes* ch = l.changes
    cdef size_t cap
    cdef rl_lease** grown
    if ch.len == ch.cap:
        cap = ch.cap * 2 if ch.cap else 64
        grown = <rl_lease**>realloc(ch.items, cap * sizeof(rl_lease*))
        if grown == NULL:
            ch.overflow = 1
            return
        ch.items = grown
        ch.cap = cap
    ch.items[ch.len] = l
    ch.len += 1
    l.listed = <int>ch.len


cdef void lease_unlist(rl_lease* l) noexcept nogil:
    """mu held: ``l`` leaves the list of woken leases (before it is freed, or unwatched)."""
    if l.listed:
        l.changes.items[l.listed - 1] = NULL
        l.listed = 0


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
    cdef float* grown
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
            grown = <float*>realloc(l.late, cap * sizeof(float))
            if grown == NULL:
                return
            l.late = grown
            l.late_cap = cap
        l.late[idx] = <float>seconds
    else:
        l.late[idx % LATE_MAX] = <float>seconds
    l.late_count += 1


