# What _discovery.pxi offers the other units: the state one Target shares
# with its connections (rl_disco: master address, slot map), addresses, and
# the short-lived connections questions are asked on.

from libc.stdint cimport int16_t

# A failure kind beyond those of _conn.pxi: the sentinels named no master.
cdef enum:
    RL_ENOMASTER = 9

cdef enum:
    DISCO_SENTINEL = 1
    DISCO_CLUSTER = 2
    MAX_PEERS = 16        # sentinels, or cluster seed nodes, a Target remembers
    MAX_NODES = 64        # cluster nodes in the slot map's node table
    CLUSTER_SLOTS = 16384
    MAX_REDIRECTS = 5     # MOVED / ASK followed per round trip

cdef struct rl_addr:
    char host[256]
    int port

cdef struct rl_disco:
    int64_t refs           # atomic: the Target and every connection made from it
    int kind
    pthread_mutex_t mu     # guards everything from here on; never held across I/O
    # The peers asked: sentinels, or a cluster's seed nodes.
    int npeers
    int first_peer         # the one that answered last is asked first next time
    rl_addr peers[16]
    # Sentinel: what the sentinels are told first, and asked.
    char* s_hello
    size_t s_hello_len
    int s_hello_replies
    char* s_query          # SENTINEL get-master-addr-by-name <service>
    size_t s_query_len
    void* s_tls_ctx        # the sentinels' own TLS (sentinel_kwargs), or NULL: plain
    int s_check_hostname
    char service[200]
    # Sentinel: the master as the sentinels last named it.
    int master_known
    rl_addr master
    int64_t master_checked
    # Cluster: the slot map, node indexes into ``nodes`` (-1: not known).
    int stale
    int nnodes
    rl_addr nodes[64]
    int16_t owner[16384]

cdef void disco_release(void* p) noexcept nogil
cdef void disco_attach(rl_conn* c, void* p) noexcept nogil
cdef void disco_after_fork(void* p) noexcept nogil
cdef char* copy_bytes(bytes b) except? NULL
cdef void* disco_from_endpoint(object endpoint) except? NULL
cdef str disco_describe(void* p)
cdef int slot_of_object(object key) except -1
cdef int disco_slot_for(void* p, object keys) except -2
cdef int command_slot(void* p, object keys, object slot) except -2
cdef bint same_addr(const rl_addr* a, const rl_addr* b) noexcept nogil
cdef void conn_set_addr(rl_conn* c, const rl_addr* a) noexcept nogil
cdef void conn_addr(rl_conn* c, rl_addr* out) noexcept nogil
cdef void conn_probe_idle(rl_conn* c) noexcept nogil
cdef bint conn_stopped(rl_conn* c) noexcept nogil
cdef int disco_pause(rl_conn* c, int64_t ns, int64_t deadline) noexcept nogil
cdef rl_conn* ask_conn(rl_conn* c, const rl_addr* a, char* hello, size_t hello_len,
                       int hello_replies, void* tls_ctx, int check_hostname) noexcept nogil
cdef void ask_conn_free(rl_conn* t) noexcept nogil
cdef int64_t share_of(int64_t deadline, int left) noexcept nogil
cdef int ask_peer(rl_conn* t, const char* cmd, size_t n, int64_t deadline) noexcept nogil
cdef void reply_text(rl_conn* t, size_t i, char* out, size_t cap) noexcept nogil
