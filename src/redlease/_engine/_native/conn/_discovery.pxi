# Finding the server, without the GIL: the master a set of sentinels names,
# or the owner of a cluster slot. This file decides *which address* a
# connection opens before its TCP connect, and *what to do with a reply*
# once it is read (MOVED, ASK, READONLY...): the transport below it
# (_conn.pxi) is untouched but for a few hook points.
#
# One ``rl_disco`` per Target, shared by every connection made from it (the
# Pool slots and the renewer's connections, each holding a reference): so
# one answer from the sentinels, or one CLUSTER SLOTS, serves them all. Its
# mutex guards the master address, the node table and the slot map; it is
# held only to copy a few bytes in or out, never across I/O, so a thread
# holding the GIL may block on it (see the lock discipline in _core.pyx).
# Every question asked (sentinels, CLUSTER SLOTS) goes over a short-lived
# connection of its own, under the deadline of the round trip it serves.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _tls; _pool (exceptions).

from libc.stdint cimport uint16_t
from libc.stdlib cimport malloc
from libc.string cimport strcmp, strlen, strncmp

from redis.sentinel import MasterNotFoundError as _RedisMasterNotFoundError


cdef extern from *:
    """
    static inline int64_t rl_add_fetch(int64_t *p, int64_t v) {
        return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL);
    }
    """
    int64_t rl_add_fetch(int64_t* p, int64_t v) noexcept nogil


# While connected, the sentinels are asked again at most this often whether
# the master is still the one they name (a failover that leaves the old
# master up and writable would otherwise go unnoticed until it is demoted).
cdef int64_t REVERIFY_NS = 1000000000
# Between attempts at a master or a slot owner that failed to answer, and
# before the one resend of a call the server did not run (timing.RESEND_PAUSE).
cdef int64_t RETRY_PAUSE_NS = _timing.ns(_timing.RESEND_PAUSE)
# The least time one sentinel or node is given to answer a question.
cdef int64_t MIN_ASK_NS = 50000000

cdef const char* ROLE_CMD = b"*1\r\n$4\r\nROLE\r\n"
cdef const char* ASKING_CMD = b"*1\r\n$6\r\nASKING\r\n"
cdef const char* SLOTS_CMD = b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n"

_DISCOVERY_FEATURES = ("sentinel", "cluster")


cdef void disco_release(void* p) noexcept nogil:
    cdef rl_disco* d = <rl_disco*>p
    if d == NULL:
        return
    if rl_add_fetch(&d.refs, -1) == 0:
        free(d.s_hello)
        free(d.s_query)
        rl_tls_ctx_free(d.s_tls_ctx)
        pthread_mutex_destroy(&d.mu)
        free(d)


cdef void disco_attach(rl_conn* c, void* p) noexcept nogil:
    """Give a connection its (shared) way of finding the server; called once, at init."""
    c.slot = -1
    if p != NULL:
        rl_add_fetch(&(<rl_disco*>p).refs, 1)
        c.port = -1         # no address until the sentinels or the slot map give one
    c.disco = p


cdef void disco_after_fork(void* p) noexcept nogil:
    cdef rl_disco* d = <rl_disco*>p
    if d != NULL:
        # The thread that held it does not exist in the child.
        pthread_mutex_init(&d.mu, NULL)


# ---------------------------------------------------------------- building it (GIL held)

cdef int set_addr(rl_addr* a, object host, object port) except -1:
    cdef bytes h = str(host).encode("idna")
    if len(h) >= 256:
        raise ValueError("host name too long")
    memset(a.host, 0, 256)
    memcpy(a.host, PyBytes_AS_STRING(h), <size_t>len(h))
    a.port = int(port)
    return 0


cdef char* copy_bytes(bytes b) except? NULL:
    cdef char* p
    if not b:
        return NULL
    p = <char*>malloc(<size_t>len(b))
    if p == NULL:
        raise MemoryError()
    memcpy(p, PyBytes_AS_STRING(b), <size_t>len(b))
    return p


cdef bytes encode_commands(list commands):
    cdef rl_buf b
    memset(&b, 0, sizeof(b))
    try:
        for command in commands:
            put_command(&b, command)
        return PyBytes_FromStringAndSize(b.data, <Py_ssize_t>b.len) if b.len else b""
    finally:
        buf_free(&b)


