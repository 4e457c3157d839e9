/* ttmetal_model.h — the core of opgen's TT-Metal CPU model (test harness only; docs/ttmetal_model.md).
 *
 * Header-only and shared by the kernel side (api/dataflow/dataflow_api.h, api/compute/...) and the
 * host shim (tt-metalium/host_api.hpp). A kernel is compiled (by the host shim's CreateKernel, as
 * tt-metal's JIT does) into its own shared object; the host runs each core's reader, compute and
 * writer kernels as three std::threads that share the core's L1 arena and pass each thread's
 * context to the kernel's entry point.
 *
 * Every violation of a hardware rule prints
 *     ttmetal-model: rule N (<short name>): <what, with values> [core (x,y) <role> kernel <file>:<line>]
 * to stderr and calls abort(). Rule 0 ("model") is the model's own: out-of-bounds accesses and
 * anything outside the modelled subset. */
#ifndef OPGEN_TTMETAL_MODEL_H
#define OPGEN_TTMETAL_MODEL_H

#include "model_std.h"

namespace tt {
/* tt::DataFormat (the subset the model computes with; values as in tt-metalium's tt_backend_api_types) */
enum class DataFormat : uint8_t { Float32 = 0, Float16 = 1, Bfp8 = 2, Bfp4 = 3, Tf32 = 4, Float16_b = 5,
                                  Bfp8_b = 6, Bfp4_b = 7, Int32 = 8, UInt16 = 9, Int8 = 14, UInt32 = 24,
                                  UInt8 = 30, Invalid = 0xff };
/* tt::CBIndex::c_0 .. c_31 */
enum CBIndex : uint8_t {
    c_0, c_1, c_2, c_3, c_4, c_5, c_6, c_7, c_8, c_9, c_10, c_11, c_12, c_13, c_14, c_15,
    c_16, c_17, c_18, c_19, c_20, c_21, c_22, c_23, c_24, c_25, c_26, c_27, c_28, c_29, c_30, c_31, SIZE };
}  // namespace tt

namespace ttmodel {

constexpr uint32_t kNumCBs = 32;
constexpr uint32_t kTileElems = 1024;

enum Role { READER = 0, COMPUTE = 1, WRITER = 2 };
inline const char *role_name(int r) { return r == READER ? "reader" : r == COMPUTE ? "compute" : "writer"; }

struct Thread;
struct Core;
inline thread_local Thread *tls = nullptr;
inline std::mutex fail_mutex;
inline std::string where();

[[noreturn]] inline void fail(int rule, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
[[noreturn]] inline void fail(int rule, const char *name, const char *fmt, ...) {
    std::lock_guard<std::mutex> g(fail_mutex);
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ttmetal-model: rule %d (%s): %s%s\n", rule, name, msg, where().c_str());
    fflush(stderr);
    abort();
}

/* model parameters from the environment */
inline uint64_t env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end = nullptr;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || s[0] == '-') fail(0, "model", "environment variable %s=%s is not an unsigned integer", name, s);
    return v;
}
inline bool blackhole() {
    const char *a = getenv("OPGEN_TT_ARCH");
    if (!a || !*a || !strcmp(a, "wormhole")) return false;
    if (!strcmp(a, "blackhole")) return true;
    fail(0, "model", "OPGEN_TT_ARCH=%s: expected wormhole or blackhole", a);
}
/* L1 bytes per core (MEM_L1_SIZE: 1,499,136 on Wormhole, 1,572,864 on Blackhole) */
inline uint32_t l1_size() { return (uint32_t)env_u64("OPGEN_TT_L1_SIZE", blackhole() ? 1572864 : 1499136); }
/* bytes at the bottom of L1 that CBs may not use (firmware, mailboxes); the model's default is 0 [unchecked] */
inline uint32_t l1_base() { return (uint32_t)env_u64("OPGEN_TT_L1_BASE", 0); }
inline uint32_t dram_read_align() { return blackhole() ? 64 : 32; }
constexpr uint32_t kL1Align = 16, kDramWriteAlign = 16;

