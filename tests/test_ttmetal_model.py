"""The TT-Metal CPU model (tests/ttmetal_model/, docs/ttmetal_model.md) tested on its own: a
hand-written reader / compute / writer triple (z = x * y per tile, and r = 0.5 * row sums of z via
reduce_tile with a scaler tile the reader builds), host code on the model's tt::tt_metal shim, run in
subprocesses (a rule violation aborts the process).

* bf16 and f32 (fp32_dest_acc_en) results against numpy.
* Every rule of the model broken once (``RULE=<case>`` define / host argument): the process aborts
  with ``ttmetal-model: rule N (name): ...``; case 0 is the positive control.
* A second program (``rms_*`` kernels): per 32-row block rstd = rsqrt(mean(x*x) + eps) (reduce ROW,
  mul/add_unary, rsqrt), y = x * rstd (bcast cols) * w (bcast rows), column sums (reduce COL), and
  e = (x - w) * recip(x*x + 1) in DST (copy_tile, SFPU binary ops, fill_tile, recip), bf16 and f32,
  against float64 numpy; then the same program on 2-4 cores must give the 1-core bytes exactly.
* A third program (``bx_*`` kernels) on the distributed host API (MeshDevice, MeshBuffer, TensorAccessorArgs
  .append_to, split_work_to_cores on a 2x2 grid, MeshWorkload, EnqueueWrite/ReadMeshBuffer): unary_bcast
  ROW/COL/SCALAR, mask_tile (a select: NaN/inf under a zero mask become 0) and exp_tile, bf16 and f32, plus
  its rule cases (missing/wrong unary_bcast_init, mask not in DST[d+1], host data of the wrong size).
* A fourth program (``nx_*`` kernels): a scatter-add of rows with reshuffle_rows_tile (mask bytes built by the reader,
  count via read_tile_value, mask address via get_tile_address), a 2x3 by 3x2 tile matmul accumulated in DST (both
  transpose settings), and a tilize -> pack_untilize round trip of row-major data, bf16 and f32, plus their rule cases.
* All kernels through ``shared/tools/tt-kernel-check --werror`` (real 0.81.1 headers), when the
  tool is present, to keep the spellings honest.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.ttmetal_model import build as model_build
from tests.ttmetal_runner import CHECKER

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


@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_kernels_and_hosts_use_the_precompiled_standard_headers(tmp_path):
    """build.precompiled's headers are valid for the flags kernels and host programs are compiled
    with: g++ -H marks a precompiled header it uses with '!' (one it cannot use is parsed as text,
    silently slower)."""
    host_defines = [f'-D{name}=""' for name in ("OPGEN_TT_MODEL_DIR", "OPGEN_TT_CXX", "OPGEN_TT_KERNEL_CACHE",
                                                "OPGEN_TT_MODEL_HASH", "OPGEN_TT_KERNEL_FLAGS", "OPGEN_TT_KERNEL_PCH")]
    cases = (("model_std.h", model_build.KERNEL_FLAGS, "api/dataflow/dataflow_api.h",
              ["-DKERNEL_COMPILE_TIME_ARGS=2,64"]),
             ("host_std.h", model_build.FLAGS, "tt-metalium/host_api.hpp", host_defines))
    for header, flags, includes, defines in cases:
        pch = model_build.precompiled(header, flags)
        assert pch, f"{header} did not precompile"
        src = tmp_path / f"{header}.cpp"
        src.write_text(f'#include "{includes}"\n')
        r = subprocess.run([model_build.cxx(), *flags, *defines, "-include", pch, "-H", "-Winvalid-pch",
                            f"-I{model_build.HERE}", "-fsyntax-only", str(src)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        assert r.stderr.splitlines()[0] == f"! {pch}.gch", r.stderr[:2000]


def test_kernels_pass_the_real_header_check(tmp_path):
    """The hand-written kernels compile clean against the real 0.81.1 headers (installs itself on first use)."""
    f32 = ("--fp32-dest-acc", "--default-format", "Float32", "--cb-format", "2=Float16_b")
    src = {"reader.cpp": (READER, "reader", "2,2048,2,2048"), "writer.cpp": (WRITER, "writer", "2,2048,2,2048"),
           "compute.cpp": (COMPUTE, "compute", "3,1056964608"),
           "rms_reader.cpp": (RMS_READER, "reader", "2,2048,2,2048"),
           "rms_writer.cpp": (RMS_WRITER, "writer", "2,2048,2,2048,2,2048,2,2048"),
           "rms_compute.cpp": (RMS_COMPUTE, "compute", "3,1009429163,1015021568"),
           "rms_compute_f32.cpp": (RMS_COMPUTE, "compute", "3,1009429163,1015021568", *f32),
           "bx_reader.cpp": (BX_READER, "reader", "2,2048,2,2048"),
           "bx_writer.cpp": (BX_WRITER, "writer", "2,2048,2,2048,2,2048"),
           "bx_compute.cpp": (BX_COMPUTE, "compute", "0"),
           "bx_compute_f32.cpp": (BX_COMPUTE, "compute", "0", "--fp32-dest-acc", "--default-format", "Float32"),
           "gen_reader.cpp": (GEN_READER, "reader", "2,2048,2,2048"),
           "gen_writer.cpp": (GEN_WRITER, "writer", "2,2048,2,2048"),
           "rs_reader.cpp": (RS_READER, "reader", "2,2048,2,128,2,2048"),
           "rs_compute.cpp": (RS_COMPUTE, "compute", "2"),
           "rs_compute_f32.cpp": (RS_COMPUTE, "compute", "2", "--fp32-dest-acc", "--default-format", "Float32"),
           "mm_compute.cpp": (MM_COMPUTE, "compute", "0"),
           "mm_compute_f32.cpp": (MM_COMPUTE, "compute", "0", "--fp32-dest-acc", "--default-format", "Float32"),
           "tz_compute.cpp": (TZ_COMPUTE, "compute", "0"),
           "tz_compute_f32.cpp": (TZ_COMPUTE, "compute", "0", "--fp32-dest-acc", "--default-format", "Float32")}
    inst = subprocess.run([str(CHECKER), "--install"], capture_output=True, text=True, timeout=600)
    if inst.returncode != 0:
        pytest.skip(f"tt-kernel-check --install failed: {inst.stdout[-400:]}{inst.stderr[-400:]}")

    def check(item):
        name, (text, role, ct, *extra) = item
        p = tmp_path / name
        p.write_text(text)
        return name, subprocess.run([str(CHECKER), "--role", role, "--ct-args", ct, *extra, "--werror", str(p)],
                                    capture_output=True, text=True, timeout=300)

    with ThreadPoolExecutor(max_workers=3) as ex:
        for name, r in ex.map(check, src.items()):
            assert r.returncode == 0, f"{name}:\n{r.stdout}{r.stderr}"


# ---- a second program: RMSNorm-like blocks, column sums, copy_tile + SFPU binary/fill/recip, on 1..4 cores ----

RMS_READER = r"""
// reader: w (Wt tiles) -> c_1 once, a bf16 scaler tile (1.0 in row 0 of each face) -> c_2 once,
// then per block of this core: the block's Wt x tiles -> c_0
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

void kernel_main() {
    const uint32_t x_addr = get_arg_val<uint32_t>(0);
    const uint32_t w_addr = get_arg_val<uint32_t>(1);
    const uint32_t first_block = get_arg_val<uint32_t>(2);
    const uint32_t n_blocks = get_arg_val<uint32_t>(3);
    const uint32_t Wt = get_arg_val<uint32_t>(4);
    constexpr uint32_t cb_x = tt::CBIndex::c_0, cb_w = tt::CBIndex::c_1, cb_one = tt::CBIndex::c_2;
    constexpr auto x_args = TensorAccessorArgs<0>();
    constexpr auto w_args = TensorAccessorArgs<x_args.next_compile_time_args_offset()>();
    const uint32_t tile = get_tile_size(cb_x);
    const auto x = TensorAccessor(x_args, x_addr, tile);
    const auto w = TensorAccessor(w_args, w_addr, get_tile_size(cb_w));

    cb_reserve_back(cb_one, 1);
    volatile tt_l1_ptr uint32_t* one = reinterpret_cast<volatile tt_l1_ptr uint32_t*>(get_write_ptr(cb_one));
    for (uint32_t i = 0; i < 512; ++i) one[i] = 0;
    for (uint32_t f = 0; f < 4; ++f)
        for (uint32_t k = 0; k < 8; ++k) one[f * 128 + k] = 0x3f803f80u;
    cb_push_back(cb_one, 1);

    cb_reserve_back(cb_w, Wt);
    for (uint32_t t = 0; t < Wt; ++t) noc_async_read_page(t, w, get_write_ptr(cb_w) + t * tile);
    noc_async_read_barrier();
    cb_push_back(cb_w, Wt);

    for (uint32_t b = 0; b < n_blocks; ++b) {
        cb_reserve_back(cb_x, Wt);
        const uint32_t l1 = get_write_ptr(cb_x);
        for (uint32_t t = 0; t < Wt; ++t) noc_async_read_page((first_block + b) * Wt + t, x, l1 + t * tile);
        noc_async_read_barrier();
        cb_push_back(cb_x, Wt);
    }
}
"""

RMS_COMPUTE = r"""
// compute, per 32-row block of x (Wt tiles):
//   rstd = rsqrt(rowsum(x*x) * inv_d + eps)       (mul_tiles, reduce ROW, mul/add_unary, rsqrt) -> c_17
//   y    = (x * rstd[bcast cols]) * w[bcast rows] (w: row 0 of its Wt tiles)                   -> c_16
//   cs   = column sums of each x tile             (reduce COL)                                 -> c_18
//   e    = (x - w) * recip(x*x + 1)               (copy_tile, SFPU binary, fill, recip)        -> c_19
#include <cstdint>
#include "api/compute/common.h"
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/tile_move_copy.h"
#include "api/compute/eltwise_binary.h"
#include "api/compute/eltwise_binary_sfpu.h"
#include "api/compute/bcast.h"
#include "api/compute/reduce.h"
#include "api/compute/eltwise_unary/eltwise_unary.h"
#include "api/compute/eltwise_unary/rsqrt.h"
#include "api/compute/eltwise_unary/recip.h"
#include "api/compute/eltwise_unary/fill.h"
#include "api/compute/eltwise_unary/binop_with_scalar.h"
#include "api/compute/reconfig_data_format.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"

