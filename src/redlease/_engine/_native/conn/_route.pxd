# What _route.pxi offers the other units: one routed round trip.

cdef int route_run(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                   rl_sender sender, void* ctx, bint script) noexcept nogil
cdef int route_rediscover(rl_conn* c, rl_disco* d, int64_t deadline,
                          int retried, bint consume) noexcept nogil
