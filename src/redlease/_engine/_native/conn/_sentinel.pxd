# What _sentinel.pxi offers the other units: pointing a connection at the
# master the sentinels name, and forgetting it.

cdef void sentinel_forget(rl_disco* d, const rl_addr* a) noexcept nogil
cdef void disco_forget_master(void* p) noexcept nogil
cdef int sentinel_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil
