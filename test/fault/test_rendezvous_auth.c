/*
 * The authenticated rendezvous against an attacker on the same network:
 * real ranks share a job secret; an intruder that knows the job key and
 * the secret's fingerprint (both read off the wire) forges a hello, replays
 * one captured from an earlier run, answers another nonce than rank 0's,
 * or floods rank 0 with handshakes it never finishes.  Each time the job
 * completes, the intruder gets nothing after the challenge, and rank 0
 * logs the intruder's address.  Ranks whose secrets differ, or of which
 * only some have one, are refused with a sentence naming both
 * fingerprints and never a secret.  An exchange message altered on the way
 * fails its seal; a listener posing as rank 0 gets the hello alone.
 * SPDX-License-Identifier: MIT
 */
#include "rendezvous_job.h"

#define SECRET "job-secret-A-0123456789abcdef"
#define OTHER  "job-secret-B-fedcba9876543210"
#define KEY    7

static sl_auth_t job_auth, other_auth;
static char      fp_job[2 * SL_AUTH_FP_LEN + 1], fp_other[sizeof(fp_job)];
static char      log_path[64];
static char      intruder[64]; /* the intruder's address, as rank 0 logs it */
static size_t    intruder_got; /* bytes it received after the challenge */
static int       intruder_closed;

/* Up to len bytes; stops at EOF or a reset (*closed = 1) or when `ms`
 * pass without data (*closed = 0). */
static int read_some(int fd, void *buf, size_t len, int ms, int *closed)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    size_t        got = 0;
    ssize_t       n;

    *closed = 0;
    while (got < len && poll(&p, 1, ms) == 1) {
        n = read(fd, (char *)buf + got, len - got);
        if (n == 0 || (n < 0 && errno == ECONNRESET)) {
            *closed = 1;
            break;
        }
        if (n < 0) {
            break;
        }
        got += (size_t)n;
    }
    return (int)got;
}

static int read_all(int fd, void *buf, size_t len, int ms)
{
    int closed;

    return read_some(fd, buf, len, ms, &closed);
}

/* After its last message: what the intruder receives until rank 0 closes
 * the connection (it must, and send nothing). */
static void intruder_listen(int fd)
{
    char buf[256];
    int  n, closed = 0;

    intruder_got = 0;
    while (!closed &&
           (n = read_some(fd, buf, sizeof(buf), (int)(TIMEOUT_S * 1e3),
                          &closed)) >= 0) {
        intruder_got += (size_t)n;
        if (n == 0 && !closed) {
            break; /* silent, yet open: a timeout */
        }
    }
    intruder_closed = closed;
    close(fd);
}

static void note_address(int fd)
{
    struct sockaddr_in a;
    socklen_t          len = sizeof(a);
    char               host[INET_ADDRSTRLEN];

    getsockname(fd, (struct sockaddr *)&a, &len);
    inet_ntop(AF_INET, &a.sin_addr, host, sizeof(host));
    snprintf(intruder, sizeof(intruder), "%s:%d", host, ntohs(a.sin_port));
}

/* Connects and sends a hello as `rank` of a world of `world` with the
 * job's fingerprint; reads the challenge.  Returns the socket or -1. */
static int intruder_hello(uint32_t rank, uint32_t world,
                          sl_boot_hello_t *hello, sl_boot_challenge_t *ch)
{
    int fd = connect_local();

    CHECK(fd >= 0, "the intruder cannot connect to port %d", port);
    if (fd < 0) {
        return -1;
    }
    note_address(fd);
    memset(hello, 0, sizeof(*hello));
    hello->mode = SL_AUTH_HMAC;
    memcpy(hello->fingerprint, job_auth.fingerprint, SL_AUTH_FP_LEN);
    CHECK(sl_auth_random(hello->nonce, SL_AUTH_NONCE_LEN, NULL) ==
          STAGELINK_SUCCESS, "getrandom");
    send_hello(fd, rank, world, KEY, sizeof(*hello), hello);
    CHECK(read_all(fd, ch, sizeof(*ch), (int)(TIMEOUT_S * 1e3)) ==
              (int)sizeof(*ch) && ch->verdict == SL_BOOT_ADMIT,
          "the intruder's hello was not challenged (verdict %u)", ch->verdict);
    return fd;
}

