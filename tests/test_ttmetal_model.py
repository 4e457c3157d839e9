"""The TT-Metal CPU model (tests/ttmetal_model/, docs/ttmetal_model.md) tested on its own: a
hand-written reader / compute / writer triple (z = x * y per tile, and r = 0.5 * row sums of z via
reduce_tile with a scaler tile the reader builds), host code on the model's tt::tt_metal shim, run in
subprocesses (a rule violation aborts the process).

* bf16 and f32 (fp32_dest_acc_en) results against numpy.
* Every rule of the model broken once (``RULE=<case>`` define / host argument): the process aborts
  with ``ttmetal-model: rule N (name): ...``; case 0 is the positive control.
* The same kernels through ``shared/tools/tt-kernel-check --werror`` (real 0.81.1 headers), when the
  tool is present, to keep the spellings honest.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.ttmetal_model import build as model_build

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "ttmetal-model-tests"
BF16 = ml_dtypes.bfloat16

pytestmark = pytest.mark.skipif(model_build.cxx() is None, reason="no g++")

READER = r"""
// reader: x and y tiles -> c_0, c_1; a bf16 scaler tile (1.0 in row 0 of each face) -> c_2 once
#include <cstdint>
#include "api/dataflow/dataflow_api.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    const uint32_t x_addr = get_arg_val<uint32_t>(0);
    const uint32_t y_addr = get_arg_val<uint32_t>(1);
    const uint32_t n_tiles = get_arg_val<uint32_t>(2);
    constexpr uint32_t cb_x = tt::CBIndex::c_0, cb_y = tt::CBIndex::c_1, cb_one = tt::CBIndex::c_2;
    constexpr auto x_args = TensorAccessorArgs<0>();
    constexpr auto y_args = TensorAccessorArgs<x_args.next_compile_time_args_offset()>();
    const auto x = TensorAccessor(x_args, x_addr, get_tile_size(cb_x));
    const auto y = TensorAccessor(y_args, y_addr, get_tile_size(cb_y));

    cb_reserve_back(cb_one, 1);
    volatile tt_l1_ptr uint32_t* one = reinterpret_cast<volatile tt_l1_ptr uint32_t*>(get_write_ptr(cb_one));
    for (uint32_t i = 0; i < 512; ++i) one[i] = 0;
    for (uint32_t f = 0; f < 4; ++f)
        for (uint32_t w = 0; w < 8; ++w) one[f * 128 + w] = 0x3f803f80u;
    cb_push_back(cb_one, 1);

    for (uint32_t t = 0; t < n_tiles; ++t) {
#if RULE == 12
        const uint32_t l1 = get_write_ptr(cb_x);
        (void)l1;
#endif
#if RULE == 11
        cb_reserve_back(cb_x, 3);
#endif
        cb_reserve_back(cb_x, 1);
        cb_reserve_back(cb_y, 1);
#if RULE == 31
        noc_async_read(x.get_noc_addr(t) + 16, get_write_ptr(cb_x), 1024);
#elif RULE == 32
        noc_async_read(x.get_noc_addr(t), get_write_ptr(cb_x) + 8, 1024);
#else
        noc_async_read_page(t, x, get_write_ptr(cb_x));
#endif
        noc_async_read_page(t, y, get_write_ptr(cb_y));
#if RULE == 33
        cb_push_back(cb_x, 1);
        noc_async_read_barrier();
#else
        noc_async_read_barrier();
        cb_push_back(cb_x, 1);
#endif
#if RULE == 13
        cb_push_back(cb_y, 2);
#else
        cb_push_back(cb_y, 1);
#endif
    }
}
"""

COMPUTE = r"""
// compute: z = x * y (FPU) -> c_16 and c_24; r = 0.5 * rowsum(z) (reduce_tile + SFPU) -> c_17
#include <cstdint>
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/eltwise_binary.h"
#include "api/compute/reduce.h"
#include "api/compute/eltwise_unary/binop_with_scalar.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"
#include "api/compute/reconfig_data_format.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    constexpr uint32_t n_tiles = get_compile_time_arg_val(0);
    constexpr uint32_t half_bits = get_compile_time_arg_val(1);
    constexpr uint32_t cb_x = tt::CBIndex::c_0, cb_y = tt::CBIndex::c_1, cb_one = tt::CBIndex::c_2;
    constexpr uint32_t cb_z = tt::CBIndex::c_16, cb_r = tt::CBIndex::c_17, cb_zz = tt::CBIndex::c_24;
#if RULE != 54
    compute_kernel_hw_startup(cb_x, cb_y, cb_z);
