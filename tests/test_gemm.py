"""The CPU runtime's packed f32 GEMM (generated/cpu/opgen_rt.c: opgen_sgemm, opgen_sgemm_par)
and its bf16 products (opgen_bgemm, opgen_bgemm_par: AMX or AVX512-BF16) driven directly
(tests/c/gemm_check.c) on shapes around its blocking — partial MR-row panels and
NR-column panels, several row blocks and OPGEN_NC column blocks, k within one OPGEN_KC block and
across several, k = 0, transposed (strided) operands, accumulation, a padded leading dimension:

* against float64 matmul (an independent reference) within f32 accumulation error;
* bitwise the same built for each register tile this machine can run — AVX-512 (the 14x32
  intrinsics kernel), AVX2 with FMA (6x16, intrinsics) and neither (the 8x32 auto-vectorised
  kernel) — single-threaded and on 1 and 3 OpenMP threads: the k order is fixed
  (blocks of ``GEMM_KC``), whatever the tiles, the instruction set or the threads;
* the padding columns of C are never written;
* opgen_bgemm: against float64 products of bf16-rounded operands on each kind of bf16 units the
  machine has (AMX tiles, AVX512-BF16 dot products: OPGEN_BF16_UNITS=amx, dp), the same bits on
  every thread count, exactly opgen_sgemm without them (OPGEN_BF16_UNITS=none);
* when the panels (or the f32 C of a bf16 output) cannot be allocated, every GEMM falls back to
  its plain loops and gives the same bits (the runtime built with its allocations failing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from opgen.compile import CFLAGS, compiler
from opgen.lower.sched import GEMM_KC
from tests.reference import cpu_flag

C_SRC = Path(__file__).parent / "c" / "gemm_check.c"
GEN = registry.REPO_ROOT / "generated"
AVX512 = cpu_flag("avx512f")
AVX2 = cpu_flag("avx2") and cpu_flag("fma")

# (m, n, k): one partial panel; a block and a half of rows (OPGEN_MC = 18 panels of 14) with n past
# a column block (OPGEN_NC = 1024); k across three GEMM_KC blocks with a remainder; k = 0; a vector
SHAPES = [(13, 31, 7), (14 * 27 + 5, 1024 + 40, 2 * GEMM_KC + 9), (29, 65, GEMM_KC), (5, 9, 0), (1, 33, 300),
          (300, 1, 70)]


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The driver linked with the runtime built natively and, for the machine's narrower register
    tiles, without AVX-512 (the AVX2 kernel) and without AVX2 (the generic kernel)."""
    out = tmp_path_factory.mktemp("gemm")
    variants = {"native": []}
    if AVX512:
        variants["no-avx512"] = ["-mno-avx512f"]
    if AVX2:
        variants["no-avx2"] = ["-mno-avx512f", "-mno-avx2"]
    return {name: _build_driver(out / f"gemm_check_{name}", extra) for name, extra in variants.items()}


