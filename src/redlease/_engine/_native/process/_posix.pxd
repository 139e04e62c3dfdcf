# C and system declarations, for every unit: the monotonic clock, atomics,
# pthreads, poll, sockets, eventfd. Small C helpers are defined inline where
# the POSIX call needs glue (CLOCK_MONOTONIC condition variables and timed
# locks, a signal mask for the renewer thread, ppoll with a nanosecond
# timeout).
#
# Needs: nothing: the bottom layer.

from libc.errno cimport EINPROGRESS, EINTR, EINVAL, ENOMEM, errno
from libc.limits cimport LLONG_MAX
from libc.stdint cimport int64_t, uint64_t
from libc.stdio cimport snprintf
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memchr, memcmp, memcpy, memmove, memset, strerror, strncpy
from posix.time cimport timespec


cdef extern from *:
    """
    #include <stdint.h>
    #include <time.h>
    #include <signal.h>
    #include <poll.h>
    #include <pthread.h>
    #include <errno.h>
    #include <fcntl.h>
    #include <sys/socket.h>
    #include <sys/time.h>

    static inline int64_t rl_now_ns(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000000LL + (int64_t)ts.tv_nsec;
    }

    /* A socket whose reads block (its writes still pass MSG_DONTWAIT). */
    static inline int rl_set_blocking(int fd) {
        int flags = fcntl(fd, F_GETFL);
        if (flags < 0) return -1;
        return fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    }

    /* How long a blocking read may wait; with it set, a signal always ends
       the read with EINTR (never restarted, whatever SA_RESTART says). */
    static inline int rl_set_rcvtimeo(int fd, int64_t ns) {
        struct timeval tv;
        if (ns < 1000) ns = 1000;
        tv.tv_sec = (time_t)(ns / 1000000000LL);
        tv.tv_usec = (suseconds_t)((ns % 1000000000LL) / 1000);
        return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }

    static inline struct timespec rl_ts(int64_t ns) {
        struct timespec ts;
        if (ns < 0) ns = 0;
        ts.tv_sec = (time_t)(ns / 1000000000LL);
        ts.tv_nsec = (long)(ns % 1000000000LL);
        return ts;
    }

    /* State and token are read by Python threads without any lock. */
    static inline int64_t rl_load(const int64_t *p) {
        return __atomic_load_n(p, __ATOMIC_ACQUIRE);
    }
    static inline void rl_store(int64_t *p, int64_t v) {
        __atomic_store_n(p, v, __ATOMIC_RELEASE);
    }

    static int rl_cond_init(pthread_cond_t *cv) {
        pthread_condattr_t attr;
        int rc;
        pthread_condattr_init(&attr);
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        rc = pthread_cond_init(cv, &attr);
        pthread_condattr_destroy(&attr);
        return rc;
    }

    static int rl_cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *m, int64_t deadline) {
        struct timespec ts = rl_ts(deadline);
        return pthread_cond_timedwait(cv, m, &ts);
    }

    /* Pool slots: a thread that already holds one (a signal handler running
       inside that thread's own call) gets EDEADLK instead of hanging. */
    static int rl_mutex_init_errorcheck(pthread_mutex_t *m) {
        pthread_mutexattr_t attr;
        int rc;
        pthread_mutexattr_init(&attr);
        pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
        rc = pthread_mutex_init(m, &attr);
        pthread_mutexattr_destroy(&attr);
        return rc;
    }

    static int rl_mutex_lock_until(pthread_mutex_t *m, int64_t deadline) {
    #if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 30))
        struct timespec ts = rl_ts(deadline);
        return pthread_mutex_clocklock(m, CLOCK_MONOTONIC, &ts);
    #else
        struct timespec now_rt, ts;
        int64_t rel = deadline - rl_now_ns();
        clock_gettime(CLOCK_REALTIME, &now_rt);
        if (rel < 0) rel = 0;
        ts = rl_ts((int64_t)now_rt.tv_sec * 1000000000LL + now_rt.tv_nsec + rel);
        return pthread_mutex_timedlock(m, &ts);
    #endif
    }

    /* The renewer thread blocks every signal: Python's handlers run on the
       main thread, and a signal landing here would only cost an EINTR. */
    static int rl_spawn(pthread_t *t, void *(*fn)(void *), void *arg) {
        sigset_t all, old;
        pthread_attr_t attr;
        int rc;
        sigfillset(&all);
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        rc = pthread_create(t, &attr, fn, arg);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
        return rc;
    }

    /* EAGAIN and EWOULDBLOCK are the same number on Linux, not everywhere. */
    static inline int rl_would_block(int e) {
        return e == EAGAIN || e == EWOULDBLOCK;
    }

    /* timeout_ns < 0 waits forever. */
    static int rl_ppoll(struct pollfd *fds, int n, int64_t timeout_ns) {
        struct timespec ts;
        if (timeout_ns < 0) return ppoll(fds, (nfds_t)n, NULL, NULL);
        ts = rl_ts(timeout_ns);
        return ppoll(fds, (nfds_t)n, &ts, NULL);
    }
    """
    ctypedef struct pthread_t:
        pass
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    struct pollfd:
        int fd
        short events
        short revents

    int64_t rl_now_ns() noexcept nogil
    int64_t rl_load(const int64_t* p) noexcept nogil
    void rl_store(int64_t* p, int64_t v) noexcept nogil
    int rl_cond_init(pthread_cond_t* cv) noexcept nogil
    int rl_cond_wait_until(pthread_cond_t* cv, pthread_mutex_t* m, int64_t deadline) noexcept nogil
    int rl_mutex_lock_until(pthread_mutex_t* m, int64_t deadline) noexcept nogil
    int rl_mutex_init_errorcheck(pthread_mutex_t* m) noexcept nogil
    int rl_spawn(pthread_t* t, void* (*fn)(void*) noexcept nogil, void* arg) noexcept nogil
    int rl_ppoll(pollfd* fds, int n, int64_t timeout_ns) noexcept nogil
    bint rl_would_block(int e) noexcept nogil
    int rl_set_blocking(int fd) noexcept nogil
    int rl_set_rcvtimeo(int fd, int64_t ns) noexcept nogil

    int pthread_join(pthread_t t, void** ret) nogil
    int pthread_detach(pthread_t t) nogil
    int pthread_mutex_init(pthread_mutex_t* m, const void* attr) nogil
    int pthread_mutex_destroy(pthread_mutex_t* m) nogil
    int pthread_mutex_lock(pthread_mutex_t* m) nogil
    int pthread_mutex_trylock(pthread_mutex_t* m) nogil
    int pthread_mutex_unlock(pthread_mutex_t* m) nogil
    int pthread_cond_wait(pthread_cond_t* cv, pthread_mutex_t* m) nogil
    int pthread_cond_signal(pthread_cond_t* cv) nogil
    int pthread_cond_broadcast(pthread_cond_t* cv) nogil
    int pthread_cond_destroy(pthread_cond_t* cv) nogil
    enum:
        POLLIN
        POLLOUT


