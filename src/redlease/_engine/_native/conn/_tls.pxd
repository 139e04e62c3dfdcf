# What _tls.pxi offers the other units: the OpenSSL glue of rl_tls.h, and
# TLS steps on a connection (handshake, reads, writes) without the GIL.

cdef extern from "conn/rl_tls.h" nogil:
    enum:
        RL_TLS_OK
        RL_TLS_WANT_READ
        RL_TLS_WANT_WRITE
        RL_TLS_CLOSED
        RL_TLS_SYSCALL
        RL_TLS_FAILED
    enum:
        RL_TLS_E_NONE
        RL_TLS_E_UNAVAILABLE
        RL_TLS_E_NOMEM
        RL_TLS_E_CA_FILE
        RL_TLS_E_CA_PATH
        RL_TLS_E_CA_DATA
        RL_TLS_E_CERT
        RL_TLS_E_KEY
        RL_TLS_E_KEY_MISMATCH
        RL_TLS_E_DEFAULT_PATHS
    ctypedef struct rl_tls_settings:
        const char* ca_file
        const char* ca_path
        const char* ca_data
        size_t ca_data_len
        int ca_data_der
        const char* certfile
        const char* keyfile
        const char* key_password
        int verify

    int rl_tls_load(const char* ssl_module)
    void rl_tls_unavailable(const char* why)
    int rl_tls_available()
    const char* rl_tls_why()
    const char* rl_tls_version()
    void* rl_tls_ctx_new(const rl_tls_settings* s, int* what, char* err, size_t errlen)
    void rl_tls_ctx_up_ref(void* ctx)
    void rl_tls_ctx_free(void* ctx)
    void* rl_tls_new(void* ctx, int fd, const char* host, int check_hostname,
                     char* err, size_t errlen)
    void rl_tls_free(void* ssl)
    int rl_tls_handshake(void* ssl, int* sys_errno, char* err, size_t errlen)
    int rl_tls_read(void* ssl, void* buf, size_t n, size_t* got, int* sys_errno,
                    char* err, size_t errlen)
    int rl_tls_write(void* ssl, const void* buf, size_t n, size_t* put, int* sys_errno,
                     char* err, size_t errlen)
    int rl_tls_has_pending(void* ssl)

cdef enum:
    TLS_MSG = 300

cdef void* make_tls_context(object tls) except NULL
cdef int tls_fail(rl_conn* c, int status, int sys_errno, const char* what,
                  const char* msg) noexcept nogil
cdef int tls_start(rl_conn* c, int64_t deadline) noexcept nogil
cdef int tls_send(rl_conn* c, const char* data, size_t n, int64_t deadline) noexcept nogil
cdef ssize_t tls_try_send(rl_conn* c, const char* data, size_t n) noexcept nogil
cdef int tls_read_more(rl_conn* c, int64_t deadline) noexcept nogil
cdef bint tls_idle_input_ok(rl_conn* c) noexcept nogil
cdef void tls_forget_after_fork(rl_conn* c) noexcept nogil