def _build_driver(exe: Path, extra: list[str]) -> Path:
    """tests/c/gemm_check.c linked with generated/cpu/opgen_rt.c, the library's flags plus ``extra``."""
    flags = [f for f in CFLAGS if f != "-fPIC"]
    r = subprocess.run([compiler(), *flags, *extra, f"-I{GEN / 'include'}", f"-I{GEN / 'cpu'}", str(C_SRC),
                        str(GEN / "cpu" / "opgen_rt.c"), "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return exe


def run(exe: Path, tmp: Path, a: np.ndarray, b: np.ndarray, c: np.ndarray, m: int, n: int, k: int, ta: int,
        tb: int, acc: int, pad: int, fn: int, threads: str = "1", units: str = "amx") -> np.ndarray:
    """C from the driver's GEMM ``fn`` (0 opgen_sgemm, 1 opgen_sgemm_par, 2 opgen_bgemm, 3
    opgen_bgemm_par, ...: tests/c/gemm_check.c) on ``threads`` OpenMP threads, with
    OPGEN_BF16_UNITS=``units`` (amx: the best the machine has, dp, none)."""
    return run_units(exe, tmp, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units)[0]


def run_units(exe: Path, tmp: Path, a: np.ndarray, b: np.ndarray, c: np.ndarray, m: int, n: int, k: int, ta: int,
              tb: int, acc: int, pad: int, fn: int, threads: str = "1", units: str = "amx") -> tuple[np.ndarray, int]:
    """:func:`run`, and the bf16 units opgen_bgemm ran on in that process (2 AMX, 1 AVX512-BF16,
    0 none)."""
    got, r = run_driver(exe, tmp, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units)
    return got, int(r.stdout.strip())


def run_driver(exe: Path, tmp: Path, a: np.ndarray, b: np.ndarray, c: np.ndarray, m: int, n: int, k: int, ta: int,
               tb: int, acc: int, pad: int, fn: int, threads: str = "1", units: str = "amx",
               env: dict[str, str] | None = None) -> tuple[np.ndarray, subprocess.CompletedProcess]:
    """C from one driver run (more environment in ``env``), and the finished process."""
    src, dst = tmp / "in.bin", tmp / f"out-{exe.name}-{fn}-{threads}-{units}.bin"
    np.concatenate([a.ravel(), b.ravel(), c.ravel()]).astype(np.float32).tofile(src)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OMP_DYNAMIC": "false", "OPGEN_BF16_UNITS": units,
           **(env or {})}
    r = subprocess.run([str(exe), str(src), str(dst), *map(str, (m, n, k, ta, tb, acc, pad, fn))],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return np.fromfile(dst, dtype=np.float32).reshape(m, n + pad), r


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_gemm_against_float64_and_bitwise_on_every_path(drivers, tmp_path, m, n, k):
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (1, 0, 0, 5)):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        c = rng.standard_normal((m, n + pad)).astype(np.float32)
        opa = (a.T if ta else a).astype(np.float64)
        opb = (b.T if tb else b).astype(np.float64)
        want = opa @ opb + (c[:, :n].astype(np.float64) if acc else 0.0)
        results = []
        for exe in drivers.values():
            results.append(run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0))
            for threads in ("1", "3"):
                results.append(run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 1, threads))
        got = results[0]
        bound = 4e-7 * (np.abs(opa) @ np.abs(opb) + (np.abs(c[:, :n]) if acc else 0.0)) * (k + 2) + 1e-30
        assert np.all(np.abs(got[:, :n].astype(np.float64) - want) <= bound), (ta, tb, acc, pad)
        assert np.array_equal(got[:, n:], c[:, n:]), "the padding columns of C were written"
        for other in results[1:]:
            assert np.array_equal(other.view(np.uint32), got.view(np.uint32)), \
                f"not bitwise the same on every path ({list(drivers)}, 1 and 3 threads): {(ta, tb, acc, pad)}"


