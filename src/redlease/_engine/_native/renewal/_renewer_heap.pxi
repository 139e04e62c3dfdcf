# The shared renewer's state, its timer heap and its leases' bookkeeping.
# ONE pthread and ONE connection renew every lease of an engine (elector
# terms and lock watchdogs alike). Leases wait in a timer heap keyed by their
# next renewal; the ones falling due together (within RENEW_WINDOW_NS) go out
# as one pipelined write and their replies are read in order. Each lease
# keeps its own deadline (send time of its last good renewal + ttl), its own
# token and state, its own errors and lateness figures: a reply of 0 ends
# that lease alone.
#
# Here: the heap, what a renewal's outcome does to its lease (renewed,
# failed, lost, a reply of the wrong shape), and a batch's renewals encoded
# and written (one encoder and one write for a renewer with one server and
# for each node of a cluster); the limits and the rl_renewer and rl_rnode
# structs are declared in _renewer_heap.pxd. The round trips are in
# _renewer_cluster.pxi and _renewer_thread.pxi, the Python faces in
# _renewer_api.pxi and _renewer_lease_api.pxi.
#
# No GIL, ever, and no Python object on the thread. Python reads token and
# state as atomics; everything else is guarded by the renewer's mutex ``mu``,
# which the thread never holds across a wait for the server (the lock
# discipline of _core.pyx): a Python thread may lock it with the GIL held.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _discovery, _replies, _lease.

# Renewals due within this much of the earliest one are sent with it, and
# after a failed renewal the next one waits at least RENEW_RETRY_NS (a refused
# connect fails at once; without a floor the thread would spin until the
# deadline; the lease deadline is unchanged by it). Both values come from
# redlease._engine.rules.timing, read when the module is imported.
cdef int64_t RENEW_WINDOW_NS = _timing.ns(_timing.RENEW_BATCH_WINDOW)
cdef int64_t RENEW_RETRY_NS = _timing.ns(_timing.RENEW_RETRY_FLOOR)
# the longest ttl (and renewal interval) a lease may have; the settings are
# checked against the same value before a lease is ever made
cdef int64_t MAX_TTL_NS = _timing.ns(_timing.MAX_TTL)
# leases in one renew_many call, at most (a lease's call_len holds it in a byte)
cdef size_t RENEW_CALL_MAX = _timing.RENEW_CALL_MAX
if not 2 <= RENEW_CALL_MAX <= 255:
    raise ImportError("redlease._engine.rules.timing.RENEW_CALL_MAX must be 2 to 255")


# ---------------------------------------------------------------- the heap (mu held)

cdef inline void heap_set(rl_renewer* r, size_t i, rl_lease* l, int64_t key) noexcept nogil:
    r.heap[i] = l
    r.heap_keys[i] = key
    l.heap_idx = <int>i


# Each slot's key is kept beside its lease (heap_keys): a sift compares keys
# in one array instead of reading two leases per level, which at 100,000
# leases cost a cache miss each and most of the thread's time. A lease's key
# changes only while it is out of the heap or before heap_fix, which takes
# it anew.

cdef void heap_up(rl_renewer* r, size_t i) noexcept nogil:
    cdef rl_lease* l = r.heap[i]
    cdef int64_t key = lease_key(l)
    cdef size_t parent
    while i > 0:
        parent = (i - 1) // 2
        if r.heap_keys[parent] <= key:
            break
        heap_set(r, i, r.heap[parent], r.heap_keys[parent])
        i = parent
    heap_set(r, i, l, key)


cdef void heap_down(rl_renewer* r, size_t i) noexcept nogil:
    cdef rl_lease* l = r.heap[i]
    cdef int64_t key = lease_key(l)
    cdef int64_t* keys = r.heap_keys
    cdef size_t child
    while True:
        child = 2 * i + 1
        if child >= r.heap_len:
            break
        if child + 1 < r.heap_len and keys[child + 1] < keys[child]:
            child += 1
        if key <= keys[child]:
            break
        heap_set(r, i, r.heap[child], keys[child])
        i = child
    heap_set(r, i, l, key)


cdef int heap_push(rl_renewer* r, rl_lease* l) noexcept nogil:
    cdef size_t cap
    cdef rl_lease** grown
    cdef int64_t* grown_keys
    if r.heap_len == r.heap_cap:
        cap = r.heap_cap * 2 if r.heap_cap else 64
        grown_keys = <int64_t*>realloc(r.heap_keys, cap * sizeof(int64_t))
        if grown_keys == NULL:
            return -1
        r.heap_keys = grown_keys
        grown = <rl_lease**>realloc(r.heap, cap * sizeof(rl_lease*))
        if grown == NULL:
            return -1
        r.heap = grown
        r.heap_cap = cap
    heap_set(r, r.heap_len, l, lease_key(l))
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
    heap_set(r, i, last, r.heap_keys[r.heap_len])
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


