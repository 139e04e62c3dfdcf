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
 * Where no OpenSSL could be found at import (see rl_tls_load below),
 * rl_tls_available() is 0 and rl_tls_why() says why; no context can be made
 * then, and so no connection ever has TLS.
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

/* ---------------------------------------------------------------- OpenSSL, found at import
 *
 * The extension does not link OpenSSL and includes none of its headers. At
 * import the core finds the libssl and libcrypto that Python's own ssl
 * module has already loaded into the process, and looks up the functions it
 * calls into rl_ossl, a table of function pointers; everything below calls
 * through that table. Why:
 *
 * - a wheel then needs no libssl of its own: bundling the build host's
 *   libssl.so.3 would tie the wheel to that host's newer glibc (and so to a
 *   newer manylinux tag), add megabytes, and freeze its security fixes at
 *   the build day; linking the system's at build time makes the wheel refuse
 *   to load where the system has another soname (1.1 vs 3);
 * - TLS in the native engine is then the same OpenSSL, at the same version
 *   and with the same security updates, as the Python it runs in, and as the
 *   pure-Python engine's (which is Python's ssl);
 * - every build is this one build: the in-place, the sdist and the wheel
 *   builds need no OpenSSL headers, and there is no "built without TLS".
 *
 * OpenSSL 1.1.1 and 3.x both work: the functions used here have one name in
 * both (none of those renamed in 3.0, such as SSL_get_peer_certificate, is
 * called), macros of the headers are spelled out as the calls they expand to
 * (SSL_CTX_ctrl, SSL_ctrl, the ex_data slot 0), and the one that differs,
 * ERR_GET_REASON, is chosen by the version found. The few types are opaque
 * here and the constants are OpenSSL's values, identical in 1.1.1 and 3.x.
 *
 * The table is filled once, at import, with the GIL held, and never changes
 * after, so threads without the GIL read it freely. No handle is closed:
 * the ssl module keeps these libraries loaded for the life of the process.
 */
#include <dlfcn.h>
#include <arpa/inet.h>
#include <stdint.h>

typedef struct rl_SSL_CTX rl_SSL_CTX;
typedef struct rl_SSL rl_SSL;
typedef struct rl_SSL_METHOD rl_SSL_METHOD;
typedef struct rl_X509 rl_X509;
typedef struct rl_X509_STORE rl_X509_STORE;
typedef struct rl_X509_VERIFY_PARAM rl_X509_VERIFY_PARAM;
typedef struct rl_BIO rl_BIO;
typedef int (*rl_pem_password_cb)(char *buf, int size, int rwflag, void *userdata);

/* OpenSSL's values (ssl.h, tls1.h, prov_ssl.h, x509.h, x509v3.h,
   x509_vfy.h, *err.h), the same in 1.1.1 and 3.x. */
#define OPENSSL_VERSION 0
#define TLS1_2_VERSION 0x0303
#define SSL_CTRL_MODE 33
#define SSL_CTRL_SET_READ_AHEAD 41
#define SSL_CTRL_SET_TLSEXT_HOSTNAME 55
#define SSL_CTRL_SET_MIN_PROTO_VERSION 123
#define TLSEXT_NAMETYPE_host_name 0
#define SSL_OP_NO_COMPRESSION ((uint64_t)1 << 17)
#define SSL_MODE_ENABLE_PARTIAL_WRITE 0x00000001L
#define SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER 0x00000002L
#define SSL_FILETYPE_PEM 1
#define SSL_VERIFY_NONE 0x00
#define SSL_VERIFY_PEER 0x01
#define SSL_ERROR_NONE 0
#define SSL_ERROR_WANT_READ 2
#define SSL_ERROR_WANT_WRITE 3
#define SSL_ERROR_SYSCALL 5
#define SSL_ERROR_ZERO_RETURN 6
#define X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS 0x4
#define X509_V_OK 0
#define X509_V_ERR_HOSTNAME_MISMATCH 62
#define X509_V_ERR_IP_ADDRESS_MISMATCH 64
#define X509_R_CERT_ALREADY_IN_HASH_TABLE 101
#define X509_R_KEY_VALUES_MISMATCH 116
#define SSL_R_CERTIFICATE_VERIFY_FAILED 134
#define SSL_R_UNEXPECTED_EOF_WHILE_READING 294 /* 3.0 and later only */