void kernel_main() {
    constexpr uint32_t Wt = get_compile_time_arg_val(0);
    constexpr uint32_t inv_d_bits = get_compile_time_arg_val(1);
    constexpr uint32_t eps_bits = get_compile_time_arg_val(2);
    const uint32_t n_blocks = get_arg_val<uint32_t>(0);
    constexpr uint32_t cb_x = tt::CBIndex::c_0, cb_w = tt::CBIndex::c_1, cb_one = tt::CBIndex::c_2;
    constexpr uint32_t cb_y = tt::CBIndex::c_16, cb_rstd_out = tt::CBIndex::c_17, cb_cs = tt::CBIndex::c_18;
    constexpr uint32_t cb_e = tt::CBIndex::c_19;
    constexpr uint32_t cb_xx = tt::CBIndex::c_24, cb_rstd = tt::CBIndex::c_25, cb_xr = tt::CBIndex::c_26;

    compute_kernel_hw_startup(cb_x, cb_x, cb_y);
    cb_wait_front(cb_one, 1);
    cb_wait_front(cb_w, Wt);
    for (uint32_t b = 0; b < n_blocks; ++b) {
        cb_wait_front(cb_x, Wt);

        // x*x -> cb_xx (Wt tiles)
        reconfig_data_format(cb_x, cb_x);
        mul_init(cb_x, cb_x);
        cb_reserve_back(cb_xx, Wt);
        for (uint32_t t = 0; t < Wt; ++t) {
            tile_regs_acquire();
            mul_tiles(cb_x, cb_x, t, t, 0);
            tile_regs_commit();
            tile_regs_wait();
            pack_tile(0, cb_xx);
            tile_regs_release();
        }
        cb_push_back(cb_xx, Wt);

        // rstd = rsqrt(mean(x*x) + eps), column 0 valid
        cb_wait_front(cb_xx, Wt);
        reconfig_data_format(cb_one, cb_xx);
        reduce_init<PoolType::SUM, ReduceDim::REDUCE_ROW>(cb_xx, cb_one, cb_rstd);
        tile_regs_acquire();
        for (uint32_t t = 0; t < Wt; ++t) reduce_tile<PoolType::SUM, ReduceDim::REDUCE_ROW>(cb_xx, cb_one, t, 0, 0);
        binop_with_scalar_tile_init();
        mul_unary_tile(0, inv_d_bits);
        add_unary_tile(0, eps_bits);
        rsqrt_tile_init();
        rsqrt_tile(0);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_rstd, 1);
        pack_tile(0, cb_rstd);
        cb_push_back(cb_rstd, 1);
        cb_reserve_back(cb_rstd_out, 1);
        pack_tile(0, cb_rstd_out);
        cb_push_back(cb_rstd_out, 1);
        tile_regs_release();
        reduce_uninit();
        cb_pop_front(cb_xx, Wt);

        // y = (x * rstd) * w
        cb_wait_front(cb_rstd, 1);
        for (uint32_t t = 0; t < Wt; ++t) {
            reconfig_data_format(cb_x, cb_rstd);
            mul_bcast_cols_init(cb_x, cb_rstd);
            tile_regs_acquire();
            mul_tiles_bcast_cols(cb_x, cb_rstd, t, 0, 0);
            tile_regs_commit();
            tile_regs_wait();
            cb_reserve_back(cb_xr, 1);
            pack_tile(0, cb_xr);
            cb_push_back(cb_xr, 1);
            tile_regs_release();

            cb_wait_front(cb_xr, 1);
            reconfig_data_format(cb_xr, cb_w);
            mul_bcast_rows_init(cb_xr, cb_w);
            tile_regs_acquire();
            mul_tiles_bcast_rows(cb_xr, cb_w, 0, t, 0);
            tile_regs_commit();
            tile_regs_wait();
            cb_reserve_back(cb_y, 1);
            pack_tile(0, cb_y);
            cb_push_back(cb_y, 1);
            tile_regs_release();
            cb_pop_front(cb_xr, 1);
        }
        cb_pop_front(cb_rstd, 1);

        // column sums of each x tile, row 0 valid
        reconfig_data_format(cb_x, cb_one);
        reduce_init<PoolType::SUM, ReduceDim::REDUCE_COL>(cb_x, cb_one, cb_cs);
        for (uint32_t t = 0; t < Wt; ++t) {
            tile_regs_acquire();
            reduce_tile<PoolType::SUM, ReduceDim::REDUCE_COL>(cb_x, cb_one, t, 0, 0);
            tile_regs_commit();
            tile_regs_wait();
            cb_reserve_back(cb_cs, 1);
            pack_tile(0, cb_cs);
            cb_push_back(cb_cs, 1);
            tile_regs_release();
        }
        reduce_uninit();

        // e = (x - w) * recip(x*x + 1), all in DST
        for (uint32_t t = 0; t < Wt; ++t) {
            tile_regs_acquire();
            copy_init(cb_x);
            copy_tile(cb_x, t, 0);
            copy_init(cb_w);
            copy_tile(cb_w, t, 1);
            mul_binary_tile_init();
            mul_binary_tile(0, 0, 2);
            fill_tile_init();
            fill_tile(3, 1.0f);
            add_binary_tile_init();
            add_binary_tile(2, 3, 2);
            recip_tile_init();
            recip_tile(2);
            sub_binary_tile_init();
            sub_binary_tile(0, 1, 0);
            mul_binary_tile_init();
            mul_binary_tile(0, 2, 0);
            tile_regs_commit();
            tile_regs_wait();
            cb_reserve_back(cb_e, 1);
            pack_tile(0, cb_e);
            cb_push_back(cb_e, 1);
            tile_regs_release();
        }
        cb_pop_front(cb_x, Wt);
    }
    cb_pop_front(cb_w, Wt);
    cb_pop_front(cb_one, 1);
}
"""

RMS_WRITER = r"""
// writer, per block g of this core: rstd page g, y / cs / e pages g*Wt + t
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

void kernel_main() {
    const uint32_t y_addr = get_arg_val<uint32_t>(0);
    const uint32_t rstd_addr = get_arg_val<uint32_t>(1);
    const uint32_t cs_addr = get_arg_val<uint32_t>(2);
    const uint32_t e_addr = get_arg_val<uint32_t>(3);
    const uint32_t first_block = get_arg_val<uint32_t>(4);
    const uint32_t n_blocks = get_arg_val<uint32_t>(5);
    const uint32_t Wt = get_arg_val<uint32_t>(6);
    constexpr uint32_t cb_y = tt::CBIndex::c_16, cb_rstd = tt::CBIndex::c_17, cb_cs = tt::CBIndex::c_18;
    constexpr uint32_t cb_e = tt::CBIndex::c_19;
    constexpr auto y_args = TensorAccessorArgs<0>();
    constexpr auto rstd_args = TensorAccessorArgs<y_args.next_compile_time_args_offset()>();
    constexpr auto cs_args = TensorAccessorArgs<rstd_args.next_compile_time_args_offset()>();
    constexpr auto e_args = TensorAccessorArgs<cs_args.next_compile_time_args_offset()>();
    const uint32_t tile = get_tile_size(cb_y);
    const auto y = TensorAccessor(y_args, y_addr, tile);
    const auto rstd = TensorAccessor(rstd_args, rstd_addr, tile);
    const auto cs = TensorAccessor(cs_args, cs_addr, tile);
    const auto e = TensorAccessor(e_args, e_addr, tile);
    for (uint32_t b = 0; b < n_blocks; ++b) {
        const uint32_t g = first_block + b;
        cb_wait_front(cb_rstd, 1);
        noc_async_write_page(g, rstd, get_read_ptr(cb_rstd));
        noc_async_writes_flushed();
        cb_pop_front(cb_rstd, 1);
        for (uint32_t t = 0; t < Wt; ++t) {
            cb_wait_front(cb_y, 1);
            noc_async_write_page(g * Wt + t, y, get_read_ptr(cb_y));
            noc_async_writes_flushed();
            cb_pop_front(cb_y, 1);
        }
        for (uint32_t t = 0; t < Wt; ++t) {
            cb_wait_front(cb_cs, 1);
            noc_async_write_page(g * Wt + t, cs, get_read_ptr(cb_cs));
            noc_async_writes_flushed();
            cb_pop_front(cb_cs, 1);
        }
        for (uint32_t t = 0; t < Wt; ++t) {
            cb_wait_front(cb_e, 1);
            noc_async_write_page(g * Wt + t, e, get_read_ptr(cb_e));
            noc_async_writes_flushed();
            cb_pop_front(cb_e, 1);
        }
    }
    noc_async_write_barrier();
}
"""

RMS_HOST = r"""
// host: argv = kernel_dir f32(0|1) n_blocks Wt n_cores in.bin out.bin
// in = x (n_blocks*Wt tiles, block-major) then w (Wt tiles); out = y, rstd (n_blocks tiles), cs, e
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <tt-metalium/host_api.hpp>