/* ---- bf16 / tf32 conversions ---- */
inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
inline uint16_t f32_to_bf16_bits(float f) { /* round to nearest even, NaN kept quiet */
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float bf16_bits_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }
inline float round_bf16(float f) { return bf16_bits_to_f32(f32_to_bf16_bits(f)); }
/* a subnormal as the zero of its sign (how the SFPU's f32 comparisons see it) */
inline float flush(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }
inline float trunc_tf32(float f) { /* FPU source registers: 10 mantissa bits, truncated [unchecked] */
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return f;
    return bits_f32(u & 0xffffe000u);
}
inline const char *format_name(tt::DataFormat f) {
    switch (f) {
    case tt::DataFormat::Float32: return "Float32";
    case tt::DataFormat::Float16_b: return "Float16_b";
    case tt::DataFormat::Float16: return "Float16";
    case tt::DataFormat::UInt32: return "UInt32";
    case tt::DataFormat::Int32: return "Int32";
    case tt::DataFormat::UInt16: return "UInt16";
    case tt::DataFormat::UInt8: return "UInt8";
    default: return "other";
    }
}
/* element (r, c) of a 32x32 tile in its 4 faces of 16x16 (face = 2*(r/16) + c/16, row-major inside) */
inline uint32_t tile_index(uint32_t r, uint32_t c) { return ((r / 16) * 2 + c / 16) * 256 + (r % 16) * 16 + c % 16; }

/* ---- DRAM: one arena of the device; addresses are offsets into it ---- */
struct DramBuffer { uint32_t addr, size; };
struct Dram {
    std::mutex m;
    uint8_t *base = nullptr;
    uint64_t size = 0, top = 4096;
    std::vector<DramBuffer> buffers;
    /* bytes the kernels' NOC transfers read and wrote (what the static report predicts); kept
     * here, in the host's object, since each kernel library has its own copy of every global */
    std::atomic<uint64_t> read_bytes{0}, written_bytes{0};
};
inline Dram &dram() { static Dram d; return d; }
inline uint32_t dram_alloc(uint32_t bytes) {
    Dram &d = dram();
    std::lock_guard<std::mutex> g(d.m);
    if (!d.base) {
        d.size = env_u64("OPGEN_TT_DRAM_SIZE", 1ull << 31);
        void *p = mmap(nullptr, d.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fail(0, "model", "cannot map %llu B of DRAM", (unsigned long long)d.size);
        d.base = (uint8_t *)p;
    }
    uint64_t a = (d.top + 1023) & ~1023ull;
    if (a + bytes > d.size || a + bytes > 0xffffffffull) fail(0, "model", "DRAM full: %u B more at %llu", bytes, (unsigned long long)a);
    d.top = a + bytes;
    d.buffers.push_back({(uint32_t)a, bytes});
    return (uint32_t)a;
}
/* the host's DRAM (kernels, in their own shared objects, reach it through Core::dram) */
inline uint8_t *dram_ptr(uint32_t addr) { return dram().base + addr; }
/* checks that [addr, addr+n) lies in one allocated buffer */
inline void dram_check(Dram &d, uint64_t addr, uint32_t n, const char *what) {
    std::lock_guard<std::mutex> g(d.m);
    for (const auto &b : d.buffers)
        if (addr >= b.addr && addr + n <= (uint64_t)b.addr + b.size) return;
    fail(0, "model", "%s of %u B at DRAM address %llu is outside every allocated buffer", what, n, (unsigned long long)addr);
}

/* NOC addresses: DRAM offsets are tagged with kNocDram; L1 addresses (real pointers below 4 GiB) with kNocL1 */
constexpr uint64_t kNocDram = 1ull << 48, kNocL1 = 2ull << 48, kNocTagMask = 0xffffull << 48;

/* ---- circular buffers ---- */
struct CB {
    bool configured = false;
    uint32_t addr = 0; /* L1 address (a pointer value below 4 GiB) */
    uint32_t size = 0, page = 0, pages = 0;
    tt::DataFormat format = tt::DataFormat::Float16_b;
    uint64_t pushed = 0, popped = 0;
    uint32_t reserved = 0, waited = 0; /* pages of the open reservation / of the last wait not yet popped */
    int waiter = -1;                    /* the role (Role) of the thread whose cb_wait_front opened `waited` */
    uint32_t wr_page = 0, rd_page = 0;
    uint32_t packed = 0; /* in-order pack_tile position since the last push */
    uint32_t wr_ptr() const { return addr + wr_page * page; }
    uint32_t rd_ptr() const { return addr + rd_page * page; }
};

struct PendingRead { uint8_t *dst; const uint8_t *src; uint32_t n; std::vector<uint8_t> data; };
struct PendingWrite { uint8_t *dst; const uint8_t *src; uint32_t n; };

/* compute-thread state (DST and the init bookkeeping of rules 4 and 5) */
enum DstState { DST_IDLE, DST_ACQUIRED, DST_COMMITTED, DST_WAITED };
struct ComputeState {
    bool started = false;   /* compute_kernel_hw_startup ran */
    DstState state = DST_IDLE;
    float dst[16][kTileElems];
    bool valid[16] = {};
    bool from_reduce[16] = {};
    std::string fpu_init;   /* last FPU init: "copy", "add", "mul_bcast_rows", "reduce_sum_row", "unary_bcast_row", ... */
    std::string fpu_init_call; /* how that init reads in messages: "add_init", "unary_bcast_init<ROW>(c_0)" */
    int fpu_cb = -1;        /* the first CB of that init */
    tt::DataFormat fpu_fmt[2] = {tt::DataFormat::Invalid, tt::DataFormat::Invalid};
    bool acc_to_dest = false;
    int fpu_cb1 = -1;       /* the second CB of that init (matmul: in1) */
    uint32_t fpu_param = 0, fpu_param2 = 0; /* matmul: transpose; tilize: block; pack_untilize: block_ct_dim, full_ct_dim */
    int fpu_ocb = -1;       /* tilize / pack_untilize: the output CB of the init */
    bool tilize_active = false;   /* tilize_init not yet undone by tilize_uninit (the unpacker is in tilize mode) */
    bool untilize_active = false; /* pack_untilize_init not yet undone by pack_untilize_uninit (the packer untilizes) */
    std::string sfpu_init;  /* last SFPU init since the last FPU init, "" if none */
    int reduce_mask = -1;   /* -1: off; else the ReduceDim of reduce_init not yet undone by reduce_uninit */
};

struct Thread {
    Core *core = nullptr;
    int role = READER;
    std::string file;
    std::vector<uint32_t> rt_args;
    int line = 0;            /* line of the API call in progress */
    std::string wait;        /* what it blocks on, "" when running */
    std::function<bool()> ready; /* the condition it blocks on */
    bool finished = false;
    std::vector<PendingRead> reads;
    std::vector<PendingWrite> writes;
    ComputeState *cs = nullptr;
};

struct Core {
    uint32_t x = 0, y = 0;
    uint8_t *l1 = nullptr;
    uint32_t l1_bytes = 0;
    Dram *dram = nullptr; /* the host's DRAM */
    CB cbs[kNumCBs];
    std::mutex m;
    std::condition_variable cv;
    int nthreads = 3;
    Thread threads[3];
    bool fp32_dest_acc = false, dst_full_sync = false;
    bool unpack_to_dest_fp32[kNumCBs] = {};
    uint32_t dst_tiles() const { return (dst_full_sync ? 16u : 8u) / (fp32_dest_acc ? 2u : 1u); }
    void init_l1(uint32_t bytes) {
        /* MAP_32BIT: L1 addresses are uint32_t in kernels and are cast back to pointers */
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_32BIT, -1, 0);
        if (p == MAP_FAILED || (uintptr_t)p + bytes > 0xffffffffull) fail(0, "model", "cannot map L1 below 4 GiB");
        l1 = (uint8_t *)p;
        l1_bytes = bytes;
    }
    ~Core() { if (l1) munmap(l1, l1_bytes); }
};

