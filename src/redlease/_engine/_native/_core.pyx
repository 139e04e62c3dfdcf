# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The native core: RESP2 on the wire, sockets without the GIL, the lease keeper thread.

Three layers, each usable on its own:

* encoding (Python values -> RESP2 bytes in a C buffer, with the GIL) and
  parsing (bytes -> a flat array of C nodes, without the GIL; the nodes become
  Python objects only back in the calling thread, with the GIL);
* ``Pool``: a few connections, each guarded by a pthread mutex, each round
  trip done with the GIL released and bounded by one deadline on
  CLOCK_MONOTONIC (connect, handshake, send, NOSCRIPT reload and reply);
* ``Keeper``: one pthread per keeper that renews a lease on absolute
  deadlines. It never takes the GIL and never touches a Python object: it
  talks to Python through atomics (state, token) and an eventfd (wake-ups).

Linux only (eventfd, ppoll, CLOCK_MONOTONIC condition variables). Where the
extension cannot be built the pure-Python engine is used instead.

Lock discipline, the one rule that keeps this deadlock-free: a thread holding
the GIL never *blocks* on one of our mutexes (it may ``trylock``), and the
keeper thread never wants the GIL. A thread may take the GIL while holding a
pool slot mutex, because whoever waits for that mutex waits with the GIL
released.
"""

from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_FromString,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.exc cimport PyErr_CheckSignals
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.errno cimport EINPROGRESS, EINTR, errno
from libc.limits cimport LLONG_MAX
from libc.stdint cimport int64_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset, strerror, strncpy
from posix.time cimport timespec

import os
import weakref

from redis.exceptions import ConnectionError as _RedisConnectionError
from redis.exceptions import ResponseError as _RedisResponseError
from redis.exceptions import TimeoutError as _RedisTimeoutError

try:
    from redis._parsers import BaseParser as _BaseParser
except ImportError:  # redis-py < 5
    from redis.connection import BaseParser as _BaseParser

# redis-py's own mapping from an error reply to an exception class, so both
# engines raise the same types for the same reply.
_parse_error = _BaseParser.parse_error


cdef extern from *:
    """
    #include <stdint.h>
    #include <time.h>
    #include <signal.h>
    #include <poll.h>
    #include <pthread.h>
    #include <errno.h>

    static inline int64_t rl_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
    }

    static inline struct timespec rl_ts(int64_t ns) {
        struct timespec ts;
        if (ns < 0) ns = 0;
        ts.tv_sec = (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        return ts;
    }

    /* State and token are read by Python threads without any lock. */
    static inline int64_t rl_load(const int64_t *p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline void rl_store(int64_t *p, int64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }

    static int rl_cond_init(pthread_cond_t *cv) {
        pthread_condattr_t attr;
        int rc;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        rc = pthread_cond_init(cv, &attr);
        pthread_condattr_destroy(&attr);
        return rc;
    }

    static int rl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *m, int64_t deadline) {
        struct timespec ts = rl_ts(deadline);
        return pthread_cond_timedwait(cv, m, &ts);
    }

    /* Pool slots: a thread that already holds one (a signal handler running
       inside that thread's own call) gets EDEADLK instead of hanging. */
    static int rl_mutex_init_errorcheck(pthread_mutex_t *m) {
        pthread_mutexattr_t attr;
        int rc;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
        rc = pthread_mutex_init(m, &attr);
        pthread_mutexattr_destroy(&attr);
        return rc;
    }

    static int rl_mutex_lock_until(pthread_mutex_t *m, int64_t deadline) {
    #if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
        struct timespec ts = rl_ts(deadline);
        return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
    #else
        struct timespec now_rt, ts;
        int64_t rel = deadline - rl_now_ns();
        clock_gettime(CLOCK_REALTIME, &now_rt);
        if (rel < 0) rel = 0;
        ts = rl_ts((int64_t)now_rt.tv_sec * 1000000000LL + now_rt.tv_nsec + rel);
        return pthread_mutex_timedlock(m, &ts);
    #endif
    }

    /* The keeper thread blocks every signal: Python's handlers run on the
       main thread, and a signal landing here would only cost an EINTR. */
    static int rl_spawn(pthread_t *t, void *(*fn)(void *), void *arg) {
        sigset_t all, old;
        pthread_attr_t attr;
        int rc;
        sigfillset(&all);
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(t, &attr, fn, arg);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        return rc;
    }

    /* EAGAIN and EWOULDBLOCK are the same number on Linux, not everywhere. */
    static inline int rl_would_block(int e) {
        return e == EAGAIN || e == EWOULDBLOCK;
    }

    /* timeout_ns < 0 waits forever. */
    static int rl_ppoll(struct pollfd *fds, int n, int64_t timeout_ns) {
        struct timespec ts;
        if (timeout_ns < 0) return ppoll(fds, (nfds_t)n, NULL, NULL);
        ts = rl_ts(timeout_ns);
        return ppoll(fds, (nfds_t)n, &ts, NULL);
    }
    """
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    struct pollfd:
        int fd
        short events
        short revents

    int64_t rl_now_ns() noexcept nogil
    int64_t rl_load(const int64_t* p) noexcept nogil
    void rl_store(int64_t* p, int64_t v) noexcept nogil
    int rl_cond_init(pthread_cond_t* cv) noexcept nogil
    int rl_cond_wait_until(pthread_cond_t* cv, pthread_mutex_t* m, int64_t deadline) noexcept nogil
    int rl_mutex_lock_until(pthread_mutex_t* m, int64_t deadline) noexcept nogil
    int rl_mutex_init_errorcheck(pthread_mutex_t* m) noexcept nogil
    int rl_spawn(pthread_t* t, void* (*fn)(void*) noexcept nogil, void* arg) noexcept nogil
    int rl_ppoll(pollfd* fds, int n, int64_t timeout_ns) noexcept nogil
    bint rl_would_block(int e) noexcept nogil

    int pthread_join(pthread_t t, void** ret) nogil
    int pthread_detach(pthread_t t) nogil
    int pthread_mutex_init(pthread_mutex_t* m, const void* attr) nogil
    int pthread_mutex_destroy(pthread_mutex_t* m) nogil
    int pthread_mutex_lock(pthread_mutex_t* m) nogil
    int pthread_mutex_trylock(pthread_mutex_t* m) nogil
    int pthread_mutex_unlock(pthread_mutex_t* m) nogil
    int pthread_cond_wait(pthread_cond_t* cv, pthread_mutex_t* m) nogil
    int pthread_cond_signal(pthread_cond_t* cv) nogil
    int pthread_cond_destroy(pthread_cond_t* cv) nogil
    enum:
        POLLIN
        POLLOUT


cdef extern from "Python.h":
    # Declared without an exception clause: the exception it may set is left
    # pending for the calling thread to raise once it is back in Python.
    int check_signals_raw "PyErr_CheckSignals" () noexcept


cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    ctypedef unsigned short sa_family_t
    struct sockaddr:
        sa_family_t sa_family
    struct sockaddr_storage:
        sa_family_t ss_family
    int socket(int domain, int type, int protocol)
    int connect(int fd, const sockaddr* addr, socklen_t len)
    ssize_t send(int fd, const void* buf, size_t n, int flags)
    ssize_t recv(int fd, void* buf, size_t n, int flags)
    int setsockopt(int fd, int level, int name, const void* val, socklen_t len)
    int getsockopt(int fd, int level, int name, void* val, socklen_t* len)
    enum:
        AF_UNIX
        AF_UNSPEC
        SOCK_STREAM
        SOCK_NONBLOCK
        SOCK_CLOEXEC
        SOL_SOCKET
        SO_ERROR
        SO_KEEPALIVE
        MSG_NOSIGNAL
        MSG_DONTWAIT

cdef extern from "<netinet/in.h>" nogil:
    enum:
        IPPROTO_TCP

cdef extern from "<netinet/tcp.h>" nogil:
    enum:
        TCP_NODELAY

cdef extern from "<sys/un.h>" nogil:
    struct sockaddr_un:
        sa_family_t sun_family
        char sun_path[108]

cdef extern from "<netdb.h>" nogil:
    struct addrinfo:
        int ai_flags
        int ai_family
        int ai_socktype
        int ai_protocol
        socklen_t ai_addrlen
        sockaddr* ai_addr
        addrinfo* ai_next
    int getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res)
    void freeaddrinfo(addrinfo* res)
    const char* gai_strerror(int code)

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    int close(int fd)
    ssize_t read(int fd, void* buf, size_t n)
    ssize_t write(int fd, const void* buf, size_t n)


# Keeper states; the values are those of redlease._engine.
IDLE = 0
ACTIVE = 1
LOST = 2
ENDED = 3

cdef enum:
    ST_IDLE = 0
    ST_ACTIVE = 1
    ST_LOST = 2
    ST_ENDED = 3

# Failure kinds, mapped to redis-py exceptions by make_exception().
cdef enum:
    RL_OK = 0
    RL_ETIMEOUT = 1
    RL_ECONN = 2
    RL_EPROTO = 3
    RL_EREPLY = 4
    RL_ENOMEM = 5
    RL_EUNEXPECTED = 6
    RL_ECANCELLED = 7
    RL_EINTERRUPTED = 8

cdef enum:
    MAX_ADDRS = 4
    ERR_MSG = 400
    ERR_RING = 32
    LATE_MAX = 65536
    READ_CHUNK = 16384
    READ_KEEP = 1048576

# A connection idle for longer than this is probed (a zero-timeout poll)
# before use, so a connection the server closed while idle (restart,
# ``timeout`` setting) is replaced instead of failing the next call.
cdef int64_t IDLE_PROBE_NS = 1000000000
cdef int64_t FOREVER_NS = 1 << 62


# ---------------------------------------------------------------- buffers

cdef struct rl_buf:
    char* data
    size_t len
    size_t cap


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


cdef int buf_put_prefix(rl_buf* b, char kind, long long n) noexcept nogil:
    """Append ``*<n>\\r\\n`` or ``$<n>\\r\\n``."""
    cdef int k
    if buf_reserve(b, 24) < 0:
        return -1
    b.data[b.len] = kind
    k = fmt_ll(b.data + b.len + 1, n)
    b.data[b.len + 1 + k] = c'\r'
    b.data[b.len + 2 + k] = c'\n'
    b.len += <size_t>k + 3
    return 0


cdef int buf_put_bulk(rl_buf* b, const char* p, size_t n) noexcept nogil:
    if buf_reserve(b, n + 26) < 0:
        return -1
    buf_put_prefix(b, c'$', <long long>n)
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


cdef struct rl_script_cmd:
    size_t head   # end of "*<n>\r\n"
    size_t tail   # start of "<numkeys> keys... args..."


cdef int put_evalsha(rl_buf* b, ScriptRef ref, object keys, object args,
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
    if buf_put_bulk(b, PyBytes_AS_STRING(ref.sha), <size_t>PyBytes_GET_SIZE(ref.sha)) < 0:
        raise MemoryError()
    out.tail = b.len
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


cdef int build_eval(rl_buf* e, const rl_buf* w, const rl_script_cmd* cmd,
                    const char* src, size_t srclen) noexcept nogil:
    """The EVAL twin of an encoded EVALSHA: same arity, same tail, source for the sha."""
    e.len = 0
    if buf_put(e, w.data, cmd.head) < 0:
        return -1
    if buf_put(e, b"$4\r\nEVAL\r\n", 10) < 0:
        return -1
    if buf_put_bulk(e, src, srclen) < 0:
        return -1
    return buf_put(e, w.data + cmd.tail, w.len - cmd.tail)


# ---------------------------------------------------------------- parsing (no GIL)

cdef struct rl_node:
    char kind         # one of : + - $ *
    long long ival    # integer value; payload length for + - $; element count for *
    size_t off        # payload offset for + - $


cdef struct rl_nodes:
    rl_node* items
    size_t len
    size_t cap


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
    -2 when out of memory. Arrays need no stack: a counter of elements still
    owed is enough, since the node counts rebuild the nesting later.
    """
    cdef size_t pos = 0
    cdef long long need = 1
    cdef const char* cr
    cdef size_t eol
    cdef char kind
    cdef long long v
    cdef rl_node* node
    cdef rl_node* grown
    cdef size_t cap
    out.len = 0
    while need > 0:
        if pos + 1 >= n:
            return 0
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
        kind = p[pos]
        node.kind = kind
        node.off = pos + 1
        if kind == c'+' or kind == c'-':
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
        elif kind == c'*':
            if parse_ll(p + pos + 1, eol - pos - 1, &v) < 0 or v < -1:
                return -1
            node.ival = v
            pos = eol + 2
            if v > 0:
                # A count that would wrap the tally could end the reply with
                # fewer nodes than its arrays claim; build_reply would then
                # read past the node array.
                if v > LLONG_MAX - need:
                    return -1
                need += v
        else:
            return -1
        need -= 1
    return <Py_ssize_t>pos


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


# ---------------------------------------------------------------- connections (no GIL)

cdef struct rl_conn:
    int fd
    int is_unix
    int port
    int naddrs
    int keep_addrs        # the keeper never resolves again: getaddrinfo has no deadline
    int python_signals    # a Python thread waits here: let signal handlers run on EINTR
    int drop_when_done    # Pool.close() ran inside this connection's call: drop it after
    int cancel_fd         # readable -> abort the round trip (keeper close)
    int err_kind
    int hello_replies
    int64_t last_used
    size_t hello_len
    size_t reply_len
    char* hello
    rl_buf w
    rl_buf e
    rl_buf r
    rl_nodes nodes
    socklen_t addrlens[4]
    sockaddr_storage addrs[4]
    char host[256]
    char path[108]
    char address[300]
    char err_msg[400]


cdef int conn_fail(rl_conn* c, int kind, const char* msg) noexcept nogil:
    c.err_kind = kind
    strncpy(c.err_msg, msg, ERR_MSG - 1)
    c.err_msg[ERR_MSG - 1] = 0
    return -1


cdef void conn_drop(rl_conn* c) noexcept nogil:
    """Forget the socket. In a forked child this sends nothing: the parent still holds it."""
    if c.fd >= 0:
        close(c.fd)
        c.fd = -1
    c.r.len = 0
    c.reply_len = 0


cdef void conn_free(rl_conn* c) noexcept nogil:
    conn_drop(c)
    buf_free(&c.w)
    buf_free(&c.e)
    buf_free(&c.r)
    free(c.nodes.items)
    c.nodes.items = NULL
    c.nodes.len = 0
    c.nodes.cap = 0
    free(c.hello)
    c.hello = NULL
    c.hello_len = 0


cdef int conn_io_error(rl_conn* c, int err, const char* what) noexcept nogil:
    c.err_kind = RL_ECONN
    snprintf(c.err_msg, ERR_MSG, "Error %d while %s %s. %s.", err, what, c.address, strerror(err))
    conn_drop(c)
    return -1


cdef int conn_timeout(rl_conn* c, const char* what) noexcept nogil:
    c.err_kind = RL_ETIMEOUT
    snprintf(c.err_msg, ERR_MSG, "Timeout %s %s", what, c.address)
    conn_drop(c)
    return -1


cdef int conn_wait(rl_conn* c, short events, int64_t deadline, const char* what) noexcept nogil:
    """Wait until the socket is ready or the deadline passes; -1 (and dropped) on timeout."""
    cdef pollfd fds[2]
    cdef int nfds = 1
    cdef int rc
    cdef int64_t now
    fds[0].fd = c.fd
    fds[0].events = events
    fds[0].revents = 0
    if c.cancel_fd >= 0:
        fds[1].fd = c.cancel_fd
        fds[1].events = POLLIN
        fds[1].revents = 0
        nfds = 2
    while True:
        now = rl_now_ns()
        if now >= deadline:
            return conn_timeout(c, what)
        rc = rl_ppoll(fds, nfds, deadline - now)
        if rc < 0:
            if errno == EINTR:
                if c.python_signals and run_signal_handlers() < 0:
                    # The handler raised (KeyboardInterrupt...): the round trip
                    # is abandoned, and with it the connection's place in the stream.
                    conn_fail(c, RL_EINTERRUPTED, "interrupted")
                    conn_drop(c)
                    return -1
                continue
            return conn_io_error(c, errno, what)
        if rc == 0:
            continue
        if nfds == 2 and fds[1].revents != 0:
            conn_fail(c, RL_ECANCELLED, "cancelled")
            conn_drop(c)
            return -1
        if fds[0].revents != 0:
            return 0


cdef int run_signal_handlers() noexcept nogil:
    cdef int rc
    with gil:
        rc = check_signals_raw()
    return rc


cdef int conn_send(rl_conn* c, const char* data, size_t n, int64_t deadline) noexcept nogil:
    cdef size_t off = 0
    cdef ssize_t k
    while off < n:
        k = send(c.fd, data + off, n - off, MSG_NOSIGNAL)
        if k >= 0:
            off += <size_t>k
            continue
        if errno == EINTR:
            continue
        if rl_would_block(errno):
            if conn_wait(c, POLLOUT, deadline, "writing to") < 0:
                return -1
            continue
        return conn_io_error(c, errno, "writing to")
    return 0


cdef int conn_read_reply(rl_conn* c, int64_t deadline) noexcept nogil:
    """Read until one whole reply is buffered; its nodes land in ``c.nodes``."""
    cdef Py_ssize_t rc
    cdef ssize_t k
    while True:
        if c.r.len > 0:
            rc = resp_parse(c.r.data, c.r.len, &c.nodes)
            if rc > 0:
                c.reply_len = <size_t>rc
                return 0
            if rc == -1:
                conn_fail(c, RL_EPROTO, "Protocol error: the server sent a malformed reply")
                conn_drop(c)
                return -1
            if rc == -2:
                conn_fail(c, RL_ENOMEM, "out of memory parsing a reply")
                conn_drop(c)
                return -1
        if conn_wait(c, POLLIN, deadline, "reading from") < 0:
            return -1
        if buf_reserve(&c.r, READ_CHUNK) < 0:
            conn_fail(c, RL_ENOMEM, "out of memory reading a reply")
            conn_drop(c)
            return -1
        k = recv(c.fd, c.r.data + c.r.len, c.r.cap - c.r.len, 0)
        if k > 0:
            c.r.len += <size_t>k
        elif k == 0:
            conn_fail(c, RL_ECONN, "Connection closed by server.")
            conn_drop(c)
            return -1
        elif errno != EINTR and not rl_would_block(errno):
            return conn_io_error(c, errno, "reading from")


cdef void conn_consume(rl_conn* c) noexcept nogil:
    cdef size_t rest
    if c.reply_len == 0:
        return
    rest = c.r.len - c.reply_len
    if rest:
        memmove(c.r.data, c.r.data + c.reply_len, rest)
    c.r.len = rest
    c.reply_len = 0
    if rest == 0 and c.r.cap > READ_KEEP:
        # One huge reply should not pin its buffer for the connection's life.
        buf_free(&c.r)


cdef int conn_resolve(rl_conn* c) noexcept nogil:
    cdef addrinfo hints
    cdef addrinfo* res = NULL
    cdef addrinfo* ai
    cdef char service[16]
    cdef int rc
    cdef sockaddr_un* un
    c.naddrs = 0
    if c.is_unix:
        un = <sockaddr_un*>&c.addrs[0]
        memset(un, 0, sizeof(sockaddr_un))
        un.sun_family = AF_UNIX
        strncpy(un.sun_path, c.path, 107)
        c.addrlens[0] = sizeof(sockaddr_un)
        c.naddrs = 1
        return 0
    memset(&hints, 0, sizeof(hints))
    hints.ai_family = AF_UNSPEC
    hints.ai_socktype = SOCK_STREAM
    snprintf(service, sizeof(service), "%d", c.port)
    rc = getaddrinfo(c.host, service, &hints, &res)
    if rc != 0:
        c.err_kind = RL_ECONN
        snprintf(c.err_msg, ERR_MSG, "Error connecting to %s: %s.", c.address, gai_strerror(rc))
        return -1
    ai = res
    while ai != NULL and c.naddrs < MAX_ADDRS:
        if ai.ai_addrlen <= sizeof(sockaddr_storage):
            memcpy(&c.addrs[c.naddrs], ai.ai_addr, ai.ai_addrlen)
            c.addrlens[c.naddrs] = ai.ai_addrlen
            c.naddrs += 1
        ai = ai.ai_next
    freeaddrinfo(res)
    if c.naddrs == 0:
        return conn_fail(c, RL_ECONN, "no usable address")
    return 0


cdef int conn_handshake(rl_conn* c, int64_t deadline) noexcept nogil:
    """AUTH / SELECT / CLIENT SETNAME, pipelined; the first error reply fails the connect."""
    cdef int i
    cdef rl_node* top
    cdef size_t n
    if c.hello_len == 0:
        return 0
    if conn_send(c, c.hello, c.hello_len, deadline) < 0:
        return -1
    for i in range(c.hello_replies):
        if conn_read_reply(c, deadline) < 0:
            return -1
        top = &c.nodes.items[0]
        if top.kind == c'-':
            n = <size_t>top.ival if top.ival < ERR_MSG - 1 else ERR_MSG - 1
            memcpy(c.err_msg, c.r.data + top.off, n)
            c.err_msg[n] = 0
            c.err_kind = RL_EREPLY
            conn_drop(c)
            return -1
        conn_consume(c)
    return 0


cdef int conn_connect(rl_conn* c, int64_t deadline) noexcept nogil:
    cdef int i, fd, rc, err, one = 1
    cdef socklen_t errlen
    cdef sockaddr* sa
    if c.naddrs == 0 and conn_resolve(c) < 0:
        return -1
    for i in range(c.naddrs):
        sa = <sockaddr*>&c.addrs[i]
        fd = socket(sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)
        if fd < 0:
            err = errno
            c.err_kind = RL_ECONN
            snprintf(c.err_msg, ERR_MSG, "Error %d connecting to %s. %s.", err, c.address, strerror(err))
            continue
        if not c.is_unix:
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one))
            setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one))
        err = 0
        rc = connect(fd, sa, c.addrlens[i])
        if rc < 0:
            err = errno
        if err == EINPROGRESS or err == EINTR:
            c.fd = fd
            if conn_wait(c, POLLOUT, deadline, "connecting to") < 0:
                # Timed out, cancelled or interrupted: no other address gets a
                # turn, the deadline is shared by all of them.
                return -1
            c.fd = -1
            errlen = sizeof(err)
            if getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &errlen) < 0:
                err = errno
        if err != 0:
            close(fd)
            c.err_kind = RL_ECONN
            snprintf(c.err_msg, ERR_MSG, "Error %d connecting to %s. %s.", err, c.address, strerror(err))
            continue
        c.fd = fd
        c.r.len = 0
        c.reply_len = 0
        if conn_handshake(c, deadline) < 0:
            return -1
        c.last_used = rl_now_ns()
        return 0
    if not c.keep_addrs:
        # Resolve again next time: the name may point somewhere new.
        c.naddrs = 0
    return -1