# ---------------------------------------------------------------- a renewal's outcome (mu held)

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


cdef void lease_unexpected(rl_lease* l, rl_conn* c, const char* what, const char* wanted) noexcept nogil:
    """A reply the script ``what`` cannot give (mu held): an error, and the stream is not trusted."""
    cdef char msg[ERR_MSG]
    reply_describe(c, what, wanted, msg, ERR_MSG)
    lease_failed(l, RL_EUNEXPECTED, msg, rl_now_ns())


cdef void lease_apply_node(rl_renewer* r, rl_rnode* n, rl_lease* l, rl_conn* c,
                           rl_node* top) noexcept nogil:
    """What the reply ``top`` does to ``l``'s renewal (mu held); ``n``: the cluster node it went
    to, NULL for a renewer with one server.

    ``top`` is a node of the reply buffered in ``c``: the reply to ``l``'s own
    call, its element of a renew_many call's reply, or that call's top-level
    error (which every lease of the call gets, as if its own renewal had).
    Only on a cluster are MOVED / ASK followed and the slot map read again
    on a RETRY reply (``replytable.resends``); elsewhere they are failed
    renewals, tried again at the next interval.
    """
    cdef rl_disco* d = <rl_disco*>r.conn.disco
    cdef bint whole = top == &c.nodes.items[0]
    cdef rl_addr there
    cdef int what, slot
    if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
        return
    what = reply_node_class(c.r.data, top, EXPECT_0_OR_1)
    if what == REPLY_DONE:
        if top.ival == 1:
            lease_renewed(l)
        else:
            lease_lose(l)
        return
    if what == REPLY_UNEXPECTED:
        lease_unexpected(l, c, "renew", "0 or 1")
        if n != NULL:
            n.drop = 1
        else:
            r.saw_unexpected = 1
        return
    if node_is_noscript(c.r.data, top):
        # The server lost its scripts (SCRIPT FLUSH, a restart): load them
        # and send this renewal again at once; not a failed renewal.
        if n != NULL:
            n.need_load = 1
        else:
            r.need_load = 1
        l.next_send = rl_now_ns()
        return
    if n != NULL and not whole and node_is_elsewhere(c.r.data, top):
        # A node-wide renew_many call reached a node that does not serve
        # this lease's key (its slot moved, or is migrating): not renewed,
        # not a failure. The map is read again, and this lease renewed again
        # at once on its own, by its declared key, so that a MOVED or ASK
        # reply to that is followed.
        l.redirects += 1
        if l.redirects <= MAX_REDIRECTS:
            cluster_forget(d)
            l.solo = 1
            l.next_send = rl_now_ns()
            return
    if n != NULL and whole and (what == REPLY_MOVED or what == REPLY_ASK):
        l.redirects += 1
        if (l.redirects <= MAX_REDIRECTS
                and parse_redirect(c, redirect_skip(what), &slot, &there) == 0):
            if what == REPLY_MOVED:
                # The slot has a new owner: the map says so, and this lease's
                # renewal goes there at once (within its own deadline).
                slot_moved(d, slot, &there)
            else:
                # Mid-migration: this renewal alone goes to the importing
                # node, after ASKING; the map is unchanged.
                l.ask_node = rnode_find(r, &there)
            l.next_send = rl_now_ns()
            return
    conn_fail_with_node(c, top)
    if what == REPLY_FAILOVER:
        # READONLY / MASTERDOWN / NOREPLICAS: this server is no longer the
        # master the lease was granted on; the term ends now, not at its
        # deadline.
        lease_record_error(l, c.err_kind, c.err_msg)
        lease_lose(l)
        if n != NULL:
            cluster_forget(d)
            n.drop = 1
        else:
            r.saw_failover = 1
        return
    if n != NULL and what == REPLY_RETRY:
        # Not executed (CLUSTERDOWN, TRYAGAIN, LOADING...): ask for the slot
        # map again and resend after a pause, until the deadline.
        lease_record_error(l, c.err_kind, c.err_msg)
        lease_wake(l)
        cluster_forget(d)
        l.next_send = rl_now_ns() + RETRY_PAUSE_NS
        return
    lease_failed(l, c.err_kind, c.err_msg, rl_now_ns())


