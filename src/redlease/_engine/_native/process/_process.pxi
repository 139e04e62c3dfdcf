# What a native object made in one process is in a forked child: the base
# class of every object whose threads, locks or streams belong to the process
# that made it (Pool, LoopConn, Renewer, Lease, NoticeHub, NoticeBell).
#
# Needs: nothing but getpid.

from posix.unistd cimport getpid


cdef extern from "<pthread.h>" nogil:
    int pthread_atfork(void (*prepare)() noexcept nogil, void (*parent)() noexcept nogil,
                       void (*child)() noexcept nogil)


# This process's id, kept by a fork handler of the C library (it runs in the
# child before any other code does): inherited() compares with it on every
# call of every native object, without a system call each time.
cdef int rl_pid = getpid()


cdef void rl_pid_after_fork() noexcept nogil:
    global rl_pid
    rl_pid = getpid()


if pthread_atfork(NULL, NULL, rl_pid_after_fork) != 0:
    raise ImportError("cannot register the native core's fork handler")


cdef class ProcessBound:
    """A native object that belongs to the process that made it.

    After ``os.fork()`` the child's copy is the parent's business: the
    threads that used it were not copied, a lock one of them held stays
    held, a condition variable one of them waited on still counts that
    waiter, and its connections' streams are the parent's. ``inherited()``
    makes the copy inert (``forget_parent``) the first time anything asks
    in another process, whoever asks first: the fork handler in _core.pyx,
    or the garbage collector freeing the copy before that handler ran (it
    may run inside any earlier fork handler; freeing the parent's state
    as it was would wait forever on a lock or condition variable).
    """

    def __cinit__(self):
        self._pid = rl_pid
        self._forked = False

    cdef bint inherited(self) noexcept:
        """True in a forked child; the first call there makes the copy inert."""
        if not self._forked and rl_pid != self._pid:
            self._forked = True
            self.forget_parent()
        return self._forked

    cdef void forget_parent(self) noexcept:
        """Make a forked child's copy inert: re-made locks, no thread, streams dropped unsent."""
        pass