cdef int conn_ready(rl_conn* c, int64_t deadline) noexcept nogil:
    """Make sure there is a live connection, replacing one the server closed while idle."""
    cdef pollfd pfd
    cdef int64_t now
    if c.fd >= 0:
        now = rl_now_ns()
        if now - c.last_used > IDLE_PROBE_NS:
            pfd.fd = c.fd
            pfd.events = POLLIN
            pfd.revents = 0
            # Nothing is owed to us on an idle connection: readable means EOF or junk.
            if rl_ppoll(&pfd, 1, 0) != 0:
                conn_drop(c)
    if c.fd < 0:
        return conn_connect(c, deadline)
    return 0


cdef inline bint reply_is_noscript(rl_conn* c) noexcept nogil:
    cdef rl_node* top = &c.nodes.items[0]
    return top.kind == c'-' and top.ival >= 8 and memcmp(c.r.data + top.off, b"NOSCRIPT", 8) == 0


cdef int conn_run_script(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                         const char* src, size_t srclen) noexcept nogil:
    """EVALSHA, and on NOSCRIPT one EVAL (which also loads the script), all before ``deadline``."""
    if conn_ready(c, deadline) < 0:
        return -1
    if conn_send(c, c.w.data, c.w.len, deadline) < 0:
        return -1
    if conn_read_reply(c, deadline) < 0:
        return -1
    if reply_is_noscript(c):
        conn_consume(c)
        if build_eval(&c.e, &c.w, cmd, src, srclen) < 0:
            return conn_fail(c, RL_ENOMEM, "out of memory encoding EVAL")
        if conn_send(c, c.e.data, c.e.len, deadline) < 0:
            return -1
        if conn_read_reply(c, deadline) < 0:
            return -1
    c.last_used = rl_now_ns()
    return 0


