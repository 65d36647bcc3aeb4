/* Which gather backend a communicator uses.  SPDX-License-Identifier: MIT */
#include "gather.h"

#include "sl_env.h"
#include "sl_log.h"

sl_status_t sl_gather_select(sl_comm_t *comm, const sl_gather_ops_t **ops)
{
    static const char *const names[] = {"auto", "ucx", "nccl", NULL};
    int                      choice;

    SL_CHECK(sl_env_parse_choice(SL_ENV_GATHER, names, &choice, &comm->err));
    if (choice == 2) {
        return sl_error(&comm->err, STAGELINK_ERR_UNSUPPORTED,
                        "STAGELINK_GATHER=nccl but this plugin was built "
                        "without the NCCL gather backend; use ucx or auto");
    }
    /* Host buffers are all this build moves: auto means UCX. */
    *ops = &sl_gather_ucx_ops;
    SL_INFO(SL_SUBSYS_GATHER, "gather backend %s (STAGELINK_GATHER=%s)",
            (*ops)->name, names[choice]);
    return STAGELINK_SUCCESS;
}
