/* The environment table and its parsers.  SPDX-License-Identifier: MIT */
#include "sl_env.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const sl_env_entry_t sl_env_table[SL_ENV_COUNT] = {
    [SL_ENV_PLUGIN] = {"STAGELINK_PLUGIN", "ucx",
        "Plugin the loader opens: a short name (ucx -> libstagelink-ucx.so) or a path."},
    [SL_ENV_PLUGIN_PATH] = {"STAGELINK_PLUGIN_PATH", "",
        "Colon-separated directories searched for plugins before the directory next to libstagelink and the installed plugin directory."},
    [SL_ENV_MODE] = {"STAGELINK_MODE", "scatter_gather",
        "Boundary mode where the host's code leaves the choice to it (mode default): scatter_gather, full or sharded, so the same job can be A/B-tested. A mode the code set and a variable naming another fail comm_init (STAGELINK_ERR_INVALID_ARG)."},
    [SL_ENV_GATHER] = {"STAGELINK_GATHER", "auto",
        "Intra-node gather backend: auto (the host's gather callback when its config gives one; else nccl for GPU buffers when built with it and usable, ucx for the rest), ucx, nccl, or host (the callback, required)."},
    [SL_ENV_DEBUG] = {"STAGELINK_DEBUG", "WARN",
        "Log level: NONE, WARN (errors only), INFO or TRACE."},
    [SL_ENV_DEBUG_SUBSYS] = {"STAGELINK_DEBUG_SUBSYS", "ALL",
        "Comma list of subsystems to log: INIT, BOOT, NET, GATHER, ENV or ALL."},
    [SL_ENV_NODE_ID] = {"STAGELINK_NODE_ID", "",
        "Override of the node identity (default: hostname plus network namespace)."},
    [SL_ENV_TIMEOUT] = {"STAGELINK_TIMEOUT", "600",
        "Seconds a blocking call (bootstrap, wait) may take before failing with STAGELINK_ERR_TIMEOUT; 0 waits forever."},
    [SL_ENV_SPIN_US] = {"STAGELINK_SPIN_US", "auto",
        "Microseconds wait() polls before sleeping on the UCX event fd; auto: 50, or 0 when this node runs more ranks than it has CPUs (a spinning rank would hold the core its peer needs). GPU copies and stream events wake no fd: while one is in flight, a rank with a spin above 0 polls it (yielding the CPU) for up to 1 ms, then, like a rank with 0, looks every 50 us."},
    [SL_ENV_MAX_REQUESTS] = {"STAGELINK_MAX_REQUESTS", "1024",
        "Transfers one communicator may have in flight."},
    [SL_ENV_PROGRESS_THREAD] = {"STAGELINK_PROGRESS_THREAD", "1",
        "1: a stagelink thread per communicator progresses UCX while the host is not calling stagelink (computing, in another library's collective, asleep), so a peer's transfer never waits for this rank's next call; it sleeps on the UCX event fd when idle. 0: only the host's calls progress, and a rank that stops calling can stall its peers."},
    [SL_ENV_FINALIZE_GRACE] = {"STAGELINK_FINALIZE_GRACE", "5",
        "Seconds comm_finalize lets sends still in flight complete before it abandons them (receives still in flight are canceled at once); finalize then returns STAGELINK_ERR_ABANDONED naming them. Capped by STAGELINK_TIMEOUT when that is lower."},
    [SL_ENV_NET_DEVICES] = {"STAGELINK_NET_DEVICES", "",
        "UCX network devices for the inter-node path (as UCX_NET_DEVICES), when UCX_NET_DEVICES is unset; default: the RDMA NIC nearest the rank's GPU (rail affinity), else UCX chooses."},
    [SL_ENV_IB_HCA] = {"STAGELINK_IB_HCA", "",
        "RDMA NICs the rail may use, in NCCL_IB_HCA's syntax: a comma list of names, each with an optional :port, matched as prefixes (mlx5 takes every mlx5_*); a leading = matches whole names, a leading ^ excludes the list instead (^=mlx5_8 leaves out exactly mlx5_8). Default: NCCL_IB_HCA's value, else every NIC. InfiniBand and RoCE ports alike."},
    [SL_ENV_NIC_MIN_GBPS] = {"STAGELINK_NIC_MIN_GBPS", "auto",
        "RDMA NICs slower than this many Gb/s are left out of rail selection (storage, management). auto: half the rate of the fastest NIC with an active port; 0 keeps all."},
    [SL_ENV_CHUNK] = {"STAGELINK_CHUNK", "auto",
        "Chunk of the wire format in bytes (equal on all ranks): device messages above it, and scatter_gather shards above it, go in chunks; a TP rank forwards each chunk of its shard to its peers as it lands; also the size of a pinned bounce buffer. auto: 16 MiB when every rank's UCX can hand its device memory over directly on every path it could have (cuda_ipc on the node, and GPU-direct RDMA to other nodes unless the job is on one node; see STAGELINK_GPU_DIRECT), since each chunk costs a rendezvous, which at NVLink and HDR rates should outweigh the copy of 1 MiB (reasoned, not measured there: the one GPU run timed a copy inside one device, docs/gpu.md); else 1 MiB, and in scatter_gather with t > 1 a message above 1 MiB goes in sixteenths of it within 256 KiB to 1 MiB, so a relay trails its shard by little (both ends derive a message's chunk from its size; bounce buffers are one chunk, so 1 MiB unless a 16 MiB chunk stages memory cuda_ipc cannot share)."},
    [SL_ENV_STAGING_BUFFERS] = {"STAGELINK_STAGING_BUFFERS", "auto",
        "Pinned bounce buffers per direction when UCX cannot reach device memory (allocated on the GPU's NUMA node, one copy stream per direction); also the chunks in flight per transfer (1 to 64). auto: the rank's share of 64 MiB a direction per node in chunks, at least 4 and at most 16 (8 of 1 MiB with 8 ranks a node; 4 of 16 MiB)."},
    [SL_ENV_GPU_DIRECT] = {"STAGELINK_GPU_DIRECT", "auto",
        "How device memory moves. auto: to other nodes handed to UCX where an InfiniBand memory domain of the UCX context (the rail's) registers device memory (a peer-memory module UCX detects, or DMA-BUF), else staged through pinned host buffers; to same-node peers over cuda_ipc where the context has it and the memory is legacy-IPC shareable, else staged. require: comm_init fails, with the reason, unless the rank has a GPU, UCX with CUDA, cuda_ipc (with other ranks on its node) and GPU-direct RDMA (in a job of several nodes); set it alike on every rank. off: always staged to other nodes."},
    [SL_ENV_NCCL_LIBRARY] = {"STAGELINK_NCCL_LIBRARY", "",
        "NCCL library to open (default libnccl.so.2 by the loader's search, then the NCCL found at build time)."},
    [SL_ENV_SYSFS_ROOT] = {"STAGELINK_SYSFS_ROOT", "",
        "Directory prefixed to every /sys path stagelink reads (tests point it at fake trees); set, NICs and GPUs come from that tree instead of libibverbs and the PCI bus, and the rail chosen from it is logged and checked across nodes but not handed to UCX (its NICs are fictions)."},
    [SL_ENV_BOOTSTRAP] = {"STAGELINK_BOOTSTRAP", "auto",
        "How init's exchanges meet when the host's config gives no store or allgather. auto: torchrun's agent store where TORCHELASTIC_USE_AGENT_STORE is True (torchrun's TCPStore at MASTER_ADDR:MASTER_PORT); else PMIx where the launcher's rank is this process's PMIX_RANK (srun --mpi=pmix, Open MPI's mpirun; libpmix.so.2 opened at run time); else stagelink's own TCP rendezvous at rank 0 (STAGELINK_BOOTSTRAP_ADDR/_PORT). The launcher's stores serve only a communicator of the launcher's whole job. callbacks, torch-store, pmix or tcp forces one (over the host's callbacks too), and init says why when it cannot be used. Trust under torch-store and pmix is the launcher's (its store, munge); the job secret seals only tcp."},
    [SL_ENV_BOOTSTRAP_ADDR] = {"STAGELINK_BOOTSTRAP_ADDR", "",
        "Address of rank 0's rendezvous listener; default MASTER_ADDR, else 127.0.0.1 on one node."},
    [SL_ENV_BOOTSTRAP_PORT] = {"STAGELINK_BOOTSTRAP_PORT", "",
        "Port of the rendezvous listener; default MASTER_PORT, else 29517."},
    [SL_ENV_BOOTSTRAP_BIND] = {"STAGELINK_BOOTSTRAP_BIND", "",
        "Address rank 0's listener binds to; default the rendezvous address itself (the interface MASTER_ADDR names), so the port is not open on other networks.  0.0.0.0 listens on all."},
    [SL_ENV_LIBRARY] = {"STAGELINK_LIBRARY", "",
        "Path of libstagelink for the Python package (which reads it); default: the directory meson install put it in, then the dynamic loader's search for libstagelink.so.1."},
    [SL_ENV_UCX] = {"STAGELINK_UCX", "auto",
        "Python package (a wheel): which UCX the plugin runs on. auto: the system's where it has an InfiniBand transport and device, else the libucx-cu13 wheel's where installed, else the system's; system; or wheel. A libucp.so.0 already in the process stays, and a choice naming the other UCX is then refused."},
    [SL_ENV_CHECK] = {"STAGELINK_CHECK", "0",
        "Python package: 1 sends each tensor's dtype and shape with it (one 128-byte transfer per TP rank more), so the same bytes received as another dtype or shape raise ShapeMismatchError naming both sides; chunk ids then stop at 1023. With tp_group=, the TP ranks also check that each gather rebuilds the same receive on all of them (one 32-byte all_gather more)."},
    [SL_ENV_JOB_KEY] = {"STAGELINK_JOB_KEY", "",
        "Shared by the ranks of one job; the rendezvous drops clients whose key differs. It tells jobs apart and authenticates nothing (a hello can be replayed): that is STAGELINK_JOB_SECRET's. Default: the launcher's job id (TORCHELASTIC_RUN_ID, SLURM_JOB_ID, OMPI_MCA_ess_base_jobid), else none."},
    [SL_ENV_JOB_SECRET] = {"STAGELINK_JOB_SECRET", "",
        "Secret shared by the ranks of one job (any bytes; 32 random bytes as hex are plenty). Set, the TCP rendezvous admits a rank only after both sides prove they hold it (HMAC-SHA256 over fresh nonces), and seals every later bootstrap message; a wrong proof is dropped and logged. Unset: unauthenticated, as any process that reaches the port with the job key can join. The host's store or allgather, when given, is used instead and is the host's to secure. stagelink_run makes one when it starts the whole job."},
    [SL_ENV_JOB_SECRET_FILE] = {"STAGELINK_JOB_SECRET_FILE", "",
        "File holding the job secret instead (a regular file without group or other permissions; a trailing newline is dropped): a file on a shared file system reaches every node of a Slurm job without the environment. Not with STAGELINK_JOB_SECRET."},
    [SL_ENV_UCX_NET_DEVICES] = {"UCX_NET_DEVICES", "",
        "UCX's own device list; when set, stagelink leaves the choice to it and ignores STAGELINK_NET_DEVICES."},
    [SL_ENV_NCCL_IB_HCA] = {"NCCL_IB_HCA", "",
        "NCCL's NIC list; the default of STAGELINK_IB_HCA, so one setting filters both."},
    [SL_ENV_RANK] = {"RANK", "", "torchrun: global rank."},
    [SL_ENV_WORLD_SIZE] = {"WORLD_SIZE", "", "torchrun: number of ranks."},
    [SL_ENV_LOCAL_RANK] = {"LOCAL_RANK", "", "torchrun: rank on this node."},
    [SL_ENV_LOCAL_WORLD_SIZE] = {"LOCAL_WORLD_SIZE", "", "torchrun: ranks on this node."},
    [SL_ENV_MASTER_ADDR] = {"MASTER_ADDR", "", "torchrun: rendezvous host (rank 0)."},
    [SL_ENV_MASTER_PORT] = {"MASTER_PORT", "", "torchrun: rendezvous port."},
    [SL_ENV_OMPI_RANK] = {"OMPI_COMM_WORLD_RANK", "", "Open MPI mpirun: global rank."},
    [SL_ENV_OMPI_SIZE] = {"OMPI_COMM_WORLD_SIZE", "", "Open MPI mpirun: number of ranks."},
    [SL_ENV_OMPI_LOCAL_RANK] = {"OMPI_COMM_WORLD_LOCAL_RANK", "", "Open MPI mpirun: rank on this node."},
    [SL_ENV_OMPI_LOCAL_SIZE] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "", "Open MPI mpirun: ranks on this node."},
    [SL_ENV_SLURM_PROCID] = {"SLURM_PROCID", "", "Slurm srun: global rank."},
    [SL_ENV_SLURM_NTASKS] = {"SLURM_NTASKS", "", "Slurm srun: number of ranks."},
    [SL_ENV_SLURM_LOCALID] = {"SLURM_LOCALID", "", "Slurm srun: rank on this node."},
    [SL_ENV_SLURM_STEP_TASKS_PER_NODE] = {"SLURM_STEP_TASKS_PER_NODE", "", "Slurm srun: ranks on each node of the step (\"4\", \"4(x2),3\"); the entry of SLURM_NODEID is this node's."},
    [SL_ENV_SLURM_NODEID] = {"SLURM_NODEID", "", "Slurm srun: this node's index in the step."},
    [SL_ENV_TORCHELASTIC_RUN_ID] = {"TORCHELASTIC_RUN_ID", "", "torchrun: job id (a default job key)."},
    [SL_ENV_TORCHELASTIC_USE_AGENT_STORE] = {"TORCHELASTIC_USE_AGENT_STORE", "", "torchrun: True when its agent hosts the job's TCPStore on MASTER_ADDR:MASTER_PORT (the bootstrap then joins it)."},
    [SL_ENV_TORCHELASTIC_RESTART_COUNT] = {"TORCHELASTIC_RESTART_COUNT", "", "torchrun: restarts of the workers so far (part of the agent store's key prefix)."},
    [SL_ENV_PMIX_RANK] = {"PMIX_RANK", "", "PMIx (srun --mpi=pmix, mpirun): this process's rank in its namespace."},
    [SL_ENV_PMIX_NAMESPACE] = {"PMIX_NAMESPACE", "", "PMIx: the job's namespace."},
    [SL_ENV_SLURM_JOB_ID] = {"SLURM_JOB_ID", "", "Slurm: job id (a default job key)."},
    [SL_ENV_OMPI_JOBID] = {"OMPI_MCA_ess_base_jobid", "", "Open MPI mpirun: job id (a default job key)."},
};

