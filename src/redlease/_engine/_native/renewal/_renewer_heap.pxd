# What _renewer_heap.pxi offers the other units: the shared renewer's state
# (rl_renewer, rl_rnode) and limits, its timer heap, what a renewal's
# outcome does to its lease, and a batch of renewals encoded and written.

cdef enum:
    RENEW_NODES_MAX = 64
    RENEW_BATCH_MAX = 512
    RENEW_SCRIPTS_MAX = 8

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
    int many_at           # 1 + renew_many's index among the scripts (0: no lease renews in it)
    rl_buf loads[8]       # SCRIPT LOAD <source>, one per distinct script
    char shas[8][41]
    rl_lease** heap
    int64_t* heap_keys    # heap[i]'s key (lease_key), kept beside it
    size_t heap_len
    size_t heap_cap
    rl_lease* batch[512]
    size_t batch_len
    rl_buf out
    rl_changes changes    # the watched leases woken since the driver last looked
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

cdef inline int64_t lease_key(rl_lease* l) noexcept nogil:
    return l.next_send if l.next_send < l.lease_deadline else l.lease_deadline

cdef int heap_push(rl_renewer* r, rl_lease* l) noexcept nogil
cdef void heap_remove(rl_renewer* r, rl_lease* l) noexcept nogil
cdef void heap_fix(rl_renewer* r, rl_lease* l) noexcept nogil
cdef rl_lease* heap_pop(rl_renewer* r) noexcept nogil
cdef void batch_release(rl_renewer* r, rl_lease* l) noexcept nogil
cdef void lease_failed(rl_lease* l, int kind, const char* msg, int64_t now) noexcept nogil
cdef void batch_fail(rl_renewer* r, size_t first, int kind, const char* msg) noexcept nogil
cdef void lease_renewed(rl_lease* l) noexcept nogil
cdef void lease_unexpected(rl_lease* l, rl_conn* c, const char* what, const char* wanted) noexcept nogil
cdef void lease_apply_node(rl_renewer* r, rl_rnode* n, rl_lease* l, rl_conn* c,
                           rl_node* top) noexcept nogil
cdef size_t call_apply_reply(rl_renewer* r, rl_rnode* n, size_t at, rl_conn* c) noexcept nogil
cdef int renewals_encode(rl_renewer* r, size_t first, size_t* count, bint need_load,
                         int* loads) noexcept nogil
cdef int renewals_send(rl_renewer* r, rl_conn* c, int64_t deadline) noexcept nogil
