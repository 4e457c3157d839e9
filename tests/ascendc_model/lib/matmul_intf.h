/* lib/matmul_intf.h — opgen's CPU model of Ascend C's high-level Matmul API (cube unit), as
 * CANN 8.x spells it. Modelled subset (docs/ascendc_model.md, "Matmul"):
 *
 *   Matmul<MatmulType<TPosition::GM, CubeFormat::ND, half|bfloat16_t|float [, isTrans]>,  // A
 *          MatmulType<TPosition::GM, CubeFormat::ND, same type [, isTrans]>,                 // B
 *          MatmulType<TPosition::GM, CubeFormat::ND, float>                                  // C
 *          [, MatmulType<TPosition::GM, CubeFormat::ND, float>]> mm;                        // bias
 *   REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm, &tiling [, mm2, &tiling2 ...]);    // <= 4 objects
 *   mm.SetOrgShape(...); mm.SetSingleShape(m, n, k); mm.SetTensorA(gA[off], tA); mm.SetTensorB(gB[off], tB);
 *   mm.IterateAll(gC[off]); ... mm.End();
 *
 * IterateAll computes C[i*ldC + j] = sum over kk ascending of float(opA(i,kk)) * float(opB(kk,j)),
 * accumulated in float (starting from float(bias[j]) with SetBias), for i < m, j < n, with the ND
 * leading dimensions of the org shape:
 *   opA(i,kk) = transA ? A[kk*orgM + i] : A[i*orgKa + kk]
 *   opB(kk,j) = transB ? B[j*orgKb + kk] : B[kk*orgN + j]
 *   ldC       = orgKc ? orgKc : orgN
 * Every block is an AIV (the model has no AIC): the calls compute synchronously in the calling
 * block. Violations abort with rule 11 (matmul), rule 9 (enAtomic) or rule 0 (not modelled). */
#ifndef OPGEN_ASCENDC_MODEL_MATMUL_INTF_H
#define OPGEN_ASCENDC_MODEL_MATMUL_INTF_H

#include <vector>

#include "../kernel_operator.h"
#include "../kernel_tiling/kernel_tiling.h"

/* global, as in asc-devkit's matmul_config.h */
enum class CubeFormat { ND = 0, NZ, ZN, ZZ, NN, ND_ALIGN };

namespace AscendC {

enum class LayoutMode { NONE = 0, BSNGD, SBNGD, BNGS1S2, NORMAL };

template <TPosition POSITION, CubeFormat FORMAT, typename TYPE, bool ISTRANS = false,
          LayoutMode LAYOUT = LayoutMode::NONE, bool IBSHARE = false>
struct MatmulType {
    constexpr static TPosition pos = POSITION;
    constexpr static CubeFormat format = FORMAT;
    using T = TYPE;
    constexpr static bool isTrans = ISTRANS;
    constexpr static LayoutMode layout = LAYOUT;
    constexpr static bool ibShare = IBSHARE;
};

/* the model ignores the configuration (NORM and MDL compute the same result) */
struct MatmulConfig {
    bool doNorm;
    bool doMDL;
};
inline constexpr MatmulConfig CFG_NORM = {true, false};
inline constexpr MatmulConfig CFG_MDL = {false, true};

template <class A_TYPE, class B_TYPE, class C_TYPE, class BIAS_TYPE = C_TYPE, const auto &MM_CFG = CFG_NORM>
class Matmul {
    using SrcAT = typename A_TYPE::T;
    using SrcBT = typename B_TYPE::T;
    using DstT = typename C_TYPE::T;
    using BiasT = typename BIAS_TYPE::T;
    static_assert(A_TYPE::pos == TPosition::GM && B_TYPE::pos == TPosition::GM && C_TYPE::pos == TPosition::GM &&
                      BIAS_TYPE::pos == TPosition::GM,
                  "ascend-model: rule 0 (model): only Matmul operands in TPosition::GM are modelled");
    static_assert(A_TYPE::format == CubeFormat::ND && B_TYPE::format == CubeFormat::ND &&
                      C_TYPE::format == CubeFormat::ND && BIAS_TYPE::format == CubeFormat::ND,
                  "ascend-model: rule 0 (model): only CubeFormat::ND Matmul operands are modelled");
    static_assert(ascend_model::is_one_of<SrcAT, half, bfloat16_t, float>,
                  "ascend-model: rule 11 (matmul): A must be half, bfloat16_t or float");
    static_assert(std::is_same_v<SrcAT, SrcBT>, "ascend-model: rule 11 (matmul): A and B must have the same type");
    static_assert(std::is_same_v<DstT, float>, "ascend-model: rule 11 (matmul): C must be float");
    static_assert(std::is_same_v<BiasT, float>, "ascend-model: rule 11 (matmul): the bias must be float");

public:
    Matmul() = default;
    Matmul(const Matmul &) = delete;
    Matmul &operator=(const Matmul &) = delete;

