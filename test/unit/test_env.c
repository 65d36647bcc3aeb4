/*
 * Environment parsing, the host's config, launcher detection (torchrun,
 * mpirun, srun) and the Megatron rank layout with the peers it names.  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "sl_env.h"
#include "sl_launcher.h"
#include "sl_layout.h"
#include "sl_log.h"
#include "sl_settings.h"
#include "sl_topo.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static void clear_launchers(void)
{
    int id;

    for (id = 0; id < SL_ENV_COUNT; ++id) {
        unsetenv(sl_env_table[id].pub.name);
    }
}

static void test_table(void)
{
    int id;

    for (id = 0; id < SL_ENV_COUNT; ++id) {
        CHECK(sl_env_table[id].pub.name != NULL && sl_env_table[id].pub.description &&
              sl_env_table[id].pub.default_value,
              "env table entry %d is incomplete", id);
    }
}

/* Every type of the one parser: the forms users write, and refusals that
 * name the variable. */
static void test_parsers(void)
{
    static const struct {
        sl_env_id_t id;
        const char *text;
        int         ok;
        uint64_t    u64;   /* int, size; bool: flag; enum: choice */
        double      real;  /* seconds, number */
    } cases[] = {
        {SL_ENV_CHUNK, "1M", 1, 1u << 20, 0},
        {SL_ENV_CHUNK, "1MiB", 1, 1u << 20, 0},
        {SL_ENV_CHUNK, "1mb", 1, 1u << 20, 0},
        {SL_ENV_CHUNK, "1024K", 1, 1u << 20, 0},
        {SL_ENV_CHUNK, "64k", 1, 64u << 10, 0},
        {SL_ENV_CHUNK, "1G", 1, 1u << 30, 0},
        {SL_ENV_CHUNK, "1048576", 1, 1u << 20, 0},
        {SL_ENV_CHUNK, "4096B", 1, 4096, 0},
        {SL_ENV_CHUNK, "2G", 0, 0, 0},
        {SL_ENV_CHUNK, "1K", 0, 0, 0},
        {SL_ENV_CHUNK, "1Q", 0, 0, 0},
        {SL_ENV_CHUNK, "1.5M", 0, 0, 0},
        {SL_ENV_CHUNK, "-1M", 0, 0, 0},
        {SL_ENV_CHUNK, "M", 0, 0, 0},
        {SL_ENV_CHUNK, "99999999999999999999", 0, 0, 0},
        {SL_ENV_CHUNK, "17179869184T", 0, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "yes", 1, 1, 0},
        {SL_ENV_PROGRESS_THREAD, "ON", 1, 1, 0},
        {SL_ENV_PROGRESS_THREAD, "True", 1, 1, 0},
        {SL_ENV_PROGRESS_THREAD, "1", 1, 1, 0},
        {SL_ENV_PROGRESS_THREAD, "off", 1, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "No", 1, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "FALSE", 1, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "0", 1, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "2", 0, 0, 0},
        {SL_ENV_PROGRESS_THREAD, "enabled", 0, 0, 0},
        {SL_ENV_CHECK, "on", 1, 1, 0},
        {SL_ENV_CHECK, "2", 0, 0, 0},
        {SL_ENV_MAX_REQUESTS, "64", 1, 64, 0},
        {SL_ENV_MAX_REQUESTS, "12x", 0, 0, 0},
        {SL_ENV_MAX_REQUESTS, "-3", 0, 0, 0},
        {SL_ENV_MAX_REQUESTS, "0", 0, 0, 0},
        {SL_ENV_MAX_REQUESTS, "auto", 0, 0, 0},
        {SL_ENV_STAGING_BUFFERS, "65", 0, 0, 0},
        {SL_ENV_TIMEOUT, "2.5", 1, 0, 2.5},
        {SL_ENV_TIMEOUT, "2.5s", 1, 0, 2.5},
        {SL_ENV_TIMEOUT, "500ms", 1, 0, 0.5},
        {SL_ENV_TIMEOUT, "1m", 1, 0, 60.0},
        {SL_ENV_TIMEOUT, "0", 1, 0, 0.0},
        {SL_ENV_TIMEOUT, "soon", 0, 0, 0},
        {SL_ENV_TIMEOUT, "-1", 0, 0, 0},
        {SL_ENV_TIMEOUT, "inf", 0, 0, 0},
        {SL_ENV_TIMEOUT, "nan", 0, 0, 0},
        {SL_ENV_TIMEOUT, "5 s", 0, 0, 0},
        {SL_ENV_NIC_MIN_GBPS, "100", 1, 0, 100.0},
        {SL_ENV_NIC_MIN_GBPS, "fast", 0, 0, 0},
        {SL_ENV_MODE, "FULL", 1, 1, 0},
        {SL_ENV_MODE, "fastest", 0, 0, 0},
        {SL_ENV_DEBUG, "info", 1, SL_LOG_INFO, 0},
        {SL_ENV_DEBUG, "1", 0, 0, 0},
        {SL_ENV_DEBUG, "verbose", 0, 0, 0},
        {SL_ENV_DEBUG_SUBSYS, "init,NET", 1, 0x5, 0},
        {SL_ENV_DEBUG_SUBSYS, "NETWORK", 0, 0, 0},
        {SL_ENV_DEBUG_SUBSYS, "INIT,", 0, 0, 0},
        {SL_ENV_IB_HCA, "mlx5_0:1,mlx5_1", 1, 0, 0},
        {SL_ENV_IB_HCA, "^=mlx5_8", 1, 0, 0},
        {SL_ENV_IB_HCA, "^", 0, 0, 0},
        {SL_ENV_IB_HCA, "=", 0, 0, 0},
        {SL_ENV_IB_HCA, "mlx5_0:", 0, 0, 0},
        {SL_ENV_IB_HCA, "mlx5_0:x", 0, 0, 0},
        {SL_ENV_IB_HCA, "mlx5_0,,mlx5_1", 0, 0, 0},
        {SL_ENV_PLUGIN_PATH, "/tmp:/", 1, 0, 0},
        {SL_ENV_PLUGIN_PATH, "/no/such/dir", 0, 0, 0},
        {SL_ENV_PLUGIN_PATH, "/etc/passwd", 0, 0, 0},
        {SL_ENV_PLUGIN_PATH, "/tmp::/:", 1, 0, 0},
        {SL_ENV_TIMEOUT, "1e308h", 0, 0, 0},
        {SL_ENV_TIMEOUT, "366000000", 0, 0, 0},
        {SL_ENV_NIC_MIN_GBPS, "0x10", 0, 0, 0},
        {SL_ENV_NIC_MIN_GBPS, " 5", 0, 0, 0},
        {SL_ENV_NIC_MIN_GBPS, "1e2", 1, 0, 100.0},
        {SL_ENV_MASTER_PORT, "65536", 0, 0, 0},
    };
    sl_env_value_t v;
    sl_errbuf_t    eb;
    size_t         i;

    for (i = 0; i < SL_ARRAY_SIZE(cases); ++i) {
        sl_env_id_t           id = cases[i].id;
        const sl_env_entry_t *e  = &sl_env_table[id];
        sl_status_t st = sl_env_parse_text(id, cases[i].text, &v, &eb);
        uint64_t    got;

        if (!cases[i].ok) {
            CHECK(st == STAGELINK_ERR_CONFIG && strstr(eb.msg, e->pub.name) &&
                      strstr(eb.msg, "use "),
                  "%s=%s: status %d, %s", e->pub.name, cases[i].text, st,
                  st ? eb.msg : "accepted");
            continue;
        }
        got = (e->type == SL_ENV_T_BOOL)   ? (uint64_t)v.flag
              : (e->type == SL_ENV_T_ENUM) ? (uint64_t)v.choice
              : (e->type == SL_ENV_T_LIST) ? (uint64_t)v.mask : v.u64;
        CHECK(st == 0 && got == cases[i].u64 && v.real == cases[i].real,
              "%s=%s: status %d (%s), read %llu / %g", e->pub.name,
              cases[i].text, st, st ? eb.msg : "", (unsigned long long)got,
              v.real);
    }
    /* Range errors offer auto where the variable takes it. */
    CHECK(sl_env_parse_text(SL_ENV_STAGING_BUFFERS, "0", &v, &eb) != 0 &&
              strstr(eb.msg, "or auto"), "no auto offered: %s", eb.msg);
    CHECK(sl_env_parse_text(SL_ENV_CHUNK, "auto", &v, &eb) == 0 && v.is_auto,
          "auto chunk refused: %s", eb.msg);
}