cdef int conn_run_command(rl_conn* c, int64_t deadline) noexcept nogil:
    if conn_ready(c, deadline) < 0:
        return -1
    if conn_send(c, c.w.data, c.w.len, deadline) < 0:
        return -1
    if conn_read_reply(c, deadline) < 0:
        return -1
    c.last_used = rl_now_ns()
    return 0


# ---------------------------------------------------------------- Python glue for connections

cdef object make_exception(int kind, bytes message):
    cdef str text = message.decode("utf-8", "replace")
    if kind == RL_ETIMEOUT:
        return _RedisTimeoutError(text)
    if kind == RL_ECONN or kind == RL_EPROTO or kind == RL_ECANCELLED:
        return _RedisConnectionError(text)
    if kind == RL_EREPLY:
        return _parse_error(text)
    if kind == RL_ENOMEM:
        return MemoryError(text)
    return _RedisResponseError(text)


cdef int reraise_pending() except -1:
    return -1


cdef object conn_exception(rl_conn* c):
    if c.err_kind == RL_EINTERRUPTED:
        reraise_pending()
    return make_exception(c.err_kind, PyBytes_FromString(c.err_msg))


cdef object take_reply(rl_conn* c):
    """The buffered reply as Python objects (a top-level error is raised); consumes it."""
    cdef size_t i = 0
    cdef rl_node* top = &c.nodes.items[0]
    cdef object value
    if top.kind == c':':
        value = top.ival
        conn_consume(c)
        return value
    try:
        if top.kind == c'-':
            raise error_from_reply(c.r.data + top.off, <Py_ssize_t>top.ival)
        return build_reply(c.r.data, c.nodes.items, &i)
    finally:
        conn_consume(c)