cdef void* disco_from_endpoint(object endpoint) except? NULL:
    """The shared discovery state for an endpoint of kind sentinel or cluster; NULL for direct."""
    cdef rl_disco* d
    cdef int i
    cdef bytes hello, query, service
    kind = getattr(endpoint, "kind", "direct")
    if kind == "direct":
        return NULL
    if kind == "sentinel":
        peers = list(endpoint.sentinels.addresses)
    elif kind == "cluster":
        peers = list(endpoint.cluster_nodes)
    else:
        raise ValueError(f"unknown endpoint kind {kind!r}")
    if not peers:
        raise ValueError(f"a {kind} endpoint needs at least one address")
    d = <rl_disco*>calloc(1, sizeof(rl_disco))
    if d == NULL:
        raise MemoryError()
    d.refs = 1
    pthread_mutex_init(&d.mu, NULL)
    try:
        d.kind = DISCO_SENTINEL if kind == "sentinel" else DISCO_CLUSTER
        for i in range(CLUSTER_SLOTS):
            d.owner[i] = -1
        for host, port in peers[:MAX_PEERS]:
            set_addr(&d.peers[d.npeers], host, port)
            d.npeers += 1
        if d.kind == DISCO_SENTINEL:
            s = endpoint.sentinels
            commands = []
            if s.username or s.password:
                commands.append(
                    ["AUTH", s.username, s.password or ""] if s.username else ["AUTH", s.password]
                )
            hello = encode_commands(commands)
            d.s_hello = copy_bytes(hello)
            d.s_hello_len = <size_t>len(hello)
            d.s_hello_replies = len(commands)
            query = encode_commands([["SENTINEL", "get-master-addr-by-name", s.service]])
            d.s_query = copy_bytes(query)
            d.s_query_len = <size_t>len(query)
            service = str(s.service).encode("utf-8", "replace")[:199]
            memcpy(d.service, PyBytes_AS_STRING(service), <size_t>len(service))
            # The sentinels may speak TLS with settings of their own
            # (redis-py's sentinel_kwargs), apart from the master's.
            if s.tls is not None:
                d.s_tls_ctx = make_tls_context(s.tls)
                d.s_check_hostname = (
                    1 if s.tls.check_hostname and str(s.tls.cert_reqs) != "none" else 0
                )
        else:
            d.stale = 1
    except BaseException:
        disco_release(d)
        raise
    return d


cdef str disco_describe(void* p):
    """How the server is found, for messages: ``sentinel:<service>``, ``cluster:<seed>``."""
    cdef rl_disco* d = <rl_disco*>p
    if d.kind == DISCO_SENTINEL:
        return "sentinel:" + d.service.decode("utf-8", "replace")
    return f"cluster:{d.peers[0].host.decode('utf-8', 'replace')}:{d.peers[0].port}"


# ---------------------------------------------------------------- slots (no GIL)

cdef uint16_t crc16_xmodem(const unsigned char* p, size_t n) noexcept nogil:
    cdef uint16_t crc = 0
    cdef size_t i
    cdef int bit
    for i in range(n):
        crc = crc ^ (<uint16_t>p[i] << 8)
        for bit in range(8):
            if crc & 0x8000:
                crc = <uint16_t>((crc << 1) ^ 0x1021)
            else:
                crc = <uint16_t>(crc << 1)
    return crc


cdef int key_slot(const char* key, size_t n) noexcept nogil:
    """The cluster slot of a key: CRC16 of its hash tag (a non-empty ``{...}``) or of all of it."""
    cdef size_t s, e
    for s in range(n):
        if key[s] == c'{':
            for e in range(s + 1, n):
                if key[e] == c'}':
                    if e > s + 1:
                        return crc16_xmodem(<const unsigned char*>key + s + 1, e - s - 1) & 16383
                    break
            break
    return crc16_xmodem(<const unsigned char*>key, n) & 16383


cdef int slot_of_object(object key) except -1:
    cdef bytes b
    if isinstance(key, str):
        b = (<str>key).encode("utf-8")
    elif isinstance(key, bytes):
        b = key
    else:
        b = bytes(key)
    return key_slot(PyBytes_AS_STRING(b), <size_t>PyBytes_GET_SIZE(b))


cdef int disco_slot_for(void* p, object keys) except -2:
    """The slot a command with ``keys`` goes to: its first key's; -1 off a cluster or keyless."""
    return command_slot(p, keys, None)


cdef int command_slot(void* p, object keys, object slot) except -2:
    """The slot a command with ``keys`` goes to: every command's one way to its slot.

    ``slot`` is None (not known: the first key is hashed here) or the slot of
    ``keys[0]``, computed once by whoever makes many commands for it (a
    fence, for every write of its name). -1 off a cluster or keyless, given or not.
    """
    cdef int known
    if p == NULL or (<rl_disco*>p).kind != DISCO_CLUSTER or not keys:
        return -1
    if slot is None:
        return slot_of_object(keys[0])
    known = slot
    if known < 0 or known > 16383:
        raise ValueError(f"a cluster slot is 0 to 16383, got {known}")
    return known


# ---------------------------------------------------------------- helpers (no GIL)

