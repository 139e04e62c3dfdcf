# The shared renewer: ONE pthread and ONE connection renew every lease of an
# engine (elector terms and lock watchdogs alike). Leases wait in a timer heap
# keyed by their next renewal; the ones falling due together (within
# RENEW_WINDOW_NS) go out as one pipelined write and their replies are read in
# order. Each lease keeps its own deadline (send time of its last good renewal
# + ttl), its own token and state, its own errors and lateness figures: a reply
# of 0 ends that lease alone.
#
# No GIL, ever, and no Python object on the thread. Python reads token and
# state as atomics; everything else is guarded by the renewer's mutex ``mu``,
# which the thread never holds across a wait for the server (the lock
# discipline of _core.pyx): a Python thread may lock it with the GIL held.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _cluster, _replies, _pool, _pipeline (batch_prepare, batch_lost), _lease.

cimport cython

cdef extern from *:
    """
    #ifndef _GNU_SOURCE
    #define _GNU_SOURCE
    #endif
    #include <pthread.h>
    /* The renewer thread's name, as ps and /proc show it (at most 15 bytes). */
    static void rl_name_renewer_thread(void) {
    #if defined(__GLIBC__)
        pthread_setname_np(pthread_self(), "redlease-renew");
    #endif
    }
    """
    void rl_name_renewer_thread() noexcept nogil

cdef enum:
    RENEW_NODES_MAX = 64
    RENEW_BATCH_MAX = 512
    RENEW_SCRIPTS_MAX = 8

# Renewals due within this much of the earliest one are sent with it.
cdef int64_t RENEW_WINDOW_NS = 1000000
# After a failed renewal the next one waits at least this long (a refused
# connect fails at once; without a floor the thread would spin until the
# deadline). The lease deadline is unchanged by it.
cdef int64_t RENEW_RETRY_NS = 1000000


cdef struct rl_renewer:
    rl_conn conn
    pthread_t thread
    pthread_mutex_t mu
    pthread_cond_t cv
    int thread_started
    int stop
    int ctl_fd            # close() aborts a round trip in flight
    int need_load         # SCRIPT LOAD every script before the next batch
    int nscripts
    rl_buf loads[8]       # SCRIPT LOAD <source>, one per distinct script
    char shas[8][41]
    rl_lease** heap
    size_t heap_len
    size_t heap_cap
    rl_lease* batch[512]
    size_t batch_len
    rl_buf out
    int64_t changes       # bumped by every wake-up of any lease (atomic)
    int64_t sent_total    # renewals written (for tests and benchmarks)
    int64_t batches_total
    int saw_failover      # a reply of this batch said the server is no longer the master
    int saw_unexpected    # a reply of this batch had a shape the script cannot give
    # On a cluster: one connection per node that owns the slots of some lease.
    int cluster
    rl_rnode* nodes       # RENEW_NODES_MAX of them, made with the renewer
    rl_lease* sorted[512] # the batch grouped by node


cdef struct rl_rnode:
    rl_conn conn
    int used
    int need_load         # SCRIPT LOAD every script before the next renewals here
    int failed            # this batch: the connect failed
    int drop              # this batch: a reply said the connection cannot be trusted
    int loads_left        # SCRIPT LOAD replies still owed
    size_t first          # its leases are batch[first:first + count]
    size_t count
    size_t done           # how many of them had their reply
    int64_t deadline      # the earliest bound of its leases' round trip


# ---------------------------------------------------------------- lease helpers (mu held)

cdef inline int64_t lease_key(rl_lease* l) noexcept nogil:
    return l.next_send if l.next_send < l.lease_deadline else l.lease_deadline


# ---------------------------------------------------------------- the heap (mu held)

cdef inline void heap_set(rl_renewer* r, size_t i, rl_lease* l) noexcept nogil:
    r.heap[i] = l
    l.heap_idx = <int>i


cdef void heap_up(rl_renewer* r, size_t i) noexcept nogil:
    cdef rl_lease* l = r.heap[i]
    cdef size_t parent
    while i > 0:
        parent = (i - 1) // 2
        if lease_key(r.heap[parent]) <= lease_key(l):
            break
        heap_set(r, i, r.heap[parent])
        i = parent
    heap_set(r, i, l)


cdef void heap_down(rl_renewer* r, size_t i) noexcept nogil:
    cdef rl_lease* l = r.heap[i]
    cdef size_t child
    while True:
        child = 2 * i + 1
        if child >= r.heap_len:
            break
        if child + 1 < r.heap_len and lease_key(r.heap[child + 1]) < lease_key(r.heap[child]):
            child += 1
        if lease_key(l) <= lease_key(r.heap[child]):
            break
        heap_set(r, i, r.heap[child])
        i = child
    heap_set(r, i, l)


cdef int heap_push(rl_renewer* r, rl_lease* l) noexcept nogil:
    cdef size_t cap
    cdef rl_lease** grown
    if r.heap_len == r.heap_cap:
        cap = r.heap_cap * 2 if r.heap_cap else 64
        grown = <rl_lease**>realloc(r.heap, cap * sizeof(rl_lease*))
        if grown == NULL:
            return -1
        r.heap = grown
        r.heap_cap = cap
    heap_set(r, r.heap_len, l)
    r.heap_len += 1
    heap_up(r, r.heap_len - 1)
    return 0