/* The defaults parse, and every variable comm_init checks refuses the
 * values its type cannot hold, naming itself. */
static void test_defaults(void)
{
    sl_env_value_t v;
    sl_errbuf_t    eb;
    int            id;

    clear_launchers();
    for (id = 0; id < SL_ENV_COUNT; ++id) {
        CHECK(sl_env_parse((sl_env_id_t)id, &v, &eb) == 0 && v.set == 0,
              "default of %s does not parse: %s", sl_env_table[id].pub.name,
              eb.msg);
    }
    CHECK(sl_env_check_all(&eb) == 0, "defaults refused: %s", eb.msg);
    /* The logger's own variable, wrong, is a sentence (it hung at 6aa8904). */
    setenv("STAGELINK_DEBUG", "1", 1);
    CHECK(sl_settings_log(&eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "STAGELINK_DEBUG=\"1\""), "DEBUG=1: %s", eb.msg);
    setenv("STAGELINK_DEBUG", "INFO", 1);
    setenv("STAGELINK_DEBUG_SUBSYS", "NETWORK", 1);
    CHECK(sl_env_check_all(&eb) == STAGELINK_ERR_CONFIG &&
              strstr(eb.msg, "STAGELINK_DEBUG_SUBSYS"), "SUBSYS: %s", eb.msg);
    unsetenv("STAGELINK_DEBUG_SUBSYS");
    CHECK(sl_settings_log(&eb) == 0 && sl_log_level() == SL_LOG_INFO,
          "STAGELINK_DEBUG=INFO did not configure the log: %s", eb.msg);
    unsetenv("STAGELINK_DEBUG");
    CHECK(sl_settings_log(&eb) == 0 && sl_log_level() == SL_LOG_WARN,
          "the default level is not WARN");
}

