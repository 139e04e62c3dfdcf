/* TLS for the native connection: OpenSSL behind a few static functions.
 *
 * The context (SSL_CTX) is built once per Target, with the GIL, from the
 * client's ssl_* settings. Everything per connection (SSL_new, the
 * handshake, reads, writes, SSL_free) runs without the GIL on a non-blocking
 * socket: a call never waits, it says what it wants (readable or writable)
 * and the caller polls under its own deadline. OpenSSL 1.1+ is thread-safe
 * with one SSL object per thread at a time and a shared, reference-counted
 * SSL_CTX.
 *
 * Built without RL_HAVE_OPENSSL (no OpenSSL headers at build time) every
 * function is a stub: rl_tls_available() is 0, no context can be made, and
 * so no connection ever has TLS.
 *
 * No password, key or certificate content ever reaches an error message.
 */
#ifndef RL_TLS_H
#define RL_TLS_H

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>

/* What a step of a connection needs next. */
enum {
    RL_TLS_OK = 0,          /* done (handshake) or some bytes moved (read, write) */
    RL_TLS_WANT_READ = 1,   /* wait until the socket is readable, then call again */
    RL_TLS_WANT_WRITE = 2,  /* wait until the socket is writable, then call again */
    RL_TLS_CLOSED = 3,      /* the peer closed the connection */
    RL_TLS_SYSCALL = 4,     /* a socket error: *sys_errno says which */
    RL_TLS_FAILED = 5       /* a TLS failure: the message says what */
};

/* Which setting a context could not be built from. */
enum {
    RL_TLS_E_NONE = 0,
    RL_TLS_E_UNAVAILABLE = 1,
    RL_TLS_E_NOMEM = 2,
    RL_TLS_E_CA_FILE = 3,
    RL_TLS_E_CA_PATH = 4,
    RL_TLS_E_CA_DATA = 5,
    RL_TLS_E_CERT = 6,
    RL_TLS_E_KEY = 7,
    RL_TLS_E_KEY_MISMATCH = 8,
    RL_TLS_E_DEFAULT_PATHS = 9
};

typedef struct {
    const char *ca_file;        /* ssl_ca_certs, or NULL */
    const char *ca_path;        /* ssl_ca_path, or NULL */
    const char *ca_data;        /* ssl_ca_data: PEM text, or DER bytes */
    size_t ca_data_len;
    int ca_data_der;            /* 1: ca_data is DER (bytes given), 0: PEM (text given) */
    const char *certfile;       /* ssl_certfile, or NULL */
    const char *keyfile;        /* ssl_keyfile, or NULL (the key is in certfile) */
    const char *key_password;   /* ssl_password, or NULL */
    int verify;                 /* 0: cert_reqs "none"; 1: the peer must verify */
} rl_tls_settings;

#ifdef RL_HAVE_OPENSSL

#include <openssl/ssl.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <arpa/inet.h>

#if OPENSSL_VERSION_NUMBER < 0x10101000L
#error "redlease needs OpenSSL 1.1.1 or newer"
#endif

static int rl_tls_available(void) { return 1; }

static const char *rl_tls_version(void) { return OpenSSL_version(OPENSSL_VERSION); }

/* The reason of the first error on this thread's queue (the most specific:
 * "bad decrypt" rather than the "PEM lib" it caused), or a fallback. */
static void rl_tls_reason(char *out, size_t outlen, const char *fallback) {
    unsigned long e = ERR_peek_error();
    const char *reason = e ? ERR_reason_error_string(e) : NULL;
    if (reason != NULL) {
        snprintf(out, outlen, "%s", reason);
    } else if (e) {
        ERR_error_string_n(e, out, outlen);
    } else {
        snprintf(out, outlen, "%s", fallback);
    }
    ERR_clear_error();
}

/* The password for an encrypted key, from the userdata: never a prompt. */
static int rl_tls_password_cb(char *buf, int size, int rwflag, void *userdata) {
    size_t n;
    (void)rwflag;
    if (userdata == NULL || size <= 0) return 0;
    n = strlen((const char *)userdata);
    if (n > (size_t)size) n = (size_t)size;
    memcpy(buf, userdata, n);
    return (int)n;
}

