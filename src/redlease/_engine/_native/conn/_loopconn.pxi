# One connection driven by an asyncio event loop instead of a blocked thread.
#
# The loop watches the socket (``loop.add_reader`` / ``add_writer``) and calls
# in here only when it is ready, so nothing ever waits: ``put`` encodes a
# script call in C onto the output buffer, ``flush`` sends what the socket
# takes right now, ``read`` takes what has arrived and parses every whole
# reply in C. Many calls are in flight at once; matching replies to callers,
# in order, is the driver's job (``redlease._engine.contract.aiowriter``). Only the
# connect (and its handshake) blocks, on an executor thread, once per
# connection: it touches the socket and the read buffer, never the output
# buffer, so calls can be queued while it runs.
#
# TLS works the same way: reads drain OpenSSL until it wants more from the
# socket, so no decrypted byte is left inside it where the loop cannot see.
# Through sentinels the connect goes to the master they name; on a cluster,
# to the owner of the slot of the calls queued (a fenced write's keys all
# live in its name's slot). A reply saying the call did not run here
# (READONLY, MASTERDOWN, LOADING; MOVED, ASK, TRYAGAIN, CLUSTERDOWN) makes
# the next connect look the server up again; the driver sends such a call
# again the blocking way, which follows the topology, and reconnects.
#
# Needs: _posix, _process (ProcessBound), _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _cluster, _replies, _pool.