cdef int64_t deadline_after(double timeout) except? -1:
    if timeout != timeout:
        raise ValueError("timeout must be a number, not NaN")
    if timeout <= 0:
        return rl_now_ns()
    if timeout > 1e9:
        return FOREVER_NS
    return rl_now_ns() + <int64_t>(timeout * 1e9)


_live = weakref.WeakSet()


cdef class ScriptRef:
    """A Lua script as the wire wants it: its SHA1 and its source, both UTF-8 bytes."""

    cdef readonly bytes sha
    cdef readonly bytes source

    def __init__(self, str sha, str source):
        if len(sha) != 40:
            raise ValueError("sha must be 40 hex digits")
        self.sha = sha.encode("ascii")
        self.source = source.encode("utf-8")


cdef class Target:
    """Where to connect and what to say first (AUTH, SELECT, CLIENT SETNAME)."""

    cdef readonly object host
    cdef readonly int port
    cdef readonly object path
    cdef readonly int db
    cdef readonly object username
    cdef readonly object client_name
    cdef object _password
    cdef bytes _host_b
    cdef bytes _path_b
    cdef bytes _hello
    cdef int _hello_replies

    def __init__(self, host=None, int port=6379, path=None, int db=0, username=None,
                 password=None, client_name=None):
        cdef rl_buf b
        cdef list hello = []
        if path:
            self._path_b = os.fsencode(path)
            if len(self._path_b) >= 108:
                raise ValueError(f"unix socket path too long ({len(self._path_b)} bytes)")
            self._host_b = b""
        else:
            self._host_b = (host or "localhost").encode("idna")
            if len(self._host_b) >= 256:
                raise ValueError("host name too long")
            self._path_b = b""
        self.host = None if path else (host or "localhost")
        self.port = port
        self.path = path or None
        self.db = db
        self.username = username
        self._password = password
        self.client_name = client_name
        if username or password:
            hello.append(["AUTH", username, password or ""] if username else ["AUTH", password])
        if db:
            hello.append(["SELECT", db])
        if client_name:
            hello.append(["CLIENT", "SETNAME", client_name])
        memset(&b, 0, sizeof(b))
        try:
            for command in hello:
                put_command(&b, command)
            self._hello = PyBytes_FromStringAndSize(b.data, <Py_ssize_t>b.len) if b.len else b""
        finally:
            buf_free(&b)
        self._hello_replies = len(hello)

    @property
    def address(self):
        return self.path if self.path else f"{self.host}:{self.port}"

    def __repr__(self):
        return f"Target({self.address!r}, db={self.db})"

    cdef int init_conn(self, rl_conn* c) except -1:
        cdef bytes address = self.address.encode("utf-8", "replace")[:299]
        memset(c, 0, sizeof(rl_conn))
        c.fd = -1
        c.cancel_fd = -1
        c.port = self.port
        c.is_unix = 1 if self._path_b else 0
        strncpy(c.host, PyBytes_AS_STRING(self._host_b), 255)
        strncpy(c.path, PyBytes_AS_STRING(self._path_b), 107)
        strncpy(c.address, PyBytes_AS_STRING(address), 299)
        c.hello_len = <size_t>len(self._hello)
        c.hello_replies = self._hello_replies
        if c.hello_len:
            c.hello = <char*>realloc(NULL, c.hello_len)
            if c.hello == NULL:
                raise MemoryError()
            memcpy(c.hello, PyBytes_AS_STRING(self._hello), c.hello_len)
        return 0