using namespace tt::tt_metal;

int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage\n"); return 2; }
    const std::string dir = argv[1];
    const bool f32 = atoi(argv[2]) != 0;
    const uint32_t nb = (uint32_t)atoi(argv[3]), Wt = (uint32_t)atoi(argv[4]), ncores = (uint32_t)atoi(argv[5]);
    const tt::DataFormat fmt = f32 ? tt::DataFormat::Float32 : tt::DataFormat::Float16_b;
    const uint32_t page = f32 ? 4096 : 2048;
    const uint32_t nx = nb * Wt;
    std::vector<uint8_t> in((nx + Wt) * page);
    FILE *fi = fopen(argv[6], "rb");
    if (!fi || fread(in.data(), 1, in.size(), fi) != in.size()) { fprintf(stderr, "bad input\n"); return 2; }
    fclose(fi);
    uint32_t x = ttmodel::dram_alloc(nx * page), w = ttmodel::dram_alloc(Wt * page);
    uint32_t y = ttmodel::dram_alloc(nx * page), rstd = ttmodel::dram_alloc(nb * page);
    uint32_t cs = ttmodel::dram_alloc(nx * page), e = ttmodel::dram_alloc(nx * page);
    memcpy(ttmodel::dram_ptr(x), in.data(), nx * page);
    memcpy(ttmodel::dram_ptr(w), in.data() + nx * page, Wt * page);

    Program program = CreateProgram();
    CoreRange cores(CoreCoord{0, 0}, CoreCoord{ncores - 1, 0});
    auto cb = [&](uint8_t idx, uint32_t pages, tt::DataFormat f, uint32_t pg) {
        CreateCircularBuffer(program, cores, CircularBufferConfig(pages * pg, {{idx, f}}).set_page_size(idx, pg));
    };
    cb(tt::CBIndex::c_0, 2 * Wt, fmt, page);
    cb(tt::CBIndex::c_1, Wt, fmt, page);
    cb(tt::CBIndex::c_2, 1, tt::DataFormat::Float16_b, 2048);
    cb(tt::CBIndex::c_16, 2, fmt, page);
    cb(tt::CBIndex::c_17, 1, fmt, page);
    cb(tt::CBIndex::c_18, 2, fmt, page);
    cb(tt::CBIndex::c_19, 2, fmt, page);
    cb(tt::CBIndex::c_24, Wt, fmt, page);
    cb(tt::CBIndex::c_25, 1, fmt, page);
    cb(tt::CBIndex::c_26, 1, fmt, page);
    std::vector<uint32_t> rct{2, page, 2, page}, wct{2, page, 2, page, 2, page, 2, page};
    auto reader = CreateKernel(program, dir + "/rms_reader.cpp", cores, ReaderDataMovementConfig(rct));
    auto writer = CreateKernel(program, dir + "/rms_writer.cpp", cores, WriterDataMovementConfig(wct));
    float inv_d = 1.0f / (32.0f * Wt), eps = 1.0f / 64;
    uint32_t inv_d_bits, eps_bits;
    memcpy(&inv_d_bits, &inv_d, 4);
    memcpy(&eps_bits, &eps, 4);
    auto compute = CreateKernel(program, dir + "/rms_compute.cpp", cores,
                                ComputeConfig{.fp32_dest_acc_en = f32, .compile_args = {Wt, inv_d_bits, eps_bits}});
    // blocks split over the cores: the first nb % ncores cores take one more
    for (uint32_t c = 0, first = 0; c < ncores; ++c) {
        const uint32_t n = nb / ncores + (c < nb % ncores ? 1 : 0);
        CoreCoord core{c, 0};
        SetRuntimeArgs(program, reader, core, {x, w, first, n, Wt});
        SetRuntimeArgs(program, compute, core, {n});
        SetRuntimeArgs(program, writer, core, {y, rstd, cs, e, first, n, Wt});
        first += n;
    }
    ttmodel::run(program);

    FILE *fo = fopen(argv[7], "wb");
    fwrite(ttmodel::dram_ptr(y), 1, nx * page, fo);
    fwrite(ttmodel::dram_ptr(rstd), 1, nb * page, fo);
    fwrite(ttmodel::dram_ptr(cs), 1, nx * page, fo);
    fwrite(ttmodel::dram_ptr(e), 1, nx * page, fo);
    fclose(fo);
    return 0;
}
"""

RMS_NB, RMS_WT = 5, 3  # 5 blocks of 32 rows, D = 96


def to_tiles(a: np.ndarray) -> np.ndarray:
    """(32*nb, 32*Wt) -> nb*Wt tiles (block-major), each in the face layout, flattened."""
    nb, wt = a.shape[0] // 32, a.shape[1] // 32
    return tilize(a.reshape(nb, 32, wt, 32).transpose(0, 2, 1, 3).reshape(nb * wt * 32, 32))


def from_tiles(t: np.ndarray, nb: int, wt: int) -> np.ndarray:
    return untilize(t, nb * wt).reshape(nb, wt, 32, 32).transpose(0, 2, 1, 3).reshape(32 * nb, 32 * wt)


@pytest.fixture(scope="module")
def rms_host():
    OUT.mkdir(parents=True, exist_ok=True)
    return model_build.build_host({"rms_host.cpp": RMS_HOST, "rms_reader.cpp": RMS_READER,
                                   "rms_compute.cpp": RMS_COMPUTE, "rms_writer.cpp": RMS_WRITER}, OUT,
                                  exe_name="rms_host")


def rms_inputs():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((32 * RMS_NB, 32 * RMS_WT)).astype(np.float32)
    w = rng.standard_normal((32, 32 * RMS_WT)).astype(np.float32)  # bcast_rows reads row 0 only
    return x, w


def rms_run(host: Path, *, f32: bool, cores: int, tmp: Path) -> bytes:
    dt = np.float32 if f32 else BF16
    x, w = rms_inputs()
    inp, out = tmp / f"rms_in{int(f32)}_{cores}.bin", tmp / f"rms_out{int(f32)}_{cores}.bin"
    np.concatenate([to_tiles(x.astype(dt)), to_tiles(w.astype(dt))]).tofile(inp)
    r = subprocess.run([str(host), str(OUT / "src"), str(int(f32)), str(RMS_NB), str(RMS_WT), str(cores), str(inp),
                        str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_rmsnorm_bcast_colsum_sfpu(rms_host, tmp_path, f32):
    """rsqrt, mul/add_unary, bcast cols/rows, REDUCE_COL, copy_tile, fill, recip, SFPU binary vs numpy (float64)."""
    nb, wt = RMS_NB, RMS_WT
    dt = np.float32 if f32 else BF16
    out = np.frombuffer(rms_run(rms_host, f32=f32, cores=1, tmp=tmp_path), dtype=dt).astype(np.float64)
    n = nb * wt * 1024
    y = from_tiles(out[:n], nb, wt)
    rstd = untilize(out[n:n + nb * 1024], nb)
    cs = from_tiles(out[n + nb * 1024:2 * n + nb * 1024], nb, wt)
    e = from_tiles(out[2 * n + nb * 1024:], nb, wt)
    x, w = (a.astype(dt).astype(np.float64) for a in rms_inputs())
    d, eps = 32 * wt, 1.0 / 64
    # f32: FPU operands are TF32 (10 mantissa bits); bf16: DST and the CBs round to bf16 after each step
    tol = 4e-3 if f32 else 3e-2

    ref_rstd = 1.0 / np.sqrt((x * x).mean(axis=1) + eps)  # per row
    np.testing.assert_allclose(rstd[:, 0], ref_rstd, rtol=tol, atol=tol)
    assert not rstd[:, 1:].any(), "the reduce-row result is packed with the edge mask (column 0 only)"
    np.testing.assert_allclose(y, x * ref_rstd[:, None] * w[0][None, :], rtol=tol, atol=tol)

    ref_cs = x.reshape(nb, 32, d).sum(axis=1)  # (nb, d): per block, per column
    cs_rows = cs.reshape(nb, 32, d)
    np.testing.assert_allclose(cs_rows[:, 0], ref_cs, rtol=tol, atol=2e-2 if f32 else 1e-1)
    assert not cs_rows[:, 1:].any(), "the reduce-col result is packed with the edge mask (row 0 only)"

    wfull = np.tile(w, (nb, 1))
    np.testing.assert_allclose(e, (x - wfull) / (x * x + 1.0), rtol=tol, atol=tol)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_multicore_matches_single_core(rms_host, tmp_path, f32):
    """The same program on 2, 3 and 4 cores (blocks split by RT args, uneven) gives the 1-core bytes exactly."""
    with ThreadPoolExecutor(max_workers=4) as ex:
        outs = dict(ex.map(lambda c: (c, rms_run(rms_host, f32=f32, cores=c, tmp=tmp_path)), [1, 2, 3, 4]))
    for c in (2, 3, 4):
        assert outs[c] == outs[1], f"{c} cores differ from 1 core"


# ---- a third program: unary_bcast ROW/COL/SCALAR, mask_tile, exp_tile on the distributed host API ----

BX_READER = r"""
// reader: tiles [first, first + n) of a (the mask) -> c_0 and of b -> c_1
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