cdef bint same_addr(const rl_addr* a, const rl_addr* b) noexcept nogil:
    return a.port == b.port and strcmp(a.host, b.host) == 0


cdef void conn_set_addr(rl_conn* c, const rl_addr* a) noexcept nogil:
    """Point the connection at ``a``; an open socket to somewhere else is dropped."""
    if c.port == a.port and strcmp(c.host, a.host) == 0:
        return
    conn_drop(c)
    strncpy(c.host, a.host, 255)
    c.host[255] = 0
    c.port = a.port
    c.is_unix = 0
    c.naddrs = 0
    snprintf(c.address, 300, "%s:%d", c.host, c.port)


cdef void conn_addr(rl_conn* c, rl_addr* out) noexcept nogil:
    strncpy(out.host, c.host, 255)
    out.host[255] = 0
    out.port = c.port


cdef void conn_probe_idle(rl_conn* c) noexcept nogil:
    """Drop a connection the server closed while it sat idle (as conn_ready does)."""
    cdef pollfd pfd
    if c.fd >= 0 and rl_now_ns() - c.last_used > IDLE_PROBE_NS:
        pfd.fd = c.fd
        pfd.events = POLLIN
        pfd.revents = 0
        if rl_ppoll(&pfd, 1, 0) != 0:
            conn_drop(c)


cdef bint conn_stopped(rl_conn* c) noexcept nogil:
    return c.err_kind == RL_ECANCELLED or c.err_kind == RL_EINTERRUPTED


cdef int disco_pause(rl_conn* c, int64_t ns, int64_t deadline) noexcept nogil:
    """Sleep ``ns`` (not past ``deadline``); -1 when cancelled or interrupted meanwhile."""
    cdef pollfd pfd
    cdef int64_t until = rl_now_ns() + ns
    cdef int64_t now
    cdef int rc
    if until > deadline:
        until = deadline
    while True:
        now = rl_now_ns()
        if now >= until:
            return 0
        pfd.fd = c.cancel_fd
        pfd.events = POLLIN
        pfd.revents = 0
        rc = rl_ppoll(&pfd, 1 if c.cancel_fd >= 0 else 0, until - now)
        if rc > 0:
            conn_fail(c, RL_ECANCELLED, "cancelled")
            conn_drop(c)
            return -1
        if rc < 0 and errno == EINTR and c.python_signals and run_signal_handlers() < 0:
            conn_fail(c, RL_EINTERRUPTED, "interrupted")
            conn_drop(c)
            return -1


cdef rl_conn* ask_conn(rl_conn* c, const rl_addr* a, char* hello, size_t hello_len,
                       int hello_replies, void* tls_ctx, int check_hostname) noexcept nogil:
    """A short-lived connection for one question; NULL when out of memory.

    Its hello and its TLS context (NULL: plain) are borrowed from whoever
    outlives it: the asking connection, or the shared discovery state.
    """
    cdef rl_conn* t = <rl_conn*>calloc(1, sizeof(rl_conn))
    if t == NULL:
        conn_fail(c, RL_ENOMEM, "out of memory")
        return NULL
    t.fd = -1
    t.slot = -1
    t.cancel_fd = c.cancel_fd
    t.python_signals = c.python_signals
    t.port = -1
    conn_set_addr(t, a)
    t.hello = hello
    t.hello_len = hello_len
    t.hello_replies = hello_replies
    t.tls_ctx = tls_ctx
    t.tls_check_hostname = check_hostname
    return t


cdef void ask_conn_free(rl_conn* t) noexcept nogil:
    t.hello = NULL          # borrowed
    t.hello_len = 0
    conn_drop(t)            # while its borrowed context is still set: frees the SSL
    t.tls_ctx = NULL        # borrowed
    conn_free(t)
    free(t)


cdef int64_t share_of(int64_t deadline, int left) noexcept nogil:
    """The deadline of one of ``left`` peers still to ask: an even share of the time left."""
    cdef int64_t now = rl_now_ns()
    cdef int64_t budget = (deadline - now) // (left if left > 0 else 1)
    if budget < MIN_ASK_NS:
        budget = MIN_ASK_NS
    return now + budget if now + budget < deadline else deadline


cdef int ask_peer(rl_conn* t, const char* cmd, size_t n, int64_t deadline) noexcept nogil:
    if conn_connect(t, deadline) < 0:
        return -1
    if conn_send(t, cmd, n, deadline) < 0:
        return -1
    return conn_read_reply(t, deadline)


cdef void reply_text(rl_conn* t, size_t i, char* out, size_t cap) noexcept nogil:
    cdef rl_node* node = &t.nodes.items[i]
    cdef size_t n = <size_t>node.ival if node.ival > 0 else 0
    if n > cap - 1:
        n = cap - 1
    memcpy(out, t.r.data + node.off, n)
    out[n] = 0
