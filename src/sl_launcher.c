/* SPDX-License-Identifier: MIT */
#include "sl_launcher.h"
#include "sl_env.h"
#include "sl_hash.h"
#include "sl_log.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *const sl_boot_kind_names[SL_BOOT_KINDS + 1] = {
    [SL_BOOT_CALLBACKS] = "callbacks", [SL_BOOT_TORCH_STORE] = "torch-store",
    [SL_BOOT_PMIX] = "pmix", [SL_BOOT_TCP] = "tcp", [SL_BOOT_KINDS] = NULL};

typedef struct sl_launcher_vars {
    const char *source;
    sl_env_id_t rank, size, local_rank, local_size;
} sl_launcher_vars_t;

/* Tried in this order: the first whose rank variable is set wins. */
static const sl_launcher_vars_t sl_launchers[] = {
    {"torchrun", SL_ENV_RANK, SL_ENV_WORLD_SIZE, SL_ENV_LOCAL_RANK,
     SL_ENV_LOCAL_WORLD_SIZE},
    {"mpirun", SL_ENV_OMPI_RANK, SL_ENV_OMPI_SIZE, SL_ENV_OMPI_LOCAL_RANK,
     SL_ENV_OMPI_LOCAL_SIZE},
    {"slurm", SL_ENV_SLURM_PROCID, SL_ENV_SLURM_STEP_NUM_TASKS, SL_ENV_SLURM_LOCALID,
     SL_ENV_SLURM_STEP_TASKS_PER_NODE},
};

/* A launcher's integer as the table bounds it; unset, -1. */
static sl_status_t sl_launcher_int(sl_env_id_t id, int *value, sl_errbuf_t *eb)
{
    sl_env_value_t v;

    SL_CHECK(sl_env_parse(id, &v, eb));
    *value = (v.text != NULL) ? (int)v.u64 : -1;
    return STAGELINK_SUCCESS;
}

/* Slurm's ranks on this node: the SLURM_NODEID-th entry of
 * SLURM_STEP_TASKS_PER_NODE, a list of COUNT or COUNT(xREPEAT) ("4(x2),3":
 * two nodes of 4, one of 3).  Unset, -1: init then counts them itself. */
static sl_status_t sl_launcher_slurm_local_size(int *value, sl_errbuf_t *eb)
{
    const char *text = sl_env_raw(SL_ENV_SLURM_STEP_TASKS_PER_NODE);
    const char *p    = text;
    int         node;

    SL_CHECK(sl_launcher_int(SL_ENV_SLURM_NODEID, &node, eb));
    *value = -1;
    if (text == NULL || node < 0) {
        return STAGELINK_SUCCESS;
    }
    for (;;) {
        char *end;
        long  count = strtol(p, &end, 10), repeat = 1;

        if (end == p || count < 1 || count > INT_MAX) {
            break;
        }
        p = end;
        if (strncmp(p, "(x", 2) == 0) {
            repeat = strtol(p + 2, &end, 10);
            if (end == p + 2 || repeat < 1 || *end != ')') {
                break;
            }
            p = end + 1;
        }
        if (node < repeat) {
            *value = (int)count;
            return STAGELINK_SUCCESS;
        }
        node -= (int)repeat;
        if (*p != ',') {
            break;
        }
        ++p;
    }
    return sl_error(eb, STAGELINK_ERR_CONFIG,
                    "SLURM_STEP_TASKS_PER_NODE=\"%.64s\" has no entry for "
                    "SLURM_NODEID=%s (it is a list of COUNT or "
                    "COUNT(xREPEAT), one a node of the step)", text,
                    sl_env_raw(SL_ENV_SLURM_NODEID));
}

/* The key tells jobs apart (a stale rank of an earlier job, a neighbour's
 * job on the same port); it is not authentication, since a hello read off
 * the wire can be replayed: that is the job secret's.  torchrun's run id
 * "none" is its default for every static job, so it names none. */
