# Finding the server, without the GIL: the master a set of sentinels names,
# or the owner of a cluster slot. This file decides *which address* a
# connection opens before its TCP connect, and *what to do with a reply*
# once it is read (MOVED, ASK, READONLY...): the transport below it
# (_conn.pxi) is untouched but for a few hook points.
#
# One ``rl_disco`` per Target, shared by every connection made from it (the
# Pool slots and the keepers' own connections, each holding a reference): so
# one answer from the sentinels, or one CLUSTER SLOTS, serves them all. Its
# mutex guards the master address, the node table and the slot map; it is
# held only to copy a few bytes in or out, never across I/O, so a thread
# holding the GIL may block on it (see the lock discipline in _core.pyx).
# Every question asked (sentinels, CLUSTER SLOTS) goes over a short-lived
# connection of its own, under the deadline of the round trip it serves.

from libc.stdint cimport int16_t, uint16_t
from libc.stdlib cimport malloc
from libc.string cimport strcmp, strlen

from redis.sentinel import MasterNotFoundError as _RedisMasterNotFoundError


cdef extern from *:
    """
    static inline int64_t rl_add_fetch(int64_t *p, int64_t v) {
        return __atomic_add_fetch(p, v, __ATOMIC_ACQ_REL);
    }
    """
    int64_t rl_add_fetch(int64_t* p, int64_t v) noexcept nogil


# A failure kind beyond those of _conn.pxi: the sentinels named no master.
cdef enum:
    RL_ENOMASTER = 9

cdef enum:
    DISCO_SENTINEL = 1
    DISCO_CLUSTER = 2
    MAX_PEERS = 16        # sentinels, or cluster seed nodes, a Target remembers
    MAX_NODES = 64        # cluster nodes in the slot map's node table
    CLUSTER_SLOTS = 16384
    MAX_REDIRECTS = 5     # MOVED / ASK followed per round trip

# While connected, the sentinels are asked again at most this often whether
# the master is still the one they name (a failover that leaves the old
# master up and writable would otherwise go unnoticed until it is demoted).
cdef int64_t REVERIFY_NS = 1000000000
# Between attempts at a master or a slot owner that failed to answer.
cdef int64_t RETRY_PAUSE_NS = 50000000
# The least time one sentinel or node is given to answer a question.
cdef int64_t MIN_ASK_NS = 50000000

cdef const char* ROLE_CMD = b"*1\r\n$4\r\nROLE\r\n"
cdef const char* ASKING_CMD = b"*1\r\n$6\r\nASKING\r\n"
cdef const char* SLOTS_CMD = b"*2\r\n$7\r\nCLUSTER\r\n$5\r\nSLOTS\r\n"

_DISCOVERY_FEATURES = ("sentinel", "cluster")


cdef struct rl_addr:
    char host[256]
    int port


cdef struct rl_disco:
    int64_t refs           # atomic: the Target and every connection made from it
    int kind
    pthread_mutex_t mu     # guards everything from here on; never held across I/O
    # The peers asked: sentinels, or a cluster's seed nodes.
    int npeers
    int first_peer         # the one that answered last is asked first next time
    rl_addr peers[16]
    # Sentinel: what the sentinels are told first, and asked.
    char* s_hello
    size_t s_hello_len
    int s_hello_replies
    char* s_query          # SENTINEL get-master-addr-by-name <service>
    size_t s_query_len
    char service[200]
    # Sentinel: the master as the sentinels last named it.
    int master_known
    rl_addr master
    int64_t master_checked
    # Cluster: the slot map, node indexes into ``nodes`` (-1: not known).
    int stale
    int nnodes
    rl_addr nodes[64]
    int16_t owner[16384]


cdef void disco_release(void* p) noexcept nogil:
    cdef rl_disco* d = <rl_disco*>p
    if d == NULL:
        return
    if rl_add_fetch(&d.refs, -1) == 0:
        free(d.s_hello)
        free(d.s_query)
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
    if p == NULL or (<rl_disco*>p).kind != DISCO_CLUSTER or not keys:
        return -1
    return slot_of_object(keys[0])


