/* kernel_tiling/kernel_tiling.h — the tiling structs of CANN's library APIs as plain C++ structs,
 * includable from host and kernel code alike (opgen's Ascend C CPU model; docs/ascendc_model.md).
 *
 * Only TCubeTiling (the Matmul API's) is modelled: the int32_t fields of asc-devkit's
 * matmul_tilingdata.h in the same order, up to dbL0C (the newer trailing layout fields —
 * ALayoutInfo*, BLayoutInfo*, CLayoutInfo*, BatchNum, mxTypePara — are left out). Never hard-code
 * sizeof(TCubeTiling) or field offsets. As in CANN's generated header the struct lives in
 * AscendC::tiling and is also visible as plain `TCubeTiling`. */
#ifndef OPGEN_ASCENDC_MODEL_KERNEL_TILING_H
#define OPGEN_ASCENDC_MODEL_KERNEL_TILING_H

#include <stdint.h>

namespace AscendC {
namespace tiling {
#pragma pack(push, 8)
struct TCubeTiling {
    int32_t usedCoreNum = 0;
    int32_t M = 0;
    int32_t N = 0;
    int32_t Ka = 0;
    int32_t Kb = 0;
    int32_t singleCoreM = 0;
    int32_t singleCoreN = 0;
    int32_t singleCoreK = 0;
    int32_t baseM = 0;
    int32_t baseN = 0;
    int32_t baseK = 0;
    int32_t depthA1 = 0;
    int32_t depthB1 = 0;
    int32_t stepM = 0;
    int32_t stepN = 0;
    int32_t isBias = 0;
    int32_t transLength = 0;
    int32_t iterateOrder = 0;
    int32_t shareMode = 0;
    int32_t shareL1Size = 0;
    int32_t shareL0CSize = 0;
    int32_t shareUbSize = 0;
    int32_t batchM = 0;
    int32_t batchN = 0;
    int32_t singleBatchM = 0;
    int32_t singleBatchN = 0;
    int32_t stepKa = 0;
    int32_t stepKb = 0;
    int32_t depthAL1CacheUB = 0;
    int32_t depthBL1CacheUB = 0;
    int32_t dbL0A = 0;
    int32_t dbL0B = 0;
    int32_t dbL0C = 0;
};
#pragma pack(pop)
}  // namespace tiling
}  // namespace AscendC
using AscendC::tiling::TCubeTiling;

#endif /* OPGEN_ASCENDC_MODEL_KERNEL_TILING_H */
