/* SPDX-License-Identifier: MIT */
#include "sl_launcher.h"
#include "sl_env.h"
#include "sl_log.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

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
    {"slurm", SL_ENV_SLURM_PROCID, SL_ENV_SLURM_NTASKS, SL_ENV_SLURM_LOCALID,
     SL_ENV_SLURM_NTASKS_PER_NODE},
};

static sl_status_t sl_launcher_int(sl_env_id_t id, long min, int *value,
                                   sl_errbuf_t *eb)
{
    const char *text = sl_env_raw(id);
    long        v;

    if (text == NULL) {
        *value = -1;
        return STAGELINK_SUCCESS;
    }
    SL_CHECK(sl_parse_long(text, min, INT_MAX, &v, sl_env_table[id].name, eb));
    *value = (int)v;
    return STAGELINK_SUCCESS;
}

/* FNV-1a: the key tells jobs apart (a stale rank of an earlier job, a
 * neighbour's job on the same port); it is not authentication, since a
 * hello read off the wire can be replayed: that is the job secret's. */
uint64_t sl_launcher_job_key(void)
{
    static const sl_env_id_t ids[] = {SL_ENV_JOB_KEY, SL_ENV_TORCHELASTIC_RUN_ID,
                                      SL_ENV_SLURM_JOB_ID, SL_ENV_OMPI_JOBID};
    const unsigned char     *p     = NULL;
    uint64_t                 h     = 0xcbf29ce484222325ull;
    size_t                   i;

    for (i = 0; i < SL_ARRAY_SIZE(ids) && p == NULL; ++i) {
        p = (const unsigned char *)sl_env_raw(ids[i]);
    }
    if (p == NULL) {
        return 0;
    }
    for (; *p != '\0'; ++p) {
        h = (h ^ *p) * 0x100000001b3ull;
    }
    return h;
}

static sl_status_t sl_launcher_rendezvous(sl_launcher_t *out, sl_errbuf_t *eb)
{
    const char *addr     = sl_env_raw(SL_ENV_BOOTSTRAP_ADDR);
    const char *port     = sl_env_raw(SL_ENV_BOOTSTRAP_PORT);
    const char *bind;
    sl_env_id_t port_var = SL_ENV_BOOTSTRAP_PORT;
    long        v;

    if (addr == NULL) {
        addr = sl_env_raw(SL_ENV_MASTER_ADDR);
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
        port     = sl_env_raw(SL_ENV_MASTER_PORT);
        port_var = SL_ENV_MASTER_PORT;
    }
    out->port = SL_BOOTSTRAP_DEFAULT_PORT;
    if (port != NULL) {
        SL_CHECK(sl_parse_long(port, 1, 65535, &v, sl_env_table[port_var].name,
                               eb));
        out->port = (int)v;
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
    for (i = 0; i < SL_ARRAY_SIZE(sl_launchers) && found == NULL; ++i) {
        if (sl_env_raw(sl_launchers[i].rank) != NULL) {
            found = &sl_launchers[i];
        }
    }
    if (found != NULL) {
        out->source = found->source;
        SL_CHECK(sl_launcher_int(found->rank, 0, &out->rank, eb));
        SL_CHECK(sl_launcher_int(found->size, 1, &out->world_size, eb));
        SL_CHECK(sl_launcher_int(found->local_rank, 0, &out->local_rank, eb));
        SL_CHECK(sl_launcher_int(found->local_size, 1, &out->local_size, eb));
        if (out->world_size < 0) {
            return sl_error(eb, STAGELINK_ERR_CONFIG,
                            "%s is set but %s is not; the launcher (%s) "
                            "environment is incomplete",
                            sl_env_table[found->rank].name,
                            sl_env_table[found->size].name, found->source);
        }
    }
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
                        "no rank found: set it in stagelink_config_t or start "
                        "under torchrun (RANK, WORLD_SIZE), mpirun "
                        "(OMPI_COMM_WORLD_RANK) or srun (SLURM_PROCID)");
    }
    if (out->world_size < 1 || out->rank < 0 ||
        out->rank >= out->world_size) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "rank %d is not in world size %d (from %s)",
                        out->rank, out->world_size, out->source);
    }
    if (config->allgather == NULL && config->store_set == NULL) {
        SL_CHECK(sl_launcher_rendezvous(out, eb));
    }
    SL_INFO(SL_SUBSYS_INIT, "rank %d of %d from %s, local rank %d of %d",
            out->rank, out->world_size, out->source, out->local_rank,
            out->local_size);
    return STAGELINK_SUCCESS;
}