inline std::string where() {
    Thread *t = tls;
    if (!t || !t->core) return "";
    char b[512];
    snprintf(b, sizeof b, " [core (%u,%u) %s kernel %s:%d]", t->core->x, t->core->y, role_name(t->role),
             t->file.c_str(), t->line);
    return b;
}

inline Thread &self(int line) {
    Thread *t = tls;
    if (!t) fail(0, "model", "kernel API called outside a kernel thread");
    t->line = line;
    return *t;
}
inline CB &cb_of(Thread &t, uint32_t id) {
    if (id >= kNumCBs) fail(1, "CB", "CB index %u is out of range [0, 32)", id);
    CB &c = t.core->cbs[id];
    if (!c.configured) fail(1, "CB", "CB %u is not configured on this core", id);
    return c;
}
inline uint8_t *l1_ptr(uint32_t addr) { return (uint8_t *)(uintptr_t)addr; }
inline bool in_l1(const Core &c, uint64_t addr, uint32_t n) {
    return addr >= (uintptr_t)c.l1 && addr + n <= (uintptr_t)c.l1 + c.l1_bytes;
}

/* blocks (core mutex held through `lk`) until ready(). If every thread of the core is finished or
 * blocked on a condition that is still false (checked under the lock: a thread just notified but not yet
 * running again is not blocked), nothing can ever make progress: rule 7. */