    void Init(const TCubeTiling *cubeTiling, TPipe *tpipe = nullptr) {
        (void)tpipe;
        block_check("Init");
        if (!registered_)
            fail("Init on a Matmul object that REGIST_MATMUL_OBJ did not register (register it first: "
                 "REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm[, &tiling]))");
        if (!cubeTiling) fail("Init(nullptr): no TCubeTiling");
        const TCubeTiling &t = *cubeTiling;
        if (t.singleCoreM <= 0 || t.singleCoreN <= 0 || t.singleCoreK <= 0 || t.baseM <= 0 || t.baseN <= 0 ||
            t.baseK <= 0)
            fail("Init: TCubeTiling has singleCoreM/N/K %d/%d/%d and baseM/N/K %d/%d/%d (all must be > 0: was "
                 "GetTiling's result checked?)",
                 t.singleCoreM, t.singleCoreN, t.singleCoreK, t.baseM, t.baseN, t.baseK);
        const uint64_t sa = sizeof(SrcAT), db_a = db(t.dbL0A), db_b = db(t.dbL0B), db_c = db(t.dbL0C);
        const uint64_t l0a = (uint64_t)t.baseM * t.baseK * sa * db_a, l0b = (uint64_t)t.baseK * t.baseN * sa * db_b,
                       l0c = (uint64_t)t.baseM * t.baseN * sizeof(float) * db_c;
        if (l0a > ascend_model::kL0ASize)
            fail("cube buffer: baseM %d x baseK %d x %zu B x dbL0A %llu = %llu B > L0A %u B", t.baseM, t.baseK,
                 sizeof(SrcAT), (unsigned long long)db_a, (unsigned long long)l0a, ascend_model::kL0ASize);
        if (l0b > ascend_model::kL0BSize)
            fail("cube buffer: baseK %d x baseN %d x %zu B x dbL0B %llu = %llu B > L0B %u B", t.baseK, t.baseN,
                 sizeof(SrcAT), (unsigned long long)db_b, (unsigned long long)l0b, ascend_model::kL0BSize);
        if (l0c > ascend_model::kL0CSize)
            fail("cube buffer: baseM %d x baseN %d x 4 B x dbL0C %llu = %llu B > L0C %u B", t.baseM, t.baseN,
                 (unsigned long long)db_c, (unsigned long long)l0c, ascend_model::kL0CSize);
        const uint64_t l1 = (uint64_t)db(t.depthA1) * t.baseM * t.baseK * sa +
                            (uint64_t)db(t.depthB1) * t.baseK * t.baseN * sa + (t.isBias ? (uint64_t)t.baseN * 4 : 0);
        if (l1 > ascend_model::kL1Size)
            fail("cube buffer: depthA1 %d A blocks + depthB1 %d B blocks (+ bias) = %llu B > L1 %u B", t.depthA1,
                 t.depthB1, (unsigned long long)l1, ascend_model::kL1Size);
        tiling_ = t;
        inited_ = true;
        org_ = {t.M, t.N, t.Ka, t.Kb, 0};
        has_bias_ = false;
    }

