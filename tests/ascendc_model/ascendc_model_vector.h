/* ascendc_model_vector.h — vector instructions of opgen's Ascend C CPU model (included by
 * kernel_operator.h; do not include directly). Rules 2 and 7 of ASCENDC.md.
 *
 * Count form ("tensor前n个数据计算"): `count` elements; every operand 32-B aligned (rule 2) and
 * count * sizeof(T) within it; operands identical or disjoint (no partial overlap). Arithmetic:
 * float in IEEE single precision (expf, logf, sqrtf; division exact); half computed in double
 * (float for exp/ln/sqrt/rsqrt/reciprocal) and rounded once to half (nearest even); integers wrap.
 * Supported types are those of Atlas A2 in the vendor docs (static_assert otherwise). */
#ifndef OPGEN_ASCENDC_MODEL_VECTOR_H
#define OPGEN_ASCENDC_MODEL_VECTOR_H

#include <cfloat>
#include <climits>
#include <limits>

namespace AscendC {

struct BinaryRepeatParams {
    BinaryRepeatParams() {}
    BinaryRepeatParams(const uint8_t dstBlkStrideIn, const uint8_t src0BlkStrideIn, const uint8_t src1BlkStrideIn,
                       const uint8_t dstRepStrideIn, const uint8_t src0RepStrideIn, const uint8_t src1RepStrideIn)
        : dstBlkStride(dstBlkStrideIn), src0BlkStride(src0BlkStrideIn), src1BlkStride(src1BlkStrideIn),
          dstRepStride(dstRepStrideIn), src0RepStride(src0RepStrideIn), src1RepStride(src1RepStrideIn) {}
    uint32_t blockNumber = 8;
    uint8_t dstBlkStride = 1;
    uint8_t src0BlkStride = 1;
    uint8_t src1BlkStride = 1;
    uint8_t dstRepStride = 8;
    uint8_t src0RepStride = 8;
    uint8_t src1RepStride = 8;
    bool repeatStrideMode = false;
    bool strideSizeMode = false;
};

}  // namespace AscendC

