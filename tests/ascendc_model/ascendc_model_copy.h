/* ascendc_model_copy.h — DataCopy / DataCopyPad of opgen's Ascend C CPU model (included by
 * kernel_operator.h; do not include directly). Rules 2, 3, 4, 8 and 9 of ASCENDC.md. */
#ifndef OPGEN_ASCENDC_MODEL_COPY_H
#define OPGEN_ASCENDC_MODEL_COPY_H

namespace AscendC {

/* DataCopy(dst, src, DataCopyParams): every length and gap in 32-B DataBlocks. */
struct DataCopyParams {
    DataCopyParams() {}
    DataCopyParams(const uint16_t count, const uint16_t len, const uint16_t srcStrideIn, const uint16_t dstStrideIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn) {}
    uint16_t blockCount = 1;
    uint16_t blockLen = 0;
    union {
        uint16_t srcGap = 0;
        uint16_t srcStride;
    };
    union {
        uint16_t dstGap = 0;
        uint16_t dstStride;
    };
};

/* DataCopyPad: blockLen in bytes; the GM-side gap in bytes, the UB-side gap in 32-B blocks. */
struct DataCopyExtParams {
    DataCopyExtParams() {}
    DataCopyExtParams(const uint16_t count, const uint32_t len, const uint32_t srcStrideIn,
                      const uint32_t dstStrideIn, const uint32_t rsvIn)
        : blockCount(count), blockLen(len), srcStride(srcStrideIn), dstStride(dstStrideIn), rsv(rsvIn) {}
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;
    uint32_t srcStride = 0;
    uint32_t dstStride = 0;
    uint32_t rsv = 0;
};

template <typename T>
struct DataCopyPadExtParams {
    DataCopyPadExtParams() {}
    DataCopyPadExtParams(const bool isPadValue, const uint8_t leftPadValue, const uint8_t rightPadValue, T padValue)
        : isPad(isPadValue), leftPadding(leftPadValue), rightPadding(rightPadValue), paddingValue(padValue) {}
    bool isPad = false;
    uint8_t leftPadding = 0;  /* elements */
    uint8_t rightPadding = 0; /* elements */
    T paddingValue = 0;
};

}  // namespace AscendC

namespace ascend_model {

/* what the hardware leaves undefined is filled with this byte (a NaN in every float type) */
constexpr uint8_t POISON = 0xFF;
constexpr uint32_t MAX_BLOCK_COUNT = 4095;      /* DataCopy*Params::blockCount, 12 bits */
constexpr uint32_t MAX_PAD_BLOCK_LEN = 2097151; /* DataCopyExtParams::blockLen (bytes) */
constexpr uint32_t MAX_UB_GAP = 65535;          /* UB-side gap in 32-B blocks, see docs */

template <typename T>
inline void ub_aligned(const AscendC::LocalTensor<T> &t, const char *api, const char *what) {
    if (t.addr_ % 32 != 0)
        fail(2, "ub alignment", "%s: %s starts at UB byte %u (%u mod 32): UB operands must be 32-B aligned", api, what,
             t.addr_, t.addr_ % 32);
}
template <typename T>
inline void ub_fits(const AscendC::LocalTensor<T> &t, uint64_t bytes, const char *api, const char *what) {
    if (bytes > t.len_)
        fail(0, "bounds", "%s: %llu B of the %s tensor are needed but it has %u B (UB %u..%u)", api,
             (unsigned long long)bytes, what, t.len_, t.addr_, t.addr_ + t.len_);
}
template <typename T>
inline void whole_blocks(uint64_t count, const char *api) {
    uint64_t bytes = count * sizeof(T);
    if (bytes % 32 != 0)
        fail(3, "datacopy length",
             "%s: %llu x %s = %llu B is not a multiple of 32 B (the hardware would move whole 32-B blocks; use "
             "DataCopyPad for unaligned rows)",
             api, (unsigned long long)count, type_name<T>(), (unsigned long long)bytes);
}

/* GM <- UB bytes, as a plain copy or (SetAtomicAdd<T> on) an atomic read-modify-write add */
template <typename T>
inline void gm_store(T *dst, const T *src, uint64_t n, const char *api) {
    Block *b = block();
    if (!b->atomic) {
        memcpy(dst, src, n * sizeof(T));
        return;
    }
    if constexpr (is_one_of<T, int8_t, int16_t, int32_t>) {
        if (strcmp(b->atomic_type, type_name<T>()) != 0)
            fail(9, "atomic", "%s of %s while SetAtomicAdd<%s>() is on: the types must match", api, type_name<T>(),
                 b->atomic_type);
        using U = std::make_unsigned_t<T>;
        gm_atomic_lock();
        for (uint64_t i = 0; i < n; i++) dst[i] = (T)(U)((U)dst[i] + (U)src[i]);
        gm_atomic_unlock();
    } else {
        fail(9, "atomic", "%s of %s while SetAtomicAdd<%s>() is on: the types must match", api, type_name<T>(),
             b->atomic_type);
    }
}

}  // namespace ascend_model