/* Unknown names, with the nearest known one. */
static void test_unknown(void)
{
    char buf[1024];

    clear_launchers();
    CHECK(sl_env_unknown(buf, sizeof(buf)) == 0, "unknown in a clean "
          "environment: %s", buf);
    setenv("STAGELINK_MOED", "full", 1);
    setenv("stagelink_timeout", "5", 1);
    setenv("STAGELINK_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ", "1", 1);
    CHECK(sl_env_unknown(buf, sizeof(buf)) == 3 &&
              strstr(buf, "STAGELINK_MOED is not a stagelink variable; did "
                          "you mean STAGELINK_MODE?") &&
              strstr(buf, "stagelink_timeout is not a stagelink variable; "
                          "did you mean STAGELINK_TIMEOUT?") &&
              !strstr(buf, "ZZZZ is not a stagelink variable; did"),
          "unknown names: %s", buf);
    unsetenv("STAGELINK_MOED");
    unsetenv("stagelink_timeout");
    unsetenv("STAGELINK_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ");
}

/* The code's mode stands; STAGELINK_MODE chooses only for the default,
 * and a variable that disagrees with the code fails, naming both. */
static void test_mode_choice(void)
{
    stagelink_config_t cfg = {.struct_size = sizeof(cfg)};
    sl_settings_t      s;
    sl_errbuf_t        eb;

    unsetenv("STAGELINK_MODE");
    cfg.mode = STAGELINK_MODE_SHARDED;
    CHECK(sl_settings_parse(&cfg, &s, &eb) == 0 &&
          s.mode == STAGELINK_MODE_SHARDED, "the code's sharded was not kept");
    setenv("STAGELINK_MODE", "sharded", 1);
    CHECK(sl_settings_parse(&cfg, &s, &eb) == 0 &&
          s.mode == STAGELINK_MODE_SHARDED, "an agreeing variable failed");
    cfg.mode = STAGELINK_MODE_DEFAULT;
    CHECK(sl_settings_parse(&cfg, &s, &eb) == STAGELINK_ERR_INVALID_ARG &&
              strstr(eb.msg, "STAGELINK_MODE=sharded") &&
              strstr(eb.msg, "only the host's code"),
          "sharded from the environment: %s", eb.msg);
    cfg.mode = STAGELINK_MODE_SHARDED;
    setenv("STAGELINK_MODE", "full", 1);
    CHECK(sl_settings_parse(&cfg, &s, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "STAGELINK_MODE=full") && strstr(eb.msg, "(sharded)"),
          "a disagreeing variable: %s", eb.msg);
    cfg.mode = STAGELINK_MODE_DEFAULT;
    CHECK(sl_settings_parse(&cfg, &s, &eb) == 0 &&
          s.mode == STAGELINK_MODE_FULL, "the variable did not choose the "
          "default's mode");
    unsetenv("STAGELINK_MODE");
    CHECK(sl_settings_parse(&cfg, &s, &eb) == 0 &&
          s.mode == STAGELINK_MODE_SCATTER_GATHER, "the default is not "
          "scatter_gather");
}