void kernel_main() {
    const uint32_t a_addr = get_arg_val<uint32_t>(0);
    const uint32_t b_addr = get_arg_val<uint32_t>(1);
    const uint32_t first = get_arg_val<uint32_t>(2);
    const uint32_t n = get_arg_val<uint32_t>(3);
    constexpr uint32_t cb_a = tt::CBIndex::c_0, cb_b = tt::CBIndex::c_1;
    constexpr auto a_args = TensorAccessorArgs<0>();
    constexpr auto b_args = TensorAccessorArgs<a_args.next_compile_time_args_offset()>();
    const auto a = TensorAccessor(a_args, a_addr, get_tile_size(cb_a));
    const auto b = TensorAccessor(b_args, b_addr, get_tile_size(cb_b));
    for (uint32_t t = first; t < first + n; ++t) {
        cb_reserve_back(cb_a, 1);
        cb_reserve_back(cb_b, 1);
        noc_async_read_page(t, a, get_write_ptr(cb_a));
        noc_async_read_page(t, b, get_write_ptr(cb_b));
        noc_async_read_barrier();
        cb_push_back(cb_a, 1);
        cb_push_back(cb_b, 1);
    }
}
"""

BX_COMPUTE = r"""
// compute, per tile: o0 = exp(b's row 0 down all rows)        (unary_bcast<ROW>, exp_tile)
//                    o1 = (b's column 0 across) where a != 0   (unary_bcast<COL>, copy_tile a -> DST[1], mask_tile)
//                    o2 = b[0][0] everywhere                   (unary_bcast<SCALAR>, unary_bcast_uninit)
#include <cstdint>
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/bcast.h"
#include "api/compute/tile_move_copy.h"
#include "api/compute/mask.h"
#include "api/compute/eltwise_unary/exp.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"
#include "api/compute/reconfig_data_format.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    const uint32_t n = get_arg_val<uint32_t>(0);
    constexpr uint32_t cb_a = tt::CBIndex::c_0, cb_b = tt::CBIndex::c_1;
    constexpr uint32_t cb_o0 = tt::CBIndex::c_16, cb_o1 = tt::CBIndex::c_17, cb_o2 = tt::CBIndex::c_18;
    compute_kernel_hw_startup(cb_b, cb_o0);
    for (uint32_t t = 0; t < n; ++t) {
        cb_wait_front(cb_a, 1);
        cb_wait_front(cb_b, 1);

        tile_regs_acquire();
        reconfig_data_format_srca(cb_b);
        unary_bcast_init<BroadcastType::ROW>(cb_b);
        unary_bcast<BroadcastType::ROW>(cb_b, 0, 0);
        exp_tile_init();
        exp_tile(0);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_o0, 1);
        pack_reconfig_data_format(cb_o0);
        pack_tile(0, cb_o0);
        cb_push_back(cb_o0, 1);
        tile_regs_release();

        tile_regs_acquire();
#if RULE != 1
        unary_bcast_init<BroadcastType::COL>(cb_b);
#endif
        unary_bcast<BroadcastType::COL>(cb_b, 0, 0);
        reconfig_data_format_srca(cb_b, cb_a);
        copy_init(cb_a);
        copy_tile(cb_a, 0, 1);
        mask_tile_init();
#if RULE == 2
        mask_tile(0, 2);
#else
        mask_tile(0, 1);
#endif
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_o1, 1);
        pack_tile(0, cb_o1);
        cb_push_back(cb_o1, 1);
        tile_regs_release();

        tile_regs_acquire();
#if RULE == 3
        unary_bcast_init<BroadcastType::SCALAR>(cb_a);
#else
        reconfig_data_format_srca(cb_a, cb_b);
        unary_bcast_init<BroadcastType::SCALAR>(cb_b);
#endif
        unary_bcast<BroadcastType::SCALAR>(cb_b, 0, 0);
        unary_bcast_uninit<BroadcastType::SCALAR>(cb_b);
        tile_regs_commit();
        tile_regs_wait();
        cb_reserve_back(cb_o2, 1);
        pack_tile(0, cb_o2);
        cb_push_back(cb_o2, 1);
        tile_regs_release();

        cb_pop_front(cb_a, 1);
        cb_pop_front(cb_b, 1);
    }
}
"""

BX_WRITER = r"""
// writer: c_16, c_17, c_18 -> tiles [first, first + n) of o0, o1, o2
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