cdef struct rl_slot:
    pthread_mutex_t mu
    rl_conn conn


cdef inline void release_slot(rl_slot* slot) noexcept:
    if slot.conn.drop_when_done:
        slot.conn.drop_when_done = 0
        conn_drop(&slot.conn)
    pthread_mutex_unlock(&slot.mu)


cdef class Pool:
    """A few native connections to one server, lazily opened, safe from any thread.

    Each call takes a free connection (a new one is opened only when all open
    ones are busy), runs one command or script with the GIL released and
    bounded by ``timeout`` in all, and gives the connection back. An I/O error
    or a timeout closes that connection; the next call opens a new one. No
    call is ever retried.
    """

    cdef rl_slot* slots
    cdef int size
    cdef unsigned int rr
    cdef readonly Target target
    cdef object __weakref__

    def __cinit__(self):
        self.slots = NULL
        self.size = 0

    def __init__(self, Target target, int size=1):
        cdef int i
        if size < 1 or size > 64:
            raise ValueError("size must be between 1 and 64")
        if self.slots != NULL:
            raise RuntimeError("Pool already initialised")
        self.target = target
        self.slots = <rl_slot*>calloc(<size_t>size, sizeof(rl_slot))
        if self.slots == NULL:
            raise MemoryError()
        for i in range(size):
            rl_mutex_init_errorcheck(&self.slots[i].mu)
            self.size = i + 1
            target.init_conn(&self.slots[i].conn)
            self.slots[i].conn.python_signals = 1
        _live.add(self)

    def __dealloc__(self):
        cdef int i
        if self.slots == NULL:
            return
        for i in range(self.size):
            conn_free(&self.slots[i].conn)
            pthread_mutex_destroy(&self.slots[i].mu)
        free(self.slots)
        self.slots = NULL

    cdef rl_slot* grab(self, int64_t deadline) except NULL:
        cdef int i
        cdef int rc
        if self.slots == NULL:
            raise RuntimeError("Pool is not initialised")
        for i in range(self.size):
            if pthread_mutex_trylock(&self.slots[i].mu) == 0:
                return &self.slots[i]
        i = <int>(self.rr % <unsigned int>self.size)
        self.rr += 1
        with nogil:
            rc = rl_mutex_lock_until(&self.slots[i].mu, deadline)
        if rc != 0:
            raise _RedisTimeoutError(f"Timeout waiting for a connection to {self.target.address}")
        return &self.slots[i]

    def execute(self, ScriptRef ref not None, keys, args, double timeout):
        """Run a script (EVALSHA, EVAL on NOSCRIPT); the reply as redis-py gives it."""
        cdef int64_t deadline = deadline_after(timeout)
        cdef rl_slot* slot = self.grab(deadline)
        cdef rl_conn* c = &slot.conn
        cdef rl_script_cmd cmd
        cdef const char* src = PyBytes_AS_STRING(ref.source)
        cdef size_t srclen = <size_t>PyBytes_GET_SIZE(ref.source)
        cdef int rc
        try:
            put_evalsha(&c.w, ref, keys, args, &cmd)
            with nogil:
                rc = conn_run_script(c, deadline, &cmd, src, srclen)
            if rc < 0:
                raise conn_exception(c)
            return take_reply(c)
        finally:
            release_slot(slot)

    def command(self, args, double timeout):
        """Run one plain command, e.g. ``["PING"]``; the reply as redis-py gives it."""
        cdef int64_t deadline = deadline_after(timeout)
        cdef rl_slot* slot = self.grab(deadline)
        cdef rl_conn* c = &slot.conn
        cdef int rc
        try:
            c.w.len = 0
            put_command(&c.w, args)
            with nogil:
                rc = conn_run_command(c, deadline)
            if rc < 0:
                raise conn_exception(c)
            return take_reply(c)
        finally:
            release_slot(slot)

    @property
    def connections(self):
        """How many connections are open right now."""
        cdef int i
        cdef int n = 0
        for i in range(self.size):
            if self.slots[i].conn.fd >= 0:
                n += 1
        return n

    def close(self):
        """Close every connection (waiting for calls in flight); later calls reconnect."""
        cdef int i
        cdef int rc
        if self.slots == NULL:
            return
        for i in range(self.size):
            with nogil:
                rc = pthread_mutex_lock(&self.slots[i].mu)
                if rc == 0:
                    conn_drop(&self.slots[i].conn)
                    pthread_mutex_unlock(&self.slots[i].mu)
            if rc != 0:
                # EDEADLK: this thread's own call holds it (we run in a signal
                # handler inside that call). Waiting would never end, and the
                # socket is in use below us: the call drops it when done.
                self.slots[i].conn.drop_when_done = 1

    cdef void after_fork_in_child(self) noexcept:
        cdef int i
        for i in range(self.size):
            # The thread that held it does not exist in the child.
            rl_mutex_init_errorcheck(&self.slots[i].mu)
            conn_drop(&self.slots[i].conn)


# ---------------------------------------------------------------- the keeper thread (no GIL, ever)

cdef struct rl_err:
    int kind
    char msg[400]


cdef struct rl_keeper:
    rl_conn conn
    pthread_t thread
    pthread_mutex_t mu
    pthread_cond_t cv
    # Read by Python without the lock: atomics only.
    int64_t state
    int64_t token
    int64_t renewed_at     # send time (ns) of the last good renewal
    int64_t renewals
    # Guarded by mu.
    int thread_started
    int stop
    int detached           # the Python object is gone: the thread frees this struct
    int exited
    uint64_t gen           # bumped by begin/end/close so a late reply cannot touch a newer term
    int64_t interval_ns
    int64_t ttl_ns
    int64_t lease_deadline
    int64_t next_send
    int wake_fd            # eventfd: Python waits on it
    int ctl_fd             # eventfd: close() aborts a round trip in flight
    char* cmd
    size_t cmd_len
    char* eval_cmd
    size_t eval_len
    double* late
    size_t late_cap
    uint64_t late_count
    int err_head
    int err_count
    rl_err errs[32]