uint64_t sl_launcher_job_key(void)
{
    static const sl_env_id_t ids[] = {SL_ENV_JOB_KEY, SL_ENV_TORCHELASTIC_RUN_ID,
                                      SL_ENV_SLURM_JOB_ID, SL_ENV_OMPI_JOBID};
    const char              *p     = NULL;
    size_t                   i;

    for (i = 0; i < SL_ARRAY_SIZE(ids) && p == NULL; ++i) {
        p = sl_env_raw(ids[i]);
        if (ids[i] == SL_ENV_TORCHELASTIC_RUN_ID && p != NULL &&
            strcmp(p, "none") == 0) {
            p = NULL;
        }
    }
    return (p != NULL) ? sl_hash_string(p) : 0;
}

/* The rendezvous's address (tcp: STAGELINK_BOOTSTRAP_ADDR/_PORT first),
 * or the agent store's (torch-store: MASTER_ADDR/_PORT alone). */
static sl_status_t sl_launcher_rendezvous(sl_launcher_t *out, sl_errbuf_t *eb)
{
    int         tcp      = out->boot == SL_BOOT_TCP;
    const char *addr     = tcp ? sl_env_raw(SL_ENV_BOOTSTRAP_ADDR) : NULL;
    const char *port     = tcp ? sl_env_raw(SL_ENV_BOOTSTRAP_PORT) : NULL;
    const char *bind;
    sl_env_id_t port_var = SL_ENV_BOOTSTRAP_PORT;
    int         v;

    if (addr == NULL) {
        addr = sl_env_raw(SL_ENV_MASTER_ADDR);
    }
    if (!tcp && (addr == NULL || sl_env_raw(SL_ENV_MASTER_PORT) == NULL)) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "the torch-store bootstrap needs MASTER_ADDR and "
                        "MASTER_PORT (torchrun's store), and %s is unset",
                        addr == NULL ? "MASTER_ADDR" : "MASTER_PORT");
    }
    if (addr == NULL) {
        /* Without an address only a single-node job can meet. */
        if (out->local_size >= 0 && out->local_size < out->world_size) {
            return sl_error(eb, STAGELINK_ERR_BOOTSTRAP,
                            "%d of %d ranks run on this node and no rendezvous "
                            "address is set; export MASTER_ADDR (or "
                            "STAGELINK_BOOTSTRAP_ADDR) to rank 0's address",
                            out->local_size, out->world_size);
        }
        addr = "127.0.0.1";
    }
    if (strlen(addr) >= sizeof(out->addr)) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "rendezvous address \"%.40s...\" is longer than %zu "
                        "characters", addr, sizeof(out->addr) - 1);
    }
    snprintf(out->addr, sizeof(out->addr), "%s", addr);
    bind = sl_env_raw(SL_ENV_BOOTSTRAP_BIND);
    if (bind != NULL && strlen(bind) >= sizeof(out->bind)) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "STAGELINK_BOOTSTRAP_BIND \"%.40s...\" is longer than "
                        "%zu characters", bind, sizeof(out->bind) - 1);
    }
    snprintf(out->bind, sizeof(out->bind), "%s", bind != NULL ? bind : addr);
    out->job_key = sl_launcher_job_key();

    if (port == NULL) {
        sl_env_value_t agent;

        port     = sl_env_raw(SL_ENV_MASTER_PORT);
        port_var = SL_ENV_MASTER_PORT;
        SL_CHECK(sl_env_parse(SL_ENV_TORCHELASTIC_USE_AGENT_STORE, &agent, eb));
        /* The agent's own address and port: only a one-rank job, which
         * meets nobody, would not collide there. */
        if (tcp && out->world_size > 1 && port != NULL && agent.flag &&
            sl_env_raw(SL_ENV_BOOTSTRAP_ADDR) == NULL) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "the tcp bootstrap would listen on MASTER_PORT=%s, "
                            "where torchrun's agent hosts the job's store "
                            "(TORCHELASTIC_USE_AGENT_STORE=%s); set "
                            "STAGELINK_BOOTSTRAP_PORT to a free port on rank "
                            "0's node (a communicator of the whole job can "
                            "instead join that store: STAGELINK_BOOTSTRAP "
                            "unset or torch-store)", port,
                            sl_env_raw(SL_ENV_TORCHELASTIC_USE_AGENT_STORE));
        }
    }
    out->port = SL_BOOTSTRAP_DEFAULT_PORT;
    if (port != NULL) {
        SL_CHECK(sl_launcher_int(port_var, &v, eb));
        out->port = v;
    }
    return STAGELINK_SUCCESS;
}