int sl_env_is_secret(sl_env_id_t id)
{
    return id == SL_ENV_JOB_SECRET;
}

const char *sl_env_raw(sl_env_id_t id)
{
    const char *value = getenv(sl_env_table[id].name);

    return (value != NULL && value[0] != '\0') ? value : NULL;
}

const char *sl_env_get(sl_env_id_t id)
{
    const char *value = sl_env_raw(id);

    return (value != NULL) ? value : sl_env_table[id].default_value;
}

sl_status_t sl_env_parse_choice(sl_env_id_t id, const char *const *names,
                                int *index, sl_errbuf_t *eb)
{
    const char *value = sl_env_get(id);
    char        choices[256] = "";
    size_t      used         = 0;
    int         i;

    for (i = 0; names[i] != NULL; ++i) {
        if (strcasecmp(value, names[i]) == 0) {
            *index = i;
            return STAGELINK_SUCCESS;
        }
        used += (size_t)snprintf(choices + used, sizeof(choices) - used,
                                 "%s%s", (i > 0) ? ", " : "", names[i]);
        if (used >= sizeof(choices)) {
            used = sizeof(choices) - 1;
        }
    }
    return sl_error(eb, STAGELINK_ERR_CONFIG,
                    "%s=\"%s\" is not a known value; use one of: %s",
                    sl_env_table[id].name, value, choices);
}