def _abc(rng: np.random.Generator, m: int, n: int, k: int, ta: int, tb: int,
         pad: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random f32 A, B and C as the driver reads them (``ta``/``tb``: 1 transposed, 2 every other
    column of a twice as wide array; C with ``pad`` more columns)."""
    a = rng.standard_normal((k, m) if ta == 1 else (m, 2 * k) if ta == 2 else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb == 1 else (k, 2 * n) if tb == 2 else (k, n)).astype(np.float32)
    return a, b, rng.standard_normal((m, n + pad)).astype(np.float32)


def _operand(x: np.ndarray, trans: int) -> np.ndarray:
    """op(X) as the driver reads it: transposed (1), every other column (2), as is (0)."""
    return x.T if trans == 1 else x[:, ::2] if trans == 2 else x


# bf16 tile products (opgen_bgemm): edge strips of 32 rows and 16/32 columns, k not a multiple of
# 32, several k blocks, FLCE's tile shapes (logits 256 x 256 x H, dX 256 x H x 256)
BF16_SHAPES = [(13, 31, 7), (70, 45, 33), (300, 1024 + 40, 2 * GEMM_KC + 9), (29, 65, GEMM_KC), (5, 9, 0),
               (1, 33, 300), (300, 1, 70), (256, 256, 1024), (256, 1024, 256),
               (40, 40, 17 * GEMM_KC + 40)]  # (past the dot-product kernel's 16 k blocks in registers)


# OPGEN_BF16_UNITS for each kind of bf16 units: the best the machine has (AMX tiles where there
# are, else AVX512-BF16) and the dot products (on an AMX machine: the other kind)
UNITS = ("amx", "dp")


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize(("m", "n", "k"), BF16_SHAPES)
def test_bf16_products_against_float64_and_bitwise_on_every_thread_count(drivers, tmp_path, m, n, k, units):
    """opgen_bgemm on the machine's bf16 units (AMX tiles or AVX512-BF16 dot products): op(A) and
    op(B) rounded to bf16 (round to nearest even: ml_dtypes, an independent rounding) then
    multiplied exactly and summed in f32; the same bits single-threaded and from opgen_bgemm_par on
    1 and 3 threads; padding columns untouched. Without such units (and always with
    OPGEN_BF16_UNITS=none) exactly opgen_sgemm's bits."""
    import ml_dtypes

    exe = drivers["native"]
    rng = np.random.default_rng(m * 5 + n * 11 + k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (1, 0, 0, 5), (2, 2, 1, 1)):
        a, b, c = _abc(rng, m, n, k, ta, tb, pad)
        got, ran = run_units(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 2, units=units)
        others = [run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 3, t, units) for t in ("1", "3")]
        for other in others:
            assert np.array_equal(other.view(np.uint32), got.view(np.uint32)), ("threads", ta, tb, acc, pad)
        assert np.array_equal(got[:, n:], c[:, n:]), "the padding columns of C were written"
        sgemm = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0)
        off, none = run_units(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 2, units="none")
        assert none == 0 and np.array_equal(off.view(np.uint32), sgemm.view(np.uint32)), \
            "OPGEN_BF16_UNITS=none is not opgen_sgemm"
        if not ran:
            assert np.array_equal(got.view(np.uint32), sgemm.view(np.uint32)), "no bf16 units: not opgen_sgemm"
            continue
        assert units != "dp" or ran == 1, f"OPGEN_BF16_UNITS=dp ran on units {ran}"
        opa, opb = _operand(a, ta), _operand(b, tb)
        ra = opa.astype(ml_dtypes.bfloat16).astype(np.float64)
        rb = opb.astype(ml_dtypes.bfloat16).astype(np.float64)
        cc = c[:, :n].astype(np.float64) if acc else 0.0
        want = ra @ rb + cc
        bound = 4e-7 * (np.abs(ra) @ np.abs(rb) + np.abs(cc)) * (k + 2) + 1e-30
        assert np.all(np.abs(got[:, :n].astype(np.float64) - want) <= bound), (ta, tb, acc, pad)
        if k >= 32:  # the rounding is real: the unrounded f32 product is farther away
            exact = opa.astype(np.float64) @ opb.astype(np.float64) + cc
            assert np.abs(got[:, :n] - exact).max() > np.abs(got[:, :n] - want).max()


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize(("m", "n", "k"), [(70, 45, 33), (300, 1024 + 40, 2 * GEMM_KC + 9), (5, 9, 0)])
def test_bf16_operands_in_memory(drivers, tmp_path, m, n, k, units):
    """opgen_gemm_bf16 (bf16 caller tensors, any strides): the bits of opgen_bgemm on the same
    (bf16-valued) operands held as f32 — the bf16 units where they run, else opgen_sgemm — on 1 and 3
    threads; with OPGEN_BF16_UNITS=none exactly opgen_sgemm."""
    import ml_dtypes

    exe = drivers["native"]
    rng = np.random.default_rng(m + n + k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (2, 2, 0, 1)):
        def bf(shape: tuple[int, int]) -> np.ndarray:
            return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float32)

        a = bf((k, m) if ta == 1 else (m, 2 * k) if ta == 2 else (m, k))
        b = bf((n, k) if tb == 1 else (k, 2 * n) if tb == 2 else (k, n))
        c = rng.standard_normal((m, n + pad)).astype(np.float32)
        want = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 2, units=units)
        for fn, threads in ((4, "1"), (5, "1"), (5, "3")):
            got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (fn, threads, ta, tb, acc, pad)
        off = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 4, units="none")
        sgemm = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0)
        assert np.array_equal(off.view(np.uint32), sgemm.view(np.uint32)), (ta, tb, acc, pad)


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize(("m", "n", "k"), [(70, 45, 33), (130, 1024 + 40, 2 * GEMM_KC + 9), (5, 9, 0), (64, 32, 300),
                                           (70, 45, 8 * GEMM_KC), (96, 64, 64), (64, 40, 17 * GEMM_KC + 32)])
