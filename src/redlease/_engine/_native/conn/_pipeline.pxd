# What _pipeline.pxi offers the other units: pointing a connection for a
# pipelined batch, and what a failed batch does to where it went.

cdef int batch_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil
cdef void batch_lost(rl_conn* c, rl_disco* d) noexcept nogil