void kernel_main() {
    const uint32_t o0_addr = get_arg_val<uint32_t>(0);
    const uint32_t o1_addr = get_arg_val<uint32_t>(1);
    const uint32_t o2_addr = get_arg_val<uint32_t>(2);
    const uint32_t first = get_arg_val<uint32_t>(3);
    const uint32_t n = get_arg_val<uint32_t>(4);
    constexpr uint32_t cb_o0 = tt::CBIndex::c_16, cb_o1 = tt::CBIndex::c_17, cb_o2 = tt::CBIndex::c_18;
    constexpr auto o0_args = TensorAccessorArgs<0>();
    constexpr auto o1_args = TensorAccessorArgs<o0_args.next_compile_time_args_offset()>();
    constexpr auto o2_args = TensorAccessorArgs<o1_args.next_compile_time_args_offset()>();
    const auto o0 = TensorAccessor(o0_args, o0_addr, get_tile_size(cb_o0));
    const auto o1 = TensorAccessor(o1_args, o1_addr, get_tile_size(cb_o1));
    const auto o2 = TensorAccessor(o2_args, o2_addr, get_tile_size(cb_o2));
    for (uint32_t t = first; t < first + n; ++t) {
        cb_wait_front(cb_o0, 1);
        noc_async_write_page(t, o0, get_read_ptr(cb_o0));
        cb_wait_front(cb_o1, 1);
        noc_async_write_page(t, o1, get_read_ptr(cb_o1));
        cb_wait_front(cb_o2, 1);
        noc_async_write_page(t, o2, get_read_ptr(cb_o2));
        noc_async_writes_flushed();
        cb_pop_front(cb_o0, 1);
        cb_pop_front(cb_o1, 1);
        cb_pop_front(cb_o2, 1);
    }
    noc_async_write_barrier();
}
"""

BX_HOST = r"""
// host: argv = kernel_dir f32(0|1) n_tiles rule in.bin out.bin; in = a (mask) tiles then b tiles; out = o0, o1, o2.
// Then a page-layout check of MeshBuffer with a page size that is not a multiple of the DRAM alignment.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <tt-metalium/host_api.hpp>
#include <tt-metalium/distributed.hpp>
#include <tt-metalium/tensor_accessor_args.hpp>
#include <tt-metalium/work_split.hpp>

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

    auto mesh_device = distributed::MeshDevice::create_unit_mesh(0);
    distributed::MeshCommandQueue &cq = mesh_device->mesh_command_queue();
    distributed::DeviceLocalBufferConfig dram{.page_size = page, .buffer_type = BufferType::DRAM};
    distributed::ReplicatedBufferConfig size{.size = n * page};
    auto a = distributed::MeshBuffer::create(size, dram, mesh_device.get());
    auto b = distributed::MeshBuffer::create(size, dram, mesh_device.get());
    std::vector<std::shared_ptr<distributed::MeshBuffer>> o;
    for (int i = 0; i < 3; ++i) o.push_back(distributed::MeshBuffer::create(size, dram, mesh_device.get()));
    std::vector<uint8_t> a_host(in.begin(), in.begin() + n * page), b_host(in.begin() + n * page, in.end());
    if (rule == 9) a_host.pop_back();  // one byte short: a model error
    distributed::EnqueueWriteMeshBuffer(cq, a, a_host, false);
    distributed::EnqueueWriteMeshBuffer(cq, b, b_host, false);

    auto [num_cores, all, g1, g2, n1, n2] = split_work_to_cores(mesh_device->compute_with_storage_grid_size(), n);
    Program program = CreateProgram();
    auto cb = [&](uint8_t idx) {
        CreateCircularBuffer(program, all, CircularBufferConfig(2 * page, {{idx, fmt}}).set_page_size(idx, page));
    };
    for (uint8_t idx : {tt::CBIndex::c_0, tt::CBIndex::c_1, tt::CBIndex::c_16, tt::CBIndex::c_17, tt::CBIndex::c_18})
        cb(idx);
    std::vector<uint32_t> rct, wct;
    TensorAccessorArgs(a).append_to(rct);
    TensorAccessorArgs(*b).append_to(rct);
    TensorAccessorArgs(o[0]).append_to(wct);
    TensorAccessorArgs(o[1].get()).append_to(wct);
    TensorAccessorArgs(*o[2]).append_to(wct);
    std::map<std::string, std::string> defs;
    if (rule >= 1 && rule <= 3) defs["RULE"] = std::to_string(rule);
    auto reader = CreateKernel(program, dir + "/bx_reader.cpp", all, ReaderDataMovementConfig(rct));
    auto writer = CreateKernel(program, dir + "/bx_writer.cpp", all, WriterDataMovementConfig(wct));
    auto compute = CreateKernel(program, dir + "/bx_compute.cpp", all,
                                ComputeConfig{.fp32_dest_acc_en = f32, .defines = defs});
    uint32_t first = 0;
    for (const CoreCoord &core : corerange_to_cores(all)) {
        bool in_g1 = false;
        for (const CoreCoord &c : corerange_to_cores(g1)) in_g1 |= c == core;
        const uint32_t k = in_g1 ? n1 : n2;
        SetRuntimeArgs(program, reader, core, {(uint32_t)a->address(), (uint32_t)b->address(), first, k});
        SetRuntimeArgs(program, compute, core, {k});
        SetRuntimeArgs(program, writer, core,
                       {(uint32_t)o[0]->address(), (uint32_t)o[1]->address(), (uint32_t)o[2]->address(), first, k});
        first += k;
    }
    if (first != n || num_cores != all.num_cores() || g1.num_cores() + g2.num_cores() != num_cores) {
        fprintf(stderr, "split_work_to_cores: inconsistent split\n");
        return 3;
    }
    printf("split %u cores: %u x %u tiles + %u x %u tiles\n", num_cores, g1.num_cores(), n1, g2.num_cores(), n2);
    distributed::MeshWorkload workload;
    workload.add_program(distributed::MeshCoordinateRange(mesh_device->shape()), std::move(program));
    distributed::EnqueueMeshWorkload(cq, workload, false);
    distributed::Finish(cq);

    FILE *fo = fopen(argv[6], "wb");
    for (auto &buf : o) {
        std::vector<uint32_t> host;
        distributed::EnqueueReadMeshBuffer(cq, host, buf, true);
        fwrite(host.data(), 4, host.size(), fo);
    }
    fclose(fo);

    // pages of 48 B lie 64 B apart (Wormhole DRAM alignment 32 B); the host sees them densely
    distributed::DeviceLocalBufferConfig odd{.page_size = 48, .buffer_type = BufferType::DRAM};
    auto c = distributed::MeshBuffer::create(distributed::ReplicatedBufferConfig{.size = 5 * 48}, odd,
                                             mesh_device.get());
    std::vector<uint16_t> src(5 * 24), back;
    for (size_t i = 0; i < src.size(); ++i) src[i] = (uint16_t)(1000 + i);
    distributed::EnqueueWriteMeshBuffer(cq, c, src, true);
    distributed::EnqueueReadMeshBuffer(cq, back, c, true);
    std::vector<uint32_t> cct = TensorAccessorArgs(c).get_compile_time_args();
    uint16_t page3;
    memcpy(&page3, ttmodel::dram_ptr((uint32_t)c->address() + 3 * 64), 2);
    if (back != src || cct != std::vector<uint32_t>{2, 64} || page3 != 1000 + 3 * 24 || c->page_size() != 48 ||
        c->size() != 240 || c->address() % 32) {
        fprintf(stderr, "MeshBuffer layout check failed\n");
        return 4;
    }
    if (!mesh_device->close()) return 5;
    return 0;
}
"""


@pytest.fixture(scope="module")
def bx_host():
    OUT.mkdir(parents=True, exist_ok=True)
    return model_build.build_host({"bx_host.cpp": BX_HOST, "bx_reader.cpp": BX_READER, "bx_compute.cpp": BX_COMPUTE,
                                   "bx_writer.cpp": BX_WRITER}, OUT, exe_name="bx_host")


BX_N = 5  # tiles; on a 2x2 grid: one core takes 2 tiles, three take 1


def bx_inputs():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((32 * BX_N, 32)).astype(np.float32)
    a[rng.random(a.shape) < 0.3] = 0.0
    a[rng.random(a.shape) < 0.05] = -0.0
    b = rng.standard_normal((32 * BX_N, 32)).astype(np.float32)
    for t in range(BX_N):  # NaN / inf in column 0 where the whole row of the mask is 0: masked, not multiplied
        a[32 * t + 3], a[32 * t + 20] = 0.0, -0.0
        b[32 * t + 3, 0], b[32 * t + 20, 0] = np.nan, -np.inf
    return a, b


def bx_run(host: Path, *, f32: bool, rule: int, tmp: Path, grid: str = "2x2"):
    dt = np.float32 if f32 else BF16
    a, b = bx_inputs()
    inp, out = tmp / f"bx_in{int(f32)}_{rule}.bin", tmp / f"bx_out{int(f32)}_{rule}.bin"
    np.concatenate([tilize(a.astype(dt)), tilize(b.astype(dt))]).tofile(inp)
    r = subprocess.run([str(host), str(OUT / "src"), str(int(f32)), str(BX_N), str(rule), str(inp), str(out)],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "OPGEN_TT_GRID": grid})
    return r, (np.fromfile(out, dtype=dt) if r.returncode == 0 else None)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_unary_bcast_mask_exp_distributed(bx_host, tmp_path, f32):
    """unary_bcast ROW/COL/SCALAR, exp_tile, mask_tile, on MeshDevice/MeshBuffer/MeshWorkload and
    split_work_to_cores."""
    r, out = bx_run(bx_host, f32=f32, rule=0, tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "split 4 cores: 1 x 2 tiles + 3 x 1 tiles" in r.stdout
    dt = np.float32 if f32 else BF16
    a, b = (v.astype(dt).astype(np.float32) for v in bx_inputs())
    n = BX_N * 1024
    o0, o1, o2 = (untilize(out[i * n:(i + 1) * n].astype(np.float32), BX_N) for i in range(3))
    bt, at = b.reshape(BX_N, 32, 32), a.reshape(BX_N, 32, 32)
    row = np.broadcast_to(bt[:, :1, :], bt.shape)
    col = np.broadcast_to(bt[:, :, :1], bt.shape)
    scalar = np.broadcast_to(bt[:, :1, :1], bt.shape)
    # unary_bcast is exact (bf16 CB -> bf16 DST, f32 CB -> f32 DST by unpack-to-dest); exp is expf, rounded by DST/pack
    ref0 = np.exp(row.astype(np.float64))
    np.testing.assert_allclose(o0.reshape(bt.shape), ref0, rtol=1e-6 if f32 else 8e-3)
    assert np.array_equal(o1.reshape(bt.shape), np.where(at == 0, 0.0, col)), \
        "mask_tile selects (NaN/inf under a 0 mask -> 0)"
    assert not np.isnan(o1).any()
    assert np.array_equal(o2.reshape(bt.shape), scalar)


BX_RULES = {
    1: "rule 5 (init): unary_bcast<COL>(1, ...) needs unary_bcast_init<COL>(1) as the last FPU init "
       "(the last one was unary_bcast_init<ROW>(1))",
    2: "rule 0 (model): mask_tile(0, 2): the hardware reads the mask from DST[1] (idst_data + 1)",
    3: "rule 5 (init): unary_bcast<SCALAR>(1, ...) needs unary_bcast_init<SCALAR>(1) as the last FPU init "
       "(the last one was unary_bcast_init<SCALAR>(0))",
    9: "rule 0 (model): EnqueueWriteMeshBuffer: 10239 elements of 1 B = 10239 B of host data for a MeshBuffer of "
       "10240 B",
}


def test_unary_bcast_mask_distributed_rules(bx_host, tmp_path):
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        results = dict(ex.map(lambda c: (c, bx_run(bx_host, f32=False, rule=c, tmp=tmp_path)[0]), BX_RULES))
    bad = [f"case {c}: rc={results[c].returncode} want {w!r}\n{results[c].stderr[-800:]}"
           for c, w in BX_RULES.items() if results[c].returncode == 0 or w not in results[c].stderr]
    assert not bad, "\n".join(bad)
    line = BX_COMPUTE.split("\n").index("        unary_bcast<BroadcastType::COL>(cb_b, 0, 0);") + 1
    assert re.search(rf"\[core \(\d,\d\) compute kernel bx_compute.cpp:{line}\]", results[1].stderr), results[1].stderr


# ---- a fourth program (``nx_*``): row reshuffle (scatter-add), matmul, tilize / pack_untilize, one core ----

GEN_READER = r"""
// reader: `rounds` rounds; in each, for each of n_streams (1 or 2) streams: chunk pages of the stream's tensor
// (pages round * chunk ...) -> its CB. RT args: rounds, n_streams, then (addr, cb, chunk) per stream.
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

template <typename Accessor>
void read_chunk(const Accessor& acc, uint32_t cb, uint32_t chunk, uint32_t first) {
    cb_reserve_back(cb, chunk);
    const uint32_t l1 = get_write_ptr(cb), page = get_tile_size(cb);
    for (uint32_t i = 0; i < chunk; ++i) noc_async_read_page(first + i, acc, l1 + i * page);
    noc_async_read_barrier();
    cb_push_back(cb, chunk);
}

void kernel_main() {
    const uint32_t rounds = get_arg_val<uint32_t>(0);
    const uint32_t n_streams = get_arg_val<uint32_t>(1);
    const uint32_t cb0 = get_arg_val<uint32_t>(3), chunk0 = get_arg_val<uint32_t>(4);
    const uint32_t cb1 = get_arg_val<uint32_t>(6), chunk1 = get_arg_val<uint32_t>(7);
    constexpr auto args0 = TensorAccessorArgs<0>();
    constexpr auto args1 = TensorAccessorArgs<args0.next_compile_time_args_offset()>();
    const auto s0 = TensorAccessor(args0, get_arg_val<uint32_t>(2), get_tile_size(cb0));
    const auto s1 = TensorAccessor(args1, get_arg_val<uint32_t>(5), get_tile_size(cb1));
    for (uint32_t r = 0; r < rounds; ++r) {
        read_chunk(s0, cb0, chunk0, r * chunk0);
        if (n_streams > 1) read_chunk(s1, cb1, chunk1, r * chunk1);
    }
}
"""

GEN_WRITER = r"""
// writer: `rounds` rounds; in each, for each of n_streams (1 or 2) streams: chunk pages of its CB -> pages
// round * chunk ... of the stream's tensor. RT args as the reader's.
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

