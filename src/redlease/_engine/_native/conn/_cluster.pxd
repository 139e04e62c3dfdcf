# What _cluster.pxi offers the other units: the slot map from CLUSTER SLOTS,
# pointing a connection at a slot's owner, MOVED / ASK parsing.

cdef int node_index(rl_disco* d, const char* host, int port) noexcept nogil
cdef int cluster_refresh(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil
cdef void cluster_forget(rl_disco* d) noexcept nogil
cdef int cluster_prepare(rl_conn* c, rl_disco* d, int64_t deadline) noexcept nogil
cdef int parse_redirect(rl_conn* c, size_t skip, int* slot, rl_addr* out) noexcept nogil
cdef void slot_moved(rl_disco* d, int slot, const rl_addr* there) noexcept nogil
