/*
 * The CUDA runtime behind sl_gpu_ops_t.  Errors become stagelink statuses
 * with CUDA's own name and sentence.  SPDX-License-Identifier: MIT
 */
#include "gpu.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SL_NUMA_MASK_WORDS 16 /* node masks of 1,024 nodes, as the kernel's */

static sl_status_t sl_cuda_check(cudaError_t err, const char *what,
                                 sl_errbuf_t *eb)
{
    if (err == cudaSuccess) {
        return STAGELINK_SUCCESS;
    }
    return sl_error(eb, STAGELINK_ERR_TRANSPORT, "%s failed: %s (%s)", what,
                    cudaGetErrorString(err), cudaGetErrorName(err));
}

static int sl_cuda_probe(char *why, size_t len)
{
    int         count  = 0;
    cudaError_t err    = cudaGetDeviceCount(&count);
    void       *driver = NULL;

    if (err == cudaErrorInsufficientDriver &&
        (driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) == NULL) {
        /* The runtime says "insufficient" for none at all. */
        snprintf(why, len, "no CUDA driver: libcuda.so.1 cannot be opened "
                 "(no NVIDIA driver installed, or not visible here)");
        cudaGetLastError();
        return 0;
    }
    if (driver != NULL) {
        dlclose(driver);
    }
    if (err != cudaSuccess) {
        int drv = 0, rt = 0;

        cudaDriverGetVersion(&drv);
        cudaRuntimeGetVersion(&rt);
        snprintf(why, len, "no CUDA device: %s (%s; driver API %d, runtime "
                 "%d)", cudaGetErrorString(err), cudaGetErrorName(err), drv,
                 rt);
        cudaGetLastError();
        return 0;
    }
    if (count == 0) {
        snprintf(why, len, "no CUDA device: the runtime sees 0 devices");
        return 0;
    }
    snprintf(why, len, "%d CUDA device%s", count, (count == 1) ? "" : "s");
    return 1;
}