cdef class LoopConn(ProcessBound):
    """A non-blocking native connection for an event loop's pipelined fenced writes.

    Not thread-safe: every method but ``connect`` runs on the loop's thread,
    and ``connect`` runs while nothing else touches the socket.
    """

    cdef rl_conn conn
    cdef rl_buf out          # encoded calls not yet (fully) sent
    cdef size_t sent         # how much of ``out`` the socket took
    cdef int want_slot       # cluster: the slot of the latest call queued (-1: none)
    cdef readonly Target target
    cdef dict refs           # a script's SHA1 -> its ScriptRef (the engine's table)
    cdef object make_ref     # makes (and enters) the ScriptRef of a script not in ``refs``
    cdef object __weakref__

    def __cinit__(self):
        memset(&self.conn, 0, sizeof(rl_conn))
        self.conn.fd = -1
        self.conn.cancel_fd = -1
        memset(&self.out, 0, sizeof(rl_buf))
        self.sent = 0
        self.want_slot = -1

    def __init__(self, Target target not None, dict refs not None, make_ref not None):
        self.target = target
        self.refs = refs
        self.make_ref = make_ref
        target.init_conn(&self.conn)
        _live.add(self)

    def __dealloc__(self):
        self.inherited()
        conn_free(&self.conn)
        buf_free(&self.out)

    def connect(self, double timeout):
        """Open the socket and run the handshake, bounded by ``timeout`` (blocks, GIL released)."""
        cdef int64_t deadline = deadline_after(timeout)
        cdef rl_conn* c = &self.conn
        cdef rl_addr here
        cdef int rc
        if c.fd >= 0:
            return
        c.slot = self.want_slot
        with nogil:
            if c.disco == NULL:
                rc = conn_connect(c, deadline)
            elif (<rl_disco*>c.disco).kind == DISCO_SENTINEL:
                rc = sentinel_prepare(c, <rl_disco*>c.disco, deadline)
                if rc < 0 and c.fd < 0:
                    conn_addr(c, &here)
                    sentinel_forget(<rl_disco*>c.disco, &here)
            else:
                rc = cluster_prepare(c, <rl_disco*>c.disco, deadline)
                if rc < 0 and c.fd < 0 and not conn_stopped(c):
                    cluster_forget(<rl_disco*>c.disco)
        if rc < 0:
            raise conn_exception(c)

    @property
    def connected(self):
        return self.conn.fd >= 0

    def fileno(self):
        return self.conn.fd

    @property
    def outdated(self):
        """Through sentinels: the master is no longer known to be the server this one reaches.

        Cleared when a master switch was announced (``Target.forget_master``)
        or another connection found a new master; the next connect asks again.
        """
        cdef rl_disco* d = <rl_disco*>self.conn.disco
        cdef rl_addr here
        cdef bint same
        if d == NULL or self.conn.fd < 0:
            return False
        conn_addr(&self.conn, &here)
        pthread_mutex_lock(&d.mu)
        same = d.master_known and same_addr(&d.master, &here)
        pthread_mutex_unlock(&d.mu)
        return not same

    @property
    def unsent(self):
        """Bytes queued and not yet taken by the socket."""
        return self.out.len - self.sent

    def put(self, script, keys, args, bint load=False, slot=None):
        """Queue ``EVALSHA`` (or with ``load``, ``EVAL``) of ``script`` with ``keys`` and ``args``.

        ``script`` is a ``redlease._scripts.Script``; its ``ScriptRef`` comes
        from ``refs`` (made by ``make_ref`` the first time). ``slot``: the
        first key's cluster slot when the caller knows it (None: hashed here;
        see ``command_slot``).
        """
        cdef rl_script_cmd cmd
        cdef rl_conn* c = &self.conn
        cdef object found = self.refs.get(script.sha)
        cdef ScriptRef ref = <ScriptRef>(found if found is not None else self.make_ref(script))
        put_evalsha(&c.w, ref.sha, ref.source, keys, args, &cmd)
        if c.disco != NULL and (<rl_disco*>c.disco).kind == DISCO_CLUSTER:
            self.want_slot = command_slot(c.disco, keys, slot)
        if load:
            if build_eval(&c.e, &c.w, &cmd) < 0:
                raise MemoryError()
            if buf_put(&self.out, c.e.data, c.e.len) < 0:
                raise MemoryError()
        elif buf_put(&self.out, c.w.data, c.w.len) < 0:
            raise MemoryError()

    def flush(self):
        """Send what the socket takes now; True once nothing is left to send.

        An I/O error drops the connection and raises ConnectionError.
        """
        cdef rl_conn* c = &self.conn
        cdef ssize_t k
        cdef size_t rest
        if c.fd < 0:
            return self.out.len == self.sent
        while self.sent < self.out.len:
            k = conn_try_send(c, self.out.data + self.sent, self.out.len - self.sent)
            if k < 0:
                self.clear()
                raise conn_exception(c)
            if k == 0:
                break
            self.sent += <size_t>k
        if self.sent == self.out.len:
            self.out.len = 0
            self.sent = 0
            if self.out.cap > READ_KEEP:
                buf_free(&self.out)
            return True
        if self.sent > self.out.len // 2:
            rest = self.out.len - self.sent
            memmove(self.out.data, self.out.data + self.sent, rest)
            self.out.len = rest
            self.sent = 0
        return False

    def read(self):
        """Every whole reply that has arrived, oldest first (may be empty).

        An error reply is an exception instance in the list, not raised. End
        of stream, an I/O error or a malformed reply drops the connection and
        raises ConnectionError.
        """
        cdef rl_conn* c = &self.conn
        cdef ssize_t k
        cdef size_t space
        cdef size_t off = 0
        cdef size_t i
        cdef Py_ssize_t rc
        cdef rl_node* top
        cdef list replies = []
        if c.fd < 0:
            return replies
        if c.ssl != NULL:
            self.read_tls()
        while c.ssl == NULL:
            if buf_reserve(&c.r, READ_CHUNK) < 0:
                raise MemoryError()
            space = c.r.cap - c.r.len
            k = recv(c.fd, c.r.data + c.r.len, space, MSG_DONTWAIT)
            if k > 0:
                c.r.len += <size_t>k
                if <size_t>k < space:
                    break
            elif k == 0:
                conn_fail(c, RL_ECONN, "Connection closed by server.")
                conn_drop(c)
                raise conn_exception(c)
            elif errno == EINTR:
                continue
            elif rl_would_block(errno):
                break
            else:
                conn_io_error(c, errno, "reading from")
                raise conn_exception(c)
        while off < c.r.len:
            rc = conn_parse(c, off)
            if rc == 0:
                break
            if rc < 0:
                raise conn_exception(c)
            top = &c.nodes.items[0]
            if top.kind == c':':
                replies.append(top.ival)
            elif top.kind == c'-':
                replies.append(error_from_reply(c.r.data + off + top.off, <Py_ssize_t>top.ival))
                if c.disco != NULL and reply_ran_elsewhere(c.r.data + off, top):
                    # Not run here: the next connect looks the server up again.
                    if (<rl_disco*>c.disco).kind == DISCO_SENTINEL:
                        disco_forget_master(c.disco)
                    else:
                        cluster_forget(<rl_disco*>c.disco)
            else:
                i = 0
                replies.append(build_reply(c.r.data + off, c.nodes.items, &i))
            off += <size_t>rc
        if off:
            if off < c.r.len:
                memmove(c.r.data, c.r.data + off, c.r.len - off)
            c.r.len -= off
            if c.r.len == 0 and c.r.cap > READ_KEEP:
                buf_free(&c.r)
        c.last_used = rl_now_ns()
        return replies

    cdef int read_tls(self) except -1:
        """Decrypt everything that has arrived into ``conn.r``, until OpenSSL wants the socket."""
        cdef rl_conn* c = &self.conn
        cdef char msg[300]
        cdef size_t got = 0
        cdef int st, sys_errno = 0
        while True:
            if buf_reserve(&c.r, READ_CHUNK) < 0:
                raise MemoryError()
            st = rl_tls_read(c.ssl, c.r.data + c.r.len, c.r.cap - c.r.len, &got,
                             &sys_errno, msg, TLS_MSG)
            if st == RL_TLS_OK:
                c.r.len += got
            elif st == RL_TLS_WANT_READ or st == RL_TLS_WANT_WRITE:
                return 0
            else:
                tls_fail(c, st, sys_errno, "reading from", msg)
                raise conn_exception(c)

    def clear(self):
        """Forget every queued call (sent or not)."""
        self.out.len = 0
        self.sent = 0

    def drop(self):
        """Close the socket and forget every queued call and every unread byte."""
        self.clear()
        conn_drop(&self.conn)

    cdef void forget_parent(self) noexcept:
        # The parent still owns the stream: close our copy, send nothing.
        self.out.len = 0
        self.sent = 0
        tls_forget_after_fork(&self.conn)
        conn_drop(&self.conn)
