# The shared renewer's thread: renewer_main takes every lease due now (or
# within RENEW_WINDOW_NS) off the timer heap as one batch and renews it, on a
# cluster through cluster_round, else pipelined on the renewer's one
# connection (which behind Sentinel follows the master the sentinels name).
# No GIL, ever: it talks to Python through the leases' atomics and eventfds.
#
# Needs: _posix, _conn, _discovery, _sentinel, _pipeline (batch_prepare, batch_lost), _lease, _renewer_heap, _renewer_cluster.

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


# ---------------------------------------------------------------- the thread

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


cdef int64_t renewer_wake_at(rl_lease* top) noexcept nogil:
    """When the thread wakes for ``top``, the heap's first lease (mu held).

    One window before its renewal is due: a renewal may go out up to
    RENEW_WINDOW_NS early (its deadline moves the same amount earlier, its
    schedule does not), so a wake-up the scheduler delays by less than that
    (a busy host, a thread holding the GIL on the other core) still sends it
    on time. A lease whose deadline comes first is woken for at its deadline
    (to be lost then), not before.
    """
    if top.next_send < top.lease_deadline:
        return top.next_send - RENEW_WINDOW_NS
    return top.lease_deadline


cdef void* renewer_main(void* arg) noexcept nogil:
    cdef rl_renewer* r = <rl_renewer*>arg
    cdef rl_conn* c = &r.conn
    cdef rl_lease* l
    cdef rl_lease* top
    cdef int64_t now, deadline, d, wake_at
    cdef int rc, nloads, j, fd
    cdef size_t i
    rl_name_renewer_thread()
    pthread_mutex_lock(&r.mu)
    while not r.stop:
        if r.heap_len == 0:
            pthread_cond_wait(&r.cv, &r.mu)
            continue
        now = rl_now_ns()
        top = r.heap[0]
        wake_at = renewer_wake_at(top)
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
        if renewals_encode(r, 0, &r.batch_len, r.need_load, &nloads) < 0:
            conn_fail(c, RL_ENOMEM, "out of memory encoding renewals")
            batch_fail(r, 0, c.err_kind, c.err_msg)
            continue
        if r.batch_len == 0:
            continue
        if renewals_send(r, c, deadline) < 0:
            batch_fail(r, 0, c.err_kind, c.err_msg)
            renewer_lost(r)
            continue
        pthread_mutex_unlock(&r.mu)
        rc = 0
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
            i += call_apply_reply(r, NULL, i, c)
            conn_consume(c)
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
