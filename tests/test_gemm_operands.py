"""Every matmul on the packed GEMM, whatever its operands' storage and layout
(opgen/emit/c_family.py: ``CPrinter.matmul``, ``gemm_operand``, ``batch_rows``).

Ops written only here, built as a user builds them: a linear layer ``x @ w.T`` in f32, bf16 and
f16 (f16 caller tensors are read by ``opgen_gemm_f16``/``opgen_gemm_f16_out``, widened exactly
while packing), the same with batched rows (``Batch(N)``: read through the row table's stride
when its rows are evenly spaced, tested once a call), and a weight gradient ``g.T @ x`` over
batched rows (a transposed batched operand). Each against a float64 reference, and bitwise
against the plain loop the same op takes when the layout does not fit the GEMM (rows not
evenly spaced, an output whose columns are not adjacent): the GEMM sums each element's k terms
in the plain loop's order, so the bits are the same — but for bf16 operands on a machine with
bf16 units (AVX512-BF16, AMX: ``opgen_bf16_units()``), whose instructions add pairs of products
(their own order, tests/test_gemm.py), where both paths are held to float64 instead. Before, f16
and batched matmuls took the plain loop (2048^3 on 2 threads: f16 2.4, batched f32 4.9 GFLOP/s;
now 450 and 440, as f32).
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

from opgen import runtime
from tests.ops_dirs import built_ops
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

OPS = '''
"""Matmuls whose operands are f16 caller tensors or batched parameters."""
from opgen.dsl import *

N, K, M = dims("N K M")
T = dtype_var("T", f32, bf16, f16)


@op
def lin(x: Tensor[T, N, K], w: Tensor[T, M, K], *, y: Output[T, N, M]):
    """y = x @ w.T."""
    return {"y": x @ w.T}


@op
def lin_rows(x: Tensor[T, Batch(N), K], w: Tensor[T, M, K], *, y: Output[T, Batch(N), M]):
    """y = x @ w.T over batched rows."""
    return {"y": x @ w.T}


@op
def grad_w(g: Tensor[T, Batch(N), M], x: Tensor[T, Batch(N), K], *, dw: Output[T, M, K]):
    """dw = g.T @ x summed over batched rows."""
    return {"dw": g.T @ x}
'''

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}
#: the output's rounding, relative (f32: the k terms' f32 accumulation error at these sizes)
TOL = {"f32": 2e-5, "bf16": 2.0**-8, "f16": 2.0**-11}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("gemm_operands"), "opgen_test_gemm_operands", {"mm.py": OPS}) as b:
        yield b


def _fns(built: dict, name: str, dt: str) -> dict[str, str]:
    src = (built["out"] / "cpu" / f"{name}.c").read_text()
    parts = src.split(f"static opgen_status_t k_{name}_")[1:]
    return {p.split("(")[0]: p for p in parts if p.startswith(dt)}


def test_the_instances_call_the_gemm(built):
    """Every instance of the three ops calls a runtime GEMM: f16 ones the f16 GEMM (into the f16
    output: no temporary, no plain loop first), batched ones under their row tables' test, the
    general (strided) flavour under its output's unit column stride."""
    for dt, fn in (("f32", "opgen_sgemm_par("), ("bf16", "opgen_gemm_bf16_out_par("),
                   ("f16", "opgen_gemm_f16_out_par(")):
        for name in ("lin", "lin_rows", "grad_w"):
            fns = _fns(built, name, dt)
            for flavour in ("u", "g"):
                assert fn in fns[f"{dt}_{flavour}"], (name, dt, flavour)
        assert "if (af_p_x && af_p_y) {" in _fns(built, "lin_rows", dt)[f"{dt}_u"]
        assert "if (af_p_g && af_p_x) {" in _fns(built, "grad_w", dt)[f"{dt}_u"]
        assert "if (st_y_1 == 1) {" in _fns(built, "lin", dt)[f"{dt}_g"]


def _ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


def _same(built: dict, dt: str, a: np.ndarray, b: np.ndarray, want: np.ndarray, k: int) -> None:
    """``a`` (the GEMM's) and ``b`` (the plain loop's) bitwise equal, or, for bf16 on bf16 units,
    both close to ``want``."""
    if dt == "bf16" and built["lib"].opgen_bf16_units():
        _close(b, want, dt, k)
    else:
        assert np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def _close(got: np.ndarray, want: np.ndarray, dt: str, k: int) -> None:
    scale = np.abs(want).max() + 1
    assert np.abs(got.astype(np.float64) - want).max() <= (TOL[dt] + 1e-6 * k) * scale


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize(("n", "k", "m"), [(1, 1, 1), (13, 7, 31), (70, 300, 45), (300, 2 * 256 + 9, 33)])
def test_linear_gemm_against_float64_and_the_plain_loop(built, rng, dt, n, k, m):
    """``lin``: the GEMM (contiguous operands; a transposed weight view, general flavour) within
    the output's rounding of float64, and bitwise the plain loop (an output with every other
    column, general flavour, C's columns not adjacent)."""
    t = DTYPES[dt]
    x, w = rng.standard_normal((n, k)).astype(t), rng.standard_normal((m, k)).astype(t)
    got = np.asarray(runtime.call("lin", lib=built["lib"], x=x, w=w)["y"])
    want = _ref(x, w.T)
    _close(got, want, dt, k)
    wt = np.ascontiguousarray(w.T).T  # (the same values, columns k apart: the general flavour's GEMM)
    assert np.array_equal(np.asarray(runtime.call("lin", lib=built["lib"], x=x, w=wt)["y"]).view(np.uint8),
                          got.view(np.uint8))
    wide = np.zeros((n, 2 * m), t)
    runtime.call("lin", lib=built["lib"], x=x, w=w, y=wide[:, ::2])
    _same(built, dt, got, wide[:, ::2], want, k)
    assert not wide[:, 1::2].any()  # (nothing written between)


