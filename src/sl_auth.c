/* The job secret, proofs and seals.  SPDX-License-Identifier: MIT */
#include "sl_auth.h"
#include "sl_env.h"
#include "sl_launcher.h"
#include "sl_log.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const sl_auth_labels[] = {
    [SL_AUTH_CLIENT_PROOF] = "stagelink rendezvous client proof",
    [SL_AUTH_ROOT_PROOF]   = "stagelink rendezvous root proof",
    [SL_AUTH_SESSION_KEY]  = "stagelink rendezvous session key",
};

static const char sl_auth_fp_label[] = "stagelink job secret fingerprint";

/* HMAC-SHA256 of `key` over the parts of `head`, then of `body`, through
 * libcrypto's EVP_MAC. */
static sl_status_t sl_auth_hmac(const void *key, size_t key_len,
                                const sl_auth_part_t *head, int nhead,
                                const sl_auth_part_t *body, int nbody,
                                uint8_t out[SL_AUTH_MAC_LEN], sl_errbuf_t *eb)
{
    char         digest[] = "SHA256";
    OSSL_PARAM   params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
        OSSL_PARAM_construct_end()};
    EVP_MAC     *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = (mac != NULL) ? EVP_MAC_CTX_new(mac) : NULL;
    sl_status_t  status = STAGELINK_SUCCESS;
    size_t       got    = 0;
    int          ok, i;

    ok = (ctx != NULL) && EVP_MAC_init(ctx, key, key_len, params);
    for (i = 0; ok && i < nhead; ++i) {
        ok = EVP_MAC_update(ctx, head[i].buf, head[i].len);
    }
    for (i = 0; ok && i < nbody; ++i) {
        ok = EVP_MAC_update(ctx, body[i].buf, body[i].len);
    }
    ok = ok && EVP_MAC_final(ctx, out, &got, SL_AUTH_MAC_LEN) &&
         got == SL_AUTH_MAC_LEN;
    if (!ok) {
        status = sl_error(eb, STAGELINK_ERR_INTERNAL,
                          "libcrypto's HMAC-SHA256 failed (%s); is "
                          "OpenSSL's default provider available?",
                          mac == NULL ? "no HMAC implementation" : "a call "
                          "returned an error");
    }
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return status;
}

sl_status_t sl_auth_set(sl_auth_t *auth, const void *secret, size_t len,
                        const char *source, uint64_t job_key,
                        sl_errbuf_t *eb)
{
    uint8_t        fp[SL_AUTH_MAC_LEN];
    sl_auth_part_t parts[] = {{sl_auth_fp_label, sizeof(sl_auth_fp_label)},
                              {&job_key, sizeof(job_key)}};

    memset(auth, 0, sizeof(*auth));
    if (len == 0 || len > SL_AUTH_SECRET_MAX) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "the job secret from %s is %zu bytes; give 1 to %d "
                        "(32 random bytes, as hex, are plenty)", source, len,
                        SL_AUTH_SECRET_MAX);
    }
    if (len < SL_AUTH_SECRET_SHORT) {
        /* One captured handshake lets a guesser test candidates offline. */
        SL_WARN(SL_SUBSYS_BOOT, "the job secret from %s is only %zu bytes: "
                "a short one can be guessed offline from one handshake; use "
                "32 random bytes (openssl rand -hex 32)", source, len);
    }
    memcpy(auth->secret, secret, len);
    auth->len = len;
    snprintf(auth->source, sizeof(auth->source), "%s", source);
    SL_CHECK(sl_auth_hmac(auth->secret, auth->len, parts, 2, NULL, 0, fp, eb));
    memcpy(auth->fingerprint, fp, SL_AUTH_FP_LEN);
    auth->mode = SL_AUTH_HMAC;
    return STAGELINK_SUCCESS;
}

