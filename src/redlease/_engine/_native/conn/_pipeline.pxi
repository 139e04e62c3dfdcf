# Pipelined scripts: many EVALSHAs encoded into one buffer, sent at once on
# one Pool connection, their replies read back in order, all with the GIL
# released. Scripts the server does not know (NOSCRIPT) are sent again as
# EVAL, only those, in a second round trip: nothing runs twice, because a
# NOSCRIPT reply means that command did not run.
#
# Through sentinels or on a cluster the batch goes where its first command's
# slot lives (a fenced pipeline's keys all share the fence's slot). When every
# reply says "not executed here" (MOVED, READONLY, LOADING, TRYAGAIN...), the
# whole batch is resent after following the redirection, as route_run does
# for one command. When only some do, those replies stay errors: the others
# ran, and resending a part out of order is not a decision to take here. When
# every reply is ASK (the slot is being migrated and the keys have left), the
# batch goes once to the node named, each command after its own ASKING.
#
# Needs: _posix, _resp_encode, _resp_parse, _conn, _discovery, _sentinel, _cluster, _replies, _route, _pool.


cdef struct rl_bcmd:
    size_t start      # where this command's EVALSHA starts in the batch buffer
    size_t head       # end of its "*<n>\r\n"
    size_t tail       # start of its "<numkeys> keys... args..."
    size_t end        # one past its last byte
    const char* src   # its script's source, for the EVAL twin (kept alive by the caller)
    size_t srclen
    char kind         # the reply's type byte (: - $ + *)
    char what         # REPLY_DONE, REPLY_MOVED, REPLY_ASK or REPLY_RETRY
    bint noscript     # the reply was NOSCRIPT: the command did not run
    long long ival    # an integer reply
    size_t off        # any other reply: its bytes in the batch's ``raw``
    size_t len


cdef struct rl_batch:
    rl_buf w          # every EVALSHA, back to back
    rl_buf e          # what is sent again: the EVAL twins of the commands answered
                      # NOSCRIPT, or the whole batch with ASKING before each command
    rl_buf raw        # the bytes of every reply that is not an integer
    rl_bcmd* cmds
    size_t n
    int moved_slot    # from the first reply, when it was MOVED or ASK
    rl_addr moved_to


cdef void batch_free(rl_batch* b) noexcept nogil:
    buf_free(&b.w)
    buf_free(&b.e)
    buf_free(&b.raw)
    free(b.cmds)
    b.cmds = NULL
    b.n = 0


cdef inline int batch_classify(const char* base, rl_node* top, rl_disco* d) noexcept nogil:
    """reply_route_class for a reply parsed at ``base`` (not necessarily the buffer's start)."""
    return reply_route_class(base, top, d)


cdef int batch_keep(rl_conn* c, rl_batch* b, size_t i, const char* base, size_t n,
                    rl_disco* d) noexcept nogil:
    """Keep the reply of command ``i``: ``base[:n]``, parsed into ``c.nodes``."""
    cdef rl_bcmd* cmd = &b.cmds[i]
    cdef rl_node* top = &c.nodes.items[0]
    cmd.kind = top.kind
    cmd.noscript = node_is_noscript(base, top)
    cmd.what = batch_classify(base, top, d)
    if top.kind == c':':
        cmd.ival = top.ival
        return 0
    if (cmd.what == REPLY_MOVED or cmd.what == REPLY_ASK) and i == 0 and base == c.r.data:
        if parse_redirect(c, redirect_skip(cmd.what), &b.moved_slot, &b.moved_to) < 0:
            cmd.what = REPLY_DONE   # unreadable: reported as the error it is
    cmd.off = b.raw.len
    cmd.len = n
    return buf_put(&b.raw, base, n)


cdef inline size_t batch_next(rl_batch* b, size_t i, bint resend) noexcept nogil:
    """The first command from ``i`` on that is owed a reply (on a resend: the NOSCRIPT ones)."""
    while resend and i < b.n and not b.cmds[i].noscript:
        i += 1
    return i


