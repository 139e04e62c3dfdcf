# What a reply means (no GIL): done, redirected (MOVED / ASK), to be resent
# (RETRY), the end of a term (FAILOVER), an error, or a shape the caller
# does not expect. The decision about a reply's text is made here, once.
#
# Needs: rl_conn and its parsed nodes (_conn, _resp_parse), rl_disco
# (_discovery).

# -- the reply codes ---------------------------------------------------------------------
# The reply table (``replytable.CODES``: each error code the core reads, its
# kind, and whether it is also read wrapped in a script error), copied into
# C when the module is imported, in its order, with the kinds numbered as
# ``replytable`` numbers them: no code or kind is spelled in the core.
# ``reply_codes()`` reads the copy back (``tests/test_reply_table.py``
# checks it is the table). NOPERM, the refusal of a subscription (not a
# call's reply), is the table module's too.

cdef enum:
    CODES_MAX = 32        # room for the table's codes (checked at import)

cdef int KIND_DONE = _replytable.DONE
cdef int KIND_NOSCRIPT = _replytable.NOSCRIPT
cdef int KIND_MOVED = _replytable.MOVED
cdef int KIND_ASK = _replytable.ASK
cdef int KIND_TRYAGAIN = _replytable.TRYAGAIN
cdef int KIND_RETRY = _replytable.RETRY
cdef int KIND_FAILOVER = _replytable.FAILOVER
cdef int KIND_NOREPLICAS = _replytable.NOREPLICAS
cdef int KIND_ERROR = _replytable.ERROR

# The codes' bytes, kept alive for the pointers below.
cdef tuple CODE_BYTES = tuple([code.encode("ascii") for code, _kind, _wraps in _replytable.CODES])
cdef bytes NOPERM_BYTES = _replytable.NOPERM.encode("ascii")
# One lease of a node-wide renew_many call whose key the node does not serve.
cdef bytes ELSEWHERE_BYTES = _replytable.BATCH_KEY_ELSEWHERE.encode("ascii")
cdef const char* CODE_ELSEWHERE = PyBytes_AS_STRING(ELSEWHERE_BYTES)
cdef bytes ELSEWHERE_BEFORE_7_BYTES = _replytable.BATCH_KEY_ELSEWHERE_BEFORE_7.encode("ascii")
cdef const char* CODE_ELSEWHERE_BEFORE_7 = PyBytes_AS_STRING(ELSEWHERE_BEFORE_7_BYTES)
cdef int N_CODES = 0
cdef const char* CODE_TEXT[CODES_MAX]
cdef int CODE_KIND[CODES_MAX]
cdef bint CODE_WRAPS[CODES_MAX]
cdef const char* CODE_NOSCRIPT = NULL
cdef const char* CODE_MOVED = NULL
cdef const char* CODE_ASK = NULL
cdef const char* CODE_NOPERM = NULL


cdef const char* code_of_kind(int kind) except NULL:
    """The table's code of ``kind`` (one of the kinds that has a single code)."""
    cdef int i
    for i in range(N_CODES):
        if CODE_KIND[i] == kind:
            return CODE_TEXT[i]
    raise RuntimeError(f"the reply table has no code of kind {_replytable.KIND_NAMES[kind]}")


cdef int load_codes() except -1:
    """Copy ``replytable.CODES`` into the C table (at import)."""
    global N_CODES, CODE_NOSCRIPT, CODE_MOVED, CODE_ASK, CODE_NOPERM
    cdef Py_ssize_t i
    if len(CODE_BYTES) > CODES_MAX:
        raise RuntimeError(
            f"the reply table has {len(CODE_BYTES)} codes; the core holds {CODES_MAX}")
    for i in range(len(CODE_BYTES)):
        _code, kind, wraps = _replytable.CODES[i]
        CODE_TEXT[i] = PyBytes_AS_STRING(CODE_BYTES[i])
        CODE_KIND[i] = kind
        CODE_WRAPS[i] = wraps
    N_CODES = <int>len(CODE_BYTES)
    CODE_NOSCRIPT = code_of_kind(KIND_NOSCRIPT)
    CODE_MOVED = code_of_kind(KIND_MOVED)
    CODE_ASK = code_of_kind(KIND_ASK)
    CODE_NOPERM = PyBytes_AS_STRING(NOPERM_BYTES)
    return 0


load_codes()


cdef bint node_starts(const char* base, rl_node* top, const char* prefix) noexcept nogil:
    """Whether the reply parsed at ``base`` (its payload at top.off) starts with ``prefix``."""
    cdef size_t n = strlen(prefix)
    return <size_t>top.ival >= n and memcmp(base + top.off, prefix, n) == 0