/* The bootstrap of this communicator: a forced one if it can serve, else
 * the first of auto's order that applies, with the reason in boot_why. */
static sl_status_t sl_launcher_bootstrap(const stagelink_config_t *config,
                                         const sl_launcher_vars_t *found,
                                         sl_launcher_t *out, sl_errbuf_t *eb)
{
    int callbacks = config->allgather != NULL || config->store_set != NULL;
    /* A launcher's store numbers the launcher's ranks: only a communicator
     * of the whole job, numbered as the launcher does, can key by them. */
    int whole = found != NULL && (!(config->flags & STAGELINK_CONFIG_RANK_SET) ||
                                  (config->rank == out->launcher_rank &&
                                   config->world_size == out->launcher_size));
    int pmix  = whole && out->pmix_rank >= 0 && found != &sl_launchers[0] &&
                out->pmix_rank == out->launcher_rank;
    sl_env_value_t agent, kind;

    SL_CHECK(sl_env_parse(SL_ENV_TORCHELASTIC_USE_AGENT_STORE, &agent, eb));
    SL_CHECK(sl_env_parse(SL_ENV_BOOTSTRAP, &kind, eb));
    switch (kind.choice - 1) {
    case -1:
        break;
    case SL_BOOT_CALLBACKS:
        if (!callbacks) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_BOOTSTRAP=callbacks, but the host's "
                            "config gives no store or allgather");
        }
        break;
    case SL_BOOT_TORCH_STORE:
        out->boot = SL_BOOT_TORCH_STORE;
        snprintf(out->boot_why, sizeof(out->boot_why), "STAGELINK_BOOTSTRAP="
                 "torch-store");
        return STAGELINK_SUCCESS;
    case SL_BOOT_PMIX:
        if (out->pmix_rank < 0 || !whole) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_BOOTSTRAP=pmix, but %s; start under "
                            "srun --mpi=pmix or mpirun", out->pmix_rank < 0
                            ? "PMIX_RANK is unset (no PMIx server launched "
                              "this process)"
                            : "this communicator is not the launcher's whole "
                              "job, numbered as the launcher does");
        }
        /* PMIx keys by its own ranks: under a launcher inside srun
         * (torchrun's workers, which inherit their agent's PMIX_RANK) they
         * are not this job's, on any rank (so every rank refuses alike). */
        if (found == &sl_launchers[0] || out->pmix_rank != out->launcher_rank) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "STAGELINK_BOOTSTRAP=pmix, but this process's "
                            "rank %d comes from %s and PMIX_RANK=%d from the "
                            "PMIx task another launcher (torchrun under srun, "
                            "say) started it inside: PMIx's ranks are not the "
                            "job's; leave STAGELINK_BOOTSTRAP unset or use "
                            "tcp", out->launcher_rank, found->source,
                            out->pmix_rank);
        }
        out->boot = SL_BOOT_PMIX;
        snprintf(out->boot_why, sizeof(out->boot_why),
                 "STAGELINK_BOOTSTRAP=pmix");
        return STAGELINK_SUCCESS;
    default:
        out->boot = SL_BOOT_TCP;
        snprintf(out->boot_why, sizeof(out->boot_why),
                 "STAGELINK_BOOTSTRAP=tcp");
        return STAGELINK_SUCCESS;
    }
    if (callbacks) {
        out->boot = SL_BOOT_CALLBACKS;
        snprintf(out->boot_why, sizeof(out->boot_why), "the host's %s",
                 config->store_set != NULL ? "store" : "allgather");
    } else if (whole && agent.flag) {
        out->boot = SL_BOOT_TORCH_STORE;
        snprintf(out->boot_why, sizeof(out->boot_why),
                 "TORCHELASTIC_USE_AGENT_STORE=%s: torchrun hosts the job's "
                 "store", sl_env_raw(SL_ENV_TORCHELASTIC_USE_AGENT_STORE));
    } else if (pmix) {
        out->boot = SL_BOOT_PMIX;
        snprintf(out->boot_why, sizeof(out->boot_why),
                 "PMIX_RANK=%d is this process's (%s)", out->pmix_rank,
                 found->source);
    } else {
        out->boot = SL_BOOT_TCP;
        snprintf(out->boot_why, sizeof(out->boot_why), "%s",
                 out->world_size == 1 ? "one rank: nothing to exchange"
                 : "no launcher's store: stagelink's own rendezvous");
    }
    return STAGELINK_SUCCESS;
}