cdef int batch_take(rl_conn* c, rl_batch* b, size_t* i, bint* asking_owed, bint asking,
                    bint resend, const char* base, size_t n, rl_disco* d) noexcept nogil:
    """One reply parsed into ``c.nodes``: ASKING's, or the one owed to command ``i[0]``."""
    if asking_owed[0]:
        asking_owed[0] = False
        if c.nodes.items[0].kind != c'+':
            conn_drop(c)     # the commands after it may have run without it
            return conn_fail(c, RL_ECONN, "ASKING was refused during a slot migration")
        return 0
    if batch_keep(c, b, i[0], base, n, d) < 0:
        conn_drop(c)
        return conn_fail(c, RL_ENOMEM, "out of memory keeping a reply")
    i[0] = batch_next(b, i[0] + 1, resend)
    asking_owed[0] = asking
    return 0


cdef int batch_read(rl_conn* c, rl_batch* b, bint resend, bint asking, rl_disco* d,
                    int64_t deadline) noexcept nogil:
    """Read and keep every reply owed, in order (with ``asking``, each after ASKING's).

    Each read is followed by every further whole reply already buffered, and
    the buffer is compacted once per read rather than once per reply, so a
    batch of thousands costs no more per reply than a batch of ten.
    """
    cdef size_t i = batch_next(b, 0, resend)
    cdef bint asking_owed = asking
    cdef size_t pos
    cdef Py_ssize_t rc
    while i < b.n:
        if conn_read_reply(c, deadline) < 0:
            return -1
        pos = c.reply_len
        if batch_take(c, b, &i, &asking_owed, asking, resend, c.r.data, pos, d) < 0:
            return -1
        while i < b.n:
            rc = conn_parse(c, pos)
            if rc == 0:
                break
            if rc < 0:
                return -1
            if batch_take(c, b, &i, &asking_owed, asking, resend, c.r.data + pos,
                          <size_t>rc, d) < 0:
                return -1
            pos += <size_t>rc
        c.reply_len = pos
        conn_consume(c)
    return 0


cdef int batch_put(rl_buf* out, rl_batch* b, size_t i, bint asking, bint eval) noexcept nogil:
    """Append command ``i`` to ``out``: ASKING first with ``asking``, as EVAL with ``eval``."""
    cdef rl_bcmd* cmd = &b.cmds[i]
    if asking and buf_put(out, ASKING_CMD, strlen(ASKING_CMD)) < 0:
        return -1
    if not eval:
        return buf_put(out, b.w.data + cmd.start, cmd.end - cmd.start)
    if (buf_put(out, b.w.data + cmd.start, cmd.head - cmd.start) < 0
            or buf_put(out, b"$4\r\nEVAL\r\n", 10) < 0
            or buf_put_bulk(out, cmd.src, cmd.srclen) < 0):
        return -1
    return buf_put(out, b.w.data + cmd.tail, cmd.end - cmd.tail)


cdef int batch_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil:
    if d == NULL:
        return conn_ready(c, deadline)
    if d.kind == DISCO_SENTINEL:
        return sentinel_prepare(c, d, deadline)
    return cluster_prepare(c, d, deadline)


cdef void batch_lost(rl_conn* c, rl_disco* d) noexcept nogil:
    """After a failed round trip: a lost connection makes the next one look the server up."""
    cdef rl_addr here
    if d == NULL or c.fd >= 0 or conn_stopped(c):
        return
    conn_addr(c, &here)
    if d.kind == DISCO_SENTINEL:
        sentinel_forget(d, &here)
    else:
        cluster_forget(d)