static int rl_tls_add_ca_data(SSL_CTX *ctx, const rl_tls_settings *s) {
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    int added = 0;
    if (s->ca_data_der) {
        const unsigned char *p = (const unsigned char *)s->ca_data;
        const unsigned char *end = p + s->ca_data_len;
        while (p < end) {
            X509 *x = d2i_X509(NULL, &p, (long)(end - p));
            if (x == NULL) return -1;
            if (!X509_STORE_add_cert(store, x)) {
                unsigned long e = ERR_peek_last_error();
                if (ERR_GET_REASON(e) != X509_R_CERT_ALREADY_IN_HASH_TABLE) {
                    X509_free(x);
                    return -1;
                }
                ERR_clear_error();
            }
            X509_free(x);
            added++;
        }
    } else {
        BIO *bio = BIO_new_mem_buf(s->ca_data, (int)s->ca_data_len);
        X509 *x;
        if (bio == NULL) return -1;
        while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
            if (!X509_STORE_add_cert(store, x)) {
                unsigned long e = ERR_peek_last_error();
                if (ERR_GET_REASON(e) != X509_R_CERT_ALREADY_IN_HASH_TABLE) {
                    X509_free(x);
                    BIO_free(bio);
                    return -1;
                }
            }
            X509_free(x);
            added++;
        }
        BIO_free(bio);
        /* The loop ends on "no start line" once the text runs out. */
        if (added > 0) ERR_clear_error();
    }
    if (added == 0) {
        ERR_clear_error();
        return -2;  /* nothing that parses as a certificate */
    }
    return 0;
}

/* A new client context from the settings, or NULL with *what set (one of
 * RL_TLS_E_*) and the OpenSSL reason in err. Called with the GIL; it reads
 * files. */
static void *rl_tls_ctx_new(const rl_tls_settings *s, int *what, char *err, size_t errlen) {
    SSL_CTX *ctx;
    ERR_clear_error();
    *what = RL_TLS_E_NONE;
    err[0] = 0;
    ctx = SSL_CTX_new(TLS_client_method());
    if (ctx == NULL) {
        *what = RL_TLS_E_NOMEM;
        rl_tls_reason(err, errlen, "cannot make an SSL context");
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION);
    /* A write may take part of a buffer, and be retried from a new address
       with the rest: the caller resumes where the last call stopped. */
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    SSL_CTX_set_default_passwd_cb(ctx, rl_tls_password_cb);
    /* One read() takes whatever has arrived, not a record header and then
       its body: half the system calls per reply. Bytes read ahead wait
       inside the SSL object, which is why readers check SSL_has_pending()
       before polling the socket. */
    SSL_CTX_set_read_ahead(ctx, 1);

    if (s->ca_file != NULL || s->ca_path != NULL) {
        if (s->ca_file != NULL && !SSL_CTX_load_verify_locations(ctx, s->ca_file, NULL)) {
            *what = RL_TLS_E_CA_FILE;
            goto fail;
        }
        if (s->ca_path != NULL && !SSL_CTX_load_verify_locations(ctx, NULL, s->ca_path)) {
            *what = RL_TLS_E_CA_PATH;
            goto fail;
        }
    }
    if (s->ca_data != NULL) {
        int rc = rl_tls_add_ca_data(ctx, s);
        if (rc == -2) {
            *what = RL_TLS_E_CA_DATA;
            snprintf(err, errlen, "no certificate found");
            SSL_CTX_free(ctx);
            return NULL;
        }
        if (rc < 0) {
            *what = RL_TLS_E_CA_DATA;
            goto fail;
        }
    }
    if (s->ca_file == NULL && s->ca_path == NULL && s->ca_data == NULL) {
        if (!SSL_CTX_set_default_verify_paths(ctx)) {
            *what = RL_TLS_E_DEFAULT_PATHS;
            goto fail;
        }
    }
    if (s->certfile != NULL) {
        if (!SSL_CTX_use_certificate_chain_file(ctx, s->certfile)) {
            *what = RL_TLS_E_CERT;
            goto fail;
        }
        SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)s->key_password);
        if (!SSL_CTX_use_PrivateKey_file(ctx, s->keyfile ? s->keyfile : s->certfile,
                                         SSL_FILETYPE_PEM)) {
            SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
            *what = ERR_GET_REASON(ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH
                        ? RL_TLS_E_KEY_MISMATCH : RL_TLS_E_KEY;
            goto fail;
        }
        /* The password is not the context's to keep. */
        SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
        if (!SSL_CTX_check_private_key(ctx)) {
            *what = RL_TLS_E_KEY_MISMATCH;
            goto fail;
        }
    }
    SSL_CTX_set_verify(ctx, s->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    ERR_clear_error();
    return ctx;

fail:
    rl_tls_reason(err, errlen, "unknown error");
    SSL_CTX_free(ctx);
    return NULL;
}