/* Every function the glue calls: X(return type, name, parameters). */
#define RL_OPENSSL_FUNCTIONS(X) \
    X(unsigned long, OpenSSL_version_num, (void)) \
    X(const char *, OpenSSL_version, (int t)) \
    X(unsigned long, ERR_peek_error, (void)) \
    X(unsigned long, ERR_peek_last_error, (void)) \
    X(const char *, ERR_reason_error_string, (unsigned long e)) \
    X(void, ERR_error_string_n, (unsigned long e, char *buf, size_t len)) \
    X(void, ERR_clear_error, (void)) \
    X(rl_X509 *, d2i_X509, (rl_X509 **a, const unsigned char **pp, long length)) \
    X(int, X509_STORE_add_cert, (rl_X509_STORE *store, rl_X509 *x)) \
    X(void, X509_free, (rl_X509 *x)) \
    X(rl_BIO *, BIO_new_mem_buf, (const void *buf, int len)) \
    X(rl_X509 *, PEM_read_bio_X509, (rl_BIO *bp, rl_X509 **x, rl_pem_password_cb cb, void *u)) \
    X(int, BIO_free, (rl_BIO *a)) \
    X(int, X509_VERIFY_PARAM_set1_ip_asc, (rl_X509_VERIFY_PARAM *param, const char *ipasc)) \
    X(const char *, X509_verify_cert_error_string, (long n)) \
    X(const rl_SSL_METHOD *, TLS_client_method, (void)) \
    X(rl_SSL_CTX *, SSL_CTX_new, (const rl_SSL_METHOD *method)) \
    X(void, SSL_CTX_free, (rl_SSL_CTX *ctx)) \
    X(int, SSL_CTX_up_ref, (rl_SSL_CTX *ctx)) \
    X(long, SSL_CTX_ctrl, (rl_SSL_CTX *ctx, int cmd, long larg, void *parg)) \
    /* unsigned long in 1.1.1, uint64_t in 3.x: one 64-bit register either way */ \
    X(uint64_t, SSL_CTX_set_options, (rl_SSL_CTX *ctx, uint64_t op)) \
    X(void, SSL_CTX_set_default_passwd_cb, (rl_SSL_CTX *ctx, rl_pem_password_cb cb)) \
    X(void, SSL_CTX_set_default_passwd_cb_userdata, (rl_SSL_CTX *ctx, void *u)) \
    X(int, SSL_CTX_load_verify_locations, (rl_SSL_CTX *ctx, const char *file, const char *path)) \
    X(int, SSL_CTX_set_default_verify_paths, (rl_SSL_CTX *ctx)) \
    X(int, SSL_CTX_use_certificate_chain_file, (rl_SSL_CTX *ctx, const char *file)) \
    X(int, SSL_CTX_use_PrivateKey_file, (rl_SSL_CTX *ctx, const char *file, int type)) \
    X(int, SSL_CTX_check_private_key, (const rl_SSL_CTX *ctx)) \
    X(void, SSL_CTX_set_verify, (rl_SSL_CTX *ctx, int mode, void *callback)) \
    X(rl_X509_STORE *, SSL_CTX_get_cert_store, (const rl_SSL_CTX *ctx)) \
    X(rl_SSL *, SSL_new, (rl_SSL_CTX *ctx)) \
    X(int, SSL_set_fd, (rl_SSL *ssl, int fd)) \
    X(int, SSL_set_ex_data, (rl_SSL *ssl, int idx, void *data)) \
    X(void *, SSL_get_ex_data, (const rl_SSL *ssl, int idx)) \
    X(void, SSL_set_connect_state, (rl_SSL *ssl)) \
    X(long, SSL_ctrl, (rl_SSL *ssl, int cmd, long larg, void *parg)) \
    X(rl_X509_VERIFY_PARAM *, SSL_get0_param, (rl_SSL *ssl)) \
    X(void, SSL_set_hostflags, (rl_SSL *ssl, unsigned int flags)) \
    X(int, SSL_set1_host, (rl_SSL *ssl, const char *hostname)) \
    X(void, SSL_free, (rl_SSL *ssl)) \
    X(int, SSL_get_error, (const rl_SSL *ssl, int ret)) \
    X(long, SSL_get_verify_result, (const rl_SSL *ssl)) \
    X(int, SSL_do_handshake, (rl_SSL *ssl)) \
    X(int, SSL_read_ex, (rl_SSL *ssl, void *buf, size_t num, size_t *readbytes)) \
    X(int, SSL_write_ex, (rl_SSL *ssl, const void *buf, size_t num, size_t *written)) \
    X(int, SSL_pending, (const rl_SSL *ssl)) \
    X(int, SSL_has_pending, (const rl_SSL *ssl))

