# What _notices_thread.pxi offers the other units: the hub's reader thread,
# queueing (UN)SUBSCRIBE for it, draining an eventfd.

cdef int hub_queue(rl_hub* h, bint unsubscribe, const char* channel, size_t n) noexcept nogil
cdef void drain_fd(int fd) noexcept nogil
cdef void* hub_main(void* arg) noexcept nogil
