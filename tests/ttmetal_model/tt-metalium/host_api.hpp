/* tt-metalium/host_api.hpp — opgen's TT-Metal CPU model: the tt::tt_metal host API subset (0.81.1
 * spellings, docs/ttmetal_model.md) plus the model's own entry points in namespace ttmodel
 * (dram_alloc / dram_ptr / run). CreateKernel compiles the kernel source with g++ against the
 * model's kernel headers into a cached shared object (as tt-metal's JIT compiles per kernel, CT args
 * and defines); run() executes the program on one model core per core in its kernels' core specs. */
#ifndef OPGEN_TTMETAL_MODEL_HOST_API_HPP
#define OPGEN_TTMETAL_MODEL_HOST_API_HPP

#include "host_std.h"
#include "ttmetal_model.h"

#if !defined(OPGEN_TT_MODEL_DIR) || !defined(OPGEN_TT_KERNEL_FLAGS) || !defined(OPGEN_TT_KERNEL_PCH)
#error "build with tests/ttmetal_model/build.py (it defines OPGEN_TT_MODEL_DIR, OPGEN_TT_CXX, OPGEN_TT_KERNEL_CACHE, OPGEN_TT_KERNEL_FLAGS, OPGEN_TT_KERNEL_PCH)"
#endif

struct CoreCoord {
    std::size_t x = 0, y = 0;
    bool operator<(const CoreCoord &o) const { return y != o.y ? y < o.y : x < o.x; }
    bool operator==(const CoreCoord &o) const { return x == o.x && y == o.y; }
};
struct CoreRange {
    CoreCoord start_coord, end_coord;
    CoreRange(CoreCoord c) : start_coord(c), end_coord(c) {}
    CoreRange(CoreCoord s, CoreCoord e) : start_coord(s), end_coord(e) {}
};
struct CoreRangeSet {
    std::vector<CoreRange> ranges_;
    CoreRangeSet() = default;
    CoreRangeSet(const CoreRange &r) : ranges_{r} {}
    CoreRangeSet(const CoreCoord &c) : ranges_{CoreRange(c)} {}
    CoreRangeSet(std::vector<CoreRange> r) : ranges_(std::move(r)) {}
    const std::vector<CoreRange> &ranges() const { return ranges_; }
    uint32_t num_cores() const {
        uint32_t n = 0;
        for (const auto &r : ranges_) n += (uint32_t)((r.end_coord.x - r.start_coord.x + 1) * (r.end_coord.y - r.start_coord.y + 1));
        return n;
    }
    bool empty() const { return ranges_.empty(); }
};

/* the cores of `crs`, range by range; inside a range row by row (row_wise) or column by column (default),
 * at most `max_cores` of them (tt-metal's core_coord.hpp) */
inline std::vector<CoreCoord> corerange_to_cores(const CoreRangeSet &crs, std::optional<uint32_t> max_cores = std::nullopt,
                                                 bool row_wise = false) {
    std::vector<CoreCoord> out;
    for (const auto &r : crs.ranges()) {
        const std::size_t w = r.end_coord.x - r.start_coord.x + 1, h = r.end_coord.y - r.start_coord.y + 1;
        for (std::size_t i = 0; i < w * h; i++) {
            if (max_cores && out.size() >= *max_cores) return out;
            out.push_back(row_wise ? CoreCoord{r.start_coord.x + i % w, r.start_coord.y + i / w}
                                   : CoreCoord{r.start_coord.x + i / h, r.start_coord.y + i % h});
        }
    }
    return out;
}