template <typename F>
inline void block_until(Thread &t, std::unique_lock<std::mutex> &lk, const std::string &what, F ready) {
    Core &c = *t.core;
    if (ready()) return;
    t.wait = what;
    t.ready = ready;
    while (!ready()) {
        bool stuck = true;
        for (int i = 0; i < c.nthreads && stuck; i++) {
            const Thread &o = c.threads[i];
            stuck = o.finished || (!o.wait.empty() && !o.ready());
        }
        if (stuck) {
            std::string all;
            for (int i = 0; i < c.nthreads; i++) {
                const Thread &o = c.threads[i];
                char b[512];
                snprintf(b, sizeof b, "%s%s (%s:%d) %s", all.empty() ? "" : "; ", role_name(o.role), o.file.c_str(),
                         o.line, o.wait.empty() ? "finished" : ("waits in " + o.wait).c_str());
                all += b;
            }
            fail(7, "deadlock", "every kernel of the core is blocked or finished: %s", all.c_str());
        }
        c.cv.wait(lk);
    }
    t.wait.clear();
    t.ready = nullptr;
}

/* ---- CB operations (shared by the dataflow and compute APIs) ---- */
inline void cb_reserve(uint32_t id, uint32_t n, int line) {
    Thread &t = self(line);
    std::unique_lock<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (n == 0 || n > c.pages) fail(1, "CB", "cb_reserve_back(%u, %u): CB %u holds %u pages", id, n, id, c.pages);
    if (c.wr_page + n > c.pages)
        fail(1, "CB", "cb_reserve_back(%u, %u) at page %u wraps past the end of the %u-page CB (capacity not a multiple of the reservation)",
             id, n, c.wr_page, c.pages);
    char w[96];
    snprintf(w, sizeof w, "cb_reserve_back(%u, %u)", id, n);
    block_until(t, lk, w, [&] { return c.pages - (c.pushed - c.popped) >= n; });
    c.reserved = n;
}
inline void cb_push(uint32_t id, uint32_t n, int line) {
    Thread &t = self(line);
    std::unique_lock<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (n == 0 || n > c.reserved) fail(1, "CB", "cb_push_back(%u, %u) pushes more than the %u reserved pages", id, n, c.reserved);
    uint8_t *lo = l1_ptr(c.wr_ptr()), *hi = lo + (size_t)n * c.page;
    for (const auto &r : t.reads)
        if (r.dst < hi && r.dst + r.n > lo)
            fail(3, "NOC", "cb_push_back(%u, %u) before noc_async_read_barrier(): a NOC read into the pushed pages is still in flight", id, n);
    c.reserved -= n;
    c.wr_page = (c.wr_page + n) % c.pages;
    c.pushed += n;
    c.packed = 0;
    t.core->cv.notify_all();
}
inline void cb_wait(uint32_t id, uint32_t n, int line) {
    Thread &t = self(line);
    std::unique_lock<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (n == 0 || n > c.pages) fail(1, "CB", "cb_wait_front(%u, %u): CB %u holds %u pages", id, n, id, c.pages);
    if (c.rd_page + n > c.pages)
        fail(1, "CB", "cb_wait_front(%u, %u) at page %u wraps past the end of the %u-page CB (capacity not a multiple of the wait)",
             id, n, c.rd_page, c.pages);
    char w[96];
    snprintf(w, sizeof w, "cb_wait_front(%u, %u)", id, n);
    block_until(t, lk, w, [&] { return c.pushed - c.popped >= n; });
    c.waited = n;
    c.waiter = t.role;
}
inline void cb_pop(uint32_t id, uint32_t n, int line) {
    Thread &t = self(line);
    std::unique_lock<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (n == 0 || n > c.waited) fail(1, "CB", "cb_pop_front(%u, %u) pops more than the %u pages waited for", id, n, c.waited);
    const uint8_t *lo = l1_ptr(c.rd_ptr()), *hi = lo + (size_t)n * c.page;
    for (const auto &w : t.writes)
        if (w.src < hi && w.src + w.n > lo)
            fail(3, "NOC", "cb_pop_front(%u, %u) before noc_async_writes_flushed()/noc_async_write_barrier(): a NOC write from the popped pages is still in flight", id, n);
    c.waited -= n;
    c.rd_page = (c.rd_page + n) % c.pages;
    c.popped += n;
    t.core->cv.notify_all();
}
inline uint32_t cb_write_ptr(uint32_t id, int line) {
    Thread &t = self(line);
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (c.reserved == 0) fail(1, "CB", "get_write_ptr(%u) without an open cb_reserve_back", id);
    return c.wr_ptr();
}
inline uint32_t cb_read_ptr(uint32_t id, int line) {
    Thread &t = self(line);
    std::lock_guard<std::mutex> lk(t.core->m);
    CB &c = cb_of(t, id);
    if (c.waited == 0) fail(1, "CB", "get_read_ptr(%u) without a cb_wait_front not yet popped", id);
    return c.rd_ptr();
}
/* is [addr, addr+n) inside the reserved window (write) or waited/reserved window (read) of some CB? */
inline bool in_cb_window(Thread &t, uint32_t addr, uint32_t n, bool for_write) {
    std::lock_guard<std::mutex> lk(t.core->m);
    for (const CB &c : t.core->cbs) {
        if (!c.configured) continue;
        if (c.reserved && addr >= c.wr_ptr() && (uint64_t)addr + n <= (uint64_t)c.wr_ptr() + (uint64_t)c.reserved * c.page) return true;
        if (!for_write && c.waited && addr >= c.rd_ptr() && (uint64_t)addr + n <= (uint64_t)c.rd_ptr() + (uint64_t)c.waited * c.page)
            return true;
    }
    return false;
}

}  // namespace ttmodel