cdef void heap_remove(rl_renewer* r, rl_lease* l) noexcept nogil:
    cdef size_t i
    cdef rl_lease* last
    if l.heap_idx < 0:
        return
    i = <size_t>l.heap_idx
    l.heap_idx = -1
    r.heap_len -= 1
    if i == r.heap_len:
        return
    last = r.heap[r.heap_len]
    heap_set(r, i, last)
    heap_up(r, i)
    if last.heap_idx == <int>i:
        heap_down(r, i)


cdef void heap_fix(rl_renewer* r, rl_lease* l) noexcept nogil:
    """Put ``l`` where its key says (pushing it when it is not in the heap)."""
    if l.heap_idx < 0:
        heap_push(r, l)
        return
    heap_up(r, <size_t>l.heap_idx)
    heap_down(r, <size_t>l.heap_idx)


cdef rl_lease* heap_pop(rl_renewer* r) noexcept nogil:
    cdef rl_lease* top = r.heap[0]
    heap_remove(r, top)
    return top


# ---------------------------------------------------------------- the thread

cdef void batch_release(rl_renewer* r, rl_lease* l) noexcept nogil:
    """``l`` is off the wire: back into the heap if its term runs on, freed if orphaned."""
    l.inflight = 0
    if l.detached:
        lease_free(l)
        return
    if not l.closed and rl_load(&l.state) == ST_ACTIVE:
        heap_fix(r, l)


cdef void lease_failed(rl_lease* l, int kind, const char* msg, int64_t now) noexcept nogil:
    """A failed renewal of ``l`` (mu held): tolerated until its deadline."""
    if l.gen == l.sent_gen and rl_load(&l.state) == ST_ACTIVE and not l.closed:
        # The failure is reported even when it ends the lease, as a
        # keeper of its own reports the round trip its deadline cut short.
        lease_record_error(l, kind, msg)
        if now >= l.lease_deadline:
            lease_lose(l)
        else:
            lease_wake(l)
            l.next_send = l.sched + l.interval_ns
            if l.next_send < now + RENEW_RETRY_NS:
                l.next_send = now + RENEW_RETRY_NS


cdef void batch_fail(rl_renewer* r, size_t first, int kind, const char* msg) noexcept nogil:
    """Every lease of the batch from ``first`` on: a failed renewal (mu held)."""
    cdef size_t i
    cdef rl_lease* l
    cdef int64_t now = rl_now_ns()
    for i in range(first, r.batch_len):
        l = r.batch[i]
        lease_failed(l, kind, msg, now)
        batch_release(r, l)
    r.batch_len = 0


cdef void lease_renewed(rl_lease* l) noexcept nogil:
    """A reply of 1 (mu held): the lease runs to its send time + ttl."""
    cdef int64_t now
    if l.t_send + l.ttl_ns > l.lease_deadline:
        rl_store(&l.lease_deadline, l.t_send + l.ttl_ns)
    rl_store(&l.renewed_at, l.t_send)
    rl_store(&l.renewals, rl_load(&l.renewals) + 1)
    l.redirects = 0
    l.next_send = l.sched + l.interval_ns
    now = rl_now_ns()
    if l.next_send < now:
        l.next_send = now


cdef void lease_unexpected(rl_lease* l, rl_conn* c) noexcept nogil:
    """A reply the renew script cannot give (mu held): an error, and the stream is not trusted."""
    cdef char msg[ERR_MSG]
    reply_describe(c, "renew", "0 or 1", msg, ERR_MSG)
    lease_failed(l, RL_EUNEXPECTED, msg, rl_now_ns())


cdef void lease_apply_reply(rl_renewer* r, rl_lease* l, rl_conn* c) noexcept nogil:
    """The buffered reply to ``l``'s renewal (mu held)."""
    cdef rl_node* top = &c.nodes.items[0]
    cdef int what
    if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
        return
    what = reply_class(c, EXPECT_0_OR_1)
    if what == REPLY_DONE:
        if top.ival == 1:
            lease_renewed(l)
        else:
            lease_lose(l)
        return
    if what == REPLY_UNEXPECTED:
        lease_unexpected(l, c)
        r.saw_unexpected = 1
        return
    if reply_is_noscript(c):
        # The server lost its scripts (SCRIPT FLUSH, a restart): load them
        # and send this renewal again at once; not a failed renewal.
        r.need_load = 1
        l.next_send = rl_now_ns()
        return
    conn_fail_with_reply(c)
    if what == REPLY_FAILOVER:
        # READONLY / MASTERDOWN / NOREPLICAS: this server is no longer the
        # master the lease was granted on; the term ends now, not at its
        # deadline.
        lease_record_error(l, c.err_kind, c.err_msg)
        lease_lose(l)
        r.saw_failover = 1
        return
    lease_failed(l, c.err_kind, c.err_msg, rl_now_ns())


cdef void renewer_lost(rl_renewer* r) noexcept nogil:
    """After a failed round trip behind Sentinel: the next connect asks the sentinels."""
    batch_lost(&r.conn, <rl_disco*>r.conn.disco)


