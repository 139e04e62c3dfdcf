# What _replies.pxi offers the other units: what a reply means (its class),
# the shapes a caller may expect, and a reply described for an error.

cdef enum:
    REPLY_DONE = 0
    REPLY_MOVED = 1
    REPLY_ASK = 2
    REPLY_RETRY = 3       # not executed, the server is not (yet) the one: ask again, resend
    REPLY_FAILOVER = 4    # READONLY / MASTERDOWN / NOREPLICAS: not the master any more
    REPLY_ERROR = 5       # any other error reply
    REPLY_UNEXPECTED = 6  # not the shape the caller expects

# The shapes a caller may expect (``reply_class``'s ``expect``).
cdef enum:
    EXPECT_ANY = 0
    EXPECT_0_OR_1 = 1     # the renew script: integer 1 (renewed) or 0 (lost)

cdef bint node_starts(const char* base, rl_node* top, const char* prefix) noexcept nogil
cdef int reply_node_class(const char* base, rl_node* top, int expect) noexcept nogil
cdef int reply_class(rl_conn* c, int expect) noexcept nogil
cdef bint node_is_noscript(const char* base, rl_node* top) noexcept nogil
cdef bint reply_is_noscript(rl_conn* c) noexcept nogil
cdef bint node_has(const char* base, rl_node* top, const char* text, bint any_case) noexcept nogil
cdef bint node_is_elsewhere(const char* base, rl_node* top) noexcept nogil
cdef bint node_is_noperm(const char* base, rl_node* top) noexcept nogil
cdef size_t redirect_skip(int what) noexcept nogil
cdef int reply_route_class(const char* base, rl_node* top, rl_disco* d) noexcept nogil
cdef bint reply_ran_elsewhere(const char* base, rl_node* top) noexcept nogil
cdef void reply_describe(rl_conn* c, const char* what, const char* wanted,
                         char* out, size_t cap) noexcept nogil