/* ---- the kernel's entry point (only when build compiles a kernel: -DOPGEN_TT_KERNEL) ---- */
#ifdef OPGEN_TT_KERNEL
void kernel_main();
extern "C" __attribute__((visibility("default"))) void opgen_tt_kernel_entry(ttmodel::Thread *t) {
    ttmodel::tls = t;
    kernel_main();
}
#endif

/* compile-time args: -DKERNEL_COMPILE_TIME_ARGS=a,b,c (tt-metal's own mechanism, api/compile_time_args.h) */
#ifndef KERNEL_COMPILE_TIME_ARGS
#define KERNEL_COMPILE_TIME_ARGS
#endif
#ifndef FORCE_INLINE
#define FORCE_INLINE inline __attribute__((always_inline))
#endif
#ifndef ALWI
#define ALWI inline __attribute__((always_inline))
#endif
#ifndef tt_l1_ptr
#define tt_l1_ptr
#endif
template <class T, class... Ts>
constexpr std::array<T, sizeof...(Ts)> make_array(Ts... values) { return {T(values)...}; }
constexpr auto kernel_compile_time_args = make_array<std::uint32_t>(KERNEL_COMPILE_TIME_ARGS);
template <uint32_t Idx>
constexpr uint32_t get_ct_arg() {
    static_assert(Idx < kernel_compile_time_args.size(), "Index out of range");
    return kernel_compile_time_args[Idx];
}
#define get_compile_time_arg_val(arg_idx) get_ct_arg<arg_idx>()

template <typename T>
inline T get_arg_val(int arg_idx, int line = __builtin_LINE()) {
    static_assert(sizeof(T) == 4, "get_arg_val<T>: T must be 4 bytes");
    ttmodel::Thread &t = ttmodel::self(line);
    if (arg_idx < 0 || (size_t)arg_idx >= t.rt_args.size())
        ttmodel::fail(0, "model", "get_arg_val(%d): the kernel has %zu runtime args", arg_idx, t.rt_args.size());
    T v;
    memcpy(&v, &t.rt_args[arg_idx], 4);
    return v;
}

inline uint32_t get_tile_size(uint32_t cb, int line = __builtin_LINE()) {
    ttmodel::Thread &t = ttmodel::self(line);
    return ttmodel::cb_of(t, cb).page;
}
inline void cb_reserve_back(uint32_t cb, uint32_t n, int line = __builtin_LINE()) { ttmodel::cb_reserve(cb, n, line); }
inline void cb_push_back(uint32_t cb, uint32_t n, int line = __builtin_LINE()) { ttmodel::cb_push(cb, n, line); }
inline void cb_wait_front(uint32_t cb, uint32_t n, int line = __builtin_LINE()) { ttmodel::cb_wait(cb, n, line); }
inline void cb_pop_front(uint32_t cb, uint32_t n, int line = __builtin_LINE()) { ttmodel::cb_pop(cb, n, line); }

#endif /* OPGEN_TTMETAL_MODEL_H */