    void SetOrgShape(int orgM, int orgN, int orgK) { SetOrgShape(orgM, orgN, orgK, orgK, 0); }
    void SetOrgShape(int orgM, int orgN, int orgKa, int orgKb, int orgKc = 0) {
        use("SetOrgShape");
        if (orgM <= 0 || orgN <= 0 || orgKa <= 0 || orgKb <= 0 || orgKc < 0)
            fail("SetOrgShape(orgM %d, orgN %d, orgKa %d, orgKb %d, orgKc %d): sizes must be > 0 (orgKc >= 0)", orgM,
                 orgN, orgKa, orgKb, orgKc);
        org_ = {orgM, orgN, orgKa, orgKb, orgKc};
    }
    void SetSingleShape(int singleM, int singleN, int singleK) {
        use("SetSingleShape");
        shape("SetSingleShape", singleM, singleN, singleK);
        m_ = singleM;
        n_ = singleN;
        k_ = singleK;
        shape_set_ = true;
    }
    /* -1 keeps a dimension (the tiling's singleCore value if SetSingleShape was not called) */
    void SetTail(int tailM = -1, int tailN = -1, int tailK = -1) {
        use("SetTail");
        int m = tailM == -1 ? (shape_set_ ? m_ : tiling_.singleCoreM) : tailM;
        int n = tailN == -1 ? (shape_set_ ? n_ : tiling_.singleCoreN) : tailN;
        int k = tailK == -1 ? (shape_set_ ? k_ : tiling_.singleCoreK) : tailK;
        shape("SetTail", m, n, k);
        m_ = m;
        n_ = n;
        k_ = k;
        shape_set_ = true;
    }
    void SetTensorA(const GlobalTensor<SrcAT> &gm, bool isTransposeA = false) {
        use("SetTensorA");
        if (isTransposeA && !A_TYPE::isTrans)
            fail("SetTensorA(gm, isTransposeA = true) but A's MatmulType has ISTRANS = false");
        if (!gm.set_) fail("SetTensorA: GlobalTensor used before SetGlobalBuffer");
        a_ = gm;
        trans_a_ = isTransposeA;
        a_set_ = true;
    }
    void SetTensorB(const GlobalTensor<SrcBT> &gm, bool isTransposeB = false) {
        use("SetTensorB");
        if (isTransposeB && !B_TYPE::isTrans)
            fail("SetTensorB(gm, isTransposeB = true) but B's MatmulType has ISTRANS = false");
        if (!gm.set_) fail("SetTensorB: GlobalTensor used before SetGlobalBuffer");
        b_ = gm;
        trans_b_ = isTransposeB;
        b_set_ = true;
    }
    void SetBias(const GlobalTensor<BiasT> &biasGlobal) {
        use("SetBias");
        if (!tiling_.isBias) fail("SetBias with a TCubeTiling whose isBias is 0 (host: SetBias(true))");
        if (!biasGlobal.set_) fail("SetBias: GlobalTensor used before SetGlobalBuffer");
        bias_ = biasGlobal;
        has_bias_ = true;
    }
    void DisableBias() {
        use("DisableBias");
        has_bias_ = false;
    }
    void ClearBias() { DisableBias(); }

