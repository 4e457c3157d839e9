/* ascendc_model_runtime.cpp — the runtime of opgen's Ascend C CPU model: launches (blocks as
 * threads, each with a private UB arena; MIX launches run 2 AIV blocks per numBlocks), SyncAll, the GM atomic lock and error reporting.
 * build.py compiles it into every library built against the model. */
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "ascendc_model_core.h"
#include "ascendc_model_host.h"

namespace ascend_model {

namespace {

struct Launch {
    const char *name = "";
    uint32_t num = 0;    /* blocks (threads): numBlocks, or 2 * numBlocks AIV blocks in a MIX launch */
    uint32_t blocks = 0; /* numBlocks as launched */
    uint32_t ration = 1; /* AIV blocks per numBlocks unit: 2 in a MIX launch */
    uint32_t cores = 0;  /* AIV cores, or AIC cores (AI Core groups) in a MIX launch */
    bool mix = false;
    bool resident = false; /* every block runs at once (numBlocks <= cores) */
    std::mutex m;
    std::condition_variable cv;
    uint32_t arrived = 0; /* blocks waiting in the current SyncAll */
    uint64_t phase = 0;   /* completed SyncAlls */
    uint32_t exited = 0;  /* blocks that returned */
};

thread_local Block *t_block = nullptr;
std::mutex g_atomic;
std::mutex g_fail; /* held by the first failing thread until abort(): one message per process */
std::atomic<aclrtStream> g_last_stream{nullptr};

}  // namespace

void fail(int rule, const char *name, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char where[256] = "";
    if (t_block)
        snprintf(where, sizeof where, " [block %lld/%lld of kernel %s]", (long long)t_block->idx,
                 (long long)(t_block->num * t_block->ration), static_cast<Launch *>(t_block->launch)->name);
    g_fail.lock();
    fprintf(stderr, "ascend-model: rule %d (%s): %s%s\n", rule, name, msg, where);
    fflush(stderr);
    abort();
}

Block *block_or_null() { return t_block; }

Block *block() {
    if (!t_block) fail(0, "model", "a kernel API was called outside a kernel launch");
    return t_block;
}

void gm_atomic_lock() { g_atomic.lock(); }
void gm_atomic_unlock() { g_atomic.unlock(); }

void sync_all() {
    Block *b = block();
    Launch *L = static_cast<Launch *>(b->launch);
    if (!L->resident)
        fail(10, "blocks",
             "SyncAll with numBlocks %u > %u %s: the blocks run in several waves on hardware and SyncAll never "
             "returns",
             L->blocks, L->cores, L->mix ? "AIC cores (MIX launch: numBlocks counts 1 AIC + 2 AIV groups)" : "AIV cores");
    std::unique_lock<std::mutex> lk(L->m);
    if (L->exited)
        fail(10, "blocks", "SyncAll: %u block(s) already returned without reaching it (on hardware: a hang)",
             L->exited);
    uint64_t phase = L->phase;
    if (++L->arrived == L->num) {
        L->arrived = 0;
        L->phase++;
        L->cv.notify_all();
        return;
    }
    L->cv.wait(lk, [&] { return L->phase != phase || L->exited != 0; });
    if (L->phase == phase)
        fail(10, "blocks", "SyncAll: %u block(s) returned without reaching it (on hardware: a hang)", L->exited);
}

namespace {

void run_block(Launch &L, uint32_t idx, uint8_t *ub, uint32_t ub_bytes, void (*body)(void *), void *arg) {
    /* hardware UB holds whatever the last kernel left: the model fills it with 0xFF (a NaN in
     * every float type) so that reading before writing shows */
    memset(ub, 0xFF, ub_bytes);
    Block blk;
    blk.idx = idx;
    blk.num = L.blocks;
    blk.ration = L.ration;
    blk.mix = L.mix;
    blk.ub = ub;
    blk.ub_size = ub_bytes;
    blk.launch = &L;
    t_block = &blk;
    body(arg);
    t_block = nullptr;
    std::lock_guard<std::mutex> lk(L.m);
    L.exited++;
    L.cv.notify_all();
}

}  // namespace

uint32_t launch(uint32_t numBlocks, aclrtStream stream, void (*body)(void *), void *arg, const char *name,
                bool mix) {
    if (t_block) fail(0, "model", "kernel %s launched from inside a kernel", name);
    g_last_stream.store(stream);
    if (numBlocks == 0 || numBlocks > 65535)
        fail(10, "blocks", "launch of kernel %s with numBlocks %u (must be in [1, 65535])", name, numBlocks);
    Launch L;
    L.name = name;
    L.mix = mix;
    L.blocks = numBlocks;
    L.ration = mix ? 2 : 1;
    L.num = numBlocks * L.ration;
    /* a MIX launch occupies numBlocks AI Core groups (1 AIC + 2 AIV each): AIC cores = AIV / 2 */
    L.cores = mix ? (aiv_cores() + 1) / 2 : aiv_cores();
    L.resident = numBlocks <= L.cores;
    const uint32_t ub_bytes = ub_size();
    const uint32_t workers = std::min(L.num, L.cores * L.ration);
    const uint32_t total = L.num;
    std::atomic<uint32_t> next{0};
    auto worker = [&] {
        uint8_t *ub = static_cast<uint8_t *>(aligned_alloc(64, ub_bytes));
        if (!ub) fail(0, "model", "out of host memory for a %u-B UB arena", ub_bytes);
        for (uint32_t i; (i = next.fetch_add(1)) < total;) run_block(L, i, ub, ub_bytes, body, arg);
        free(ub);
    };
    std::vector<std::thread> threads;
    threads.reserve(workers);
    for (uint32_t w = 0; w < workers; w++) threads.emplace_back(worker);
    for (auto &t : threads) t.join();
    return 0;
}

}  // namespace ascend_model

extern "C" aclrtStream ascendc_model_last_stream(void) { return ascend_model::g_last_stream.load(); }
