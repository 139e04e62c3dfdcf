# What _conn.pxi offers the other units: one connection (rl_conn), its
# failure kinds, and connecting, sending and reading under a deadline.

# Failure kinds, mapped to redis-py exceptions by make_exception().
cdef enum:
    RL_OK = 0
    RL_ETIMEOUT = 1
    RL_ECONN = 2
    RL_EPROTO = 3
    RL_EREPLY = 4
    RL_ENOMEM = 5
    RL_EUNEXPECTED = 6
    RL_ECANCELLED = 7
    RL_EINTERRUPTED = 8

cdef enum:
    MAX_ADDRS = 4
    ERR_MSG = 400
    READ_CHUNK = 16384
    READ_KEEP = 1048576
    MAX_REPLY = 4194304   # no reply of more bytes is buffered: redlease._engine.contract.interface.MAX_REPLY_BYTES

cdef struct rl_conn:
    int fd
    int is_unix
    int port
    int naddrs
    int keep_addrs        # the renewer never resolves again: getaddrinfo has no deadline
    int python_signals    # a Python thread waits here: let signal handlers run on EINTR
    int drop_when_done    # Pool.close() ran inside this connection's call: drop it after
    int cancel_fd         # readable -> abort the round trip (renewer close)
    int err_kind
    int tls_check_hostname  # with tls_ctx: the certificate must name ``host``
    int hello_replies
    int slot              # cluster slot of the command in ``w`` (-1: none); see _discovery.pxi
    int blocking_reads    # plain sockets: wait for a reply in recv itself (see conn_read_reply)
    int fd_blocking       # this socket's reads block, bounded by SO_RCVTIMEO = rcvtimeo_ns
    int64_t rcvtimeo_ns
    void* disco           # how the server is found (Sentinel, Cluster), or NULL: a fixed address
    int64_t last_used
    size_t hello_len
    size_t reply_len
    char* hello
    void* tls_ctx         # SSL_CTX (a reference of this connection's own), or NULL: plain
    void* ssl             # SSL of the open connection, when tls_ctx is set (see _tls.pxi)
    rl_buf w              # the command being sent; for a script, its EVALSHA
    rl_buf e              # that script's EVAL twin, sent on NOSCRIPT
    rl_buf r              # bytes read and not yet consumed
    rl_nodes nodes
    socklen_t addrlens[4]
    sockaddr_storage addrs[4]
    char host[256]
    char path[108]
    char address[300]
    char err_msg[400]

ctypedef int (*rl_sender)(rl_conn* c, const char* data, size_t n, int64_t deadline,
                          void* ctx, bint first) noexcept nogil

cdef int conn_fail(rl_conn* c, int kind, const char* msg) noexcept nogil
cdef int conn_fail_with_reply(rl_conn* c) noexcept nogil
cdef int conn_fail_with_node(rl_conn* c, rl_node* top) noexcept nogil
cdef void conn_drop(rl_conn* c) noexcept nogil
cdef void conn_free(rl_conn* c) noexcept nogil
cdef int conn_io_error(rl_conn* c, int err, const char* what) noexcept nogil
cdef int conn_timeout(rl_conn* c, const char* what) noexcept nogil
cdef int conn_wait(rl_conn* c, short events, int64_t deadline, const char* what) noexcept nogil
cdef int run_signal_handlers() noexcept nogil
cdef int conn_send(rl_conn* c, const char* data, size_t n, int64_t deadline) noexcept nogil
cdef ssize_t conn_try_send(rl_conn* c, const char* data, size_t n) noexcept nogil
cdef Py_ssize_t conn_parse(rl_conn* c, size_t off) noexcept nogil
cdef int conn_read_reply(rl_conn* c, int64_t deadline) noexcept nogil
cdef void conn_consume(rl_conn* c) noexcept nogil
cdef int conn_resolve(rl_conn* c) noexcept nogil
cdef int conn_connect(rl_conn* c, int64_t deadline) noexcept nogil
cdef int conn_ready(rl_conn* c, int64_t deadline) noexcept nogil
cdef int send_all(rl_conn* c, const char* data, size_t n, int64_t deadline,
                  void* ctx, bint first) noexcept nogil
cdef int conn_run_script(rl_conn* c, int64_t deadline, const rl_script_cmd* cmd,
                         rl_sender sender, void* ctx) noexcept nogil
cdef int conn_run_command(rl_conn* c, int64_t deadline) noexcept nogil
