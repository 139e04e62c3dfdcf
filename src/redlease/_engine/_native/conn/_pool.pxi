# The Python-facing connection objects: ScriptRef (a script as the wire wants
# it), Target (where to connect and what to say first), Pool (a few
# connections safe from any thread), and the glue that turns a connection's
# failures and replies into Python objects, with the GIL.
#
# A slot's mutex is only ever waited for with the GIL released (see the lock
# discipline in _core.pyx); with the GIL held it is only ``trylock``-ed.
#
# Needs: _posix, _process (ProcessBound), _resp_encode, _resp_parse, _conn, _tls, _discovery, _sentinel, _route.

from redis.exceptions import ConnectionError as _RedisConnectionError
from redis.exceptions import InvalidResponse as _RedisInvalidResponse
from redis.exceptions import ResponseError as _RedisResponseError
from redis.exceptions import TimeoutError as _RedisTimeoutError

from redlease._engine.rules.replies import UnexpectedReply as _UnexpectedReply

cdef int64_t FOREVER_NS = 1 << 62


# ---------------------------------------------------------------- failures and replies (GIL held)

cdef object make_exception(int kind, bytes message):
    cdef str text = message.decode("utf-8", "replace")
    if kind == RL_ETIMEOUT:
        return _RedisTimeoutError(text)
    if kind == RL_ECONN or kind == RL_ECANCELLED:
        return _RedisConnectionError(text)
    if kind == RL_EPROTO:
        # A malformed reply: what redis-py's own parsers raise for one.
        return _RedisInvalidResponse(text)
    if kind == RL_EREPLY:
        return _reply_error(text)
    if kind == RL_ENOMEM:
        return MemoryError(text)
    if kind == RL_ENOMASTER:
        return _RedisMasterNotFoundError(text)
    if kind == RL_EUNEXPECTED:
        # A reply the script cannot give: the same error the Python engine raises.
        return _UnexpectedReply(text)
    return _behind_service(text) or _RedisResponseError(text)


cdef object _reply_error(str text):
    """An error reply, as redis-py's parser makes it."""
    return _behind_service(text) or _parse_error(text)


cdef object _behind_service(str text):
    """Behind Sentinel the core names the service before the master's reply ("Service
    'svc': WRONGPASS ..."): the error of the class that reply's code maps to, as on the
    Python engine, its text keeping the service; None for any other failure."""
    cdef str service, sep, reply
    if not text.startswith("Service '"):
        return None
    service, sep, reply = text.partition("': ")
    if not (sep and reply):
        return None
    return type(_parse_error(reply))(text)


cdef int reraise_pending() except -1:
    return -1


cdef object conn_exception(rl_conn* c):
    if c.err_kind == RL_EINTERRUPTED:
        reraise_pending()
    return make_exception(c.err_kind, PyBytes_FromString(c.err_msg))


cdef object take_reply(rl_conn* c):
    """The buffered reply as Python objects (a top-level error is raised); consumes it."""
    cdef size_t i = 0
    cdef rl_node* top = &c.nodes.items[0]
    cdef object value
    if top.kind == c':':
        value = top.ival
        conn_consume(c)
        return value
    try:
        if top.kind == c'-':
            raise error_from_reply(c.r.data + top.off, <Py_ssize_t>top.ival)
        return build_reply(c.r.data, c.nodes.items, &i)
    finally:
        conn_consume(c)


cdef int64_t deadline_after(double timeout) except? -1:
    if timeout != timeout:
        raise ValueError("timeout must be a number, not NaN")
    if timeout <= 0:
        return rl_now_ns()
    if timeout > 1e9:
        return FOREVER_NS
    return rl_now_ns() + <int64_t>(timeout * 1e9)


cdef object wait_replicas(rl_conn* c, object address, object wait_cmd, int wait_ms,
                          int64_t deadline):
    """``wait_cmd`` (``WAIT replicas wait_ms``) on the connection that just wrote, GIL released.

    The number of replicas that acknowledged. Never on a new connection: it
    would count another server's replicas. The WAIT gets ``wait_ms`` beyond
    ``deadline`` (or beyond now, when that has passed).
    """
    cdef int64_t wait_deadline
    cdef int rc
    if c.fd < 0:
        raise _RedisConnectionError(f"Connection to {address} closed before WAIT")
    c.w.len = 0
    put_command(&c.w, wait_cmd)
    wait_deadline = rl_now_ns()
    wait_deadline = (deadline if deadline > wait_deadline else wait_deadline) + \
        <int64_t>wait_ms * 1000000
    with nogil:
        rc = conn_run_command(c, wait_deadline)
    if rc < 0:
        raise conn_exception(c)
    return take_reply(c)