static sl_status_t sl_auth_read_file(sl_auth_t *auth, const char *path,
                                     uint64_t job_key, sl_errbuf_t *eb)
{
    unsigned char buf[SL_AUTH_SECRET_MAX + 2];
    char          source[160];
    struct stat   st;
    sl_status_t   status;
    ssize_t       n;
    size_t        len = 0;
    int           fd;

    /* O_NONBLOCK: a FIFO (or a device) in its place must not block open;
     * it is refused as not a regular file below. */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "cannot open STAGELINK_JOB_SECRET_FILE=%s: %s", path,
                        strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "cannot stat STAGELINK_JOB_SECRET_FILE=%s: %s",
                          path, strerror(errno));
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "STAGELINK_JOB_SECRET_FILE=%s is not a regular "
                          "file (mode %06o): a FIFO or device could block "
                          "or change under the job; put the secret in a "
                          "file", path, (unsigned)st.st_mode);
        goto out;
    }
    if (st.st_uid != geteuid()) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "STAGELINK_JOB_SECRET_FILE=%s belongs to uid %u, "
                          "not to this process's uid %u: another user could "
                          "have chosen the job secret; use a file of your "
                          "own (chmod 600)", path, (unsigned)st.st_uid,
                          (unsigned)geteuid());
        goto out;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "STAGELINK_JOB_SECRET_FILE=%s has mode %04o: others "
                          "can read or change the job secret; chmod 600 it",
                          path, (unsigned)(st.st_mode & 07777));
        goto out;
    }
    while (len < sizeof(buf) &&
           (n = read(fd, buf + len, sizeof(buf) - len)) != 0) {
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            status = sl_error(eb, STAGELINK_ERR_CONFIG,
                              "cannot read STAGELINK_JOB_SECRET_FILE=%s: %s",
                              path, strerror(errno));
            goto out;
        }
        len += (size_t)n;
    }
    if (len > SL_AUTH_SECRET_MAX + 1) {
        status = sl_error(eb, STAGELINK_ERR_CONFIG,
                          "STAGELINK_JOB_SECRET_FILE=%s holds more than %d "
                          "bytes; a secret of 32 random bytes is plenty",
                          path, SL_AUTH_SECRET_MAX);
        goto out;
    }
    if (len > 0 && buf[len - 1] == '\n') {
        --len;
    }
    if (len > 0 && buf[len - 1] == '\r') {
        --len;
    }
    snprintf(source, sizeof(source), "STAGELINK_JOB_SECRET_FILE=%.120s", path);
    status = sl_auth_set(auth, buf, len, source, job_key, eb);
out:
    OPENSSL_cleanse(buf, sizeof(buf));
    close(fd);
    return status;
}

int sl_auth_configured(void)
{
    return getenv(sl_env_table[SL_ENV_JOB_SECRET].pub.name) != NULL ||
           getenv(sl_env_table[SL_ENV_JOB_SECRET_FILE].pub.name) != NULL;
}

sl_status_t sl_auth_load(sl_auth_t *auth, uint64_t job_key, sl_errbuf_t *eb)
{
    /* getenv, not sl_env_raw: set but empty is a mistake to stop on, not
     * an unauthenticated job. */
    const char *secret = getenv(sl_env_table[SL_ENV_JOB_SECRET].pub.name);
    const char *path   = getenv(sl_env_table[SL_ENV_JOB_SECRET_FILE].pub.name);

    memset(auth, 0, sizeof(*auth));
    if (secret != NULL && path != NULL) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "both STAGELINK_JOB_SECRET and "
                        "STAGELINK_JOB_SECRET_FILE are set; set one");
    }
    if (path != NULL && path[0] == '\0') {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "STAGELINK_JOB_SECRET_FILE is set but empty; name "
                        "the secret's file, or unset it to run the "
                        "rendezvous unauthenticated");
    }
    if (path != NULL) {
        return sl_auth_read_file(auth, path, job_key, eb);
    }
    if (secret != NULL) {
        return sl_auth_set(auth, secret, strlen(secret),
                           "STAGELINK_JOB_SECRET", job_key, eb);
    }
    snprintf(auth->source, sizeof(auth->source), "no STAGELINK_JOB_SECRET "
             "or STAGELINK_JOB_SECRET_FILE");
    return STAGELINK_SUCCESS;
}

void sl_auth_clear(sl_auth_t *auth)
{
    OPENSSL_cleanse(auth, sizeof(*auth));
}

void sl_auth_clear_links(sl_auth_link_t *links, size_t n)
{
    OPENSSL_cleanse(links, n * sizeof(*links));
}

void sl_auth_fingerprint_hex(const uint8_t *fp, char *out)
{
    int i;

    for (i = 0; i < SL_AUTH_FP_LEN; ++i) {
        snprintf(out + 2 * i, 3, "%02x", fp[i]);
    }
}

