/* A C program built against the generated CPU library through its CMake package or its
 * pkg-config file (tests/test_packaging.py); it only includes opgen.h.
 * Usage: rms_user IN OUT
 *   IN:  int64 N, D; f32 eps; then f32 grad_y (N*D), x (N*D), w (D)
 *   OUT: f32 grad_x (N*D), grad_w (D) */
#include "opgen.h"

#include <stdio.h>
#include <stdlib.h>

static int read_all(FILE *f, void *p, size_t size, size_t n) { return fread(p, size, n, f) == n; }

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s IN OUT\n", argv[0]);
        return 2;
    }
    FILE *in = fopen(argv[1], "rb");
    if (!in) return 2;
    int64_t nd[2];
    float eps;
    if (!read_all(in, nd, sizeof nd[0], 2) || !read_all(in, &eps, sizeof eps, 1) || nd[0] < 0 || nd[1] < 0 ||
        nd[0] > 4096 || nd[1] > 4096) {
        fclose(in);
        return 2;
    }
    const size_t nx = (size_t)(nd[0] * nd[1]), nw = (size_t)nd[1];
    float *gy = malloc(sizeof(float) * (nx + 1)), *x = malloc(sizeof(float) * (nx + 1));
    float *w = malloc(sizeof(float) * (nw + 1)), *gx = malloc(sizeof(float) * (nx + 1));
    float *gw = malloc(sizeof(float) * (nw + 1));
    int ok = gy && x && w && gx && gw && read_all(in, gy, sizeof(float), nx) && read_all(in, x, sizeof(float), nx) &&
             read_all(in, w, sizeof(float), nw);
    fclose(in);
    int rc = 1;
    if (ok) {
        const int64_t shape2[2] = {nd[0], nd[1]}, shape1[1] = {nd[1]};
        const opgen_tensor_t tgy = {gy, OPGEN_F32, 2, shape2, NULL}, tx = {x, OPGEN_F32, 2, shape2, NULL};
        const opgen_tensor_t tw = {w, OPGEN_F32, 1, shape1, NULL}, tgx = {gx, OPGEN_F32, 2, shape2, NULL};
        const opgen_tensor_t tgw = {gw, OPGEN_F32, 1, shape1, NULL};
        size_t ws_size = 0;
        opgen_status_t st = opgen_rms_norm_backward_workspace_size(&tgy, &tx, &tw, eps, &tgx, &tgw, &ws_size);
        void *ws = st == OPGEN_SUCCESS && ws_size ? malloc(ws_size) : NULL;
        if (st == OPGEN_SUCCESS && (ws || !ws_size))
            st = opgen_rms_norm_backward(&tgy, &tx, &tw, eps, &tgx, &tgw, ws, ws_size);
        free(ws);
        if (st != OPGEN_SUCCESS) {
            fprintf(stderr, "opgen_rms_norm_backward: %s (%s)\n", opgen_status_string(st), opgen_last_error());
        } else {
            FILE *out = fopen(argv[2], "wb");
            if (out && fwrite(gx, sizeof(float), nx, out) == nx && fwrite(gw, sizeof(float), nw, out) == nw) rc = 0;
            if (out) fclose(out);
        }
    }
    free(gy);
    free(x);
    free(w);
    free(gx);
    free(gw);
    return rc;
}
