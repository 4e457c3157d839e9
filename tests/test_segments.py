"""Scatter-add and scale-by-frequency over segment tables (``sched.segments``).

The indices are sorted once (stably) and each output row sums its run. The table layout is the
runtime's choice from the sizes alone: a dense start table (rows + 1 words) when the table is not
much larger than the number of indices, else the sorted indices searched by bisection (3n words on
the CPU) — so the workspace grows with the indices, never with the table (outside testing found
12 bytes per table row: 24 GiB for V = 2^31 + 1 and one index). Both layouts must give the
oracle's result (which PyTorch checks elsewhere), bitwise the same as each other.
"""

from __future__ import annotations

import numpy as np
import pytest

from opgen import oracle, registry, runtime
from tests.cpu_cases import c_call, filled, floats, set_shape


def dense(rows: int, n: int) -> bool:
    """The CPU runtime's layout rule (templates/cpu/opgen_seg.h.j2), restated."""
    return rows <= 4096 or (rows - 4096) // 4 <= n


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("V", [9000, 300])  # sparse and dense tables for 12 indices
def test_embedding_dense_backward_both_layouts(rng, T, scale, V):
    idx = rng.integers(0, V, (3, 4))
    idx[0, :3] = idx[2, 1]  # duplicates: summed in index order, counted by frequency
    idx[1, 0] = V - 1
    assert dense(V, idx.size) == (V == 300)
    grad = floats(rng, (3, 4, 5), T)
    args = {"grad": grad, "indices": idx, "num_weights": V, "padding_idx": int(idx[1, 1]),
            "scale_grad_by_freq": scale}
    ref = oracle.run(registry.get("embedding_dense_backward"), **args)["out"]
    got = runtime.call("embedding_dense_backward", **args)["out"]
    assert np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-6, atol=1e-7)
    assert np.count_nonzero(np.abs(got.astype(np.float32)).sum(axis=1)) <= idx.size


def test_layouts_give_identical_bits(rng):
    """The same rows through a dense and a sparse table: one row block, compared bitwise."""
    n = 40
    idx = rng.integers(0, 50, n)
    grad = floats(rng, (n, 7), "f32")
    small = runtime.call("embedding_dense_backward", grad=grad, indices=idx, num_weights=50,
                         scale_grad_by_freq=True)["out"]
    big = runtime.call("embedding_dense_backward", grad=grad, indices=idx, num_weights=20000,
                       scale_grad_by_freq=True)["out"]
    assert not dense(20000, n) and dense(50, n)
    assert big[:50].tobytes() == small.tobytes() and not big[50:].any()


@pytest.mark.parametrize("V", [6000, 5])
def test_other_scatter_ops_both_layouts(rng, V):
    args = {"indices": rng.integers(0, V, 17).astype(np.uint32), "weight": filled((V, 6), "f32"),
            "grad": floats(rng, (17, 6), "f32")}
    ref = oracle.run(registry.get("embedding_bw"), **args)["out"]
    got = runtime.call("embedding_bw", **args)["out"]
    assert np.array_equal(got, ref)
    i1 = rng.integers(0, V, 23)
    i1[:4] = i1[5]
    eb = {"dtable1": filled((V, 3), "f32", 1.5), "dy": floats(rng, (23, 3), "f32"), "i1": i1, "alpha1": -0.5,
          "dtable1_acc": True}
    ref = oracle.run(registry.get("embedding_backward"), **eb)["dtable1"]
    got = runtime.call("embedding_backward", **eb)["dtable1"]
    assert np.allclose(got, ref, rtol=1e-6, atol=1e-7)


def _size(V: int, N: int, scale: bool = True) -> tuple[int, int]:
    """(status, workspace bytes) of embedding_dense_backward for a (V, 1) f32 table and N indices,
    without allocating the table (its descriptor claims V rows; sizing reads no data)."""
    args = {"grad": filled((N, 1), "f32"), "indices": np.zeros(N, np.int64), "num_weights": V,
            "padding_idx": -1, "scale_grad_by_freq": scale, "out": filled((1, 1), "f32")}
    return c_call("embedding_dense_backward", args, {"out": lambda d, h: set_shape(d, h, (V, 1))},
                  size_query=True)


