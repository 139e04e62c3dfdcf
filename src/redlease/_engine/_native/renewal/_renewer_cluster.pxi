# The shared renewer on a Redis Cluster: one connection per node that owns
# the slot of some lease (an rl_rnode each), every renewal of a batch routed
# to its slot's owner, MOVED and ASK followed per lease, one write per node
# and the replies read from whichever node answers first (cluster_round,
# which the thread's main loop calls with mu held). No GIL, ever.
#
# Needs: _posix, _resp_parse, _conn, _discovery, _cluster, _replies, _lease, _renewer_heap.

# ---------------------------------------------------------------- on a cluster

# A lease's renewal goes to the node that owns its key's slot, over that
# node's one connection. A batch is grouped by node: one write per node, and
# the replies are read from whichever node answers first, each node's under
# the deadline of its own leases, so a slow or dead node holds up only the
# renewals on it (for at most one round trip's bound; see cluster_round).

cdef int rnode_find(rl_renewer* r, const rl_addr* a) noexcept nogil:
    """The index of the node connection to ``a``, taking a free one when new; -1 if none is left."""
    cdef int i, free_at = -1, idle_at = -1
    cdef rl_rnode* n
    for i in range(RENEW_NODES_MAX):
        n = &r.nodes[i]
        if n.used:
            if n.conn.port == a.port and strcmp(n.conn.host, a.host) == 0:
                return i
            if idle_at < 0 and n.count == 0:
                idle_at = i
        elif free_at < 0:
            free_at = i
    if free_at < 0:
        # A node table this full means nodes went away: reuse an idle one.
        free_at = idle_at
    if free_at < 0:
        return -1
    n = &r.nodes[free_at]
    conn_set_addr(&n.conn, a)
    n.used = 1
    n.need_load = 1
    return free_at


cdef int64_t lease_trip_bound(rl_lease* l, int64_t now) noexcept nogil:
    # A round trip may never outlive a lease: its deadline, or one interval.
    cdef int64_t d = now + l.interval_ns
    return d if d < l.lease_deadline else l.lease_deadline


cdef void node_fail(rl_renewer* r, rl_rnode* n, int kind, const char* msg) noexcept nogil:
    """The leases of ``n`` still without a reply: a failed renewal (mu held)."""
    cdef size_t i
    cdef rl_lease* l
    cdef int64_t now = rl_now_ns()
    for i in range(n.first + n.done, n.first + n.count):
        l = r.batch[i]
        lease_failed(l, kind, msg, now)
        batch_release(r, l)
    n.done = n.count
    cluster_forget(<rl_disco*>r.conn.disco)


cdef int node_reply_buffered(rl_conn* c) noexcept nogil:
    """Whether a whole reply is already in ``c``'s buffer (parsed into its nodes)."""
    cdef Py_ssize_t rc
    if c.reply_len != 0 or c.r.len == 0:
        return 0
    rc = resp_parse(c.r.data, c.r.len, &c.nodes)
    if rc > 0:
        c.reply_len = <size_t>rc
        return 1
    return 0


cdef void node_take_reply(rl_renewer* r, rl_rnode* n) noexcept nogil:
    """Apply the buffered reply of ``n`` to what it answers (mu held)."""
    cdef rl_conn* c = &n.conn
    cdef rl_lease* l
    if n.loads_left > 0:
        n.loads_left -= 1
        if n.loads_left == 0:
            n.need_load = 0
        conn_consume(c)
        return
    l = r.batch[n.first + n.done]
    if l.asking == 1:
        # ASKING's own reply; the renewal's follows.
        l.asking = 2
        conn_consume(c)
        return
    n.done += call_apply_reply(r, n, n.first + n.done, c)
    conn_consume(c)
    if n.drop:
        # Whatever follows on this connection cannot be trusted (a reply of
        # the wrong shape), or is not the master's (a failover reply).
        n.drop = 0
        conn_drop(c)
        n.need_load = 1
        if n.done < n.count:
            node_fail(r, n, RL_ECONN, "connection dropped after a renewal reply it could not trust")


