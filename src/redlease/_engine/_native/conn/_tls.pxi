# TLS on a native connection, over the OpenSSL glue in rl_tls.h.
#
# The context is built once per Target, with the GIL, from the client's
# ssl_* settings (a bad file or key password is a ConfigError then, not a
# failed connect later). Each connection that has a context makes its own
# SSL object right after the TCP connect and drives it without the GIL: the
# handshake, writes and reads never block inside OpenSSL (the socket is
# non-blocking); whenever OpenSSL wants the socket readable or writable the
# connection waits in conn_wait, under the round trip's deadline and with
# its cancel fd, exactly like a plain socket does.
#
# OpenSSL is not linked: at import the glue finds the one Python's ssl module
# has loaded (rl_tls.h says how and why). Where there is none, FEATURES lacks
# "tls", tls_available() says why, and engine selection never hands a TLS
# endpoint to this core.
#
# Needs: _posix, _resp_encode, _conn; _pool (exceptions).

from libc.string cimport strcmp

import importlib

from redlease._errors import ConfigError as _ConfigError


cdef bint _load_openssl():
    """Find the ssl module's OpenSSL (once, at import); False with rl_tls_why() set."""
    cdef bytes path
    if os.environ.get("REDLEASE_NO_OPENSSL") == "1":
        rl_tls_unavailable(b"REDLEASE_NO_OPENSSL=1 is set")
        return False
    try:
        # Through importlib: the ssl module's extension, as Python's import
        # finds it (sys.modules first).
        _ssl = importlib.import_module("_ssl")
    except ImportError as exc:
        rl_tls_unavailable(f"this Python has no ssl module ({exc})".encode("utf-8", "replace"))
        return False
    module = getattr(_ssl, "__file__", None)  # None: built into the interpreter
    if module is None:
        return rl_tls_load(NULL) == 1
    path = os.fsencode(module)
    return rl_tls_load(path) == 1


_load_openssl()

# "tls" when OpenSSL was found (part of FEATURES, in _core.pyx).
_TLS_FEATURES = ("tls",) if rl_tls_available() else ()

# The OpenSSL this core runs with ("" without one): the ssl module's.
OPENSSL_VERSION = rl_tls_version().decode("ascii", "replace")


def tls_available():
    """``(True, "")`` when the native engine can speak TLS, else ``(False, why not)``.

    It uses the OpenSSL that Python's ssl module loaded, found at import;
    ``why`` says what was missing (no ssl module, no OpenSSL 1.1.1 or newer,
    ``REDLEASE_NO_OPENSSL=1``).
    """
    if rl_tls_available():
        return True, ""
    return False, rl_tls_why().decode("utf-8", "replace")


# ---------------------------------------------------------------- the context (GIL held)

cdef bytes _readable_file(str option, object path):
    """``path`` as bytes for OpenSSL, or ConfigError when it cannot be opened."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise _ConfigError(
            f"TLS setting {option}={os.fspath(path)!r}: cannot read it ({exc.strerror})"
        ) from None
    return os.fsencode(path)


cdef bint _file_has(object path, bytes marker):
    try:
        with open(path, "rb") as f:
            return marker in f.read(1 << 20)
    except OSError:
        return False


cdef str _pem_reason(object path, str reason):
    """OpenSSL's reason, or plainer words when the file is not PEM at all."""
    if not _file_has(path, b"-----BEGIN"):
        return "the file is not PEM (no -----BEGIN line)"
    return reason


cdef bytes _secret_bytes(object password):
    """The key password as bytes (a callable is asked once, as Python's ssl does)."""
    if callable(password):
        password = password()
    if isinstance(password, str):
        password = password.encode("utf-8")
    elif isinstance(password, (bytearray, memoryview)):
        password = bytes(password)
    if not isinstance(password, bytes):
        raise _ConfigError("TLS setting ssl_password must be a str or bytes")
    if b"\0" in password:
        raise _ConfigError("TLS setting ssl_password must not contain NUL characters")
    return password


