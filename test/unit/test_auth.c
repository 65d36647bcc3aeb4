/*
 * The job secret and its uses, without a network: where the secret comes
 * from (the variable, a file no one else may read, never both), its
 * fingerprint and proofs against HMAC-SHA256 computed independently (Python's
 * hmac module), and the seal of a bootstrap message: the next one each way
 * passes; replayed, reordered, altered, turned around or under another
 * key, it fails.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "sl_auth.h"
#include "sl_bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SECRET "job-secret-A-0123456789abcdef"

/* python3: hmac.new(SECRET, b"stagelink job secret fingerprint\0" +
 * (7).to_bytes(8, "little"), sha256).hexdigest()[:16] (job key 7), and the
 * client proof over nonces 0..31 and 32..63, rank 5, world 8, job key 7
 * (little-endian). */
#define FP_HEX "a88ff210bee35ea6"
#define PROOF_HEX \
    "4997ceb2bd4aac0f4836f7a247f242d5b35ea80d2fcf758bb6ba600607ea5222"

static void hex(const uint8_t *p, size_t n, char *out)
{
    size_t i;

    for (i = 0; i < n; ++i) {
        snprintf(out + 2 * i, 3, "%02x", p[i]);
    }
}

static int write_file(const char *path, const char *text, mode_t mode)
{
    FILE *f = fopen(path, "w");

    if (f == NULL) {
        return -1;
    }
    fputs(text, f);
    fclose(f);
    return chmod(path, mode);
}

static void test_sources(void)
{
    char        path[64], fp[2 * SL_AUTH_FP_LEN + 1];
    sl_errbuf_t eb = {{0}};
    sl_auth_t   a;

    unsetenv("STAGELINK_JOB_SECRET");
    unsetenv("STAGELINK_JOB_SECRET_FILE");
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_SUCCESS && a.mode == SL_AUTH_NONE,
          "no secret: mode %d (%s)", a.mode, eb.msg);

    setenv("STAGELINK_JOB_SECRET", SECRET, 1);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_SUCCESS && a.mode == SL_AUTH_HMAC,
          "the variable: %s", eb.msg);
    sl_auth_fingerprint_hex(a.fingerprint, fp);
    CHECK(strcmp(fp, FP_HEX) == 0, "fingerprint %s, HMAC-SHA256 gives %s", fp,
          FP_HEX);

    setenv("STAGELINK_JOB_SECRET", SECRET, 1);
    CHECK(sl_auth_load(&a, 8, &eb) == STAGELINK_SUCCESS &&
              (sl_auth_fingerprint_hex(a.fingerprint, fp), strcmp(fp, FP_HEX) != 0),
          "another job key's fingerprint is the same: %s", fp);

    setenv("STAGELINK_JOB_SECRET", "", 1);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "0 bytes"),
          "an empty secret: %s", eb.msg);
    unsetenv("STAGELINK_JOB_SECRET");
    setenv("STAGELINK_JOB_SECRET_FILE", "", 1);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "set but empty") && sl_auth_configured(),
          "an empty file name: %s", eb.msg);
    unsetenv("STAGELINK_JOB_SECRET_FILE");
    CHECK(!sl_auth_configured(), "nothing set, yet configured");

    snprintf(path, sizeof(path), "/tmp/sl-secret-%d", (int)getpid());
    CHECK(write_file(path, SECRET "\n", 0600) == 0, "cannot write %s", path);
    setenv("STAGELINK_JOB_SECRET_FILE", path, 1);
    setenv("STAGELINK_JOB_SECRET", SECRET, 1);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "set one"),
          "both set: %s", eb.msg);
    unsetenv("STAGELINK_JOB_SECRET");
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_SUCCESS && a.mode == SL_AUTH_HMAC,
          "a 0600 file: %s", eb.msg);
    sl_auth_fingerprint_hex(a.fingerprint, fp);
    CHECK(strcmp(fp, FP_HEX) == 0 && strstr(a.source, path),
          "the file's trailing newline is not the secret's: %s from %s", fp,
          a.source);
    CHECK(chmod(path, 0640) == 0, "chmod");
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "0640") && strstr(eb.msg, "chmod 600"),
          "a group-readable file: %s", eb.msg);
    unlink(path);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, path),
          "a missing file: %s", eb.msg);
    setenv("STAGELINK_JOB_SECRET_FILE", "/tmp", 1);
    CHECK(sl_auth_load(&a, 7, &eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "regular file"),
          "a directory: %s", eb.msg);
    unsetenv("STAGELINK_JOB_SECRET_FILE");
    sl_auth_clear(&a);
    CHECK(a.len == 0 && a.secret[0] == 0, "clear left the secret");
}

