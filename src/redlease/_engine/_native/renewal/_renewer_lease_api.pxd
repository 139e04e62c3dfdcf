# What _renewer_lease_api.pxi offers the other units: Lease, one lease a
# Renewer renews.

cdef class Lease(ProcessBound):
    cdef rl_lease* l
    cdef readonly Renewer renewer
    cdef bint _closed
    cdef int _waiters
    cdef readonly double interval
    cdef readonly double ttl
    cdef object __weakref__

    cdef inline rl_renewer* _r(self):
        # A forked child's copy is made inert before its renewer's lock is taken.
        self.inherited()
        return self.renewer.r

    cdef inline bint _expired(self) noexcept:
        # The renewer may be waiting on a slow server's replies to other
        # leases when this one's deadline passes: readers see the loss at
        # the deadline all the same, the thread records it when it is back.
        return (rl_load(&self.l.state) == ST_ACTIVE
                and rl_now_ns() >= rl_load(&self.l.lease_deadline))

    cdef int _wake_fd(self) except -2
    cdef void close_fd(self) noexcept
    cdef void forget_parent(self) noexcept