cdef void cluster_round(rl_renewer* r) noexcept nogil:
    """Renew the batch on a cluster (mu held on entry and on return; released for I/O)."""
    cdef rl_disco* d = <rl_disco*>r.conn.disco
    cdef rl_lease* l
    cdef rl_rnode* n
    cdef rl_addr a
    cdef pollfd fds[65]
    cdef int which[64]
    cdef size_t i, pos, total
    cdef int k, idx, own, need, nfds, rc, pending
    cdef int64_t now, bound, overall, wait_until_ns
    cdef char msg[ERR_MSG]
    now = rl_now_ns()
    overall = 0
    need = 0
    pthread_mutex_lock(&d.mu)
    need = d.stale or d.nnodes == 0
    for i in range(r.batch_len):
        l = r.batch[i]
        bound = lease_trip_bound(l, now)
        if overall == 0 or bound < overall:
            overall = bound
        if l.ask_node < 0 and l.slot >= 0 and d.owner[l.slot] < 0:
            need = 1
    pthread_mutex_unlock(&d.mu)
    if need:
        pthread_mutex_unlock(&r.mu)
        cluster_refresh(&r.conn, d, overall)
        pthread_mutex_lock(&r.mu)
        if r.stop:
            batch_fail(r, 0, RL_ECANCELLED, "cancelled")
            return
    # Route: every lease to the node connection of its slot's owner.
    for k in range(RENEW_NODES_MAX):
        n = &r.nodes[k]
        n.count = 0
        n.done = 0
        n.failed = 0
        n.drop = 0
        n.deadline = 0
    now = rl_now_ns()
    total = 0
    for i in range(r.batch_len):
        l = r.batch[i]
        idx = -1
        l.asking = 0
        if l.ask_node >= 0:
            idx = l.ask_node
            l.ask_node = -1
            l.asking = 1
        else:
            pthread_mutex_lock(&d.mu)
            own = d.owner[l.slot] if l.slot >= 0 else (0 if d.nnodes > 0 else -1)
            if own >= 0:
                a = d.nodes[own]
            pthread_mutex_unlock(&d.mu)
            if own >= 0:
                idx = rnode_find(r, &a)
        l.node = idx
        if idx < 0:
            snprintf(msg, ERR_MSG, "Cluster: no node serves slot %d (%s)", l.slot, r.conn.err_msg)
            lease_failed(l, RL_ECONN, msg, now)
            batch_release(r, l)
            continue
        n = &r.nodes[idx]
        n.count += 1
        bound = lease_trip_bound(l, now)
        if n.deadline == 0 or bound < n.deadline:
            n.deadline = bound
        r.sorted[total] = l
        total += 1
    # Group by node (stable), each node's leases one range of the batch.
    pos = 0
    for k in range(RENEW_NODES_MAX):
        n = &r.nodes[k]
        n.first = pos
        pos += n.count
        n.count = 0
    for i in range(total):
        l = r.sorted[i]
        n = &r.nodes[l.node]
        r.batch[n.first + n.count] = l
        n.count += 1
    r.batch_len = total
    # Connect where there is no connection yet (each under its own bound).
    pthread_mutex_unlock(&r.mu)
    for k in range(RENEW_NODES_MAX):
        n = &r.nodes[k]
        if n.count == 0:
            continue
        conn_probe_idle(&n.conn)
        if n.conn.fd < 0:
            n.need_load = 1
            if conn_connect(&n.conn, n.deadline) < 0:
                n.failed = 1
        if r.stop:
            break
    pthread_mutex_lock(&r.mu)
    # One write per node; the first part under the lock, so that once end()
    # has returned nothing more is sent for that term.
    for k in range(RENEW_NODES_MAX):
        n = &r.nodes[k]
        if n.count == 0:
            continue
        if r.stop:
            node_fail(r, n, RL_ECANCELLED, "cancelled")
            continue
        if n.failed:
            node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
            continue
        if renewals_encode(r, n.first, &n.count, n.need_load, &n.loads_left) < 0:
            conn_fail(&n.conn, RL_ENOMEM, "out of memory encoding renewals")
            node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
            continue
        if n.count == 0:
            continue
        if renewals_send(r, &n.conn, n.deadline) < 0:
            node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
            n.count = 0
            n.loads_left = 0
    # Read the replies as they come, from any node; each node's up to its bound.
    while True:
        now = rl_now_ns()
        nfds = 0
        pending = 0
        wait_until_ns = 0
        for k in range(RENEW_NODES_MAX):
            n = &r.nodes[k]
            if n.done >= n.count and n.loads_left == 0:
                continue
            if n.conn.fd < 0:
                node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
                n.loads_left = 0
                continue
            while (n.done < n.count or n.loads_left > 0) and node_reply_buffered(&n.conn):
                node_take_reply(r, n)
            if n.done >= n.count and n.loads_left == 0:
                continue
            if n.conn.fd < 0:
                continue  # dropped by its last reply; the rest failed already
            if now >= n.deadline:
                conn_timeout(&n.conn, "reading from")
                node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
                n.loads_left = 0
                continue
            pending += 1
            if wait_until_ns == 0 or n.deadline < wait_until_ns:
                wait_until_ns = n.deadline
            if n.conn.ssl != NULL:
                # TLS may hold a whole record already read: read it blockingly
                # (bounded by this node's deadline) rather than poll.
                pthread_mutex_unlock(&r.mu)
                rc = conn_read_reply(&n.conn, n.deadline)
                pthread_mutex_lock(&r.mu)
                if rc < 0:
                    node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
                    n.loads_left = 0
                else:
                    node_take_reply(r, n)
                continue
            fds[nfds].fd = n.conn.fd
            fds[nfds].events = POLLIN
            fds[nfds].revents = 0
            which[nfds] = k
            nfds += 1
        if pending == 0:
            break
        if nfds == 0:
            continue
        fds[nfds].fd = r.ctl_fd
        fds[nfds].events = POLLIN
        fds[nfds].revents = 0
        pthread_mutex_unlock(&r.mu)
        now = rl_now_ns()
        rc = rl_ppoll(fds, nfds + 1, wait_until_ns - now if wait_until_ns > now else 0)
        pthread_mutex_lock(&r.mu)
        if rc < 0 and errno != EINTR:
            rc = 0
        if fds[nfds].revents != 0 or r.stop:
            for k in range(RENEW_NODES_MAX):
                n = &r.nodes[k]
                if n.done < n.count:
                    node_fail(r, n, RL_ECANCELLED, "cancelled")
                n.loads_left = 0
            break
        for k in range(nfds):
            if fds[k].revents == 0:
                continue
            n = &r.nodes[which[k]]
            # Readable: what has arrived is read (a partial reply is waited
            # for, bounded by this node's deadline).
            pthread_mutex_unlock(&r.mu)
            rc = conn_read_reply(&n.conn, n.deadline)
            pthread_mutex_lock(&r.mu)
            if rc < 0:
                node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
                n.loads_left = 0
            else:
                node_take_reply(r, n)
    for k in range(RENEW_NODES_MAX):
        n = &r.nodes[k]
        n.count = 0
        n.done = 0
        if n.conn.fd >= 0:
            n.conn.last_used = rl_now_ns()
    r.batch_len = 0
