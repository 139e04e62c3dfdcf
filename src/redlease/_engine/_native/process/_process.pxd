# ProcessBound, the base of every native object whose threads, locks or
# streams belong to the process that made it (the implementation and its
# rules: _process.pxi).

cdef class ProcessBound:
    cdef int _pid
    cdef bint _forked

    cdef bint inherited(self) noexcept
    cdef void forget_parent(self) noexcept