def _key_slot(key):
    """The cluster slot of ``key`` (str or bytes), hash tags honoured. A test hook."""
    return slot_of_object(key)


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
                       int hello_replies) noexcept nogil:
    """A short-lived connection for one question (its hello borrowed); NULL when out of memory."""
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
    return t


cdef void ask_conn_free(rl_conn* t) noexcept nogil:
    t.hello = NULL          # borrowed
    t.hello_len = 0
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


# ---------------------------------------------------------------- Sentinel (no GIL)

cdef int sentinel_ask(rl_conn* c, rl_disco* d, int64_t deadline, rl_addr* out) noexcept nogil:
    """Ask the sentinels in turn for the master: 1 (in ``out``), 0 none named one, -1 stopped.

    On 0 the failure (kind RL_ENOMASTER, naming the service and what the last
    sentinel said) is recorded in ``c``.
    """
    cdef rl_conn* t
    cdef rl_node* items
    cdef int n, first, j, i
    cdef long long port
    cdef char why[300]
    cdef char text[200]
    cdef rl_addr peer
    strncpy(why, "no time left to ask", 299)
    pthread_mutex_lock(&d.mu)
    n = d.npeers
    first = d.first_peer
    pthread_mutex_unlock(&d.mu)
    for j in range(n):
        if rl_now_ns() >= deadline:
            break
        i = (first + j) % n
        peer = d.peers[i]      # peers never change after init
        t = ask_conn(c, &peer, d.s_hello, d.s_hello_len, d.s_hello_replies)
        if t == NULL:
            return -1
        if ask_peer(t, d.s_query, d.s_query_len, share_of(deadline, n - j)) < 0:
            if conn_stopped(t):
                c.err_kind = t.err_kind
                strncpy(c.err_msg, t.err_msg, ERR_MSG - 1)
                ask_conn_free(t)
                return -1
            snprintf(why, 300, "sentinel %s: %s", t.address, t.err_msg)
            ask_conn_free(t)
            continue
        items = t.nodes.items
        if (items[0].kind == c'*' and items[0].ival == 2 and t.nodes.len >= 3
                and items[1].kind == c'$' and items[2].kind == c'$'
                and items[1].ival > 0 and items[1].ival < 256
                and parse_ll(t.r.data + items[2].off, <size_t>items[2].ival, &port) == 0):
            reply_text(t, 1, out.host, 256)
            out.port = <int>port
            pthread_mutex_lock(&d.mu)
            d.first_peer = i
            pthread_mutex_unlock(&d.mu)
            ask_conn_free(t)
            return 1
        if items[0].kind == c'-':
            reply_text(t, 0, text, 200)
            snprintf(why, 300, "sentinel %s: %s", t.address, text)
        else:
            snprintf(why, 300, "sentinel %s does not know it", t.address)
        ask_conn_free(t)
    c.err_kind = RL_ENOMASTER
    snprintf(c.err_msg, ERR_MSG, "No master found for service '%s' (%s)", d.service, why)
    return 0


cdef void sentinel_forget(rl_disco* d, const rl_addr* a) noexcept nogil:
    """The master at ``a`` failed us: ask the sentinels before the next connect."""
    pthread_mutex_lock(&d.mu)
    if d.master_known and same_addr(&d.master, a):
        d.master_known = 0
    pthread_mutex_unlock(&d.mu)


cdef void disco_forget_master(void* p) noexcept nogil:
    """Forget the master whatever it was (the sentinels announced a switch)."""
    cdef rl_disco* d = <rl_disco*>p
    if d == NULL or d.kind != DISCO_SENTINEL:
        return
    pthread_mutex_lock(&d.mu)
    d.master_known = 0
    pthread_mutex_unlock(&d.mu)