cdef int batch_run(rl_conn* c, rl_batch* b, int64_t deadline) noexcept nogil:
    """Send the batch, read every reply, resend the NOSCRIPT ones as EVAL; 0 or -1.

    -1 (the failure recorded in ``c``) means some replies were not read: the
    commands' outcome is unknown and nothing is sent again.
    """
    cdef rl_disco* d = <rl_disco*>c.disco
    cdef size_t i
    cdef bint missing = False
    cdef bint asking = False
    cdef int redirects = 0, retried = 0, rc
    cdef char what
    cdef bint all_same
    while True:
        if asking:
            # Every command answered ASK: all of them, each after ASKING, to that node.
            conn_set_addr(c, &b.moved_to)
            conn_probe_idle(c)
            if c.fd < 0 and conn_connect(c, deadline) < 0:
                return -1
            b.e.len = 0
            for i in range(b.n):
                if batch_put(&b.e, b, i, True, False) < 0:
                    return conn_fail(c, RL_ENOMEM, "out of memory encoding ASKING")
            if conn_send(c, b.e.data, b.e.len, deadline) < 0:
                return -1
        else:
            if batch_prepare(c, d, deadline) < 0:
                batch_lost(c, d)
                return -1
            if conn_send(c, b.w.data, b.w.len, deadline) < 0:
                batch_lost(c, d)
                return -1
        b.raw.len = 0
        if batch_read(c, b, False, asking, d, deadline) < 0:
            batch_lost(c, d)
            return -1
        c.last_used = rl_now_ns()
        if d == NULL or asking:
            break
        # Resend the whole batch only when no command of it ran.
        what = b.cmds[0].what
        all_same = what != REPLY_DONE
        i = 1
        while all_same and i < b.n:
            all_same = b.cmds[i].what == what
            i += 1
        if not all_same:
            break
        if what == REPLY_ASK:
            asking = True
            continue
        if what == REPLY_MOVED:
            redirects += 1
            if redirects > MAX_REDIRECTS:
                break
            slot_moved(d, b.moved_slot, &b.moved_to)
            conn_set_addr(c, &b.moved_to)
            continue
        # REPLY_RETRY: not executed; look the server up again, then resend once.
        retried += 1
        rc = route_rediscover(c, d, deadline, retried, False)
        if rc > 0:
            break
        if rc < 0:
            return -1
    b.e.len = 0
    for i in range(b.n):
        if b.cmds[i].noscript:
            missing = True
            if batch_put(&b.e, b, i, asking, True) < 0:
                return conn_fail(c, RL_ENOMEM, "out of memory encoding EVAL")
    if not missing:
        return 0
    if conn_send(c, b.e.data, b.e.len, deadline) < 0:
        batch_lost(c, d)
        return -1
    if batch_read(c, b, True, asking, d, deadline) < 0:
        batch_lost(c, d)
        return -1
    c.last_used = rl_now_ns()
    return 0


cdef inline bint immutable_arg(object arg) noexcept:
    """An argument whose encoding cannot change between two reads (exact str, bytes or int)."""
    return type(arg) is str or type(arg) is bytes or type(arg) is int


cdef type SERIES_TYPE = _ScriptRun


cdef Py_ssize_t batch_calls(list requests) except -1:
    """How many commands ``requests`` make: one per request, one per call of a run."""
    cdef Py_ssize_t n = 0
    for request in requests:
        n += len((<object>request).firsts) if type(request) is SERIES_TYPE else 1
    return n


cdef object batch_first_keys(object request):
    """The keys of ``request``'s first command (what routes the batch on a cluster)."""
    if type(request) is not SERIES_TYPE:
        return request[1]
    if request.first_is_key and not request.keys:
        return request.firsts[:1]
    return request.keys