cdef void renewer_drop_master(rl_renewer* r) noexcept nogil:
    cdef rl_addr here
    cdef rl_conn* c = &r.conn
    r.saw_failover = 0
    if c.disco == NULL:
        return
    conn_addr(c, &here)
    conn_drop(c)
    sentinel_forget(<rl_disco*>c.disco, &here)
    r.need_load = 1


cdef int renewer_send_batch(rl_renewer* r, int64_t* deadline, int* nloads) noexcept nogil:
    """Encode the batch (mu held) and write what the socket takes without blocking.

    Leases whose term ended since they were picked are dropped here, under
    the lock, so once end() has returned nothing more is sent for that term.
    Returns how many bytes are still to send, or -1 (failure recorded in the
    connection, mu still held).
    """
    cdef rl_conn* c = &r.conn
    cdef size_t i, kept = 0
    cdef int j
    cdef rl_lease* l
    cdef int64_t now
    cdef ssize_t sent = 0
    r.out.len = 0
    nloads[0] = 0
    if r.need_load:
        for j in range(r.nscripts):
            if buf_put(&r.out, r.loads[j].data, r.loads[j].len) < 0:
                return conn_fail(c, RL_ENOMEM, "out of memory encoding renewals")
        nloads[0] = r.nscripts
    for i in range(r.batch_len):
        l = r.batch[i]
        if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
            batch_release(r, l)
            continue
        if buf_put(&r.out, l.cmd.data, l.cmd.len) < 0:
            r.batch_len = kept
            return conn_fail(c, RL_ENOMEM, "out of memory encoding renewals")
        r.batch[kept] = l
        kept += 1
    r.batch_len = kept
    if kept == 0:
        return 0
    now = rl_now_ns()
    for i in range(kept):
        l = r.batch[i]
        l.t_send = now
        # Sent up to one window early: on time, not early.
        lease_record_lateness(l, <double>(now - l.sched) / 1e9 if now > l.sched else 0.0)
    r.sent_total += <int64_t>kept
    r.batches_total += 1
    if c.ssl != NULL:
        sent = tls_try_send(c, r.out.data, r.out.len)
        if sent < 0:
            return -1
        return <int>(r.out.len - <size_t>sent)
    while True:
        sent = send(c.fd, r.out.data, r.out.len, MSG_NOSIGNAL | MSG_DONTWAIT)
        if sent >= 0 or errno != EINTR:
            break
    if sent < 0:
        if not rl_would_block(errno):
            return conn_io_error(c, errno, "writing to")
        sent = 0
    return <int>(r.out.len - <size_t>sent)


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


cdef void cluster_apply_reply(rl_renewer* r, rl_rnode* n, rl_lease* l, rl_conn* c) noexcept nogil:
    """The buffered reply to ``l``'s renewal on node ``n`` (mu held)."""
    cdef rl_node* top = &c.nodes.items[0]
    cdef rl_disco* d = <rl_disco*>r.conn.disco
    cdef rl_addr there
    cdef int what, slot, idx
    cdef int64_t now
    if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
        return
    what = reply_class(c, EXPECT_0_OR_1)
    if what == REPLY_DONE:
        if top.ival == 1:
            lease_renewed(l)
        else:
            lease_lose(l)
        return
    if what == REPLY_UNEXPECTED:
        lease_unexpected(l, c)
        n.drop = 1
        return
    if reply_is_noscript(c):
        n.need_load = 1
        l.next_send = rl_now_ns()
        return
    if what == REPLY_MOVED or what == REPLY_ASK:
        l.redirects += 1
        if (l.redirects <= MAX_REDIRECTS
                and parse_redirect(c, 6 if what == REPLY_MOVED else 4, &slot, &there) == 0):
            if what == REPLY_MOVED:
                # The slot has a new owner: the map says so, and this lease's
                # renewal goes there at once (within its own deadline).
                pthread_mutex_lock(&d.mu)
                idx = node_index(d, there.host, there.port)
                if idx >= 0:
                    d.owner[slot] = <int16_t>idx
                else:
                    d.stale = 1
                pthread_mutex_unlock(&d.mu)
            else:
                # Mid-migration: this renewal alone goes to the importing
                # node, after ASKING; the map is unchanged.
                l.ask_node = rnode_find(r, &there)
            l.next_send = rl_now_ns()
            return
    conn_fail_with_reply(c)
    if what == REPLY_FAILOVER:
        lease_record_error(l, c.err_kind, c.err_msg)
        lease_lose(l)
        cluster_forget(d)
        n.drop = 1
        return
    if what == REPLY_RETRY:
        # Not executed (CLUSTERDOWN, TRYAGAIN, LOADING...): ask for the slot
        # map again and resend after a pause, until the deadline.
        lease_record_error(l, c.err_kind, c.err_msg)
        lease_wake(l)
        cluster_forget(d)
        now = rl_now_ns()
        l.next_send = now + RETRY_PAUSE_NS
        return
    lease_failed(l, c.err_kind, c.err_msg, rl_now_ns())


cdef int node_try_send(rl_conn* c, const char* data, size_t n) noexcept nogil:
    """Write what the socket takes without blocking; bytes still to send, or -1."""
    cdef ssize_t sent = 0
    if c.ssl != NULL:
        sent = tls_try_send(c, data, n)
        if sent < 0:
            return -1
        return <int>(n - <size_t>sent)
    while True:
        sent = send(c.fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT)
        if sent >= 0 or errno != EINTR:
            break
    if sent < 0:
        if not rl_would_block(errno):
            return conn_io_error(c, errno, "writing to")
        sent = 0
    return <int>(n - <size_t>sent)