template <typename Accessor>
void write_chunk(const Accessor& acc, uint32_t cb, uint32_t chunk, uint32_t first) {
    cb_wait_front(cb, chunk);
    const uint32_t l1 = get_read_ptr(cb), page = get_tile_size(cb);
    for (uint32_t i = 0; i < chunk; ++i) noc_async_write_page(first + i, acc, l1 + i * page);
    noc_async_writes_flushed();
    cb_pop_front(cb, chunk);
}

void kernel_main() {
    const uint32_t rounds = get_arg_val<uint32_t>(0);
    const uint32_t n_streams = get_arg_val<uint32_t>(1);
    const uint32_t cb0 = get_arg_val<uint32_t>(3), chunk0 = get_arg_val<uint32_t>(4);
    const uint32_t cb1 = get_arg_val<uint32_t>(6), chunk1 = get_arg_val<uint32_t>(7);
    constexpr auto args0 = TensorAccessorArgs<0>();
    constexpr auto args1 = TensorAccessorArgs<args0.next_compile_time_args_offset()>();
    const auto s0 = TensorAccessor(args0, get_arg_val<uint32_t>(2), get_tile_size(cb0));
    const auto s1 = TensorAccessor(args1, get_arg_val<uint32_t>(5), get_tile_size(cb1));
    for (uint32_t r = 0; r < rounds; ++r) {
        write_chunk(s0, cb0, chunk0, r * chunk0);
        if (n_streams > 1) write_chunk(s1, cb1, chunk1, r * chunk1);
    }
    noc_async_write_barrier();
}
"""

RS_READER = r"""
// reader of the scatter-add out[idx[i]] += g[i] (the vendor's embedding-backward scheme, own code): the 32 row
// indices -> c_1 (read here), the Wt tiles of g -> c_0, the number of 32-row chunks of `out` that indices hit -> c_25,
// then per chunk: 32 mask bytes (destination row in the chunk, 255 = skip) -> c_24, the chunk's Wt tiles of out -> c_2;
// it also writes the updated chunk (c_16) back.
#include <cstdint>
#include "api/dataflow/dataflow_api.h"

void kernel_main() {
    const uint32_t g_addr = get_arg_val<uint32_t>(0);
    const uint32_t idx_addr = get_arg_val<uint32_t>(1);
    const uint32_t o_addr = get_arg_val<uint32_t>(2);
    const uint32_t Wt = get_arg_val<uint32_t>(3);
    const uint32_t n_rows = get_arg_val<uint32_t>(4);  // rows of out; an index >= n_rows is skipped
    constexpr uint32_t cb_g = tt::CBIndex::c_0, cb_idx = tt::CBIndex::c_1, cb_o = tt::CBIndex::c_2;
    constexpr uint32_t cb_out = tt::CBIndex::c_16, cb_mask = tt::CBIndex::c_24, cb_count = tt::CBIndex::c_25;
    constexpr auto g_args = TensorAccessorArgs<0>();
    constexpr auto i_args = TensorAccessorArgs<g_args.next_compile_time_args_offset()>();
    constexpr auto o_args = TensorAccessorArgs<i_args.next_compile_time_args_offset()>();
    const uint32_t tile = get_tile_size(cb_g);
    const auto g = TensorAccessor(g_args, g_addr, tile);
    const auto ix = TensorAccessor(i_args, idx_addr, get_tile_size(cb_idx));
    const auto o = TensorAccessor(o_args, o_addr, tile);

    cb_reserve_back(cb_idx, 1);
    noc_async_read_page(0, ix, get_write_ptr(cb_idx));
    noc_async_read_barrier();
    cb_push_back(cb_idx, 1);
    cb_wait_front(cb_idx, 1);
    volatile tt_l1_ptr uint32_t* idx = reinterpret_cast<volatile tt_l1_ptr uint32_t*>(get_read_ptr(cb_idx));

    uint32_t chunks[32];
    uint32_t n_chunks = 0;
    for (uint32_t i = 0; i < 32; ++i) {
        if (idx[i] >= n_rows) continue;
        const uint32_t c = idx[i] >> 5;
        bool seen = false;
        for (uint32_t k = 0; k < n_chunks; ++k) seen = seen || chunks[k] == c;
        if (!seen) chunks[n_chunks++] = c;
    }

    cb_reserve_back(cb_g, Wt);
    for (uint32_t t = 0; t < Wt; ++t) noc_async_read_page(t, g, get_write_ptr(cb_g) + t * tile);
    noc_async_read_barrier();
    cb_push_back(cb_g, Wt);

    cb_reserve_back(cb_count, 1);
    reinterpret_cast<volatile tt_l1_ptr uint32_t*>(get_write_ptr(cb_count))[0] = n_chunks;
    cb_push_back(cb_count, 1);

    for (uint32_t k = 0; k < n_chunks; ++k) {
        cb_reserve_back(cb_mask, 1);
        volatile tt_l1_ptr uint8_t* mask = reinterpret_cast<volatile tt_l1_ptr uint8_t*>(get_write_ptr(cb_mask));
        for (uint32_t i = 0; i < 32; ++i)
            mask[i] = (idx[i] < n_rows && (idx[i] >> 5) == chunks[k]) ? static_cast<uint8_t>(idx[i] & 31) : 255;
        cb_push_back(cb_mask, 1);

        cb_reserve_back(cb_o, Wt);
        for (uint32_t t = 0; t < Wt; ++t) noc_async_read_page(chunks[k] * Wt + t, o, get_write_ptr(cb_o) + t * tile);
        noc_async_read_barrier();
        cb_push_back(cb_o, Wt);

        cb_wait_front(cb_out, Wt);
        for (uint32_t t = 0; t < Wt; ++t) noc_async_write_page(chunks[k] * Wt + t, o, get_read_ptr(cb_out) + t * tile);
        noc_async_write_barrier();
        cb_pop_front(cb_out, Wt);
    }
    cb_pop_front(cb_idx, 1);
}
"""

RS_COMPUTE = r"""
// compute of the scatter-add: per chunk and tile, DST[0] = g tile, DST[1] = out tile,
// reshuffle_rows_tile(0, mask address - 16) adds row i of DST[0] into row mask[i] of DST[1]; pack DST[1]
#include <cstdint>
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/tile_move_copy.h"
#include "api/compute/reshuffle.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    constexpr uint32_t Wt = get_compile_time_arg_val(0);
    constexpr uint32_t cb_g = tt::CBIndex::c_0, cb_o = tt::CBIndex::c_2, cb_out = tt::CBIndex::c_16;
    constexpr uint32_t cb_mask = tt::CBIndex::c_24, cb_count = tt::CBIndex::c_25;
    compute_kernel_hw_startup(cb_g, cb_out);
    copy_init(cb_g);
    cb_wait_front(cb_g, Wt);
#if RULE != 2
    cb_wait_front(cb_count, 1);
#endif
    const uint32_t n_chunks = read_tile_value(cb_count, 0, 0);
    for (uint32_t k = 0; k < n_chunks; ++k) {
        cb_wait_front(cb_mask, 1);
        const uint32_t mask_addr = get_tile_address(cb_mask, 0);
        cb_wait_front(cb_o, Wt);
        cb_reserve_back(cb_out, Wt);
        for (uint32_t t = 0; t < Wt; ++t) {
            tile_regs_acquire();
            copy_tile(cb_g, t, 0);
            copy_tile(cb_o, t, 1);
            reshuffle_rows_tile_init();
#if RULE == 1
            reshuffle_rows_tile(0, mask_addr);  // forgets the 16-B header the LLK skips
#else
            reshuffle_rows_tile(0, mask_addr - 16);
#endif
            tile_regs_commit();
            tile_regs_wait();
            pack_tile(1, cb_out);
            tile_regs_release();
        }
        cb_push_back(cb_out, Wt);
        cb_pop_front(cb_o, Wt);
        cb_pop_front(cb_mask, 1);
    }
    cb_pop_front(cb_count, 1);
    cb_pop_front(cb_g, Wt);
}
"""

MM_COMPUTE = r"""
// compute: C (Mt x Nt tiles) = A (Mt x Kt) x B (Kt x Nt), the whole C block accumulated over K in DST
#include <cstdint>
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/matmul.h"
#include "api/compute/eltwise_binary.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    const uint32_t transpose = get_arg_val<uint32_t>(0);
    constexpr uint32_t Mt = 2, Kt = 3, Nt = 2;
    constexpr uint32_t cb_a = tt::CBIndex::c_0, cb_b = tt::CBIndex::c_1, cb_c = tt::CBIndex::c_16;
    compute_kernel_hw_startup<SrcOrder::Reverse>(cb_a, cb_b, cb_c);
    cb_wait_front(cb_a, Mt * Kt);
    cb_wait_front(cb_b, Kt * Nt);
#if RULE == 3
    mul_init(cb_a, cb_b);
#else
    matmul_init(cb_a, cb_b, transpose);