cdef extern from "Python.h":
    # Declared without an exception clause: the exception it may set is left
    # pending for the calling thread to raise once it is back in Python.
    int check_signals_raw "PyErr_CheckSignals" () noexcept


cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    ctypedef unsigned short sa_family_t
    struct sockaddr:
        sa_family_t sa_family
    struct sockaddr_storage:
        sa_family_t ss_family
    int socket(int domain, int type, int protocol)
    int connect(int fd, const sockaddr* addr, socklen_t len)
    ssize_t send(int fd, const void* buf, size_t n, int flags)
    ssize_t recv(int fd, void* buf, size_t n, int flags)
    int setsockopt(int fd, int level, int name, const void* val, socklen_t len)
    int getsockopt(int fd, int level, int name, void* val, socklen_t* len)
    enum:
        AF_UNIX
        AF_UNSPEC
        SOCK_STREAM
        SOCK_NONBLOCK
        SOCK_CLOEXEC
        SOL_SOCKET
        SO_ERROR
        SO_KEEPALIVE
        MSG_NOSIGNAL
        MSG_DONTWAIT

cdef extern from "<netinet/in.h>" nogil:
    enum:
        IPPROTO_TCP

cdef extern from "<netinet/tcp.h>" nogil:
    enum:
        TCP_NODELAY

cdef extern from "<sys/un.h>" nogil:
    struct sockaddr_un:
        sa_family_t sun_family
        char sun_path[108]

cdef extern from "<netdb.h>" nogil:
    struct addrinfo:
        int ai_flags
        int ai_family
        int ai_socktype
        int ai_protocol
        socklen_t ai_addrlen
        sockaddr* ai_addr
        addrinfo* ai_next
    int getaddrinfo(const char* node, const char* service, const addrinfo* hints, addrinfo** res)
    void freeaddrinfo(addrinfo* res)
    const char* gai_strerror(int code)

cdef extern from "<sys/eventfd.h>" nogil:
    int eventfd(unsigned int initval, int flags)
    enum:
        EFD_NONBLOCK
        EFD_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    int close(int fd)
    ssize_t read(int fd, void* buf, size_t n)
    ssize_t write(int fd, const void* buf, size_t n)
