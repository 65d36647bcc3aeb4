/* Which gather backends a communicator uses.  SPDX-License-Identifier: MIT */
#include "gather.h"

#include "sl_env.h"
#include "sl_log.h"

#ifdef STAGELINK_HAVE_NCCL
#include "nccl_api.h"
#endif

sl_status_t sl_gather_select(sl_comm_t *comm)
{
    sl_env_value_t v;

    /* The table's choices are in sl_gather_choice_t's order. */
    SL_CHECK(sl_env_parse(SL_ENV_GATHER, &v, &comm->err));
    comm->gather_choice = v.choice;
    if (comm->gather_choice == SL_GATHER_AUTO && comm->host_gather != NULL) {
        comm->gather_choice = SL_GATHER_HOST;
    }
    if (comm->gather_choice == SL_GATHER_HOST && comm->host_gather == NULL) {
        return sl_error(&comm->err, STAGELINK_ERR_CONFIG,
                        "STAGELINK_GATHER=host but the host gave no gather "
                        "callback in its config; use auto, ucx or nccl");
    }
    if (comm->gather_choice != SL_GATHER_NCCL) {
        return STAGELINK_SUCCESS;
    }
    /* Refused here, before any exchange, so that no peer is left waiting. */
#ifdef STAGELINK_HAVE_NCCL
    {
        const sl_nccl_api_t *api;
        sl_errbuf_t          why;

        SL_CHECK(sl_env_parse(SL_ENV_CUDA_DEVICE_MAX_CONNECTIONS, &v,
                              &comm->err));
        if (v.set && v.u64 == 1) {
            /* One hardware queue: NCCL's kernel, waiting for a TP peer,
             * holds back every later copy and kernel of the device.  The
             * argument says the wait is bounded (docs/design.md); until a
             * GPU has run it, this setting is not offered. */
            return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                            "STAGELINK_GATHER=nccl with "
                            "CUDA_DEVICE_MAX_CONNECTIONS=1 (every stream on "
                            "one hardware queue, as Megatron sets it) is "
                            "refused until tools/lab/gpu-check has shown it "
                            "safe on a GPU; use STAGELINK_GATHER=ucx (the "
                            "default), or the host's gather (Python's "
                            "gather=\"tp_group\")");
        }
        if (!comm->gpu_usable) {
            return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                            "STAGELINK_GATHER=nccl but %s", comm->gpu_why);
        }
        if (sl_nccl_api_get(&api, &why) != STAGELINK_SUCCESS) {
            return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                            "STAGELINK_GATHER=nccl but %s", why.msg);
        }
        return STAGELINK_SUCCESS;
    }
#else
    return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                    "STAGELINK_GATHER=nccl but this plugin was built without "
                    "NCCL (configure with -Dnccl=enabled); use ucx or auto");
#endif
}

sl_status_t sl_gather_init(sl_comm_t *comm)
{
    comm->gather = (comm->gather_choice == SL_GATHER_HOST) ? &sl_gather_host_ops
                                                           : &sl_gather_ucx_ops;
    SL_CHECK(comm->gather->init(comm, &comm->gather_state));
#ifdef STAGELINK_HAVE_NCCL
    if (comm->gather_choice == SL_GATHER_NCCL) {
        SL_CHECK(sl_gather_nccl_ops.init(comm, &comm->gather_dev_state));
        if (comm->gather_dev_state != NULL) {
            comm->gather_dev = &sl_gather_nccl_ops;
        }
    }
#endif
    if (comm->gather_dev == NULL) {
        comm->gather_dev       = comm->gather;
        comm->gather_dev_state = comm->gather_state;
    }
    SL_INFO(SL_SUBSYS_GATHER, "gather backends: host buffers %s, device "
            "buffers %s", comm->gather->name, comm->gather_dev->name);
    return STAGELINK_SUCCESS;
}

void sl_gather_fault(sl_comm_t *comm)
{
    if (comm->gather_dev != NULL && comm->gather_dev != comm->gather &&
        comm->gather_dev->fault != NULL) {
        comm->gather_dev->fault(comm->gather_dev_state);
    }
    if (comm->gather != NULL && comm->gather->fault != NULL) {
        comm->gather->fault(comm->gather_state);
    }
}

void sl_gather_cleanup(sl_comm_t *comm)
{
    if (comm->gather_dev != NULL && comm->gather_dev != comm->gather) {
        comm->gather_dev->cleanup(comm->gather_dev_state);
    }
    if (comm->gather != NULL) {
        comm->gather->cleanup(comm->gather_state);
    }
    comm->gather = comm->gather_dev = NULL;
}