namespace ascend_model {

/* compute type: half -> double (one rounding back), float -> float, ints -> wider, wrapped back */
template <typename T>
struct Calc;
template <>
struct Calc<half> {
    using C = double;
    static C in(half x) { return (double)(float)x; }
    static half out(C v) { return (half)v; }
};
template <>
struct Calc<float> {
    using C = float;
    static C in(float x) { return x; }
    static float out(C v) { return v; }
};
template <>
struct Calc<int16_t> {
    using C = int32_t;
    static C in(int16_t x) { return x; }
    static int16_t out(C v) { return (int16_t)(uint16_t)(uint32_t)v; }
};
template <>
struct Calc<uint16_t> { /* (And/Or/Not: bits) */
    using C = uint32_t;
    static C in(uint16_t x) { return x; }
    static uint16_t out(C v) { return (uint16_t)v; }
};
template <>
struct Calc<int32_t> {
    using C = int64_t;
    static C in(int32_t x) { return x; }
    static int32_t out(C v) { return (int32_t)(uint32_t)(uint64_t)v; }
};

template <typename C>
inline bool isnan_c(C v) {
    if constexpr (std::is_floating_point_v<C>) return std::isnan(v);
    else return false;
}
/* max/min propagate NaN (the model's choice, see docs) */
template <typename C>
inline C vmax(C a, C b) {
    if (isnan_c(a)) return a;
    if (isnan_c(b)) return b;
    return a < b ? b : a;
}
template <typename C>
inline C vmin(C a, C b) {
    if (isnan_c(a)) return a;
    if (isnan_c(b)) return b;
    return b < a ? b : a;
}

inline uint64_t vcount(int64_t count, const char *api) {
    if (count < 0) fail(7, "vector op", "%s: count %lld is negative", api, (long long)count);
    return (uint64_t)count;
}

/* an operand of a count-form instruction: live (rule 6), aligned (rule 2), large enough */
template <typename T>
inline void voperand(const AscendC::LocalTensor<T> &t, const char *api, const char *what, uint64_t bytes,
                     uint32_t align = 32) {
    t.live(api);
    if (t.addr_ % align != 0)
        fail(2, "ub alignment", "%s: %s starts at UB byte %u (%u mod %u): it must be %u-B aligned", api, what, t.addr_,
             t.addr_ % align, align, align);
    if (bytes > t.len_)
        fail(7, "vector op", "%s: %s needs %llu B but the tensor has %u B", api, what, (unsigned long long)bytes,
             t.len_);
}

/* operands must be identical (same start, same length) or disjoint */
inline void no_partial_overlap(const char *api, const char *an, uint64_t a0, uint64_t alen, const char *bn,
                               uint64_t b0, uint64_t blen) {
    if (alen == 0 || blen == 0) return;
    if (a0 == b0 && alen == blen) return;
    if (a0 + alen <= b0 || b0 + blen <= a0) return;
    fail(7, "vector op", "%s: %s (UB [%llu, %llu)) and %s (UB [%llu, %llu)) partially overlap", api, an,
         (unsigned long long)a0, (unsigned long long)(a0 + alen), bn, (unsigned long long)b0,
         (unsigned long long)(b0 + blen));
}

template <typename T, typename F>
inline void binary(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &s0,
                   const AscendC::LocalTensor<T> &s1, int64_t count, F f) {
    uint64_t n = vcount(count, api);
    dst.live(api);
    s0.live(api);
    s1.live(api);
    if (n == 0) return;
    uint64_t bytes = n * sizeof(T);
    voperand(dst, api, "dst", bytes);
    voperand(s0, api, "src0", bytes);
    voperand(s1, api, "src1", bytes);
    no_partial_overlap(api, "dst", dst.addr_, bytes, "src0", s0.addr_, bytes);
    no_partial_overlap(api, "dst", dst.addr_, bytes, "src1", s1.addr_, bytes);
    T *d = dst.ptr();
    const T *a = s0.ptr();
    const T *b = s1.ptr();
    for (uint64_t i = 0; i < n; i++) d[i] = Calc<T>::out(f(Calc<T>::in(a[i]), Calc<T>::in(b[i])));
}

template <typename T, typename F>
inline void unary(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &src,
                  int64_t count, F f) {
    uint64_t n = vcount(count, api);
    dst.live(api);
    src.live(api);
    if (n == 0) return;
    uint64_t bytes = n * sizeof(T);
    voperand(dst, api, "dst", bytes);
    voperand(src, api, "src", bytes);
    no_partial_overlap(api, "dst", dst.addr_, bytes, "src", src.addr_, bytes);
    T *d = dst.ptr();
    const T *s = src.ptr();
    for (uint64_t i = 0; i < n; i++) d[i] = f(s[i]);
}

/* Repeat ("high-dimensional") form: repeatTime iterations of 256 B; element e < mask of
 * iteration r sits at byte (r * repStride + (e / epb) * blkStride) * 32 + (e % epb) * sizeof(T),
 * epb = 32 / sizeof(T). repeatTime is a uint8_t on hardware: the model takes a wider integer and
 * aborts beyond 255 (rule 7) instead of letting it wrap. */
template <typename T, typename F>
inline void binary_repeat(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &s0,
                          const AscendC::LocalTensor<T> &s1, uint64_t mask, int64_t repeatTime,
                          const AscendC::BinaryRepeatParams &p, F f) {
    if (repeatTime < 0 || repeatTime > 255)
        fail(7, "vector op",
             "%s: repeatTime %lld is outside [0, 255] (a uint8_t on hardware: it would wrap to %lld and silently "
             "compute %s)",
             api, (long long)repeatTime, (long long)(repeatTime & 0xff), (repeatTime & 0xff) ? "less" : "nothing");
    const uint64_t per_repeat = 256 / sizeof(T), epb = 32 / sizeof(T);
    if (mask > per_repeat)
        fail(7, "vector op", "%s: mask %llu > %llu elements of %s per repeat (the hardware would silently clamp it)",
             api, (unsigned long long)mask, (unsigned long long)per_repeat, type_name<T>());
    if (p.repeatStrideMode || p.strideSizeMode || p.blockNumber != 8)
        fail(0, "model", "%s: BinaryRepeatParams blockNumber/repeatStrideMode/strideSizeMode are not modelled", api);
    dst.live(api);
    s0.live(api);
    s1.live(api);
    if (mask == 0 || repeatTime == 0) return;
    voperand(dst, api, "dst", 0);
    voperand(s0, api, "src0", 0);
    voperand(s1, api, "src1", 0);
    auto offset = [&](const AscendC::LocalTensor<T> &t, const char *what, uint64_t r, uint64_t e, uint64_t rep,
                      uint64_t blk) {
        uint64_t off = (r * rep + (e / epb) * blk) * 32 + (e % epb) * sizeof(T);
        if (off + sizeof(T) > t.len_)
            fail(7, "vector op", "%s: repeat %llu element %llu of %s is at byte %llu, past the tensor's %u B", api,
                 (unsigned long long)r, (unsigned long long)e, what, (unsigned long long)off, t.len_);
        return off;
    };
    std::vector<T> out;
    std::vector<uint64_t> where;
    for (uint64_t r = 0; r < (uint64_t)repeatTime; r++)
        for (uint64_t e = 0; e < mask; e++) {
            uint64_t a = offset(s0, "src0", r, e, p.src0RepStride, p.src0BlkStride);
            uint64_t b = offset(s1, "src1", r, e, p.src1RepStride, p.src1BlkStride);
            T x, y;
            memcpy(&x, (const uint8_t *)s0.ptr() + a, sizeof(T));
            memcpy(&y, (const uint8_t *)s1.ptr() + b, sizeof(T));
            out.push_back(Calc<T>::out(f(Calc<T>::in(x), Calc<T>::in(y))));
            where.push_back(offset(dst, "dst", r, e, p.dstRepStride, p.dstBlkStride));
        }
    for (size_t i = 0; i < out.size(); i++) memcpy((uint8_t *)dst.ptr() + where[i], &out[i], sizeof(T));
}

/* ---- rounding for Cast (exact in long double: 64-bit significand on x86-64) ---- */
using RM = AscendC::RoundMode;
inline bool rounds_up(RM m, bool neg, long double fl, long double frac) {
    bool odd = fmodl(fl, 2.0L) != 0;
    switch (m) {
        case RM::CAST_NONE:
        case RM::CAST_RINT: return frac > 0.5L || (frac == 0.5L && odd);
        case RM::CAST_ROUND: return frac >= 0.5L;
        case RM::CAST_TRUNC: return false;
        case RM::CAST_FLOOR: return neg && frac > 0;
        case RM::CAST_CEIL: return !neg && frac > 0;
        case RM::CAST_ODD: return frac > 0 && !odd;
        default: fail(0, "model", "Cast: RoundMode %d is not modelled", (int)m);
    }
}
/* x rounded to a multiple of 2^q */
inline long double round_grid(long double x, int q, RM m) {
    if (x == 0 || !std::isfinite(x)) return x;
    bool neg = std::signbit(x);
    long double t = ldexpl(fabsl(x), -q), fl = floorl(t);
    long double r = ldexpl(fl + (rounds_up(m, neg, fl, t - fl) ? 1 : 0), q);
    return neg ? -r : r;
}
/* x rounded to a binary format with p significand bits and minimum normal exponent emin */
inline long double round_format(long double x, int p, int emin, RM m) {
    if (x == 0 || !std::isfinite(x)) return x;
    int e = ilogbl(x);
    if (e < emin) e = emin;
    return round_grid(x, e - p + 1, m);
}
/* on overflow, modes that round the magnitude down give the largest finite value */
inline bool overflow_to_max(RM m, bool neg) {
    return m == RM::CAST_TRUNC || m == RM::CAST_ODD || (m == RM::CAST_FLOOR && !neg) || (m == RM::CAST_CEIL && neg);
}

template <typename S>
inline long double to_ld(S s) {
    if constexpr (std::is_same_v<S, half>) return (long double)(float)s;
    else if constexpr (std::is_same_v<S, bfloat16_t>) return (long double)(float)s;
    else return (long double)s;
}

template <typename D>
struct FloatFormat;
template <>
struct FloatFormat<half> {
    static constexpr int p = 11, emin = -14;
    static constexpr long double max = 65504.0L;
};
template <>
struct FloatFormat<bfloat16_t> {
    static constexpr int p = 8, emin = -126;
    static constexpr long double max = 3.38953138925153547590470800371487867e+38L; /* (2 - 2^-7) * 2^127 */
};
template <>
struct FloatFormat<float> {
    static constexpr int p = 24, emin = -126;
    static constexpr long double max = FLT_MAX;
};

template <typename D, typename S>
inline D cast_one(S s, RM m) {
    long double x = to_ld(s);
    if constexpr (is_float_like<D>) {
        if constexpr (std::is_same_v<D, float> && std::is_same_v<S, float>) {
            return (float)round_grid(x, 0, m); /* float -> float: round to an integral value */
        } else {
            if (std::isnan(x)) return D((float)x);
            long double r = round_format(x, FloatFormat<D>::p, FloatFormat<D>::emin, m);
            if (std::isfinite(r) && fabsl(r) > FloatFormat<D>::max) {
                bool neg = std::signbit(r);
                r = overflow_to_max(m, neg) ? FloatFormat<D>::max : (long double)INFINITY;
                if (neg) r = -r;
            }
            return D((float)r);
        }
    } else {
        if (std::isnan(x)) return 0;
        long double r = round_grid(x, 0, m);
        const long double lo = (long double)std::numeric_limits<D>::min(), hi = (long double)std::numeric_limits<D>::max();
        if (r < lo) return std::numeric_limits<D>::min();
        if (r > hi) return std::numeric_limits<D>::max();
        return (D)r;
    }
}

/* Cast pairs of Atlas A2 and their round modes (asc-devkit docs, Cast "A2 支持的数据类型组合") */
enum : unsigned {
    M_NONE = 1u << 0,
    M_RINT = 1u << 1,
    M_FLOOR = 1u << 2,
    M_CEIL = 1u << 3,
    M_ROUND = 1u << 4,
    M_TRUNC = 1u << 5,
    M_ODD = 1u << 6,
    M_DEQ = 1u << 7, /* int32 -> half: needs SetDeqScale, not modelled */
    M_R5 = M_RINT | M_FLOOR | M_CEIL | M_ROUND | M_TRUNC,
};
template <typename D, typename S>
constexpr unsigned cast_modes() {
#define ASCM_PAIR(s, d, modes) \
    if constexpr (std::is_same_v<S, s> && std::is_same_v<D, d>) return modes;
    ASCM_PAIR(int8_t, half, M_NONE)
    ASCM_PAIR(uint8_t, half, M_NONE)
    ASCM_PAIR(int16_t, half, M_R5 | M_NONE)
    ASCM_PAIR(int16_t, float, M_NONE)
    ASCM_PAIR(half, int8_t, M_R5 | M_NONE)
    ASCM_PAIR(half, uint8_t, M_R5 | M_NONE)
    ASCM_PAIR(half, int16_t, M_R5)
    ASCM_PAIR(half, int32_t, M_R5)
    ASCM_PAIR(half, float, M_NONE)
    ASCM_PAIR(bfloat16_t, int32_t, M_R5)
    ASCM_PAIR(bfloat16_t, float, M_NONE)
    ASCM_PAIR(int32_t, int16_t, M_NONE)
    ASCM_PAIR(int32_t, half, M_DEQ)
    ASCM_PAIR(int32_t, float, M_R5 | M_NONE)
    ASCM_PAIR(int32_t, int64_t, M_NONE)
    ASCM_PAIR(float, int16_t, M_R5)
    ASCM_PAIR(float, half, M_R5 | M_ODD | M_NONE)
    ASCM_PAIR(float, bfloat16_t, M_R5)
    ASCM_PAIR(float, int32_t, M_R5)
    ASCM_PAIR(float, float, M_R5)
    ASCM_PAIR(float, int64_t, M_R5)
    ASCM_PAIR(int64_t, int32_t, M_NONE)
    ASCM_PAIR(int64_t, float, M_R5)
#undef ASCM_PAIR
    return 0;
}

inline const char *mode_name(RM m) {
    static const char *names[] = {"CAST_NONE", "CAST_RINT",  "CAST_FLOOR", "CAST_CEIL",
                                  "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
    return (unsigned)m < 7 ? names[(unsigned)m] : "?";
}

/* ReduceSum of one 256-B repeat: pairwise (adjacent) binary tree, masked lanes left out */
template <typename T>
inline T tree_sum(const T *v, uint64_t n) {
    std::vector<T> level(v, v + n);
    while (level.size() > 1) {
        std::vector<T> next;
        for (size_t i = 0; i < level.size(); i += 2)
            next.push_back(i + 1 < level.size() ? Calc<T>::out(Calc<T>::in(level[i]) + Calc<T>::in(level[i + 1]))
                                                : level[i]);
        level.swap(next);
    }
    return level[0];
}

template <typename T>
inline void reduce_common(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &src,
                          const AscendC::LocalTensor<T> &work, uint64_t n, uint32_t dst_elems) {
    voperand(src, api, "src", n * sizeof(T));
    voperand(work, api, "sharedTmpBuffer", 0);
    voperand(dst, api, "dst", (uint64_t)dst_elems * sizeof(T), (uint32_t)(dst_elems * sizeof(T)));
    no_partial_overlap(api, "dst", dst.addr_, dst_elems * sizeof(T), "src", src.addr_, n * sizeof(T));
}

template <typename T, bool is_max>
inline void reduce_extreme(const char *api, const AscendC::LocalTensor<T> &dst, const AscendC::LocalTensor<T> &src,
                           const AscendC::LocalTensor<T> &work, int64_t count, bool calIndex) {
    static_assert(is_one_of<T, half, float>,
                  "ascend-model: rule 7 (vector op): ReduceMax/ReduceMin support half and float on A2");
    uint64_t n = vcount(count, api);
    dst.live(api);
    src.live(api);
    work.live(api);
    if (n == 0) return;
    reduce_common(api, dst, src, work, n, calIndex ? 2 : 1);
    /* sharedTmpBuffer size, as the vendor docs compute it (elements) */
    const uint64_t epb = 32 / sizeof(T), epr = 256 / sizeof(T);
    auto up = [](uint64_t a, uint64_t b) { return (a + b - 1) / b; };
    uint64_t first = n / epr ? n / epr : 1, need;
    if (!calIndex) {
        need = up(first * 2, epb) * epb;
    } else {
        uint64_t out1 = first * 2, start2 = up(out1, epb) * epb, out2 = up(out1, epr) * 2, end2 = up(out2, epb) * epb;
        need = start2 + end2;
        if (out2 > 2) {
            uint64_t out3 = up(out2, epr) * 2, end3 = up(out3, epb) * epb;
            need = start2 + end2 + end3;
        }
    }
    if (need * sizeof(T) > work.len_)
        fail(7, "vector op", "%s: sharedTmpBuffer has %u B; %llu elements of %s (%llu B) are needed for count %llu%s",
             api, work.len_, (unsigned long long)need, type_name<T>(), (unsigned long long)(need * sizeof(T)),
             (unsigned long long)n, calIndex ? " with calIndex" : "");
    if (std::is_same_v<T, half> && calIndex && n > 65536)
        fail(7, "vector op", "%s: half indices stop at 65535 (count %llu)", api, (unsigned long long)n);
    const T *s = src.ptr();
    uint64_t best = 0;
    for (uint64_t i = 1; i < n && !isnan_c(Calc<T>::in(s[best])); i++) {
        auto a = Calc<T>::in(s[i]), b = Calc<T>::in(s[best]);
        if (isnan_c(a) || (is_max ? a > b : a < b)) best = i;
    }
    T *d = dst.ptr();
    d[0] = s[best];
    if (calIndex) {
        if constexpr (sizeof(T) == 2) {
            uint16_t bits = (uint16_t)best;
            memcpy(&d[1], &bits, 2);
        } else {
            uint32_t bits = (uint32_t)best;
            memcpy(&d[1], &bits, 4);
        }
    }
}

}  // namespace ascend_model

namespace AscendC {

/* ---- binary, count form ---- */
#define ASCM_TYPES_ARITH "int16_t, half, int32_t, float"
#define ASCM_BINARY(Name, Types, TypeText, expr)                                                                   \
    template <typename T>                                                                                          \
    inline void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src0, const LocalTensor<T> &src1,            \
                     const int32_t &count) {                                                                        \
        static_assert(ascend_model::is_one_of<T, Types>,                                                           \
                      "ascend-model: rule 7 (vector op): " #Name " supports " TypeText " on A2");                  \
        ascend_model::binary(#Name, dst, src0, src1, count, [](auto a, auto b) { return expr; });                  \
    }                                                                                                              \
    template <typename T, bool isSetMask = true>                                                                   \
    inline void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src0, const LocalTensor<T> &src1,            \
                     uint64_t mask, const int64_t repeatTime, const BinaryRepeatParams &repeatParams) {             \
        static_assert(ascend_model::is_one_of<T, Types>,                                                           \
                      "ascend-model: rule 7 (vector op): " #Name " supports " TypeText " on A2");                  \
        ascend_model::binary_repeat(#Name "(mask, repeatTime)", dst, src0, src1, mask, repeatTime, repeatParams,    \
                                    [](auto a, auto b) { return expr; });                                          \
    }

#define ASCM_ARITH int16_t, half, int32_t, float
#define ASCM_FLOATS half, float
ASCM_BINARY(Add, ASCM_ARITH, ASCM_TYPES_ARITH, a + b)
ASCM_BINARY(Sub, ASCM_ARITH, ASCM_TYPES_ARITH, a - b)
ASCM_BINARY(Mul, ASCM_ARITH, ASCM_TYPES_ARITH, a * b)
ASCM_BINARY(Div, ASCM_FLOATS, "half, float", a / b)
ASCM_BINARY(Max, ASCM_ARITH, ASCM_TYPES_ARITH, ascend_model::vmax(a, b))
ASCM_BINARY(Min, ASCM_ARITH, ASCM_TYPES_ARITH, ascend_model::vmin(a, b))
#define ASCM_BITS int16_t, uint16_t
ASCM_BINARY(And, ASCM_BITS, "int16_t, uint16_t", (decltype(a))(a & b))
ASCM_BINARY(Or, ASCM_BITS, "int16_t, uint16_t", (decltype(a))(a | b))
#undef ASCM_BINARY

/* ---- vector-scalar ---- */
#define ASCM_SCALAR(Name, expr)                                                                                     \
    template <typename T, bool isSetMask = true>                                                                    \
    inline void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src, const T &scalarValue,                    \
                     const int32_t &count) {                                                                         \
        static_assert(ascend_model::is_one_of<T, ASCM_ARITH>,                                                       \
                      "ascend-model: rule 7 (vector op): " #Name " supports " ASCM_TYPES_ARITH " on A2");           \
        using C = ascend_model::Calc<T>;                                                                            \
        const auto b = C::in(scalarValue);                                                                          \
        ascend_model::unary(#Name, dst, src, count, [b](T x) {                                                      \
            const auto a = C::in(x);                                                                                \
            return C::out(expr);                                                                                    \
        });                                                                                                         \
    }
ASCM_SCALAR(Adds, a + b)
ASCM_SCALAR(Muls, a * b)
ASCM_SCALAR(Maxs, ascend_model::vmax(a, b))
ASCM_SCALAR(Mins, ascend_model::vmin(a, b))
#undef ASCM_SCALAR

/* ---- unary ---- */
#define ASCM_UNARY(Name, Types, TypeText, fexpr)                                                                    \
    template <typename T>                                                                                           \
    inline void Name(const LocalTensor<T> &dst, const LocalTensor<T> &src, const int32_t &count) {                  \
        static_assert(ascend_model::is_one_of<T, Types>,                                                            \
                      "ascend-model: rule 7 (vector op): " #Name " supports " TypeText " on A2");                   \
        ascend_model::unary(#Name, dst, src, count, [](T x) -> T {                                                  \
            if constexpr (std::is_same_v<T, half>) {                                                                \
                float v = (float)x;                                                                                 \
                return (half)(fexpr);                                                                               \
            } else if constexpr (std::is_same_v<T, float>) {                                                        \
                float v = x;                                                                                        \
                return fexpr;                                                                                       \
            } else {                                                                                                \
                T v = x;                                                                                            \
                return (T)(fexpr);                                                                                  \
            }                                                                                                       \
        });                                                                                                         \
    }
ASCM_UNARY(Exp, ASCM_FLOATS, "half, float", expf(v))
ASCM_UNARY(Ln, ASCM_FLOATS, "half, float", logf(v))
ASCM_UNARY(Sqrt, ASCM_FLOATS, "half, float", sqrtf(v))
ASCM_UNARY(Rsqrt, ASCM_FLOATS, "half, float", 1.0f / sqrtf(v))
ASCM_UNARY(Reciprocal, ASCM_FLOATS, "half, float", 1.0f / v)
ASCM_UNARY(Abs, ASCM_FLOATS, "half, float", fabsf(v))
template <typename T>
inline void Not(const LocalTensor<T> &dst, const LocalTensor<T> &src, const int32_t &count) {
    static_assert(ascend_model::is_one_of<T, ASCM_BITS>, "ascend-model: rule 7 (vector op): Not supports int16_t, "
                                                         "uint16_t on A2");
    ascend_model::unary("Not", dst, src, count, [](T x) -> T { return (T)~x; });
}
#undef ASCM_BITS
#define ASCM_RELU_TYPES half, int32_t, float
ASCM_UNARY(Relu, ASCM_RELU_TYPES, "half, int32_t, float", (v < 0 ? 0 : v))
#undef ASCM_RELU_TYPES
#undef ASCM_UNARY

/* ---- Duplicate ---- */
template <typename T>
inline void Duplicate(const LocalTensor<T> &dst, const T &scalarValue, const int32_t &count) {
    static_assert(ascend_model::is_one_of<T, int16_t, uint16_t, half, bfloat16_t, int32_t, uint32_t, float>,
                  "ascend-model: rule 7 (vector op): Duplicate supports int16_t, uint16_t, half, bfloat16_t, int32_t, "
                  "uint32_t, float on A2");
    const char *api = "Duplicate";
    uint64_t n = ascend_model::vcount(count, api);
    dst.live(api);
    if (n == 0) return;
    ascend_model::voperand(dst, api, "dst", n * sizeof(T));
    T *d = dst.ptr();
    for (uint64_t i = 0; i < n; i++) d[i] = scalarValue;
}

/* ---- Cast (pairs and modes of A2; see cast_modes) ---- */
template <typename T, typename U>
inline void Cast(const LocalTensor<T> &dst, const LocalTensor<U> &src, const RoundMode &roundMode,
                 const uint32_t count) {
    constexpr unsigned modes = ascend_model::cast_modes<T, U>();
    static_assert(modes != 0,
                  "ascend-model: rule 7 (vector op): this Cast<dst, src> pair is not supported on A2 (see the pair "
                  "table in docs/ascendc_model.md)");
    const char *api = "Cast";
    dst.live(api);
    src.live(api);
    if constexpr (modes == ascend_model::M_DEQ) {
        ascend_model::fail(0, "model", "Cast int32_t->half works with SetDeqScale on A2, which is not modelled");
    } else {
        if ((unsigned)roundMode > 6 || !(modes & (1u << (unsigned)roundMode)))
            ascend_model::fail(7, "vector op", "Cast %s->%s does not support RoundMode::%s on A2",
                               ascend_model::type_name<U>(), ascend_model::type_name<T>(),
                               ascend_model::mode_name(roundMode));
        if (count == 0) return;
        uint64_t db = (uint64_t)count * sizeof(T), sb = (uint64_t)count * sizeof(U);
        ascend_model::voperand(dst, api, "dst", db);
        ascend_model::voperand(src, api, "src", sb);
        ascend_model::no_partial_overlap(api, "dst", dst.addr_, db, "src", src.addr_, sb);
        T *d = dst.ptr();
        const U *s = src.ptr();
        for (uint32_t i = 0; i < count; i++) {
            if constexpr (std::is_same_v<T, uint8_t>)
                if ((float)s[i] < 0)
                    ascend_model::fail(7, "vector op", "Cast %s->uint8_t of the negative value %g (element %u) is an "
                                                       "exception on hardware",
                                       ascend_model::type_name<U>(), (double)(float)s[i], i);
            d[i] = ascend_model::cast_one<T>(s[i], roundMode);
        }
    }
}

/* ---- reductions: the result goes to dst[0] (ReduceMax/Min with calIndex: the index's bits in
 * dst[1], to be read back with a reinterpret to uint16_t (half) / uint32_t (float)) ---- */
template <typename T, bool isSetMask = true>
inline void ReduceSum(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LocalTensor<T> &sharedTmpBuffer,
                      const int32_t count) {
    static_assert(ascend_model::is_one_of<T, half, float>,
                  "ascend-model: rule 7 (vector op): ReduceSum supports half and float on A2");
    const char *api = "ReduceSum";
    uint64_t n = ascend_model::vcount(count, api);
    dst.live(api);
    src.live(api);
    sharedTmpBuffer.live(api);
    if (n == 0) return;
    ascend_model::reduce_common(api, dst, src, sharedTmpBuffer, n, 1);
    /* A2 count form ("方式一"): a binary tree inside each 256-B repeat, the repeats' sums added in
     * order; sharedTmpBuffer is not used */
    const uint64_t per = 256 / sizeof(T);
    const T *s = src.ptr();
    T acc = ascend_model::tree_sum(s, n < per ? n : per);
    for (uint64_t r = per; r < n; r += per) {
        T part = ascend_model::tree_sum(s + r, n - r < per ? n - r : per);
        acc = ascend_model::Calc<T>::out(ascend_model::Calc<T>::in(acc) + ascend_model::Calc<T>::in(part));
    }
    dst.ptr()[0] = acc;
}

template <typename T>
inline void ReduceMax(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LocalTensor<T> &sharedTmpBuffer,
                      const int32_t count, bool calIndex = 0) {
    ascend_model::reduce_extreme<T, true>("ReduceMax", dst, src, sharedTmpBuffer, count, calIndex);
}
template <typename T>
inline void ReduceMin(const LocalTensor<T> &dst, const LocalTensor<T> &src, const LocalTensor<T> &sharedTmpBuffer,
                      const int32_t count, bool calIndex = 0) {
    ascend_model::reduce_extreme<T, false>("ReduceMin", dst, src, sharedTmpBuffer, count, calIndex);
}

/* ---- Compare: bit i (LSB first) of byte i/8 of dst = src0[i] <op> src1[i] ---- */
namespace detail {
/* Compare's and CompareScalar's rules and bits; src1 null: the scalar y1 */
template <typename T, typename U>
inline void compare(const char *api, const LocalTensor<U> &dst, const LocalTensor<T> &src0,
                    const LocalTensor<T> *src1, T y1, CMPMODE cmpMode, uint32_t count) {
    static_assert(ascend_model::is_one_of<T, half, float, int32_t>,
                  "ascend-model: rule 7 (vector op): Compare/CompareScalar support half, float (and int32_t with "
                  "EQ) on A2");
    static_assert(ascend_model::is_one_of<U, int8_t, uint8_t>,
                  "ascend-model: rule 7 (vector op): Compare/CompareScalar write their bit mask to int8_t/uint8_t");
    dst.live(api);
    src0.live(api);
    if (src1) src1->live(api);
    if (std::is_same_v<T, int32_t> && cmpMode != CMPMODE::EQ)
        ascend_model::fail(7, "vector op", "%s<int32_t> supports only CMPMODE::EQ on A2", api);
    if ((unsigned)cmpMode > 5) ascend_model::fail(7, "vector op", "%s: unknown CMPMODE %u", api, (unsigned)cmpMode);
    if (count == 0) return;
    uint64_t bytes = (uint64_t)count * sizeof(T);
    if (bytes % 256 != 0)
        ascend_model::fail(7, "vector op",
                           "%s: count %u x %s = %llu B is not a multiple of 256 B (the hardware leaves the "
                           "incomplete repeat out)",
                           api, count, ascend_model::type_name<T>(), (unsigned long long)bytes);
    ascend_model::voperand(src0, api, "src0", bytes);
    ascend_model::voperand(dst, api, "dst", count / 8);
    ascend_model::no_partial_overlap(api, "dst", dst.addr_, count / 8, "src0", src0.addr_, bytes);
    if (src1) {
        ascend_model::voperand(*src1, api, "src1", bytes);
        ascend_model::no_partial_overlap(api, "dst", dst.addr_, count / 8, "src1", src1->addr_, bytes);
    }
    const T *a = src0.ptr();
    const T *b = src1 ? src1->ptr() : nullptr;
    uint8_t *d = (uint8_t *)dst.ptr();
    memset(d, 0, count / 8);
    for (uint32_t i = 0; i < count; i++) {
        const T bi = b ? b[i] : y1;
        auto x = (double)(float)a[i], y = (double)(float)bi;
        if constexpr (std::is_same_v<T, int32_t>) x = a[i], y = bi;
        bool r = false;
        switch (cmpMode) {
            case CMPMODE::LT: r = x < y; break;
            case CMPMODE::GT: r = x > y; break;
            case CMPMODE::EQ: r = x == y; break;
            case CMPMODE::LE: r = x <= y; break;
            case CMPMODE::GE: r = x >= y; break;
            case CMPMODE::NE: r = x != y; break;
        }
        if (r) d[i / 8] |= (uint8_t)(1u << (i % 8));
    }
}
}  // namespace detail

template <typename T, typename U>
inline void Compare(const LocalTensor<U> &dst, const LocalTensor<T> &src0, const LocalTensor<T> &src1, CMPMODE cmpMode,
                    uint32_t count) {
    detail::compare("Compare", dst, src0, &src1, T{}, cmpMode, count);
}

/* ---- CompareScalar: bit i of dst = src0[i] <op> src1Scalar (the same rules as Compare: the count
 * covers whole 256-byte repeats) ---- */
template <typename T, typename U>
inline void CompareScalar(const LocalTensor<U> &dst, const LocalTensor<T> &src0, const T src1Scalar, CMPMODE cmpMode,
                          uint32_t count) {
    detail::compare("CompareScalar", dst, src0, (const LocalTensor<T> *)nullptr, src1Scalar, cmpMode, count);
}

/* ---- Select: dst[i] = bit i of selMask ? src0[i] : src1 (tensor [mode 2] or scalar [mode 1]) ---- */
namespace detail {
template <typename T, typename U, typename Pick>
inline void select(const char *api, const LocalTensor<T> &dst, const LocalTensor<U> &mask, const LocalTensor<T> &src0,
                   const LocalTensor<T> *src1, uint32_t count, Pick pick) {
    static_assert(ascend_model::is_one_of<T, half, float>,
                  "ascend-model: rule 7 (vector op): Select supports half and float on A2");
    static_assert(ascend_model::is_one_of<U, uint8_t, uint16_t, uint32_t, uint64_t>,
                  "ascend-model: rule 7 (vector op): Select's selMask is uint8_t/uint16_t/uint32_t/uint64_t");
    dst.live(api);
    mask.live(api);
    src0.live(api);
    if (src1) src1->live(api);
    if (count == 0) return;
    uint64_t bytes = (uint64_t)count * sizeof(T), mbytes = (count + 7) / 8;
    ascend_model::voperand(dst, api, "dst", bytes);
    ascend_model::voperand(mask, api, "selMask", mbytes);
    ascend_model::voperand(src0, api, "src0", bytes);
    ascend_model::no_partial_overlap(api, "dst", dst.addr_, bytes, "src0", src0.addr_, bytes);
    ascend_model::no_partial_overlap(api, "dst", dst.addr_, bytes, "selMask", mask.addr_, mbytes);
    if (src1) {
        ascend_model::voperand(*src1, api, "src1", bytes);
        ascend_model::no_partial_overlap(api, "dst", dst.addr_, bytes, "src1", src1->addr_, bytes);
    }
    const uint8_t *m = (const uint8_t *)mask.ptr();
    T *d = dst.ptr();
    const T *a = src0.ptr();
    for (uint32_t i = 0; i < count; i++) d[i] = (m[i / 8] >> (i % 8)) & 1 ? a[i] : pick(i);
}
}  // namespace detail

template <typename T, typename U>
inline void Select(const LocalTensor<T> &dst, const LocalTensor<U> &selMask, const LocalTensor<T> &src0,
                   const LocalTensor<T> &src1, SELMODE selMode, uint32_t count) {
    if (selMode == SELMODE::VSEL_CMPMASK_SPR)
        ascend_model::fail(0, "model", "Select with VSEL_CMPMASK_SPR (the CMPMASK register) is not modelled");
    if (selMode != SELMODE::VSEL_TENSOR_TENSOR_MODE)
        ascend_model::fail(7, "vector op", "Select(dst, mask, src0, src1 tensor, ...) needs VSEL_TENSOR_TENSOR_MODE");
    const T *b = src1.ptr();
    detail::select("Select", dst, selMask, src0, &src1, count, [b](uint32_t i) { return b[i]; });
}

template <typename T, typename U>
inline void Select(const LocalTensor<T> &dst, const LocalTensor<U> &selMask, const LocalTensor<T> &src0, T src1,
                   SELMODE selMode, uint32_t count) {
    if (selMode != SELMODE::VSEL_TENSOR_SCALAR_MODE)
        ascend_model::fail(7, "vector op", "Select(dst, mask, src0, scalar, ...) needs VSEL_TENSOR_SCALAR_MODE");
    detail::select("Select", dst, selMask, src0, (const LocalTensor<T> *)nullptr, count,
                   [src1](uint32_t) { return src1; });
}

#undef ASCM_ARITH
#undef ASCM_FLOATS
#undef ASCM_TYPES_ARITH

}  // namespace AscendC

#endif /* OPGEN_ASCENDC_MODEL_VECTOR_H */