#define RL_OSSL_FIELD(ret, name, params) ret (*name) params;
static struct {
    int loaded;     /* 1 once every function below was found */
    int v3;         /* OpenSSL 3.0 or later */
    char why[300];  /* when not loaded: why not */
    RL_OPENSSL_FUNCTIONS(RL_OSSL_FIELD)
} rl_ossl;
#undef RL_OSSL_FIELD

/* Fill the table from one handle: 0, or -1 with the missing name in why. */
static int rl_tls_resolve(void *handle, const char *where) {
#define RL_OSSL_LOOKUP(ret, name, params) \
    *(void **)(&rl_ossl.name) = dlsym(handle, #name); \
    if (rl_ossl.name == NULL) { \
        snprintf(rl_ossl.why, sizeof rl_ossl.why, "%s lacks %s", where, #name); \
        return -1; \
    }
    RL_OPENSSL_FUNCTIONS(RL_OSSL_LOOKUP)
#undef RL_OSSL_LOOKUP
    return 0;
}

/* Find the OpenSSL of the ssl module (already imported by the caller).
 * ssl_module is the path of its _ssl extension, or NULL where _ssl is built
 * into the interpreter. Tried in turn, never loading anything new
 * (RTLD_NOLOAD): the _ssl extension itself (dlsym through its handle
 * searches the libraries it depends on, whatever their soname), the
 * sonames of OpenSSL 3 and 1.1, then the process's global symbols (an
 * interpreter with OpenSSL linked in). 1 on success; 0 with rl_ossl.why. */
static int rl_tls_load(const char *ssl_module) {
    static const char *sonames[] = {"libssl.so.3", "libssl.so.1.1"};
    char first[300];
    size_t i;
    void *handle;
    unsigned long version;
    first[0] = 0;
    rl_ossl.loaded = 0;
    for (i = 0; i < 4; i++) {
        const char *where;
        if (i == 0) {
            if (ssl_module == NULL) continue;
            handle = dlopen(ssl_module, RTLD_NOW | RTLD_NOLOAD);
            where = "Python's _ssl module";
        } else if (i < 3) {
            handle = dlopen(sonames[i - 1], RTLD_NOW | RTLD_NOLOAD);
            where = sonames[i - 1];
        } else {
            handle = RTLD_DEFAULT;
            where = "the interpreter";
        }
        if (handle == NULL) continue;
        if (rl_tls_resolve(handle, where) == 0) {
            version = rl_ossl.OpenSSL_version_num();
            if (version >= 0x10101000UL) {
                rl_ossl.v3 = version >= 0x30000000UL;
                rl_ossl.loaded = 1;
                rl_ossl.why[0] = 0;
                return 1;
            }
            snprintf(rl_ossl.why, sizeof rl_ossl.why,
                     "Python's ssl module runs %s, and 1.1.1 or newer is needed",
                     rl_ossl.OpenSSL_version(OPENSSL_VERSION));
        }
        if (first[0] == 0) memcpy(first, rl_ossl.why, sizeof first);
    }
    if (first[0] != 0) {
        memcpy(rl_ossl.why, first, sizeof first);
    } else {
        snprintf(rl_ossl.why, sizeof rl_ossl.why,
                 "no OpenSSL is loaded by Python's ssl module");
    }
    return 0;
}

/* Called by the core when it does not look for OpenSSL at all. */
static void rl_tls_unavailable(const char *why) {
    rl_ossl.loaded = 0;
    snprintf(rl_ossl.why, sizeof rl_ossl.why, "%s", why);
}

static int rl_tls_available(void) { return rl_ossl.loaded; }

static const char *rl_tls_why(void) { return rl_ossl.why; }

/* 3.0 keeps the library and reason apart differently from 1.1.1 (and
 * flags system errors in the top bit); ERR_GET_REASON of each. */
static int rl_err_reason(unsigned long e) {
    if (rl_ossl.v3) {
        if (e & 0x80000000UL) return (int)(e & 0x7FFFFFFFUL);
        return (int)(e & 0x7FFFFFUL);
    }
    return (int)(e & 0xFFFUL);
}

static long rl_ssl_ctx_set_min_proto_version(rl_SSL_CTX *ctx, int version) {
    return rl_ossl.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, version, NULL);
}

static long rl_ssl_ctx_set_mode(rl_SSL_CTX *ctx, long mode) {
    return rl_ossl.SSL_CTX_ctrl(ctx, SSL_CTRL_MODE, mode, NULL);
}

static long rl_ssl_ctx_set_read_ahead(rl_SSL_CTX *ctx, int yes) {
    return rl_ossl.SSL_CTX_ctrl(ctx, SSL_CTRL_SET_READ_AHEAD, yes, NULL);
}

static long rl_ssl_set_host_name(rl_SSL *ssl, const char *name) {
    return rl_ossl.SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                            (void *)name);
}