namespace AscendC {

/* ---- DataCopy, count form (rule 3: count * sizeof(T) must be a multiple of 32 B) ---- */
template <typename T>
inline void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, const uint32_t count) {
    const char *api = "DataCopy(GM->UB)";
    dst.live(api);
    if (count == 0) return;
    ascend_model::ub_aligned(dst, api, "dst");
    ascend_model::whole_blocks<T>(count, api);
    ascend_model::ub_fits(dst, (uint64_t)count * sizeof(T), api, "dst");
    src.check(0, (uint64_t)count * sizeof(T), api);
    memcpy(dst.ptr(), src.addr_, (size_t)count * sizeof(T));
}

template <typename T>
inline void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, const uint32_t count) {
    const char *api = "DataCopy(UB->GM)";
    src.live(api);
    if (count == 0) return;
    ascend_model::ub_aligned(src, api, "src");
    ascend_model::whole_blocks<T>(count, api);
    ascend_model::ub_fits(src, (uint64_t)count * sizeof(T), api, "src");
    dst.check(0, (uint64_t)count * sizeof(T), api);
    ascend_model::gm_store(dst.addr_, src.ptr(), count, api);
}

template <typename T>
inline void DataCopy(const LocalTensor<T> &dst, const LocalTensor<T> &src, const uint32_t count) {
    const char *api = "DataCopy(UB->UB)";
    dst.live(api);
    src.live(api);
    if (count == 0) return;
    ascend_model::ub_aligned(dst, api, "dst");
    ascend_model::ub_aligned(src, api, "src");
    ascend_model::whole_blocks<T>(count, api);
    ascend_model::ub_fits(dst, (uint64_t)count * sizeof(T), api, "dst");
    ascend_model::ub_fits(src, (uint64_t)count * sizeof(T), api, "src");
    memmove(dst.ptr(), src.ptr(), (size_t)count * sizeof(T));
}

/* ---- DataCopy with DataCopyParams: blockCount rows of blockLen 32-B blocks, gaps in blocks ---- */
template <typename T>
inline void DataCopy(const LocalTensor<T> &dst, const GlobalTensor<T> &src, const DataCopyParams &p) {
    const char *api = "DataCopy(GM->UB, DataCopyParams)";
    dst.live(api);
    if (p.blockCount > ascend_model::MAX_BLOCK_COUNT)
        ascend_model::fail(8, "copy params", "%s: blockCount %u > %u", api, p.blockCount, ascend_model::MAX_BLOCK_COUNT);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    ascend_model::ub_aligned(dst, api, "dst");
    uint64_t row = (uint64_t)p.blockLen * 32, ub_pitch = row + (uint64_t)p.dstStride * 32,
             gm_pitch = row + (uint64_t)p.srcStride * 32;
    ascend_model::ub_fits(dst, (p.blockCount - 1) * ub_pitch + row, api, "dst");
    for (uint32_t r = 0; r < p.blockCount; r++) {
        src.check(r * gm_pitch, row, api);
        memcpy((uint8_t *)dst.ptr() + r * ub_pitch, (const uint8_t *)src.addr_ + r * gm_pitch, row);
    }
}

