# RESP2 parsing: a reply's bytes -> a flat array of C nodes, without the GIL,
# so a connection can tell a whole reply from a partial one while the GIL is
# released; then nodes -> Python objects, with the GIL, in the calling thread.
#
# Needs: _posix.

try:
    from redis._parsers import BaseParser as _BaseParser
except ImportError:  # redis-py < 5
    from redis.connection import BaseParser as _BaseParser

# redis-py's own mapping from an error reply to an exception class, so both
# engines raise the same types for the same reply.
_parse_error = _BaseParser.parse_error


# ---------------------------------------------------------------- parsing (no GIL)

cdef int parse_ll(const char* p, size_t n, long long* out) noexcept nogil:
    cdef size_t i = 0
    cdef bint neg = False
    cdef unsigned long long u = 0
    cdef unsigned long long limit
    cdef int d
    if n == 0:
        return -1
    if p[0] == c'-':
        neg = True
        i = 1
        if n == 1:
            return -1
    if p[i] == c'0' and (n - i > 1 or neg):
        return -1  # "00", "01", "-0": no server writes them; hiredis refuses them too
    limit = (<unsigned long long>1 << 63) if neg else (<unsigned long long>1 << 63) - 1
    while i < n:
        d = p[i] - c'0'
        if d < 0 or d > 9:
            return -1
        if u > (limit - <unsigned long long>d) // 10:
            return -1
        u = u * 10 + <unsigned long long>d
        i += 1
    if neg:
        out[0] = -<long long>(u - 1) - 1 if u else 0
    else:
        out[0] = <long long>u
    return 0


cdef Py_ssize_t resp_parse(const char* p, size_t n, rl_nodes* out) noexcept nogil:
    """Parse one whole reply from ``p[:n]`` into ``out`` (preorder nodes).

    Returns the bytes it spans, 0 when incomplete, -1 on a protocol error,
    -2 when out of memory, ``RESP_PAST_LIMIT`` (-3) for an array of more
    than ``MAX_REPLY_ELEMENTS`` elements or nested deeper than
    ``MAX_REPLY_DEPTH``: refused when its header arrives, whatever follows,
    and nothing is ever sized by a count the server sent. The elements
    still owed at each open level are the only stack, of fixed size.
    """
    cdef size_t pos = 0
    cdef long long owed[MAX_REPLY_DEPTH + 1]
    cdef int depth = 0
    cdef const char* cr
    cdef size_t eol
    cdef char kind
    cdef long long v
    cdef rl_node* node
    cdef rl_node* grown
    cdef size_t cap
    out.len = 0
    owed[0] = 1
    while True:
        if pos >= n:
            return 0
        kind = p[pos]
        if (kind != c':' and kind != c'$' and kind != c'*' and kind != c'+' and kind != c'-'
                and kind != c'_'):
            return -1  # at once: a reply cannot start so, whatever follows
        if pos + 1 >= n:
            return 0
        if kind == c'_' and p[pos + 1] != c'\r':
            return -1  # RESP3's null holds nothing before its CRLF
        cr = <const char*>memchr(p + pos + 1, c'\r', n - pos - 1)
        if cr == NULL:
            return 0
        eol = <size_t>(cr - p)
        if eol + 1 >= n:
            return 0
        if p[eol + 1] != c'\n':
            return -1
        if out.len == out.cap:
            cap = out.cap * 2 if out.cap else 16
            grown = <rl_node*>realloc(out.items, cap * sizeof(rl_node))
            if grown == NULL:
                return -2
            out.items = grown
            out.cap = cap
        node = &out.items[out.len]
        out.len += 1
        node.kind = kind
        node.off = pos + 1
        owed[depth] -= 1  # this node fills one place of the array it is in
        if kind == c'_':
            # RESP3's null: read as RESP2's nil bulk, so one shape check decides.
            if eol != pos + 1:
                return -1
            node.kind = c'$'
            node.ival = -1
            pos = eol + 2
        elif kind == c'+' or kind == c'-':
            if memchr(p + pos + 1, c'\n', eol - pos - 1) != NULL:
                return -1  # a line holds no LF (hiredis refuses it too)
            node.ival = <long long>(eol - pos - 1)
            pos = eol + 2
        elif kind == c':':
            if parse_ll(p + pos + 1, eol - pos - 1, &node.ival) < 0:
                return -1
            pos = eol + 2
        elif kind == c'$':
            if parse_ll(p + pos + 1, eol - pos - 1, &v) < 0 or v < -1:
                return -1
            node.ival = v
            pos = eol + 2
            if v >= 0:
                if pos + <size_t>v + 2 > n:
                    return 0
                node.off = pos
                if p[pos + <size_t>v] != c'\r' or p[pos + <size_t>v + 1] != c'\n':
                    return -1
                pos += <size_t>v + 2
        else:  # '*'
            if parse_ll(p + pos + 1, eol - pos - 1, &v) < 0 or v < -1:
                return -1
            node.ival = v
            pos = eol + 2
            if v > 0:
                if v > MAX_REPLY_ELEMENTS or depth == MAX_REPLY_DEPTH:
                    return RESP_PAST_LIMIT
                depth += 1
                owed[depth] = v
                continue
        while owed[depth] == 0:
            if depth == 0:
                return <Py_ssize_t>pos
            depth -= 1


# ---------------------------------------------------------------- nodes -> Python (GIL held)

cdef object error_from_reply(const char* p, Py_ssize_t n):
    return _parse_error(PyBytes_FromStringAndSize(<char*>p, n).decode("utf-8", "replace"))


cdef object build_value(const char* base, rl_node* node):
    """One node that holds no elements: a scalar, a null, or an empty array."""
    if node.kind == c':':
        return node.ival
    if node.kind == c'$':
        if node.ival < 0:
            return None
        return PyBytes_FromStringAndSize(<char*>base + node.off, <Py_ssize_t>node.ival)
    if node.kind == c'+':
        return PyBytes_FromStringAndSize(<char*>base + node.off, <Py_ssize_t>node.ival)
    if node.kind == c'-':
        # Nested errors are values, as in redis-py; only a top-level one raises.
        return error_from_reply(base + node.off, <Py_ssize_t>node.ival)
    if node.ival < 0:
        return None
    return []


cdef object build_reply(const char* base, rl_node* nodes, size_t* i):
    """The reply starting at ``nodes[i]`` as Python objects; ``i`` ends past its last node.

    Iterative on purpose: how deep arrays nest is up to the server, and one C
    frame per level lets a broken or hostile reply overflow the stack.
    """
    cdef rl_node* node
    cdef object value
    cdef long long left
    cdef Py_ssize_t top
    cdef list filling = []    # arrays still owed elements, innermost last
    cdef list owed = []       # how many each of them is still owed
    while True:
        node = &nodes[i[0]]
        i[0] += 1
        if node.kind == c'*' and node.ival > 0:
            filling.append([])
            owed.append(node.ival)
            continue
        value = build_value(base, node)
        while True:
            if not filling:
                return value
            # No negative indexing: this module is compiled with wraparound off.
            top = len(filling) - 1
            (<list>filling[top]).append(value)
            left = <long long>owed[top] - 1
            if left > 0:
                owed[top] = left
                break
            owed.pop()
            value = filling.pop()