def test_f16_output_copy_kept_between_and_during_calls(built, rng):
    """The f16 GEMM into an f16 output keeps its f32 copy of C between calls (one buffer, taken and
    given back by atomic exchange): calls of growing and shrinking sizes one after another, then
    the same calls from four threads at once, each within the output's rounding of float64 and
    bitwise the same call's result alone."""
    from concurrent.futures import ThreadPoolExecutor

    shapes = [(300, 2 * 256 + 9, 70), (13, 7, 31), (700, 64, 500), (1, 1, 1), (300, 2 * 256 + 9, 70)]
    inputs = [(rng.standard_normal((n, k)).astype(np.float16), rng.standard_normal((m, k)).astype(np.float16))
              for n, k, m in shapes]

    def call(i: int) -> np.ndarray:
        x, w = inputs[i % len(inputs)]
        return np.asarray(runtime.call("lin", lib=built["lib"], x=x, w=w)["y"]).copy()

    alone = [call(i) for i in range(len(inputs))]
    for (x, w), got, (_, k, _) in zip(inputs, alone, shapes, strict=True):
        _close(got, _ref(x, w.T), "f16", k)
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(call, range(8 * len(inputs))))
    for i, got in enumerate(together):
        assert np.array_equal(got.view(np.uint16), alone[i % len(inputs)].view(np.uint16)), i


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize(("b", "r", "k", "m"), [(1, 1, 5, 3), (3, 17, 40, 33), (2, 150, 2 * 256 + 9, 70)])
def test_batched_rows_against_float64_and_the_plain_loop(built, rng, dt, b, r, k, m):
    """``lin_rows`` and ``grad_w`` on (b, r, k) inputs: evenly spaced rows (contiguous) on the GEMM,
    within the output's rounding of float64; rows that are not (a view skipping a row between
    batches) on the plain loop: the same bits."""
    t = DTYPES[dt]
    big = rng.standard_normal((b, r + 1, k)).astype(t)
    gbig = rng.standard_normal((b, r + 1, m)).astype(t)
    w = rng.standard_normal((m, k)).astype(t)
    x, g = np.ascontiguousarray(big[:, :r]), np.ascontiguousarray(gbig[:, :r])
    got = np.asarray(runtime.call("lin_rows", lib=built["lib"], x=x, w=w)["y"])
    assert got.shape == (b, r, m)
    want = _ref(x.reshape(-1, k), w.T).reshape(b, r, m)
    _close(got, want, dt, k)
    gaps = np.asarray(runtime.call("lin_rows", lib=built["lib"], x=big[:, :r], w=w)["y"])
    _same(built, dt, got, gaps, want, k)
    dw = np.asarray(runtime.call("grad_w", lib=built["lib"], g=g, x=x)["dw"])
    want = _ref(g.reshape(-1, m).T, x.reshape(-1, k))
    _close(dw, want, dt, b * r)
    gaps = np.asarray(runtime.call("grad_w", lib=built["lib"], g=gbig[:, :r], x=big[:, :r])["dw"])
    _same(built, dt, dw, gaps, want, b * r)


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    rng = np.random.default_rng(0)
    for t in (np.float32, ml_dtypes.bfloat16, np.float16):
        for b, r, k, m in ((1, 1, 1, 1), (2, 3, 5, 7), (3, 40, 300, 33), (2, 3, 5, 7)):  # (16-bit C: kept copies)
            big = rng.standard_normal((b, r + 1, k)).astype(t)
            gbig = rng.standard_normal((b, r + 1, m)).astype(t)
            w = rng.standard_normal((m, k)).astype(t)
            x = np.ascontiguousarray(big[:, :r])
            runtime.call("lin", lib=lib, x=x.reshape(-1, k), w=w)
            runtime.call("lin", lib=lib, x=x.reshape(-1, k), w=np.ascontiguousarray(w.T).T)
            runtime.call("lin", lib=lib, x=x.reshape(-1, k), w=w, y=np.zeros((b * r, 2 * m), t)[:, ::2])
            for xs in (x, big[:, :r]):
                runtime.call("lin_rows", lib=lib, x=xs, w=w)
            runtime.call("grad_w", lib=lib, g=np.ascontiguousarray(gbig[:, :r]), x=x)
            runtime.call("grad_w", lib=lib, g=gbig[:, :r], x=big[:, :r])
    print("done")
""")


def test_clean_under_asan_and_ubsan(built):
    """The three ops on both paths (the GEMM and the plain loop), every dtype, under ASan/UBSan."""
    assert_clean_under_sanitizers(built, SANITIZED)