def test_bf16_output(drivers, tmp_path, m, n, k, units):
    """opgen_gemm_bf16_out (bf16 A, B and C): each element is opgen_bgemm's f32 sum on the same
    values (C widened when accumulating) rounded once to bf16 (ml_dtypes, round to nearest even),
    on 1 and 3 threads; the padding columns of C untouched. With k a multiple of 32 the
    dot-product kernel reads a row-major A in place in its full 32-row blocks (8 k blocks: blocks
    of 32 rows, then 6 rows packed; k = 64: one block of 96 rows; 17 k blocks and a part: past the
    16 k blocks a pass keeps C in registers), a transposed or strided A packed."""
    import ml_dtypes

    exe = drivers["native"]
    rng = np.random.default_rng(3 * m + n + k)

    def bf(shape: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16).astype(np.float32)

    for ta, tb, acc, pad in ((0, 0, 0, 0), (0, 1, 1, 3), (1, 0, 1, 0), (2, 2, 0, 1)):
        a = bf((k, m) if ta == 1 else (m, 2 * k) if ta == 2 else (m, k))
        b = bf((n, k) if tb == 1 else (k, 2 * n) if tb == 2 else (k, n))
        c = bf((m, n + pad))
        f32 = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 2, units=units)
        want = f32[:, :n].astype(ml_dtypes.bfloat16).astype(np.float32)
        for fn, threads in ((6, "1"), (7, "1"), (7, "3")):
            got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units)
            assert np.array_equal(got[:, :n].view(np.uint32), want.view(np.uint32)), (fn, threads, ta, tb, acc)
            assert np.array_equal(got[:, n:], c[:, n:]), "the padding columns of C were written"