    template <bool sync = true>
    void IterateAll(const GlobalTensor<DstT> &gm, uint8_t enAtomic = 0, bool enSequentialWrite = false,
                    bool waitIterateAll = false, bool fakeMsg = false) {
        static_assert(sync, "ascend-model: rule 0 (model): IterateAll<false> (asynchronous) is not modelled");
        (void)waitIterateAll;
        use("IterateAll");
        if (enAtomic != 0)
            ascend_model::fail(9, "atomic",
                               "Matmul::IterateAll(gm, enAtomic = %u): atomic accumulation of float results into GM is "
                               "forbidden (the result would depend on block order)",
                               (unsigned)enAtomic);
        if (enSequentialWrite || fakeMsg)
            ascend_model::fail(0, "model", "Matmul::IterateAll with enSequentialWrite or fakeMsg is not modelled");
        if (!a_set_ || !b_set_ || !shape_set_)
            fail("IterateAll before %s%s%s", a_set_ ? "" : "SetTensorA ", b_set_ ? "" : "SetTensorB ",
                 shape_set_ ? "" : "SetSingleShape ");
        if (!gm.set_) fail("IterateAll: GlobalTensor used before SetGlobalBuffer");
        const int64_t m = m_, n = n_, k = k_;
        const int64_t oM = org_.m, oN = org_.n, oKa = org_.ka, oKb = org_.kb, ldc = org_.kc ? org_.kc : org_.n;
        /* the ND leading dimensions: a row of the single shape must fit its org row */
        if (trans_a_ ? m > oM : k > oKa)
            fail("IterateAll: A%s rows hold %lld elements (org %s %lld) but the single shape needs %lld",
                 trans_a_ ? " (transposed)" : "", (long long)(trans_a_ ? oM : oKa), trans_a_ ? "M" : "Ka",
                 (long long)(trans_a_ ? oM : oKa), (long long)(trans_a_ ? m : k));
        if (trans_b_ ? k > oKb : n > oN)
            fail("IterateAll: B%s rows hold %lld elements (org %s %lld) but the single shape needs %lld",
                 trans_b_ ? " (transposed)" : "", (long long)(trans_b_ ? oKb : oN), trans_b_ ? "Kb" : "N",
                 (long long)(trans_b_ ? oKb : oN), (long long)(trans_b_ ? k : n));
        if (n > ldc)
            fail("IterateAll: C rows hold %lld elements (org %s %lld) but singleN is %lld", (long long)ldc,
                 org_.kc ? "Kc" : "N", (long long)ldc, (long long)n);
        /* every element read or written lies inside its GlobalTensor (extents: rows * ld + last) */
        const int64_t a_end = trans_a_ ? (k - 1) * oM + m : (m - 1) * oKa + k;
        const int64_t b_end = trans_b_ ? (n - 1) * oKb + k : (k - 1) * oN + n;
        const int64_t c_end = (m - 1) * ldc + n;
        a_.check(0, (uint64_t)a_end * sizeof(SrcAT), "Matmul::IterateAll (A)");
        b_.check(0, (uint64_t)b_end * sizeof(SrcBT), "Matmul::IterateAll (B)");
        gm.check(0, (uint64_t)c_end * sizeof(DstT), "Matmul::IterateAll (C)");
        if (has_bias_) bias_.check(0, (uint64_t)n * sizeof(BiasT), "Matmul::IterateAll (bias)");

        std::vector<float> av((size_t)(m * k)), bv((size_t)(k * n)), acc((size_t)(m * n));
        for (int64_t i = 0; i < m; i++)
            for (int64_t kk = 0; kk < k; kk++)
                av[(size_t)(i * k + kk)] = (float)a_.addr_[trans_a_ ? kk * oM + i : i * oKa + kk];
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t j = 0; j < n; j++)
                bv[(size_t)(kk * n + j)] = (float)b_.addr_[trans_b_ ? j * oKb + kk : kk * oN + j];
        for (int64_t i = 0; i < m; i++) {
            float *row = &acc[(size_t)(i * n)];
            for (int64_t j = 0; j < n; j++) row[j] = has_bias_ ? (float)bias_.addr_[j] : 0.0f;
            for (int64_t kk = 0; kk < k; kk++) {
                const float x = av[(size_t)(i * k + kk)];
                const float *brow = &bv[(size_t)(kk * n)];
                for (int64_t j = 0; j < n; j++) row[j] += x * brow[j];
            }
        }
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) gm.addr_[i * ldc + j] = acc[(size_t)(i * n + j)];
    }

    void End() {
        use("End");
        ended_ = true;
    }

    /* ---- model internals ---- */
    void model_register(TPipe *pipe, const TCubeTiling *tiling) {
        block_check("REGIST_MATMUL_OBJ");
        if (registered_) fail("REGIST_MATMUL_OBJ: this Matmul object is already registered");
        blk_ = ascend_model::block();
        if (!pipe || pipe != blk_->pipe)
            fail("REGIST_MATMUL_OBJ needs the kernel's live TPipe (got %s)", pipe ? "another pipe" : "nullptr");
        if (pipe->nbufs_ != 0)
            fail("REGIST_MATMUL_OBJ after pipe.InitBuffer (%u buffer(s) already): register every Matmul object "
                 "before the first InitBuffer",
                 pipe->nbufs_);
        if (++blk_->mm_objs > 4) fail("REGIST_MATMUL_OBJ: %d Matmul objects registered (at most 4)", blk_->mm_objs);
        registered_ = true;
        if (tiling) Init(tiling, pipe);
    }