cdef int check_role(rl_conn* c, int64_t deadline) noexcept nogil:
    """0 when ``ROLE`` says master (or cannot be asked), 1 when not (dropped), -1 on failure."""
    cdef rl_node* items
    cdef char role[32]
    if conn_send(c, ROLE_CMD, strlen(ROLE_CMD), deadline) < 0:
        return -1
    if conn_read_reply(c, deadline) < 0:
        return -1
    items = c.nodes.items
    if items[0].kind == c'*' and items[0].ival >= 1 and c.nodes.len >= 2 and items[1].kind == c'$':
        if items[1].ival == 6 and memcmp(c.r.data + items[1].off, b"master", 6) == 0:
            conn_consume(c)
            return 0
        reply_text(c, 1, role, 32)
        conn_consume(c)
        conn_drop(c)
        c.err_kind = RL_ECONN
        snprintf(c.err_msg, ERR_MSG, "%s is not a master (ROLE: %s)", c.address, role)
        return 1
    # An ACL user without ROLE: trust the sentinels.
    conn_consume(c)
    return 0


cdef int sentinel_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil:
    """Connect ``c`` to the master the sentinels name, a master by its own ``ROLE``."""
    cdef rl_addr cur, found
    cdef int known, rc
    cdef int64_t now, checked
    cdef char why[ERR_MSG]
    while True:
        now = rl_now_ns()
        pthread_mutex_lock(&d.mu)
        known = d.master_known
        cur = d.master
        checked = d.master_checked
        if known and now - checked >= REVERIFY_NS:
            d.master_checked = now      # this thread asks; the others carry on meanwhile
        pthread_mutex_unlock(&d.mu)
        if not known:
            rc = sentinel_ask(c, d, deadline, &found)
            if rc <= 0:
                return -1
            pthread_mutex_lock(&d.mu)
            d.master = found
            d.master_known = 1
            d.master_checked = rl_now_ns()
            pthread_mutex_unlock(&d.mu)
            cur = found
        elif now - checked >= REVERIFY_NS:
            # Still the master? A short look: a silent sentinel must not cost the round trip.
            rc = sentinel_ask(c, d, now + (deadline - now) // 4, &found)
            if rc < 0:
                return -1
            if rc == 1 and not same_addr(&found, &cur):
                pthread_mutex_lock(&d.mu)
                d.master = found
                d.master_known = 1
                pthread_mutex_unlock(&d.mu)
                cur = found
        conn_set_addr(c, &cur)
        conn_probe_idle(c)
        if c.fd >= 0:
            return 0
        rc = conn_connect(c, deadline)
        if rc == 0:
            rc = check_role(c, deadline)
            if rc == 0:
                return 0
        if conn_stopped(c):
            return -1
        conn_drop(c)
        sentinel_forget(d, &cur)
        if rl_now_ns() + RETRY_PAUSE_NS >= deadline:
            strncpy(why, c.err_msg, ERR_MSG - 1)
            why[ERR_MSG - 1] = 0
            snprintf(c.err_msg, ERR_MSG, "Service '%s': %s", d.service, why)
            return -1
        if disco_pause(c, RETRY_PAUSE_NS, deadline) < 0:
            return -1


# ---------------------------------------------------------------- Cluster (no GIL)

cdef int node_index(rl_disco* d, const char* host, int port) noexcept nogil:
    """The node table index of ``host:port``, added when new; -1 when the table is full. Locked."""
    cdef int i
    for i in range(d.nnodes):
        if d.nodes[i].port == port and strcmp(d.nodes[i].host, host) == 0:
            return i
    if d.nnodes == MAX_NODES:
        return -1
    strncpy(d.nodes[d.nnodes].host, host, 255)
    d.nodes[d.nnodes].host[255] = 0
    d.nodes[d.nnodes].port = port
    d.nnodes += 1
    return d.nnodes - 1


cdef size_t node_span(rl_nodes* nodes, size_t i) noexcept nogil:
    """The index just past the reply element that starts at ``i``."""
    cdef long long need = 1
    while need > 0 and i < nodes.len:
        if nodes.items[i].kind == c'*' and nodes.items[i].ival > 0:
            need += nodes.items[i].ival
        need -= 1
        i += 1
    return i


cdef int apply_slots(rl_disco* d, rl_conn* t) noexcept nogil:
    """Rebuild the slot map from a ``CLUSTER SLOTS`` reply in ``t``; -1 when it is not one."""
    cdef rl_nodes* nodes = &t.nodes
    cdef rl_node* items = nodes.items
    cdef size_t i = 1, end
    cdef long long k, s, lo, hi, port
    cdef int idx, owned = 0
    cdef char host[256]
    if items[0].kind != c'*' or items[0].ival < 1:
        return -1
    pthread_mutex_lock(&d.mu)
    d.nnodes = 0
    for s in range(CLUSTER_SLOTS):
        d.owner[s] = -1
    for k in range(items[0].ival):
        end = node_span(nodes, i)
        # [start, end, [host, port, id, ...], replicas...]
        if (items[i].kind == c'*' and items[i].ival >= 3 and i + 5 < nodes.len
                and items[i + 1].kind == c':' and items[i + 2].kind == c':'
                and items[i + 3].kind == c'*' and items[i + 3].ival >= 2
                and items[i + 4].kind == c'$' and items[i + 5].kind == c':'):
            lo = items[i + 1].ival
            hi = items[i + 2].ival
            port = items[i + 5].ival
            if items[i + 4].ival > 0 and items[i + 4].ival < 256:
                reply_text(t, i + 4, host, 256)
            else:
                strncpy(host, t.host, 255)   # "": the node we asked
                host[255] = 0
            idx = node_index(d, host, <int>port)
            if idx >= 0 and 0 <= lo <= hi < CLUSTER_SLOTS:
                for s in range(lo, hi + 1):
                    d.owner[s] = <int16_t>idx
                owned += 1
        i = end
    d.stale = 0 if owned else 1
    pthread_mutex_unlock(&d.mu)
    return 0 if owned else -1


cdef int cluster_refresh(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil:
    """Ask the known nodes, then the seeds, for ``CLUSTER SLOTS``; -1 when none answered."""
    cdef rl_addr* cand = <rl_addr*>malloc((MAX_NODES + MAX_PEERS) * sizeof(rl_addr))
    cdef int n = 0, i
    cdef rl_conn* t
    cdef char why[300]
    if cand == NULL:
        return conn_fail(c, RL_ENOMEM, "out of memory")
    strncpy(why, "no time left to ask", 299)
    pthread_mutex_lock(&d.mu)
    for i in range(d.nnodes):
        cand[n] = d.nodes[i]
        n += 1
    for i in range(d.npeers):
        cand[n] = d.peers[i]
        n += 1
    pthread_mutex_unlock(&d.mu)
    for i in range(n):
        if rl_now_ns() >= deadline:
            break
        t = ask_conn(c, &cand[i], c.hello, c.hello_len, c.hello_replies)
        if t == NULL:
            free(cand)
            return -1
        if ask_peer(t, SLOTS_CMD, strlen(SLOTS_CMD), share_of(deadline, n - i)) == 0:
            if apply_slots(d, t) == 0:
                ask_conn_free(t)
                free(cand)
                return 0
            snprintf(why, 300, "%s answered CLUSTER SLOTS with no slot", t.address)
        elif conn_stopped(t):
            c.err_kind = t.err_kind
            strncpy(c.err_msg, t.err_msg, ERR_MSG - 1)
            ask_conn_free(t)
            free(cand)
            return -1
        else:
            snprintf(why, 300, "%s: %s", t.address, t.err_msg)
        ask_conn_free(t)
    free(cand)
    c.err_kind = RL_ECONN
    snprintf(c.err_msg, ERR_MSG, "Cluster: no node answered CLUSTER SLOTS (%s)", why)
    return -1


cdef void cluster_forget(rl_disco* d) noexcept nogil:
    pthread_mutex_lock(&d.mu)
    d.stale = 1
    pthread_mutex_unlock(&d.mu)


cdef int cluster_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil:
    """Connect ``c`` to the owner of its slot (any node for a keyless command)."""
    cdef rl_addr a
    cdef int need, idx, found
    cdef int refreshed
    while True:
        pthread_mutex_lock(&d.mu)
        need = d.stale or d.nnodes == 0 or (c.slot >= 0 and d.owner[c.slot] < 0)
        pthread_mutex_unlock(&d.mu)
        refreshed = 0
        if need:
            if cluster_refresh(c, d, deadline) < 0:
                if conn_stopped(c):
                    return -1
            else:
                refreshed = 1
        found = 0
        pthread_mutex_lock(&d.mu)
        idx = d.owner[c.slot] if c.slot >= 0 else (0 if d.nnodes > 0 else -1)
        if idx >= 0:
            a = d.nodes[idx]
            found = 1
        elif c.slot < 0:
            a = d.peers[0]
            found = 1
        pthread_mutex_unlock(&d.mu)
        if not found:
            if not need or refreshed:
                c.err_kind = RL_ECONN
                snprintf(c.err_msg, ERR_MSG, "Cluster: no node serves slot %d", c.slot)
            return -1
        conn_set_addr(c, &a)
        conn_probe_idle(c)
        if c.fd >= 0:
            return 0
        if conn_connect(c, deadline) == 0:
            return 0
        if conn_stopped(c):
            return -1
        cluster_forget(d)
        if rl_now_ns() + RETRY_PAUSE_NS >= deadline:
            return -1
        if disco_pause(c, RETRY_PAUSE_NS, deadline) < 0:
            return -1


cdef int parse_redirect(rl_conn* c, size_t skip, int* slot, rl_addr* out) noexcept nogil:
    """``<slot> <host>:<port>`` after the first ``skip`` bytes of the error reply; -1 if not."""
    cdef rl_node* top = &c.nodes.items[0]
    cdef const char* p = c.r.data + top.off + skip
    cdef size_t n = <size_t>top.ival - skip if <size_t>top.ival > skip else 0
    cdef size_t i = 0, sp, colon = 0
    cdef long long v
    while i < n and p[i] != c' ':
        i += 1
    if i == 0 or i >= n or parse_ll(p, i, &v) < 0 or v < 0 or v >= CLUSTER_SLOTS:
        return -1
    slot[0] = <int>v
    sp = i + 1
    for i in range(sp, n):
        if p[i] == c':':
            colon = i
    if colon == 0 or parse_ll(p + colon + 1, n - colon - 1, &v) < 0 or colon - sp >= 256:
        return -1
    out.port = <int>v
    if colon == sp:
        strncpy(out.host, c.host, 255)    # unknown endpoint: the node that answered
        out.host[255] = 0
    else:
        memcpy(out.host, p + sp, colon - sp)
        out.host[colon - sp] = 0
    return 0


# ---------------------------------------------------------------- one routed round trip (no GIL)

cdef enum:
    REPLY_DONE = 0
    REPLY_MOVED = 1
    REPLY_ASK = 2
    REPLY_RETRY = 3       # not executed, the server is not (yet) the one: ask again, resend


cdef bint reply_starts(rl_conn* c, const char* prefix) noexcept nogil:
    cdef rl_node* top = &c.nodes.items[0]
    cdef size_t n = strlen(prefix)
    return <size_t>top.ival >= n and memcmp(c.r.data + top.off, prefix, n) == 0


cdef int classify_reply(rl_conn* c, rl_disco* d) noexcept nogil:
    if c.nodes.items[0].kind != c'-':
        return REPLY_DONE
    if d.kind == DISCO_CLUSTER:
        if reply_starts(c, b"MOVED "):
            return REPLY_MOVED
        if reply_starts(c, b"ASK "):
            return REPLY_ASK
        if reply_starts(c, b"CLUSTERDOWN") or reply_starts(c, b"TRYAGAIN"):
            return REPLY_RETRY
    if reply_starts(c, b"READONLY") or reply_starts(c, b"MASTERDOWN") or reply_starts(c, b"LOADING"):
        return REPLY_RETRY
    return REPLY_DONE


cdef int send_command(rl_conn* c, const char* data, size_t n, int64_t deadline,
                      rl_sender sender, void* ctx, bint script, bint first) noexcept nogil:
    if script:
        return sender(c, data, n, deadline, ctx, first)
    return conn_send(c, data, n, deadline)


cdef int run_asking(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                    rl_sender sender, void* ctx, bint script, const rl_addr* node) noexcept nogil:
    """``ASKING`` and the command, pipelined on a connection to ``node`` (EVAL on NOSCRIPT)."""
    cdef int rc, attempt
    cdef bint noscript = False
    conn_set_addr(c, node)
    conn_probe_idle(c)
    if c.fd < 0 and conn_connect(c, deadline) < 0:
        return -1
    for attempt in range(2):
        if conn_send(c, ASKING_CMD, strlen(ASKING_CMD), deadline) < 0:
            return -1
        if attempt == 0:
            rc = send_command(c, c.w.data, c.w.len, deadline, sender, ctx, script, True)
        else:
            rc = send_command(c, c.e.data, c.e.len, deadline, sender, ctx, script, False)
        if rc != 0:
            conn_drop(c)          # ASKING's reply is owed and nobody will read it
            return rc
        if conn_read_reply(c, deadline) < 0:
            return -1
        if c.nodes.items[0].kind == c'-':
            conn_fail_with_reply(c)
            conn_drop(c)
            return -1
        conn_consume(c)
        if conn_read_reply(c, deadline) < 0:
            return -1
        noscript = script and reply_is_noscript(c)
        if not noscript:
            break
        conn_consume(c)
        if cmd != NULL and build_eval(&c.e, &c.w, cmd) < 0:
            return conn_fail(c, RL_ENOMEM, "out of memory encoding EVAL")
    c.last_used = rl_now_ns()
    return 0


cdef int route_run(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                   rl_sender sender, void* ctx, bint script) noexcept nogil:
    """One round trip of the command in ``c.w`` (a script when ``script``), wherever it belongs.

    With a fixed address this is conn_run_script / conn_run_command. Through
    sentinels or on a cluster, the connection is first pointed at the master
    or at its slot's owner (asking the sentinels, or for CLUSTER SLOTS, when
    not known), and replies that say the command was not executed there are
    followed: MOVED (the map is updated, the command resent to the owner),
    ASK (``ASKING`` + the command to that node, once), and READONLY,
    MASTERDOWN, LOADING, CLUSTERDOWN, TRYAGAIN (the master is looked up
    again and the command resent, until the deadline). A command that may
    have executed is never resent: a connection lost after the send fails
    the round trip (and makes the next one look the server up again).
    Returns as conn_run_script does.
    """
    cdef rl_disco* d = <rl_disco*>c.disco
    cdef rl_addr here, there
    cdef int rc, what, redirects = 0, slot, idx
    cdef bint asking = False
    if d == NULL:
        if script:
            return conn_run_script(c, deadline, cmd, sender, ctx)
        return conn_run_command(c, deadline)
    while True:
        if asking:
            asking = False
            rc = run_asking(c, deadline, cmd, sender, ctx, script, &there)
        else:
            if d.kind == DISCO_SENTINEL:
                rc = sentinel_prepare(c, d, deadline)
            else:
                rc = cluster_prepare(c, d, deadline)
            if rc == 0:
                if script:
                    rc = conn_run_script(c, deadline, cmd, sender, ctx)
                else:
                    rc = conn_run_command(c, deadline)
        if rc != 0:
            if rc == -1 and c.fd < 0 and not conn_stopped(c):
                conn_addr(c, &here)
                if d.kind == DISCO_SENTINEL:
                    sentinel_forget(d, &here)
                else:
                    cluster_forget(d)
            return rc
        what = classify_reply(c, d)
        if what == REPLY_DONE:
            return 0
        if what == REPLY_MOVED or what == REPLY_ASK:
            redirects += 1
            if redirects > MAX_REDIRECTS:
                return 0
            if parse_redirect(c, 6 if what == REPLY_MOVED else 4, &slot, &there) < 0:
                return 0
            conn_consume(c)
            if what == REPLY_MOVED:
                pthread_mutex_lock(&d.mu)
                idx = node_index(d, there.host, there.port)
                if idx >= 0:
                    d.owner[slot] = <int16_t>idx
                else:
                    d.stale = 1
                pthread_mutex_unlock(&d.mu)
                conn_set_addr(c, &there)
            else:
                asking = True
            continue
        # REPLY_RETRY: not executed; look the server up again, then resend.
        if rl_now_ns() + RETRY_PAUSE_NS >= deadline:
            return 0
        conn_consume(c)
        conn_addr(c, &here)
        conn_drop(c)
        if d.kind == DISCO_SENTINEL:
            sentinel_forget(d, &here)
        else:
            cluster_forget(d)
        if disco_pause(c, RETRY_PAUSE_NS, deadline) < 0:
            return -1