static void rl_tls_ctx_up_ref(void *ctx) {
    if (ctx != NULL) SSL_CTX_up_ref((SSL_CTX *)ctx);
}

static void rl_tls_ctx_free(void *ctx) {
    if (ctx != NULL) SSL_CTX_free((SSL_CTX *)ctx);
}

static int rl_tls_is_ip(const char *host) {
    unsigned char buf[16];
    return inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1;
}

/* A new connection over fd (connected, non-blocking) to host. Like Python's
 * ssl: SNI for a host name (not for an address), and with check_hostname
 * the certificate must name the host (or hold the IP address). NULL with a
 * message in err on failure. host must outlive the connection: error
 * messages name it. */
static void *rl_tls_new(void *ctx, int fd, const char *host, int check_hostname,
                        char *err, size_t errlen) {
    SSL *ssl;
    int ip = rl_tls_is_ip(host);
    ERR_clear_error();
    ssl = SSL_new((SSL_CTX *)ctx);
    if (ssl == NULL) goto fail;
    if (!SSL_set_fd(ssl, fd)) goto fail;
    SSL_set_app_data(ssl, (char *)host);
    SSL_set_connect_state(ssl);
    if (!ip && host[0] != 0 && !SSL_set_tlsext_host_name(ssl, host)) goto fail;
    if (check_hostname) {
        if (ip) {
            if (!X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)) goto fail;
        } else {
            SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            if (!SSL_set1_host(ssl, host)) goto fail;
        }
    }
    return ssl;

fail:
    rl_tls_reason(err, errlen, "cannot set up a TLS connection");
    if (ssl != NULL) SSL_free(ssl);
    return NULL;
}

static void rl_tls_free(void *ssl) {
    /* No SSL_shutdown: it would write (and may wait) on a socket we are
       abandoning, possibly in a forked child that does not own it. */
    if (ssl != NULL) SSL_free((SSL *)ssl);
}

/* Turn the result of an SSL call into RL_TLS_*, with a message for failures. */
static int rl_tls_status(SSL *ssl, int rc, int *sys_errno, char *err, size_t errlen) {
    int saved = errno;
    int e = SSL_get_error(ssl, rc);
    long vr;
    switch (e) {
    case SSL_ERROR_NONE:
        return RL_TLS_OK;
    case SSL_ERROR_WANT_READ:
        return RL_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return RL_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        ERR_clear_error();
        return RL_TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        if (ERR_peek_last_error() == 0) {
            ERR_clear_error();
            if (saved == 0) return RL_TLS_CLOSED;
            *sys_errno = saved;
            return RL_TLS_SYSCALL;
        }
        break;
    default:
        break;
    }
#ifdef SSL_R_UNEXPECTED_EOF_WHILE_READING
    if (ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ERR_clear_error();
        return RL_TLS_CLOSED;
    }
#endif
    vr = SSL_get_verify_result(ssl);
    if (vr != X509_V_OK &&
        ERR_GET_REASON(ERR_peek_last_error()) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        ERR_clear_error();
        if (vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH) {
            const char *host = (const char *)SSL_get_app_data(ssl);
            snprintf(err, errlen,
                     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                     "%s mismatch, certificate is not valid for '%s'.",
                     vr == X509_V_ERR_IP_ADDRESS_MISMATCH ? "IP address" : "Hostname",
                     host ? host : "?");
        } else {
            snprintf(err, errlen,
                     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: %s.",
                     X509_verify_cert_error_string(vr));
        }
        return RL_TLS_FAILED;
    }
    {
        char reason[200];
        rl_tls_reason(reason, sizeof reason, "TLS failure");
        snprintf(err, errlen, "[SSL] %s", reason);
    }
    return RL_TLS_FAILED;
}