cdef class ScriptRef:
    """A Lua script as the wire wants it: its SHA1 and its source, both UTF-8 bytes."""

    def __init__(self, str sha, str source):
        if len(sha) != 40:
            raise ValueError("sha must be 40 hex digits")
        self.sha = sha.encode("ascii")
        self.source = source.encode("utf-8")


cdef class Target:
    """Where to connect and what to say first (AUTH, SELECT, CLIENT SETNAME).

    Made from an endpoint (``redlease._engine.conn.client.Endpoint``, or any object
    with its fields: ``host port path db username password client_name``,
    and optionally ``tls``). The password is kept only inside the encoded
    handshake: no attribute, repr or error message of the core shows it.

    With ``endpoint.tls`` set (a ``redlease._engine.conn.client.TLS``) every
    connection speaks TLS; its context is built here, once, and a setting
    that cannot be used (a missing or unparsable file, a wrong key password)
    raises ConfigError now, naming the setting and the file.
    """

    def __cinit__(self):
        self.disco = NULL
        self._tls_ctx = NULL

    def __dealloc__(self):
        # One of each: a second definition would silently replace the first.
        disco_release(self.disco)
        self.disco = NULL
        rl_tls_ctx_free(self._tls_ctx)
        self._tls_ctx = NULL

    def __init__(self, endpoint not None):
        cdef rl_buf b
        cdef list hello = []
        host = endpoint.host
        path = endpoint.path
        username = endpoint.username
        password = endpoint.password
        if path:
            self._path_b = os.fsencode(path)
            if len(self._path_b) >= 108:
                raise ValueError(f"unix socket path too long ({len(self._path_b)} bytes)")
            self._host_b = b""
        else:
            self._host_b = (host or "localhost").encode("idna")
            if len(self._host_b) >= 256:
                raise ValueError("host name too long")
            self._path_b = b""
        self.host = None if path else (host or "localhost")
        self.port = endpoint.port
        self.path = path or None
        self.db = endpoint.db
        self.username = username
        self.client_name = endpoint.client_name
        if username or password:
            hello.append(["AUTH", username, password or ""] if username else ["AUTH", password])
        if self.db:
            hello.append(["SELECT", self.db])
        if self.client_name:
            hello.append(["CLIENT", "SETNAME", self.client_name])
        memset(&b, 0, sizeof(b))
        try:
            for command in hello:
                put_command(&b, command)
            self._hello = PyBytes_FromStringAndSize(b.data, <Py_ssize_t>b.len) if b.len else b""
        finally:
            buf_free(&b)
        self._hello_replies = len(hello)
        tls = getattr(endpoint, "tls", None)
        rl_tls_ctx_free(self._tls_ctx)
        self._tls_ctx = NULL
        self.tls = False
        if tls is not None:
            if self.path is not None:
                raise _ConfigError("TLS over a unix socket is not supported")
            self._tls_ctx = make_tls_context(tls)
            self.tls = True
            # As redis-py does: no hostname check when no certificate is checked.
            self._check_hostname = bool(tls.check_hostname) and str(tls.cert_reqs) != "none"
        if self.disco == NULL:
            self.disco = disco_from_endpoint(endpoint)

    def forget_master(self):
        """Sentinel: the master may have changed; connections ask the sentinels before their next use."""
        disco_forget_master(self.disco)

    def master_address(self):
        """Sentinel: the master's ``(host, port)`` as the sentinels last named it, or None."""
        cdef rl_disco* d = <rl_disco*>self.disco
        cdef rl_addr a
        cdef int known = 0
        if d == NULL or d.kind != DISCO_SENTINEL:
            return None
        with nogil:
            pthread_mutex_lock(&d.mu)
            known = d.master_known
            if known:
                a = d.master
            pthread_mutex_unlock(&d.mu)
        if not known:
            return None
        return (a.host.decode("utf-8", "replace"), a.port)

    @property
    def kind(self):
        """``"direct"``, ``"sentinel"`` or ``"cluster"``: how the server is found."""
        if self.disco == NULL:
            return "direct"
        return "sentinel" if (<rl_disco*>self.disco).kind == DISCO_SENTINEL else "cluster"

    @property
    def address(self):
        if self.disco != NULL:
            return disco_describe(self.disco)
        return self.path if self.path else f"{self.host}:{self.port}"

    def __repr__(self):
        tls = ", tls=True" if self.tls else ""
        return f"Target({self.address!r}, db={self.db}{tls})"

    cdef int init_conn(self, rl_conn* c) except -1:
        cdef bytes address = self.address.encode("utf-8", "replace")[:299]
        memset(c, 0, sizeof(rl_conn))
        c.fd = -1
        c.cancel_fd = -1
        c.port = self.port
        c.is_unix = 1 if self._path_b else 0
        strncpy(c.host, PyBytes_AS_STRING(self._host_b), 255)
        strncpy(c.path, PyBytes_AS_STRING(self._path_b), 107)
        strncpy(c.address, PyBytes_AS_STRING(address), 299)
        c.hello_len = <size_t>len(self._hello)
        c.hello_replies = self._hello_replies
        if self._tls_ctx != NULL:
            rl_tls_ctx_up_ref(self._tls_ctx)
            c.tls_ctx = self._tls_ctx
            c.tls_check_hostname = 1 if self._check_hostname else 0
        if c.hello_len:
            c.hello = <char*>realloc(NULL, c.hello_len)
            if c.hello == NULL:
                raise MemoryError()
            memcpy(c.hello, PyBytes_AS_STRING(self._hello), c.hello_len)
        disco_attach(c, self.disco)
        return 0