cdef bint many_reply_fits(rl_conn* c, size_t count) noexcept nogil:
    """Whether the buffered reply is a renew_many call's for ``count`` leases: an array of
    that many elements, each 0, 1 or an error reply."""
    cdef rl_node* top = &c.nodes.items[0]
    cdef rl_node* each
    cdef size_t i
    if top.kind != c'*' or top.ival != <long long>count or c.nodes.len < count + 1:
        return False
    for i in range(1, count + 1):
        each = &c.nodes.items[i]
        if each.kind == c'-':
            continue
        if each.kind != c':' or (each.ival != 0 and each.ival != 1):
            return False
    return True


cdef size_t call_apply_reply(rl_renewer* r, rl_rnode* n, size_t at, rl_conn* c) noexcept nogil:
    """The buffered reply to the call whose first lease is ``r.batch[at]`` (mu held).

    Each lease of the call has its reply applied (lease_apply_node) and is
    released; returns how many leases that is (1 for a lease renewed
    alone). A renew_many call's error reply is every lease's; an array
    element is its lease's alone; any other reply is one the script cannot
    give, for every lease of the call, and the stream is not trusted.
    """
    cdef rl_lease* l = r.batch[at]
    cdef size_t count = l.call_len
    cdef rl_node* top = &c.nodes.items[0]
    cdef size_t i
    if count == 0:
        lease_apply_node(r, n, l, c, top)
        batch_release(r, l)
        return 1
    if top.kind == c'-':
        for i in range(count):
            lease_apply_node(r, n, r.batch[at + i], c, top)
    elif many_reply_fits(c, count):
        for i in range(count):
            lease_apply_node(r, n, r.batch[at + i], c, &c.nodes.items[i + 1])
    else:
        for i in range(count):
            lease_unexpected(r.batch[at + i], c, "renew_many",
                             "an array of 0, 1 or an error reply per lease")
        if n != NULL:
            n.drop = 1
        else:
            r.saw_unexpected = 1
    for i in range(count):
        batch_release(r, r.batch[at + i])
    return count


# ---------------------------------------------------------------- a batch on the wire (mu held)

cdef inline bint lease_renews_many(rl_renewer* r, rl_lease* l) noexcept nogil:
    # A lease after an ASK redirection, or whose key a node-wide call found
    # elsewhere, goes alone, by its declared key.
    return (l.batch_kind != 0 and r.many_at != 0
            and not (r.cluster and (l.asking or l.solo)))


cdef void calls_plan(rl_renewer* r, size_t first, size_t count) noexcept nogil:
    """Order ``r.batch[first:first + count]`` into calls (mu held): the leases renewed
    alone first, then the others in renew_many calls of at most RENEW_CALL_MAX leases,
    as even as can be (a call's first lease says how many its call renews: call_len).
    """
    cdef size_t i, alone = 0, many = 0, calls, size, extra, pos
    cdef rl_lease* l
    for i in range(first, first + count):
        l = r.batch[i]
        l.call_len = 0
        if lease_renews_many(r, l):
            r.sorted[many] = l  # scratch: the cluster's grouping is done with it
            many += 1
        else:
            r.batch[first + alone] = l
            alone += 1
    for i in range(many):
        r.batch[first + alone + i] = r.sorted[i]
    if many < 2:
        return  # one lease alone costs the server no more as its own call
    calls = (many + RENEW_CALL_MAX - 1) // RENEW_CALL_MAX
    pos = first + alone
    for i in range(calls):
        size = many // calls
        extra = many % calls
        if i < extra:
            size += 1
        r.batch[pos].call_len = <unsigned char>size
        pos += size


# A lease's kind in a renew_many call: a string lease, or a lock hash (7 bytes each).
cdef const char* MANY_STRING = b"$1\r\ns\r\n"
cdef const char* MANY_HASH = b"$1\r\nh\r\n"
cdef const char* EVALSHA_NAME = b"$7\r\nEVALSHA\r\n"


