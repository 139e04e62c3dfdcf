# What a reply means (no GIL): done, redirected (MOVED / ASK), to be resent
# (RETRY), the end of a term (FAILOVER), an error, or a shape the caller
# does not expect. The decision about a reply's text is made here, once.
#
# Needs: rl_conn and its parsed nodes (_conn.pxi, _resp_parse.pxi).

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


cdef bint reply_starts(rl_conn* c, const char* prefix) noexcept nogil:
    cdef rl_node* top = &c.nodes.items[0]
    cdef size_t n = strlen(prefix)
    return <size_t>top.ival >= n and memcmp(c.r.data + top.off, prefix, n) == 0


cdef bint reply_mentions(rl_conn* c, const char* needle) noexcept nogil:
    cdef rl_node* top = &c.nodes.items[0]
    cdef size_t n = strlen(needle)
    cdef size_t size = <size_t>top.ival
    cdef size_t i
    cdef const char* text = c.r.data + top.off
    if size < n:
        return False
    for i in range(size - n + 1):
        if text[i] == needle[0] and memcmp(text + i, needle, n) == 0:
            return True
    return False


cdef bint reply_is_failover(rl_conn* c) noexcept nogil:
    """A READONLY, MASTERDOWN or NOREPLICAS error reply: no longer the lease's master.

    At the start of the reply (a command; a script on Redis 7), or wrapped in
    a script error as Redis 6 does it ("ERR Error running script ...:
    @user_script:1: -READONLY You can't ...").
    """
    if c.nodes.items[0].kind != c'-':
        return False
    return (reply_starts(c, b"READONLY") or reply_starts(c, b"MASTERDOWN")
            or reply_starts(c, b"NOREPLICAS") or reply_mentions(c, b": -READONLY ")
            or reply_mentions(c, b": -MASTERDOWN ") or reply_mentions(c, b": -NOREPLICAS "))


cdef int reply_class(rl_conn* c, int expect) noexcept nogil:
    """What the buffered reply means: one of the REPLY_* values.

    Error replies: MOVED / ASK (cluster redirections), RETRY (TRYAGAIN,
    CLUSTERDOWN, LOADING, BUSY: not executed, ask again), FAILOVER
    (READONLY, MASTERDOWN, NOREPLICAS, wrapped in a script error or not),
    ERROR (the rest). Other replies are DONE when they have the shape
    ``expect`` names, else UNEXPECTED.
    """
    cdef rl_node* top = &c.nodes.items[0]
    if top.kind != c'-':
        if expect == EXPECT_0_OR_1 and not (top.kind == c':' and (top.ival == 0 or top.ival == 1)):
            return REPLY_UNEXPECTED
        return REPLY_DONE
    if reply_starts(c, b"MOVED "):
        return REPLY_MOVED
    if reply_starts(c, b"ASK "):
        return REPLY_ASK
    if reply_is_failover(c):
        return REPLY_FAILOVER
    if (reply_starts(c, b"TRYAGAIN") or reply_starts(c, b"CLUSTERDOWN")
            or reply_starts(c, b"LOADING") or reply_starts(c, b"BUSY ")):
        return REPLY_RETRY
    return REPLY_ERROR


cdef void reply_describe(rl_conn* c, const char* what, const char* wanted,
                         char* out, size_t cap) noexcept nogil:
    """``<what> answered <the reply's shape> where it returns <wanted>``, for messages."""
    cdef rl_node* top = &c.nodes.items[0]
    if top.kind == c'*':
        if top.ival < 0:
            snprintf(out, cap, "%s answered a nil array where it returns %s", what, wanted)
        else:
            snprintf(out, cap, "%s answered an array of %lld elements where it returns %s",
                     what, top.ival, wanted)
    elif top.kind == c'$':
        if top.ival < 0:
            snprintf(out, cap, "%s answered nil where it returns %s", what, wanted)
        else:
            snprintf(out, cap, "%s answered a bulk string of %lld bytes where it returns %s",
                     what, top.ival, wanted)
    elif top.kind == c':':
        snprintf(out, cap, "%s answered the integer %lld where it returns %s",
                 what, top.ival, wanted)
    elif top.kind == c'+':
        snprintf(out, cap, "%s answered a status reply where it returns %s", what, wanted)
    else:
        snprintf(out, cap, "%s answered an error where it returns %s", what, wanted)