#endif
    cb_wait_front(cb_one, 1);
    for (uint32_t t = 0; t < n_tiles; ++t) {
        cb_wait_front(cb_x, 1);
        cb_wait_front(cb_y, 1);
#if RULE == 51
        add_init(cb_x, cb_y);
#else
        mul_init(cb_x, cb_y);
#endif
#if RULE == 43
        mul_tiles(cb_x, cb_y, 0, 0, 0);
#endif
        tile_regs_acquire();
#if RULE == 42
        mul_tiles(cb_x, cb_y, 0, 0, 8);
#else
        mul_tiles(cb_x, cb_y, 0, 0, 0);
#endif
        tile_regs_commit();
#if RULE == 41
        cb_reserve_back(cb_z, 1);
        pack_tile(0, cb_z);
#endif
        tile_regs_wait();
        cb_reserve_back(cb_z, 1);
        pack_tile(0, cb_z);
        cb_push_back(cb_z, 1);
        cb_reserve_back(cb_zz, 1);
        pack_tile(0, cb_zz);
        cb_push_back(cb_zz, 1);
        tile_regs_release();
        cb_pop_front(cb_x, 1);
        cb_pop_front(cb_y, 1);

        cb_wait_front(cb_zz, 1);
        reconfig_data_format(cb_one, cb_zz);
        reduce_init<PoolType::SUM, ReduceDim::REDUCE_ROW>(cb_zz, cb_one, cb_r);
        tile_regs_acquire();
        reduce_tile<PoolType::SUM, ReduceDim::REDUCE_ROW>(cb_zz, cb_one, 0, 0, 0);
#if RULE != 52
        binop_with_scalar_tile_init();
#endif
        mul_unary_tile(0, half_bits);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_r, 1);
        pack_tile(0, cb_r);
        cb_push_back(cb_r, 1);
        tile_regs_release();
#if RULE != 53
        reduce_uninit();
#endif
        cb_pop_front(cb_zz, 1);
    }
    cb_pop_front(cb_one, 1);
}
"""

WRITER = r"""
// writer: c_16 -> z pages, c_17 -> r pages
#include <cstdint>
#include "api/dataflow/dataflow_api.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    const uint32_t z_addr = get_arg_val<uint32_t>(0);
    const uint32_t r_addr = get_arg_val<uint32_t>(1);
    const uint32_t n_tiles = get_arg_val<uint32_t>(2);
    constexpr uint32_t cb_z = tt::CBIndex::c_16, cb_r = tt::CBIndex::c_17;
    constexpr auto z_args = TensorAccessorArgs<0>();
    constexpr auto r_args = TensorAccessorArgs<z_args.next_compile_time_args_offset()>();
    const auto z = TensorAccessor(z_args, z_addr, get_tile_size(cb_z));
    const auto r = TensorAccessor(r_args, r_addr, get_tile_size(cb_r));
    for (uint32_t t = 0; t < n_tiles; ++t) {
        cb_wait_front(cb_z, 1);
        noc_async_write_page(t, z, get_read_ptr(cb_z));
#if RULE == 34
        cb_pop_front(cb_z, 1);
        noc_async_writes_flushed();
#else
        noc_async_writes_flushed();
        cb_pop_front(cb_z, 1);
#endif
        cb_wait_front(cb_r, 1);
        noc_async_write_page(t, r, get_read_ptr(cb_r));
        noc_async_writes_flushed();
#if RULE == 14
        if (t + 1 < n_tiles) cb_pop_front(cb_r, 1);
#else
        cb_pop_front(cb_r, 1);
#endif
    }
    noc_async_write_barrier();
#if RULE == 7
    cb_wait_front(cb_z, 1);
#endif
}
"""

HOST = r"""
// host: argv = kernel_dir f32(0|1) n_tiles rule in.bin out.bin
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <tt-metalium/host_api.hpp>