cdef int encode_run(rl_batch* b, object run, ScriptRef ref) except -1:
    """Each call of a ``ScriptSeries`` as an EVALSHA appended to ``b.w``, from its lists.

    The bytes every call shares (the header, the sha, the key count, the
    run's own keys; then its own args) are encoded once and copied for each
    further call; only ``firsts[i]`` and ``seconds[i]`` are encoded per call.
    """
    cdef tuple keys = run.keys
    cdef tuple args = run.args
    cdef list firsts = run.firsts
    cdef list seconds = run.seconds
    cdef bint first_is_key = run.first_is_key
    cdef Py_ssize_t m = len(firsts)
    cdef Py_ssize_t nkeys = len(keys) + (1 if first_is_key else 0)
    cdef Py_ssize_t nargs = len(args) + (0 if first_is_key else 1) + 1
    cdef Py_ssize_t i
    cdef size_t start, head = 0, tail = 0, s1 = 0, s1len = 0, s2 = 0, s2len = 0
    cdef rl_bcmd* out
    cdef char num[24]
    cdef int k
    if len(seconds) != m:
        raise ValueError(f"a run needs as many firsts as seconds: {m} != {len(seconds)}")
    for i in range(m):
        start = b.w.len
        if i == 0:
            if buf_put_prefix(&b.w, c'*', 3 + nkeys + nargs) < 0:
                raise MemoryError()
            head = b.w.len - start
            if (buf_put(&b.w, b"$7\r\nEVALSHA\r\n", 13) < 0
                    or buf_put_bulk(&b.w, PyBytes_AS_STRING(ref.sha),
                                    <size_t>PyBytes_GET_SIZE(ref.sha)) < 0):
                raise MemoryError()
            tail = b.w.len - start
            k = fmt_ll(num, nkeys)
            if buf_put_bulk(&b.w, num, <size_t>k) < 0:
                raise MemoryError()
            for key in keys:
                put_arg(&b.w, key)
            s1 = start
            s1len = b.w.len - start
        elif buf_put_copy(&b.w, s1, s1len) < 0:
            raise MemoryError()
        if first_is_key:
            put_arg(&b.w, firsts[i])
        if i == 0:
            s2 = b.w.len
            for arg in args:
                put_arg(&b.w, arg)
            s2len = b.w.len - s2
        elif s2len and buf_put_copy(&b.w, s2, s2len) < 0:
            raise MemoryError()
        if not first_is_key:
            put_arg(&b.w, firsts[i])
        put_arg(&b.w, seconds[i])
        out = &b.cmds[b.n]
        out.start = start
        out.head = start + head
        out.tail = start + tail
        out.end = b.w.len
        out.src = PyBytes_AS_STRING(ref.source)
        out.srclen = <size_t>PyBytes_GET_SIZE(ref.source)
        out.kind = 0
        out.what = REPLY_DONE
        out.noscript = False
        out.ival = 0
        out.off = 0
        out.len = 0
        b.n += 1
    return 0


