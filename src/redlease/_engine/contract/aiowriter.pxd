# Compiled beside aiowriter.py when the native engine is built: this file
# makes its LoopWriter an extension type, so that a write's and a reply's
# attribute reads and flags are C fields, not dictionary lookups. The
# Python source stays the one definition of what the writer does; without
# a compiler it runs as it is, and behaves the same.

cdef class LoopWriter:
    cdef object _loop_ref
    cdef int _topology
    cdef bint _plain_loop
    cdef object _fallback
    cdef bint _reroute
    cdef object _thread
    cdef object _conn
    cdef object _put
    cdef double _timeout
    cdef object _pending
    cdef int _fd
    cdef object _connecting
    cdef bint _writing
    cdef bint _flush_soon
    cdef bint _timer
    cdef bint _closed
    cdef object __weakref__


# A reply's and an error's way into a future: C calls, not Python ones (a fenced
# write from a coroutine settles through them).
cdef _settle(object fut, object settler, object reply)
cdef _reject(object fut, object settler, object args, object error)
