# What _notices_hub_api.pxi offers the other units: NoticeReader, the Python
# face of the process's notice threads, and NoticeHub, the Python face of one
# subscription connection.

cdef class NoticeReader(ProcessBound):
    cdef rl_reader* r
    cdef object __weakref__

    cdef tuple _counts(self)


cdef class NoticeHub(ProcessBound):
    cdef rl_hub* h
    cdef bint _closed
    cdef dict _counts        # channel -> how many subscriptions want it (GIL-guarded)
    cdef readonly Target target
    cdef readonly NoticeReader reader
    cdef object __weakref__

    cdef int _state(self) noexcept
    cdef int add(self, rl_nsub* s) except -1
    cdef void remove(self, rl_nsub* s) noexcept
    cdef void forget_parent(self) noexcept
