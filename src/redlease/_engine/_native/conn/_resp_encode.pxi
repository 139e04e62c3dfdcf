# Growable C buffers, and Python values -> the RESP2 bytes of a command.
# Commands are written with the GIL held (the arguments are Python objects)
# and sent later without it, from the same buffer.
#
# Needs: nothing but libc.

# ---------------------------------------------------------------- buffers (no GIL)

cdef int buf_reserve(rl_buf* b, size_t extra) noexcept nogil:
    cdef size_t need = b.len + extra
    cdef size_t cap
    cdef char* p
    if need <= b.cap:
        return 0
    cap = b.cap if b.cap else 256
    while cap < need:
        cap *= 2
    p = <char*>realloc(b.data, cap)
    if p == NULL:
        return -1
    b.data = p
    b.cap = cap
    return 0


cdef void buf_free(rl_buf* b) noexcept nogil:
    free(b.data)
    b.data = NULL
    b.len = 0
    b.cap = 0


cdef inline int fmt_ll(char* out, long long v) noexcept nogil:
    cdef char tmp[24]
    cdef int n = 0
    cdef int i = 0
    cdef unsigned long long u
    if v < 0:
        u = <unsigned long long>(-(v + 1)) + 1
        out[0] = c'-'
        i = 1
    else:
        u = <unsigned long long>v
    while True:
        tmp[n] = <char>(c'0' + <int>(u % 10))
        n += 1
        u //= 10
        if u == 0:
            break
    while n > 0:
        n -= 1
        out[i] = tmp[n]
        i += 1
    return i


cdef int buf_put(rl_buf* b, const char* p, size_t n) noexcept nogil:
    if buf_reserve(b, n) < 0:
        return -1
    memcpy(b.data + b.len, p, n)
    b.len += n
    return 0


cdef int buf_put_copy(rl_buf* b, size_t off, size_t n) noexcept nogil:
    """Append ``n`` of ``b``'s own bytes from ``off`` (read after it grows: they may move)."""
    if buf_reserve(b, n) < 0:
        return -1
    memcpy(b.data + b.len, b.data + off, n)
    b.len += n
    return 0


