/* tiling/platform/platform_ascendc.h — the platform queries host tiling code makes, as CANN's
 * header of that path declares them, answered by opgen's Ascend C CPU model from
 *     OPGEN_ASCEND_AIV_CORES (default 48)  and  OPGEN_ASCEND_UB_SIZE (default 196608)
 * (the UB arena of every model block has that same size). Only what the model can answer is
 * declared; GetCoreMemSize of anything but the UB aborts (rule 0). */
#ifndef OPGEN_ASCENDC_MODEL_PLATFORM_ASCENDC_H
#define OPGEN_ASCENDC_MODEL_PLATFORM_ASCENDC_H

#include <cstdint>

#include "../../ascendc_model_core.h"

namespace fe {
class PlatFormInfos;
}

namespace platform_ascendc {

enum class CoreMemType { L0_A = 0, L0_B = 1, L0_C = 2, L1 = 3, L2 = 4, UB = 5, HBM = 6, FB = 7, BT = 8, RESERVED };

enum class SocVersion { ASCEND910 = 0, ASCEND910B, ASCEND310P, ASCEND310B, RESERVED_VERSION = 99999 };

class PlatformAscendC {
public:
    PlatformAscendC() = delete;
    ~PlatformAscendC() = default;
    /* `platformInfo` (context->GetPlatformInfo() in tiling functions) is not read by the model */
    explicit PlatformAscendC(fe::PlatFormInfos *platformInfo) : platformInfo_(platformInfo) {}

    uint32_t GetCoreNumAiv(void) const { return ascend_model::aiv_cores(); }
    /* 910B pairs two vector cores with one cube core */
    uint32_t GetCoreNumAic(void) const { return (ascend_model::aiv_cores() + 1) / 2; }
    /* CANN: "On Ascend910B MIX model, return AICore number" */
    uint32_t GetCoreNum(void) const { return GetCoreNumAic(); }
    void GetCoreMemSize(const CoreMemType &memType, uint64_t &size) const {
        if (memType != CoreMemType::UB)
            ascend_model::fail(0, "model", "GetCoreMemSize: only CoreMemType::UB is modelled (asked for %d)",
                               (int)memType);
        size = ascend_model::ub_size();
    }
    SocVersion GetSocVersion(void) const { return SocVersion::ASCEND910B; }
    /* the library APIs' (Matmul) system workspace: 16 MiB on 910B (DAV_2201); a kernel's workspace
     * argument holds it first, the user's part follows (GetUserWorkspace) */
    uint32_t GetLibApiWorkSpaceSize(void) const { return ascend_model::kLibApiWorkspace; }

private:
    fe::PlatFormInfos *platformInfo_;
};

class PlatformAscendCManager {
public:
    static PlatformAscendC *GetInstance() {
        static PlatformAscendC instance(nullptr);
        return &instance;
    }
    static PlatformAscendC *GetInstance(const char *) { return GetInstance(); }

private:
    PlatformAscendCManager();
    ~PlatformAscendCManager() = default;
};

}  // namespace platform_ascendc

#endif /* OPGEN_ASCENDC_MODEL_PLATFORM_ASCENDC_H */
