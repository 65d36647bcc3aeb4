/*
 * The NCCL functions stagelink uses all resolve from the installed
 * libnccl.so.2, of the version the build saw (no GPU needed: this is the
 * link check of the dlopen'd NCCL).  SPDX-License-Identifier: MIT
 */
#include "check.h"
#include "nccl_api.h"

#include <stdlib.h>
#include <string.h>

int main(void)
{
    const sl_nccl_api_t *api;
    sl_errbuf_t          eb;
    int                  version = 0;

    CHECK(sl_nccl_api_get(&api, &eb) == STAGELINK_SUCCESS, "%s", eb.msg);
    if (api == NULL) {
        return check_summary();
    }
    CHECK(api->GetVersion(&version) == ncclSuccess &&
          version / 100 == NCCL_VERSION_CODE / 100,
          "libnccl %d, header %d", version, NCCL_VERSION_CODE);
    CHECK(strlen(api->GetErrorString(ncclInvalidArgument)) > 5,
          "ncclGetErrorString");
    CHECK(sl_nccl_check(api, ncclInvalidUsage, NULL, "ncclTest", &eb) ==
              STAGELINK_ERR_TRANSPORT && strstr(eb.msg, "ncclTest failed"),
          "error sentence: %s", eb.msg);
    printf("NCCL %d from %s\n", version, api->path);

    return check_summary();
}
