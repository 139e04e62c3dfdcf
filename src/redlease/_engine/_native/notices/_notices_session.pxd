# What _notices_session.pxi offers the other units: one subscription
# session's two parts (hub_open, hub_serve), queueing (UN)SUBSCRIBE for it,
# draining an eventfd.

cdef int hub_queue(rl_hub* h, bint unsubscribe, const char* channel, size_t n) noexcept nogil
cdef void drain_fd(int fd) noexcept nogil
cdef int hub_open(rl_hub* h, bint reconnect) noexcept nogil
cdef int hub_serve(rl_hub* h, bint readable, bint queued, int64_t now) noexcept nogil
