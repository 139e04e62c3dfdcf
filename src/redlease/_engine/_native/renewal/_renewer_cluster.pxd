# What _renewer_cluster.pxi offers the other units: one renewal round on a
# cluster, per slot-owning master.

cdef void cluster_round(rl_renewer* r) noexcept nogil
cdef int rnode_find(rl_renewer* r, const rl_addr* a) noexcept nogil
