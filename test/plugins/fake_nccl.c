/*
 * A stand-in for libnccl.so.2 (STAGELINK_NCCL_LIBRARY) with every function
 * stagelink resolves, for tests of NCCL setup paths on machines without a
 * GPU.  Nothing moves data.  ncclGetUniqueId fills a known pattern, or
 * fails with ncclSystemError while FAKE_NCCL_UNIQUE_ID=fail;
 * ncclCommInitRank succeeds only with an id of that pattern, so a test
 * sees that every rank got TP index 0's id.  SPDX-License-Identifier: MIT
 */
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include <stdlib.h>
#include <string.h>

#define FAKE_ID_BYTE 0x5a

static int fake_comm; /* every communicator handle points here */

#pragma GCC visibility push(default)

ncclResult_t ncclGetVersion(int *version)
{
    *version = 22800;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    const char *mode = getenv("FAKE_NCCL_UNIQUE_ID");

    if (mode != NULL && strcmp(mode, "fail") == 0) {
        return ncclSystemError;
    }
    memset(id->internal, FAKE_ID_BYTE, sizeof(id->internal));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id,
                              int rank)
{
    size_t i;

    for (i = 0; i < sizeof(id.internal); ++i) {
        if ((unsigned char)id.internal[i] != FAKE_ID_BYTE) {
            return ncclInvalidArgument;
        }
    }
    if (nranks < 1 || rank < 0 || rank >= nranks) {
        return ncclInvalidArgument;
    }
    *comm = (ncclComm_t)(void *)&fake_comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return (comm == (ncclComm_t)(void *)&fake_comm) ? ncclSuccess
                                                    : ncclInvalidArgument;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    return ncclCommDestroy(comm);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count,
                           ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)send, (void)recv, (void)count, (void)type, (void)comm, (void)stream;
    return ncclInvalidUsage;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count,
                           ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)send, (void)recv, (void)count, (void)type, (void)root, (void)comm,
        (void)stream;
    return ncclInvalidUsage;
}

ncclResult_t ncclSend(const void *buf, size_t count, ncclDataType_t type,
                      int peer, ncclComm_t comm, cudaStream_t stream)
{
    (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
    return ncclInvalidUsage;
}

ncclResult_t ncclRecv(void *buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    (void)buf, (void)count, (void)type, (void)peer, (void)comm, (void)stream;
    return ncclInvalidUsage;
}

ncclResult_t ncclGroupStart(void)
{
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error (fake NCCL)";
    case ncclSystemError: return "unhandled system error (fake NCCL)";
    case ncclInvalidArgument: return "invalid argument (fake NCCL)";
    default: return "not implemented by the fake NCCL";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "fake NCCL";
}

#pragma GCC visibility pop