static sl_auth_bind_t bind_of(uint32_t rank, uint32_t world,
                              const sl_boot_hello_t *hello,
                              const sl_boot_challenge_t *ch)
{
    sl_auth_bind_t b = {.rank = rank, .world_size = world, .job_key = KEY};

    memcpy(b.client_nonce, hello->nonce, SL_AUTH_NONCE_LEN);
    memcpy(b.root_nonce, ch->nonce, SL_AUTH_NONCE_LEN);
    return b;
}

/* Right key and fingerprint, a made-up proof. */
static void forged(void)
{
    sl_boot_challenge_t ch;
    sl_boot_hello_t     hello;
    sl_boot_proof_t     proof;
    int                 fd = intruder_hello(1, 3, &hello, &ch);

    if (fd < 0) {
        return;
    }
    CHECK(sl_auth_random(&proof, sizeof(proof), NULL) == STAGELINK_SUCCESS,
          "getrandom");
    (void)!write(fd, &proof, sizeof(proof));
    intruder_listen(fd);
}

/* The hello, proof and first exchange a real rank 1 sent in an earlier
 * run, byte for byte. */
static void replayed(void)
{
    sl_boot_challenge_t ch;
    size_t              hello_len = sizeof(sl_boot_hdr_t) +
                                    sizeof(sl_boot_hello_t);
    int                 fd = connect_local();

    CHECK(fd >= 0, "the intruder cannot connect to port %d", port);
    if (fd < 0) {
        return;
    }
    note_address(fd);
    (void)!write(fd, res->capture, hello_len);
    CHECK(read_all(fd, &ch, sizeof(ch), (int)(TIMEOUT_S * 1e3)) ==
              (int)sizeof(ch) && ch.verdict == SL_BOOT_ADMIT,
          "the replayed hello was not challenged");
    (void)!write(fd, res->capture + hello_len, res->captured - hello_len);
    intruder_listen(fd);
}

/* Holds the secret, proves over its own nonce twice instead of rank 0's. */
static void other_nonce(void)
{
    sl_boot_challenge_t ch;
    sl_boot_hello_t     hello;
    sl_boot_proof_t     proof;
    sl_auth_bind_t      b;
    uint8_t             want[SL_AUTH_MAC_LEN];
    int                 fd = intruder_hello(1, 3, &hello, &ch);

    if (fd < 0) {
        return;
    }
    /* The test computes proofs as rank 0 does: its own proof checks out. */
    b = bind_of(1, 3, &hello, &ch);
    sl_auth_compute(&job_auth, SL_AUTH_ROOT_PROOF, &b, want, NULL);
    CHECK(memcmp(want, ch.proof, sizeof(want)) == 0,
          "the test's root proof differs from rank 0's");
    memcpy(b.root_nonce, hello.nonce, SL_AUTH_NONCE_LEN);
    sl_auth_compute(&job_auth, SL_AUTH_CLIENT_PROOF, &b, proof.proof, NULL);
    (void)!write(fd, &proof, sizeof(proof));
    intruder_listen(fd);
}

/* The same client answering rank 0's nonce is admitted as rank 2 (then
 * leaves): what the other-nonce case changes is the nonce alone. */
