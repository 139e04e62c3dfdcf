# What _renewer_api.pxi offers the other units: Renewer, the Python face of
# the shared renewer thread.

cdef class Renewer(ProcessBound):
    cdef rl_renewer* r
    cdef bint _closed
    cdef object __weakref__

    cdef int add_script(self, ScriptRef ref) except -1
    cdef int renew_many_with(self, ScriptRef many) except -1
    cdef void stop_thread(self) noexcept
    cdef int start_thread(self) except -1
    cdef void forget_parent(self) noexcept