static int rl_ssl_set_app_data(rl_SSL *ssl, void *data) {
    return rl_ossl.SSL_set_ex_data(ssl, 0, data);
}

static void *rl_ssl_get_app_data(const rl_SSL *ssl) {
    return rl_ossl.SSL_get_ex_data(ssl, 0);
}

/* ---------------------------------------------------------------- the glue */

static const char *rl_tls_version(void) {
    return rl_ossl.loaded ? rl_ossl.OpenSSL_version(OPENSSL_VERSION) : "";
}

/* The reason of the first error on this thread's queue (the most specific:
 * "bad decrypt" rather than the "PEM lib" it caused), or a fallback. */
static void rl_tls_reason(char *out, size_t outlen, const char *fallback) {
    unsigned long e = rl_ossl.ERR_peek_error();
    const char *reason = e ? rl_ossl.ERR_reason_error_string(e) : NULL;
    if (reason != NULL) {
        snprintf(out, outlen, "%s", reason);
    } else if (e) {
        rl_ossl.ERR_error_string_n(e, out, outlen);
    } else {
        snprintf(out, outlen, "%s", fallback);
    }
    rl_ossl.ERR_clear_error();
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

static int rl_tls_add_ca_data(rl_SSL_CTX *ctx, const rl_tls_settings *s) {
    rl_X509_STORE *store = rl_ossl.SSL_CTX_get_cert_store(ctx);
    int added = 0;
    if (s->ca_data_der) {
        const unsigned char *p = (const unsigned char *)s->ca_data;
        const unsigned char *end = p + s->ca_data_len;
        while (p < end) {
            rl_X509 *x = rl_ossl.d2i_X509(NULL, &p, (long)(end - p));
            if (x == NULL) return -1;
            if (!rl_ossl.X509_STORE_add_cert(store, x)) {
                unsigned long e = rl_ossl.ERR_peek_last_error();
                if (rl_err_reason(e) != X509_R_CERT_ALREADY_IN_HASH_TABLE) {
                    rl_ossl.X509_free(x);
                    return -1;
                }
                rl_ossl.ERR_clear_error();
            }
            rl_ossl.X509_free(x);
            added++;
        }
    } else {
        rl_BIO *bio = rl_ossl.BIO_new_mem_buf(s->ca_data, (int)s->ca_data_len);
        rl_X509 *x;
        if (bio == NULL) return -1;
        while ((x = rl_ossl.PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
            if (!rl_ossl.X509_STORE_add_cert(store, x)) {
                unsigned long e = rl_ossl.ERR_peek_last_error();
                if (rl_err_reason(e) != X509_R_CERT_ALREADY_IN_HASH_TABLE) {
                    rl_ossl.X509_free(x);
                    rl_ossl.BIO_free(bio);
                    return -1;
                }
            }
            rl_ossl.X509_free(x);
            added++;
        }
        rl_ossl.BIO_free(bio);
        /* The loop ends on "no start line" once the text runs out. */
        if (added > 0) rl_ossl.ERR_clear_error();
    }
    if (added == 0) {
        rl_ossl.ERR_clear_error();
        return -2;  /* nothing that parses as a certificate */
    }
    return 0;
}

/* A new client context from the settings, or NULL with *what set (one of
 * RL_TLS_E_*) and the OpenSSL reason in err. Called with the GIL; it reads
 * files. */
static void *rl_tls_ctx_new(const rl_tls_settings *s, int *what, char *err, size_t errlen) {
    rl_SSL_CTX *ctx;
    if (!rl_ossl.loaded) {
        *what = RL_TLS_E_UNAVAILABLE;
        snprintf(err, errlen, "%s", rl_ossl.why[0] ? rl_ossl.why : "OpenSSL is not loaded");
        return NULL;
    }
    rl_ossl.ERR_clear_error();
    *what = RL_TLS_E_NONE;
    err[0] = 0;
    ctx = rl_ossl.SSL_CTX_new(rl_ossl.TLS_client_method());
    if (ctx == NULL) {
        *what = RL_TLS_E_NOMEM;
        rl_tls_reason(err, errlen, "cannot make an SSL context");
        return NULL;
    }
    rl_ssl_ctx_set_min_proto_version(ctx, TLS1_2_VERSION);
    rl_ossl.SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION);
    /* A write may take part of a buffer, and be retried from a new address
       with the rest: the caller resumes where the last call stopped. */
    rl_ssl_ctx_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    rl_ossl.SSL_CTX_set_default_passwd_cb(ctx, rl_tls_password_cb);
    /* One read() takes whatever has arrived, not a record header and then
       its body: half the system calls per reply. Bytes read ahead wait
       inside the SSL object, which is why readers check SSL_has_pending()
       before polling the socket. */
    rl_ssl_ctx_set_read_ahead(ctx, 1);

    if (s->ca_file != NULL || s->ca_path != NULL) {
        if (s->ca_file != NULL && !rl_ossl.SSL_CTX_load_verify_locations(ctx, s->ca_file, NULL)) {
            *what = RL_TLS_E_CA_FILE;
            goto fail;
        }
        if (s->ca_path != NULL && !rl_ossl.SSL_CTX_load_verify_locations(ctx, NULL, s->ca_path)) {
            *what = RL_TLS_E_CA_PATH;
            goto fail;
        }
    }
    if (s->ca_data != NULL) {
        int rc = rl_tls_add_ca_data(ctx, s);
        if (rc == -2) {
            *what = RL_TLS_E_CA_DATA;
            snprintf(err, errlen, "no certificate found");
            rl_ossl.SSL_CTX_free(ctx);
            return NULL;
        }
        if (rc < 0) {
            *what = RL_TLS_E_CA_DATA;
            goto fail;
        }
    }
    if (s->ca_file == NULL && s->ca_path == NULL && s->ca_data == NULL) {
        if (!rl_ossl.SSL_CTX_set_default_verify_paths(ctx)) {
            *what = RL_TLS_E_DEFAULT_PATHS;
            goto fail;
        }
    }
    if (s->certfile != NULL) {
        if (!rl_ossl.SSL_CTX_use_certificate_chain_file(ctx, s->certfile)) {
            *what = RL_TLS_E_CERT;
            goto fail;
        }
        rl_ossl.SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)s->key_password);
        if (!rl_ossl.SSL_CTX_use_PrivateKey_file(ctx, s->keyfile ? s->keyfile : s->certfile,
                                         SSL_FILETYPE_PEM)) {
            rl_ossl.SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
            *what = rl_err_reason(rl_ossl.ERR_peek_last_error()) == X509_R_KEY_VALUES_MISMATCH
                        ? RL_TLS_E_KEY_MISMATCH : RL_TLS_E_KEY;
            goto fail;
        }
        /* The password is not the context's to keep. */
        rl_ossl.SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
        if (!rl_ossl.SSL_CTX_check_private_key(ctx)) {
            *what = RL_TLS_E_KEY_MISMATCH;
            goto fail;
        }
    }
    rl_ossl.SSL_CTX_set_verify(ctx, s->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
    rl_ossl.ERR_clear_error();
    return ctx;

fail:
    rl_tls_reason(err, errlen, "unknown error");
    rl_ossl.SSL_CTX_free(ctx);
    return NULL;
}