@pytest.mark.parametrize(("m", "n", "k"), [(70, 45, 33), (130, 1024 + 40, 2 * GEMM_KC + 9), (5, 9, 0), (1, 33, 300)])
def test_f16_operands_and_output(drivers, tmp_path, m, n, k):
    """opgen_gemm_f16 (f16 caller tensors, any strides): opgen_sgemm's bits on the same
    (f16-valued) operands held as f32, on 1 and 3 threads; opgen_gemm_f16_out (C f16 too): those
    sums rounded once to f16 (numpy, round to nearest even), C widened first when accumulating,
    its padding columns untouched. On every register tile the machine runs."""
    rng = np.random.default_rng(5 * m + n + k)

    def f16(shape: tuple[int, int]) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float16).astype(np.float32)

    for exe in drivers.values():
        for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (2, 2, 0, 1)):
            a = f16((k, m) if ta == 1 else (m, 2 * k) if ta == 2 else (m, k))
            b = f16((n, k) if tb == 1 else (k, 2 * n) if tb == 2 else (k, n))
            c = f16((m, n + pad))
            want = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0)
            for fn, threads in ((10, "1"), (11, "1"), (11, "3")):
                got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads)
                assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (fn, threads, ta, tb, acc, pad)
            rounded = want[:, :n].astype(np.float16).astype(np.float32)
            for fn, threads in ((12, "1"), (13, "1"), (13, "3")):
                got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads)
                assert np.array_equal(got[:, :n].view(np.uint32), rounded.view(np.uint32)), (fn, threads, ta, tb)
                assert np.array_equal(got[:, n:], c[:, n:]), "the padding columns of C were written"


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize(("m", "n", "k"), BF16_SHAPES)
def test_packed_right_hand_operand(drivers, tmp_path, m, n, k, units):
    """opgen_bpack + opgen_bgemm_pb (hoist-packing's B packed ahead of the loop): bitwise
    opgen_bgemm's result on every shape and stride (the same products on the same packed words),
    never writing past round32(k) x round32(n) words nor reading a word it did not pack (the
    buffer starts as NaN patterns); with OPGEN_BF16_UNITS=none exactly opgen_sgemm."""
    exe = drivers["native"]
    rng = np.random.default_rng(m * 3 + n * 7 + k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (1, 0, 0, 5), (2, 2, 1, 1)):
        a, b, c = _abc(rng, m, n, k, ta, tb, pad)
        want = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 2, units=units)
        got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 8, units=units)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (ta, tb, acc, pad)
        off = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 8, units="none")
        sgemm = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0)
        assert np.array_equal(off.view(np.uint32), sgemm.view(np.uint32)), ("no bf16 units", ta, tb, acc, pad)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_packed_right_hand_operand_f32(drivers, tmp_path, m, n, k):
    """opgen_spack + opgen_sgemm_pb (hoist-packing for f32 products): bitwise opgen_sgemm's result,
    built with AVX-512 and without (its other kernel), every stride and accumulation; never
    writing past k x round32(n) floats nor reading an element it did not pack (NaN patterns)."""
    rng = np.random.default_rng(m * 13 + n + k * 5)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (1, 0, 0, 5), (2, 2, 1, 1)):
        a, b, c = _abc(rng, m, n, k, ta, tb, pad)
        for exe in drivers.values():
            want = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0)
            got = run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 9)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (exe.name, ta, tb, acc, pad)


@pytest.fixture(scope="module")
def failing_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The native driver with opgen_rt.c's malloc and aligned_alloc routed through the driver,
    which fails every request of 4 KiB or more when GEMM_CHECK_FAIL_ALLOC=1."""
    return _build_driver(tmp_path_factory.mktemp("gemm-fail") / "gemm_check_fail",
                         ["-DGEMM_CHECK_FAIL_ALLOC", "-Dmalloc=gemm_check_malloc",
                          "-Daligned_alloc=gemm_check_aligned_alloc"])


@pytest.mark.parametrize(("m", "n", "k"), [(70, 45, 33), (130, 1024 + 40, 2 * GEMM_KC + 9), (5, 9, 0)])
def test_every_gemm_falls_back_when_memory_runs_out(drivers, failing_driver, tmp_path, m, n, k):
    """Every GEMM entry point (f32, bf16 and f16 operands, bf16 and f16 outputs, B packed ahead;
    one and three threads) with each of its large allocations failing: its plain loops give the bits of the
    panel GEMM (without bf16 units, whose products round differently by design), and the failure
    really happened (the driver counts the refused requests)."""
    import ml_dtypes

    rng = np.random.default_rng(m + 2 * n + 3 * k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (2, 2, 1, 1)):
        a, b, c = _abc(rng, m, n, k, ta, tb, pad)
        a, b, c = (x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in (a, b, c))  # (bf16 values)
        for fn, threads in ((0, "1"), (1, "3"), (2, "1"), (3, "3"), (4, "1"), (5, "3"), (6, "1"), (7, "3"), (8, "1"),
                            (9, "1"), (10, "1"), (11, "3"), (12, "1"), (13, "3")):
            want = run(drivers["native"], tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units="none")
            got, r = run_driver(failing_driver, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, fn, threads, units="none",
                                env={"GEMM_CHECK_FAIL_ALLOC": "1"})
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (fn, threads, ta, tb, acc, pad)
            failed = int(r.stderr.split("failed allocations:")[1])
            assert failed > 0 or k == 0, f"fn {fn}: no allocation was refused, the fallback did not run"
