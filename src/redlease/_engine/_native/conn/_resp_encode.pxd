# What _resp_encode.pxi offers the other units: growable C buffers and
# RESP2 command encoding.

cdef struct rl_buf:
    char* data
    size_t len
    size_t cap

cdef struct rl_script_cmd:
    size_t head       # end of "*<n>\r\n"
    size_t tail       # start of "<numkeys> keys... args..."
    const char* src   # the script's source, for the EVAL twin (owned by the caller)
    size_t srclen

cdef int buf_reserve(rl_buf* b, size_t extra) noexcept nogil
cdef void buf_free(rl_buf* b) noexcept nogil
cdef int buf_put(rl_buf* b, const char* p, size_t n) noexcept nogil
cdef int buf_put_copy(rl_buf* b, size_t off, size_t n) noexcept nogil
cdef int buf_put_prefix(rl_buf* b, char kind, long long n) noexcept nogil
cdef int buf_put_bulk(rl_buf* b, const char* p, size_t n) noexcept nogil
cdef int put_command(rl_buf* b, object args) except -1
cdef int put_evalsha(rl_buf* b, bytes sha, bytes source, object keys, object args,
                     rl_script_cmd* out) except -1
cdef int build_eval(rl_buf* e, const rl_buf* w, const rl_script_cmd* cmd) noexcept nogil
