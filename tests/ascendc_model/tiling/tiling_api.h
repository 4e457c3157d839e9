/* tiling/tiling_api.h — host-side Matmul tiling (namespace matmul_tiling) as CANN 8.x spells it,
 * answered by opgen's Ascend C CPU model (docs/ascendc_model.md, "Matmul"). Test harness only.
 *
 *   matmul_tiling::MatmulApiTiling mt(*platform_ascendc::PlatformAscendCManager::GetInstance());
 *   mt.SetAType(TPosition::GM, CubeFormat::ND, DataType::DT_FLOAT16[, isTrans]); SetBType(...); SetCType(...);
 *   mt.SetShape(M, N, K); mt.SetOrgShape(orgM, orgN, orgKa[, orgKb]); mt.SetBias(false);
 *   if (mt.GetTiling(tiling) == -1) { error }
 *
 * GetTiling returns -1 on: A, B or C type not set; a shape <= 0 or larger than the org shape; A and B
 * of different types; A/B not DT_FLOAT16/DT_BF16/DT_FLOAT; C (or an enabled bias) not DT_FLOAT;
 * a position other than GM or a format other than ND (the kernel-side model has only those); an org
 * matrix of more than INT32_MAX elements (the model's conservative choice). Otherwise it fills
 * M/N/Ka/Kb (org shape), singleCoreM/N/K (the shape), usedCoreNum 1, base blocks that fit L0A/L0B
 * (64 KiB) and L0C (128 KiB) once each (baseM <= 128, baseN <= 256, baseK <= 64 for 2-byte and
 * <= 32 for 4-byte types, each clamped to the shape rounded up to 16, or SetFixSplit's values),
 * depthA1/depthB1/stepM/stepN/stepKa/stepKb 1, isBias, iterateOrder (SetTraverse), dbL0A/B/C 1,
 * and returns 0. The choice of base blocks is the model's, not CANN's: kernels must read them from
 * the tiling, never assume them. */
#ifndef OPGEN_ASCENDC_MODEL_TILING_API_H
#define OPGEN_ASCENDC_MODEL_TILING_API_H

#include <algorithm>
#include <cstdint>

#include "../kernel_tiling/kernel_tiling.h"
#include "platform/platform_ascendc.h"

namespace matmul_tiling {

enum class TPosition : int32_t {
    GM,
    A1,
    A2,
    B1,
    B2,
    C1,
    C2,
    CO1,
    CO2,
    VECIN,
    VECOUT,
    VECCALC,
    LCM = VECCALC,
    SPM,
    SHM = SPM,
    TSCM,
    MAX,
};
enum class CubeFormat : int32_t { ND = 0, NZ, ZN, ZZ, NN, ND_ALIGN, SCALAR, VECTOR };
/* the values confirmed for CANN (the rest of ge's list is left out) */
enum class DataType : int32_t {
    DT_FLOAT = 0,
    DT_FLOAT16 = 1,
    DT_INT8 = 2,
    DT_INT32 = 3,
    DT_BF16 = 27,
    DT_BFLOAT16 = 33,
};
enum class MatrixTraverse : int32_t { NOSET = 0, FIRSTM = 1, FIRSTN = 2 };

struct PlatformInfo {
    platform_ascendc::SocVersion socVersion = platform_ascendc::SocVersion::ASCEND910B;
    uint64_t l1Size = 0;
    uint64_t l0CSize = 0;
    uint64_t ubSize = 0;
    uint64_t l0ASize = 0;
    uint64_t l0BSize = 0;
};

class MatmulApiTilingBase {
public:
    MatmulApiTilingBase() = default;
    explicit MatmulApiTilingBase(const platform_ascendc::PlatformAscendC &) {}
    explicit MatmulApiTilingBase(const PlatformInfo &) {}
    virtual ~MatmulApiTilingBase() = default;