cdef class Pool(ProcessBound):
    """A few native connections to one server, lazily opened, safe from any thread.

    Each call takes a free connection (a new one is opened only when all open
    ones are busy), runs one command or script with the GIL released and
    bounded by ``timeout`` in all, and gives the connection back. An I/O error
    or a timeout closes that connection; the next call opens a new one. No
    call is ever retried.
    """

    def __cinit__(self):
        self.slots = NULL
        self.size = 0

    def __init__(self, Target target, int size=1):
        cdef int i
        if size < 1 or size > 64:
            raise ValueError("size must be between 1 and 64")
        if self.slots != NULL:
            raise RuntimeError("Pool already initialised")
        self.target = target
        self.slots = <rl_slot*>calloc(<size_t>size, sizeof(rl_slot))
        if self.slots == NULL:
            raise MemoryError()
        for i in range(size):
            rl_mutex_init_errorcheck(&self.slots[i].mu)
            self.size = i + 1
            target.init_conn(&self.slots[i].conn)
            self.slots[i].conn.python_signals = 1
            # One caller at a time, no cancel fd: its reply can be waited for in recv.
            self.slots[i].conn.blocking_reads = 1
        _live.add(self)

    def __dealloc__(self):
        cdef int i
        if self.slots == NULL:
            return
        self.inherited()
        for i in range(self.size):
            conn_free(&self.slots[i].conn)
            pthread_mutex_destroy(&self.slots[i].mu)
        free(self.slots)
        self.slots = NULL

    cdef rl_slot* grab(self, int64_t deadline) except NULL:
        cdef int i
        cdef int rc
        if self.slots == NULL:
            raise RuntimeError("Pool is not initialised")
        for i in range(self.size):
            if pthread_mutex_trylock(&self.slots[i].mu) == 0:
                return &self.slots[i]
        i = <int>(self.rr % <unsigned int>self.size)
        self.rr += 1
        with nogil:
            rc = rl_mutex_lock_until(&self.slots[i].mu, deadline)
        if rc != 0:
            raise _RedisTimeoutError(f"Timeout waiting for a connection to {self.target.address}")
        return &self.slots[i]

    cdef rl_slot* grab_for(self, int key_slot, int64_t deadline) except NULL:
        """A free connection for a command bound for ``key_slot`` (``command_slot`` of its
        keys, computed once by the caller, which gives the connection the same slot): on a
        cluster, one already open to the node that owns the slot if there is one, so that
        commands for several nodes do not drop and make a connection each; else ``grab``.
        """
        cdef rl_disco* d
        cdef rl_conn* c
        cdef rl_addr owner
        cdef int idx, i
        cdef bint known = False
        if key_slot < 0 or self.slots == NULL or self.slots[0].conn.disco == NULL:
            return self.grab(deadline)
        d = <rl_disco*>self.slots[0].conn.disco
        if d.kind != DISCO_CLUSTER:
            return self.grab(deadline)
        pthread_mutex_lock(&d.mu)
        idx = d.owner[key_slot] if not d.stale else -1
        if idx >= 0:
            owner = d.nodes[idx]
            known = True
        pthread_mutex_unlock(&d.mu)
        if known:
            for i in range(self.size):
                if pthread_mutex_trylock(&self.slots[i].mu) == 0:
                    c = &self.slots[i].conn
                    if c.fd >= 0 and c.port == owner.port and strcmp(c.host, owner.host) == 0:
                        return &self.slots[i]
                    pthread_mutex_unlock(&self.slots[i].mu)
            # None there: one not open yet, rather than one open to another node.
            for i in range(self.size):
                if pthread_mutex_trylock(&self.slots[i].mu) == 0:
                    if self.slots[i].conn.fd < 0:
                        return &self.slots[i]
                    pthread_mutex_unlock(&self.slots[i].mu)
        return self.grab(deadline)

    def execute(self, ScriptRef ref not None, keys, args, double timeout, slot=None):
        """Run a script (EVALSHA, EVAL on NOSCRIPT); the reply as redis-py gives it.

        ``slot``: its first key's cluster slot when the caller knows it (None:
        hashed here; see ``command_slot``).
        """
        cdef int64_t deadline = deadline_after(timeout)
        cdef int key_slot = command_slot(self.target.disco, keys, slot)
        cdef rl_slot* held = self.grab_for(key_slot, deadline)
        cdef rl_conn* c = &held.conn
        cdef rl_script_cmd cmd
        cdef int rc
        try:
            put_evalsha(&c.w, ref.sha, ref.source, keys, args, &cmd)
            c.slot = key_slot
            with nogil:
                rc = route_run(c, deadline, &cmd, send_all, NULL, True)
            if rc < 0:
                raise conn_exception(c)
            return take_reply(c)
        finally:
            release_slot(held)

    def execute_wait(self, ScriptRef ref not None, keys, args, double timeout,
                     int replicas, int wait_ms, slot=None):
        """``execute``, then ``WAIT replicas wait_ms`` on the connection that ran the script.

        ``(reply, acknowledged)``. Both round trips run with the GIL released
        on the one connection this call holds, so the WAIT counts the
        replicas of the very server that applied the script. An error reply
        raises without a WAIT. The WAIT gets ``wait_ms`` plus what is left of
        ``timeout``. ``slot`` as for ``execute``.
        """
        cdef int64_t deadline = deadline_after(timeout)
        cdef rl_slot* held
        cdef rl_conn* c
        cdef int key_slot = command_slot(self.target.disco, keys, slot)
        cdef rl_script_cmd cmd
        cdef int rc
        wait_cmd = _timing.wait_command(replicas, wait_ms)
        held = self.grab_for(key_slot, deadline)
        c = &held.conn
        try:
            put_evalsha(&c.w, ref.sha, ref.source, keys, args, &cmd)
            c.slot = key_slot
            with nogil:
                rc = route_run(c, deadline, &cmd, send_all, NULL, True)
            if rc < 0:
                raise conn_exception(c)
            reply = take_reply(c)
            return reply, wait_replicas(c, self.target.address, wait_cmd, wait_ms, deadline)
        finally:
            release_slot(held)

    @property
    def connections(self):
        """How many connections are open right now."""
        cdef int i
        cdef int n = 0
        for i in range(self.size):
            if self.slots[i].conn.fd >= 0:
                n += 1
        return n

    def close(self):
        """Close every connection (waiting for calls in flight); later calls reconnect."""
        cdef int i
        cdef int rc
        if self.slots == NULL:
            return
        for i in range(self.size):
            with nogil:
                rc = pthread_mutex_lock(&self.slots[i].mu)
                if rc == 0:
                    conn_drop(&self.slots[i].conn)
                    pthread_mutex_unlock(&self.slots[i].mu)
            if rc != 0:
                # EDEADLK: this thread's own call holds it (we run in a signal
                # handler inside that call). Waiting would never end, and the
                # socket is in use below us: the call drops it when done.
                self.slots[i].conn.drop_when_done = 1

    cdef void forget_parent(self) noexcept:
        cdef int i
        if self.slots == NULL:
            return
        # The slots' own reference to the Target's discovery state, not
        # self.target: when the collector frees the pool in a cycle, it may
        # have cleared that attribute (to None) before __dealloc__ runs here.
        disco_after_fork(self.slots[0].conn.disco)
        for i in range(self.size):
            # The thread that held it does not exist in the child.
            rl_mutex_init_errorcheck(&self.slots[i].mu)
            tls_forget_after_fork(&self.slots[i].conn)
            conn_drop(&self.slots[i].conn)