cdef bint batch_encode_scripts(rl_batch* b, list requests, dict refs, object make_ref,
                               list keep) except -1:
    """Each ``(Script, keys, args)`` as an EVALSHA appended to ``b.w``, with no copy between,
    and each call of a ``ScriptSeries`` likewise (``encode_run``).

    A script's ScriptRef is looked up (``refs``, else ``make_ref``) once per
    run of requests naming the same script, and kept alive in ``keep``. A
    request that repeats the previous one's script, arity and first key
    (the fence's mark key, in a fenced pipeline) copies that encoded
    prefix instead of encoding it again, and one whose first arg is the
    previous one's (the token) copies its encoding. True when every request
    names the first one's script.
    """
    cdef Py_ssize_t n = len(requests)
    cdef Py_ssize_t i, j, nkeys = 0, nargs = 0
    cdef Py_ssize_t prev_nkeys = -1, prev_nargs = -1
    cdef Py_ssize_t total = batch_calls(requests)
    cdef object request, script, found
    cdef object prev_script = None
    cdef object prev_first = None
    cdef object prev_arg = None
    cdef size_t astart = 0, alen = 0
    cdef tuple keys, args
    cdef ScriptRef ref = None
    cdef size_t start, pstart = 0, plen = 0, phead = 0, ptail = 0
    cdef bint same = True
    cdef rl_bcmd* out
    cdef char num[24]
    cdef int k
    # Not zeroed: every field is set below, or by the reply it is read from.
    b.cmds = <rl_bcmd*>realloc(NULL, (<size_t>total if total else 1) * sizeof(rl_bcmd))
    if b.cmds == NULL:
        raise MemoryError()
    for i in range(n):
        request = requests[i]
        if type(request) is SERIES_TYPE:
            script = request.script
            if script is not prev_script:
                same = same and b.n == 0
                found = refs.get(script.sha)
                ref = <ScriptRef>(found if found is not None else make_ref(script))
                keep.append(ref)
                prev_script = script
            encode_run(b, request, ref)
            # What the next request may copy is this run's, not what came before it.
            prev_first = None
            prev_arg = None
            continue
        if type(request) is tuple and len(<tuple>request) == 3:
            script = (<tuple>request)[0]
            keys = (<tuple>request)[1] if type((<tuple>request)[1]) is tuple \
                else tuple((<tuple>request)[1])
            args = (<tuple>request)[2] if type((<tuple>request)[2]) is tuple \
                else tuple((<tuple>request)[2])
        else:
            script, keys_seq, args_seq = request
            keys = tuple(keys_seq)
            args = tuple(args_seq)
        if script is not prev_script:
            same = same and b.n == 0
            found = refs.get(script.sha)
            ref = <ScriptRef>(found if found is not None else make_ref(script))
            keep.append(ref)
            prev_script = script
            prev_first = None
        nkeys = len(keys)
        nargs = len(args)
        start = b.w.len
        out = &b.cmds[b.n]
        if (prev_first is not None and nkeys == prev_nkeys and nargs == prev_nargs
                and keys[0] is prev_first):
            # The same script, arity and first key as the previous request: the
            # same bytes up to and with that key.
            if buf_put_copy(&b.w, pstart, plen) < 0:
                raise MemoryError()
            out.head = start + phead
            out.tail = start + ptail
        else:
            if buf_put_prefix(&b.w, c'*', 3 + nkeys + nargs) < 0:
                raise MemoryError()
            out.head = b.w.len
            if (buf_put(&b.w, b"$7\r\nEVALSHA\r\n", 13) < 0
                    or buf_put_bulk(&b.w, PyBytes_AS_STRING(ref.sha),
                                    <size_t>PyBytes_GET_SIZE(ref.sha)) < 0):
                raise MemoryError()
            out.tail = b.w.len
            k = fmt_ll(num, nkeys)
            if buf_put_bulk(&b.w, num, <size_t>k) < 0:
                raise MemoryError()
            prev_first = None
            if nkeys > 0:
                put_arg(&b.w, keys[0])
                if immutable_arg(keys[0]):
                    prev_first = keys[0]
                    prev_nkeys = nkeys
                    prev_nargs = nargs
                    pstart = start
                    plen = b.w.len - start
                    phead = out.head - start
                    ptail = out.tail - start
        for j in range(1, nkeys):
            put_arg(&b.w, keys[j])
        if nargs > 0:
            if prev_arg is not None and args[0] is prev_arg:
                if buf_put_copy(&b.w, astart, alen) < 0:
                    raise MemoryError()
            else:
                astart = b.w.len
                put_arg(&b.w, args[0])
                alen = b.w.len - astart
                prev_arg = args[0] if immutable_arg(args[0]) else None
        for j in range(1, nargs):
            put_arg(&b.w, args[j])
        out.start = start
        out.end = b.w.len
        out.src = PyBytes_AS_STRING(ref.source)
        out.srclen = <size_t>PyBytes_GET_SIZE(ref.source)
        out.kind = 0
        out.what = REPLY_DONE
        out.noscript = False
        out.ival = 0
        out.off = 0
        out.len = 0
        b.n += 1
    return same


cdef bint batch_all_flags(rl_batch* b) noexcept:
    """Every reply of the batch an integer 0 or 1."""
    cdef size_t i
    for i in range(b.n):
        if b.cmds[i].kind != c':' or (b.cmds[i].ival != 0 and b.cmds[i].ival != 1):
            return False
    return True