static void rl_tls_ctx_up_ref(void *ctx) {
    if (ctx != NULL) rl_ossl.SSL_CTX_up_ref((rl_SSL_CTX *)ctx);
}

static void rl_tls_ctx_free(void *ctx) {
    if (ctx != NULL) rl_ossl.SSL_CTX_free((rl_SSL_CTX *)ctx);
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
    rl_SSL *ssl;
    int ip = rl_tls_is_ip(host);
    rl_ossl.ERR_clear_error();
    ssl = rl_ossl.SSL_new((rl_SSL_CTX *)ctx);
    if (ssl == NULL) goto fail;
    if (!rl_ossl.SSL_set_fd(ssl, fd)) goto fail;
    rl_ssl_set_app_data(ssl, (char *)host);
    rl_ossl.SSL_set_connect_state(ssl);
    if (!ip && host[0] != 0 && !rl_ssl_set_host_name(ssl, host)) goto fail;
    if (check_hostname) {
        if (ip) {
            if (!rl_ossl.X509_VERIFY_PARAM_set1_ip_asc(rl_ossl.SSL_get0_param(ssl), host)) goto fail;
        } else {
            rl_ossl.SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            if (!rl_ossl.SSL_set1_host(ssl, host)) goto fail;
        }
    }
    return ssl;

fail:
    rl_tls_reason(err, errlen, "cannot set up a TLS connection");
    if (ssl != NULL) rl_ossl.SSL_free(ssl);
    return NULL;
}