    int32_t SetAType(TPosition pos, CubeFormat type, DataType dataType, bool isTrans = false) {
        a_ = {true, pos, type, dataType, isTrans};
        return 0;
    }
    int32_t SetBType(TPosition pos, CubeFormat type, DataType dataType, bool isTrans = false) {
        b_ = {true, pos, type, dataType, isTrans};
        return 0;
    }
    int32_t SetCType(TPosition pos, CubeFormat type, DataType dataType) {
        c_ = {true, pos, type, dataType, false};
        return 0;
    }
    int32_t SetBiasType(TPosition pos, CubeFormat type, DataType dataType) {
        bias_ = {true, pos, type, dataType, false};
        return 0;
    }
    virtual int32_t SetShape(int32_t m, int32_t n, int32_t k) {
        m_ = m;
        n_ = n;
        k_ = k;
        return m > 0 && n > 0 && k > 0 ? 0 : -1;
    }
    int32_t SetOrgShape(int32_t orgMIn, int32_t orgNIn, int32_t orgKIn) {
        return SetOrgShape(orgMIn, orgNIn, orgKIn, orgKIn);
    }
    int32_t SetOrgShape(int32_t orgMIn, int32_t orgNIn, int32_t orgKaIn, int32_t orgKbIn) {
        orgM_ = orgMIn;
        orgN_ = orgNIn;
        orgKa_ = orgKaIn;
        orgKb_ = orgKbIn;
        return orgMIn > 0 && orgNIn > 0 && orgKaIn > 0 && orgKbIn > 0 ? 0 : -1;
    }
    int32_t SetBias(bool isBiasIn = false) {
        isBias_ = isBiasIn;
        return 0;
    }
    int32_t EnableBias(bool isBiasIn = false) { return SetBias(isBiasIn); }
    int32_t SetFixSplit(int32_t baseMIn = -1, int32_t baseNIn = -1, int32_t baseKIn = -1) {
        fixM_ = baseMIn;
        fixN_ = baseNIn;
        fixK_ = baseKIn;
        return baseMIn >= -1 && baseNIn >= -1 && baseKIn >= -1 ? 0 : -1;
    }
    /* bytes, -1 = all of it; recorded, not used by the model's base-block choice */
    int32_t SetBufferSpace(int32_t l1Size = -1, int32_t l0CSize = -1, int32_t ubSize = -1, int32_t btSize = -1) {
        return l1Size >= -1 && l0CSize >= -1 && ubSize >= -1 && btSize >= -1 ? 0 : -1;
    }
    int32_t SetTraverse(MatrixTraverse traverse) {
        traverse_ = traverse;
        return 0;
    }
    virtual int64_t GetTiling(TCubeTiling &tiling) = 0;

protected:
    struct Operand {
        bool set = false;
        TPosition pos = TPosition::GM;
        CubeFormat format = CubeFormat::ND;
        DataType type = DataType::DT_FLOAT;
        bool trans = false;
    };
    Operand a_, b_, c_, bias_;
    int32_t m_ = 0, n_ = 0, k_ = 0, orgM_ = 0, orgN_ = 0, orgKa_ = 0, orgKb_ = 0;
    int32_t fixM_ = -1, fixN_ = -1, fixK_ = -1;
    bool isBias_ = false;
    MatrixTraverse traverse_ = MatrixTraverse::NOSET;

    static bool gm_nd(const Operand &o) { return o.pos == TPosition::GM && o.format == CubeFormat::ND; }
    static int32_t align16(int32_t v) { return (v + 15) / 16 * 16; }

