# Cluster: the slot map from CLUSTER SLOTS, MOVED and ASK parsing (no GIL).
# Part of the discovery layer; shared state and helpers are in _discovery.pxi.
#
# Needs: _posix, _resp_parse, _conn, _discovery.

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
        # Every node of a TLS cluster speaks TLS, with the client's settings.
        t = ask_conn(c, &cand[i], c.hello, c.hello_len, c.hello_replies,
                     c.tls_ctx, c.tls_check_hostname)
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


cdef void slot_moved(rl_disco* d, int slot, const rl_addr* there) noexcept nogil:
    """A MOVED reply's news: ``slot`` is owned by ``there`` (the map is marked stale
    when ``there`` is not a known node, so it is read again)."""
    cdef int idx
    pthread_mutex_lock(&d.mu)
    idx = node_index(d, there.host, there.port)
    if idx >= 0:
        d.owner[slot] = <int16_t>idx
    else:
        d.stale = 1
    pthread_mutex_unlock(&d.mu)