#endif
    tile_regs_acquire();
    for (uint32_t k = 0; k < Kt; ++k)
        for (uint32_t i = 0; i < Mt; ++i)
            for (uint32_t j = 0; j < Nt; ++j) matmul_tiles(cb_a, cb_b, i * Kt + k, k * Nt + j, i * Nt + j);
    tile_regs_commit();
    tile_regs_wait();
    cb_reserve_back(cb_c, Mt * Nt);
    for (uint32_t d = 0; d < Mt * Nt; ++d) pack_tile(d, cb_c);
    cb_push_back(cb_c, Mt * Nt);
    tile_regs_release();
    cb_pop_front(cb_a, Mt * Kt);
    cb_pop_front(cb_b, Kt * Nt);
}
"""

TZ_COMPUTE = r"""
// compute, per 32-row strip of Wt tiles' width of row-major x: tilize -> c_24; copy the tiles -> c_17;
// pack_untilize them back (two blocks of Wt/2 tiles) -> c_16 (row-major)
#include <cstdint>
#include "api/compute/compute_kernel_hw_startup.h"
#include "api/compute/tilize.h"
#include "api/compute/pack_untilize.h"
#include "api/compute/tile_move_copy.h"
#include "api/compute/reg_api.h"
#include "api/compute/pack.h"
#include "api/compute/cb_api.h"
#ifndef RULE
#define RULE 0
#endif

void kernel_main() {
    const uint32_t n_strips = get_arg_val<uint32_t>(0);
    constexpr uint32_t Wt = 4, half = Wt / 2;
    constexpr uint32_t cb_x = tt::CBIndex::c_0, cb_y = tt::CBIndex::c_16, cb_tiles = tt::CBIndex::c_17;
    constexpr uint32_t cb_t = tt::CBIndex::c_24;
    compute_kernel_hw_startup(cb_x, cb_t);
    for (uint32_t s = 0; s < n_strips; ++s) {
        tilize_init(cb_x, Wt, cb_t);
        cb_wait_front(cb_x, Wt);
        cb_reserve_back(cb_t, Wt);
        tilize_block(cb_x, Wt, cb_t);
        cb_push_back(cb_t, Wt);
        cb_pop_front(cb_x, Wt);
#if RULE != 5
        tilize_uninit(cb_x, cb_t);
#endif

        copy_init(cb_t);
        cb_wait_front(cb_t, Wt);
        for (uint32_t t = 0; t < Wt; ++t) {
            tile_regs_acquire();
            copy_tile(cb_t, t, 0);
            tile_regs_commit();
            tile_regs_wait();
            cb_reserve_back(cb_tiles, 1);
            pack_tile(0, cb_tiles);
            cb_push_back(cb_tiles, 1);
            tile_regs_release();
        }

#if RULE == 4
        pack_untilize_init<16>(cb_t, cb_y);
        cb_reserve_back(cb_y, Wt);
        pack_untilize_block<16>(cb_t, 1, cb_y);
#else
        pack_untilize_init<half, Wt>(cb_t, cb_y);
        cb_reserve_back(cb_y, Wt);
        for (uint32_t b = 0; b < Wt / half; ++b) {
            cb_wait_front(cb_t, half);
            pack_untilize_block<half, Wt>(cb_t, 1, cb_y, b);
            cb_pop_front(cb_t, half);
        }
#endif
        cb_push_back(cb_y, Wt);
#if RULE != 6
        pack_untilize_uninit(cb_y);
#endif
    }
}
"""

NX_HOST = r"""
// host: argv = kernel_dir mode(rs|mm|tz) f32(0|1) rule transpose in.bin out.bin
//   rs: in = g (Wt tiles), out (3 chunks x Wt tiles), 32 uint32 row indices; out = the updated out
//   mm: in = A (2x3 tiles, row-major tile order), B (3x2 tiles); out = C (2x2 tiles)
//   tz: in = x row-major (64 x 128: 8 pages); out = the tilized tiles (8 pages), then x back (row-major, 8 pages)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <tt-metalium/host_api.hpp>

using namespace tt::tt_metal;

