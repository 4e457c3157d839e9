/* A user of InfiniCore's infiniop C API: RMSNormBackward on f32 tensors of shape (N1, N2, D).
 * Plain C (also valid C++); it knows nothing of opgen. Usage: infinicore_user IN OUT
 *   IN:  int64 N1, N2, D, with_eps; float eps; then f32 grad_y, x (N1*N2*D each), w (D)
 *   OUT: f32 grad_x (N1*N2*D), grad_w (D)
 * Prints the workspace size and the descriptor's device. */
#include <infiniop.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        infiniStatus_t s_ = (call);                                                  \
        if (s_ != INFINI_STATUS_SUCCESS) {                                           \
            fprintf(stderr, "%s failed: status %d\n", #call, (int)s_);               \
            return 1;                                                                \
        }                                                                            \
    } while (0)

static int read_exact(FILE *f, void *dst, size_t bytes) { return fread(dst, 1, bytes, f) == bytes; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    if (!in) return 2;
    int64_t hdr[4];
    float eps = 0.0f;
    if (!read_exact(in, hdr, sizeof hdr) || !read_exact(in, &eps, sizeof eps)) return 2;
    size_t n1 = (size_t)hdr[0], n2 = (size_t)hdr[1], d = (size_t)hdr[2];
    int with_eps = (int)hdr[3];
    size_t n = n1 * n2 * d;
    float *grad_y = (float *)malloc(sizeof(float) * n);
    float *x = (float *)malloc(sizeof(float) * n);
    float *w = (float *)malloc(sizeof(float) * d);
    float *grad_x = (float *)malloc(sizeof(float) * n);
    float *grad_w = (float *)malloc(sizeof(float) * d);
    if (!grad_y || !x || !w || !grad_x || !grad_w) return 2;
    if (!read_exact(in, grad_y, sizeof(float) * n) || !read_exact(in, x, sizeof(float) * n) ||
        !read_exact(in, w, sizeof(float) * d))
        return 2;
    fclose(in);

    infiniopHandle_t handle;
    CHECK(infiniopCreateHandle(&handle));

    size_t shape3[3] = {n1, n2, d};
    size_t shape1[1] = {d};
    ptrdiff_t strides3[3] = {(ptrdiff_t)(n2 * d), (ptrdiff_t)d, 1};
    infiniopTensorDescriptor_t grad_x_desc, grad_w_desc, grad_y_desc, x_desc, w_desc;
    CHECK(infiniopCreateTensorDescriptor(&grad_x_desc, 3, shape3, NULL, INFINI_DTYPE_F32));
    CHECK(infiniopCreateTensorDescriptor(&grad_w_desc, 1, shape1, NULL, INFINI_DTYPE_F32));
    CHECK(infiniopCreateTensorDescriptor(&grad_y_desc, 3, shape3, strides3, INFINI_DTYPE_F32));
    CHECK(infiniopCreateTensorDescriptor(&x_desc, 3, shape3, strides3, INFINI_DTYPE_F32));
    CHECK(infiniopCreateTensorDescriptor(&w_desc, 1, shape1, NULL, INFINI_DTYPE_F32));

    infiniopRMSNormBackwardDescriptor_t desc;
    if (with_eps)
        CHECK(infiniopCreateRMSNormBackwardDescriptorWithEpsilon(handle, &desc, grad_x_desc, grad_w_desc,
                                                                 grad_y_desc, x_desc, w_desc, eps));
    else
        CHECK(infiniopCreateRMSNormBackwardDescriptor(handle, &desc, grad_x_desc, grad_w_desc, grad_y_desc,
                                                      x_desc, w_desc));
    /* the tensor descriptors may go as soon as the operator descriptor exists */
    CHECK(infiniopDestroyTensorDescriptor(grad_x_desc));
    CHECK(infiniopDestroyTensorDescriptor(grad_w_desc));
    CHECK(infiniopDestroyTensorDescriptor(grad_y_desc));
    CHECK(infiniopDestroyTensorDescriptor(x_desc));
    CHECK(infiniopDestroyTensorDescriptor(w_desc));

    infiniDevice_t device;
    int device_id = -1;
    CHECK(infiniopGetDescriptorDeviceType(desc, &device));
    CHECK(infiniopGetDescriptorDeviceId(desc, &device_id));

    size_t workspace_size = 0;
    CHECK(infiniopGetRMSNormBackwardWorkspaceSize(desc, &workspace_size));
    void *workspace = workspace_size ? malloc(workspace_size) : NULL;
    if (workspace_size && !workspace) return 2;
    if (workspace_size > 0 &&
        infiniopRMSNormBackward(desc, workspace, workspace_size - 1, grad_x, grad_w, grad_y, x, w, NULL) !=
            INFINI_STATUS_INSUFFICIENT_WORKSPACE) {
        fprintf(stderr, "a short workspace was not refused\n");
        return 1;
    }
    CHECK(infiniopRMSNormBackward(desc, workspace, workspace_size, grad_x, grad_w, grad_y, x, w, NULL));
    CHECK(infiniopDestroyRMSNormBackwardDescriptor(desc));
    CHECK(infiniopDestroyHandle(handle));
    free(workspace);

    FILE *out = fopen(argv[2], "wb");
    if (!out) return 2;
    fwrite(grad_x, sizeof(float), n, out);
    fwrite(grad_w, sizeof(float), d, out);
    fclose(out);
    printf("workspace %zu device %d id %d\n", workspace_size, (int)device, device_id);
    free(grad_y);
    free(x);
    free(w);
    free(grad_x);
    free(grad_w);
    return 0;
}