static void test_launchers(void)
{
    stagelink_config_t cfg;
    sl_launcher_t      l;
    sl_errbuf_t        eb;

    memset(&cfg, 0, sizeof(cfg));
    clear_launchers();
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "torchrun"), "no launcher: %s", eb.msg);

    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_BOOTSTRAP &&
          strstr(eb.msg, "MASTER_ADDR"),
          "multi-node without MASTER_ADDR: %s", eb.msg);
    setenv("MASTER_ADDR", "198.18.0.1", 1);
    setenv("MASTER_PORT", "29999", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.rank == 3 &&
          l.world_size == 8 && l.local_rank == 1 && l.local_size == 2 &&
          strcmp(l.addr, "198.18.0.1") == 0 && l.port == 29999 &&
          strcmp(l.bind, "198.18.0.1") == 0 &&
          strcmp(l.source, "torchrun") == 0, "torchrun: %s", eb.msg);
    setenv("STAGELINK_BOOTSTRAP_BIND", "0.0.0.0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 &&
          strcmp(l.bind, "0.0.0.0") == 0 && strcmp(l.addr, "198.18.0.1") == 0,
          "bind address apart from the rendezvous address: %s", l.bind);
    unsetenv("STAGELINK_BOOTSTRAP_BIND");
    setenv("MASTER_PORT", "70000", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG,
          "port 70000 accepted");
    setenv("RANK", "8", 1);
    setenv("MASTER_PORT", "29999", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "rank 8"), "rank 8 of 8: %s", eb.msg);
    setenv("RANK", "3", 1);
    /* torchrun's agent holds MASTER_PORT: the tcp rendezvous needs its own. */
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 &&
          l.boot == SL_BOOT_TORCH_STORE && l.port == 29999,
          "torchrun's agent store: %s", eb.msg);
    setenv("STAGELINK_BOOTSTRAP", "tcp", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "STAGELINK_BOOTSTRAP_PORT"),
          "tcp on the agent's MASTER_PORT: %s", eb.msg);
    setenv("STAGELINK_BOOTSTRAP_PORT", "29998", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.boot == SL_BOOT_TCP &&
          l.port == 29998, "tcp on a port of its own: %s", eb.msg);
    unsetenv("STAGELINK_BOOTSTRAP_PORT");
    setenv("WORLD_SIZE", "1", 1); /* one rank meets nobody */
    setenv("RANK", "0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.boot == SL_BOOT_TCP,
          "one rank refused on the agent's port: %s", eb.msg);
    clear_launchers();

    /* torchrun's default run id "none" names no job. */
    setenv("SLURM_JOB_ID", "4242", 1);
    {
        uint64_t slurm = sl_launcher_job_key();

        setenv("TORCHELASTIC_RUN_ID", "none", 1);
        CHECK(sl_launcher_job_key() == slurm && slurm != 0,
              "run id \"none\" taken as a job key");
        setenv("TORCHELASTIC_RUN_ID", "job-17", 1);
        CHECK(sl_launcher_job_key() != slurm, "run id job-17 not taken");
    }
    clear_launchers();

    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "4", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.rank == 2 &&
          l.world_size == 4 && strcmp(l.source, "mpirun") == 0 &&
          strcmp(l.addr, "127.0.0.1") == 0, "mpirun one node: %s", eb.msg);
    /* PMIx keys by its own ranks: forced, they must be the launcher's. */
    setenv("STAGELINK_BOOTSTRAP", "pmix", 1);
    setenv("PMIX_RANK", "0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "PMIX_RANK=0"), "pmix forced on another rank: %s",
          eb.msg);
    setenv("PMIX_RANK", "2", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.boot == SL_BOOT_PMIX,
          "pmix forced: %s", eb.msg);
    clear_launchers();
    /* torchrun's workers inherit their agent's PMIX_RANK: every rank
     * refuses, also the one whose number happens to match. */
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("STAGELINK_BOOTSTRAP", "pmix", 1);
    setenv("PMIX_RANK", "0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "torchrun"), "pmix forced under torchrun: %s",
          eb.msg);
    clear_launchers();

    /* A batch script: rank 0 of SLURM_NTASKS, but no srun step. */
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "4", 1);
    setenv("SLURM_LOCALID", "0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "batch script"), "a batch script as rank 0 of 4: %s",
          eb.msg);
    unsetenv("SLURM_NTASKS"); /* not in the table: clear_launchers keeps it */
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_STEP_NUM_TASKS", "6", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("MASTER_ADDR", "node0", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.rank == 5 &&
          l.world_size == 6 && l.local_rank == 1 &&
          strcmp(l.source, "slurm") == 0 && l.local_size == -1,
          "srun: %s", eb.msg);
    /* Ranks on this node: the SLURM_NODEID-th entry of the step's list. */
    {
        static const struct {
            const char *list, *node;
            int         local_size;
        } cases[] = {{"6", "0", 6},          {"4(x2),3", "0", 4},
                     {"4(x2),3", "1", 4},    {"4(x2),3", "2", 3},
                     {"2,3(x3),1", "4", 1},  {"2,3(x3),1", "3", 3},
                     {"4(x2),3", "3", 0},    {"4(x", "0", 0},
                     {"0", "0", 0},          {"3,", "1", 0},
                     {"x", "0", 0}};
        size_t i;

        for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
            sl_status_t st;

            setenv("SLURM_STEP_TASKS_PER_NODE", cases[i].list, 1);
            setenv("SLURM_NODEID", cases[i].node, 1);
            st = sl_launcher_detect(&cfg, &l, &eb);
            CHECK(cases[i].local_size > 0
                      ? st == 0 && l.local_size == cases[i].local_size
                      : st == STAGELINK_ERR_CONFIG &&
                            strstr(eb.msg, "SLURM_STEP_TASKS_PER_NODE") != NULL,
                  "SLURM_STEP_TASKS_PER_NODE=%s SLURM_NODEID=%s: status %d, "
                  "local size %d, %s", cases[i].list, cases[i].node, st,
                  l.local_size, eb.msg);
        }
        unsetenv("SLURM_STEP_TASKS_PER_NODE");
        unsetenv("SLURM_NODEID");
    }
    setenv("SLURM_STEP_NUM_TASKS", "six", 1);
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == STAGELINK_ERR_CONFIG &&
          strstr(eb.msg, "SLURM_STEP_NUM_TASKS"), "bad SLURM_STEP_NUM_TASKS: %s",
          eb.msg);
    clear_launchers();

    cfg.flags      = STAGELINK_CONFIG_RANK_SET;
    cfg.rank       = 0;
    cfg.world_size = 2;
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.rank == 0 &&
          strcmp(l.source, "config") == 0, "config rank: %s", eb.msg);

    /* The launcher's local rank holds for a communicator of the whole
     * job, however it numbers the ranks, not for a smaller one. */
    setenv("RANK", "1", 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    cfg.rank = 1;
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.local_rank == 1 &&
          l.local_size == 2, "config = launcher: local %d/%d", l.local_rank,
          l.local_size);
    cfg.rank = 0; /* renumbered: still this process's local rank */
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.local_rank == 1 &&
          l.local_size == 2, "renumbered: local %d/%d", l.local_rank,
          l.local_size);
    cfg.world_size = 1; /* a communicator of part of the job */
    CHECK(sl_launcher_detect(&cfg, &l, &eb) == 0 && l.local_rank == -1 &&
          l.local_size == -1, "sub-communicator kept the launcher's local "
          "rank %d/%d", l.local_rank, l.local_size);
    clear_launchers();
}

