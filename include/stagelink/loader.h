/*
 * Host side of stagelink: find, dlopen and check a plugin, and list the
 * environment variables stagelink reads.  Link `libstagelink` (pkg-config
 * name `stagelink`); the plugin itself is only ever reached through dlopen.
 *
 * Copyright (c) 2026 The stagelink developers. SPDX-License-Identifier: MIT
 */
#ifndef STAGELINK_LOADER_H
#define STAGELINK_LOADER_H

#include <stagelink/stagelink.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A loaded plugin library. */
typedef struct stagelink_loader stagelink_loader_t;

/**
 * Loads a plugin.  `name` is a short name ("ucx" -> libstagelink-ucx.so) or
 * a path (anything containing '/'); NULL means $STAGELINK_PLUGIN, default
 * "ucx".  A short name is looked for in each directory of
 * $STAGELINK_PLUGIN_PATH, then in the installed plugin directory, then by
 * the dynamic loader's own search (LD_LIBRARY_PATH, ...).
 *
 * The library is opened with RTLD_NOW|RTLD_LOCAL, `stagelink_plugin_v1` is
 * resolved and its ABI version and size are checked (a v1 vtable must
 * reach at least through `get_counters`).  On failure `err`
 * (may be NULL) receives a sentence naming every path tried or both
 * versions, and *loader is NULL.
 */
STAGELINK_EXPORT stagelink_status_t stagelink_loader_open(const char *name,
                                         stagelink_loader_t **loader,
                                         char *err, size_t errlen);

/**
 * The checked vtable of a loaded plugin: the loader's own full-size copy,
 * valid until stagelink_loader_close.  Every entry the plugin has is the
 * plugin's own; a plugin built against an older v1 header (a smaller
 * struct_size, which the copy keeps) gets loader stubs for the entries it
 * predates, answering STAGELINK_ERR_UNSUPPORTED.
 */
STAGELINK_EXPORT const stagelink_plugin_v1_t *
stagelink_loader_plugin(const stagelink_loader_t *loader);

/** Path the plugin was loaded from. */
STAGELINK_EXPORT const char *stagelink_loader_path(const stagelink_loader_t *loader);

/**
 * `plugin->comm_init` with the plugin's error sentence copied into `err`
 * on failure, prefixed with the plugin's name and path.
 */
STAGELINK_EXPORT stagelink_status_t stagelink_loader_comm_init(const stagelink_loader_t *loader,
                                              const stagelink_config_t *config,
                                              stagelink_comm_t **comm,
                                              char *err, size_t errlen);

/**
 * The plugins (libstagelink-NAME.so) in the directories stagelink_loader_open
 * searches by short name, in its order (STAGELINK_PLUGIN_PATH, next to
 * libstagelink, the installed plugin directory), one path a line.  Returns
 * the bytes needed (as snprintf).
 */
STAGELINK_EXPORT size_t stagelink_plugins_found(char *buf, size_t len);

/** dlcloses the plugin.  Finalize its communicators first. */
STAGELINK_EXPORT void stagelink_loader_close(stagelink_loader_t *loader);

/** One environment variable stagelink reads. */
typedef struct stagelink_env_var {
    const char *name;
    const char *default_value; /**< "" when unset means "not used" */
    const char *description;
} stagelink_env_var_t;

/** Number of entries in the environment table. */
STAGELINK_EXPORT size_t stagelink_env_count(void);

/** Entry `index` of the environment table, or NULL past the end. */
STAGELINK_EXPORT const stagelink_env_var_t *stagelink_env_var(size_t index);

/** Nonzero when entry `index` holds a secret (STAGELINK_JOB_SECRET): a
 *  listing must not print its value. */
STAGELINK_EXPORT int stagelink_env_var_secret(size_t index);

/** The values entry `index` accepts, in words ("an integer from 1 to 64,
 *  or auto"), into `buf` ("" past the end of the table). */
STAGELINK_EXPORT void stagelink_env_var_forms(size_t index, char *buf,
                                              size_t len);

/**
 * Variable `name` of the table, read from the environment (else its
 * default) by the parser comm_init uses, as its canonical text in `value`:
 * "1" or "0" for a switch, the choice as the table spells it, bytes for a
 * size, seconds, "auto", "" when unset without a default; a secret reads
 * "(set, not shown)".  STAGELINK_ERR_CONFIG with a sentence naming the
 * variable, the value and the accepted forms when it does not parse;
 * STAGELINK_ERR_NOT_FOUND when the table has no such name.
 */
STAGELINK_EXPORT stagelink_status_t stagelink_env_value(const char *name,
                                                        char *value, size_t len,
                                                        char *err,
                                                        size_t errlen);

/**
 * The STAGELINK_ variables of this environment the table does not hold
 * (misspelled, in the wrong case, retired), one line each with the nearest
 * known name, into `buf`; returns how many.  comm_init logs the same lines
 * once per process unless STAGELINK_WARN_UNKNOWN_ENV is off.
 */
STAGELINK_EXPORT int stagelink_env_unknown(char *buf, size_t len);

/**
 * What this build and machine offer, one fact a line: build features
 * (CUDA, NCCL, libibverbs, the UCX it was built against), GPU-direct RDMA
 * support, the RDMA devices and ports, the GPUs on the PCI bus, and the
 * NIC each local rank would use (rail affinity), the bootstrap a job
 * launched here would use and why, and whether the TCP rendezvous is
 * authenticated (STAGELINK_JOB_SECRET).  Read under
 * STAGELINK_SYSFS_ROOT when set.  Returns the bytes needed (as snprintf).
 */
STAGELINK_EXPORT size_t stagelink_system_report(char *buf, size_t len);

/** This process's place in its job, as the launcher's environment gives
 *  it, and the bootstrap a communicator of the whole job would use. */
typedef struct stagelink_job_info {
    size_t struct_size;      /**< sizeof(stagelink_job_info_t), set by the caller */
    int    rank, world_size;
    int    local_rank, local_size; /**< -1 where the launcher says nothing */
    char   launcher[16];     /**< "torchrun" (also stagelink_run), "mpirun", "slurm" */
    char   bootstrap[16];    /**< "torch-store", "pmix" or "tcp" (STAGELINK_BOOTSTRAP) */
    char   bootstrap_reason[160]; /**< why that one, a sentence */
} stagelink_job_info_t;

/**
 * Fills `job` (its struct_size set) from the environment: torchrun
 * (RANK, WORLD_SIZE, ...; stagelink_run sets the same), Open MPI's mpirun
 * or Slurm's srun, with the bootstrap STAGELINK_BOOTSTRAP chooses there.
 * Without a launcher, or with a value it cannot use, returns an error with
 * the reason in `err`.
 */
STAGELINK_EXPORT stagelink_status_t stagelink_job_query(stagelink_job_info_t *job,
                                                        char *err, size_t errlen);

/** Library version, "MAJOR.MINOR.PATCH". */
STAGELINK_EXPORT const char *stagelink_version(void);

#ifdef __cplusplus
}
#endif

#endif /* STAGELINK_LOADER_H */