template <typename T>
inline void DataCopy(const GlobalTensor<T> &dst, const LocalTensor<T> &src, const DataCopyParams &p) {
    const char *api = "DataCopy(UB->GM, DataCopyParams)";
    src.live(api);
    if (p.blockCount > ascend_model::MAX_BLOCK_COUNT)
        ascend_model::fail(8, "copy params", "%s: blockCount %u > %u", api, p.blockCount, ascend_model::MAX_BLOCK_COUNT);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    ascend_model::ub_aligned(src, api, "src");
    uint64_t row = (uint64_t)p.blockLen * 32, ub_pitch = row + (uint64_t)p.srcStride * 32,
             gm_pitch = row + (uint64_t)p.dstStride * 32;
    ascend_model::ub_fits(src, (p.blockCount - 1) * ub_pitch + row, api, "src");
    for (uint32_t r = 0; r < p.blockCount; r++) {
        dst.check(r * gm_pitch, row, api);
        ascend_model::gm_store((T *)((uint8_t *)dst.addr_ + r * gm_pitch),
                               (const T *)((const uint8_t *)src.ptr() + r * ub_pitch), row / sizeof(T), api);
    }
}

/* ---- DataCopyPad (rules 4 and 8) ----
 * GM -> UB: row r is read from GM byte r * (blockLen + srcStride) and written to UB byte
 * r * (R + dstStride * 32), R = align32(leftPadding * sizeof(T) + blockLen + rightPadding * sizeof(T)):
 *   [leftPadding elements][blockLen bytes of data][rightPadding elements][dummy up to R]
 * isPad: the paddings and the dummy hold paddingValue; otherwise they are undefined on hardware
 * and POISON here (so that nothing can depend on them). blockCount or blockLen 0: no-op (A2). */
template <typename T>
inline void DataCopyPad(const LocalTensor<T> &dst, const GlobalTensor<T> &src, const DataCopyExtParams &p,
                        const DataCopyPadExtParams<T> &pad) {
    const char *api = "DataCopyPad(GM->UB)";
    dst.live(api);
    const uint64_t sz = sizeof(T);
    if (p.blockCount > ascend_model::MAX_BLOCK_COUNT)
        ascend_model::fail(8, "copy params", "%s: blockCount %u > %u", api, p.blockCount, ascend_model::MAX_BLOCK_COUNT);
    if (p.blockLen > ascend_model::MAX_PAD_BLOCK_LEN)
        ascend_model::fail(8, "copy params", "%s: blockLen %u B > %u B", api, p.blockLen,
                           ascend_model::MAX_PAD_BLOCK_LEN);
    if (p.dstStride > ascend_model::MAX_UB_GAP)
        ascend_model::fail(8, "copy params", "%s: dstStride (UB side, 32-B blocks) %u > %u", api, p.dstStride,
                           ascend_model::MAX_UB_GAP);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    ascend_model::ub_aligned(dst, api, "dst");
    if (p.blockLen % sz != 0)
        ascend_model::fail(4, "datacopypad", "%s: blockLen %u B is not a multiple of sizeof(%s) = %u", api, p.blockLen,
                           ascend_model::type_name<T>(), (unsigned)sz);
    if (pad.leftPadding * sz > 32 || pad.rightPadding * sz > 32)
        ascend_model::fail(4, "datacopypad",
                           "%s: leftPadding %u / rightPadding %u elements of %s: each padding may cover at most 32 B",
                           api, pad.leftPadding, pad.rightPadding, ascend_model::type_name<T>());
    if constexpr (sizeof(T) == 8) {
        T zero = 0;
        if (pad.isPad && memcmp(&pad.paddingValue, &zero, 8) != 0)
            ascend_model::fail(4, "datacopypad", "%s: a 64-bit paddingValue must be 0", api);
    }
    const uint64_t left = pad.leftPadding * sz, right = pad.rightPadding * sz;
    const uint64_t row = ascend_model::align32(left + p.blockLen + right);
    const uint64_t ub_pitch = row + (uint64_t)p.dstStride * 32, gm_pitch = (uint64_t)p.blockLen + p.srcStride;
    ascend_model::ub_fits(dst, (p.blockCount - 1) * ub_pitch + row, api, "dst");
    const bool defined = pad.isPad && (pad.leftPadding || pad.rightPadding);
    for (uint32_t r = 0; r < p.blockCount; r++) {
        uint8_t *out = (uint8_t *)dst.ptr() + r * ub_pitch;
        src.check(r * gm_pitch, p.blockLen, api);
        if (defined)
            for (uint64_t i = 0; i < row / sz; i++) memcpy(out + i * sz, &pad.paddingValue, sz);
        else
            memset(out, ascend_model::POISON, row);
        memcpy(out + left, (const uint8_t *)src.addr_ + r * gm_pitch, p.blockLen);
    }
}

