/* A user of CANN's aclnn API, written the way CANN's samples are (acl runtime + two-phase
 * aclnnEmbeddingDenseBackward); plain C (also valid C++), it knows nothing of opgen.
 * Usage: cann_user IN OUT
 *   IN:  int64 B, S, D, numWeights, paddingIdx, scaleGradByFreq, gradOffset;
 *        then f32 grad (B*S*D), int64 indices (B*S)
 *   OUT: f32 out (numWeights*D)
 * grad is handed over as a view `gradOffset` elements into its device buffer. */
#include "acl/acl.h"
#include "aclnnop/aclnn_embedding_dense_backward.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_RET(cond, return_expr) \
    do {                             \
        if (!(cond)) {               \
            return_expr;             \
        }                            \
    } while (0)

#define LOG_PRINT(...)          \
    do {                        \
        printf(__VA_ARGS__);    \
    } while (0)

static int64_t GetShapeSize(const int64_t *shape, uint64_t n) {
    int64_t size = 1;
    for (uint64_t i = 0; i < n; i++) size *= shape[i];
    return size;
}

static int Init(int32_t deviceId, aclrtStream *stream) {
    /* fixed pattern: resource initialisation */
    int ret = aclInit(NULL);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclInit failed. ERROR: %d\n", ret); return ret);
    ret = aclrtSetDevice(deviceId);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSetDevice failed. ERROR: %d\n", ret); return ret);
    ret = aclrtCreateStream(stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtCreateStream failed. ERROR: %d\n", ret); return ret);
    return 0;
}

/* Copies `hostData` (`bytes` bytes) to new device memory and makes a contiguous aclTensor of
 * `shape` on it whose first element is `offset` elements into that memory. */
static int CreateAclTensor(const void *hostData, size_t bytes, const int64_t *shape, uint64_t ndim, int64_t offset,
                           void **deviceAddr, aclDataType dataType, aclTensor **tensor) {
    int ret = aclrtMalloc(deviceAddr, bytes, ACL_MEM_MALLOC_HUGE_FIRST);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMalloc failed. ERROR: %d\n", ret); return ret);
    ret = aclrtMemcpy(*deviceAddr, bytes, hostData, bytes, ACL_MEMCPY_HOST_TO_DEVICE);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtMemcpy failed. ERROR: %d\n", ret); return ret);
    int64_t strides[8];
    strides[ndim - 1] = 1;
    for (int64_t i = (int64_t)ndim - 2; i >= 0; i--) strides[i] = shape[i + 1] * strides[i + 1];
    /* the storage is the whole allocation (the view must lie inside it): offset + the view's elements */
    int64_t storage = offset + shape[0] * strides[0];
    *tensor = aclCreateTensor(shape, ndim, dataType, strides, offset, ACL_FORMAT_ND, &storage, 1, *deviceAddr);
    CHECK_RET(*tensor != NULL, LOG_PRINT("aclCreateTensor failed\n"); return 1);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    CHECK_RET(in != NULL, return 2);
    int64_t hdr[7];
    CHECK_RET(fread(hdr, sizeof hdr, 1, in) == 1, return 2);
    int64_t B = hdr[0], S = hdr[1], D = hdr[2], numWeights = hdr[3], paddingIdx = hdr[4], gradOffset = hdr[6];
    bool scaleGradByFreq = hdr[5] != 0;
    size_t nGrad = (size_t)(B * S * D), nIdx = (size_t)(B * S), nOut = (size_t)(numWeights * D);
    float *gradHost = (float *)calloc(nGrad + (size_t)gradOffset, sizeof(float));
    int64_t *indicesHost = (int64_t *)malloc(sizeof(int64_t) * nIdx);
    float *outHost = (float *)malloc(sizeof(float) * nOut);
    CHECK_RET(gradHost && indicesHost && outHost, return 2);
    CHECK_RET(fread(gradHost + gradOffset, sizeof(float), nGrad, in) == nGrad, return 2);
    CHECK_RET(fread(indicesHost, sizeof(int64_t), nIdx, in) == nIdx, return 2);
    fclose(in);
    for (size_t i = 0; i < nOut; i++) outHost[i] = -7.0f; /* the op must overwrite every element */

    /* 1. (fixed pattern) device / stream initialisation */
    int32_t deviceId = 0;
    aclrtStream stream;
    int ret = Init(deviceId, &stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("Init acl failed. ERROR: %d\n", ret); return ret);

    /* 2. inputs and outputs */
    int64_t gradShape[3] = {B, S, D};
    int64_t indicesShape[2] = {B, S};
    int64_t outShape[2] = {numWeights, D};
    void *gradDeviceAddr = NULL;
    void *indicesDeviceAddr = NULL;
    void *outDeviceAddr = NULL;
    aclTensor *grad = NULL;
    aclTensor *indices = NULL;
    aclTensor *out = NULL;
    ret = CreateAclTensor(gradHost, sizeof(float) * (nGrad + (size_t)gradOffset), gradShape, 3, gradOffset,
                          &gradDeviceAddr, ACL_FLOAT, &grad);
    CHECK_RET(ret == ACL_SUCCESS, return ret);
    ret = CreateAclTensor(indicesHost, sizeof(int64_t) * nIdx, indicesShape, 2, 0, &indicesDeviceAddr, ACL_INT64,
                          &indices);
    CHECK_RET(ret == ACL_SUCCESS, return ret);
    ret = CreateAclTensor(outHost, sizeof(float) * nOut, outShape, 2, 0, &outDeviceAddr, ACL_FLOAT, &out);
    CHECK_RET(ret == ACL_SUCCESS, return ret);

    /* 3. the CANN operator API: phase one, workspace, phase two */
    uint64_t workspaceSize = 0;
    aclOpExecutor *executor;
    ret = aclnnEmbeddingDenseBackwardGetWorkspaceSize(grad, indices, (uint64_t)numWeights, (uint64_t)paddingIdx,
                                                      scaleGradByFreq, out, &workspaceSize, &executor);
    CHECK_RET(ret == ACL_SUCCESS,
              LOG_PRINT("aclnnEmbeddingDenseBackwardGetWorkspaceSize failed. ERROR: %d\n", ret); return ret);
    void *workspaceAddr = NULL;
    if (workspaceSize > 0) {
        ret = aclrtMalloc(&workspaceAddr, workspaceSize, ACL_MEM_MALLOC_HUGE_FIRST);
        CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("allocate workspace failed. ERROR: %d\n", ret); return ret);
    }
    ret = aclnnEmbeddingDenseBackward(workspaceAddr, workspaceSize, executor, stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclnnEmbeddingDenseBackward failed. ERROR: %d\n", ret); return ret);
    /* the executor was single-use */
    ret = aclnnEmbeddingDenseBackward(workspaceAddr, workspaceSize, executor, stream);
    CHECK_RET(ret == ACLNN_ERR_PARAM_INVALID, LOG_PRINT("executor reuse gave %d\n", ret); return 1);

    /* 4. (fixed pattern) wait for the stream */
    ret = aclrtSynchronizeStream(stream);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("aclrtSynchronizeStream failed. ERROR: %d\n", ret); return ret);

    /* 5. results back to the host */
    int64_t size = GetShapeSize(outShape, 2);
    ret = aclrtMemcpy(outHost, (size_t)size * sizeof(float), outDeviceAddr, (size_t)size * sizeof(float),
                      ACL_MEMCPY_DEVICE_TO_HOST);
    CHECK_RET(ret == ACL_SUCCESS, LOG_PRINT("copy result from device to host failed. ERROR: %d\n", ret); return ret);
    FILE *o = fopen(argv[2], "wb");
    CHECK_RET(o != NULL, return 2);
    fwrite(outHost, sizeof(float), nOut, o);
    fclose(o);
    LOG_PRINT("workspace %llu\n", (unsigned long long)workspaceSize);

    /* 6. release the aclTensors, 7. the device resources */
    aclDestroyTensor(grad);
    aclDestroyTensor(indices);
    aclDestroyTensor(out);
    aclrtFree(gradDeviceAddr);
    aclrtFree(indicesDeviceAddr);
    aclrtFree(outDeviceAddr);
    if (workspaceSize > 0) {
        aclrtFree(workspaceAddr);
    }
    aclrtDestroyStream(stream);
    aclrtResetDevice(deviceId);
    aclFinalize();
    free(gradHost);
    free(indicesHost);
    free(outHost);
    return 0;
}