namespace tt::tt_metal {

using ::CoreCoord;
using ::CoreRange;
using ::CoreRangeSet;
using ::corerange_to_cores;
using CBHandle = uintptr_t;
using KernelHandle = uint32_t;

enum class MathFidelity : uint8_t { LoFi = 0, HiFi2 = 2, HiFi3 = 3, HiFi4 = 4 };
enum class UnpackToDestMode : uint8_t { Default, UnpackToDestFp32 };
enum class DataMovementProcessor { RISCV_0 = 0, RISCV_1 = 1 };
enum class NOC : uint8_t { RISCV_0_default = 0, RISCV_1_default = 1, NOC_0 = 0, NOC_1 = 1 };

struct DataMovementConfig {
    DataMovementProcessor processor = DataMovementProcessor::RISCV_0;
    NOC noc = NOC::RISCV_0_default;
    std::vector<uint32_t> compile_args;
    std::map<std::string, std::string> defines;
};
struct ReaderDataMovementConfig : DataMovementConfig {
    ReaderDataMovementConfig(std::vector<uint32_t> compile_args = {}, std::map<std::string, std::string> defines = {}) {
        processor = DataMovementProcessor::RISCV_1;
        noc = NOC::RISCV_1_default;
        this->compile_args = std::move(compile_args);
        this->defines = std::move(defines);
    }
};
struct WriterDataMovementConfig : DataMovementConfig {
    WriterDataMovementConfig(std::vector<uint32_t> compile_args = {}, std::map<std::string, std::string> defines = {}) {
        processor = DataMovementProcessor::RISCV_0;
        noc = NOC::RISCV_0_default;
        this->compile_args = std::move(compile_args);
        this->defines = std::move(defines);
    }
};
struct ComputeConfig {
    MathFidelity math_fidelity = MathFidelity::HiFi4;
    bool fp32_dest_acc_en = false;
    bool dst_full_sync_en = false;
    std::vector<UnpackToDestMode> unpack_to_dest_mode;
    bool bfp8_pack_precise = false;
    bool math_approx_mode = false;
    std::vector<uint32_t> compile_args;
    std::map<std::string, std::string> defines;
};

class CircularBufferConfig {
  public:
    CircularBufferConfig(uint32_t total_size, const std::map<uint8_t, tt::DataFormat> &formats)
        : total_size_(total_size), formats_(formats) {}
    CircularBufferConfig &set_page_size(uint8_t index, uint32_t page_size) {
        if (!formats_.count(index)) ttmodel::fail(1, "CB", "set_page_size(%u, %u): CB %u has no data format in this config", index, page_size, index);
        page_sizes_[index] = page_size;
        return *this;
    }
    uint32_t total_size() const { return total_size_; }
    const std::map<uint8_t, tt::DataFormat> &formats() const { return formats_; }
    const std::map<uint8_t, uint32_t> &page_sizes() const { return page_sizes_; }

