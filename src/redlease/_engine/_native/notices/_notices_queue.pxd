# What _notices_queue.pxi offers the other units: the state a hub and its
# waiters share (rl_hub, rl_nsub, rl_bell, rl_payload), queueing a notice for
# a waiter, and waking a hub's waiters.

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
    bint refused             # the server refused its channel (an ACL user without it): it polls
    int64_t notices          # how many notices reached it (a test hook)
    int64_t last_ns          # when the latest one did (rl_now_ns; a test hook)
    # NOTICE_PENDING slots, allocated by the first notice and freed by take():
    # thousands of waiters that hear nothing cost no payload space.
    rl_payload* pending
    int index                # where it is in the hub's ``subs``
    uint64_t hash            # its channel's hash, and the next of its bucket in the hub's index
    rl_nsub* hnext
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

cdef struct rl_hub:
    rl_conn conn             # its ``w`` holds the SUBSCRIBE of a new session, ``e`` what ``out`` had
    pthread_mutex_t mu
    int cmd_fd               # eventfd: ``out`` has commands to send
    int stop_fd              # eventfd: stop (the connection's cancel fd; never drained)
    void* reader             # the rl_reader that serves it (fixed)
    # Guarded by mu.
    int stop
    int cluster              # a cluster node's hub: channels live in slots that move (fixed)
    int sharded              # SSUBSCRIBE (a cluster node with sharded pub/sub), else SUBSCRIBE
    int64_t connects         # sessions established so far
    int64_t subscribed_at    # when the current session sent its SUBSCRIBE (0: none)
    rl_buf out               # SUBSCRIBE / UNSUBSCRIBE queued by Python for the reader
    # When the oldest UNSUBSCRIBE in ``out`` that nobody signalled for was
    # queued (0: none): the reader sends it within NOTICE_UNSUBSCRIBE_NS.
    int64_t unsubscribe_since
    # The channels of the (S)SUBSCRIBE commands in ``out``, then of those sent
    # and not answered yet (oldest from inflight_head): each entry a size_t
    # length and the channel's bytes. An error reply answers the oldest one.
    rl_buf out_subs
    rl_buf inflight
    size_t inflight_head
    int64_t refusals         # subscriptions the server refused so far (a test hook)
    rl_nsub** subs
    int nsubs
    int cap
    # The same waiters by channel (a hash index): a notice finds its waiters
    # without looking at every other one. nbuckets is a power of two (0: none yet).
    rl_nsub** buckets
    size_t nbuckets
    # Guarded by the reader's mu: where the hub is in its life (HUB_IDLE ...).
    int state
    int index                # where it is in the reader's ``hubs`` (not HUB_IDLE)
    bint lost                # a session of it was lost since it left HUB_IDLE
    int64_t connect_at       # HUB_WANT: not before this
    int64_t backoff          # the pause after the next failure
    # The reader thread's own, while HUB_LIVE (set by the connector before).
    int64_t heard            # the last reply of the session
    int64_t pinged           # the last PING sent
    int64_t idle_since       # since when no waiter is left (0: some are)
    int64_t live_since       # when the session began


cdef enum:
    HUB_IDLE = 0             # no session, none wanted: not in the reader's list
    HUB_WANT = 1             # waiters, no session: the connector connects it at connect_at
    HUB_CONNECTING = 2       # the connector is connecting it (its I/O, off the reader's list)
    HUB_LIVE = 3             # a session the reader thread reads


cdef struct rl_reader:
    pthread_mutex_t mu
    pthread_cond_t released  # a hub went back to HUB_IDLE (close() waits for its own)
    int wake_fd              # eventfd: the reader looks at its hubs again
    int connect_fd           # eventfd: the connector looks for a hub to connect
    # Guarded by mu.
    int stop
    pthread_t thread         # the reader
    int thread_started
    int exited
    pthread_t connector      # the connector: alive while a hub wants a session
    int connector_started
    int connector_exited
    int64_t connectors       # connector threads started so far (a test hook)
    rl_hub** hubs            # every hub not HUB_IDLE
    int nhubs
    int cap


cdef void bell_unlink(rl_bell* b, rl_nsub* s) noexcept nogil
cdef void hub_free(rl_hub* h) noexcept nogil
cdef void sub_push(rl_nsub* s, const char* data, size_t n, bint lost) noexcept nogil
cdef void hub_wake_all(rl_hub* h) noexcept nogil
cdef void hub_moved(rl_hub* h, const char* channel, size_t n) noexcept nogil
cdef uint64_t channel_hash(const char* channel, size_t n) noexcept nogil
cdef int hub_index_add(rl_hub* h, rl_nsub* s) noexcept nogil
cdef void hub_index_remove(rl_hub* h, rl_nsub* s) noexcept nogil
cdef rl_nsub* hub_index_first(rl_hub* h, const char* channel, size_t n) noexcept nogil
cdef rl_nsub* hub_index_next(rl_nsub* s, const char* channel, size_t n) noexcept nogil