static void test_proofs(void)
{
    sl_auth_bind_t b = {.rank = 5, .world_size = 8, .job_key = 7};
    uint8_t        mac[SL_AUTH_MAC_LEN], root[SL_AUTH_MAC_LEN];
    char           text[2 * SL_AUTH_MAC_LEN + 1];
    sl_auth_t      a;
    int            i;

    for (i = 0; i < SL_AUTH_NONCE_LEN; ++i) {
        b.client_nonce[i] = (uint8_t)i;
        b.root_nonce[i]   = (uint8_t)(32 + i);
    }
    CHECK(sizeof(b) == 80, "the binding has padding: %zu bytes", sizeof(b));
    sl_auth_set(&a, SECRET, strlen(SECRET), "test", 7, NULL);
    CHECK(sl_auth_compute(&a, SL_AUTH_CLIENT_PROOF, &b, mac, NULL) ==
          STAGELINK_SUCCESS, "compute");
    hex(mac, sizeof(mac), text);
    CHECK(strcmp(text, PROOF_HEX) == 0, "client proof %s, expected %s", text,
          PROOF_HEX);
    sl_auth_compute(&a, SL_AUTH_ROOT_PROOF, &b, root, NULL);
    CHECK(!sl_auth_equal(mac, root, sizeof(mac)),
          "the two directions' proofs are the same");
    b.root_nonce[0] ^= 1;
    sl_auth_compute(&a, SL_AUTH_CLIENT_PROOF, &b, root, NULL);
    CHECK(!sl_auth_equal(mac, root, sizeof(mac)), "a nonce does not count");
}

static void test_seals(void)
{
    sl_auth_link_t tx = {.sealed = 1}, rx = {.sealed = 1}, other = {.sealed = 1};
    sl_auth_seal_t s1, s2;
    char           msg[] = "rank 3's worker address";
    sl_auth_part_t part  = {msg, sizeof(msg)};
    sl_errbuf_t    eb    = {{0}};

    memset(tx.key, 0x42, sizeof(tx.key));
    rx = tx;
    memset(other.key, 0x43, sizeof(other.key));
    sl_auth_seal(&tx, SL_AUTH_TO_ROOT, &part, 1, &s1, NULL);
    sl_auth_seal(&tx, SL_AUTH_TO_ROOT, &part, 1, &s2, NULL);
    CHECK(s1.seq == 0 && s2.seq == 1, "sequence numbers %llu %llu",
          (unsigned long long)s1.seq, (unsigned long long)s2.seq);
    CHECK(sl_auth_check(&other, SL_AUTH_TO_ROOT, &part, 1, &s1, "m", &eb) ==
          STAGELINK_ERR_BOOTSTRAP, "another key's link accepted the seal");
    CHECK(sl_auth_check(&rx, SL_AUTH_FROM_ROOT, &part, 1, &s1, "m", &eb) ==
          STAGELINK_ERR_BOOTSTRAP, "a seal turned around was accepted");
    CHECK(sl_auth_check(&rx, SL_AUTH_TO_ROOT, &part, 1, &s2, "m", &eb) ==
          STAGELINK_ERR_BOOTSTRAP, "the second message was accepted first");
    CHECK(sl_auth_check(&rx, SL_AUTH_TO_ROOT, &part, 1, &s1, "m", &eb) ==
          STAGELINK_SUCCESS, "the first message: %s", eb.msg);
    CHECK(sl_auth_check(&rx, SL_AUTH_TO_ROOT, &part, 1, &s1, "m", &eb) ==
              STAGELINK_ERR_BOOTSTRAP && strstr(eb.msg, "replayed"),
          "a replay was accepted: %s", eb.msg);
    msg[0] ^= 1;
    CHECK(sl_auth_check(&rx, SL_AUTH_TO_ROOT, &part, 1, &s2, "m", &eb) ==
          STAGELINK_ERR_BOOTSTRAP, "an altered message was accepted");
    msg[0] ^= 1;
    CHECK(sl_auth_check(&rx, SL_AUTH_TO_ROOT, &part, 1, &s2, "m", &eb) ==
          STAGELINK_SUCCESS, "the second message, unaltered: %s", eb.msg);
}

/* A sealed exchange message at rank 0: as sent it decodes; the same bytes
 * again (a replay mid-session) do not. */
static void test_sealed_part(void)
{
    struct {
        sl_boot_req_t req;
        uint32_t      peers[2];
        char          blob[4];
    } body = {{"addr", 2, 4}, {0, 2}, "abc"};
    sl_bootstrap_t bs   = {.rank = 0, .world_size = 3, .job_key = 7};
    sl_boot_hdr_t  hdr  = {SL_BOOT_MAGIC, SL_BOOT_VERSION, 1, 3, 7,
                           sizeof(body)};
    sl_auth_part_t parts[] = {{&hdr, sizeof(hdr)}, {&body, sizeof(body)}};
    sl_auth_link_t tx = {.sealed = 1}, rx;
    sl_auth_seal_t seal;
    sl_boot_part_t part;
    sl_errbuf_t    eb = {{0}};

    memset(tx.key, 7, sizeof(tx.key));
    rx = tx;
    sl_auth_seal(&tx, SL_AUTH_TO_ROOT, parts, 2, &seal, NULL);
    CHECK(sl_bootstrap_parse_part(&bs, 1, "addr", &hdr, &body, &seal, &rx,
                                  &part, &eb) == STAGELINK_SUCCESS &&
              part.npeers == 2 && part.peers[1] == 2 &&
              strcmp(part.blob.data, "abc") == 0,
          "a sealed part: %s", eb.msg);
    CHECK(sl_bootstrap_parse_part(&bs, 1, "addr", &hdr, &body, &seal, &rx,
                                  &part, &eb) == STAGELINK_ERR_BOOTSTRAP,
          "the same part replayed was accepted");
}

int main(void)
{
    test_sources();
    test_proofs();
    test_seals();
    test_sealed_part();
    return check_summary();
}