cdef void keeper_free(rl_keeper* k) noexcept nogil:
    conn_free(&k.conn)
    if k.wake_fd >= 0:
        close(k.wake_fd)
        k.wake_fd = -1
    if k.ctl_fd >= 0:
        close(k.ctl_fd)
        k.ctl_fd = -1
    free(k.cmd)
    free(k.eval_cmd)
    free(k.late)
    pthread_mutex_destroy(&k.mu)
    pthread_cond_destroy(&k.cv)
    free(k)


cdef inline void fd_signal(int fd) noexcept nogil:
    cdef uint64_t one = 1
    if fd >= 0:
        write(fd, &one, 8)


cdef void keeper_lose(rl_keeper* k) noexcept nogil:
    # Token first: anyone who sees LOST must never still see a token.
    rl_store(&k.token, 0)
    rl_store(&k.state, ST_LOST)
    fd_signal(k.wake_fd)


cdef void keeper_record_lateness(rl_keeper* k, double seconds) noexcept nogil:
    cdef uint64_t idx = k.late_count
    cdef size_t cap
    cdef double* grown
    if idx < LATE_MAX:
        if idx >= k.late_cap:
            cap = k.late_cap * 2 if k.late_cap else 256
            if cap > LATE_MAX:
                cap = LATE_MAX
            grown = <double*>realloc(k.late, cap * sizeof(double))
            if grown == NULL:
                return
            k.late = grown
            k.late_cap = cap
        k.late[idx] = seconds
    else:
        k.late[idx % LATE_MAX] = seconds
    k.late_count += 1


cdef void keeper_record_error(rl_keeper* k, int kind, const char* msg) noexcept nogil:
    cdef int slot = (k.err_head + k.err_count) % ERR_RING
    if k.err_count == ERR_RING:
        # Full: the oldest goes.
        k.err_head = (k.err_head + 1) % ERR_RING
        k.err_count -= 1
    k.errs[slot].kind = kind
    strncpy(k.errs[slot].msg, msg, ERR_MSG - 1)
    k.errs[slot].msg[ERR_MSG - 1] = 0
    k.err_count += 1


cdef enum:
    ROUND_RENEWED = 1
    ROUND_LOST = 0
    ROUND_ERROR = -1
    ROUND_SKIPPED = -2
    ROUND_CANCELLED = -3


cdef int keeper_send(rl_keeper* k, uint64_t gen, const char* data, size_t n,
                     int64_t deadline, int64_t* t_send) noexcept nogil:
    """Send one renewal command for term ``gen``, unless that term has ended.

    The first write happens under the lock right after re-checking the term,
    so once end() has returned nothing more is ever sent for that term.
    """
    cdef rl_conn* c = &k.conn
    cdef ssize_t sent = 0
    cdef int err = 0
    pthread_mutex_lock(&k.mu)
    if k.gen != gen or k.stop:
        pthread_mutex_unlock(&k.mu)
        return ROUND_SKIPPED
    if t_send != NULL:
        t_send[0] = rl_now_ns()
    while True:
        sent = send(c.fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT)
        if sent >= 0 or errno != EINTR:
            break
    if sent < 0:
        err = errno
    pthread_mutex_unlock(&k.mu)
    if sent < 0:
        if not rl_would_block(err):
            conn_io_error(c, err, "writing to")
            return ROUND_ERROR
        sent = 0
    if <size_t>sent < n and conn_send(c, data + sent, n - <size_t>sent, deadline) < 0:
        return ROUND_CANCELLED if c.err_kind == RL_ECANCELLED else ROUND_ERROR
    return 0


cdef int keeper_round(rl_keeper* k, uint64_t gen, int64_t deadline, int64_t* t_send) noexcept nogil:
    """One renewal round trip (EVALSHA, EVAL on NOSCRIPT), bounded by ``deadline``."""
    cdef rl_conn* c = &k.conn
    cdef rl_node* top
    cdef size_t n
    cdef int rc
    t_send[0] = 0
    if conn_ready(c, deadline) < 0:
        return ROUND_CANCELLED if c.err_kind == RL_ECANCELLED else ROUND_ERROR
    rc = keeper_send(k, gen, k.cmd, k.cmd_len, deadline, t_send)
    if rc < 0:
        return rc
    if conn_read_reply(c, deadline) < 0:
        return ROUND_CANCELLED if c.err_kind == RL_ECANCELLED else ROUND_ERROR
    if reply_is_noscript(c):
        conn_consume(c)
        rc = keeper_send(k, gen, k.eval_cmd, k.eval_len, deadline, NULL)
        if rc < 0:
            return rc
        if conn_read_reply(c, deadline) < 0:
            return ROUND_CANCELLED if c.err_kind == RL_ECANCELLED else ROUND_ERROR
    c.last_used = rl_now_ns()
    top = &c.nodes.items[0]
    if top.kind == c':' and top.ival == 1:
        conn_consume(c)
        return ROUND_RENEWED
    if top.kind == c':' and top.ival == 0:
        conn_consume(c)
        return ROUND_LOST
    if top.kind == c'-':
        n = <size_t>top.ival if top.ival < ERR_MSG - 1 else ERR_MSG - 1
        memcpy(c.err_msg, c.r.data + top.off, n)
        c.err_msg[n] = 0
        c.err_kind = RL_EREPLY
    else:
        conn_fail(c, RL_EUNEXPECTED, "unexpected reply to a renewal (expected 1 or 0)")
    conn_consume(c)
    return ROUND_ERROR


cdef void* keeper_main(void* arg) noexcept nogil:
    cdef rl_keeper* k = <rl_keeper*>arg
    cdef int64_t now, sched, deadline, t_send, wake_at
    cdef uint64_t gen
    cdef int rc, detached
    pthread_mutex_lock(&k.mu)
    while not k.stop:
        if rl_load(&k.state) != ST_ACTIVE:
            pthread_cond_wait(&k.cv, &k.mu)
            continue
        now = rl_now_ns()
        if now >= k.lease_deadline:
            keeper_lose(k)
            continue
        if now < k.next_send:
            wake_at = k.next_send if k.next_send < k.lease_deadline else k.lease_deadline
            rl_cond_wait_until(&k.cv, &k.mu, wake_at)
            continue
        gen = k.gen
        sched = k.next_send
        # A round trip may never outlive the lease: at the deadline it is
        # abandoned and the term is lost, whatever is still in flight.
        deadline = now + k.interval_ns
        if deadline > k.lease_deadline:
            deadline = k.lease_deadline
        pthread_mutex_unlock(&k.mu)
        rc = keeper_round(k, gen, deadline, &t_send)
        pthread_mutex_lock(&k.mu)
        if t_send != 0:
            keeper_record_lateness(k, <double>(t_send - sched) / 1e9)
        if rc == ROUND_SKIPPED or rc == ROUND_CANCELLED:
            continue
        if k.gen != gen or rl_load(&k.state) != ST_ACTIVE:
            continue
        if rc == ROUND_RENEWED:
            if t_send + k.ttl_ns > k.lease_deadline:
                k.lease_deadline = t_send + k.ttl_ns
            rl_store(&k.renewed_at, t_send)
            rl_store(&k.renewals, rl_load(&k.renewals) + 1)
        elif rc == ROUND_LOST:
            keeper_lose(k)
            continue
        else:
            keeper_record_error(k, k.conn.err_kind, k.conn.err_msg)
            fd_signal(k.wake_fd)
        k.next_send = sched + k.interval_ns
        now = rl_now_ns()
        if k.next_send < now:
            # Behind schedule (a slow or failed round trip): go again at once
            # rather than skip ahead, the lease deadline is what bounds us.
            k.next_send = now
    detached = k.detached
    k.exited = 1
    pthread_mutex_unlock(&k.mu)
    if detached:
        keeper_free(k)
    return NULL


