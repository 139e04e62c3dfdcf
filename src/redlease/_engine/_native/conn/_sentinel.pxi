# Sentinel: asking the sentinels for the master, checking its ROLE (no GIL).
# Part of the discovery layer; shared state and helpers are in _discovery.pxi.
#
# Needs: _posix, _resp_parse, _conn, _discovery.

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
        t = ask_conn(c, &peer, d.s_hello, d.s_hello_len, d.s_hello_replies,
                     d.s_tls_ctx, d.s_check_hostname)
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


cdef void keep_first_failure(rl_conn* c, int* kind, char* msg) noexcept nogil:
    """Remember the round trip's first failure that was not a timeout."""
    if kind[0] == RL_OK and c.err_kind != RL_ETIMEOUT and c.err_kind != RL_OK:
        kind[0] = c.err_kind
        strncpy(msg, c.err_msg, ERR_MSG - 1)
        msg[ERR_MSG - 1] = 0


cdef int fail_with_first(rl_conn* c, rl_disco* d, int kind, const char* msg) noexcept nogil:
    """End the round trip: with its first definite failure (a refused certificate, a
    refused connection...) rather than the timeout or the "no time left" that the
    retries after it ran into, which would hide why the master could not be used."""
    cdef char why[ERR_MSG]
    if kind != RL_OK and (c.err_kind == RL_ETIMEOUT or c.err_kind == RL_ENOMASTER):
        c.err_kind = kind
        strncpy(why, msg, ERR_MSG - 1)
    else:
        strncpy(why, c.err_msg, ERR_MSG - 1)
    why[ERR_MSG - 1] = 0
    if strncmp(why, b"Service '", 9) == 0 or strncmp(why, b"No master found", 15) == 0:
        strncpy(c.err_msg, why, ERR_MSG - 1)
    else:
        snprintf(c.err_msg, ERR_MSG, "Service '%s': %s", d.service, why)
    return -1


cdef int sentinel_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil:
    """Connect ``c`` to the master the sentinels name, a master by its own ``ROLE``."""
    cdef rl_addr cur, found
    cdef int known, rc
    cdef int64_t now, checked
    cdef int first_kind = RL_OK
    cdef char first_msg[ERR_MSG]
    first_msg[0] = 0
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
            if rc < 0:
                return -1
            if rc == 0:
                if first_kind != RL_OK:
                    return fail_with_first(c, d, first_kind, first_msg)
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
        keep_first_failure(c, &first_kind, first_msg)
        conn_drop(c)
        sentinel_forget(d, &cur)
        if rl_now_ns() + RETRY_PAUSE_NS >= deadline:
            return fail_with_first(c, d, first_kind, first_msg)
        if disco_pause(c, RETRY_PAUSE_NS, deadline) < 0:
            return -1