cdef void* make_tls_context(object tls) except NULL:
    """A new SSL_CTX (one reference, the caller's) for the endpoint's ``TLS`` settings.

    Every file is read now: one that is missing, unreadable or does not
    parse, and a key its password does not open, raise ConfigError naming
    the setting and the file. No message shows the password.
    """
    cdef rl_tls_settings s
    cdef int what = RL_TLS_E_NONE
    cdef char err[300]
    cdef void* ctx
    cdef bytes ca_file = None
    cdef bytes ca_path = None
    cdef bytes ca_data = None
    cdef bytes certfile = None
    cdef bytes keyfile = None
    cdef bytes password = None
    memset(&s, 0, sizeof(s))
    if not rl_tls_available():
        raise _ConfigError("the native engine has no OpenSSL: "
                           + rl_tls_why().decode("utf-8", "replace"))
    cert_reqs = str(tls.cert_reqs or "required").lower()
    if cert_reqs not in ("none", "optional", "required"):
        raise _ConfigError(f"TLS setting ssl_cert_reqs must be none, optional or required, "
                           f"got {tls.cert_reqs!r}")
    if tls.ca_certs is not None:
        ca_file = _readable_file("ssl_ca_certs", tls.ca_certs)
        s.ca_file = ca_file
    if tls.ca_path is not None:
        if not os.path.isdir(tls.ca_path):
            raise _ConfigError(
                f"TLS setting ssl_ca_path={os.fspath(tls.ca_path)!r}: not a directory"
            )
        ca_path = os.fsencode(tls.ca_path)
        s.ca_path = ca_path
    if tls.ca_data is not None:
        if isinstance(tls.ca_data, str):
            ca_data = tls.ca_data.encode("ascii", "replace")
            s.ca_data_der = 0
        else:
            ca_data = bytes(tls.ca_data)
            s.ca_data_der = 1
        s.ca_data = ca_data
        s.ca_data_len = <size_t>len(ca_data)
    if tls.keyfile is not None and tls.certfile is None:
        raise _ConfigError("TLS setting ssl_keyfile is set without ssl_certfile")
    if tls.certfile is not None:
        certfile = _readable_file("ssl_certfile", tls.certfile)
        s.certfile = certfile
        if tls.keyfile is not None:
            keyfile = _readable_file("ssl_keyfile", tls.keyfile)
            s.keyfile = keyfile
        if tls.key_password is not None:
            password = _secret_bytes(tls.key_password)
            s.key_password = password
    s.verify = 0 if cert_reqs == "none" else 1
    ctx = rl_tls_ctx_new(&s, &what, err, sizeof(err))
    if ctx != NULL:
        return ctx
    reason = err.decode("utf-8", "replace")
    if what == RL_TLS_E_CA_FILE:
        reason = _pem_reason(tls.ca_certs, reason)
        message = f"ssl_ca_certs={os.fspath(tls.ca_certs)!r}: no CA certificate could be loaded"
    elif what == RL_TLS_E_CA_PATH:
        message = f"ssl_ca_path={os.fspath(tls.ca_path)!r}: the directory could not be used"
    elif what == RL_TLS_E_CA_DATA:
        form = "PEM text" if isinstance(tls.ca_data, str) else "DER bytes"
        message = f"ssl_ca_data ({form}): no CA certificate could be loaded"
    elif what == RL_TLS_E_CERT:
        reason = _pem_reason(tls.certfile, reason)
        message = (f"ssl_certfile={os.fspath(tls.certfile)!r}: "
                   "no certificate chain could be loaded")
    elif what == RL_TLS_E_KEY:
        path = tls.keyfile if tls.keyfile is not None else tls.certfile
        option = "ssl_keyfile" if tls.keyfile is not None else "ssl_certfile"
        reason = _pem_reason(path, reason)
        if _file_has(path, b"ENCRYPTED"):
            hint = (" (the ssl_password given does not open it)" if tls.key_password is not None
                    else " (it is encrypted and ssl_password is not set)")
        else:
            hint = ""
        message = f"{option}={os.fspath(path)!r}: the private key could not be loaded{hint}"
    elif what == RL_TLS_E_KEY_MISMATCH:
        path = tls.keyfile if tls.keyfile is not None else tls.certfile
        message = (f"ssl_keyfile={os.fspath(path)!r}: the private key does not match "
                   f"the certificate in {os.fspath(tls.certfile)!r}")
    elif what == RL_TLS_E_DEFAULT_PATHS:
        message = "the system's default CA certificates could not be loaded"
    elif what == RL_TLS_E_NOMEM:
        raise MemoryError(reason)
    else:
        message = "the TLS context could not be made"
    raise _ConfigError(f"TLS setting {message}: {reason}")


# ---------------------------------------------------------------- one connection (no GIL)

cdef int tls_fail(rl_conn* c, int status, int sys_errno, const char* what,
                  const char* msg) noexcept nogil:
    """Record a failed TLS step (``what``: "connecting to", "reading from"...) and drop."""
    if status == RL_TLS_CLOSED:
        conn_fail(c, RL_ECONN, "Connection closed by server.")
        conn_drop(c)
        return -1
    if status == RL_TLS_SYSCALL:
        return conn_io_error(c, sys_errno, what)
    c.err_kind = RL_ECONN
    if strcmp(what, "connecting to") == 0:
        snprintf(c.err_msg, ERR_MSG, "Error connecting to %s. %s", c.address, msg)
    else:
        snprintf(c.err_msg, ERR_MSG, "Error while %s %s. %s", what, c.address, msg)
    conn_drop(c)
    return -1