cdef bytes encoded_command(object args):
    cdef rl_buf b
    memset(&b, 0, sizeof(b))
    try:
        put_command(&b, args)
        return PyBytes_FromStringAndSize(b.data, <Py_ssize_t>b.len)
    finally:
        buf_free(&b)


cdef class Keeper:
    """Keeps one lease alive from a native thread that never takes the GIL.

    ``begin(token, acquired_at)`` starts a term: the renewal script is sent at
    once and then every ``interval`` seconds on absolute CLOCK_MONOTONIC
    deadlines, on the keeper's own connection. A reply of 1 extends the lease
    to (send time + ``ttl``); 0 loses it at once; errors are tolerated until
    the lease deadline, which a timer enforces even while a renewal is in
    flight. ``token`` and ``state`` are atomics: reading them never waits,
    and they change the moment the thread sees the loss. Every state change
    and every failed renewal makes ``fileno()`` readable.

    The thread starts on the first ``begin()`` and is joined by ``close()``.
    After ``os.fork()`` the child's copy is inert: token 0, not ACTIVE, no
    thread, its socket dropped without a byte sent; ``begin()`` raises there.
    """

    cdef rl_keeper* k
    cdef bint _closed
    cdef bint _forked
    # Threads inside wait(): close() leaves the eventfds to the last of them,
    # so none polls or reads a descriptor number that may already be reused.
    cdef int _waiters
    cdef readonly double interval
    cdef readonly double ttl
    cdef object __weakref__

    def __cinit__(self):
        self.k = NULL
        self._closed = False
        self._forked = False
        self._waiters = 0

    def __init__(self, Target target not None, ScriptRef ref not None, keys, args,
                 double interval, double ttl):
        cdef rl_keeper* k
        cdef rl_buf w
        cdef rl_buf e
        cdef rl_script_cmd cmd
        cdef int rc
        if self.k != NULL:
            raise RuntimeError("Keeper already initialised")
        if not (interval > 0 and interval < 1e6) or not (ttl > 0 and ttl < 1e6):
            raise ValueError("interval and ttl must be positive numbers of seconds")
        self.interval = interval
        self.ttl = ttl
        k = <rl_keeper*>calloc(1, sizeof(rl_keeper))
        if k == NULL:
            raise MemoryError()
        k.wake_fd = -1
        k.ctl_fd = -1
        k.conn.fd = -1
        k.conn.cancel_fd = -1
        pthread_mutex_init(&k.mu, NULL)
        rl_cond_init(&k.cv)
        self.k = k
        target.init_conn(&k.conn)
        k.interval_ns = <int64_t>(interval * 1e9)
        k.ttl_ns = <int64_t>(ttl * 1e9)
        memset(&w, 0, sizeof(w))
        memset(&e, 0, sizeof(e))
        try:
            put_evalsha(&w, ref, keys, args, &cmd)
            if build_eval(&e, &w, &cmd, PyBytes_AS_STRING(ref.source),
                          <size_t>PyBytes_GET_SIZE(ref.source)) < 0:
                raise MemoryError()
            k.cmd = <char*>w.data
            k.cmd_len = w.len
            k.eval_cmd = <char*>e.data
            k.eval_len = e.len
            w.data = NULL
            e.data = NULL
        finally:
            buf_free(&w)
            buf_free(&e)
        k.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        k.ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if k.wake_fd < 0 or k.ctl_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        k.conn.cancel_fd = k.ctl_fd
        # Resolve now, on the caller's thread: name lookups have no deadline,
        # and the keeper's thread must never block past its lease.
        with nogil:
            rc = conn_resolve(&k.conn)
        if rc < 0:
            raise conn_exception(&k.conn)
        k.conn.keep_addrs = 1
        _live.add(self)

    def __dealloc__(self):
        cdef rl_keeper* k = self.k
        cdef pthread_t tid
        cdef int exited
        if k == NULL:
            return
        self.k = NULL
        if not k.thread_started:
            keeper_free(k)
            return
        # Nobody called close(): stop the thread without waiting for it; the
        # last of the two to let go frees the struct.
        tid = k.thread
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.stop = 1
        k.gen += 1
        k.detached = 1
        exited = k.exited
        fd_signal(k.ctl_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        if exited:
            with nogil:
                pthread_join(tid, NULL)
            keeper_free(k)
        else:
            pthread_detach(tid)

    @property
    def token(self):
        """The running term's token, or 0 when no term is ACTIVE."""
        if self.k == NULL:
            return 0
        return rl_load(&self.k.token)

    @property
    def state(self):
        """IDLE, ACTIVE, LOST or ENDED."""
        if self.k == NULL:
            return ST_ENDED
        return rl_load(&self.k.state)

    @property
    def renewed_at(self):
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        if self.k == NULL:
            return 0.0
        return <double>rl_load(&self.k.renewed_at) / 1e9

    @property
    def renewals(self):
        """How many renewals succeeded since the keeper was made."""
        if self.k == NULL:
            return 0
        return rl_load(&self.k.renewals)

    @property
    def closed(self):
        return self._closed

    def begin(self, token, double acquired_at):
        """Start a term; ``acquired_at`` is the ``time.monotonic()`` send time of the acquire."""
        cdef rl_keeper* k = self.k
        cdef long long tok = token
        cdef int rc
        if k == NULL:
            raise RuntimeError("Keeper is not initialised")
        if self._forked:
            raise RuntimeError("this keeper was inherited across fork(); make a new one in the child")
        if self._closed:
            raise RuntimeError("Keeper is closed")
        if tok < 1:
            raise ValueError("token must be >= 1")
        pthread_mutex_lock(&k.mu)
        k.gen += 1
        k.lease_deadline = <int64_t>(acquired_at * 1e9) + k.ttl_ns
        k.next_send = rl_now_ns()
        rl_store(&k.token, tok)
        rl_store(&k.state, ST_ACTIVE)
        if not k.thread_started:
            rc = rl_spawn(&k.thread, keeper_main, k)
            if rc != 0:
                rl_store(&k.token, 0)
                rl_store(&k.state, ST_ENDED)
                pthread_mutex_unlock(&k.mu)
                raise OSError(rc, "cannot start the keeper thread: " + strerror(rc).decode())
            k.thread_started = 1
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        fd_signal(k.wake_fd)

    def end(self):
        """End the term (token cleared first); idempotent; a LOST term stays LOST."""
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.gen += 1
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
            fd_signal(k.wake_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)

    def wait(self, timeout=None):
        """Block until woken (loss, error, ``notify()``); False on timeout. Consumes the wake-up."""
        cdef rl_keeper* k = self.k
        cdef int64_t deadline = -1
        cdef int64_t now
        cdef int64_t left
        cdef pollfd pfd[2]
        cdef int rc
        cdef int err
        cdef uint64_t value
        cdef ssize_t got
        if k == NULL or self._closed:
            return True
        if timeout is not None:
            deadline = deadline_after(timeout)
        pfd[0].fd = k.wake_fd
        pfd[0].events = POLLIN
        # close() signals ctl_fd and nothing ever drains it, so every waiter
        # sees it, not just the one that would consume the wake-up.
        pfd[1].fd = k.ctl_fd
        pfd[1].events = POLLIN
        self._waiters += 1
        try:
            while True:
                pfd[0].revents = 0
                pfd[1].revents = 0
                with nogil:
                    if deadline < 0:
                        left = -1
                    else:
                        now = rl_now_ns()
                        left = deadline - now if deadline > now else 0
                    rc = rl_ppoll(pfd, 2, left)
                    err = errno
                    got = -1
                    if rc > 0 and pfd[1].revents == 0:
                        got = read(pfd[0].fd, &value, 8)
                if rc > 0:
                    if got == 8 or self._closed:
                        return True
                    continue  # another waiter took it
                if rc == 0:
                    if deadline >= 0 and rl_now_ns() >= deadline:
                        return False
                    continue
                if err == EINTR:
                    PyErr_CheckSignals()
                    continue
                raise OSError(err, strerror(err).decode("utf-8", "replace"))
        finally:
            self._waiters -= 1
            if self._closed and self._waiters == 0:
                self.close_fds()

    def notify(self):
        """Wake the waiter."""
        if self.k != NULL and not self._closed:
            fd_signal(self.k.wake_fd)

    def fileno(self):
        """An eventfd that is readable while a wake-up is pending (-1 once closed)."""
        if self.k == NULL or self._closed:
            return -1
        return self.k.wake_fd

    def pop_errors(self):
        """redis-py exceptions of the failed renewals since the last call, oldest first."""
        cdef rl_keeper* k = self.k
        cdef rl_err copy[32]
        cdef int n = 0
        cdef int i
        if k == NULL:
            return []
        # Copy out under the lock; build Python objects after releasing it,
        # so the keeper thread is never held up by Python code.
        pthread_mutex_lock(&k.mu)
        n = k.err_count
        for i in range(n):
            copy[i] = k.errs[(k.err_head + i) % ERR_RING]
        k.err_head = 0
        k.err_count = 0
        pthread_mutex_unlock(&k.mu)
        return [make_exception(copy[i].kind, PyBytes_FromString(copy[i].msg)) for i in range(n)]

    def lateness(self):
        """Seconds each renewal was sent after its scheduled time (up to the last 65536)."""
        cdef rl_keeper* k = self.k
        cdef double* copy
        cdef size_t n
        cdef size_t start = 0
        cdef size_t i
        if k == NULL:
            return []
        copy = <double*>realloc(NULL, LATE_MAX * sizeof(double))
        if copy == NULL:
            raise MemoryError()
        try:
            pthread_mutex_lock(&k.mu)
            if k.late_count <= LATE_MAX:
                n = <size_t>k.late_count
            else:
                n = LATE_MAX
                start = <size_t>(k.late_count % LATE_MAX)
            for i in range(n):
                copy[i] = k.late[(start + i) % LATE_MAX] if start else k.late[i]
            pthread_mutex_unlock(&k.mu)
            return [copy[i] for i in range(n)]
        finally:
            free(copy)

    def close(self):
        """End any term, stop and join the thread, close the socket and both eventfds. Idempotent."""
        cdef rl_keeper* k = self.k
        cdef int started
        if k == NULL or self._closed:
            return
        self._closed = True
        pthread_mutex_lock(&k.mu)
        rl_store(&k.token, 0)
        k.gen += 1
        k.stop = 1
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
        started = k.thread_started
        fd_signal(k.ctl_fd)
        fd_signal(k.wake_fd)
        pthread_cond_signal(&k.cv)
        pthread_mutex_unlock(&k.mu)
        if started:
            with nogil:
                pthread_join(k.thread, NULL)
            k.thread_started = 0
        conn_drop(&k.conn)
        if self._waiters == 0:
            self.close_fds()

    cdef void close_fds(self) noexcept:
        """Close both eventfds; only once closed and no thread is inside wait()."""
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        if k.ctl_fd >= 0:
            close(k.ctl_fd)
            k.ctl_fd = -1
            k.conn.cancel_fd = -1
        if k.wake_fd >= 0:
            close(k.wake_fd)
            k.wake_fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef void after_fork_in_child(self) noexcept:
        cdef rl_keeper* k = self.k
        if k == NULL:
            return
        # The renewer thread was not copied; its lock may have been held.
        pthread_mutex_init(&k.mu, NULL)
        rl_cond_init(&k.cv)
        k.thread_started = 0
        k.stop = 1
        k.gen += 1
        rl_store(&k.token, 0)
        if rl_load(&k.state) == ST_ACTIVE:
            rl_store(&k.state, ST_ENDED)
        self._forked = True
        # Threads that were waiting in the parent do not exist here.
        self._waiters = 0
        conn_drop(&k.conn)
        if k.ctl_fd >= 0:
            close(k.ctl_fd)
            k.ctl_fd = -1
            k.conn.cancel_fd = -1
        if k.wake_fd >= 0:
            # The eventfd is shared with the parent; waking it would wake the parent.
            close(k.wake_fd)
            k.wake_fd = -1 if self._closed else eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)


def _after_fork_in_child():
    for obj in list(_live):
        if isinstance(obj, Keeper):
            (<Keeper>obj).after_fork_in_child()
        elif isinstance(obj, Pool):
            (<Pool>obj).after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- small helpers, mostly for tests

def encode_command(args):
    """The RESP2 encoding of one command, e.g. ``encode_command(["SET", "k", 1])``."""
    return encoded_command(args)


def parse_reply(bytes data not None):
    """``(value, consumed)`` for the first whole reply in ``data``, or None when incomplete.

    Error replies come back as exception instances (not raised). A malformed
    reply raises ValueError.
    """
    cdef rl_nodes nodes
    cdef Py_ssize_t rc
    cdef size_t i = 0
    memset(&nodes, 0, sizeof(nodes))
    try:
        rc = resp_parse(PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data), &nodes)
        if rc == 0:
            return None
        if rc == -2:
            raise MemoryError()
        if rc < 0:
            raise ValueError("malformed RESP2 reply")
        return build_reply(PyBytes_AS_STRING(data), nodes.items, &i), rc
    finally:
        free(nodes.items)


def monotonic():
    """CLOCK_MONOTONIC in seconds: the clock every deadline here is measured on."""
    return <double>rl_now_ns() / 1e9