/* UB -> GM: row r is read from UB byte r * (align32(blockLen) + srcStride * 32) and its blockLen
 * bytes written to GM byte r * (blockLen + dstStride). */
template <typename T>
inline void DataCopyPad(const GlobalTensor<T> &dst, const LocalTensor<T> &src, const DataCopyExtParams &p) {
    const char *api = "DataCopyPad(UB->GM)";
    src.live(api);
    const uint64_t sz = sizeof(T);
    if (p.blockCount > ascend_model::MAX_BLOCK_COUNT)
        ascend_model::fail(8, "copy params", "%s: blockCount %u > %u", api, p.blockCount, ascend_model::MAX_BLOCK_COUNT);
    if (p.blockLen > ascend_model::MAX_PAD_BLOCK_LEN)
        ascend_model::fail(8, "copy params", "%s: blockLen %u B > %u B", api, p.blockLen,
                           ascend_model::MAX_PAD_BLOCK_LEN);
    if (p.srcStride > ascend_model::MAX_UB_GAP)
        ascend_model::fail(8, "copy params", "%s: srcStride (UB side, 32-B blocks) %u > %u", api, p.srcStride,
                           ascend_model::MAX_UB_GAP);
    if (p.blockCount == 0 || p.blockLen == 0) return;
    ascend_model::ub_aligned(src, api, "src");
    if (p.blockLen % sz != 0)
        ascend_model::fail(4, "datacopypad", "%s: blockLen %u B is not a multiple of sizeof(%s) = %u", api, p.blockLen,
                           ascend_model::type_name<T>(), (unsigned)sz);
    const uint64_t ub_pitch = ascend_model::align32(p.blockLen) + (uint64_t)p.srcStride * 32;
    const uint64_t gm_pitch = (uint64_t)p.blockLen + p.dstStride;
    ascend_model::ub_fits(src, (p.blockCount - 1) * ub_pitch + p.blockLen, api, "src");
    for (uint32_t r = 0; r < p.blockCount; r++) {
        dst.check(r * gm_pitch, p.blockLen, api);
        T *out = (T *)((uint8_t *)dst.addr_ + r * gm_pitch);
        const T *in = (const T *)((const uint8_t *)src.ptr() + r * ub_pitch);
        if (ascend_model::block()->atomic) {
            if (((uintptr_t)out) % sz != 0)
                ascend_model::fail(9, "atomic", "%s: an atomic add to a GM address not aligned to sizeof(%s)", api,
                                   ascend_model::type_name<T>());
            ascend_model::gm_store(out, in, p.blockLen / sz, api);
        } else {
            memcpy(out, in, p.blockLen);
        }
    }
}

}  // namespace AscendC

#endif /* OPGEN_ASCENDC_MODEL_COPY_H */