cdef int node_encode(rl_renewer* r, rl_rnode* n) noexcept nogil:
    """Encode ``n``'s part of the batch into r.out (mu held), dropping ended terms; -1: no memory."""
    cdef size_t i, kept = 0
    cdef int j
    cdef rl_lease* l
    cdef int64_t now
    r.out.len = 0
    n.loads_left = 0
    if n.need_load:
        for j in range(r.nscripts):
            if buf_put(&r.out, r.loads[j].data, r.loads[j].len) < 0:
                return -1
        n.loads_left = r.nscripts
    for i in range(n.first, n.first + n.count):
        l = r.batch[i]
        if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
            batch_release(r, l)
            continue
        if l.asking and buf_put(&r.out, ASKING_CMD, strlen(ASKING_CMD)) < 0:
            return -1
        if buf_put(&r.out, l.cmd.data, l.cmd.len) < 0:
            return -1
        r.batch[n.first + kept] = l
        kept += 1
    n.count = kept
    now = rl_now_ns()
    for i in range(n.first, n.first + kept):
        l = r.batch[i]
        l.t_send = now
        lease_record_lateness(l, <double>(now - l.sched) / 1e9 if now > l.sched else 0.0)
    r.sent_total += <int64_t>kept
    if kept:
        r.batches_total += 1
    return 0


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
    cluster_apply_reply(r, n, l, c)
    conn_consume(c)
    batch_release(r, l)
    n.done += 1
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
    cdef int k, idx, own, need, nfds, rc, left, pending
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
        if node_encode(r, n) < 0:
            conn_fail(&n.conn, RL_ENOMEM, "out of memory encoding renewals")
            node_fail(r, n, n.conn.err_kind, n.conn.err_msg)
            continue
        if n.count == 0 and n.loads_left == 0:
            continue
        left = node_try_send(&n.conn, r.out.data, r.out.len)
        if left > 0:
            pthread_mutex_unlock(&r.mu)
            rc = conn_send(&n.conn, r.out.data + (r.out.len - <size_t>left), <size_t>left, n.deadline)
            pthread_mutex_lock(&r.mu)
            if rc < 0:
                left = -1
        if left < 0:
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


cdef void* renewer_main(void* arg) noexcept nogil:
    cdef rl_renewer* r = <rl_renewer*>arg
    cdef rl_conn* c = &r.conn
    cdef rl_lease* l
    cdef rl_lease* top
    cdef int64_t now, deadline, d, wake_at
    cdef int rc, left, nloads, j, fd
    cdef size_t i
    rl_name_renewer_thread()
    pthread_mutex_lock(&r.mu)
    while not r.stop:
        if r.heap_len == 0:
            pthread_cond_wait(&r.cv, &r.mu)
            continue
        now = rl_now_ns()
        top = r.heap[0]
        wake_at = lease_key(top)
        if wake_at > now:
            rl_cond_wait_until(&r.cv, &r.mu, wake_at)
            continue
        # Everything due now (or within the window) goes in one batch.
        r.batch_len = 0
        deadline = 0
        while r.heap_len and r.batch_len < RENEW_BATCH_MAX and lease_key(r.heap[0]) <= now + RENEW_WINDOW_NS:
            l = heap_pop(r)
            if now >= l.lease_deadline:
                lease_lose(l)
                continue
            if l.next_send > now + RENEW_WINDOW_NS:
                heap_push(r, l)
                break
            l.inflight = 1
            l.sent_gen = l.gen
            l.sched = l.next_send
            r.batch[r.batch_len] = l
            r.batch_len += 1
            # A round trip may never outlive a lease: its deadline, or one
            # interval, whichever comes first, bounds the whole batch.
            d = now + l.interval_ns
            if d > l.lease_deadline:
                d = l.lease_deadline
            if deadline == 0 or d < deadline:
                deadline = d
        if r.batch_len == 0:
            continue
        if r.cluster:
            cluster_round(r)
            continue
        fd = c.fd
        pthread_mutex_unlock(&r.mu)
        # Behind Sentinel this asks the sentinels where the master is when
        # the connection is new (and re-checks now and then): the renewals
        # follow the master.
        rc = batch_prepare(c, <rl_disco*>c.disco, deadline)
        pthread_mutex_lock(&r.mu)
        if fd < 0 or c.fd != fd:
            # A new connection may reach a server that lost its scripts (a
            # missed one is answered NOSCRIPT, which loads them too).
            r.need_load = 1
        if rc < 0:
            batch_fail(r, 0, c.err_kind, c.err_msg)
            renewer_lost(r)
            continue
        if r.stop:
            batch_fail(r, 0, RL_ECANCELLED, "cancelled")
            break
        left = renewer_send_batch(r, &deadline, &nloads)
        if left < 0:
            batch_fail(r, 0, c.err_kind, c.err_msg)
            continue
        if r.batch_len == 0 and nloads == 0:
            continue
        pthread_mutex_unlock(&r.mu)
        rc = 0
        if left > 0:
            rc = conn_send(c, r.out.data + (r.out.len - <size_t>left), <size_t>left, deadline)
        if rc == 0:
            for j in range(nloads):
                rc = conn_read_reply(c, deadline)
                if rc < 0:
                    break
                conn_consume(c)
        if rc == 0:
            r.need_load = 0
        pthread_mutex_lock(&r.mu)
        if rc < 0:
            batch_fail(r, 0, c.err_kind, c.err_msg)
            renewer_lost(r)
            continue
        r.saw_failover = 0
        r.saw_unexpected = 0
        i = 0
        while i < r.batch_len and not r.saw_unexpected:
            pthread_mutex_unlock(&r.mu)
            rc = conn_read_reply(c, deadline)
            pthread_mutex_lock(&r.mu)
            if rc < 0:
                break
            l = r.batch[i]
            lease_apply_reply(r, l, c)
            conn_consume(c)
            batch_release(r, l)
            i += 1
        if r.saw_unexpected:
            # The replies after it cannot be matched to their renewals.
            conn_drop(c)
            r.need_load = 1
            if i < r.batch_len:
                batch_fail(r, i, RL_ECONN, "connection dropped after an unexpected renewal reply")
        elif i < r.batch_len:
            batch_fail(r, i, c.err_kind, c.err_msg)
            renewer_lost(r)
        if r.saw_failover:
            # Whatever answers next on this address is not the master the
            # leases were granted on: the next batch asks where it is.
            renewer_drop_master(r)
        r.batch_len = 0
        c.last_used = rl_now_ns()
    r.batch_len = 0
    pthread_mutex_unlock(&r.mu)
    return NULL


