# What _pool.pxi offers the other units: failures and replies as Python
# objects, deadlines, the WAIT after a write, and the Python-facing
# ScriptRef, Target and Pool.

cdef struct rl_slot:
    pthread_mutex_t mu
    rl_conn conn

cdef inline void release_slot(rl_slot* slot) noexcept:
    if slot.conn.drop_when_done:
        slot.conn.drop_when_done = 0
        conn_drop(&slot.conn)
    pthread_mutex_unlock(&slot.mu)

cdef object make_exception(int kind, bytes message)
cdef object conn_exception(rl_conn* c)
cdef object take_reply(rl_conn* c)
cdef int64_t deadline_after(double timeout) except? -1
cdef object wait_replicas(rl_conn* c, object address, object wait_cmd, int wait_ms,
                          int64_t deadline)

cdef class ScriptRef:
    cdef readonly bytes sha
    cdef readonly bytes source


cdef class Target:
    cdef readonly object host
    cdef readonly int port
    cdef readonly object path
    cdef readonly int db
    cdef readonly object username
    cdef readonly object client_name
    cdef readonly bint tls
    cdef bint _check_hostname
    cdef void* _tls_ctx
    cdef bytes _host_b
    cdef bytes _path_b
    cdef bytes _hello
    cdef int _hello_replies
    cdef void* disco      # Sentinel / Cluster: how the server is found (_discovery.pxi)

    cdef int init_conn(self, rl_conn* c) except -1


cdef class Pool(ProcessBound):
    cdef rl_slot* slots
    cdef int size
    cdef unsigned int rr
    cdef readonly Target target
    cdef object __weakref__

    cdef rl_slot* grab(self, int64_t deadline) except NULL
    cdef rl_slot* grab_for(self, int key_slot, int64_t deadline) except NULL
    cdef void forget_parent(self) noexcept
