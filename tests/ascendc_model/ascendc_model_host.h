/* ascendc_model_host.h — host side of opgen's Ascend C CPU model: what CANN's generated
 * aclrtlaunch_<kernel>.h headers provide (tests/ascendc_model/build.py generates them, one per
 * `extern "C" __global__` kernel, each including this header):
 *
 *     ACLRT_LAUNCH_KERNEL(k)(numBlocks, stream, args...)  ->  aclrtlaunch_k(numBlocks, stream, args...)
 *     extern "C" uint32_t aclrtlaunch_k(uint32_t numBlocks, aclrtStream stream, void *gm_arg, ...);
 *
 * In the model a launch is synchronous (the stream is only recorded) and returns 0; it may be called
 * from several host threads at once. Works with or without the project's acl/acl_base.h (the
 * aclrtStream typedef below is the same declaration, which C and C++ both allow twice). */
#ifndef OPGEN_ASCENDC_MODEL_HOST_H
#define OPGEN_ASCENDC_MODEL_HOST_H

#include <stdint.h>

typedef void *aclrtStream;

#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* The stream the last launch (of any thread) was given: what tests check a host entry forwards. */
aclrtStream ascendc_model_last_stream(void);
#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
namespace ascend_model {
/* Run `body(arg)` as each of `numBlocks` blocks (threads with private UB arenas). Returns 0.
 * `mix`: a KERNEL_TYPE_MIX_AIC_1_2 kernel: `numBlocks` AI Core groups of 1 AIC + 2 AIV; the model
 * runs the 2 * numBlocks AIV blocks (GetBlockIdx() in [0, 2 * numBlocks), GetTaskRation() 2). */
uint32_t launch(uint32_t numBlocks, aclrtStream stream, void (*body)(void *), void *arg, const char *name,
                bool mix = false);
}  // namespace ascend_model
#endif

#endif /* OPGEN_ASCENDC_MODEL_HOST_H */