  private:
    uint32_t total_size_;
    std::map<uint8_t, tt::DataFormat> formats_;
    std::map<uint8_t, uint32_t> page_sizes_;
};

struct Program {
    struct Cb { std::set<CoreCoord> cores; CircularBufferConfig cfg; };
    struct Kernel {
        std::string path;
        std::set<CoreCoord> cores;
        int role;
        std::vector<uint32_t> ct;
        std::map<std::string, std::string> defines;
        ComputeConfig compute;
        std::string so;
        std::map<CoreCoord, std::vector<uint32_t>> rt;
    };
    std::vector<Cb> cbs;
    std::vector<Kernel> kernels;
};

inline Program CreateProgram() { return Program{}; }

namespace detail {
inline std::set<CoreCoord> cores_of(const CoreRangeSet &s) {
    std::set<CoreCoord> out;
    for (const auto &r : s.ranges())
        for (std::size_t y = r.start_coord.y; y <= r.end_coord.y; y++)
            for (std::size_t x = r.start_coord.x; x <= r.end_coord.x; x++) out.insert({x, y});
    return out;
}
inline uint64_t fnv(const std::string &s, uint64_t h = 1469598103934665603ull) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}
inline std::string quote(const std::string &s) {
    std::string o = "'";
    for (char c : s) o += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return o + "'";
}
/* compile one kernel (file, role, CT args, defines) into a cached shared object; returns its path */
inline std::string jit(const std::string &path, int role, const std::vector<uint32_t> &ct,
                       const std::map<std::string, std::string> &defines, const ComputeConfig &cc) {
    std::ifstream in(path);
    if (!in) ttmodel::fail(0, "model", "CreateKernel: cannot read kernel source %s", path.c_str());
    std::stringstream text;
    text << in.rdbuf();
    /* the key covers the op's own headers the kernel includes by relative path (its dataflow
       helpers), so a kernel is rebuilt when they change, not only when its own text does */
    std::string deps;
    {
        std::istringstream lines(text.str());
        std::string line;
        const std::string dir = path.substr(0, path.rfind('/') + 1);
        while (std::getline(lines, line)) {
            const std::string inc = "#include \"";
            if (line.compare(0, inc.size(), inc) != 0) continue;
            const std::size_t end = line.find('"', inc.size());
            if (end == std::string::npos) continue;
            std::ifstream dep(dir + line.substr(inc.size(), end - inc.size()));
            if (dep) {
                std::stringstream d;
                d << dep.rdbuf();
                deps += d.str();
            }
        }
    }
    std::string flags = OPGEN_TT_KERNEL_FLAGS;
    std::string args = " -I" + quote(OPGEN_TT_MODEL_DIR) + " -I" + quote(path.substr(0, path.rfind('/') + 1) + ".");
    if (*OPGEN_TT_KERNEL_PCH) args += " -include " + quote(OPGEN_TT_KERNEL_PCH); /* model_std.h, precompiled */
    std::string cta;
    for (std::size_t i = 0; i < ct.size(); i++) cta += (i ? "," : "") + std::to_string(ct[i]);
    args += " " + quote("-DKERNEL_COMPILE_TIME_ARGS=" + cta);
    for (const auto &[k, v] : defines) args += " " + quote("-D" + k + "=" + v);
    args += role == ttmodel::COMPUTE ? std::string(" -DOPGEN_TT_COMPUTE -DDST_ACCUM_MODE=") + (cc.fp32_dest_acc_en ? "1" : "0")
                                     : std::string(role == ttmodel::READER ? " -DCOMPILE_FOR_NCRISC" : " -DCOMPILE_FOR_BRISC");
    const char *cache_env = getenv("OPGEN_TT_KERNEL_CACHE");
    std::string cache = cache_env && *cache_env ? cache_env : OPGEN_TT_KERNEL_CACHE;
    char key[32];
    snprintf(key, sizeof key, "%016llx",
             (unsigned long long)fnv(text.str() + "\n" + deps + "\n" + flags + args + OPGEN_TT_MODEL_HASH));
    std::string base = path.substr(path.rfind('/') + 1);
    std::string so = cache + "/" + base + "." + key + ".so";
    if (std::ifstream(so).good()) return so;
    std::string tmp = so + ".tmp" + std::to_string(getpid()) + "_" + std::to_string(fnv(path, (uint64_t)pthread_self()));
    std::string cmd = std::string("mkdir -p ") + quote(cache) + " && " + OPGEN_TT_CXX + " " + flags + args + " " +
                      quote(path) + " -o " + quote(tmp) + " 2>&1 && mv " + quote(tmp) + " " + quote(so);
    FILE *p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (p && fgets(buf, sizeof buf, p)) out += buf;
    int rc = p ? pclose(p) : -1;
    if (rc != 0) {
        fprintf(stderr, "%s\n", out.c_str());
        ttmodel::fail(0, "model", "CreateKernel: compiling %s failed: %s", path.c_str(), cmd.c_str());
    }
    return so;
}
}  // namespace detail

inline CBHandle CreateCircularBuffer(Program &program, const CoreRangeSet &cores, const CircularBufferConfig &cfg) {
    for (const auto &[idx, fmt] : cfg.formats()) {
        if (idx >= ttmodel::kNumCBs) ttmodel::fail(1, "CB", "CB index %u is out of range: a core has 32 CBs (c_0..c_31)", idx);
        auto ps = cfg.page_sizes().find(idx);
        if (ps == cfg.page_sizes().end()) ttmodel::fail(1, "CB", "CB %u: set_page_size was not called", idx);
        if (ps->second == 0 || ps->second % 16)
            ttmodel::fail(1, "CB", "CB %u: page size %u is not a positive multiple of 16 B", idx, ps->second);
        if (cfg.total_size() == 0 || cfg.total_size() % ps->second)
            ttmodel::fail(1, "CB", "CB %u: total size %u is not a positive multiple of the page size %u", idx, cfg.total_size(), ps->second);
    }
    program.cbs.push_back({detail::cores_of(cores), cfg});
    return program.cbs.size();
}