using namespace tt::tt_metal;

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage\n"); return 2; }
    const std::string dir = argv[1];
    const bool f32 = atoi(argv[2]) != 0;
    const uint32_t n = (uint32_t)atoi(argv[3]);
    const int rule = atoi(argv[4]);
    const tt::DataFormat fmt = f32 ? tt::DataFormat::Float32 : tt::DataFormat::Float16_b;
    const uint32_t page = f32 ? 4096 : 2048;
    std::vector<uint8_t> in(2 * n * page);
    FILE *fi = fopen(argv[5], "rb");
    if (!fi || fread(in.data(), 1, in.size(), fi) != in.size()) { fprintf(stderr, "bad input\n"); return 2; }
    fclose(fi);
    uint32_t x = ttmodel::dram_alloc(n * page), y = ttmodel::dram_alloc(n * page);
    uint32_t z = ttmodel::dram_alloc(n * page), r = ttmodel::dram_alloc(n * page);
    memcpy(ttmodel::dram_ptr(x), in.data(), n * page);
    memcpy(ttmodel::dram_ptr(y), in.data() + n * page, n * page);

    Program program = CreateProgram();
    CoreCoord core{0, 0};
    auto cb = [&](uint8_t idx, uint32_t pages, tt::DataFormat f, uint32_t pg) {
        CreateCircularBuffer(program, core, CircularBufferConfig(pages * pg, {{idx, f}}).set_page_size(idx, pg));
    };
    cb(tt::CBIndex::c_0, 2, fmt, rule == 10 ? page - 8 : page);
    cb(tt::CBIndex::c_1, 2, fmt, page);
    cb(tt::CBIndex::c_2, 1, tt::DataFormat::Float16_b, 2048);
    cb(tt::CBIndex::c_16, 2, fmt, page);
    cb(tt::CBIndex::c_17, 2, fmt, page);
    cb(tt::CBIndex::c_24, rule == 20 ? 800 : 1, fmt, page);
    // RULE=<case> goes to the one kernel the case breaks (cases 1x/3x reader or writer, 4x/5x compute)
    auto defs = [&](int role) {
        bool r = rule == 11 || rule == 12 || rule == 13 || (rule >= 31 && rule <= 33);
        bool w = rule == 14 || rule == 34 || rule == 7;
        bool c = rule >= 41 && rule <= 59;
        std::map<std::string, std::string> d;
        if ((role == 0 && r) || (role == 1 && c) || (role == 2 && w)) d["RULE"] = std::to_string(rule);
        return d;
    };
    std::vector<uint32_t> ct{2, page, 2, page};  // two TensorAccessorArgs: {IsDram, aligned page}
    auto reader = CreateKernel(program, dir + "/reader.cpp", core, ReaderDataMovementConfig(ct, defs(0)));
    auto writer = CreateKernel(program, dir + "/writer.cpp", core, WriterDataMovementConfig(ct, defs(2)));
    float half = 0.5f;
    uint32_t half_bits;
    memcpy(&half_bits, &half, 4);
    CreateKernel(program, dir + "/compute.cpp", core,
                 ComputeConfig{.fp32_dest_acc_en = f32, .compile_args = {n, half_bits}, .defines = defs(1)});
    SetRuntimeArgs(program, reader, core, {x, y, n});
    SetRuntimeArgs(program, writer, core, {z, r, n});
    ttmodel::run(program);

    FILE *fo = fopen(argv[6], "wb");
    fwrite(ttmodel::dram_ptr(z), 1, n * page, fo);
    fwrite(ttmodel::dram_ptr(r), 1, n * page, fo);
    fclose(fo);
    return 0;
}
"""


def tilize(a: np.ndarray) -> np.ndarray:
    """(32*n, 32) -> n tiles of 4 faces of 16x16, flattened (the L1/DRAM tile layout)."""
    n = a.shape[0] // 32
    return a.reshape(n, 2, 16, 2, 16).transpose(0, 1, 3, 2, 4).reshape(-1)


def untilize(t: np.ndarray, n: int) -> np.ndarray:
    return t.reshape(n, 2, 2, 16, 16).transpose(0, 1, 3, 2, 4).reshape(32 * n, 32)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    OUT.mkdir(parents=True, exist_ok=True)
    exe = model_build.build_host({"host.cpp": HOST, "reader.cpp": READER, "compute.cpp": COMPUTE,
                                  "writer.cpp": WRITER}, OUT)
    return exe


def run(host: Path, *, f32: bool, n: int, rule: int, x: np.ndarray, y: np.ndarray, tmp: Path):
    dt = np.float32 if f32 else BF16
    inp, out = tmp / f"in{rule}.bin", tmp / f"out{rule}.bin"
    np.concatenate([tilize(x.astype(dt)), tilize(y.astype(dt))]).tofile(inp)
    r = subprocess.run([str(host), str(OUT / "src"), str(int(f32)), str(n), str(rule), str(inp), str(out)],
                       capture_output=True, text=True, timeout=120)
    return r, (np.fromfile(out, dtype=dt) if r.returncode == 0 else None)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_product_and_row_sums(host, tmp_path, f32):
    n = 3
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32 * n, 32)).astype(np.float32)
    y = rng.standard_normal((32 * n, 32)).astype(np.float32)
    dt = np.float32 if f32 else BF16
    r, out = run(host, f32=f32, n=n, rule=0, x=x, y=y, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    xq, yq = x.astype(dt).astype(np.float32), y.astype(dt).astype(np.float32)
    z = untilize(out[: n * 1024].astype(np.float32), n)
    rs = untilize(out[n * 1024:].astype(np.float32), n)
    # f32: FPU operands are TF32 (10 mantissa bits); bf16: DST and the CBs round to bf16
    tol = 2e-3 if f32 else 1e-2
    np.testing.assert_allclose(z, xq * yq, rtol=tol, atol=tol)
    ref = 0.5 * (xq * yq).sum(axis=1)
    np.testing.assert_allclose(rs[:, 0], ref, rtol=3e-2, atol=5e-2 if not f32 else 1e-2)
    assert not rs[:, 1:].any(), "reduce output is masked to column 0 while reduce_init is active"


# case -> the abort text (each rule broken once; 0 is the positive control)
RULES = {
    10: "rule 1 (CB): CB 0: page size 2040 is not a positive multiple of 16 B",
    11: "rule 1 (CB): cb_reserve_back(0, 3): CB 0 holds 2 pages",
    12: "rule 1 (CB): get_write_ptr(0) without an open cb_reserve_back",
    13: "rule 1 (CB): cb_push_back(1, 2) pushes more than the 1 reserved pages",
    14: "rule 1 (CB): core (0,0) CB 17: 2 pages pushed but 1 popped when the kernels finished",
    20: "rule 2 (L1): core (0,0): CBs need",
    31: "rule 3 (NOC): noc_async_read: DRAM source address",
    32: "rule 3 (NOC): noc_async_read: L1 destination address",
    33: "rule 3 (NOC): cb_push_back(0, 1) before noc_async_read_barrier()",
    34: "rule 3 (NOC): cb_pop_front(16, 1) before noc_async_writes_flushed()",
    41: "rule 4 (DST protocol): pack_tile outside tile_regs_wait ... tile_regs_release",
    42: "rule 4 (DST protocol): mul_tiles: DST index 8 out of range: DST holds 8 tiles (16-bit, half-sync)",
    43: "rule 4 (DST protocol): mul_tiles outside tile_regs_acquire ... tile_regs_commit",
    51: "rule 5 (init): mul_tiles needs mul_init since the last FPU init (the last one was add_init)",
    52: "rule 5 (init): mul_unary_tile needs binop_with_scalar_tile_init",
    53: "rule 5 (init): pack_tile of DST[0] (not a reduce result) after reduce_init without reduce_uninit",
    54: "rule 5 (init): mul_init before compute_kernel_hw_startup",
    7: "rule 7 (deadlock): every kernel of the core is blocked or finished",
}


def test_rules(host, tmp_path):
    n = 2
    x = np.ones((32 * n, 32), np.float32)

    def one(case):
        return case, run(host, f32=False, n=n, rule=case, x=x, y=x, tmp=tmp_path)[0]

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        results = dict(ex.map(one, [0, *RULES]))
    assert results[0].returncode == 0, results[0].stderr
    bad = []
    for case, want in RULES.items():
        r = results[case]
        if r.returncode == 0 or want not in r.stderr:
            bad.append(f"case {case}: rc={r.returncode} want {want!r}\n{r.stderr[-800:]}")
    assert not bad, "\n".join(bad)
    # the message names the core, the kernel and the line
    assert "[core (0,0) reader kernel reader.cpp:" in results[31].stderr
    assert "waits in cb_wait_front(16, 1)" in results[7].stderr
    assert "reader (reader.cpp:0) finished" in results[7].stderr


CHECKER = REPO.parent / "shared" / "tools" / "tt-kernel-check"
CHECKER = CHECKER if CHECKER.is_file() else Path("/work/shared/tools/tt-kernel-check")


@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_kernels_pass_the_real_header_check(tmp_path):
    """The hand-written kernels compile clean against the real 0.81.1 headers (installs itself on first use)."""
    src = {"reader.cpp": (READER, "reader", "2,2048,2,2048"), "writer.cpp": (WRITER, "writer", "2,2048,2,2048"),
           "compute.cpp": (COMPUTE, "compute", "3,1056964608")}
    inst = subprocess.run([str(CHECKER), "--install"], capture_output=True, text=True, timeout=600)
    if inst.returncode != 0:
        pytest.skip(f"tt-kernel-check --install failed: {inst.stdout[-400:]}{inst.stderr[-400:]}")

    def check(item):
        name, (text, role, ct) = item
        p = tmp_path / name
        p.write_text(text)
        return name, subprocess.run([str(CHECKER), "--role", role, "--ct-args", ct, "--werror", str(p)],
                                    capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=3) as ex:
        for name, r in ex.map(check, src.items()):
            assert r.returncode == 0, f"{name}:\n{r.stdout}{r.stderr}"