    /* the whole tiling for a single-core shape (sm, sn, sk) of the shape (m_, n_, k_); -1 if invalid */
    int64_t fill(TCubeTiling &t, int32_t sm, int32_t sn, int32_t sk, int32_t usedCores) const {
        if (!a_.set || !b_.set || !c_.set) return -1;
        if (m_ <= 0 || n_ <= 0 || k_ <= 0 || sm <= 0 || sn <= 0 || sk <= 0 || sm > m_ || sn > n_ || sk > k_) return -1;
        const int32_t oM = orgM_ > 0 ? orgM_ : m_, oN = orgN_ > 0 ? orgN_ : n_;
        const int32_t oKa = orgKa_ > 0 ? orgKa_ : k_, oKb = orgKb_ > 0 ? orgKb_ : k_;
        if (m_ > oM || n_ > oN || k_ > oKa || k_ > oKb) return -1;
        if ((int64_t)oM * oKa > INT32_MAX || (int64_t)oKb * oN > INT32_MAX || (int64_t)oM * oN > INT32_MAX) return -1;
        if (a_.type != b_.type) return -1;
        if (a_.type != DataType::DT_FLOAT16 && a_.type != DataType::DT_BF16 && a_.type != DataType::DT_BFLOAT16 &&
            a_.type != DataType::DT_FLOAT)
            return -1;
        if (c_.type != DataType::DT_FLOAT) return -1;
        if (!gm_nd(a_) || !gm_nd(b_) || !gm_nd(c_)) return -1;
        if (isBias_ && bias_.set && (bias_.type != DataType::DT_FLOAT || !gm_nd(bias_))) return -1;
        const int64_t item = a_.type == DataType::DT_FLOAT ? 4 : 2;
        const int32_t bm = fixM_ > 0 ? fixM_ : std::min<int32_t>(128, align16(sm));
        const int32_t bn = fixN_ > 0 ? fixN_ : std::min<int32_t>(256, align16(sn));
        const int32_t bk = fixK_ > 0 ? fixK_ : std::min<int32_t>(item == 4 ? 32 : 64, align16(sk));
        if ((int64_t)bm * bk * item > ascend_model::kL0ASize || (int64_t)bk * bn * item > ascend_model::kL0BSize ||
            (int64_t)bm * bn * 4 > ascend_model::kL0CSize)
            return -1;
        t = TCubeTiling{};
        t.usedCoreNum = usedCores;
        t.M = oM;
        t.N = oN;
        t.Ka = oKa;
        t.Kb = oKb;
        t.singleCoreM = sm;
        t.singleCoreN = sn;
        t.singleCoreK = sk;
        t.baseM = bm;
        t.baseN = bn;
        t.baseK = bk;
        t.depthA1 = t.depthB1 = t.stepM = t.stepN = t.stepKa = t.stepKb = 1;
        t.isBias = isBias_ ? 1 : 0;
        t.iterateOrder = traverse_ == MatrixTraverse::FIRSTN ? 1 : 0;
        t.dbL0A = t.dbL0B = t.dbL0C = 1;
        return 0;
    }
};

/* single core: singleCoreM/N/K = the shape */
class MatmulApiTiling : public MatmulApiTilingBase {
public:
    MatmulApiTiling() = default;
    explicit MatmulApiTiling(const platform_ascendc::PlatformAscendC &p) : MatmulApiTilingBase(p) {}
    explicit MatmulApiTiling(const PlatformInfo &p) : MatmulApiTilingBase(p) {}
    int64_t GetTiling(TCubeTiling &tiling) override { return fill(tiling, m_, n_, k_, 1); }
};

/* multi-core: SetSingleShape's values (default: the whole shape, one core); usedCoreNum =
 * ceil(M / singleCoreM) * ceil(N / singleCoreN), which must not exceed SetDim's dim (K is not split) */
class MultiCoreMatmulTiling : public MatmulApiTilingBase {
public:
    MultiCoreMatmulTiling() = default;
    explicit MultiCoreMatmulTiling(const platform_ascendc::PlatformAscendC &p) : MatmulApiTilingBase(p) {}
    explicit MultiCoreMatmulTiling(const PlatformInfo &p) : MatmulApiTilingBase(p) {}
    int32_t SetDim(int32_t dim) {
        dim_ = dim;
        return dim > 0 ? 0 : -1;
    }
    virtual int32_t SetSingleShape(int32_t singleMIn = -1, int32_t singleNIn = -1, int32_t singleKIn = -1) {
        sm_ = singleMIn;
        sn_ = singleNIn;
        sk_ = singleKIn;
        return singleMIn >= -1 && singleNIn >= -1 && singleKIn >= -1 ? 0 : -1;
    }
    int32_t GetCoreNum(int32_t &dim, int32_t &mDim, int32_t &nDim) {
        if (m_ <= 0 || n_ <= 0) return -1;
        mDim = (m_ + single(sm_, m_) - 1) / single(sm_, m_);
        nDim = (n_ + single(sn_, n_) - 1) / single(sn_, n_);
        dim = mDim * nDim;
        return 0;
    }
    int64_t GetTiling(TCubeTiling &tiling) override {
        int32_t used = 0, mDim = 0, nDim = 0;
        if (dim_ <= 0 || GetCoreNum(used, mDim, nDim) != 0 || used > dim_) return -1;
        if (sk_ > 0 && sk_ != k_) return -1;
        return fill(tiling, single(sm_, m_), single(sn_, n_), k_, used);
    }

private:
    int32_t dim_ = 0, sm_ = -1, sn_ = -1, sk_ = -1;
    static int32_t single(int32_t s, int32_t whole) { return s > 0 ? std::min(s, whole) : whole; }
};

}  // namespace matmul_tiling

#endif /* OPGEN_ASCENDC_MODEL_TILING_API_H */