private:
    struct Org {
        int m, n, ka, kb, kc;
    };
    TCubeTiling tiling_{};
    Org org_{};
    int m_ = 0, n_ = 0, k_ = 0;
    bool registered_ = false, inited_ = false, ended_ = false, shape_set_ = false;
    bool a_set_ = false, b_set_ = false, trans_a_ = false, trans_b_ = false, has_bias_ = false;
    GlobalTensor<SrcAT> a_;
    GlobalTensor<SrcBT> b_;
    GlobalTensor<BiasT> bias_;
    ascend_model::Block *blk_ = nullptr;

    static uint64_t db(int32_t v) { return v > 1 ? (uint64_t)v : 1; }

    template <typename... Args>
    [[noreturn]] static void fail(const char *fmt, Args... args) {
        char msg[768];
        snprintf(msg, sizeof msg, fmt, args...);
        ascend_model::fail(11, "matmul", "%s", msg);
    }
    [[noreturn]] static void fail(const char *msg) { ascend_model::fail(11, "matmul", "%s", msg); }

    /* the kernel must be a MIX_AIC_1_2 kernel (the AIV issues, the AIC computes) */
    static void block_check(const char *api) {
        if (ascend_model::block()->task_type != KERNEL_TYPE_MIX_AIC_1_2)
            ascend_model::fail(11, "matmul",
                               "Matmul %s in a kernel that did not declare KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) "
                               "(write it first in the kernel body; the launch then runs 1 AIC + 2 AIV per block)",
                               api);
    }
    void use(const char *api) const {
        block_check(api);
        if (!registered_) fail("%s on a Matmul object that REGIST_MATMUL_OBJ never registered", api);
        if (blk_ != ascend_model::block()) fail("%s on a Matmul object registered by another block", api);
        if (!inited_)
            fail("%s before Init (REGIST_MATMUL_OBJ(pipe, ws, mm, &tiling) or mm.Init(&tiling))", api);
        if (ended_) fail("%s after End()", api);
    }
    void shape(const char *api, int m, int n, int k) const {
        if (m <= 0 || n <= 0 || k <= 0 || m > tiling_.singleCoreM || n > tiling_.singleCoreN ||
            k > tiling_.singleCoreK)
            fail("%s(m %d, n %d, k %d): each must be in [1, the tiling's singleCoreM/N/K = %d/%d/%d]", api, m, n, k,
                 tiling_.singleCoreM, tiling_.singleCoreN, tiling_.singleCoreK);
    }
};

}  // namespace AscendC

/* CANN 8.0 spells the API matmul::Matmul / matmul::MatmulType (later AscendC::); both work */
namespace matmul = AscendC;

namespace ascend_model {
template <class MM>
inline void regist_matmul_list(AscendC::TPipe *pipe, MM &mm) {
    mm.model_register(pipe, nullptr);
}
template <class MM, class... Rest>
inline void regist_matmul_list(AscendC::TPipe *pipe, MM &mm, const TCubeTiling *tiling, Rest &&...rest) {
    mm.model_register(pipe, tiling);
    if constexpr (sizeof...(Rest) > 0) regist_matmul_list(pipe, rest...);
}
template <class... Args>
inline void regist_matmul(AscendC::TPipe *pipe, GM_ADDR workspace, Args &&...args) {
    if (!workspace)
        fail(11, "matmul", "REGIST_MATMUL_OBJ with a null system workspace (SetSysWorkspace(workspace) first)");
    regist_matmul_list(pipe, args...);
}
}  // namespace ascend_model

/* REGIST_MATMUL_OBJ(tpipe, workspace, mm1, &tiling1 [, mm2, &tiling2 ...]) or (tpipe, workspace, mm) + mm.Init */
#define REGIST_CUBE_OBJ(tpipe, workspace, ...) ascend_model::regist_matmul(tpipe, workspace, __VA_ARGS__)
#define REGIST_MATMUL_OBJ REGIST_CUBE_OBJ

#endif /* OPGEN_ASCENDC_MODEL_MATMUL_INTF_H */
