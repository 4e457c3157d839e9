/* api/dataflow/dataflow_api.h — opgen's TT-Metal CPU model of the data-movement kernel API (0.81.1
 * spellings; docs/ttmetal_model.md). NOC transfers are memcpy between the core's L1 arena and the
 * DRAM arena; reads land at noc_async_read_barrier() (the destination holds 0xff bytes, a NaN, until
 * then); writes land at noc_async_writes_flushed() / noc_async_write_barrier(). */
#ifndef OPGEN_TTMETAL_MODEL_DATAFLOW_API_H
#define OPGEN_TTMETAL_MODEL_DATAFLOW_API_H

#include <cstdint>

#include "ttmetal_model.h"

constexpr uint8_t noc_index = 0;

/* TensorAccessorArgs<Base>(): CT args Base = config bits (2 = IsDram, interleaved), Base+1 = aligned page size */
template <uint32_t Base>
struct TensorAccessorArgs {
    static constexpr uint32_t config = get_ct_arg<Base>();
    static constexpr uint32_t aligned_page_size = get_ct_arg<Base + 1>();
    static_assert(config == 2, "opgen TT model: only interleaved DRAM tensors (TensorAccessorArgs config bits 2 = IsDram)");
    constexpr TensorAccessorArgs() = default;
    static constexpr uint32_t next_compile_time_args_offset() { return Base + 2; }
    static constexpr uint32_t num_compile_time_args() { return 2; }
};

/* an interleaved DRAM tensor: page i at bank_base_address + i * aligned_page_size */
template <typename Args>
struct TensorAccessor {
    uint32_t bank_base_address;
    uint32_t page_size;
    TensorAccessor(const Args &, uint32_t addr, uint32_t page_size_ = 0, int line = __builtin_LINE())
        : bank_base_address(addr), page_size(page_size_ ? page_size_ : Args::aligned_page_size) {
        ttmodel::self(line);
        if (Args::aligned_page_size % ttmodel::dram_read_align() != 0)
            ttmodel::fail(3, "NOC", "TensorAccessor aligned page size %u is not a multiple of the DRAM alignment %u",
                          Args::aligned_page_size, ttmodel::dram_read_align());
        if (addr % ttmodel::dram_read_align() != 0)
            ttmodel::fail(3, "NOC", "TensorAccessor base address %u is not %u-B aligned", addr, ttmodel::dram_read_align());
    }
    uint32_t get_aligned_page_size() const { return Args::aligned_page_size; }
    uint64_t get_noc_addr(uint32_t page_id, uint32_t offset = 0, uint8_t = noc_index) const {
        return ttmodel::kNocDram | ((uint64_t)bank_base_address + (uint64_t)page_id * Args::aligned_page_size + offset);
    }
};
template <typename Args>
TensorAccessor(const Args &, uint32_t, uint32_t = 0, int = 0) -> TensorAccessor<Args>;

template <typename Args>
inline uint64_t get_noc_addr(uint32_t id, const TensorAccessor<Args> &a, uint32_t offset = 0, uint8_t noc = noc_index) {
    return a.get_noc_addr(id, offset, noc);
}
/* the local core's L1 address as a NOC address */
inline uint64_t get_noc_addr(uint32_t l1_addr, uint8_t = noc_index) { return ttmodel::kNocL1 | l1_addr; }