sl_status_t sl_launcher_detect(const stagelink_config_t *config,
                               sl_launcher_t *out, sl_errbuf_t *eb)
{
    const sl_launcher_vars_t *found = NULL;
    size_t                    i;

    memset(out, 0, sizeof(*out));
    out->local_rank = out->local_size = -1;
    SL_CHECK(sl_launcher_int(SL_ENV_PMIX_RANK, &out->pmix_rank, eb));
    for (i = 0; i < SL_ARRAY_SIZE(sl_launchers) && found == NULL; ++i) {
        /* A Slurm batch script has SLURM_PROCID=0 of SLURM_NTASKS too, but
         * it is no task of a step: only srun's own size says one is. */
        if (sl_env_raw(sl_launchers[i].rank) != NULL &&
            (sl_launchers[i].size != SL_ENV_SLURM_STEP_NUM_TASKS ||
             sl_env_raw(SL_ENV_SLURM_STEP_NUM_TASKS) != NULL)) {
            found = &sl_launchers[i];
        }
    }
    if (found != NULL) {
        out->source = found->source;
        SL_CHECK(sl_launcher_int(found->rank, &out->rank, eb));
        SL_CHECK(sl_launcher_int(found->size, &out->world_size, eb));
        SL_CHECK(sl_launcher_int(found->local_rank, &out->local_rank, eb));
        if (found->local_size == SL_ENV_SLURM_STEP_TASKS_PER_NODE) {
            SL_CHECK(sl_launcher_slurm_local_size(&out->local_size, eb));
        } else {
            SL_CHECK(sl_launcher_int(found->local_size, &out->local_size, eb));
        }
        if (out->world_size < 0) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "%s is set but %s is not; the launcher (%s) "
                            "environment is incomplete",
                            sl_env_table[found->rank].pub.name,
                            sl_env_table[found->size].pub.name, found->source);
        }
    }
    out->launcher_rank = out->rank;
    out->launcher_size = out->world_size;
    if (config->flags & STAGELINK_CONFIG_RANK_SET) {
        /* The launcher's local rank is this process's: it holds for a
         * communicator of every process of the job, however numbered, and
         * the same answer on every rank decides whether init exchanges
         * node identities.  A smaller one must find its own. */
        if (found == NULL || out->world_size != config->world_size) {
            out->local_rank = out->local_size = -1;
        }
        out->source     = "config";
        out->rank       = config->rank;
        out->world_size = config->world_size;
    } else if (found == NULL) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "no rank found%s: set it in stagelink_config_t or "
                        "start under torchrun (RANK, WORLD_SIZE), mpirun "
                        "(OMPI_COMM_WORLD_RANK) or srun (SLURM_PROCID, "
                        "SLURM_STEP_NUM_TASKS)",
                        sl_env_raw(SL_ENV_SLURM_PROCID) != NULL
                            ? " (SLURM_PROCID is set but SLURM_STEP_NUM_TASKS "
                              "is not: this is a Slurm batch script, not a "
                              "task of srun)" : "");
    }
    if (out->world_size < 1 || out->rank < 0 ||
        out->rank >= out->world_size) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "rank %d is not in world size %d (from %s)",
                        out->rank, out->world_size, out->source);
    }
    SL_CHECK(sl_launcher_bootstrap(config, found, out, eb));
    if (out->boot == SL_BOOT_TCP || out->boot == SL_BOOT_TORCH_STORE) {
        SL_CHECK(sl_launcher_rendezvous(out, eb));
    }
    SL_INFO(SL_SUBSYS_INIT, "rank %d of %d from %s, local rank %d of %d, "
            "bootstrap %s (%s)", out->rank, out->world_size, out->source,
            out->local_rank, out->local_size, sl_boot_kind_names[out->boot],
            out->boot_why);
    return STAGELINK_SUCCESS;
}
