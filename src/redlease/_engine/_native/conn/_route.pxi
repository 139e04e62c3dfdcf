# One routed round trip (no GIL): send to the server discovery chose, and
# react to what comes back (MOVED, ASK, READONLY, TRYAGAIN...; see _replies.pxi).
#
# Needs: _posix, _resp_encode, _conn, _discovery, _sentinel, _cluster, _replies.

cdef inline int classify_reply(rl_conn* c, rl_disco* d) noexcept nogil:
    return reply_route_class(c.r.data, &c.nodes.items[0], d)


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


cdef int route_rediscover(rl_conn* c, rl_disco* d, int64_t deadline,
                          int retried, bint consume) noexcept nogil:
    """After a reply saying the command did not run here: forget this server, pause,
    and let the caller resend. 0: resend; 1: do not (the one resend was made, or
    the deadline is too near; the reply stands); -1: failed (``c`` says why).
    With ``consume``, the buffered reply is consumed (only when resending)."""
    cdef rl_addr here
    if retried > 1 or rl_now_ns() + RETRY_PAUSE_NS >= deadline:
        return 1
    if consume:
        conn_consume(c)
    conn_addr(c, &here)
    conn_drop(c)
    if d.kind == DISCO_SENTINEL:
        sentinel_forget(d, &here)
    else:
        cluster_forget(d)
    if disco_pause(c, RETRY_PAUSE_NS, deadline) < 0:
        return -1
    return 0


cdef int route_run(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                   rl_sender sender, void* ctx, bint script) noexcept nogil:
    """One round trip of the command in ``c.w`` (a script when ``script``), wherever it belongs.

    With a fixed address this is conn_run_script / conn_run_command. Through
    sentinels or on a cluster, the connection is first pointed at the master
    or at its slot's owner (asking the sentinels, or for CLUSTER SLOTS, when
    not known), and replies that say the command was not executed there are
    followed: MOVED (the map is updated, the command resent to the owner),
    ASK (``ASKING`` + the command to that node, once), and the replies the
    reply table resends (``replytable.resends``: the master is looked up
    again and the command resent once). A command that may
    have executed is never resent: a connection lost after the send fails
    the round trip (and makes the next one look the server up again).
    Returns as conn_run_script does.
    """
    cdef rl_disco* d = <rl_disco*>c.disco
    cdef rl_addr here, there
    cdef int rc, what, redirects = 0, retried = 0, slot
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
            if parse_redirect(c, redirect_skip(what), &slot, &there) < 0:
                return 0
            conn_consume(c)
            if what == REPLY_MOVED:
                slot_moved(d, slot, &there)
                conn_set_addr(c, &there)
            else:
                asking = True
            continue
        # REPLY_RETRY: not executed; look the server up again, then resend once.
        retried += 1
        rc = route_rediscover(c, d, deadline, retried, True)
        if rc != 0:
            return 0 if rc > 0 else -1