static void right_nonce(void)
{
    sl_boot_challenge_t ch;
    sl_boot_hello_t     hello;
    sl_boot_proof_t     proof;
    sl_boot_welcome_t   w;
    sl_auth_link_t      link = {.sealed = 1};
    sl_auth_part_t      part = {&w, offsetof(sl_boot_welcome_t, seal)};
    sl_auth_bind_t      b;
    int                 fd = intruder_hello(2, 3, &hello, &ch);

    if (fd < 0) {
        return;
    }
    b = bind_of(2, 3, &hello, &ch);
    sl_auth_compute(&job_auth, SL_AUTH_CLIENT_PROOF, &b, proof.proof, NULL);
    (void)!write(fd, &proof, sizeof(proof));
    CHECK(read_all(fd, &w, sizeof(w), (int)(TIMEOUT_S * 1e3)) == (int)sizeof(w),
          "the right proof got no welcome");
    sl_auth_compute(&job_auth, SL_AUTH_SESSION_KEY, &b, link.key, NULL);
    CHECK(sl_auth_check(&link, SL_AUTH_FROM_ROOT, &part, 1, &w.seal, "welcome",
                        NULL) == STAGELINK_SUCCESS && w.rank == 2,
          "the welcome's seal is not the session key's");
    close(fd);
}

/* A listener posing as rank 0 on the job's port: it answers a real rank's
 * hello with a challenge whose proof it made up, and records what the rank
 * sent (the hello alone, or it gave something away). */
static size_t fake_root_got;

static void fake_root(int lfd)
{
    sl_boot_challenge_t ch = {.magic = SL_BOOT_MAGIC, .verdict = SL_BOOT_ADMIT,
                              .mode = SL_AUTH_HMAC,
                              .version = SL_BOOT_VERSION};
    struct pollfd       p  = {.fd = lfd, .events = POLLIN};
    char                buf[512];
    int                 fd, n, closed;

    fake_root_got = 0;
    if (poll(&p, 1, (int)(TIMEOUT_S * 1e3)) != 1 ||
        (fd = accept(lfd, NULL, NULL)) < 0) {
        return;
    }
    n = read_all(fd, buf, sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t),
                 (int)(TIMEOUT_S * 1e3));
    sl_auth_random(ch.nonce, sizeof(ch.nonce), NULL);
    sl_auth_random(ch.proof, sizeof(ch.proof), NULL);
    (void)!write(fd, &ch, sizeof(ch));
    fake_root_got = (size_t)n;
    while ((n = read_some(fd, buf, sizeof(buf), (int)(TIMEOUT_S * 1e3),
                          &closed)) > 0) {
        fake_root_got += (size_t)n;
    }
    close(fd);
}

static pid_t flooder = -1;
static int   flood_stop[2];

/* Handshakes never finished: 96 hellos left at the challenge and 32
 * silent connections, held until the job is over (at most 10 s). */
static void flood(void)
{
    static int      fds[128];
    sl_boot_hello_t hello;
    int             i, n = 0, challenged = 0, ready[2];
    char            c;

    /* The job's other ranks start only once rank 0 challenged the flood
     * (or the flooder gave up): else they could meet and end first. */
    if (pipe(ready) != 0 || pipe(flood_stop) != 0 ||
        (flooder = fork()) != 0) {
        if (flooder > 0) {
            close(ready[1]);
            (void)!read(ready[0], &c, 1);
            close(ready[0]);
        }
        return;
    }
    alarm(10);
    close(flood_stop[1]);
    close(ready[0]);
    memset(&hello, 0, sizeof(hello));
    hello.mode = SL_AUTH_HMAC;
    memcpy(hello.fingerprint, job_auth.fingerprint, SL_AUTH_FP_LEN);
    for (i = 0; i < 128; ++i) {
        if ((fds[n] = connect_local()) < 0) {
            continue;
        }
        if (i % 4 != 3) {
            send_hello(fds[n], 1 + (uint32_t)i % 3, 4, KEY, sizeof(hello),
                       &hello);
        }
        ++n;
    }
    for (i = 0; i < n && challenged == 0; ++i) {
        sl_boot_challenge_t ch;

        if (i % 4 != 3) {
            challenged += read_all(fds[i], &ch, sizeof(ch), 200) ==
                          (int)sizeof(ch);
        }
    }
    close(ready[1]);
    (void)!read(flood_stop[0], &c, 1);
    _exit(challenged > 0 ? 0 : 1);
}