cdef int tls_start(rl_conn* c, int64_t deadline) noexcept nogil:
    """The client handshake on the freshly connected ``c.fd``, before ``deadline``."""
    cdef char msg[300]
    cdef int st, sys_errno = 0
    msg[0] = 0
    c.ssl = rl_tls_new(c.tls_ctx, c.fd, c.host, c.tls_check_hostname, msg, TLS_MSG)
    if c.ssl == NULL:
        return tls_fail(c, RL_TLS_FAILED, 0, "connecting to", msg)
    while True:
        st = rl_tls_handshake(c.ssl, &sys_errno, msg, TLS_MSG)
        if st == RL_TLS_OK:
            return 0
        if st == RL_TLS_WANT_READ:
            if conn_wait(c, POLLIN, deadline, "connecting to") < 0:
                return -1
        elif st == RL_TLS_WANT_WRITE:
            if conn_wait(c, POLLOUT, deadline, "connecting to") < 0:
                return -1
        else:
            return tls_fail(c, st, sys_errno, "connecting to", msg)


cdef int tls_send(rl_conn* c, const char* data, size_t n, int64_t deadline) noexcept nogil:
    """All of ``data`` through the TLS connection before ``deadline``."""
    cdef char msg[300]
    cdef size_t off = 0, put = 0
    cdef int st, sys_errno = 0
    while off < n:
        st = rl_tls_write(c.ssl, data + off, n - off, &put, &sys_errno, msg, TLS_MSG)
        if st == RL_TLS_OK:
            off += put
        elif st == RL_TLS_WANT_WRITE:
            if conn_wait(c, POLLOUT, deadline, "writing to") < 0:
                return -1
        elif st == RL_TLS_WANT_READ:
            if conn_wait(c, POLLIN, deadline, "writing to") < 0:
                return -1
        else:
            return tls_fail(c, st, sys_errno, "writing to", msg)
    return 0


cdef ssize_t tls_try_send(rl_conn* c, const char* data, size_t n) noexcept nogil:
    """What the connection takes of ``data`` right now (maybe 0), or -1 (failed, dropped).

    After 0 the same bytes must be sent again (``tls_send`` does).
    """
    cdef char msg[300]
    cdef size_t put = 0
    cdef int st, sys_errno = 0
    st = rl_tls_write(c.ssl, data, n, &put, &sys_errno, msg, TLS_MSG)
    if st == RL_TLS_OK:
        return <ssize_t>put
    if st == RL_TLS_WANT_WRITE or st == RL_TLS_WANT_READ:
        return 0
    return tls_fail(c, st, sys_errno, "writing to", msg)


cdef int tls_read_more(rl_conn* c, int64_t deadline) noexcept nogil:
    """Append at least one decrypted byte to ``c.r``, before ``deadline``.

    The read is tried before any poll: bytes OpenSSL already holds (a whole
    record may wait inside the SSL object while the socket has nothing more
    to say) and a reply that arrived while this thread was busy or
    descheduled are taken at once, without a poll and the wake-up after it.
    Only when nothing has come does the connection wait in poll, then read.
    """
    cdef char msg[300]
    cdef size_t got = 0
    cdef int st, sys_errno = 0
    while True:
        if buf_reserve(&c.r, READ_CHUNK) < 0:
            conn_fail(c, RL_ENOMEM, "out of memory reading a reply")
            conn_drop(c)
            return -1
        st = rl_tls_read(c.ssl, c.r.data + c.r.len, c.r.cap - c.r.len, &got,
                         &sys_errno, msg, TLS_MSG)
        if st == RL_TLS_OK:
            c.r.len += got
            return 0
        if st == RL_TLS_WANT_READ:
            if conn_wait(c, POLLIN, deadline, "reading from") < 0:
                return -1
        elif st == RL_TLS_WANT_WRITE:
            if conn_wait(c, POLLOUT, deadline, "reading from") < 0:
                return -1
        else:
            return tls_fail(c, st, sys_errno, "reading from", msg)


cdef bint tls_idle_input_ok(rl_conn* c) noexcept nogil:
    """An idle TLS connection turned readable: is it only TLS housekeeping?

    A TLS 1.3 server may send session tickets or a key update at any time;
    reading them yields no application byte. Anything else (bytes nobody
    asked for, EOF, an alert) means the connection is done.
    """
    cdef char msg[300]
    cdef size_t got = 0
    cdef int st, sys_errno = 0
    if c.ssl == NULL:
        return False
    if buf_reserve(&c.r, READ_CHUNK) < 0:
        return False
    st = rl_tls_read(c.ssl, c.r.data + c.r.len, c.r.cap - c.r.len, &got,
                     &sys_errno, msg, TLS_MSG)
    return st == RL_TLS_WANT_READ


cdef void tls_forget_after_fork(rl_conn* c) noexcept nogil:
    """In a forked child: let go of the SSL object without touching it.

    A thread of the parent (not copied) may have been inside OpenSSL with
    it, and OpenSSL's locks may have been held: the child neither frees it
    nor writes through it (no close_notify). It stays allocated, once per
    connection per fork, and the connection is then dropped as a plain one.
    """
    c.ssl = NULL