cdef bint node_wraps(const char* base, rl_node* top, const char* code) noexcept nogil:
    """Whether the reply carries ``code`` as a script error does (Redis 6): ``": -CODE "``."""
    cdef size_t n = strlen(code)
    cdef size_t size = <size_t>top.ival
    cdef size_t i
    cdef const char* text = base + top.off
    if size < n + 4:
        return False
    for i in range(size - n - 3):
        if (text[i] == c':' and text[i + 1] == c' ' and text[i + 2] == c'-'
                and memcmp(text + i + 3, code, n) == 0 and text[i + 3 + n] == c' '):
            return True
    return False


cdef int reply_node_kind(const char* base, rl_node* top, bint* wrapped) noexcept nogil:
    """The reply table's kind (KIND_*) of the reply parsed at ``base``, as ``replies.classify``.

    The first code of the table the error reply starts with, or (for the
    codes read so) carries wrapped in a script error, then ``wrapped`` is
    set; any other error reply is KIND_ERROR, any other reply KIND_DONE.
    """
    cdef int i
    wrapped[0] = False
    if top.kind != c'-':
        return KIND_DONE
    for i in range(N_CODES):
        if node_starts(base, top, CODE_TEXT[i]):
            return CODE_KIND[i]
        if CODE_WRAPS[i] and node_wraps(base, top, CODE_TEXT[i]):
            wrapped[0] = True
            return CODE_KIND[i]
    return KIND_ERROR


cdef bint kind_resent(int kind, bint wrapped, bint cluster) noexcept nogil:
    """``replytable.resends`` for a client through sentinels, or with ``cluster`` on a cluster.

    NOSCRIPT is not counted: the connection that got it sends the EVAL itself.
    """
    if wrapped:
        return False
    if kind == KIND_MOVED or kind == KIND_ASK or kind == KIND_TRYAGAIN:
        return cluster
    return kind == KIND_RETRY or kind == KIND_FAILOVER


cdef int reply_node_class(const char* base, rl_node* top, int expect) noexcept nogil:
    """What the reply parsed at ``base`` means: one of the REPLY_* values.

    The kind the reply table gives it (reply_node_kind), folded: MOVED /
    ASK (cluster redirections), RETRY (TRYAGAIN, CLUSTERDOWN, LOADING: not
    executed, ask again), FAILOVER (READONLY, MASTERDOWN, NOREPLICAS; at the
    start of the reply, or wrapped in a script error as Redis 6 does it:
    "ERR Error running script ...: @user_script:1: -READONLY You can't ..."),
    ERROR (the rest, BUSY and NOSCRIPT included: NOSCRIPT is found where it
    is resent, reply_is_noscript). Other replies are DONE when they have the
    shape ``expect`` names, else UNEXPECTED.
    """
    cdef bint wrapped
    cdef int kind
    if top.kind != c'-':
        if expect == EXPECT_0_OR_1 and not (top.kind == c':' and (top.ival == 0 or top.ival == 1)):
            return REPLY_UNEXPECTED
        return REPLY_DONE
    kind = reply_node_kind(base, top, &wrapped)
    if kind == KIND_MOVED:
        return REPLY_MOVED
    if kind == KIND_ASK:
        return REPLY_ASK
    if kind == KIND_TRYAGAIN or kind == KIND_RETRY:
        return REPLY_RETRY
    if kind == KIND_FAILOVER or kind == KIND_NOREPLICAS:
        return REPLY_FAILOVER
    return REPLY_ERROR


cdef int reply_class(rl_conn* c, int expect) noexcept nogil:
    """reply_node_class of the reply buffered in ``c``."""
    return reply_node_class(c.r.data, &c.nodes.items[0], expect)


cdef bint node_is_noscript(const char* base, rl_node* top) noexcept nogil:
    """A NOSCRIPT error reply: the script did not run (it is sent again as EVAL)."""
    return top.kind == c'-' and node_starts(base, top, CODE_NOSCRIPT)


cdef bint reply_is_noscript(rl_conn* c) noexcept nogil:
    """node_is_noscript of the reply buffered in ``c``."""
    return node_is_noscript(c.r.data, &c.nodes.items[0])


cdef inline char ascii_lower(char ch) noexcept nogil:
    return <char>(ch + 32) if c'A' <= ch <= c'Z' else ch