sl_status_t sl_parse_long(const char *text, long min, long max, long *value,
                          const char *what, sl_errbuf_t *eb)
{
    char *end;
    long  v;

    errno = 0;
    v     = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < min || v > max) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "%s=\"%s\" is not an integer in [%ld, %ld]", what,
                        text, min, max);
    }
    *value = v;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_env_parse_u64(sl_env_id_t id, uint64_t min, uint64_t max,
                             uint64_t *value, sl_errbuf_t *eb)
{
    const char        *text = sl_env_get(id);
    char              *end;
    unsigned long long v;

    errno = 0;
    v     = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || text[0] == '-' ||
        v < min || v > max) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "%s=\"%s\" is not an integer in [%llu, %llu]",
                        sl_env_table[id].name, text, (unsigned long long)min,
                        (unsigned long long)max);
    }
    *value = v;
    return STAGELINK_SUCCESS;
}

sl_status_t sl_env_parse_seconds(sl_env_id_t id, double *seconds,
                                 sl_errbuf_t *eb)
{
    const char *text = sl_env_get(id);
    char       *end;
    double      v;

    errno = 0;
    v     = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(v) || v < 0) {
        return sl_error(eb, STAGELINK_ERR_CONFIG,
                        "%s=\"%s\" is not a non-negative number of seconds",
                        sl_env_table[id].name, text);
    }
    *seconds = v;
    return STAGELINK_SUCCESS;
}