static int sl_cuda_pci_bus_ids(char (*ids)[16], int max, int *current)
{
    int count = 0, i;

    if (cudaGetDeviceCount(&count) != cudaSuccess ||
        cudaGetDevice(current) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    for (i = 0; i < count && i < max; ++i) {
        if (cudaDeviceGetPCIBusId(ids[i], 16, i) != cudaSuccess) {
            cudaGetLastError();
            return i;
        }
    }
    return i;
}

/* cuCtxGetCurrent from the driver the runtime loaded (stagelink does not
 * link libcuda): it answers without creating a context, which a runtime
 * call such as cudaPointerGetAttributes may do on device 0. */
static CUresult (*sl_cu_ctx_get_current)(CUcontext *ctx);
/* And its setter: NULL leaves a thread without a context again. */
static CUresult (*sl_cu_ctx_set_current)(CUcontext ctx);
static CUresult (*sl_cu_pointer_get_attribute)(void *data,
                                               CUpointer_attribute attr,
                                               CUdeviceptr ptr);
static CUresult (*sl_cu_device_get)(CUdevice *dev, int ordinal);
static CUresult (*sl_cu_device_get_attribute)(int *value,
                                              CUdevice_attribute attr,
                                              CUdevice dev);
static pthread_once_t sl_cu_once = PTHREAD_ONCE_INIT;

static void sl_cuda_entry(const char *name, int version, void *out)
{
    enum cudaDriverEntryPointQueryResult found;
    void                                *fn = NULL;

    if (cudaGetDriverEntryPointByVersion(name, &fn, (unsigned)version,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess && fn != NULL) {
        /* ISO C has no cast from void * to a function pointer: copy it. */
        memcpy(out, &fn, sizeof(fn));
    }
    cudaGetLastError();
}

static void sl_cuda_resolve(void)
{
    sl_cuda_entry("cuCtxGetCurrent", 4000, &sl_cu_ctx_get_current);
    sl_cuda_entry("cuPointerGetAttribute", 4000, &sl_cu_pointer_get_attribute);
    sl_cuda_entry("cuCtxSetCurrent", 4000, &sl_cu_ctx_set_current);
    sl_cuda_entry("cuDeviceGet", 2000, &sl_cu_device_get);
    sl_cuda_entry("cuDeviceGetAttribute", 2000, &sl_cu_device_get_attribute);
}

/*
 * By the driver's pointer attributes, which answer from the unified
 * address space without a current context: the runtime's
 * cudaPointerGetAttributes would make device 0's primary context current
 * on a thread that has none.
 */
static stagelink_mem_type_t sl_cuda_classify(const void *ptr, int *device)
{
    CUdeviceptr  p = (CUdeviceptr)(uintptr_t)ptr;
    unsigned int type = 0, managed = 0;
    int          ordinal = -1;
    CUresult     res;

    *device = -1;
    pthread_once(&sl_cu_once, sl_cuda_resolve);
    if (sl_cu_pointer_get_attribute == NULL) {
        return STAGELINK_MEM_AUTO;
    }
    res = sl_cu_pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (res == CUDA_ERROR_INVALID_VALUE) {
        return STAGELINK_MEM_HOST; /* memory CUDA does not know */
    }
    if (res != CUDA_SUCCESS ||
        sl_cu_pointer_get_attribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    p) != CUDA_SUCCESS ||
        sl_cu_pointer_get_attribute(&ordinal,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                    p) != CUDA_SUCCESS) {
        return STAGELINK_MEM_AUTO; /* the driver cannot say */
    }
    if (managed) {
        *device = ordinal;
        return STAGELINK_MEM_CUDA_MANAGED;
    }
    if (type == CU_MEMORYTYPE_DEVICE) {
        *device = ordinal;
        return STAGELINK_MEM_CUDA;
    }
    return STAGELINK_MEM_HOST; /* pinned or registered host memory */
}

static void *sl_cuda_context_current(void)
{
    CUcontext ctx = NULL;

    pthread_once(&sl_cu_once, sl_cuda_resolve);
    if (sl_cu_ctx_get_current == NULL || sl_cu_ctx_get_current(&ctx) != CUDA_SUCCESS) {
        return NULL;
    }
    return ctx;
}

static int sl_cuda_thread_on_gpu(void)
{
    pthread_once(&sl_cu_once, sl_cuda_resolve);
    return sl_cu_ctx_get_current == NULL || sl_cuda_context_current() != NULL;
}

/* Memory of cudaMalloc is; memory of the virtual-memory API (PyTorch's
 * expandable_segments) and of stream-ordered pools (cudaMallocAsync) is
 * not, and cuda_ipc would fail on it, or worse. */
static int sl_cuda_ipc_capable(const void *ptr)
{
    int capable = 1;

    pthread_once(&sl_cu_once, sl_cuda_resolve);
    if (sl_cu_pointer_get_attribute != NULL &&
        sl_cu_pointer_get_attribute(&capable,
                                    CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                                    (CUdeviceptr)(uintptr_t)ptr) != CUDA_SUCCESS) {
        capable = 1; /* an old driver cannot say: as before */
    }
    return capable;
}

static sl_status_t sl_cuda_context_set(void *ctx, sl_errbuf_t *eb)
{
    CUresult res;

    pthread_once(&sl_cu_once, sl_cuda_resolve);
    if (sl_cu_ctx_set_current == NULL) {
        return sl_error(eb, STAGELINK_ERR_TRANSPORT, "the CUDA driver has no "
                        "cuCtxSetCurrent");
    }
    res = sl_cu_ctx_set_current((CUcontext)ctx);
    if (res != CUDA_SUCCESS) {
        return sl_error(eb, STAGELINK_ERR_TRANSPORT, "cuCtxSetCurrent(%p) "
                        "failed with CUresult %d", ctx, (int)res);
    }
    return STAGELINK_SUCCESS;
}

static int sl_cuda_device_current(void)
{
    int device = -1;

    if (!sl_cuda_thread_on_gpu() || cudaGetDevice(&device) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return device;
}

static sl_status_t sl_cuda_device_set(int device, sl_errbuf_t *eb)
{
    if (device < 0) {
        return sl_cuda_context_set(NULL, eb);
    }
    return sl_cuda_check(cudaSetDevice(device), "cudaSetDevice", eb);
}

/* The driver's own answer (CUDA 11.7 and later, open kernel modules): the
 * runtime names no such attribute. */
static int sl_cuda_dmabuf_supported(int device)
{
    CUdevice dev;
    int      yes = 0;

    pthread_once(&sl_cu_once, sl_cuda_resolve);
    if (sl_cu_device_get == NULL || sl_cu_device_get_attribute == NULL ||
        sl_cu_device_get(&dev, device) != CUDA_SUCCESS ||
        sl_cu_device_get_attribute(&yes, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                   dev) != CUDA_SUCCESS) {
        return -1;
    }
    return yes != 0;
}

/* Below Hopper, an RDMA write the NIC completed may not yet be visible to
 * the GPU's kernels; the driver flushes it on request (NCCL does the same
 * below compute capability 9.0). */
static int sl_cuda_rdma_flush_needed(int device)
{
    int major = 0, options = 0;

    if (device < 0 ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                               device) != cudaSuccess ||
        cudaDeviceGetAttribute(&options,
                               cudaDevAttrGPUDirectRDMAFlushWritesOptions,
                               device) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major < 9 && (options & cudaFlushGPUDirectRDMAWritesOptionHost);
}

static sl_status_t sl_cuda_rdma_flush(sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaDeviceFlushGPUDirectRDMAWrites(
                             cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                             cudaFlushGPUDirectRDMAWritesToOwner),
                         "cudaDeviceFlushGPUDirectRDMAWrites", eb);
}

static sl_status_t sl_cuda_dev_alloc(size_t len, void **ptr, sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaMalloc(ptr, len), "cudaMalloc", eb);
}