cdef int put_many_call(rl_renewer* r, size_t at, size_t count) noexcept nogil:
    """Append the renew_many call of ``r.batch[at:at + count]`` to ``r.out``: keys declared
    on one server, on a Cluster node not (they follow the triples), as the script reads them."""
    cdef rl_buf* b = &r.out
    cdef bint declared = not r.cluster
    cdef char num[24]
    cdef int k
    cdef size_t i
    cdef rl_lease* l
    if buf_put_prefix(b, c'*', <long long>(3 + 4 * count)) < 0:
        return -1
    if buf_put(b, EVALSHA_NAME, 13) < 0:
        return -1
    if buf_put_bulk(b, r.shas[r.many_at - 1], 40) < 0:
        return -1
    k = fmt_ll(num, <long long>count if declared else 0)
    if buf_put_bulk(b, num, <size_t>k) < 0:
        return -1
    if declared and put_many_keys(r, at, count) < 0:
        return -1
    for i in range(at, at + count):
        l = r.batch[i]
        if buf_put(b, MANY_HASH if l.batch_kind == c'h' else MANY_STRING, 7) < 0:
            return -1
        if buf_put(b, l.cmd.data + l.owner_at, l.cmd.len - l.owner_at) < 0:
            return -1
    if not declared and put_many_keys(r, at, count) < 0:
        return -1
    return 0


cdef int put_many_keys(rl_renewer* r, size_t at, size_t count) noexcept nogil:
    cdef size_t i
    cdef rl_lease* l
    for i in range(at, at + count):
        l = r.batch[i]
        if buf_put(&r.out, l.cmd.data + l.key_at, l.owner_at - l.key_at) < 0:
            return -1
    return 0


cdef int renewals_encode(rl_renewer* r, size_t first, size_t* count, bint need_load,
                         int* loads) noexcept nogil:
    """Encode the renewals ``r.batch[first:first + count[0]]`` into ``r.out`` (mu held).

    Leases whose term ended since they were picked are released here, under
    the lock, so once end() has returned nothing more is sent for that term;
    ``count[0]`` becomes how many are kept (in order, from ``first``). With
    ``need_load`` every script's SCRIPT LOAD goes first (``loads[0]``: how
    many replies to them come first; else 0), and a lease sent after an ASK
    redirection (on a cluster) has ASKING before its renewal. The leases of
    renew.lua and lock_refresh.lua go in renew_many calls (calls_plan
    orders them; call_apply_reply reads a call's reply), the others each in
    its own call. When none is kept nothing is encoded: the loads wait for
    the next renewals. 0, or -1 out of memory (the kept leases are still in
    the batch, to be failed).
    """
    cdef size_t i, kept = 0
    cdef int j
    cdef rl_lease* l
    cdef int64_t now
    r.out.len = 0
    loads[0] = 0
    for i in range(first, first + count[0]):
        l = r.batch[i]
        if l.gen != l.sent_gen or rl_load(&l.state) != ST_ACTIVE or l.closed:
            batch_release(r, l)
            continue
        r.batch[first + kept] = l
        kept += 1
    count[0] = kept
    if kept == 0:
        return 0
    calls_plan(r, first, kept)
    if need_load:
        for j in range(r.nscripts):
            if buf_put(&r.out, r.loads[j].data, r.loads[j].len) < 0:
                return -1
    i = first
    while i < first + kept:
        l = r.batch[i]
        if l.call_len:
            if put_many_call(r, i, l.call_len) < 0:
                return -1
            i += l.call_len
            continue
        l.solo = 0
        if l.asking and buf_put(&r.out, ASKING_CMD, strlen(ASKING_CMD)) < 0:
            return -1
        if buf_put(&r.out, l.cmd.data, l.cmd.len) < 0:
            return -1
        i += 1
    if need_load:
        loads[0] = r.nscripts
    now = rl_now_ns()
    for i in range(first, first + kept):
        l = r.batch[i]
        l.t_send = now
        # Sent up to one window early: on time, not early.
        lease_record_lateness(l, <double>(now - l.sched) / 1e9 if now > l.sched else 0.0)
    r.sent_total += <int64_t>kept
    r.batches_total += 1
    return 0


cdef int renewals_send(rl_renewer* r, rl_conn* c, int64_t deadline) noexcept nogil:
    """Write ``r.out`` on ``c`` (mu held on entry and on return); 0, or -1 (failure in ``c``).

    What the socket takes at once is written under the lock, so that once
    end() has returned nothing more is sent for that term; the rest, if any,
    with mu released, before ``deadline``.
    """
    cdef ssize_t sent = conn_try_send(c, r.out.data, r.out.len)
    cdef int rc
    if sent < 0:
        return -1
    if <size_t>sent == r.out.len:
        return 0
    pthread_mutex_unlock(&r.mu)
    rc = conn_send(c, r.out.data + sent, r.out.len - <size_t>sent, deadline)
    pthread_mutex_lock(&r.mu)
    return rc