namespace ttmodel {
inline void noc_read(uint64_t src, uint32_t dst, uint32_t n, const char *fn, int line) {
    Thread &t = self(line);
    uint64_t tag = src & kNocTagMask, a = src & ~kNocTagMask;
    const uint8_t *s;
    if (tag == kNocDram) {
        if (a % dram_read_align()) fail(3, "NOC", "%s: DRAM source address %llu is not %u-B aligned", fn, (unsigned long long)a, dram_read_align());
        dram_check(*t.core->dram, a, n, fn);
        s = t.core->dram->base + a;
        t.core->dram->read_bytes += n;
    } else if (tag == kNocL1) {
        if (a % kL1Align) fail(3, "NOC", "%s: L1 source address 0x%llx is not 16-B aligned", fn, (unsigned long long)a);
        if (!in_l1(*t.core, a, n)) fail(0, "model", "%s: L1 source 0x%llx + %u B is outside this core's L1", fn, (unsigned long long)a, n);
        s = l1_ptr((uint32_t)a);
    } else {
        fail(0, "model", "%s: 0x%llx is not a NOC address of the model (use a TensorAccessor or get_noc_addr)", fn, (unsigned long long)src);
    }
    if (dst % kL1Align) fail(3, "NOC", "%s: L1 destination address 0x%x is not 16-B aligned", fn, dst);
    if (!in_cb_window(t, dst, n, true))
        fail(3, "NOC", "%s: L1 destination 0x%x + %u B is not inside a reserved CB window (cb_reserve_back + get_write_ptr)", fn, dst, n);
    PendingRead r{l1_ptr(dst), s, n, std::vector<uint8_t>(s, s + n)};
    memset(r.dst, 0xff, n); /* poison until the barrier */
    t.reads.push_back(std::move(r));
}
inline void noc_write(uint32_t src, uint64_t dst, uint32_t n, const char *fn, int line) {
    Thread &t = self(line);
    uint64_t tag = dst & kNocTagMask, a = dst & ~kNocTagMask;
    uint8_t *d;
    if (src % kL1Align) fail(3, "NOC", "%s: L1 source address 0x%x is not 16-B aligned", fn, src);
    if (!in_cb_window(t, src, n, false))
        fail(3, "NOC", "%s: L1 source 0x%x + %u B is not inside a waited or reserved CB window", fn, src, n);
    if (n % kDramWriteAlign) fail(3, "NOC", "%s: %u B is not a multiple of 16 B", fn, n);
    if (tag == kNocDram) {
        if (a % kDramWriteAlign) fail(3, "NOC", "%s: DRAM destination address %llu is not 16-B aligned", fn, (unsigned long long)a);
        dram_check(*t.core->dram, a, n, fn);
        d = t.core->dram->base + a;
        t.core->dram->written_bytes += n;
    } else if (tag == kNocL1) {
        if (a % kL1Align) fail(3, "NOC", "%s: L1 destination 0x%llx is not 16-B aligned", fn, (unsigned long long)a);
        if (!in_l1(*t.core, a, n)) fail(0, "model", "%s: L1 destination 0x%llx + %u B is outside this core's L1", fn, (unsigned long long)a, n);
        d = l1_ptr((uint32_t)a);
    } else {
        fail(0, "model", "%s: 0x%llx is not a NOC address of the model (use a TensorAccessor or get_noc_addr)", fn, (unsigned long long)dst);
    }
    t.writes.push_back({d, l1_ptr(src), n});
}
}  // namespace ttmodel

template <uint32_t max_page_size = 0, bool enable_noc_tracing = true>
inline void noc_async_read(uint64_t src_noc_addr, uint32_t dst_local_l1_addr, uint32_t size, uint8_t = noc_index,
                           uint32_t = 0, int line = __builtin_LINE()) {
    ttmodel::noc_read(src_noc_addr, dst_local_l1_addr, size, "noc_async_read", line);
}
template <uint32_t max_page_size = 0, bool enable_noc_tracing = true, bool posted = false>
inline void noc_async_write(uint32_t src_local_l1_addr, uint64_t dst_noc_addr, uint32_t size, uint8_t = noc_index,
                            uint32_t = 0, int line = __builtin_LINE()) {
    ttmodel::noc_write(src_local_l1_addr, dst_noc_addr, size, "noc_async_write", line);
}
/* moves accessor.get_aligned_page_size() bytes (dataflow_api.h:1241 in 0.81.1) */
template <typename AddrGen, bool enable_noc_tracing = true>
inline void noc_async_read_page(const uint32_t id, const AddrGen &addrgen, uint32_t dst_local_l1_addr, uint32_t offset = 0,
                                uint8_t = noc_index, int line = __builtin_LINE()) {
    ttmodel::noc_read(addrgen.get_noc_addr(id, offset), dst_local_l1_addr, addrgen.get_aligned_page_size(),
                      "noc_async_read_page", line);
}
template <typename AddrGen, bool enable_noc_tracing = true, bool posted = false>
inline void noc_async_write_page(const uint32_t id, const AddrGen &addrgen, uint32_t src_local_l1_addr, uint32_t size = 0,
                                 uint32_t offset = 0, uint8_t = noc_index, int line = __builtin_LINE()) {
    ttmodel::noc_write(src_local_l1_addr, addrgen.get_noc_addr(id, offset), size ? size : addrgen.get_aligned_page_size(),
                       "noc_async_write_page", line);
}
inline void noc_async_read_barrier(uint8_t = noc_index, int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    for (auto &r : t.reads) memcpy(r.dst, r.data.data(), r.n);
    t.reads.clear();
}
inline void noc_async_writes_flushed(uint8_t = noc_index, int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    for (auto &w : t.writes) memcpy(w.dst, w.src, w.n);
    t.writes.clear();
}
inline void noc_async_write_barrier(uint8_t noc = noc_index, int line = __builtin_LINE()) { noc_async_writes_flushed(noc, line); }

inline uint32_t get_write_ptr(uint32_t cb, int line = __builtin_LINE()) { return ttmodel::cb_write_ptr(cb, line); }
inline uint32_t get_read_ptr(uint32_t cb, int line = __builtin_LINE()) { return ttmodel::cb_read_ptr(cb, line); }

#endif /* OPGEN_TTMETAL_MODEL_DATAFLOW_API_H */
