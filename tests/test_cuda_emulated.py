"""The generated CUDA kernels EXECUTED without a GPU, on a CPU model of the CUDA subset they use
(tests/cuda_emu/cuda_emu.h: every block's 256 threads are real threads, so barriers, block
reductions, warp shuffles, integer atomics and races are real; device memory is host memory).

What this verifies: the mapping of ``sched`` loops to blocks/threads, barrier placement (under
ThreadSanitizer: a removed barrier is caught, see the positive control), block reductions,
owner-computes scatter-add over the segments, the workspace layout, the host launchers and the
shared binder — against the numpy oracle, bitwise identical across runs with different thread
timing, and "nothing written" after an index out of range. What it cannot: GPU memory-model
subtleties, the real CUB sort (a stable sort stands in), performance. benchmarks/gpu.py covers
those on a GPU machine.

``OPGEN_EMU_ALL=1`` runs every dtype binding x variant (default: a covering sample).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opgen import build, registry
from tests.cuda_emu import emu_build
from tests.cuda_emu import emu_worker as worker

REPO = Path(__file__).resolve().parent.parent

OUT = REPO / "build" / "cuda-emu"
pytestmark = pytest.mark.skipif(emu_build.cxx() is None, reason="no C++ compiler (g++): the CUDA emulator "
                                                                 "tests are skipped")


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return build.generated_files()


@pytest.fixture(scope="module")
def emu_lib(sources: dict[str, str]) -> Path:
    return emu_build.build(sources, OUT)


@pytest.mark.parametrize("op", sorted(registry.load_all()))
def test_kernels_match_the_oracle_and_are_deterministic(emu_lib: Path, op: str) -> None:
    lib = worker.load(emu_lib)
    failures = worker.check(lib, op, full=os.environ.get("OPGEN_EMU_ALL") == "1")
    assert not failures, "\n".join(failures[:20])


def test_unfused_lowering_runs_too(sources: dict[str, str]) -> None:
    """The printer on the other loop shapes of the unfused fallback lowering (top-level
    reductions and matmuls, one nest per value): one case per op."""
    from opgen.emit import cuda

    unfused = {p: t for p, t in sources.items() if not p.endswith(".cu") or p.endswith("opgen_cuda_rt.cu")}
    for name, o in registry.load_all().items():
        unfused[f"cuda/{name}.cu"] = cuda.op_source(o, fuse=False)
    lib = worker.load(emu_build.build(unfused, OUT / "unfused"))
    failures = [f for op in sorted(registry.load_all()) for f in worker.check(lib, op, limit=1)]
    assert not failures, "\n".join(failures[:20])


def _at_odd_offset(a: np.ndarray) -> np.ndarray:
    """The same values one element past an aligned address (no 8/16-byte vector access fits)."""
    buf = np.zeros(a.size + 1, a.dtype)
    view = buf[1:].reshape(a.shape)
    view[...] = a
    return view


def _every_other(a: np.ndarray) -> np.ndarray:
    """The same values with a last-dim stride of 2 (the general-stride flavour)."""
    buf = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
    buf[..., ::2] = a
    return buf[..., ::2]


@pytest.mark.parametrize("T", [np.float16, np.float32])
def test_vector_and_strided_paths_give_the_same_bits(emu_lib: Path, T: type) -> None:
    """RMSNorm backward (vectorised row reductions and element loops) and the dense embedding
    backward (vectorised scatter rows): aligned 16-byte vectors, misaligned element-by-element
    chunks and the general-stride flavour all sum in one order -> identical bits, = the oracle."""
    from opgen import oracle, runtime

    shim = worker.load(emu_lib)
    rng = np.random.default_rng(7)
    N, D = 5, 304  # rows of 608/1216 bytes: aligned; D % 8 == 0
    rms = {"grad_y": rng.standard_normal((N, D)).astype(T), "x": rng.standard_normal((N, D)).astype(T),
           "w": rng.standard_normal(D).astype(T), "eps": 1e-6}
    emb = {"grad": rng.standard_normal((4, 3, D)).astype(T), "indices": rng.integers(0, 6, (4, 3)),
           "num_weights": 6, "padding_idx": 2, "scale_grad_by_freq": True}
    for op, args, moved, strided in (("rms_norm_backward", rms, ("grad_y", "x", "w"), ("w",)),
                                     ("embedding_dense_backward", emb, ("grad",), ("grad",))):
        ref = oracle.run(registry.get(op), **args)
        runs = [runtime.call(op, lib=shim, **args),
                runtime.call(op, lib=shim, **{**args, **{k: _at_odd_offset(args[k]) for k in moved}}),
                runtime.call(op, lib=shim, **{**args, **{k: _every_other(args[k]) for k in strided}})]
        for k, v in ref.items():
            assert not worker.bench().close(runs[0][k], v), f"{op}.{k} vs oracle"
            for r in runs[1:]:
                assert r[k].tobytes() == runs[0][k].tobytes(), f"{op}.{k}: the paths disagree"


GEMM_PROBE = r"""
#include "opgen_cuda_rt.cuh"
static __global__ void probe(int sa, int sb, const float *A, int64_t ars, int64_t acs, const float *B, int64_t brs,
                             int64_t bcs, float *C, int64_t m, int64_t n, int64_t k, int acc) {
    if (sa && sb) opgen_block_gemm_tc<true, true>(m, n, k, A, ars, acs, B, brs, bcs, C, n, acc);
    else if (sa) opgen_block_gemm_tc<true, false>(m, n, k, A, ars, acs, B, brs, bcs, C, n, acc);
    else if (sb) opgen_block_gemm_tc<false, true>(m, n, k, A, ars, acs, B, brs, bcs, C, n, acc);
    else opgen_block_gemm_tc<false, false>(m, n, k, A, ars, acs, B, brs, bcs, C, n, acc);
}
extern "C" void gemm_probe(int sa, int sb, const float *A, int64_t ars, int64_t acs, const float *B, int64_t brs,
                           int64_t bcs, float *C, int64_t m, int64_t n, int64_t k, int acc) {
    probe<<<1, OPGEN_CUDA_THREADS, 0, 0>>>(sa, sb, A, ars, acs, B, brs, bcs, C, m, n, k, acc);
}
"""


def test_tensor_core_gemm_keeps_f32_accuracy(sources: dict[str, str]) -> None:
    """opgen_block_gemm_tc (TF32 WMMA) on the CPU model, against float64 numpy: odd sizes,
    transposed operands, accumulate. Operands split into hi + lo TF32 parts give f32-level
    accuracy; the unsplit product of f32 data is only TF32-accurate (the control: the model
    rounds like the hardware, so the split is what buys the accuracy); bf16 data is exact in
    TF32 and needs no split. An infinite operand stays infinite (no inf - inf from the split)."""
    keep = {p: t for p, t in sources.items() if p.startswith("include/") or p == "cuda/opgen_cuda_rt.cuh"}
    keep["cuda/gemm_probe.cu"] = GEMM_PROBE
    lib = ctypes.CDLL(str(emu_build.build(keep, OUT / "gemm")))
    f, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.gemm_probe.argtypes = [ctypes.c_int, ctypes.c_int, f, i64, i64, f, i64, i64, f, i64, i64, i64, ctypes.c_int]
    rng = np.random.default_rng(3)

    def run(a: np.ndarray, b: np.ndarray, sa: bool, sb: bool, c0: np.ndarray | None = None) -> np.ndarray:
        """C (= or +=) a @ b with a given as a (m, k) view (maybe transposed) and b (k, n)."""
        m, k = a.shape
        n = b.shape[1]
        c = np.array(c0 if c0 is not None else np.full((m, n), np.nan), np.float32)
        lib.gemm_probe(sa, sb, a.ctypes.data, a.strides[0] // 4, a.strides[1] // 4, b.ctypes.data,
                       b.strides[0] // 4, b.strides[1] // 4, c.ctypes.data, m, n, k, c0 is not None)
        return c

    m, n, k = 70, 90, 45  # partial 64-tiles and k-steps
    a_t = rng.standard_normal((k, m)).astype(np.float32)  # a = a_t.T: a transposed operand
    a, b = a_t.T, rng.standard_normal((k, n)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
    split = run(a, b, True, True)
    assert (np.abs(split - ref) / scale).max() < 2e-6
    unsplit = run(a, b, False, False)
    assert (np.abs(unsplit - ref) / scale).max() > 1e-4  # TF32's 2^-11 shows
    # bf16 data on both sides: exact in TF32, one product is as good as the split
    import ml_dtypes
    ab = a.astype(ml_dtypes.bfloat16).astype(np.float32)
    bb = b.astype(ml_dtypes.bfloat16).astype(np.float32)
    exact = run(ab, bb, False, False)
    ref_b = ab.astype(np.float64) @ bb.astype(np.float64)
    assert (np.abs(exact - ref_b) / (np.abs(ab) @ np.abs(bb))).max() < 2e-6
    # accumulate into C (A split, B exact: the FLCE gradient products)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    acc = run(a, bb, True, False, c0)
    assert np.allclose(acc, c0 + a.astype(np.float64) @ bb, rtol=0, atol=2e-5 * (1 + np.abs(c0) + scale).max())
    # an infinity in a split operand: inf * positive column sums stay inf, never NaN
    a_inf = np.array(a)
    a_inf[3, 5] = np.inf
    bpos = np.abs(bb) + 0.5
    got = run(a_inf, bpos, True, False)
    assert np.isposinf(got[3]).all() and np.isfinite(np.delete(got, 3, 0)).all()


@pytest.mark.parametrize(("scale", "lead"), [(False, (3, 4)), (True, (3, 4)), (True, (20, 20))])
def test_sparse_segment_tables(emu_lib: Path, scale: bool, lead: tuple[int, int]) -> None:
    """A table much larger than the indices (V = 6000, N = 12: V > 64 N + 4096): the segment
    table is the sorted indices (searched by bisection, no V-sized workspace), on the device as
    on the CPU. With N = 400 the device takes the dense start table (V <= 64 N + 4096) where the
    CPU keeps the sorted indices (V > 4 N + 4096): same results. (Every row of the table is one
    step of the kernel's row loop, a barrier of 256 threads on the CPU model: V is kept just past
    the bounds.)"""
    from opgen import oracle, runtime

    rng = np.random.default_rng(5)
    idx = rng.integers(0, 6000, lead)
    idx[0, :3] = idx[2, 1]
    grad = rng.standard_normal((*lead, 6)).astype(np.float32)
    args = {"grad": grad, "indices": idx, "num_weights": 6000, "padding_idx": int(idx[1, 0]),
            "scale_grad_by_freq": scale}
    got = runtime.call("embedding_dense_backward", lib=worker.load(emu_lib), **args)["out"]
    ref = oracle.run(registry.get("embedding_dense_backward"), **args)["out"]
    assert np.allclose(got, ref, rtol=1e-6, atol=1e-7) and np.count_nonzero(got.any(axis=1)) >= 5


@pytest.mark.parametrize("op", ["rms_norm_backward", "embedding_dense_backward"])
def test_results_do_not_depend_on_the_grid(emu_lib: Path, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """$OPGEN_CUDA_MAX_GRID caps every grid (read at each call): one block, three blocks and the
    library's own grids give the same bits (RMSNorm's 8-row partials and their columns kernel;
    the scatter's owner-computes rows)."""
    from opgen import runtime

    rng = np.random.default_rng(11)
    if op == "rms_norm_backward":
        args = {"grad_y": rng.standard_normal((70, 300)).astype(np.float32),
                "x": rng.standard_normal((70, 300)).astype(np.float32),
                "w": rng.standard_normal(300).astype(np.float32), "eps": 1e-6}
    else:
        args = {"grad": rng.standard_normal((50, 40)).astype(np.float32), "indices": rng.integers(0, 90, 50),
                "num_weights": 90, "padding_idx": 3, "scale_grad_by_freq": True}
    lib = worker.load(emu_lib)
    runs = []
    for cap in (None, "1", "3"):
        if cap is None:
            monkeypatch.delenv("OPGEN_CUDA_MAX_GRID", raising=False)
        else:
            monkeypatch.setenv("OPGEN_CUDA_MAX_GRID", cap)
        runs.append(runtime.call(op, lib=lib, **args))
    for k, v in runs[0].items():
        assert all(r[k].tobytes() == v.tobytes() for r in runs[1:]), k