cdef bint node_has(const char* base, rl_node* top, const char* text, bint any_case) noexcept nogil:
    """Whether the error reply parsed at ``base`` contains ``text`` (ASCII; in any case
    with ``any_case``, else as written)."""
    cdef size_t k = strlen(text)
    cdef size_t i, j
    cdef const char* p = base + top.off
    if top.kind != c'-' or top.ival < 0 or <size_t>top.ival < k:
        return False
    for i in range(<size_t>top.ival - k + 1):
        j = 0
        if any_case:
            while j < k and ascii_lower(p[i + j]) == ascii_lower(text[j]):
                j += 1
        else:
            while j < k and p[i + j] == text[j]:
                j += 1
        if j == k:
            return True
    return False


cdef bint node_is_elsewhere(const char* base, rl_node* top) noexcept nogil:
    """An error reply saying the key is not this Cluster node's, by the rule
    ``redlease._engine.rules.replies.renewed_elsewhere`` states (both engines, one rule).

    What one lease of a node-wide renew_many call (no declared key) is
    answered when the node does not serve its key's slot: it did not run.
    Only an error the reply table calls ERROR can be one. Redis 7 and later: the text, after the ``ERR`` code, is
    ``replytable.BATCH_KEY_ELSEWHERE`` followed by more; Redis 6 puts it in a
    Lua error's own words, ``replytable.BATCH_KEY_ELSEWHERE_BEFORE_7``
    anywhere in it (``ERR @user_script: 28: Lua script attempted ...``).
    """
    cdef rl_node rest
    cdef bint wrapped
    if top.kind != c'-' or reply_node_kind(base, top, &wrapped) != KIND_ERROR:
        return False
    rest = top[0]
    if node_starts(base, &rest, b"ERR "):
        rest.off += 4
        rest.ival -= 4
    return (node_starts(base, &rest, CODE_ELSEWHERE)
            or node_has(base, top, CODE_ELSEWHERE_BEFORE_7, False))


cdef bint node_is_noperm(const char* base, rl_node* top) noexcept nogil:
    """A NOPERM error reply: an ACL user not allowed the channel (or command)."""
    return top.kind == c'-' and node_starts(base, top, CODE_NOPERM)


cdef size_t redirect_skip(int what) noexcept nogil:
    """How many bytes of a MOVED (REPLY_MOVED) or ASK reply come before its ``<slot> <host>:<port>``."""
    return strlen(CODE_MOVED if what == REPLY_MOVED else CODE_ASK) + 1


cdef int reply_route_class(const char* base, rl_node* top, rl_disco* d) noexcept nogil:
    """What a routed command does with a reply (route_run, a pipelined batch): DONE, MOVED, ASK or RETRY.

    Whatever the reply table resends (``replytable.resends``, kind_resent)
    through sentinels or on a cluster: redirections and TRYAGAIN on a
    cluster only; LOADING, CLUSTERDOWN, and a READONLY or MASTERDOWN at the
    start of the reply (the command did not run on this server, which is
    looked up again and the command resent once) there and through
    sentinels. Failover errors wrapped in a script error are answers. (A
    renewal's failover reply is final: the renewer decides that itself,
    from reply_class.)
    """
    cdef bint wrapped
    cdef int kind
    if d == NULL:
        return REPLY_DONE
    kind = reply_node_kind(base, top, &wrapped)
    if not kind_resent(kind, wrapped, d.kind == DISCO_CLUSTER):
        return REPLY_DONE
    if kind == KIND_MOVED:
        return REPLY_MOVED
    if kind == KIND_ASK:
        return REPLY_ASK
    return REPLY_RETRY


cdef bint reply_ran_elsewhere(const char* base, rl_node* top) noexcept nogil:
    """Whether an error reply says the command did not run here and belongs on another server.

    What reply_route_class resends on a cluster: an event loop's pipelined
    writes (_loopconn.pxi) are sent again the blocking way, which routes.
    """
    cdef bint wrapped
    cdef int kind = reply_node_kind(base, top, &wrapped)
    return kind_resent(kind, wrapped, True)


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


def reply_codes():
    """The reply table as the native core holds it in C: ``(code, kind, wrapped)`` per code.

    Read back from the C copy made at import; ``tests/test_reply_table.py``
    checks it equals ``replytable.CODES``.
    """
    return tuple((CODE_TEXT[i].decode("ascii"), CODE_KIND[i], bool(CODE_WRAPS[i]))
                 for i in range(N_CODES))



def reply_batch_elsewhere():
    """``replytable.BATCH_KEY_ELSEWHERE`` and ``BATCH_KEY_ELSEWHERE_BEFORE_7`` as the
    native core holds them in C (read back)."""
    return CODE_ELSEWHERE.decode("ascii"), CODE_ELSEWHERE_BEFORE_7.decode("ascii")