inline KernelHandle CreateKernel(Program &program, const std::string &path, const CoreRangeSet &cores,
                                 const DataMovementConfig &cfg) {
    Program::Kernel k{path, detail::cores_of(cores), cfg.processor == DataMovementProcessor::RISCV_1 ? ttmodel::READER : ttmodel::WRITER,
                      cfg.compile_args, cfg.defines, ComputeConfig{}, "", {}};
    k.so = detail::jit(path, k.role, k.ct, k.defines, k.compute);
    program.kernels.push_back(std::move(k));
    return program.kernels.size() - 1;
}
inline KernelHandle CreateKernel(Program &program, const std::string &path, const CoreRangeSet &cores, const ComputeConfig &cfg) {
    Program::Kernel k{path, detail::cores_of(cores), ttmodel::COMPUTE, cfg.compile_args, cfg.defines, cfg, "", {}};
    k.so = detail::jit(path, k.role, k.ct, k.defines, k.compute);
    program.kernels.push_back(std::move(k));
    return program.kernels.size() - 1;
}

inline void SetRuntimeArgs(Program &program, KernelHandle kernel, const CoreRangeSet &cores, const std::vector<uint32_t> &args) {
    if (kernel >= program.kernels.size()) ttmodel::fail(0, "model", "SetRuntimeArgs: no kernel %u", kernel);
    if (args.size() > 341) ttmodel::fail(0, "model", "SetRuntimeArgs: %zu runtime args (max_runtime_args = 341)", args.size());
    for (const auto &c : detail::cores_of(cores)) program.kernels[kernel].rt[c] = args;
}
inline void SetRuntimeArgs(Program &program, KernelHandle kernel, const CoreRangeSet &cores, std::initializer_list<uint32_t> args) {
    SetRuntimeArgs(program, kernel, cores, std::vector<uint32_t>(args));
}

}  // namespace tt::tt_metal

namespace ttmodel {

inline void (*load_kernel(const std::string &so))(Thread *) {
    static std::mutex m;
    static std::map<std::string, void (*)(Thread *)> loaded;
    std::lock_guard<std::mutex> g(m);
    auto it = loaded.find(so);
    if (it != loaded.end()) return it->second;
    void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) fail(0, "model", "dlopen %s: %s", so.c_str(), dlerror());
    auto f = (void (*)(Thread *))dlsym(h, "opgen_tt_kernel_entry");
    if (!f) fail(0, "model", "%s has no kernel entry", so.c_str());
    return loaded[so] = f;
}

inline void thread_main(Thread *t, void (*entry)(Thread *)) {
    tls = t;
    entry(t);
    t->line = 0;
    if (!t->reads.empty()) fail(3, "NOC", "kernel returned with %zu NOC reads not waited for (noc_async_read_barrier)", t->reads.size());
    if (!t->writes.empty())
        fail(3, "NOC", "kernel returned with %zu NOC writes not flushed (noc_async_write_barrier)", t->writes.size());
    if (t->cs && t->cs->state != DST_IDLE) fail(4, "DST protocol", "kernel returned inside a tile_regs_acquire ... tile_regs_release section");
    Core &c = *t->core;
    std::lock_guard<std::mutex> g(c.m);
    t->finished = true;
    c.cv.notify_all();
}

