/* The environment table and its one parser.  SPDX-License-Identifier: MIT */
#include "sl_env.h"
#include "sl_log.h"

#include <sys/stat.h>

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define SL_CHOICES(...) ((const char *const[]){__VA_ARGS__, NULL})

const sl_env_entry_t sl_env_table[SL_ENV_COUNT] = {
    [SL_ENV_PLUGIN] = {{"STAGELINK_PLUGIN", "ucx",
        "Plugin the loader opens: a short name (ucx -> libstagelink-ucx.so) or a path."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_PLUGIN_PATH] = {{"STAGELINK_PLUGIN_PATH", "",
        "Colon-separated directories searched for plugins before the directory next to libstagelink and the installed plugin directory."},
        .type = SL_ENV_T_DIRS},
    [SL_ENV_MODE] = {{"STAGELINK_MODE", "scatter_gather",
        "Boundary mode where the host's code leaves the choice to it (mode default): scatter_gather or full, which deliver the same tensor, so the same job can be A/B-tested. sharded changes what a receive holds (each rank its own shard), so only the host's code may ask for it: from the variable it fails comm_init. A mode the code set and a variable naming another fail comm_init (STAGELINK_ERR_INVALID_ARG) on every rank."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("scatter_gather", "full", "sharded")},
    [SL_ENV_GATHER] = {{"STAGELINK_GATHER", "auto",
        "Intra-node gather backend: auto (the host's gather callback when its config gives one, else ucx), ucx, nccl (GPU buffers by NCCL, issued in wait: every TP rank waits its receives in one order, and test completes none), or host (the callback, required)."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("auto", "ucx", "nccl", "host")},
    [SL_ENV_DEBUG] = {{"STAGELINK_DEBUG", "WARN",
        "Log level: NONE, WARN (errors only), INFO or TRACE."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("NONE", "WARN", "INFO", "TRACE")},
    [SL_ENV_DEBUG_SUBSYS] = {{"STAGELINK_DEBUG_SUBSYS", "ALL",
        "Comma list of subsystems to log: INIT, BOOT, NET, GATHER, ENV or ALL."},
        .type = SL_ENV_T_LIST, .choices = SL_CHOICES("INIT", "BOOT", "NET", "GATHER", "ENV", "ALL")},
    [SL_ENV_NODE_ID] = {{"STAGELINK_NODE_ID", "",
        "Override of the node identity (default: hostname, the kernel's boot id and the network namespace)."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_TIMEOUT] = {{"STAGELINK_TIMEOUT", "600",
        "Seconds a blocking call (bootstrap, wait) may take before failing with STAGELINK_ERR_TIMEOUT; 0 waits forever."},
        .type = SL_ENV_T_SECONDS},
    [SL_ENV_SPIN_US] = {{"STAGELINK_SPIN_US", "auto",
        "Microseconds wait() may poll idle workers (since the last event of any transfer on them) before sleeping on the UCX event fd, at most: while bytes keep moving the wait polls on, and a pause longer than the window sleeps. The window adapts after KVM's halt polling (shrink 2): it doubles while events end its sleeps within the cap (polling would have been cheaper than the wake-up) and halves when a sleep lasts longer or times out, or the kernel preempted the waiting thread (its core has other work). auto: 200 (KVM's default), or 0 when this node runs more ranks than it has CPUs (a spinning rank would hold the core its peer needs). GPU copies and stream events wake no fd: while one is in flight, a rank with a spin above 0 polls it (yielding the CPU) for up to 1 ms, then, like a rank with 0, looks every 50 us."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_AUTO, .min = 0, .max = 10000000},
    [SL_ENV_MAX_REQUESTS] = {{"STAGELINK_MAX_REQUESTS", "1024",
        "Transfers one communicator may have in flight."},
        .type = SL_ENV_T_INT, .min = 1, .max = 1u << 20},
    [SL_ENV_PROGRESS_THREAD] = {{"STAGELINK_PROGRESS_THREAD", "1",
        "On (1, yes, on, true): a stagelink thread per communicator progresses UCX while the host is not calling stagelink (computing, in another library's collective, asleep), so a peer's transfer never waits for this rank's next call; it sleeps on the UCX event fd when idle. Off (0, no, off, false): only the host's calls progress, and a rank that stops calling can stall its peers."},
        .type = SL_ENV_T_BOOL},
    [SL_ENV_FINALIZE_GRACE] = {{"STAGELINK_FINALIZE_GRACE", "5",
        "Seconds comm_finalize lets sends still in flight complete before it abandons them (receives still in flight are canceled at once); finalize then returns STAGELINK_ERR_ABANDONED naming them. Capped by STAGELINK_TIMEOUT when that is lower."},
        .type = SL_ENV_T_SECONDS},
    [SL_ENV_NET_DEVICES] = {{"STAGELINK_NET_DEVICES", "",
        "UCX network devices for the inter-node path (as UCX_NET_DEVICES), when UCX_NET_DEVICES is unset; default: the RDMA NIC nearest the rank's GPU (rail affinity), else UCX chooses."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_IB_HCA] = {{"STAGELINK_IB_HCA", "",
        "RDMA NICs the rail may use, in NCCL_IB_HCA's syntax: a comma list of names, each with an optional :port, matched as prefixes (mlx5 takes every mlx5_*); a leading = matches whole names, a leading ^ excludes the list instead (^=mlx5_8 leaves out exactly mlx5_8). Default: NCCL_IB_HCA's value, else every NIC. InfiniBand and RoCE ports alike."},
        .type = SL_ENV_T_NICS},
    [SL_ENV_NIC_MIN_GBPS] = {{"STAGELINK_NIC_MIN_GBPS", "auto",
        "RDMA NICs slower than this many Gb/s are left out of rail selection (storage, management). auto: half the rate of the fastest NIC with an active port; 0 keeps all."},
        .type = SL_ENV_T_NUMBER, .flags = SL_ENV_F_AUTO},
    [SL_ENV_CHUNK] = {{"STAGELINK_CHUNK", "auto",
        "Chunk of the wire format in bytes, 4K to 1G (1048576, 1M, 1MiB, 1024K alike; equal on all ranks): device messages above it, and scatter_gather shards above it, go in chunks; a TP rank forwards each chunk of its shard to its peers as it lands; also the size of a pinned bounce buffer. auto: 16 MiB when every rank's UCX can hand its device memory over directly on every path it could have (cuda_ipc on the node, and GPU-direct RDMA to other nodes unless the job is on one node; see STAGELINK_GPU_DIRECT), since each chunk costs a rendezvous, which at NVLink and HDR rates should outweigh the copy of 1 MiB (reasoned, not measured there: the one GPU run timed a copy inside one device, docs/gpu.md); else 1 MiB, and in scatter_gather with t > 1 a message above 1 MiB goes in sixteenths of it within 256 KiB to 1 MiB, so a relay trails its shard by little (both ends derive a message's chunk from its size; bounce buffers are one chunk, so 1 MiB unless a 16 MiB chunk stages memory cuda_ipc cannot share)."},
        .type = SL_ENV_T_SIZE, .flags = SL_ENV_F_AUTO, .min = 4096, .max = 1u << 30},
    [SL_ENV_STAGING_BUFFERS] = {{"STAGELINK_STAGING_BUFFERS", "auto",
        "Pinned bounce buffers per direction when UCX cannot reach device memory (allocated on the GPU's NUMA node, one copy stream per direction); also the chunks in flight per transfer (1 to 64). auto: the rank's share of 64 MiB a direction per node in chunks, at least 4 and at most 16 (8 of 1 MiB with 8 ranks a node; 4 of 16 MiB)."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_AUTO, .min = 1, .max = 64},
    [SL_ENV_GPU_DIRECT] = {{"STAGELINK_GPU_DIRECT", "auto",
        "How device memory moves. auto: to other nodes handed to UCX where an InfiniBand memory domain of the UCX context (the rail's) registers device memory (a peer-memory module UCX detects, or DMA-BUF), else staged through pinned host buffers; to same-node peers over cuda_ipc where the context has it and the memory is legacy-IPC shareable, else staged. require: comm_init fails, with the reason, unless the rank has a GPU, UCX with CUDA, cuda_ipc (with other ranks on its node) and GPU-direct RDMA (in a job of several nodes); set it alike on every rank. off: always staged to other nodes."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("auto", "require", "off")},
    [SL_ENV_NCCL_LIBRARY] = {{"STAGELINK_NCCL_LIBRARY", "",
        "NCCL library to open (default libnccl.so.2 by the loader's search, then the NCCL found at build time)."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_SYSFS_ROOT] = {{"STAGELINK_SYSFS_ROOT", "",
        "Directory prefixed to every /sys path stagelink reads (tests point it at fake trees); set, NICs and GPUs come from that tree instead of libibverbs and the PCI bus, and the rail chosen from it is logged and checked across nodes but not handed to UCX (its NICs are fictions)."},
        .type = SL_ENV_T_DIRS},
    [SL_ENV_BOOTSTRAP] = {{"STAGELINK_BOOTSTRAP", "auto",
        "How init's exchanges meet when the host's config gives no store or allgather. auto: torchrun's agent store where TORCHELASTIC_USE_AGENT_STORE is True (torchrun's TCPStore at MASTER_ADDR:MASTER_PORT); else PMIx where the launcher's rank is this process's PMIX_RANK (srun --mpi=pmix, Open MPI's mpirun; libpmix.so.2 opened at run time); else stagelink's own TCP rendezvous at rank 0 (STAGELINK_BOOTSTRAP_ADDR/_PORT). The launcher's stores serve only a communicator of the launcher's whole job. callbacks, torch-store, pmix or tcp forces one (over the host's callbacks too), and init says why when it cannot be used. Trust under torch-store and pmix is the launcher's (its store, munge); the job secret seals only tcp."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("auto", "callbacks", "torch-store", "pmix", "tcp")},
    [SL_ENV_BOOTSTRAP_ADDR] = {{"STAGELINK_BOOTSTRAP_ADDR", "",
        "Address of rank 0's rendezvous listener; default MASTER_ADDR, else 127.0.0.1 on one node."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_BOOTSTRAP_PORT] = {{"STAGELINK_BOOTSTRAP_PORT", "",
        "Port of the rendezvous listener; default MASTER_PORT, else 29517."},
        .type = SL_ENV_T_INT, .min = 1, .max = 65535},
    [SL_ENV_BOOTSTRAP_BIND] = {{"STAGELINK_BOOTSTRAP_BIND", "",
        "Address rank 0's listener binds to; default the rendezvous address itself (the interface MASTER_ADDR names), so the port is not open on other networks.  0.0.0.0 listens on all."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_LIBRARY] = {{"STAGELINK_LIBRARY", "",
        "Path of libstagelink for the Python package (which reads it); default: the directory meson install put it in, then the dynamic loader's search for libstagelink.so.1."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_UCX] = {{"STAGELINK_UCX", "auto",
        "Python package (a wheel): which UCX the plugin runs on. auto: the system's where it has an InfiniBand transport and device, else the libucx-cu13 wheel's where installed, else the system's; system; or wheel. A libucp.so.0 already in the process stays, and a choice naming the other UCX is then refused."},
        .type = SL_ENV_T_ENUM, .choices = SL_CHOICES("auto", "system", "wheel")},
    [SL_ENV_CHECK] = {{"STAGELINK_CHECK", "0",
        "Python package: on (1, yes, on, true) sends each tensor's dtype and shape with it (one 128-byte transfer per TP rank more), so the same bytes received as another dtype or shape raise ShapeMismatchError naming both sides; chunk ids then stop at 1023. With tp_group=, the TP ranks also check that each gather rebuilds the same receive on all of them (one 32-byte all_gather more)."},
        .type = SL_ENV_T_BOOL},
    [SL_ENV_WARN_UNKNOWN_ENV] = {{"STAGELINK_WARN_UNKNOWN_ENV", "1",
        "1: comm_init names, once per process, each STAGELINK_ variable of the environment that stagelink does not know, with the nearest known name (as UCX_WARN_UNUSED_ENV_VARS); 0 keeps quiet."},
        .type = SL_ENV_T_BOOL},
    [SL_ENV_TEST_DEVICE] = {{"STAGELINK_TEST_DEVICE", "cpu",
        "Tests and benches (Python): where the model and data live, cpu or cuda (the rank's GPU)."},
        .type = SL_ENV_T_ENUM, .flags = SL_ENV_F_TOOLS, .choices = SL_CHOICES("cpu", "cuda")},
    [SL_ENV_RANKS_PER_NODE] = {{"STAGELINK_RANKS_PER_NODE", "1",
        "tools/lab/stagelink_two_node.sh and the tests that use it: ranks started in each of the two simulated nodes."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_TOOLS, .min = 1, .max = 64},
    [SL_ENV_UCX_CUDA] = {{"STAGELINK_UCX_CUDA", "/opt/ucx-cuda",
        "CI: prefix of the UCX built with CUDA (tools/build-ucx-cuda.sh) that test/run-all.sh runs the plugin against besides the system's UCX."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_TOOLS},
    [SL_ENV_PYTHON] = {{"STAGELINK_PYTHON", "",
        "tools/make-venv.sh: the interpreter .venv is made from (default: python3.12, then python3.13, on PATH or pyenv's)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_TOOLS},
    [SL_ENV_NO_VENV] = {{"STAGELINK_NO_VENV", "0",
        "tools/install-deps.sh: 1 installs the Debian packages only, without .venv."},
        .type = SL_ENV_T_BOOL, .flags = SL_ENV_F_TOOLS},
    [SL_ENV_IN_CLEAN_ROOT] = {{"STAGELINK_IN_CLEAN_ROOT", "0",
        "test/install: set by the test itself once it runs in its private mount namespace (not for users)."},
        .type = SL_ENV_T_BOOL, .flags = SL_ENV_F_TOOLS},
    [SL_ENV_STRESS_DIR] = {{"STAGELINK_STRESS_DIR", "",
        "stagelink_stress: directory its ranks leave their progress files in (set by the stress tests)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_TOOLS},
    [SL_ENV_STRESS_FD] = {{"STAGELINK_STRESS_FD", "",
        "stagelink_stress: file descriptor its ranks report on (set by the stress tests)."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_TOOLS, .min = 0, .max = INT_MAX},
    [SL_ENV_JOB_KEY] = {{"STAGELINK_JOB_KEY", "",
        "Shared by the ranks of one job; the rendezvous drops clients whose key differs. It tells jobs apart and authenticates nothing (a hello can be replayed): that is STAGELINK_JOB_SECRET's. Default: the launcher's job id (TORCHELASTIC_RUN_ID unless torchrun's default \"none\", SLURM_JOB_ID, OMPI_MCA_ess_base_jobid), else none."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_JOB_SECRET] = {{"STAGELINK_JOB_SECRET", "",
        "Secret shared by the ranks of one job (any bytes; 32 random bytes as hex are plenty). Set, the TCP rendezvous admits a rank only after both sides prove they hold it (HMAC-SHA256 over fresh nonces), and seals every later bootstrap message; a wrong proof is dropped and logged. Unset: unauthenticated, as any process that reaches the port with the job key can join. The host's store or allgather, when given, is used instead and is the host's to secure. stagelink_run makes one when it starts the whole job."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_SECRET},
    [SL_ENV_JOB_SECRET_FILE] = {{"STAGELINK_JOB_SECRET_FILE", "",
        "File holding the job secret instead (a regular file without group or other permissions; a trailing newline is dropped): a file on a shared file system reaches every node of a Slurm job without the environment. Not with STAGELINK_JOB_SECRET."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_UCX_NET_DEVICES] = {{"UCX_NET_DEVICES", "",
        "UCX's own device list; when set, stagelink leaves the choice to it and ignores STAGELINK_NET_DEVICES."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_UCX_TLS] = {{"UCX_TLS", "",
        "UCX's own transport list; when set, same-node peers use the transports it names instead of the shared-memory ones stagelink picks."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_UCX_MODULE_DIR] = {{"UCX_MODULE_DIR", "",
        "UCX's module directory; where set, stagelink_info looks there for UCX's CUDA module (libuct_cuda) to tell whether the UCX in use was built with CUDA."},
        .type = SL_ENV_T_STRING},
    [SL_ENV_NCCL_IB_HCA] = {{"NCCL_IB_HCA", "",
        "NCCL's NIC list; the default of STAGELINK_IB_HCA, so one setting filters both."},
        .type = SL_ENV_T_NICS},
    [SL_ENV_CUDA_DEVICE_MAX_CONNECTIONS] = {{"CUDA_DEVICE_MAX_CONNECTIONS", "",
        "CUDA's hardware queues per device (Megatron sets 1 for its overlap features, which puts every stream on one queue): at 1, STAGELINK_GATHER=nccl is refused until a GPU has shown a collective issued in wait safe there (docs/gpu.md)."},
        .type = SL_ENV_T_INT, .min = 1, .max = INT_MAX},
    [SL_ENV_NCCL_MULTI_RANK_GPU_ENABLE] = {{"NCCL_MULTI_RANK_GPU_ENABLE", "",
        "NCCL's (2.30.3 and later) consent to several ranks of a communicator on one GPU: where every rank of a TP group sets it and has such an NCCL, STAGELINK_GATHER=nccl takes TP ranks sharing a GPU (a one-GPU test machine) instead of refusing them."},
        .type = SL_ENV_T_BOOL},
    [SL_ENV_RANK] = {{"RANK", "", "torchrun: global rank."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_WORLD_SIZE] = {{"WORLD_SIZE", "", "torchrun: number of ranks."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = INT_MAX},
    [SL_ENV_LOCAL_RANK] = {{"LOCAL_RANK", "", "torchrun: rank on this node."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_LOCAL_WORLD_SIZE] = {{"LOCAL_WORLD_SIZE", "", "torchrun: ranks on this node."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = INT_MAX},
    [SL_ENV_MASTER_ADDR] = {{"MASTER_ADDR", "", "torchrun: rendezvous host (rank 0)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_MASTER_PORT] = {{"MASTER_PORT", "", "torchrun: rendezvous port."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = 65535},
    [SL_ENV_OMPI_RANK] = {{"OMPI_COMM_WORLD_RANK", "", "Open MPI mpirun: global rank."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_OMPI_SIZE] = {{"OMPI_COMM_WORLD_SIZE", "", "Open MPI mpirun: number of ranks."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = INT_MAX},
    [SL_ENV_OMPI_LOCAL_RANK] = {{"OMPI_COMM_WORLD_LOCAL_RANK", "", "Open MPI mpirun: rank on this node."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_OMPI_LOCAL_SIZE] = {{"OMPI_COMM_WORLD_LOCAL_SIZE", "", "Open MPI mpirun: ranks on this node."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = INT_MAX},
    [SL_ENV_SLURM_PROCID] = {{"SLURM_PROCID", "", "Slurm srun: global rank."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_SLURM_STEP_NUM_TASKS] = {{"SLURM_STEP_NUM_TASKS", "", "Slurm srun: number of ranks of the step (srun's alone: a batch script, where SLURM_PROCID is 0 too, has none)."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 1, .max = INT_MAX},
    [SL_ENV_SLURM_LOCALID] = {{"SLURM_LOCALID", "", "Slurm srun: rank on this node."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_SLURM_STEP_TASKS_PER_NODE] = {{"SLURM_STEP_TASKS_PER_NODE", "", "Slurm srun: ranks on each node of the step (\"4\", \"4(x2),3\"); the entry of SLURM_NODEID is this node's."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_SLURM_NODEID] = {{"SLURM_NODEID", "", "Slurm srun: this node's index in the step."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_TORCHELASTIC_RUN_ID] = {{"TORCHELASTIC_RUN_ID", "", "torchrun: job id (a default job key)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_TORCHELASTIC_USE_AGENT_STORE] = {{"TORCHELASTIC_USE_AGENT_STORE", "", "torchrun: True when its agent hosts the job's TCPStore on MASTER_ADDR:MASTER_PORT (the bootstrap then joins it)."},
        .type = SL_ENV_T_BOOL, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_TORCHELASTIC_RESTART_COUNT] = {{"TORCHELASTIC_RESTART_COUNT", "", "torchrun: restarts of the workers so far (part of the agent store's key prefix)."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_PMIX_RANK] = {{"PMIX_RANK", "", "PMIx (srun --mpi=pmix, mpirun): this process's rank in its namespace."},
        .type = SL_ENV_T_INT, .flags = SL_ENV_F_LAUNCHER, .min = 0, .max = INT_MAX},
    [SL_ENV_PMIX_NAMESPACE] = {{"PMIX_NAMESPACE", "", "PMIx: the job's namespace."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_SLURM_JOB_ID] = {{"SLURM_JOB_ID", "", "Slurm: job id (a default job key)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
    [SL_ENV_OMPI_JOBID] = {{"OMPI_MCA_ess_base_jobid", "", "Open MPI mpirun: job id (a default job key)."},
        .type = SL_ENV_T_STRING, .flags = SL_ENV_F_LAUNCHER},
};


const char *sl_env_raw(sl_env_id_t id)
{
    const char *value = getenv(sl_env_table[id].pub.name);

    return (value != NULL && value[0] != '\0') ? value : NULL;
}

const char *sl_env_get(sl_env_id_t id)
{
    const char *value = sl_env_raw(id);

    return (value != NULL) ? value : sl_env_table[id].pub.default_value;
}

sl_env_id_t sl_env_find(const char *name)
{
    int id;

    for (id = 0; id < SL_ENV_COUNT; ++id) {
        if (strcmp(sl_env_table[id].pub.name, name) == 0) {
            break;
        }
    }
    return (sl_env_id_t)id;
}

static int sl_env_choice(const char *const *choices, const char *text,
                         size_t len)
{
    int i;

    for (i = 0; choices[i] != NULL; ++i) {
        if (strlen(choices[i]) == len && strncasecmp(choices[i], text, len) == 0) {
            return i;
        }
    }
    return -1;
}

/* "a, b or c" into buf. */
static const char *sl_env_choices_text(const char *const *choices, char *buf,
                                       size_t len)
{
    size_t used = 0;
    int    i;

    buf[0] = '\0';
    for (i = 0; choices[i] != NULL && used < len; ++i) {
        used += (size_t)snprintf(buf + used, len - used, "%s%s",
                                 (i == 0) ? "" : (choices[i + 1] == NULL)
                                                     ? " or " : ", ",
                                 choices[i]);
    }
    return buf;
}

static int sl_env_parse_u64_text(const char *text, uint64_t *v, char **end)
{
    unsigned long long u;

    if (text[0] < '0' || text[0] > '9') {
        return 0;
    }
    errno = 0;
    u     = strtoull(text, end, 10);
    *v    = u;
    return errno == 0;
}

static int sl_env_parse_size_text(const char *text, uint64_t *v)
{
    static const char units[] = "KMGT";
    const char       *u;
    char             *end;
    int               shift = 0;

    if (!sl_env_parse_u64_text(text, v, &end)) {
        return 0;
    }
    if (*end != '\0') {
        u = strchr(units, (*end >= 'a' && *end <= 'z') ? *end - 32 : *end);
        if (u == NULL || *u == '\0') {
            return (strcasecmp(end, "B") == 0);
        }
        shift = 10 * (int)(u - units + 1);
        ++end;
        if (*end != '\0' && strcasecmp(end, "B") != 0 &&
            strcasecmp(end, "iB") != 0) {
            return 0;
        }
        if (*v > (UINT64_MAX >> shift)) {
            return 0;
        }
        *v <<= shift;
    }
    return 1;
}

/* A year: past it a deadline would overflow a poll's milliseconds; a wait
 * that long is meant as forever, which 0 says. */
#define SL_ENV_SECONDS_MAX (365.0 * 86400.0)

static int sl_env_parse_seconds_text(const char *text, double *v)
{
    static const struct {
        const char *suffix;
        double      scale;
    } units[] = {{"", 1.0}, {"s", 1.0}, {"ms", 1e-3}, {"us", 1e-6},
                 {"ns", 1e-9}, {"m", 60.0}, {"h", 3600.0}};
    char  *end;
    size_t i;

    if (!((text[0] >= '0' && text[0] <= '9') || text[0] == '.')) {
        return 0;
    }
    errno = 0;
    *v    = strtod(text, &end);
    if (errno != 0 || !isfinite(*v)) {
        return 0;
    }
    for (i = 0; i < SL_ARRAY_SIZE(units); ++i) {
        if (strcasecmp(end, units[i].suffix) == 0) {
            *v *= units[i].scale;
            return *v <= SL_ENV_SECONDS_MAX;
        }
    }
    return 0;
}

/* NCCL_IB_HCA's grammar: [^][=]name[:port][,name[:port]...]. */
static int sl_env_parse_nics_text(const char *text)
{
    const char *p = text + (text[0] == '^');

    p += (p[0] == '=');
    if (*p == '\0') {
        return 0;
    }
    for (;;) {
        size_t len  = strcspn(p, ",");
        size_t name = strcspn(p, ",:");
        char  *end;
        long   port;

        if (name == 0) {
            return 0;
        }
        if (name < len) {
            errno = 0;
            port  = strtol(p + name + 1, &end, 10);
            if (errno != 0 || end != p + len || end == p + name + 1 ||
                port < 1 || port > 255) {
                return 0;
            }
        }
        if (p[len] == '\0') {
            return 1;
        }
        p += len + 1;
    }
}

void sl_env_forms(sl_env_id_t id, char *buf, size_t len)
{
    const sl_env_entry_t *e = &sl_env_table[id];
    char        choices[256];
    const char *aut = (e->flags & SL_ENV_F_AUTO) ? ", or auto" : "";

    switch (e->type) {
    case SL_ENV_T_BOOL:
        snprintf(buf, len, "1, y, yes, on or true; 0, n, no, off or false (any case)");
        break;
    case SL_ENV_T_INT:
        snprintf(buf, len, "an integer from %llu to %llu%s",
                 (unsigned long long)e->min, (unsigned long long)e->max, aut);
        break;
    case SL_ENV_T_SIZE:
        snprintf(buf, len, "a size from %llu to %llu bytes, as bytes or "
                 "with K, M, G or T (powers of 1024: 64K, 1M, 1MiB)%s",
                 (unsigned long long)e->min, (unsigned long long)e->max, aut);
        break;
    case SL_ENV_T_SECONDS:
        snprintf(buf, len, "non-negative seconds up to a year: 2.5, 2.5s, "
                 "500ms, 100us or 1m%s", aut);
        break;
    case SL_ENV_T_NUMBER:
        snprintf(buf, len, "a non-negative number%s", aut);
        break;
    case SL_ENV_T_ENUM:
        snprintf(buf, len, "one of %s (any case)",
                 sl_env_choices_text(e->choices, choices, sizeof(choices)));
        break;
    case SL_ENV_T_LIST:
        snprintf(buf, len, "a comma list of %s (any case)",
                 sl_env_choices_text(e->choices, choices, sizeof(choices)));
        break;
    case SL_ENV_T_DIRS:
        snprintf(buf, len, "existing directories, separated by colons "
                 "(empty entries are skipped)");
        break;
    case SL_ENV_T_NICS:
        snprintf(buf, len, "NIC names with an optional :port, separated by "
                 "commas, after an optional ^ (exclude) and = (whole names): "
                 "mlx5_0:1,mlx5_1 or ^=mlx5_8");
        break;
    case SL_ENV_T_STRING:
        snprintf(buf, len, "any text");
        break;
    }
}

sl_status_t sl_env_parse_text(sl_env_id_t id, const char *text,
                              sl_env_value_t *value, sl_errbuf_t *eb)
{
    const sl_env_entry_t *e = &sl_env_table[id];
    char                  forms[512], why[160] = "";
    int                   ok = 1, i;

    memset(value, 0, sizeof(*value));
    value->text = text;
    if (text == NULL || text[0] == '\0') {
        value->text = NULL;
        return STAGELINK_SUCCESS;
    }
    if ((e->flags & SL_ENV_F_AUTO) && strcasecmp(text, "auto") == 0) {
        value->is_auto = 1;
        return STAGELINK_SUCCESS;
    }
    switch (e->type) {
    case SL_ENV_T_BOOL: {
        static const char *const words[] = {"0", "no", "off", "false", "n",
                                            "1", "yes", "on", "true", "y",
                                            NULL};

        i           = sl_env_choice(words, text, strlen(text));
        ok          = i >= 0;
        value->flag = i >= 5;
        break;
    }
    case SL_ENV_T_INT: {
        char *end;

        ok = sl_env_parse_u64_text(text, &value->u64, &end) && *end == '\0' &&
             value->u64 >= e->min && value->u64 <= e->max;
        break;
    }
    case SL_ENV_T_SIZE:
        ok = sl_env_parse_size_text(text, &value->u64) &&
             value->u64 >= e->min && value->u64 <= e->max;
        break;
    case SL_ENV_T_SECONDS:
        ok = sl_env_parse_seconds_text(text, &value->real);
        break;
    case SL_ENV_T_NUMBER: {
        char *end;

        errno       = 0;
        value->real = strtod(text, &end);
        ok = ((text[0] >= '0' && text[0] <= '9') || text[0] == '.') &&
             errno == 0 && end != text && *end == '\0' &&
             isfinite(value->real) && value->real >= 0.0 &&
             strpbrk(text, "xX") == NULL;
        break;
    }
    case SL_ENV_T_ENUM:
        value->choice = sl_env_choice(e->choices, text, strlen(text));
        ok            = value->choice >= 0;
        break;
    case SL_ENV_T_LIST: {
        const char *p = text;

        for (;;) {
            size_t len = strcspn(p, ",");

            i = sl_env_choice(e->choices, p, len);
            if (i < 0) {
                ok = 0;
                snprintf(why, sizeof(why), " (\"%.*s\" is none of them)",
                         (int)(len < 40 ? len : 40), p);
                break;
            }
            value->mask |= 1u << i;
            if (p[len] == '\0') {
                break;
            }
            p += len + 1;
        }
        break;
    }
    case SL_ENV_T_DIRS: {
        const char *p = text;
        struct stat st;
        char        dir[4096];

        for (;;) {
            size_t len = strcspn(p, ":");

            /* Empty entries are skipped, as PATH's are ("new:$OLD"). */
            snprintf(dir, sizeof(dir), "%.*s", (int)len, p);
            if (len > 0 && (len >= sizeof(dir) || stat(dir, &st) != 0 ||
                            !S_ISDIR(st.st_mode))) {
                int err = (len < sizeof(dir) && stat(dir, &st) == 0) ? ENOTDIR
                                                                     : errno;

                ok = 0;
                snprintf(why, sizeof(why), " (\"%.100s\": %s)", dir,
                         strerror(err));
                break;
            }
            if (p[len] == '\0') {
                break;
            }
            p += len + 1;
        }
        break;
    }
    case SL_ENV_T_NICS:
        ok = sl_env_parse_nics_text(text);
        break;
    case SL_ENV_T_STRING:
        break;
    }
    if (ok) {
        return STAGELINK_SUCCESS;
    }
    sl_env_forms(id, forms, sizeof(forms));
    return sl_error(eb, STAGELINK_ERR_CONFIG, "%s=\"%.200s\" is not valid%s; "
                    "use %s", e->pub.name, text, why, forms);
}

sl_status_t sl_env_parse(sl_env_id_t id, sl_env_value_t *value,
                         sl_errbuf_t *eb)
{
    const char *text = sl_env_raw(id);

    if (text != NULL) {
        SL_CHECK(sl_env_parse_text(id, text, value, eb));
        value->set = 1;
        return STAGELINK_SUCCESS;
    }
    return sl_env_parse_text(id, sl_env_table[id].pub.default_value, value, eb);
}

sl_status_t sl_env_check_all(sl_errbuf_t *eb)
{
    sl_env_value_t value;
    int            id;

    for (id = 0; id < SL_ENV_COUNT; ++id) {
        if (!(sl_env_table[id].flags & (SL_ENV_F_LAUNCHER | SL_ENV_F_TOOLS))) {
            SL_CHECK(sl_env_parse((sl_env_id_t)id, &value, eb));
        }
    }
    return STAGELINK_SUCCESS;
}

/* Edit distance, case-insensitive: the nearest known name of a typo. */
static size_t sl_env_distance(const char *a, const char *b)
{
    size_t row[128], la = strlen(a), lb = strlen(b), i, j, diag, up;

    if (la >= SL_ARRAY_SIZE(row) || lb >= SL_ARRAY_SIZE(row)) {
        return SIZE_MAX;
    }
    for (j = 0; j <= lb; ++j) {
        row[j] = j;
    }
    for (i = 1; i <= la; ++i) {
        diag   = row[0];
        row[0] = i;
        for (j = 1; j <= lb; ++j) {
            up     = row[j];
            row[j] = diag + (toupper((unsigned char)a[i - 1]) !=
                             toupper((unsigned char)b[j - 1]));
            if (up + 1 < row[j]) {
                row[j] = up + 1;
            }
            if (row[j - 1] + 1 < row[j]) {
                row[j] = row[j - 1] + 1;
            }
            diag = up;
        }
    }
    return row[lb];
}

int sl_env_unknown(char *buf, size_t len)
{
    extern char **environ;
    char        **var;
    size_t        used = 0;
    int           count = 0;

    if (len > 0) {
        buf[0] = '\0';
    }
    for (var = environ; var != NULL && *var != NULL; ++var) {
        char   name[128];
        size_t nlen = strcspn(*var, "="), best_d = SIZE_MAX, d;
        int    id, best = -1;

        if (nlen >= sizeof(name) || strncasecmp(*var, "STAGELINK_", 10) != 0) {
            continue;
        }
        snprintf(name, sizeof(name), "%.*s", (int)nlen, *var);
        if (sl_env_find(name) != SL_ENV_COUNT) {
            continue;
        }
        for (id = 0; id < SL_ENV_COUNT; ++id) {
            d = sl_env_distance(name, sl_env_table[id].pub.name);
            if (d < best_d) {
                best_d = d;
                best   = id;
            }
        }
        ++count;
        if (used < len) {
            used += (size_t)snprintf(buf + used, len - used,
                                     "%s%s is not a stagelink variable%s%s%s",
                                     used ? "\n" : "", name,
                                     (best >= 0 && best_d <= 4) ? "; did you mean "
                                                                : "",
                                     (best >= 0 && best_d <= 4)
                                         ? sl_env_table[best].pub.name : "",
                                     (best >= 0 && best_d <= 4) ? "?" : "");
        }
    }
    return count;
}

static void sl_env_warn_unknown_once(void)
{
    char           lines[4096], *line, *save = NULL;
    sl_env_value_t on;
    sl_errbuf_t    eb;

    if (sl_env_parse(SL_ENV_WARN_UNKNOWN_ENV, &on, &eb) != STAGELINK_SUCCESS ||
        !on.flag || sl_env_unknown(lines, sizeof(lines)) == 0) {
        return;
    }
    for (line = strtok_r(lines, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        SL_WARN(SL_SUBSYS_ENV, "%s (STAGELINK_WARN_UNKNOWN_ENV=0 keeps quiet)",
                line);
    }
}

void sl_env_warn_unknown(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;

    pthread_once(&once, sl_env_warn_unknown_once);
}