def test_zeroed_scratch_is_cleared_by_vector_stores():
    """A kernel's zeroed scratch (the scatter-add's accumulator row, cleared for every output row
    hit) is cleared by the runtime's opgen_zero (vector stores), never by memset: glibc's memset
    of 4 KiB is `rep stosb`, which waited behind the kernel's streaming stores (docs/backend_cpu.md)."""
    from opgen.emit import cpu

    text = cpu.op_source(registry.get("embedding_dense_backward"))
    assert "opgen_zero(l" in text
    assert not any(line.strip().startswith("memset(l") for line in text.splitlines())

@pytest.mark.parametrize("scale", [False, True])
def test_workspace_grows_with_the_indices_not_the_table(scale):
    st, small = _size(100, 1, scale)
    assert st == 0
    st, huge = _size(2**31 + 1, 1, scale)
    assert st == 0 and huge <= small + 64, f"{huge} bytes of workspace for one index ({small} for 100 rows)"
    st, many = _size(2**31 + 1, 1000, scale)
    assert st == 0 and many < 1000 * 64 + 64 * 1024


SCATTER_EXP = '''\
"""A scatter-add whose epilogue does not map 0 to 0: rows no index hits are exp(0) + bias."""

from opgen.dsl import *

N, D, V = dims("N D V")
T = dtype_var("T", f32, bf16)


@op
def scatter_exp(grad: Tensor[T, N, D], idx: Tensor[i64, N], bias: Tensor[T, V, D], rows: V, *,
                out: Output[T, V, D], total: Output[f32, V]):
    """``out = exp(sum of grad's rows into rows idx) + bias``; ``total``: 1 + the sums of those
    rows' elements (a scalar per row: its scratch a register)."""
    return {"out": cast(exp(scatter_add(cast(grad, f32), idx, V)) + cast(bias, f32), T),
            "total": 1.0 + scatter_add(sum(cast(grad, f32), axis=1), idx, V)}
'''


@pytest.fixture(scope="module")
def scatter_exp(tmp_path_factory):
    from tests.ops_dirs import built_ops

    with built_ops(tmp_path_factory.mktemp("segops"), "opgen_test_segops", {"scatter_exp.py": SCATTER_EXP}) as b:
        yield b


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("V", [9000, 40])  # sparse and dense tables
def test_empty_segments_take_the_epilogue_of_zero(scatter_exp, rng, T, V):
    """empty-ranges (opgen/lower/empty_ranges.py) gives rows no index hits a branch that stores
    the epilogue of the empty sum: here exp(0) + bias, so a row left 0 (or its scratch left
    uncleared) shows. Against the oracle, rows hit and not hit, both table layouts."""
    from opgen.lower import sched as s
    from opgen.passes import pipeline

    o = scatter_exp["ops"]["scatter_exp"]
    m = o.module()
    pipeline.run(m, "cpu")
    assert any(isinstance(op, s.IfOp) for op in m.walk()), "the empty range was not specialised"
    n = 25
    idx = rng.integers(0, min(V, 30), n)
    idx[:4] = idx[7]
    args = {"grad": floats(rng, (n, 6), T), "idx": idx, "bias": floats(rng, (V, 6), T), "rows": V}
    refs = oracle.run(o, **args)
    ref = refs["out"]
    res = runtime.call("scatter_exp", lib=scatter_exp["lib"], **args)
    got = res["out"]
    assert np.allclose(res["total"], refs["total"], rtol=1e-5, atol=1e-6)
    hit = np.zeros(V, bool)
    hit[idx] = True
    assert hit.any() and not hit.all()
    assert np.allclose(got.astype(np.float64), ref.astype(np.float64), rtol=1e-6, atol=1e-7)
    # and again into a given output holding a sentinel: every row is written, hit or not
    out = filled((V, 6), T)
    runtime.call("scatter_exp", lib=scatter_exp["lib"], **args, out=out, total=filled(V, "f32"))
    assert np.allclose(out.astype(np.float64), ref.astype(np.float64), rtol=1e-6, atol=1e-7)


def test_scatter_exp_writes_every_output_element(scatter_exp):
    """Rows no index hits are written too (the epilogue of the empty sum): the Python API
    allocates the outputs uninitialised (tests/outputs_written.py)."""
    from tests.outputs_written import assert_every_output_written

    assert_every_output_written(scatter_exp["ops"], scatter_exp["lib"])