cdef list batch_replies(rl_batch* b):
    """Every reply as redis-py gives it, error replies as exception objects (not raised)."""
    cdef list replies = []
    cdef rl_bcmd* cmd
    cdef rl_nodes nodes
    cdef size_t i, k
    cdef Py_ssize_t rc
    memset(&nodes, 0, sizeof(nodes))
    try:
        for i in range(b.n):
            cmd = &b.cmds[i]
            if cmd.kind == c':':
                replies.append(cmd.ival)
                continue
            rc = resp_parse(b.raw.data + cmd.off, cmd.len, &nodes)
            if rc == -2:
                raise MemoryError()
            if rc <= 0:
                raise _RedisConnectionError("Protocol error: a kept reply no longer parses")
            k = 0
            if nodes.items[0].kind == c'-':
                replies.append(error_from_reply(b.raw.data + cmd.off + nodes.items[0].off,
                                                <Py_ssize_t>nodes.items[0].ival))
            else:
                replies.append(build_reply(b.raw.data + cmd.off, nodes.items, &k))
    finally:
        free(nodes.items)
    return replies


cdef object batch_execute(Pool pool, rl_batch* b, object first_keys, object known_slot,
                          int64_t deadline, int replicas, int wait_ms, object wait_cmd):
    """Run the encoded batch on one of ``pool``'s connections (WAIT after it with
    ``replicas``); the number of replicas that acknowledged (0 without). It goes to
    the slot of ``first_keys``, ``known_slot`` when not None (``command_slot``)."""
    cdef rl_slot* slot
    cdef rl_conn* c
    cdef int rc, key_slot
    acked = 0
    key_slot = command_slot(pool.target.disco, first_keys, known_slot)
    slot = pool.grab_for(key_slot, deadline)
    c = &slot.conn
    try:
        c.slot = key_slot
        with nogil:
            rc = batch_run(c, b, deadline)
        if rc < 0:
            raise conn_exception(c)
        if replicas > 0:
            acked = wait_replicas(c, pool.target.address, wait_cmd, wait_ms, deadline)
    finally:
        release_slot(slot)
    return acked


def execute_scripts(Pool pool not None, list requests not None, dict refs not None,
                    make_ref not None, double timeout, int replicas=0, int wait_ms=0,
                    slot=None):
    """Run ``[(Script, keys, args), ...]`` in one round trip on one of ``pool``'s
    connections: ``(replies, acknowledged, flags)``.

    The replies come back in order as redis-py gives them; an error reply is
    an exception object in the list, not raised, so every reply is read
    before the caller decides. A failure that leaves replies unread (the
    connection broke, the deadline passed) raises redis-py's ConnectionError
    or TimeoutError: those commands may or may not have run, and none is sent
    again. ``timeout`` bounds the whole batch, the NOSCRIPT resend included.
    An argument that cannot be encoded raises before the connection is used.

    Each ``Script``'s ScriptRef comes from ``refs`` (made by ``make_ref`` the
    first time), looked up once per run of requests naming the same script.
    With ``replicas`` > 0 the batch is followed by ``WAIT replicas wait_ms`` on
    the same connection (GIL released; ``wait_ms`` beyond the batch's
    deadline) and ``acknowledged`` is the replicas it counted; 0 without.
    ``flags`` is True when every request names the first one's script and
    every reply is an integer 0 or 1: then a script whose replies are flags
    needs no reply checked one by one. ``slot``: the first request's first
    key's cluster slot when the caller knows it (None: hashed here), for
    every request of a batch is bound for one slot.
    """
    cdef int64_t deadline = deadline_after(timeout)
    cdef rl_batch b
    cdef bint same
    cdef list keep = []
    wait_cmd = _timing.wait_command(replicas, wait_ms) if replicas > 0 else None
    memset(&b, 0, sizeof(b))
    try:
        same = batch_encode_scripts(&b, requests, refs, make_ref, keep)
        if b.n == 0:
            return [], 0, False
        acked = batch_execute(pool, &b, batch_first_keys(requests[0]), slot, deadline,
                              replicas, wait_ms, wait_cmd)
        return batch_replies(&b), acked, same and batch_all_flags(&b)
    finally:
        batch_free(&b)