int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage\n"); return 2; }
    const std::string dir = argv[1], mode = argv[2];
    const bool f32 = atoi(argv[3]) != 0;
    const int rule = atoi(argv[4]);
    const uint32_t transpose = (uint32_t)atoi(argv[5]);
    const tt::DataFormat fmt = f32 ? tt::DataFormat::Float32 : tt::DataFormat::Float16_b;
    const uint32_t page = f32 ? 4096 : 2048;
    FILE *fi = fopen(argv[6], "rb");
    std::vector<uint8_t> in;
    for (int ch; fi && (ch = fgetc(fi)) != EOF;) in.push_back((uint8_t)ch);
    if (fi) fclose(fi);

    Program program = CreateProgram();
    CoreCoord core{0, 0};
    auto cb = [&](uint8_t idx, uint32_t pages, tt::DataFormat f, uint32_t pg) {
        CreateCircularBuffer(program, core, CircularBufferConfig(pages * pg, {{idx, f}}).set_page_size(idx, pg));
    };
    auto buf = [&](uint32_t bytes, size_t from) {
        uint32_t a = ttmodel::dram_alloc(bytes);
        if (from != (size_t)-1) memcpy(ttmodel::dram_ptr(a), in.data() + from, bytes);
        return a;
    };
    std::map<std::string, std::string> defs;
    if (rule) defs["RULE"] = std::to_string(rule);
    std::vector<UnpackToDestMode> u2d(32, UnpackToDestMode::Default);
    if (f32) u2d[0] = u2d[2] = u2d[24] = UnpackToDestMode::UnpackToDestFp32;
    std::vector<std::pair<uint32_t, uint32_t>> outs;  // (address, bytes) written to out.bin in order

    if (mode == "rs") {
        const uint32_t Wt = 2, n_out = 3 * Wt;
        if (in.size() != (Wt + n_out) * page + 128) { fprintf(stderr, "bad input\n"); return 2; }
        uint32_t g = buf(Wt * page, 0), o = buf(n_out * page, Wt * page), ix = buf(128, (Wt + n_out) * page);
        cb(tt::CBIndex::c_0, Wt, fmt, page);
        cb(tt::CBIndex::c_1, 1, tt::DataFormat::UInt32, 128);
        cb(tt::CBIndex::c_2, Wt, fmt, page);
        cb(tt::CBIndex::c_16, Wt, fmt, page);
        cb(tt::CBIndex::c_24, 2, tt::DataFormat::UInt8, 32);
        cb(tt::CBIndex::c_25, 1, tt::DataFormat::UInt32, 16);
        auto reader = CreateKernel(program, dir + "/rs_reader.cpp", core,
                                   ReaderDataMovementConfig({2, page, 2, 128, 2, page}));
        CreateKernel(program, dir + "/rs_compute.cpp", core,
                     ComputeConfig{.fp32_dest_acc_en = f32, .unpack_to_dest_mode = u2d, .compile_args = {Wt},
                                   .defines = defs});
        SetRuntimeArgs(program, reader, core, {g, ix, o, Wt, 3 * 32});
        outs.push_back({o, n_out * page});
    } else if (mode == "mm") {
        if (in.size() != 12 * page) { fprintf(stderr, "bad input\n"); return 2; }
        uint32_t a = buf(6 * page, 0), b = buf(6 * page, 6 * page), c = buf(4 * page, (size_t)-1);
        cb(tt::CBIndex::c_0, 6, fmt, page);
        cb(tt::CBIndex::c_1, 6, fmt, page);
        cb(tt::CBIndex::c_16, 4, fmt, page);
        std::vector<uint32_t> ct{2, page, 2, page};
        auto reader = CreateKernel(program, dir + "/gen_reader.cpp", core, ReaderDataMovementConfig(ct));
        auto writer = CreateKernel(program, dir + "/gen_writer.cpp", core, WriterDataMovementConfig(ct));
        auto compute = CreateKernel(program, dir + "/mm_compute.cpp", core,
                                    ComputeConfig{.fp32_dest_acc_en = f32, .defines = defs});
        SetRuntimeArgs(program, reader, core, {1, 2, a, tt::CBIndex::c_0, 6, b, tt::CBIndex::c_1, 6});
        SetRuntimeArgs(program, writer, core, {1, 1, c, tt::CBIndex::c_16, 4, c, tt::CBIndex::c_16, 4});
        SetRuntimeArgs(program, compute, core, {transpose});
        outs.push_back({c, 4 * page});
    } else if (mode == "tz") {
        if (in.size() != 8 * page) { fprintf(stderr, "bad input\n"); return 2; }
        uint32_t x = buf(8 * page, 0), t = buf(8 * page, (size_t)-1), y = buf(8 * page, (size_t)-1);
        for (uint8_t idx : {tt::CBIndex::c_0, tt::CBIndex::c_16, tt::CBIndex::c_17, tt::CBIndex::c_24})
            cb(idx, 4, fmt, page);
        std::vector<uint32_t> ct{2, page, 2, page};
        auto reader = CreateKernel(program, dir + "/gen_reader.cpp", core, ReaderDataMovementConfig(ct));
        auto writer = CreateKernel(program, dir + "/gen_writer.cpp", core, WriterDataMovementConfig(ct));
        auto compute = CreateKernel(program, dir + "/tz_compute.cpp", core,
                                    ComputeConfig{.fp32_dest_acc_en = f32, .unpack_to_dest_mode = u2d,
                                                  .defines = defs});
        SetRuntimeArgs(program, reader, core, {2, 1, x, tt::CBIndex::c_0, 4, x, tt::CBIndex::c_0, 4});
        SetRuntimeArgs(program, writer, core, {2, 2, t, tt::CBIndex::c_17, 4, y, tt::CBIndex::c_16, 4});
        SetRuntimeArgs(program, compute, core, {2});
        outs.push_back({t, 8 * page});
        outs.push_back({y, 8 * page});
    } else {
        fprintf(stderr, "bad mode\n");
        return 2;
    }
    ttmodel::run(program);
    FILE *fo = fopen(argv[7], "wb");
    for (auto [a, n] : outs) fwrite(ttmodel::dram_ptr(a), 1, n, fo);
    fclose(fo);
    return 0;
}
"""

NX_SOURCES = {"nx_host.cpp": NX_HOST, "gen_reader.cpp": GEN_READER, "gen_writer.cpp": GEN_WRITER,
              "rs_reader.cpp": RS_READER, "rs_compute.cpp": RS_COMPUTE, "mm_compute.cpp": MM_COMPUTE,
              "tz_compute.cpp": TZ_COMPUTE}


def nx_inputs(mode: str, f32: bool, transpose: int = 0):
    """The input bytes of a run and the float32 arrays (already rounded to the data type) the checks use."""
    dt = np.float32 if f32 else BF16
    rng = np.random.default_rng({"rs": 21, "mm": 22, "tz": 23}[mode])
    if mode == "rs":
        g = rng.standard_normal((32, 64)).astype(dt)
        o = rng.standard_normal((96, 64)).astype(dt)
        # rows 3, 17 and 30 all go to row 40 (in that order); rows 5 and 9 are skipped (>= 96); chunk 2 (rows 64..95)
        # gets rows 0 and 31 only; chunk 1 several; row 0 of out is hit once
        idx = rng.integers(0, 64, 32).astype(np.uint32)
        idx[[3, 17, 30]] = 40
        idx[5], idx[9] = 0xFFFFFFFF, 96
        idx[0], idx[31], idx[1] = 70, 95, 0
        def tiles(a):
            return np.concatenate([tilize(a[:, 32 * t:32 * t + 32]) for t in range(2)])
        ot = np.concatenate([tiles(o[32 * c:32 * c + 32]) for c in range(3)])
        data = np.concatenate([tiles(g), ot]).tobytes() + idx.tobytes()
        return data, (g.astype(np.float32), o.astype(np.float32), idx)
    if mode == "mm":
        a = rng.standard_normal((64, 96)).astype(dt)
        b = rng.standard_normal((96, 64)).astype(dt)

        def tiles(m, tr=False):
            rows, cols = m.shape[0] // 32, m.shape[1] // 32
            return np.concatenate([tilize(m[32 * i:32 * i + 32, 32 * j:32 * j + 32].T.copy() if tr else
                                          m[32 * i:32 * i + 32, 32 * j:32 * j + 32]) for i in range(rows)
                                   for j in range(cols)])
        data = np.concatenate([tiles(a), tiles(b, bool(transpose))]).tobytes()
        return data, (a.astype(np.float32), b.astype(np.float32))
    x = rng.standard_normal((64, 128)).astype(dt)
    return x.tobytes(), (x.astype(np.float32),)


def nx_run(host: Path, mode: str, *, f32: bool, rule: int = 0, transpose: int = 0, tmp: Path):
    dt = np.float32 if f32 else BF16
    data, arrays = nx_inputs(mode, f32, transpose)
    inp, out = tmp / f"nx_{mode}{int(f32)}_{rule}_{transpose}.in", tmp / f"nx_{mode}{int(f32)}_{rule}_{transpose}.out"
    inp.write_bytes(data)
    cmd = [str(host), str(OUT / "src"), mode, str(int(f32)), str(rule), str(transpose), str(inp), str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    return r, (np.fromfile(out, dtype=dt).astype(np.float32) if r.returncode == 0 else None), arrays


NX_RULES = {
    ("rs", 1): "rule 1 (CB): reshuffle_rows_tile(0, 0x",
    ("rs", 2): "rule 1 (CB): read_tile_value(25, 0): tile 0 of CB 25 but the compute kernel waited for only 0 pages",
    ("mm", 3): "rule 5 (init): matmul_tiles(0, 1, ...) needs matmul_init(0, 1) as the last FPU init "
               "(the last one was mul_init)",
    ("tz", 4): "rule 4 (DST protocol): pack_untilize_block<16, 16>: block_ct_dim 16 exceeds DST: it holds 8 tiles "
               "(16-bit, half-sync)",
    ("tz", 5): "rule 5 (init): copy_init after tilize_init without tilize_uninit "
               "(the unpacker is still in tilize mode)",
    ("tz", 6): "rule 5 (init): pack_tile after pack_untilize_init without pack_untilize_uninit",
}


@pytest.fixture(scope="module")
def nx_results(tmp_path_factory):
    """Every nx_* run (positive ones for bf16 and f32, both matmul transposes, and the rule cases), two at a time."""
    OUT.mkdir(parents=True, exist_ok=True)
    host = model_build.build_host(NX_SOURCES, OUT, exe_name="nx_host")
    tmp = tmp_path_factory.mktemp("nx")
    jobs = [(m, f, 0, tr) for f in (False, True) for m, tr in (("rs", 0), ("mm", 0), ("mm", 1), ("tz", 0))]
    jobs += [(m, False, rule, 0) for m, rule in NX_RULES]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        res = list(ex.map(lambda j: nx_run(host, j[0], f32=j[1], rule=j[2], transpose=j[3], tmp=tmp), jobs))
    return dict(zip(jobs, res, strict=True))


def _rne_bf16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float32).astype(BF16).astype(np.float32)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_reshuffle_rows_scatter_add(nx_results, f32):
    """reshuffle_rows_tile: out[idx[i]] += g[i] with the mask built by the reader, the count read with
    read_tile_value and the mask address with get_tile_address (minus the 16-B header the LLK skips)."""
    r, out, (g, o, idx) = nx_results[("rs", f32, 0, 0)]
    assert r.returncode == 0, r.stderr
    # the model's documented semantics, emulated: rows in increasing order, each add in f32, DST rounding per add
    want = o.copy()
    for i in range(32):
        if idx[i] < 96:
            s = want[idx[i]] + g[i]
            want[idx[i]] = s if f32 else _rne_bf16(s)
    got = np.concatenate([np.concatenate([untilize(out[(2 * c + t) * 1024:(2 * c + t + 1) * 1024], 1)
                                          for t in range(2)], axis=1) for c in range(3)])
    assert np.array_equal(got, want)
    ref = o.astype(np.float64)
    np.add.at(ref, idx[idx < 96].astype(np.int64), g[idx < 96].astype(np.float64))
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 if f32 else 6e-2)
    assert not np.array_equal(got[40], o[40] + g[3]), "three rows accumulate into row 40"


def _mm_emulate(a: np.ndarray, b: np.ndarray, f32: bool) -> np.ndarray:
    """The model's matmul: TF32 operands (f32) / exact bf16, per tile and per inner half a 16-term f32 sum in order
    added into DST (bf16-rounded unless f32), K tiles in order."""
    if f32:
        a = (a.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
        b = (b.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    c = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 16):
        acc = np.zeros_like(c)
        for k in range(k0, k0 + 16):
            acc = (acc + np.outer(a[:, k], b[k, :]).astype(np.float32)).astype(np.float32)
        c = (c + acc).astype(np.float32)
        c = c if f32 else _rne_bf16(c)
    return c


@pytest.mark.parametrize("transpose", [0, 1])
@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_matmul_block(nx_results, f32, transpose):
    """matmul_init/matmul_tiles: a 2x3-tile by 3x2-tile product accumulated over K in DST; with transpose = 1 the host
    stores every B tile transposed and the unpacker transposes it back."""
    r, out, (a, b) = nx_results[("mm", f32, 0, transpose)]
    assert r.returncode == 0, r.stderr
    got = np.block([[untilize(out[(2 * i + j) * 1024:(2 * i + j + 1) * 1024], 1) for j in range(2)] for i in range(2)])
    assert np.array_equal(got, _mm_emulate(a, b, f32))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=0 if f32 else 2e-2, atol=5e-2 if f32 else 0.1)


@pytest.mark.parametrize("f32", [False, True], ids=["bf16", "f32"])
def test_tilize_pack_untilize_round_trip(nx_results, f32):
    """tilize_block gives the tile layout of row-major data, and pack_untilize_block (two blocks of 2 tiles of a
    4-tile row, block_c_index 0 and 1) gives the rows back, bit for bit."""
    r, out, (x,) = nx_results[("tz", f32, 0, 0)]
    assert r.returncode == 0, r.stderr
    tiles, back = out[:8 * 1024], out[8 * 1024:]
    want = np.concatenate([tilize(x[32 * s:32 * s + 32, 32 * t:32 * t + 32]) for s in range(2) for t in range(4)])
    assert np.array_equal(tiles, want)
    assert np.array_equal(back.reshape(64, 128), x)


def test_reshuffle_matmul_tilize_rules(nx_results):
    bad = []
    for (mode, rule), want in NX_RULES.items():
        r = nx_results[(mode, False, rule, 0)][0]
        if r.returncode == 0 or want not in r.stderr:
            bad.append(f"{mode} case {rule}: rc={r.returncode} want {want!r}\n{r.stderr[-800:]}")
    assert not bad, "\n".join(bad)
    assert "which is not inside a CB page the compute kernel waited for" in nx_results[("rs", False, 1, 0)][0].stderr