/* One step of the client handshake. */
static int rl_tls_handshake(void *ssl, int *sys_errno, char *err, size_t errlen) {
    int rc;
    ERR_clear_error();
    errno = 0;
    rc = SSL_do_handshake((SSL *)ssl);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Read up to n bytes: RL_TLS_OK with *got > 0, or what to wait for, or a failure. */
static int rl_tls_read(void *ssl, void *buf, size_t n, size_t *got, int *sys_errno,
                       char *err, size_t errlen) {
    int rc;
    ERR_clear_error();
    errno = 0;
    *got = 0;
    rc = SSL_read_ex((SSL *)ssl, buf, n, got);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Write up to n bytes (n > 0): RL_TLS_OK with *put > 0, or what to wait for,
 * or a failure. After a WANT the same bytes must be offered again. */
static int rl_tls_write(void *ssl, const void *buf, size_t n, size_t *put, int *sys_errno,
                        char *err, size_t errlen) {
    int rc;
    ERR_clear_error();
    errno = 0;
    *put = 0;
    rc = SSL_write_ex((SSL *)ssl, buf, n, put);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Whether decrypted or buffered input is waiting inside the SSL object. */
static int rl_tls_has_pending(void *ssl) {
    return SSL_pending((SSL *)ssl) > 0 || SSL_has_pending((SSL *)ssl);
}

#else /* no OpenSSL at build time: stubs */

typedef int rl_tls_unused;

static int rl_tls_available(void) { return 0; }

static const char *rl_tls_version(void) { return ""; }

static void *rl_tls_ctx_new(const rl_tls_settings *s, int *what, char *err, size_t errlen) {
    (void)s;
    *what = RL_TLS_E_UNAVAILABLE;
    snprintf(err, errlen, "the native extension was built without OpenSSL");
    return NULL;
}

static void rl_tls_ctx_up_ref(void *ctx) { (void)ctx; }

static void rl_tls_ctx_free(void *ctx) { (void)ctx; }

static void *rl_tls_new(void *ctx, int fd, const char *host, int check_hostname,
                        char *err, size_t errlen) {
    (void)ctx; (void)fd; (void)host; (void)check_hostname;
    snprintf(err, errlen, "the native extension was built without OpenSSL");
    return NULL;
}

static void rl_tls_free(void *ssl) { (void)ssl; }

static int rl_tls_handshake(void *ssl, int *sys_errno, char *err, size_t errlen) {
    (void)ssl; (void)sys_errno;
    snprintf(err, errlen, "the native extension was built without OpenSSL");
    return RL_TLS_FAILED;
}

static int rl_tls_read(void *ssl, void *buf, size_t n, size_t *got, int *sys_errno,
                       char *err, size_t errlen) {
    (void)ssl; (void)buf; (void)n; (void)sys_errno;
    *got = 0;
    snprintf(err, errlen, "the native extension was built without OpenSSL");
    return RL_TLS_FAILED;
}

static int rl_tls_write(void *ssl, const void *buf, size_t n, size_t *put, int *sys_errno,
                        char *err, size_t errlen) {
    (void)ssl; (void)buf; (void)n; (void)sys_errno;
    *put = 0;
    snprintf(err, errlen, "the native extension was built without OpenSSL");
    return RL_TLS_FAILED;
}

static int rl_tls_has_pending(void *ssl) { (void)ssl; return 0; }

#endif /* RL_HAVE_OPENSSL */

#endif /* RL_TLS_H */