static int dummy_set(void *ctx, const char *key, const void *buf, size_t n)
{
    (void)ctx, (void)key, (void)buf, (void)n;
    return 0;
}

static int dummy_get(void *ctx, const char *key, void *buf, size_t cap,
                     size_t *n)
{
    (void)ctx, (void)key, (void)buf, (void)cap, (void)n;
    return 0;
}

static int dummy_allgather(void *ctx, const void *s, void *r, size_t n)
{
    (void)ctx, (void)s, (void)r, (void)n;
    return 0;
}

/* A host built before the store fields passes the original v1 size; the
 * fields it lacks read as zero, whatever lies past its struct. */
static void test_config_copy(void)
{
    stagelink_config_t cfg, out;
    sl_errbuf_t        eb;

    memset(&cfg, 0, sizeof(cfg));
    cfg.tp_size     = 2;
    cfg.store_set   = dummy_set; /* past the old struct: must be ignored */
    cfg.struct_size = (uint32_t)offsetof(stagelink_config_t, store_set);
    CHECK(sl_config_copy(&cfg, &out, &eb) == 0 && out.tp_size == 2 &&
          out.store_set == NULL && out.struct_size == sizeof(out),
          "original v1 config: %s", eb.msg);
    cfg.struct_size = (uint32_t)offsetof(stagelink_config_t, flags);
    CHECK(sl_config_copy(&cfg, &out, &eb) == STAGELINK_ERR_ABI &&
          strstr(eb.msg, "struct_size"), "a config shorter than v1: %s",
          eb.msg);
    cfg.struct_size = sizeof(cfg);
    CHECK(sl_config_copy(&cfg, &out, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "store_get"), "half a store: %s", eb.msg);
    cfg.store_get = dummy_get;
    CHECK(sl_config_copy(&cfg, &out, &eb) == 0 && out.store_get == dummy_get,
          "a store: %s", eb.msg);
    cfg.allgather = dummy_allgather;
    CHECK(sl_config_copy(&cfg, &out, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "both"), "store and allgather: %s", eb.msg);
    cfg.allgather = NULL;
    cfg.flags = STAGELINK_CONFIG_RANK_SET | STAGELINK_CONFIG_DEVICE_SET;
    CHECK(sl_config_copy(&cfg, &out, &eb) == 0, "the known flags: %s", eb.msg);
    cfg.flags |= 0x80000000u; /* a later header's flag */
    CHECK(sl_config_copy(&cfg, &out, &eb) == STAGELINK_ERR_ABI &&
          strstr(eb.msg, "0x80000000"), "an unknown flag: %s", eb.msg);
}

