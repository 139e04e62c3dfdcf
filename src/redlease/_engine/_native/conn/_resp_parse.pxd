# What _resp_parse.pxi offers the other units: RESP2 replies as C nodes,
# and those nodes as Python objects.

cdef enum:
    MAX_REPLY_DEPTH = 8           # arrays nest no deeper: redlease._engine.contract.interface.MAX_REPLY_DEPTH
    MAX_REPLY_ELEMENTS = 65536    # no array holds more: redlease._engine.contract.interface.MAX_REPLY_ELEMENTS
    RESP_PAST_LIMIT = -3          # resp_parse: an array past one of those limits

cdef struct rl_node:
    char kind         # one of : + - $ *
    long long ival    # integer value; payload length for + - $; element count for *
    size_t off        # payload offset for + - $

cdef struct rl_nodes:
    rl_node* items
    size_t len
    size_t cap

cdef int parse_ll(const char* p, size_t n, long long* out) noexcept nogil
cdef Py_ssize_t resp_parse(const char* p, size_t n, rl_nodes* out) noexcept nogil
cdef object error_from_reply(const char* p, Py_ssize_t n)
cdef object build_reply(const char* base, rl_node* nodes, size_t* i)