static int log_has(const char *what)
{
    static char buf[65536];
    FILE       *f = fopen(log_path, "r");
    size_t      n = (f != NULL) ? fread(buf, 1, sizeof(buf) - 1, f) : 0;

    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    return strstr(buf, what) != NULL;
}

static void expect_refused_intruder(const char *what, double took)
{
    char line[160];
    int  i;

    for (i = 0; i < 3; ++i) {
        CHECK(res->status[i] == STAGELINK_SUCCESS, "%s: rank %d failed: %s",
              what, i, res->msg[i]);
    }
    CHECK(took < TIMEOUT_S + 1, "%s: the job took %.2f s", what, took);
    CHECK(intruder_closed && intruder_got == 0,
          "%s: the intruder received %zu bytes after the challenge%s", what,
          intruder_got, intruder_closed ? "" : " and was never closed");
    snprintf(line, sizeof(line), "dropped rendezvous client %s: rank 1 "
             "answered the challenge with a wrong proof", intruder);
    CHECK(log_has(line), "%s: rank 0's log lacks \"%s\"", what, line);
}

static int names_no_secret(const char *msg)
{
    return strstr(msg, SECRET) == NULL && strstr(msg, OTHER) == NULL;
}

int main(void)
{
    rank_spec_t job[4] = {{0, 3, KEY, SECRET, 0, NULL, 0},
                          {1, 3, KEY, SECRET, 0, NULL, 0},
                          {2, 3, KEY, SECRET, 0, NULL, 0},
                          {3, 4, KEY, SECRET, 0, NULL, 0}};
    rank_spec_t spec[4];
    double      took;
    int         i, wst;

    setenv("STAGELINK_DEBUG", "WARN", 1);
    if (job_setup() != 0 ||
        sl_auth_set(&job_auth, SECRET, strlen(SECRET), "test", KEY, NULL) != 0 ||
        sl_auth_set(&other_auth, OTHER, strlen(OTHER), "test", KEY, NULL) != 0) {
        return 2;
    }
    sl_auth_fingerprint_hex(job_auth.fingerprint, fp_job);
    sl_auth_fingerprint_hex(other_auth.fingerprint, fp_other);
    snprintf(log_path, sizeof(log_path), "/tmp/sl-auth-%d.log", (int)getpid());
    job[0].log = log_path;

    /* A forged hello: right key and fingerprint, a made-up proof. */
    took = run_job(job, 3, forged);
    expect_refused_intruder("forged", took);

    /* A replay: rank 1's bytes of an earlier run of the same job. */
    memcpy(spec, job, sizeof(spec));
    spec[1].world = spec[0].world = 2;
    spec[1].capture = 1;
    res->captured   = 0;
    took = run_job(spec, 2, NULL);
    CHECK(res->status[0] == 0 && res->status[1] == 0 &&
              res->captured > sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t) +
                                  sizeof(sl_boot_proof_t),
          "the earlier run failed or captured %zu bytes: %s", res->captured,
          res->msg[1]);
    spec[1].capture = 0;
    took = run_job(spec, 2, replayed);
    spec[2] = job[2]; /* expect_refused_intruder looks at three ranks */
    res->status[2] = STAGELINK_SUCCESS;
    expect_refused_intruder("replayed", took);

    /* The secret, but proving over another nonce than rank 0's. */
    took = run_job(job, 3, other_nonce);
    expect_refused_intruder("other nonce", took);

    /* The same client with rank 0's nonce joins as rank 2 and leaves: the
     * others fail on its departure, not on a missing rank. */
    took = run_job(job, 2, right_nonce);
    CHECK(res->status[0] != STAGELINK_SUCCESS &&
              strstr(res->msg[0], "closed the connection") != NULL,
          "right nonce: rank 0 did not count rank 2 in: %s", res->msg[0]);

    /* A tampered exchange: rank 1's first request altered on the way
     * fails its seal at rank 0, and init fails on both. */
    memcpy(spec, job, sizeof(spec));
    spec[0].world = spec[1].world = 2;
    spec[1].capture = 2;
    took = run_job(spec, 2, NULL);
    CHECK(res->status[0] != STAGELINK_SUCCESS &&
              strstr(res->msg[0], "rank 1's part of bootstrap exchange") &&
              strstr(res->msg[0], "fails its seal"),
          "tampered: rank 0 said: %s", res->msg[0]);
    CHECK(res->status[1] != STAGELINK_SUCCESS, "tampered: rank 1 succeeded");
    CHECK(took < 2 * TIMEOUT_S + 1, "tampered: %.2f s", took);

    /* A listener posing as rank 0: the real rank refuses its made-up proof
     * and has sent it the hello alone. */
    {
        pid_t pid;
        int   lfd, wst;

        lfd = hold_port(&port);
        CHECK(lfd >= 0 && listen(lfd, 4) == 0, "no fake rank 0 listener");
        if ((pid = fork()) == 0) {
            run_rank(1, job[1]);
        }
        fake_root(lfd);
        waitpid(pid, &wst, 0);
        close(lfd);
        CHECK(res->status[1] != STAGELINK_SUCCESS &&
                  strstr(res->msg[1], "did not prove it holds the job secret"),
              "fake rank 0: rank 1 said: %s", res->msg[1]);
        CHECK(fake_root_got == sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t),
              "fake rank 0 got %zu bytes, the hello is %zu", fake_root_got,
              sizeof(sl_boot_hdr_t) + sizeof(sl_boot_hello_t));
    }

    /* Secrets that differ: both sides say so with both fingerprints. */
    memcpy(spec, job, sizeof(spec));
    spec[2].secret = OTHER;
    took = run_job(spec, 3, NULL);
    CHECK(res->status[2] != STAGELINK_SUCCESS && strstr(res->msg[2], fp_job) &&
              strstr(res->msg[2], fp_other) && names_no_secret(res->msg[2]),
          "mismatch: rank 2 said: %s", res->msg[2]);
    CHECK(res->status[0] != STAGELINK_SUCCESS &&
              strstr(res->msg[0], "missing: 2") && strstr(res->msg[0], fp_job) &&
              strstr(res->msg[0], fp_other) && names_no_secret(res->msg[0]),
          "mismatch: rank 0 said: %s", res->msg[0]);
    CHECK(took < 2 * TIMEOUT_S + 1, "mismatch: %.2f s", took);

    /* A secret on some ranks only, either way round. */
    for (i = 0; i < 2; ++i) {
        memcpy(spec, job, sizeof(spec));
        spec[i == 0 ? 2 : 0].secret = NULL;
        took = run_job(spec, 3, NULL);
        CHECK(res->status[2] != STAGELINK_SUCCESS &&
                  strstr(res->msg[2], i == 0 ? "rank 0 requires a job secret"
                                             : "rank 0 runs without one"),
              "mode %d: rank 2 said: %s", i, res->msg[2]);
        CHECK(took < 2 * TIMEOUT_S + 1, "mode %d: %.2f s", i, took);
    }

    /* A flood of handshakes left at the challenge while the job meets. */
    for (i = 0; i < 4; ++i) {
        spec[i] = job[i];
        spec[i].world = 4;
    }
    took = run_job(spec, 4, flood);
    if (flooder > 0) {
        close(flood_stop[1]);
        CHECK(waitpid(flooder, &wst, 0) == flooder && WIFEXITED(wst) &&
                  WEXITSTATUS(wst) == 0,
              "the flood got no challenge (status %#x): it tested nothing",
              wst);
        close(flood_stop[0]);
    }
    for (i = 0; i < 4; ++i) {
        CHECK(res->status[i] == STAGELINK_SUCCESS, "flood: rank %d failed: %s",
              i, res->msg[i]);
    }
    CHECK(took < TIMEOUT_S + 1, "flood: the job took %.2f s", took);
    if (getenv("KEEP_LOG") == NULL) {
        unlink(log_path);
    }
    return check_summary();
}