/* Each peer once, ascending, never the rank itself; p = 2 with the
 * stages wrapping around names one neighbour. */
static void test_peers(void)
{
    sl_layout_t          l;
    sl_errbuf_t          eb;
    int                  peers[8], n;
    int                  group[2] = {0, 1};
    stagelink_topology_t wrap     = {2, 2, 1, 0, group};

    CHECK(sl_layout_from_order(13, 16, 2, 4, &l, &eb) == 0, "layout");
    n = sl_layout_peers(&l, peers);
    CHECK(n == 2 && peers[0] == 9 && peers[1] == 12, "rank 13's peers: %d "
          "(%d, %d)", n, peers[0], peers[1]);
    sl_layout_cleanup(&l);
    CHECK(sl_layout_from_topology(1, 4, 2, 2, &wrap, &l, &eb) == 0, "wrap: %s",
          eb.msg);
    n = sl_layout_peers(&l, peers);
    CHECK(n == 2 && peers[0] == 0 && peers[1] == 2, "wrap-around peers: %d",
          n);
    sl_layout_cleanup(&l);
}

static void test_layout(void)
{
    sl_layout_t          l;
    sl_errbuf_t          eb;
    int                  group[2] = {4, 6};
    stagelink_topology_t topo     = {-1, 9, 1, 0, group};

    /* 16 ranks, t = 2, p = 4, so d = 2: rank 13 = pp 3, dp 0, tp 1. */
    CHECK(sl_layout_from_order(13, 16, 2, 4, &l, &eb) == 0 && l.tp_index == 1 &&
          l.dp_index == 0 && l.pp_index == 3 && l.dp_size == 2 &&
          l.prev_rank == 9 && l.next_rank == -1 && l.tp_ranks[0] == 12 &&
          l.tp_ranks[1] == 13, "Megatron order of rank 13");
    sl_layout_cleanup(&l);
    CHECK(sl_layout_from_order(2, 8, 4, 0, &l, &eb) == 0 && l.pp_size == 2 &&
          l.prev_rank == -1 && l.next_rank == 6, "p derived from world / t");
    sl_layout_cleanup(&l);
    CHECK(sl_layout_from_order(0, 6, 4, 0, &l, &eb) == STAGELINK_ERR_INVALID_ARG,
          "6 ranks with t = 4 accepted");
    CHECK(sl_layout_from_order(0, 4, 0, 0, &l, &eb) == STAGELINK_ERR_INVALID_ARG,
          "t = 0 accepted");
    /* t x p past INT_MAX: a division by zero (256 x 2^24) or a wrap. */
    CHECK(sl_layout_from_order(0, 256, 256, 1 << 24, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG, "t = 256, p = 2^24 accepted");
    CHECK(sl_layout_from_order(0, 2, 2, 0x7fffffff, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG, "p = INT_MAX accepted");
    CHECK(sl_layout_from_order(0, 8, 2, -4, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG, "p = -4 accepted");
    CHECK(sl_layout_from_topology(6, 10, 2, -1, &topo, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG && strstr(eb.msg, "pp_size -1"),
          "explicit topology with p = -1: %s", eb.msg);
    CHECK(sl_layout_from_topology(6, 10, 2, 2, &topo, &l, &eb) == 0 &&
          l.next_rank == 9 && l.prev_rank == -1 && l.tp_ranks[0] == 4,
          "explicit topology: %s", eb.msg);
    sl_layout_cleanup(&l);
    topo.tp_index = 0;
    CHECK(sl_layout_from_topology(6, 10, 2, 2, &topo, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG, "tp_ranks[tp_index] != rank accepted");
    group[0] = 6;
    topo.tp_index = 1;
    CHECK(sl_layout_from_topology(6, 10, 2, 2, &topo, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG && strstr(eb.msg, "both rank 6"),
          "a TP group naming rank 6 twice: %s", eb.msg);
    group[0] = 9;
    CHECK(sl_layout_from_topology(6, 10, 2, 2, &topo, &l, &eb) ==
              STAGELINK_ERR_INVALID_ARG && strstr(eb.msg, "next stage"),
          "the next stage inside the TP group: %s", eb.msg);
}

/* Rank 5 of t = 2, p = 3 (Megatron order, 12 ranks) against the claims
 * of its peers: its neighbours must name it back, its TP peer the same
 * group at the index where rank 5 has it. */
static void test_claims(void)
{
    sl_layout_t       me, peer;
    sl_layout_claim_t c;
    sl_errbuf_t       eb;
    int               r;

    CHECK(sl_layout_from_order(5, 12, 2, 3, &me, &eb) == 0 &&
          me.prev_rank == 1 && me.next_rank == 9, "rank 5's layout");
    for (r = 0; r < 12; ++r) {
        CHECK(sl_layout_from_order(r, 12, 2, 3, &peer, &eb) == 0, "rank %d",
              r);
        sl_layout_claim(&peer, &c);
        CHECK(sl_layout_agrees(&me, r, &c, &eb) == 0,
              "rank %d of the same order refused: %s", r, eb.msg);
        sl_layout_cleanup(&peer);
    }
    CHECK(sl_layout_from_order(9, 12, 2, 3, &peer, &eb) == 0, "rank 9");
    sl_layout_claim(&peer, &c);
    c.prev_rank = 3;
    CHECK(sl_layout_agrees(&me, 9, &c, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "rank 9's previous stage is rank 3"),
          "a next stage receiving from another rank: %s", eb.msg);
    sl_layout_cleanup(&peer);
    CHECK(sl_layout_from_order(1, 12, 2, 3, &peer, &eb) == 0, "rank 1");
    sl_layout_claim(&peer, &c);
    c.next_rank = -1;
    CHECK(sl_layout_agrees(&me, 1, &c, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "rank 1's next stage is rank -1"),
          "a previous stage sending nowhere: %s", eb.msg);
    sl_layout_cleanup(&peer);
    CHECK(sl_layout_from_order(4, 12, 2, 3, &peer, &eb) == 0, "rank 4");
    sl_layout_claim(&peer, &c);
    c.tp_index = 1;
    CHECK(sl_layout_agrees(&me, 4, &c, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "TP index 0 of this rank's (5) TP group {4,5}"),
          "a TP peer at another index: %s", eb.msg);
    sl_layout_claim(&peer, &c);
    c.tp_group ^= 1;
    CHECK(sl_layout_agrees(&me, 4, &c, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "another group"),
          "a TP peer naming another group: %s", eb.msg);
    sl_layout_cleanup(&peer);
    sl_layout_cleanup(&me);
    /* A group too long to name whole is cut with an ellipsis. */
    CHECK(sl_layout_from_order(4000, 4096, 64, 64, &me, &eb) == 0 &&
          sl_layout_from_order(4001, 4096, 64, 64, &peer, &eb) == 0,
          "t = 64 layouts");
    sl_layout_claim(&peer, &c);
    c.tp_index = 0;
    CHECK(sl_layout_agrees(&me, 4001, &c, &eb) == STAGELINK_ERR_INVALID_ARG &&
          strstr(eb.msg, "{3968,3969,") && strstr(eb.msg, ",...}"),
          "a long TP group named: %s", eb.msg);
    sl_layout_cleanup(&peer);
    sl_layout_cleanup(&me);
}

static void test_topo(void)
{
    static const char ids[5][SL_NODE_ID_LEN] = {"a", "b", "a", "b", "a"};
    sl_locality_t     loc;

    sl_topo_locality(ids, 5, 4, &loc);
    CHECK(loc.local_rank == 2 && loc.local_size == 3, "rank 4 on node a: %d/%d",
          loc.local_rank, loc.local_size);
    sl_topo_locality(ids, 5, 3, &loc);
    CHECK(loc.local_rank == 1 && loc.local_size == 2, "rank 3 on node b: %d/%d",
          loc.local_rank, loc.local_size);

    clear_launchers();
}

int main(void)
{
    test_table();
    test_claims();
    test_parsers();
    test_defaults();
    test_unknown();
    test_mode_choice();
    test_launchers();
    test_config_copy();
    test_layout();
    test_peers();
    test_topo();
    return check_summary();
}