def test_index_out_of_range_writes_nothing_and_is_reported(emu_lib: Path) -> None:
    lib = ctypes.CDLL(str(emu_lib))
    lib.opgen_cuda_device_status.argtypes = [ctypes.c_void_p, ctypes.c_int]
    shim = worker.load(emu_lib)
    from opgen import runtime

    assert lib.opgen_cuda_device_status(None, 1) == 0
    out = np.full((11, 9), 7.0, np.float32)
    idx = np.array([[1, 2, 3], [4, 11, 0]], np.int64)  # 11 is out of [0, 11)
    runtime.call("embedding_dense_backward", lib=shim, grad=np.ones((2, 3, 9), np.float32), indices=idx,
                 num_weights=11, padding_idx=-1, scale_grad_by_freq=True, out=out)
    assert (out == 7.0).all(), "an output was written after a failed device-side index check"
    assert lib.opgen_cuda_device_status(None, 1) == 6  # OPGEN_ERR_INDEX, then cleared
    assert lib.opgen_cuda_device_status(None, 0) == 0
    # a valid call afterwards works (the per-call status word is reset)
    runtime.call("embedding_dense_backward", lib=shim, grad=np.ones((2, 3, 9), np.float32),
                 indices=np.array([[1, 2, 3], [4, 10, 0]], np.int64), num_weights=11, padding_idx=-1,
                 scale_grad_by_freq=False, out=out)
    assert out[10].tolist() == [1.0] * 9 and out[5].tolist() == [0.0] * 9