cdef inline size_t put_header(char* out, char kind, size_t n) noexcept nogil:
    """Write ``<kind><n>\r\n`` at ``out`` (24 bytes of room); its length.

    Lengths and counts of one or two digits, nearly every one a command
    has, are written without the general conversion.
    """
    cdef size_t k
    out[0] = kind
    if n < 10:
        out[1] = <char>(c'0' + <int>n)
        k = 1
    elif n < 100:
        out[1] = <char>(c'0' + <int>(n // 10))
        out[2] = <char>(c'0' + <int>(n % 10))
        k = 2
    else:
        k = <size_t>fmt_ll(out + 1, <long long>n)
    out[1 + k] = c'\r'
    out[2 + k] = c'\n'
    return k + 3


cdef int buf_put_prefix(rl_buf* b, char kind, long long n) noexcept nogil:
    """Append ``*<n>\\r\\n`` or ``$<n>\\r\\n``."""
    cdef int k
    if buf_reserve(b, 24) < 0:
        return -1
    if n >= 0:
        b.len += put_header(b.data + b.len, kind, <size_t>n)
        return 0
    b.data[b.len] = kind
    k = fmt_ll(b.data + b.len + 1, n)
    b.data[b.len + 1 + k] = c'\r'
    b.data[b.len + 2 + k] = c'\n'
    b.len += <size_t>k + 3
    return 0


cdef int buf_put_bulk(rl_buf* b, const char* p, size_t n) noexcept nogil:
    if buf_reserve(b, n + 26) < 0:
        return -1
    b.len += put_header(b.data + b.len, c'$', n)
    memcpy(b.data + b.len, p, n)
    b.data[b.len + n] = c'\r'
    b.data[b.len + n + 1] = c'\n'
    b.len += n + 2
    return 0


# ---------------------------------------------------------------- encoding (GIL held)

cdef object _invalid_input(object arg):
    return TypeError(
        f"Invalid input of type: '{type(arg).__name__}'. "
        "Convert to a bytes, string, int or float first."
    )


cdef int put_arg_slow(rl_buf* b, object arg) except -1:
    cdef bytes data
    if isinstance(arg, bool):
        raise _invalid_input(arg)
    if isinstance(arg, int):
        data = int.__repr__(arg).encode("ascii")
    elif isinstance(arg, float):
        # repr() like redis-py: the shortest text that round-trips.
        data = float.__repr__(arg).encode("ascii")
    elif isinstance(arg, str):
        data = str(arg).encode("utf-8")
    elif isinstance(arg, (bytes, bytearray, memoryview)):
        data = bytes(arg)
    else:
        raise _invalid_input(arg)
    if buf_put_bulk(b, PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data)) < 0:
        raise MemoryError()
    return 0


cdef int put_arg(rl_buf* b, object arg) except -1:
    cdef const char* p
    cdef Py_ssize_t n
    cdef long long v
    cdef int overflow = 0
    cdef char num[24]
    cdef type t = type(arg)
    if t is bytes:
        p = PyBytes_AS_STRING(arg)
        n = PyBytes_GET_SIZE(arg)
    elif t is str:
        p = PyUnicode_AsUTF8AndSize(arg, &n)
    elif t is int:
        v = PyLong_AsLongLongAndOverflow(arg, &overflow)
        if overflow:
            return put_arg_slow(b, arg)
        n = fmt_ll(num, v)
        p = num
    else:
        return put_arg_slow(b, arg)
    if buf_put_bulk(b, p, <size_t>n) < 0:
        raise MemoryError()
    return 0


cdef int put_command(rl_buf* b, object args) except -1:
    if buf_put_prefix(b, c'*', len(args)) < 0:
        raise MemoryError()
    for arg in args:
        put_arg(b, arg)
    return 0


cdef int put_evalsha(rl_buf* b, bytes sha, bytes source, object keys, object args,
                     rl_script_cmd* out) except -1:
    """EVALSHA sha numkeys keys... args..., remembering where its parts are."""
    cdef Py_ssize_t nkeys = len(keys)
    cdef Py_ssize_t nargs = len(args)
    cdef char num[24]
    cdef int k
    b.len = 0
    if buf_put_prefix(b, c'*', 3 + nkeys + nargs) < 0:
        raise MemoryError()
    out.head = b.len
    if buf_put(b, b"$7\r\nEVALSHA\r\n", 13) < 0:
        raise MemoryError()
    if buf_put_bulk(b, PyBytes_AS_STRING(sha), <size_t>PyBytes_GET_SIZE(sha)) < 0:
        raise MemoryError()
    out.tail = b.len
    out.src = PyBytes_AS_STRING(source)
    out.srclen = <size_t>PyBytes_GET_SIZE(source)
    k = fmt_ll(num, nkeys)
    if buf_put_bulk(b, num, <size_t>k) < 0:
        raise MemoryError()
    for key in keys:
        put_arg(b, key)
    for arg in args:
        put_arg(b, arg)
    # A sequence that changed size while we walked it would break the count.
    if len(keys) != nkeys or len(args) != nargs:
        raise RuntimeError("keys or args changed size during encoding")
    return 0


cdef int build_eval(rl_buf* e, const rl_buf* w, const rl_script_cmd* cmd) noexcept nogil:
    """The EVAL twin of an encoded EVALSHA: same arity, same tail, source for the sha."""
    e.len = 0
    if buf_put(e, w.data, cmd.head) < 0:
        return -1
    if buf_put(e, b"$4\r\nEVAL\r\n", 10) < 0:
        return -1
    if buf_put_bulk(e, cmd.src, cmd.srclen) < 0:
        return -1
    return buf_put(e, w.data + cmd.tail, w.len - cmd.tail)


cdef inline bint plain_value(object o) noexcept:
    """An exact str, bytes, int or float: what a fenced write's value may be, checked no further."""
    cdef type t = type(o)
    return t is str or t is bytes or t is int or t is float


cdef inline bint plain_first(object o, bint key) noexcept:
    """A key (exact str or bytes) with ``key``, else a value."""
    cdef type t = type(o)
    if key:
        return t is str or t is bytes
    return t is str or t is bytes or t is int or t is float


def split_pairs(object items, bint keys):
    """``items`` as two new lists, ``(firsts, seconds)``, when every item is plainly good; else None.

    ``items`` is a dict, or a list or tuple of 2-tuples (or 2-item lists).
    Plainly good: every first an exact str or bytes (with ``keys``; else
    an exact str, bytes, int or float, as a hash field), every second an
    exact str, bytes, int or float. None for anything else, and then the
    caller checks the items one by one (and says what is wrong): this is
    only the fast path of that check, done in C for a pipeline's
    ``set_many`` / ``hset_many``.
    """
    cdef Py_ssize_t n, i = 0
    cdef list firsts, seconds
    cdef object row, first, second
    if type(items) is dict:
        n = len(<dict>items)
        firsts = [None] * n
        seconds = [None] * n
        for first, second in (<dict>items).items():
            if i >= n or not plain_first(first, keys) or not plain_value(second):
                return None
            firsts[i] = first
            seconds[i] = second
            i += 1
        return (firsts, seconds) if i == n else None
    if type(items) is not list and type(items) is not tuple:
        return None
    n = len(items)
    firsts = [None] * n
    seconds = [None] * n
    for i in range(n):
        row = items[i]
        if type(row) is tuple and len(<tuple>row) == 2:
            first = (<tuple>row)[0]
            second = (<tuple>row)[1]
        elif type(row) is list and len(<list>row) == 2:
            first = (<list>row)[0]
            second = (<list>row)[1]
        else:
            return None
        if not plain_first(first, keys) or not plain_value(second):
            return None
        firsts[i] = first
        seconds[i] = second
    return firsts, seconds
