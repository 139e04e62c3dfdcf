# What _lease.pxi offers the other units: one lease's state (rl_lease), its
# states and limits, and the helpers that change it.

from libc.stdint cimport uint32_t

# Lease states, as C atomics. The values are those of redlease._engine
# (IDLE, ACTIVE, LOST, ENDED), which ``Lease.state`` returns.
cdef enum:
    ST_IDLE = 0
    ST_ACTIVE = 1
    ST_LOST = 2
    ST_ENDED = 3

cdef enum:
    ERR_RING = 32
    LATE_MAX = 128        # lateness samples a lease holds: redlease._engine.contract.interface.LATENESS_SAMPLES
    LATE_BOUNDS_N = 16

cdef struct rl_err:
    int kind
    char msg[400]

cdef struct rl_lease

cdef struct rl_changes:
    # The leases a driver watches that were woken since it last looked, each
    # listed once (a slot of a lease freed meanwhile is NULL). Guarded by the
    # renewer's mu; the renewer owns it, its leases point at it.
    rl_lease** items
    size_t len
    size_t cap
    int64_t handles       # the last handle given to a lease
    int overflow          # a wake-up could not be listed (out of memory): look at them all

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
    # Renewed in renew_many calls (lua/renew_many.lua) beside other leases:
    # its key, owner and ttl are read out of cmd, where they lie encoded.
    uint32_t key_at       # where its key's bulk string starts in cmd (after it: owner, ttl)
    uint32_t owner_at     # where its owner's starts (its ttl's follows it, to the end)
    char batch_kind       # b's' (a string lease) or b'h' (a lock hash); 0: renewed alone
    unsigned char call_len  # on the wire: the first lease of a renew_many call of this many; 0: alone
    unsigned char solo    # on a cluster: its next renewal goes alone, by its declared key
    float* late           # single precision: a lateness needs no more, a lease half the room
    uint64_t late_count
    uint64_t late_hist[17]
    double late_sum
    int err_head
    int err_count
    rl_err* errs          # ERR_RING entries, allocated on the first error
    rl_changes* changes   # the renewer's list of woken watched leases
    int64_t handle        # this lease's name in that list, for Python (fixed)
    int watched           # a driver watches it: its wake-ups are listed
    int listed            # 1 + its index in the list, 0 when not listed
    # On a cluster (the renewer's thread only).
    int slot              # its key's slot (-1: keyless)
    int node              # the node connection its renewal of this batch went to
    int ask_node          # an ASK redirection: the next renewal goes there, after ASKING
    int asking            # this batch's renewal is preceded by ASKING (its reply is owed)
    int redirects         # MOVED / ASK followed since the last answer
    # Last, beside the other ints: the struct then fits a smaller allocation.
    unsigned int late_cap # how many samples ``late`` has room for (at most LATE_MAX)

cdef inline void fd_signal(int fd) noexcept nogil:
    cdef uint64_t one = 1
    if fd >= 0:
        write(fd, &one, 8)

cdef void lease_wake(rl_lease* l) noexcept nogil
cdef void lease_unlist(rl_lease* l) noexcept nogil
cdef void lease_free(rl_lease* l) noexcept nogil
cdef void lease_lose(rl_lease* l) noexcept nogil
cdef void lease_record_error(rl_lease* l, int kind, const char* msg) noexcept nogil
cdef void lease_record_lateness(rl_lease* l, double seconds) noexcept nogil
