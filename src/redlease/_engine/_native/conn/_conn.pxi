# One connection, driven without the GIL: resolve and connect, the handshake
# (AUTH / SELECT / CLIENT SETNAME), sends and reads under one deadline on
# CLOCK_MONOTONIC, and scripts with the NOSCRIPT fallback. A Pool slot and a
# renewer each own one ``rl_conn``; every failure is recorded in it as a kind
# and a message, turned into a redis-py exception later, with the GIL.
#
# Needs: _posix, _resp_encode, _resp_parse; hooks into _tls, _discovery, _pool (signals), declared in their .pxd files.

from redlease._engine.contract.interface import MAX_REPLY_BYTES as _ENGINE_MAX_REPLY_BYTES
from redlease._engine.contract.interface import MAX_REPLY_DEPTH as _ENGINE_MAX_REPLY_DEPTH
from redlease._engine.contract.interface import MAX_REPLY_ELEMENTS as _ENGINE_MAX_REPLY_ELEMENTS

if MAX_REPLY != _ENGINE_MAX_REPLY_BYTES:
    raise ImportError("the native reply cap differs from redlease._engine.contract.interface.MAX_REPLY_BYTES")
if (MAX_REPLY_ELEMENTS, MAX_REPLY_DEPTH) != (_ENGINE_MAX_REPLY_ELEMENTS, _ENGINE_MAX_REPLY_DEPTH):
    raise ImportError("the native array limits differ from redlease._engine.contract.interface's")

# A connection idle for longer than this is probed (a zero-timeout poll)
# before use, so a connection the server closed while idle (restart,
# ``timeout`` setting) is replaced instead of failing the next call.
cdef int64_t IDLE_PROBE_NS = 1000000000

# A blocking read may outlast its deadline by this much before SO_RCVTIMEO
# is set again (setting it costs a system call; most calls share a timeout).
cdef int64_t RCVTIMEO_SLACK_NS = 2000000


cdef int conn_fail(rl_conn* c, int kind, const char* msg) noexcept nogil:
    c.err_kind = kind
    strncpy(c.err_msg, msg, ERR_MSG - 1)
    c.err_msg[ERR_MSG - 1] = 0
    return -1


cdef int conn_fail_with_reply(rl_conn* c) noexcept nogil:
    """Record the buffered top-level error reply as the failure (kind RL_EREPLY)."""
    return conn_fail_with_node(c, &c.nodes.items[0])


cdef int conn_fail_with_node(rl_conn* c, rl_node* top) noexcept nogil:
    """Record the error reply ``top`` (a node of the buffered reply) as the failure (RL_EREPLY)."""
    cdef size_t n = <size_t>top.ival if top.ival < ERR_MSG - 1 else ERR_MSG - 1
    memcpy(c.err_msg, c.r.data + top.off, n)
    c.err_msg[n] = 0
    c.err_kind = RL_EREPLY
    return -1


cdef void conn_drop(rl_conn* c) noexcept nogil:
    """Forget the socket. In a forked child this sends nothing: the parent still holds it."""
    if c.ssl != NULL:
        # Freed, not shut down: no close_notify, nothing written.
        rl_tls_free(c.ssl)
        c.ssl = NULL
    if c.fd >= 0:
        close(c.fd)
        c.fd = -1
    c.fd_blocking = 0
    c.rcvtimeo_ns = 0
    c.r.len = 0
    c.reply_len = 0


cdef void conn_free(rl_conn* c) noexcept nogil:
    conn_drop(c)
    rl_tls_ctx_free(c.tls_ctx)
    c.tls_ctx = NULL
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
    disco_release(c.disco)
    c.disco = NULL


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
                if conn_interrupted(c) < 0:
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


cdef int conn_interrupted(rl_conn* c) noexcept nogil:
    """After EINTR: let Python's signal handlers run; -1 (and dropped) when one raised."""
    if c.python_signals and run_signal_handlers() < 0:
        # The handler raised (KeyboardInterrupt...): the round trip is
        # abandoned, and with it the connection's place in the stream.
        conn_fail(c, RL_EINTERRUPTED, "interrupted")
        conn_drop(c)
        return -1
    return 0


cdef int run_signal_handlers() noexcept nogil:
    cdef int rc
    with gil:
        rc = check_signals_raw()
    return rc


cdef int conn_send(rl_conn* c, const char* data, size_t n, int64_t deadline) noexcept nogil:
    cdef size_t off = 0
    cdef ssize_t k
    if c.ssl != NULL:
        return tls_send(c, data, n, deadline)
    while off < n:
        k = send(c.fd, data + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT)
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


cdef ssize_t conn_try_send(rl_conn* c, const char* data, size_t n) noexcept nogil:
    """What the socket takes of ``data`` right now, without blocking (maybe 0), or -1.

    -1: the failure is recorded in ``c`` (and the connection dropped). What
    was not taken is sent later, by ``conn_send`` or another try.
    """
    cdef ssize_t k
    if c.ssl != NULL:
        return tls_try_send(c, data, n)
    while True:
        k = send(c.fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT)
        if k >= 0:
            return k
        if errno != EINTR:
            break
    if rl_would_block(errno):
        return 0
    return conn_io_error(c, errno, "writing to")