def _tsan_runtime() -> str | None:
    r = subprocess.run(["gcc", "-print-file-name=libtsan.so"], capture_output=True, text=True)
    p = Path(r.stdout.strip())
    return str(p.resolve()) if r.returncode == 0 and p.is_absolute() and p.exists() else None


def _run_tsan(lib: Path, ops: str, limit: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "LD_PRELOAD": _tsan_runtime() or "", "TSAN_OPTIONS": "halt_on_error=0 exitcode=66"}
    return subprocess.run([sys.executable, str(REPO / "tests" / "cuda_emu" / "emu_worker.py"), str(lib), ops,
                           "--limit", str(limit)], capture_output=True, text=True, env=env, timeout=1800)


needs_tsan = pytest.mark.skipif(_tsan_runtime() is None, reason="libtsan not found: race checks skipped")


@needs_tsan
def test_no_data_races_under_threadsanitizer(sources: dict[str, str]) -> None:
    """Every op's kernels (two cases each) under ThreadSanitizer: a missing barrier between
    threads of a block sharing scratch or shared memory would be reported."""
    lib = emu_build.build(sources, OUT, tsan=True)
    r = _run_tsan(lib, ",".join(sorted(registry.load_all())), 2)
    assert "ThreadSanitizer" not in r.stderr, r.stderr[-6000:]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


@needs_tsan
@pytest.mark.parametrize(("barrier", "op"), [("__syncthreads();", "rms_norm_backward"),
                                             ("__syncwarp();", "fused_linear_cross_entropy_loss_grad")])
def test_threadsanitizer_positive_control(sources: dict[str, str], barrier: str, op: str) -> None:
    """Without the runtime's block barriers (block reductions) or warp barriers (tensor-core
    epilogue: lanes read accumulator elements other lanes stored), the race is caught: the
    check is live."""
    keep = {p: t for p, t in sources.items() if p.startswith("include/") or p in
            ("cuda/opgen_cuda_rt.cu", "cuda/opgen_cuda_rt.cuh", f"cuda/{op}.cu")}
    assert barrier in keep["cuda/opgen_cuda_rt.cuh"]
    keep["cuda/opgen_cuda_rt.cuh"] = keep["cuda/opgen_cuda_rt.cuh"].replace(barrier, "/* removed */")
    lib = emu_build.build(keep, OUT / f"control-{op}", tsan=True)
    r = _run_tsan(lib, op, 1)
    assert "ThreadSanitizer: data race" in r.stderr, r.stderr[-3000:]