/* run `program` on one model core per core named by its kernels; returns when every core finished */
inline void run(tt::tt_metal::Program &program) {
    std::set<CoreCoord> all;
    for (const auto &k : program.kernels) all.insert(k.cores.begin(), k.cores.end());
    std::vector<std::unique_ptr<Core>> cores;
    std::vector<std::unique_ptr<ComputeState>> states;
    for (const auto &cc : all) {
        auto core = std::make_unique<Core>();
        core->x = (uint32_t)cc.x;
        core->y = (uint32_t)cc.y;
        core->init_l1(l1_size());
        core->dram = &dram();
        tls = nullptr;
        uint64_t at = l1_base();
        for (const auto &cb : program.cbs) {
            if (!cb.cores.count(cc)) continue;
            for (const auto &[idx, fmt] : cb.cfg.formats()) {
                CB &b = core->cbs[idx];
                if (b.configured) fail(1, "CB", "CB %u is created twice on core (%zu,%zu)", idx, cc.x, cc.y);
                b.configured = true;
                b.page = cb.cfg.page_sizes().at(idx);
                b.size = cb.cfg.total_size();
                b.pages = b.size / b.page;
                b.format = fmt;
                at = (at + 15) & ~15ull;
                b.addr = (uint32_t)((uintptr_t)core->l1 + at);
                at += b.size;
            }
        }
        if (at > core->l1_bytes) {
            std::string list;
            for (uint32_t i = 0; i < kNumCBs; i++)
                if (core->cbs[i].configured) list += " c_" + std::to_string(i) + "=" + std::to_string(core->cbs[i].size);
            fail(2, "L1", "core (%zu,%zu): CBs need %llu B from L1 base %u but L1 has %u B (CB bytes:%s)", cc.x, cc.y,
                 (unsigned long long)at, l1_base(), core->l1_bytes, list.c_str());
        }
        int roles = 0;
        for (const auto &k : program.kernels) {
            if (!k.cores.count(cc)) continue;
            if (roles & (1 << k.role)) fail(0, "model", "core (%zu,%zu) has two %s kernels", cc.x, cc.y, role_name(k.role));
            roles |= 1 << k.role;
            Thread &t = core->threads[k.role];
            t.core = core.get();
            t.role = k.role;
            t.file = k.path.substr(k.path.rfind('/') + 1);
            auto rt = k.rt.find(cc);
            if (rt != k.rt.end()) t.rt_args = rt->second;
            if (k.role == COMPUTE) {
                states.push_back(std::make_unique<ComputeState>());
                t.cs = states.back().get();
                core->fp32_dest_acc = k.compute.fp32_dest_acc_en;
                core->dst_full_sync = k.compute.dst_full_sync_en;
                for (std::size_t i = 0; i < k.compute.unpack_to_dest_mode.size() && i < kNumCBs; i++)
                    core->unpack_to_dest_fp32[i] = k.compute.unpack_to_dest_mode[i] == tt::tt_metal::UnpackToDestMode::UnpackToDestFp32;
            }
        }
        for (int r = 0; r < 3; r++)
            if (!(roles & (1 << r))) { /* a missing kernel is an empty one */
                core->threads[r].core = core.get();
                core->threads[r].role = r;
                core->threads[r].file = "(none)";
                core->threads[r].finished = true;
            }
        cores.push_back(std::move(core));
    }
    std::vector<std::thread> threads;
    std::size_t ci = 0;
    for (const auto &cc : all) {
        Core *core = cores[ci++].get();
        for (const auto &k : program.kernels)
            if (k.cores.count(cc)) threads.emplace_back(thread_main, &core->threads[k.role], load_kernel(k.so));
    }
    for (auto &t : threads) t.join();
    for (auto &core : cores) {
        for (uint32_t i = 0; i < kNumCBs; i++) {
            const CB &b = core->cbs[i];
            if (!b.configured) continue;
            if (b.reserved)
                fail(1, "CB", "core (%u,%u) CB %u: %u reserved pages were never pushed when the kernels finished", core->x, core->y, i, b.reserved);
            if (b.pushed != b.popped)
                fail(1, "CB", "core (%u,%u) CB %u: %llu pages pushed but %llu popped when the kernels finished", core->x, core->y, i,
                     (unsigned long long)b.pushed, (unsigned long long)b.popped);
        }
    }
}

}  // namespace ttmodel

#endif /* OPGEN_TTMETAL_MODEL_HOST_API_HPP */