static void sl_cuda_dev_free(void *ptr)
{
    cudaFree(ptr);
}

/*
 * Pinned memory on NUMA node *ctx (an int, -1 anywhere): the calling
 * thread prefers that node while the driver allocates, so the bounce
 * buffers sit beside the GPU's PCIe root, not across the socket link.
 * Portable: pinned for every context, not only the allocating one's (the
 * host may switch devices or contexts between calls).
 */
static void *sl_cuda_host_alloc(size_t len, void *ctx)
{
    const int    *numa = ctx;
    unsigned long want[SL_NUMA_MASK_WORDS] = {0}, old[SL_NUMA_MASK_WORDS];
    int           mode = MPOL_DEFAULT, placed = 0;
    void         *ptr  = NULL;

    if (numa != NULL && *numa >= 0 && *numa < SL_NUMA_MASK_WORDS * 64 &&
        syscall(SYS_get_mempolicy, &mode, old, SL_NUMA_MASK_WORDS * 64, NULL,
                0) == 0) {
        want[*numa / 64] = 1ul << (*numa % 64);
        placed = syscall(SYS_set_mempolicy, MPOL_PREFERRED, want,
                         SL_NUMA_MASK_WORDS * 64) == 0;
    }
    if (cudaHostAlloc(&ptr, len, cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        ptr = NULL;
    }
    if (placed) {
        syscall(SYS_set_mempolicy, mode, mode == MPOL_DEFAULT ? NULL : old,
                SL_NUMA_MASK_WORDS * 64);
    }
    return ptr;
}

static void sl_cuda_host_free(void *ptr, void *ctx)
{
    (void)ctx;
    cudaFreeHost(ptr);
}

static sl_status_t sl_cuda_stream_create(void **stream, sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaStreamCreateWithFlags((cudaStream_t *)stream,
                                                   cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags", eb);
}

static void sl_cuda_stream_destroy(void *stream)
{
    cudaStreamDestroy((cudaStream_t)stream);
}

static sl_status_t sl_cuda_event_create(void **event, sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaEventCreateWithFlags((cudaEvent_t *)event,
                                                  cudaEventDisableTiming),
                         "cudaEventCreateWithFlags", eb);
}

static void sl_cuda_event_destroy(void *event)
{
    cudaEventDestroy((cudaEvent_t)event);
}

static sl_status_t sl_cuda_event_record(void *event, void *stream,
                                        sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaEventRecord((cudaEvent_t)event,
                                         (cudaStream_t)stream),
                         "cudaEventRecord", eb);
}

static int sl_cuda_event_query(void *event, sl_status_t *status,
                               sl_errbuf_t *eb)
{
    cudaError_t err = cudaEventQuery((cudaEvent_t)event);

    if (err == cudaErrorNotReady) {
        return 0;
    }
    *status = sl_cuda_check(err, "cudaEventQuery", eb);
    return 1;
}

static sl_status_t sl_cuda_stream_wait_event(void *stream, void *event,
                                             sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaStreamWaitEvent((cudaStream_t)stream,
                                             (cudaEvent_t)event, 0),
                         "cudaStreamWaitEvent", eb);
}

static sl_status_t sl_cuda_copy_async(void *dst, const void *src, size_t len,
                                      void *stream, sl_errbuf_t *eb)
{
    return sl_cuda_check(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault,
                                         (cudaStream_t)stream),
                         "cudaMemcpyAsync", eb);
}

const sl_gpu_ops_t sl_gpu_default_ops = {
    .name              = "cuda",
    .probe             = sl_cuda_probe,
    .pci_bus_ids       = sl_cuda_pci_bus_ids,
    .classify          = sl_cuda_classify,
    .thread_on_gpu     = sl_cuda_thread_on_gpu,
    .host_alloc        = sl_cuda_host_alloc,
    .host_free         = sl_cuda_host_free,
    .stream_create     = sl_cuda_stream_create,
    .stream_destroy    = sl_cuda_stream_destroy,
    .event_create      = sl_cuda_event_create,
    .event_destroy     = sl_cuda_event_destroy,
    .event_record      = sl_cuda_event_record,
    .event_query       = sl_cuda_event_query,
    .stream_wait_event = sl_cuda_stream_wait_event,
    .copy_async        = sl_cuda_copy_async,
    .device_current    = sl_cuda_device_current,
    .device_set        = sl_cuda_device_set,
    .context_current   = sl_cuda_context_current,
    .context_set       = sl_cuda_context_set,
    .ipc_capable       = sl_cuda_ipc_capable,
    .rdma_flush_needed = sl_cuda_rdma_flush_needed,
    .dmabuf_supported  = sl_cuda_dmabuf_supported,
    .rdma_flush        = sl_cuda_rdma_flush,
    .dev_alloc         = sl_cuda_dev_alloc,
    .dev_free          = sl_cuda_dev_free,
};