cdef Py_ssize_t conn_parse(rl_conn* c, size_t off) noexcept nogil:
    """What the bytes buffered from ``off`` on are; its nodes land in ``c.nodes``.

    The one place every reader (a call, a pipeline, the event loop's
    connection, the notice thread) asks: the length of a whole reply; 0
    while more of it is owed and less than MAX_REPLY bytes of it are
    buffered; or -1, the failure recorded on ``c`` and the connection
    dropped: a malformed reply, no memory, a reply past the cap, or an
    array past the element or depth limit (no buffer grows on the
    server's say-so).
    """
    cdef Py_ssize_t rc = resp_parse(c.r.data + off, c.r.len - off, &c.nodes)
    if rc > 0:
        return rc
    if rc == 0:
        if c.r.len - off < MAX_REPLY:
            return 0
        c.err_kind = RL_EPROTO
        snprintf(c.err_msg, ERR_MSG, "Protocol error: the server sent %zu bytes without ending "
                 "a reply, past the %d MiB cap on one reply", c.r.len - off, MAX_REPLY // 1048576)
    elif rc == -2:
        conn_fail(c, RL_ENOMEM, "out of memory parsing a reply")
    elif rc == RESP_PAST_LIMIT:
        c.err_kind = RL_EPROTO
        snprintf(c.err_msg, ERR_MSG, "Protocol error: the server sent an array of more than %d "
                 "elements or nested deeper than %d levels, past the limits on one reply",
                 <int>MAX_REPLY_ELEMENTS, <int>MAX_REPLY_DEPTH)
    else:
        conn_fail(c, RL_EPROTO, "Protocol error: the server sent a malformed reply")
    conn_drop(c)
    return -1


cdef int conn_read_reply(rl_conn* c, int64_t deadline) noexcept nogil:
    """Read until one whole reply is buffered; its nodes land in ``c.nodes``."""
    cdef Py_ssize_t rc
    cdef ssize_t k
    cdef int64_t now
    while True:
        if c.r.len > 0:
            rc = conn_parse(c, 0)
            if rc > 0:
                c.reply_len = <size_t>rc
                return 0
            if rc < 0:
                return -1
        if c.ssl != NULL:
            if tls_read_more(c, deadline) < 0:
                return -1
            continue
        if c.fd_blocking:
            # The reply is waited for in recv itself, one system call instead
            # of a poll and a read; SO_RCVTIMEO keeps it within the deadline
            # (give or take RCVTIMEO_SLACK_NS and the kernel's tick).
            now = rl_now_ns()
            if now >= deadline:
                return conn_timeout(c, "reading from")
            if c.rcvtimeo_ns == 0 or c.rcvtimeo_ns > deadline - now + RCVTIMEO_SLACK_NS \
                    or c.rcvtimeo_ns < (deadline - now) // 2:
                if rl_set_rcvtimeo(c.fd, deadline - now) < 0:
                    return conn_io_error(c, errno, "reading from")
                c.rcvtimeo_ns = deadline - now
        elif conn_wait(c, POLLIN, deadline, "reading from") < 0:
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
        elif errno == EINTR:
            if c.fd_blocking and conn_interrupted(c) < 0:
                return -1
        elif not rl_would_block(errno):
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
    if c.hello_len == 0:
        return 0
    if conn_send(c, c.hello, c.hello_len, deadline) < 0:
        return -1
    for i in range(c.hello_replies):
        if conn_read_reply(c, deadline) < 0:
            return -1
        if c.nodes.items[0].kind == c'-':
            conn_fail_with_reply(c)
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
        if c.tls_ctx != NULL and tls_start(c, deadline) < 0:
            return -1
        if conn_handshake(c, deadline) < 0:
            return -1
        if c.blocking_reads and c.ssl == NULL and rl_set_blocking(fd) == 0:
            c.fd_blocking = 1
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
            # Nothing is owed to us on an idle connection: readable means EOF
            # or junk (or, on TLS, maybe only TLS records of its own).
            if rl_ppoll(&pfd, 1, 0) != 0 and not tls_idle_input_ok(c):
                conn_drop(c)
    if c.fd < 0:
        return conn_connect(c, deadline)
    return 0


cdef int send_all(rl_conn* c, const char* data, size_t n, int64_t deadline,
                  void* ctx, bint first) noexcept nogil:
    """The plain ``rl_sender``: the whole command, before ``deadline``."""
    return conn_send(c, data, n, deadline)


cdef int conn_run_script(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                         rl_sender sender, void* ctx) noexcept nogil:
    """EVALSHA, and on NOSCRIPT one EVAL (which also loads the script), all before ``deadline``.

    The one NOSCRIPT fallback of the core: every Pool call runs its script
    through it. The EVALSHA is in ``c.w``; on NOSCRIPT
    its EVAL twin is built into ``c.e`` from ``cmd``, or, with ``cmd`` NULL,
    is there already. ``sender`` writes each command (``first`` for the
    EVALSHA): it returns 0 once sent, -1 with the failure recorded in ``c``,
    or another negative value of its own, which is returned as it is.
    On 0 the reply is buffered (``c.nodes``), a top-level error included.
    """
    cdef int rc
    if conn_ready(c, deadline) < 0:
        return -1
    rc = sender(c, c.w.data, c.w.len, deadline, ctx, True)
    if rc < 0:
        return rc
    if conn_read_reply(c, deadline) < 0:
        return -1
    if reply_is_noscript(c):
        conn_consume(c)
        if cmd != NULL and build_eval(&c.e, &c.w, cmd) < 0:
            return conn_fail(c, RL_ENOMEM, "out of memory encoding EVAL")
        rc = sender(c, c.e.data, c.e.len, deadline, ctx, False)
        if rc < 0:
            return rc
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
