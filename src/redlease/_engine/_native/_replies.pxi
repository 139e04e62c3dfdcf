# What a reply means (no GIL): done, redirected (MOVED / ASK), to be resent
# (RETRY), the end of a term (FAILOVER), an error, or a shape the caller
# does not expect. The decision about a reply's text is made here, once.
#
# Needs: rl_conn and its parsed nodes (_conn, _resp_parse), rl_disco
# (_discovery).

cdef bint node_starts(const char* base, rl_node* top, const char* prefix) noexcept nogil:
    """Whether the reply parsed at ``base`` (its payload at top.off) starts with ``prefix``."""
    cdef size_t n = strlen(prefix)
    return <size_t>top.ival >= n and memcmp(base + top.off, prefix, n) == 0


cdef bint node_mentions(const char* base, rl_node* top, const char* needle) noexcept nogil:
    cdef size_t n = strlen(needle)
    cdef size_t size = <size_t>top.ival
    cdef size_t i
    cdef const char* text = base + top.off
    if size < n:
        return False
    for i in range(size - n + 1):
        if text[i] == needle[0] and memcmp(text + i, needle, n) == 0:
            return True
    return False


cdef int reply_node_class(const char* base, rl_node* top, int expect) noexcept nogil:
    """What the reply parsed at ``base`` means: one of the REPLY_* values.

    The codes and kinds are those of the reply table
    (``redlease._engine.replytable``; ``tests/test_reply_table.py`` checks
    every code against it). Error replies: MOVED / ASK (cluster
    redirections), RETRY (TRYAGAIN, CLUSTERDOWN, LOADING: not executed, ask
    again; BUSY is an ERROR, an answer), FAILOVER
    (READONLY, MASTERDOWN, NOREPLICAS; at the start of the reply, or wrapped
    in a script error as Redis 6 does it: "ERR Error running script ...:
    @user_script:1: -READONLY You can't ..."), ERROR (the rest). Other
    replies are DONE when they have the shape ``expect`` names, else
    UNEXPECTED.
    """
    if top.kind != c'-':
        if expect == EXPECT_0_OR_1 and not (top.kind == c':' and (top.ival == 0 or top.ival == 1)):
            return REPLY_UNEXPECTED
        return REPLY_DONE
    if node_starts(base, top, b"MOVED "):
        return REPLY_MOVED
    if node_starts(base, top, b"ASK "):
        return REPLY_ASK
    if (node_starts(base, top, b"READONLY") or node_starts(base, top, b"MASTERDOWN")
            or node_starts(base, top, b"NOREPLICAS") or node_mentions(base, top, b": -READONLY ")
            or node_mentions(base, top, b": -MASTERDOWN ")
            or node_mentions(base, top, b": -NOREPLICAS ")):
        return REPLY_FAILOVER
    if (node_starts(base, top, b"TRYAGAIN") or node_starts(base, top, b"CLUSTERDOWN")
            or node_starts(base, top, b"LOADING")):
        return REPLY_RETRY
    return REPLY_ERROR


cdef int reply_class(rl_conn* c, int expect) noexcept nogil:
    """reply_node_class of the reply buffered in ``c``."""
    return reply_node_class(c.r.data, &c.nodes.items[0], expect)


cdef bint reply_starts(rl_conn* c, const char* prefix) noexcept nogil:
    return node_starts(c.r.data, &c.nodes.items[0], prefix)


cdef bint reply_is_failover(rl_conn* c) noexcept nogil:
    """A READONLY, MASTERDOWN or NOREPLICAS error reply: no longer the lease's master."""
    return reply_class(c, EXPECT_ANY) == REPLY_FAILOVER


cdef int reply_route_class(const char* base, rl_node* top, rl_disco* d) noexcept nogil:
    """What a routed command does with a reply (route_run, a pipelined batch): DONE, MOVED, ASK or RETRY.

    Redirections and TRYAGAIN count on a cluster only; LOADING and
    CLUSTERDOWN through sentinels or on a cluster; a
    READONLY or MASTERDOWN at the start of the reply means the command did
    not run on this server, which is looked up again and the command resent
    once (``replytable.resends``). Failover errors wrapped in a script error
    are answers. (A renewal's failover
    reply is final: the renewer decides that itself, from reply_class.)
    """
    cdef int what
    if d == NULL:
        return REPLY_DONE
    what = reply_node_class(base, top, EXPECT_ANY)
    if what == REPLY_MOVED or what == REPLY_ASK:
        return what if d.kind == DISCO_CLUSTER else REPLY_DONE
    if what == REPLY_RETRY:
        # LOADING, CLUSTERDOWN: through sentinels or on a cluster; TRYAGAIN: on a cluster.
        if d.kind == DISCO_CLUSTER or not node_starts(base, top, b"TRYAGAIN"):
            return REPLY_RETRY
        return REPLY_DONE
    if what == REPLY_FAILOVER and (node_starts(base, top, b"READONLY")
                                   or node_starts(base, top, b"MASTERDOWN")):
        return REPLY_RETRY
    return REPLY_DONE


cdef bint reply_ran_elsewhere(const char* base, rl_node* top) noexcept nogil:
    """Whether an error reply says the command did not run here and belongs on another server.

    What reply_route_class resends on a cluster: an event loop's pipelined
    writes (_loopconn.pxi) are sent again the blocking way, which routes.
    """
    cdef int what = reply_node_class(base, top, EXPECT_ANY)
    if what == REPLY_MOVED or what == REPLY_ASK or what == REPLY_RETRY:
        return True
    return what == REPLY_FAILOVER and (node_starts(base, top, b"READONLY")
                                       or node_starts(base, top, b"MASTERDOWN"))


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


def reply_kind(bytes reply, bint cluster=False):
    """``(class, route class)`` of one raw RESP reply: REPLY_* numbers.

    The route class is for a client through sentinels, or with ``cluster``,
    on a cluster. For ``tests/test_reply_table.py``, which checks the C
    reading of every code against the reply table.
    """
    cdef rl_nodes nodes
    cdef rl_disco d
    cdef const char* data = reply
    cdef int what, route
    nodes.items = NULL
    nodes.len = 0
    nodes.cap = 0
    if resp_parse(data, <size_t>len(reply), &nodes) != len(reply):
        free(nodes.items)
        raise ValueError("not one whole RESP reply")
    d.kind = DISCO_CLUSTER if cluster else DISCO_SENTINEL
    what = reply_node_class(data, &nodes.items[0], EXPECT_ANY)
    route = reply_route_class(data, &nodes.items[0], &d)
    free(nodes.items)
    return what, route