# ---------------------------------------------------------------- Python faces

cdef class Renewer:
    """One native thread that renews every ``Lease`` made from it.

    On a fixed address or behind Sentinel it renews over one connection
    (which follows the master the sentinels name); on a cluster over one
    connection per slot-owning master, each lease sent to its key's slot's
    owner, MOVED and ASK followed per lease. Renewals falling due together
    are pipelined in one write per connection. The thread
    starts with the first term begun and is joined by ``close()``. After
    ``os.fork()`` the child's copy is inert: no thread, its socket dropped
    without a byte sent, and every lease of it ended.
    """

    cdef rl_renewer* r
    cdef bint _closed
    cdef bint _forked
    cdef object __weakref__

    def __cinit__(self):
        self.r = NULL
        self._closed = False
        self._forked = False

    def __init__(self, Target target not None):
        cdef rl_renewer* r = <rl_renewer*>calloc(1, sizeof(rl_renewer))
        cdef int rc, j
        if r == NULL:
            raise MemoryError()
        r.ctl_fd = -1
        pthread_mutex_init(&r.mu, NULL)
        rl_cond_init(&r.cv)
        self.r = r
        target.init_conn(&r.conn)
        r.conn.slot = -1
        r.need_load = 1
        r.ctl_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if r.ctl_fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        r.conn.cancel_fd = r.ctl_fd
        if r.conn.disco != NULL and (<rl_disco*>r.conn.disco).kind == DISCO_CLUSTER:
            # A cluster's leases live on as many masters as their slots: one
            # connection per node, made here (the thread never takes the GIL
            # to make one), opened when a lease's slot first needs it. The
            # renewer's own connection only asks for the slot map.
            r.cluster = 1
            r.nodes = <rl_rnode*>calloc(RENEW_NODES_MAX, sizeof(rl_rnode))
            if r.nodes == NULL:
                raise MemoryError()
            for j in range(RENEW_NODES_MAX):
                target.init_conn(&r.nodes[j].conn)
                r.nodes[j].conn.cancel_fd = r.ctl_fd
        elif r.conn.disco == NULL:
            # Resolve now, on the caller's thread: name lookups have no
            # deadline. (Behind Sentinel the address comes from the
            # sentinels, as an IP address, when the thread connects.)
            with nogil:
                rc = conn_resolve(&r.conn)
            if rc < 0:
                raise conn_exception(&r.conn)
        r.conn.keep_addrs = 1
        _live.add(self)

    def __dealloc__(self):
        cdef rl_renewer* r = self.r
        cdef int j
        if r == NULL:
            return
        self.stop_thread()
        self.r = NULL
        conn_free(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                conn_free(&r.nodes[j].conn)
            free(r.nodes)
        for j in range(r.nscripts):
            buf_free(&r.loads[j])
        buf_free(&r.out)
        free(r.heap)
        if r.ctl_fd >= 0:
            close(r.ctl_fd)
        pthread_mutex_destroy(&r.mu)
        pthread_cond_destroy(&r.cv)
        free(r)

    cdef int add_script(self, ScriptRef ref) except -1:
        """Make sure the renewer loads ``ref`` on every new connection.

        The SCRIPT LOAD command is encoded before the lock is taken: Python
        allocations may run the garbage collector, and a lease freed there
        takes the same (non-recursive) lock.
        """
        cdef rl_renewer* r = self.r
        cdef rl_buf load
        cdef int j
        cdef int found = 0
        cdef int full = 0
        cdef const char* sha = PyBytes_AS_STRING(ref.sha)
        memset(&load, 0, sizeof(rl_buf))
        put_command(&load, (b"SCRIPT", b"LOAD", ref.source))
        pthread_mutex_lock(&r.mu)
        for j in range(r.nscripts):
            if strncmp(r.shas[j], sha, 40) == 0:
                found = 1
                break
        if not found:
            if r.nscripts == RENEW_SCRIPTS_MAX:
                full = 1
            else:
                j = r.nscripts
                r.loads[j] = load
                memset(&load, 0, sizeof(rl_buf))
                strncpy(r.shas[j], sha, 40)
                r.shas[j][40] = 0
                r.nscripts += 1
                r.need_load = 1
        pthread_mutex_unlock(&r.mu)
        buf_free(&load)
        if full:
            raise RuntimeError("too many distinct renewal scripts for one renewer")
        return 0

    cdef void stop_thread(self) noexcept:
        cdef rl_renewer* r = self.r
        cdef int started
        if r == NULL:
            return
        pthread_mutex_lock(&r.mu)
        r.stop = 1
        started = r.thread_started
        r.thread_started = 0
        fd_signal(r.ctl_fd)
        pthread_cond_signal(&r.cv)
        pthread_mutex_unlock(&r.mu)
        if started:
            with nogil:
                pthread_join(r.thread, NULL)

    cdef int start_thread(self) except -1:
        """Start the thread if it is not running (mu held by the caller)."""
        cdef rl_renewer* r = self.r
        cdef int rc
        if r.thread_started:
            return 0
        rc = rl_spawn(&r.thread, renewer_main, r)
        if rc != 0:
            raise OSError(rc, "cannot start the renewer thread: " + strerror(rc).decode())
        r.thread_started = 1
        return 0

    @property
    def running(self):
        """Whether the renewal thread is running."""
        return self.r != NULL and self.r.thread_started != 0

    @property
    def leases(self):
        """How many leases wait in the timer heap right now."""
        if self.r == NULL:
            return 0
        return self.r.heap_len

    @property
    def sent(self):
        """``(renewals, batches)`` written since the renewer was made."""
        if self.r == NULL:
            return 0, 0
        return self.r.sent_total, self.r.batches_total

    @property
    def connections(self):
        """``[(server address, fd)]`` of the renewer's open connections (a snapshot)."""
        cdef rl_renewer* r = self.r
        cdef int j
        out = []
        if r == NULL:
            return out
        pthread_mutex_lock(&r.mu)
        try:
            if r.nodes != NULL:
                for j in range(RENEW_NODES_MAX):
                    if r.nodes[j].conn.fd >= 0:
                        out.append((r.nodes[j].conn.address.decode("utf-8", "replace"),
                                    r.nodes[j].conn.fd))
            elif r.conn.fd >= 0:
                out.append((r.conn.address.decode("utf-8", "replace"), r.conn.fd))
        finally:
            pthread_mutex_unlock(&r.mu)
        return out

    @property
    def changes(self):
        """A counter bumped by every wake-up of any of the renewer's leases."""
        if self.r == NULL:
            return 0
        return rl_load(&self.r.changes)

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Stop and join the thread and close the connection. Idempotent.

        Leases made from this renewer are ended first by their owners; any
        still running are ended here (LOST is kept).
        """
        cdef rl_renewer* r = self.r
        cdef rl_lease* l
        cdef int j
        if r == NULL or self._closed:
            return
        self._closed = True
        pthread_mutex_lock(&r.mu)
        while r.heap_len:
            l = heap_pop(r)
            rl_store(&l.token, 0)
            l.gen += 1
            if rl_load(&l.state) == ST_ACTIVE:
                rl_store(&l.state, ST_ENDED)
                lease_wake(l)
        pthread_mutex_unlock(&r.mu)
        self.stop_thread()
        conn_drop(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                conn_drop(&r.nodes[j].conn)

    cdef void after_fork_in_child(self) noexcept:
        cdef rl_renewer* r = self.r
        cdef int j
        if r == NULL:
            return
        pthread_mutex_init(&r.mu, NULL)
        rl_cond_init(&r.cv)
        r.thread_started = 0
        r.stop = 1
        r.heap_len = 0
        r.batch_len = 0
        self._forked = True
        tls_forget_after_fork(&r.conn)
        conn_drop(&r.conn)
        if r.nodes != NULL:
            for j in range(RENEW_NODES_MAX):
                tls_forget_after_fork(&r.nodes[j].conn)
                conn_drop(&r.nodes[j].conn)


@cython.no_gc_clear
cdef class Lease:
    """One lease renewed by a shared ``Renewer`` (the engine's ``Keeper`` protocol).

    ``begin()`` sends the first renewal at once, then one every ``interval``
    on absolute deadlines; a reply of 1 extends the lease to (send time +
    ``ttl``), 0 loses it at once, a failover reply (READONLY, MASTERDOWN,
    NOREPLICAS) loses it at once; errors, a reply of any other shape
    included, are tolerated until the lease deadline. ``token`` and
    ``state`` are atomics: reading them never waits. ``fileno()`` makes the lease's
    eventfd on first use, so a lease nobody waits on costs no descriptor.
    """

    cdef rl_lease* l
    cdef readonly Renewer renewer
    cdef bint _closed
    cdef bint _forked
    cdef int _waiters
    cdef readonly double interval
    cdef readonly double ttl
    cdef object __weakref__

    def __cinit__(self):
        self.l = NULL
        self._closed = False
        self._forked = False
        self._waiters = 0

    def __init__(self, Renewer renewer not None, ScriptRef ref not None, keys, args,
                 double interval, double ttl):
        cdef rl_lease* l
        cdef rl_script_cmd cmd
        if renewer.r == NULL or renewer._closed:
            raise RuntimeError("the renewer is closed")
        if not (interval > 0 and interval < 1e6) or not (ttl > 0 and ttl < 1e6):
            raise ValueError("interval and ttl must be positive numbers of seconds")
        self.interval = interval
        self.ttl = ttl
        l = <rl_lease*>calloc(1, sizeof(rl_lease))
        if l == NULL:
            raise MemoryError()
        l.heap_idx = -1
        l.wake_fd = -1
        l.interval_ns = <int64_t>(interval * 1e9)
        l.ttl_ns = <int64_t>(ttl * 1e9)
        self.l = l
        self.renewer = renewer
        l.changes = &renewer.r.changes
        l.slot = disco_slot_for(renewer.r.conn.disco, keys)
        l.ask_node = -1
        put_evalsha(&l.cmd, ref.sha, ref.source, keys, args, &cmd)
        renewer.add_script(ref)
        _live.add(self)

    def __dealloc__(self):
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL:
            return
        self.l = NULL
        if self.renewer is None or self.renewer.r == NULL:
            lease_free(l)
            return
        r = self.renewer.r
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        l.closed = 1
        heap_remove(r, l)
        if l.inflight:
            l.detached = 1  # the thread frees it when the batch is done
            l = NULL
        pthread_mutex_unlock(&r.mu)
        if l != NULL:
            lease_free(l)

    cdef inline rl_renewer* _r(self):
        return self.renewer.r

    cdef inline bint _expired(self) noexcept:
        # The renewer may be waiting on a slow server's replies to other
        # leases when this one's deadline passes: readers see the loss at
        # the deadline all the same, the thread records it when it is back.
        return (rl_load(&self.l.state) == ST_ACTIVE
                and rl_now_ns() >= rl_load(&self.l.lease_deadline))

    @property
    def token(self):
        """The running term's token, or 0 when no term is ACTIVE (or its deadline passed)."""
        if self.l == NULL or self._expired():
            return 0
        return rl_load(&self.l.token)

    @property
    def state(self):
        """IDLE, ACTIVE, LOST or ENDED (LOST from the deadline on)."""
        if self.l == NULL:
            return ST_ENDED
        if self._expired():
            return ST_LOST
        return rl_load(&self.l.state)

    @property
    def renewed_at(self):
        """``time.monotonic()`` send time of the last good renewal (0.0 before the first)."""
        if self.l == NULL:
            return 0.0
        return <double>rl_load(&self.l.renewed_at) / 1e9

    @property
    def renewals(self):
        """How many renewals succeeded since the lease was made."""
        if self.l == NULL:
            return 0
        return rl_load(&self.l.renewals)

    @property
    def changes(self):
        """The renewer's change counter: it moves whenever any of its leases is woken."""
        if self.renewer is None or self.renewer.r == NULL:
            return 0
        return rl_load(&self.renewer.r.changes)

    @property
    def closed(self):
        """True once ``close()`` ran, or the renewer was closed (the engine's close)."""
        return self._closed or self.renewer._closed

    def begin(self, token, double acquired_at):
        """Start a term; ``acquired_at`` is the ``time.monotonic()`` send time of the acquire."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef long long tok = token
        if l == NULL:
            raise RuntimeError("Lease is not initialised")
        if self._forked or self.renewer._forked:
            raise RuntimeError("this lease was inherited across fork(); make a new one in the child")
        if self._closed or self.renewer._closed:
            raise RuntimeError("Lease is closed")
        if tok < 1:
            raise ValueError("token must be >= 1")
        r = self._r()
        pthread_mutex_lock(&r.mu)
        try:
            self.renewer.start_thread()
        except BaseException:
            pthread_mutex_unlock(&r.mu)
            raise
        l.gen += 1
        rl_store(&l.lease_deadline, <int64_t>(acquired_at * 1e9) + l.ttl_ns)
        l.next_send = rl_now_ns()
        rl_store(&l.token, tok)
        rl_store(&l.state, ST_ACTIVE)
        if not l.inflight:
            heap_fix(r, l)
        pthread_cond_signal(&r.cv)
        lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def end(self):
        """End the term (token cleared first); idempotent; a LOST term stays LOST."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        heap_remove(r, l)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
            lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def lose(self, error):
        """End an ACTIVE term as LOST now; ``error``'s text is reported as a ConnectionError."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef bytes msg = str(error).encode("utf-8", "replace")[:ERR_MSG - 1]
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        if rl_load(&l.state) == ST_ACTIVE:
            heap_remove(r, l)
            lease_record_error(l, RL_ECONN, msg)
            lease_lose(l)
        pthread_mutex_unlock(&r.mu)

    cdef int _wake_fd(self) except -2:
        """The lease's eventfd, made now if it does not exist yet (-1 once closed)."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef int fd
        if l == NULL or self._closed:
            return -1
        if l.wake_fd >= 0:
            return l.wake_fd
        fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if fd < 0:
            raise OSError(errno, strerror(errno).decode("utf-8", "replace"))
        r = self._r()
        pthread_mutex_lock(&r.mu)
        l.wake_fd = fd
        if l.wake_pending:
            l.wake_pending = 0
            fd_signal(fd)
        pthread_mutex_unlock(&r.mu)
        return fd

    def wait(self, timeout=None):
        """Block until woken (loss, error, ``notify()``); False on timeout. Consumes the wake-up."""
        cdef int64_t deadline = -1
        cdef int64_t now, left
        cdef pollfd pfd
        cdef int rc, err
        cdef uint64_t value
        cdef ssize_t got
        cdef int fd = self._wake_fd()
        if fd < 0:
            return True
        if timeout is not None:
            deadline = deadline_after(timeout)
        pfd.fd = fd
        pfd.events = POLLIN
        self._waiters += 1
        try:
            while True:
                pfd.revents = 0
                with nogil:
                    if deadline < 0:
                        left = -1
                    else:
                        now = rl_now_ns()
                        left = deadline - now if deadline > now else 0
                    rc = rl_ppoll(&pfd, 1, left)
                    err = errno
                if self._closed:
                    # close() leaves the eventfd readable for every waiter.
                    return True
                if rc > 0:
                    got = read(fd, &value, 8)
                    if got == 8:
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
                self.close_fd()

    def notify(self):
        """Wake the waiter."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL or self._closed:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        lease_wake(l)
        pthread_mutex_unlock(&r.mu)

    def fileno(self):
        """An eventfd that is readable while a wake-up is pending (-1 once closed)."""
        return self._wake_fd()

    def pop_errors(self):
        """redis-py exceptions of the failed renewals since the last call, oldest first."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef rl_err copy[32]
        cdef int n = 0
        cdef int i
        if l == NULL or rl_load(&l.err_count_atomic) == 0:
            return []
        r = self._r()
        pthread_mutex_lock(&r.mu)
        n = l.err_count
        for i in range(n):
            copy[i] = l.errs[(l.err_head + i) % ERR_RING]
        l.err_head = 0
        l.err_count = 0
        rl_store(&l.err_count_atomic, 0)
        pthread_mutex_unlock(&r.mu)
        return [make_exception(copy[i].kind, PyBytes_FromString(copy[i].msg)) for i in range(n)]

    def lateness(self):
        """Seconds each renewal was sent after its scheduled time (up to the last 65536)."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef double* copy
        cdef size_t n
        cdef size_t start = 0
        cdef size_t i
        if l == NULL:
            return []
        copy = <double*>realloc(NULL, LATE_MAX * sizeof(double))
        if copy == NULL:
            raise MemoryError()
        r = self._r()
        try:
            pthread_mutex_lock(&r.mu)
            if l.late_count <= LATE_MAX:
                n = <size_t>l.late_count
            else:
                n = LATE_MAX
                start = <size_t>(l.late_count % LATE_MAX)
            for i in range(n):
                copy[i] = l.late[(start + i) % LATE_MAX] if start else l.late[i]
            pthread_mutex_unlock(&r.mu)
            return [copy[i] for i in range(n)]
        finally:
            free(copy)

    def lateness_totals(self):
        """``(counts, sum)``: renew lateness since the lease was made, as a histogram."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef uint64_t copy[17]
        cdef double total
        cdef int i
        if l == NULL:
            return [0] * (LATE_BOUNDS_N + 1), 0.0
        r = self._r()
        pthread_mutex_lock(&r.mu)
        for i in range(LATE_BOUNDS_N + 1):
            copy[i] = l.late_hist[i]
        total = l.late_sum
        pthread_mutex_unlock(&r.mu)
        return [copy[i] for i in range(LATE_BOUNDS_N + 1)], total

    def close(self):
        """End any term and take the lease off the renewer. Idempotent."""
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        if l == NULL or self._closed:
            return
        self._closed = True
        r = self._r()
        pthread_mutex_lock(&r.mu)
        rl_store(&l.token, 0)
        l.gen += 1
        l.closed = 1
        heap_remove(r, l)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
        if l.wake_fd >= 0:
            fd_signal(l.wake_fd)
        pthread_mutex_unlock(&r.mu)
        if self._waiters == 0:
            self.close_fd()

    cdef void close_fd(self) noexcept:
        cdef rl_lease* l = self.l
        cdef rl_renewer* r
        cdef int fd
        if l == NULL:
            return
        r = self._r()
        pthread_mutex_lock(&r.mu)
        fd = l.wake_fd
        l.wake_fd = -1
        pthread_mutex_unlock(&r.mu)
        if fd >= 0:
            close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    cdef void after_fork_in_child(self) noexcept:
        cdef rl_lease* l = self.l
        if l == NULL:
            return
        # The renewer's mutex is re-made by the renewer's own handler; the
        # lease is the parent's business: never renewed or released here.
        rl_store(&l.token, 0)
        if rl_load(&l.state) == ST_ACTIVE:
            rl_store(&l.state, ST_ENDED)
        l.gen += 1
        l.heap_idx = -1
        l.inflight = 0
        self._forked = True
        self._waiters = 0
        l.wake_pending = 0  # the parent's wake-ups, not the child's
        if l.wake_fd >= 0:
            # Shared with the parent: waking it would wake the parent.
            close(l.wake_fd)
            l.wake_fd = -1