static void rl_tls_free(void *ssl) {
    /* No SSL_shutdown: it would write (and may wait) on a socket we are
       abandoning, possibly in a forked child that does not own it. */
    if (ssl != NULL) rl_ossl.SSL_free((rl_SSL *)ssl);
}

/* Turn the result of an SSL call into RL_TLS_*, with a message for failures. */
static int rl_tls_status(rl_SSL *ssl, int rc, int *sys_errno, char *err, size_t errlen) {
    int saved = errno;
    int e = rl_ossl.SSL_get_error(ssl, rc);
    long vr;
    switch (e) {
    case SSL_ERROR_NONE:
        return RL_TLS_OK;
    case SSL_ERROR_WANT_READ:
        return RL_TLS_WANT_READ;
    case SSL_ERROR_WANT_WRITE:
        return RL_TLS_WANT_WRITE;
    case SSL_ERROR_ZERO_RETURN:
        rl_ossl.ERR_clear_error();
        return RL_TLS_CLOSED;
    case SSL_ERROR_SYSCALL:
        if (rl_ossl.ERR_peek_last_error() == 0) {
            rl_ossl.ERR_clear_error();
            if (saved == 0) return RL_TLS_CLOSED;
            *sys_errno = saved;
            return RL_TLS_SYSCALL;
        }
        break;
    default:
        break;
    }
    /* 3.0 reports an EOF without close_notify as this error (1.1.1 as
       SSL_ERROR_SYSCALL with an empty queue, handled above). */
    if (rl_ossl.v3 &&
        rl_err_reason(rl_ossl.ERR_peek_last_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        rl_ossl.ERR_clear_error();
        return RL_TLS_CLOSED;
    }
    vr = rl_ossl.SSL_get_verify_result(ssl);
    if (vr != X509_V_OK &&
        rl_err_reason(rl_ossl.ERR_peek_last_error()) == SSL_R_CERTIFICATE_VERIFY_FAILED) {
        rl_ossl.ERR_clear_error();
        if (vr == X509_V_ERR_HOSTNAME_MISMATCH || vr == X509_V_ERR_IP_ADDRESS_MISMATCH) {
            const char *host = (const char *)rl_ssl_get_app_data(ssl);
            snprintf(err, errlen,
                     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
                     "%s mismatch, certificate is not valid for '%s'.",
                     vr == X509_V_ERR_IP_ADDRESS_MISMATCH ? "IP address" : "Hostname",
                     host ? host : "?");
        } else {
            snprintf(err, errlen,
                     "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: %s.",
                     rl_ossl.X509_verify_cert_error_string(vr));
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
    rl_ossl.ERR_clear_error();
    errno = 0;
    rc = rl_ossl.SSL_do_handshake((rl_SSL *)ssl);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((rl_SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Read up to n bytes: RL_TLS_OK with *got > 0, or what to wait for, or a failure. */
static int rl_tls_read(void *ssl, void *buf, size_t n, size_t *got, int *sys_errno,
                       char *err, size_t errlen) {
    int rc;
    rl_ossl.ERR_clear_error();
    errno = 0;
    *got = 0;
    rc = rl_ossl.SSL_read_ex((rl_SSL *)ssl, buf, n, got);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((rl_SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Write up to n bytes (n > 0): RL_TLS_OK with *put > 0, or what to wait for,
 * or a failure. After a WANT the same bytes must be offered again. */
static int rl_tls_write(void *ssl, const void *buf, size_t n, size_t *put, int *sys_errno,
                        char *err, size_t errlen) {
    int rc;
    rl_ossl.ERR_clear_error();
    errno = 0;
    *put = 0;
    rc = rl_ossl.SSL_write_ex((rl_SSL *)ssl, buf, n, put);
    if (rc == 1) return RL_TLS_OK;
    return rl_tls_status((rl_SSL *)ssl, rc, sys_errno, err, errlen);
}

/* Whether decrypted or buffered input is waiting inside the SSL object. */
static int rl_tls_has_pending(void *ssl) {
    return rl_ossl.SSL_pending((rl_SSL *)ssl) > 0 || rl_ossl.SSL_has_pending((rl_SSL *)ssl);
}

#endif /* RL_TLS_H */
