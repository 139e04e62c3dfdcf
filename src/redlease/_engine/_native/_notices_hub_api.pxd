# What _notices_hub_api.pxi offers the other units: NoticeHub, the Python
# face of one subscription connection and its reader thread.

cdef class NoticeHub(ProcessBound):
    cdef rl_hub* h
    cdef bint _closed
    cdef dict _counts        # channel -> how many subscriptions want it (GIL-guarded)
    cdef readonly Target target
    cdef object __weakref__

    cdef int add(self, rl_nsub* s) except -1
    cdef void remove(self, rl_nsub* s) noexcept
    cdef void forget_parent(self) noexcept