sl_status_t sl_auth_random(void *buf, size_t len, sl_errbuf_t *eb)
{
    char   *p = buf;
    ssize_t n;

    while (len > 0) {
        n = getrandom(p, len, 0);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return sl_error(eb, STAGELINK_ERR_INTERNAL,
                            "getrandom for a %zu-byte nonce: %s", len,
                            strerror(errno));
        }
        p   += n;
        len -= (size_t)n;
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_auth_compute(const sl_auth_t *auth, sl_auth_label_t label,
                            const sl_auth_bind_t *bind,
                            uint8_t out[SL_AUTH_MAC_LEN], sl_errbuf_t *eb)
{
    sl_auth_part_t parts[] = {
        {sl_auth_labels[label], strlen(sl_auth_labels[label]) + 1},
        {bind, sizeof(*bind)}};

    return sl_auth_hmac(auth->secret, auth->len, parts, 2, NULL, 0, out, eb);
}

int sl_auth_equal(const void *a, const void *b, size_t len)
{
    return CRYPTO_memcmp(a, b, len) == 0;
}

/* The MAC of one message: direction and sequence number, then the parts. */
static sl_status_t sl_auth_seal_mac(const sl_auth_link_t *link,
                                    sl_auth_dir_t dir, uint64_t seq,
                                    const sl_auth_part_t *parts, int nparts,
                                    uint8_t mac[SL_AUTH_MAC_LEN],
                                    sl_errbuf_t *eb)
{
    uint8_t        d      = (uint8_t)dir;
    sl_auth_part_t head[] = {{&d, 1}, {&seq, sizeof(seq)}};

    return sl_auth_hmac(link->key, sizeof(link->key), head, 2, parts, nparts,
                        mac, eb);
}

sl_status_t sl_auth_seal(sl_auth_link_t *link, sl_auth_dir_t dir,
                         const sl_auth_part_t *parts, int nparts,
                         sl_auth_seal_t *seal, sl_errbuf_t *eb)
{
    seal->seq = link->seq[dir];
    SL_CHECK(sl_auth_seal_mac(link, dir, seal->seq, parts, nparts, seal->mac,
                              eb));
    ++link->seq[dir];
    return STAGELINK_SUCCESS;
}

sl_status_t sl_auth_check(sl_auth_link_t *link, sl_auth_dir_t dir,
                          const sl_auth_part_t *parts, int nparts,
                          const sl_auth_seal_t *seal, const char *what,
                          sl_errbuf_t *eb)
{
    uint8_t mac[SL_AUTH_MAC_LEN];

    /* The expected number goes into the MAC: a replayed or reordered
     * message fails the comparison as a forged one does. */
    SL_CHECK(sl_auth_seal_mac(link, dir, link->seq[dir], parts, nparts, mac,
                              eb));
    if (!sl_auth_equal(mac, seal->mac, sizeof(mac))) {
        return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                        "%s fails its seal (message %llu of the connection, "
                        "expected %llu): forged, replayed or altered on the "
                        "way, so init fails; something on the network "
                        "between the ranks injects into or alters their "
                        "connection", what, (unsigned long long)seal->seq,
                        (unsigned long long)link->seq[dir]);
    }
    ++link->seq[dir];
    return STAGELINK_SUCCESS;
}

size_t sl_auth_describe(char *buf, size_t len)
{
    sl_errbuf_t eb = {{0}};
    sl_auth_t   auth;
    char        fp[2 * SL_AUTH_FP_LEN + 1];
    int         n;

    if (sl_auth_load(&auth, sl_launcher_job_key(), &eb) != STAGELINK_SUCCESS) {
        n = snprintf(buf, len, "rendezvous: refused at init: %s\n", eb.msg);
    } else if (auth.mode == SL_AUTH_HMAC) {
        sl_auth_fingerprint_hex(auth.fingerprint, fp);
        n = snprintf(buf, len, "rendezvous: authenticated (mutual HMAC-SHA256 "
                     "proof, sealed messages; secret from %s, fingerprint "
                     "%s for job key %016llx)\n", auth.source, fp,
                     (unsigned long long)sl_launcher_job_key());
    } else {
        n = snprintf(buf, len, "rendezvous: unauthenticated (%s): any process "
                     "that reaches the port with the job key can join\n",
                     auth.source);
    }
    sl_auth_clear(&auth);
    return (n < 0) ? 0 : (size_t)n;
}
