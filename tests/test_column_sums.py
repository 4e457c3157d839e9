"""Sums over a leading or middle axis with more than one kept axis after it (a positional
embedding's gradient summed over the batch: (B, N, D) -> (N, D)): the kept axes but the last are
walked outside the chunks of rows (lower-to-loops' and row groups' ``hoist``), each unit a row of
partials, and map-cpu splits the kept rows and the chunks among the threads together
(``collapse(2)``). Before, one walk of whole (N, D) slices kept a slice of partials per thread
and ran on one thread where B fits in one chunk (B = 8, N x D = 4M f32: 0.2x PyTorch). Against
PyTorch (float64 and same-dtype) and the oracle, every row count around the chunks, strided
inputs, the same bits on 1 and 3 threads; clean under ASan/UBSan."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest

from opgen import oracle, runtime
from opgen.emit import cpu
from opgen.lower import cpu_map
from opgen.lower import sched as s
from opgen.lower.to_loops import CHUNKS, COLUMN_CHUNK
from tests.ops_dirs import built_ops, built_unfused, top_loops
from tests.reference import assert_close_policy, rounded, t64, tt
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

SUM_OPS = '''
"""Sums over a leading or middle axis, kept axes after it."""
from opgen.dsl import *

A, B, M, N, D = dims("A B M N D")
T = dtype_var("T", f32, bf16, f16)


@op
def sum_lead(x: Tensor[T, B, N, D], *, y: Output[T, N, D]):
    """y = x summed over its leading axis (a row group's column sum)."""
    return {"y": sum(cast(x, f32), axis=0)}


@op
def sum_lead_scaled(x: Tensor[T, B, N, D], *, y: Output[T, N, D], z: Output[T, B, N, D]):
    """The sum and an output of the same rows in one walk."""
    xf = cast(x, f32)
    return {"y": sum(xf, axis=0), "z": xf * 2.0}


@op
def sum_middle(x: Tensor[T, A, M, N, D], *, y: Output[T, A, N, D]):
    """y = x summed over axis 1 (lower-to-loops' column sums, axes kept before and after)."""
    return {"y": sum(cast(x, f32), axis=1)}


@op
def sum_cols(x: Tensor[T, B, D], *, y: Output[T, D]):
    """A 2-D column sum: nothing to walk outside the chunks."""
    return {"y": sum(cast(x, f32), axis=0)}
'''

#: leading-axis lengths around the chunks of rows
ROWS = (1, COLUMN_CHUNK - 1, COLUMN_CHUNK, COLUMN_CHUNK + 1, 2 * COLUMN_CHUNK + 7)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("colsums"), "opgen_test_colsums", {"sum_ops.py": SUM_OPS}) as b:
        yield b


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The same ops built with lower-to-loops' unfused lowering (no row groups: its own column
    sums)."""
    with built_unfused(tmp_path_factory.mktemp("unfused"), "opgen_test_colsums_unfused", {"sum_ops.py": SUM_OPS}) as b:
        yield b


def _local_ranks(loop: s.ForOp) -> list[int]:
    return [s.buf_type(a.result).rank for a in loop.walk() if isinstance(a, s.AllocOp)
            and s.buf_type(a.result).role.data == "local"]


def test_kept_rows_walked_outside_the_chunks(built):
    """The leading-axis sums: an ``omp_for`` over N collapsed with the loop over chunks (tagged
    ``chunks``) in its body, each unit's partials one row (rank 1, not the (N, D) slice); the sum
    over axis 1 of a 4-D tensor walks A and N outside its chunks; a 2-D column sum keeps its
    chunks as the parallel loop, not collapsed, its partials a row as before."""
    for name in ("sum_lead", "sum_lead_scaled"):
        walk = top_loops(built, name)[0]
        assert cpu_map.cpu_mapping(walk) == s.CpuMapping.OMP_FOR and cpu_map.COLLAPSE in walk.attributes, name
        (chunks,) = [o for o in walk.body.block.ops if isinstance(o, s.ForOp)]
        assert CHUNKS in chunks.attributes and chunks.kind.data == "parallel"
        assert _local_ranks(chunks) == [1], name
        # one chunk (B <= 32): each unit's sums straight into y; else into the partials
        (branch,) = [o for o in chunks.body.block.ops if isinstance(o, s.IfOp)]
        k = walk.parent_op()
        names = k.param_names  # type: ignore[union-attr]
        into = [{names.get(st.buf, s.buf_type(st.buf).role.data) for st in r.walk() if isinstance(st, s.StoreOp)}
                for r in (branch.then, branch.otherwise)]
        assert into == [{"y"}, {"temp"}], name
    walk = top_loops(built, "sum_cols")[0]
    assert CHUNKS in walk.attributes and cpu_map.COLLAPSE not in walk.attributes
    assert _local_ranks(walk) == [1]
    text = cpu.op_source(built["ops"]["sum_lead"])  # type: ignore[index]
    assert "#pragma omp parallel for collapse(2) schedule(static)" in text


def test_unfused_column_sums_walk_kept_rows_outside_the_chunks(unfused):
    """lower-to-loops' own column sums (where no row group forms; here the library built without
    fusion): the sum over axis 1 of a 4-D tensor walks A and N outside its chunks (the loop over
    A then N, both parallel), each unit's partials one row; the leading-axis sum's N loop
    collapsed with its chunks'."""
    walk = top_loops(unfused, "sum_middle")[0]
    (chunks,) = [o for o in walk.walk() if isinstance(o, s.ForOp) and CHUNKS in o.attributes]
    n_loop = chunks.parent_op()
    assert isinstance(n_loop, s.ForOp) and n_loop.parent_op() is walk and n_loop.kind.data == "parallel"
    assert cpu_map.COLLAPSE not in walk.attributes and _local_ranks(chunks) == [1]
    walk = top_loops(unfused, "sum_lead")[0]
    assert cpu_map.COLLAPSE in walk.attributes
    (chunks,) = [o for o in walk.body.block.ops if isinstance(o, s.ForOp)]
    assert CHUNKS in chunks.attributes and _local_ranks(chunks) == [1]


def _ref(x: np.ndarray, axis: int, T: str) -> tuple[object, object]:
    """(float64 sum, PyTorch's same-dtype sum: accumulated in f32, rounded once)."""
    same = tt(x, T)
    return t64(x).sum(axis), same.float().sum(axis).to(same.dtype)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
def test_sums_against_pytorch(built, unfused, rng, T, fused):
    """Every leading length around the chunks, N and D of 1 and more, contiguous and strided
    (every other element of the last axis), against PyTorch float64 (same-dtype PyTorch setting
    the margin) and the oracle; the row-group op's second output too; the library of row groups
    and the unfused one (lower-to-loops' own column sums)."""
    lib = (built if fused else unfused)["lib"]
    for b in ROWS:
        for n, d in ((1, 1), (3, 17), (2, 40)):
            x = rounded(rng.standard_normal((b, n, 2 * d)) * 2, T)
            for xs in (np.ascontiguousarray(x[..., :d]), x[..., ::2]):
                what = f"{T} B={b} N={n} D={d} strided={xs.strides[-1] != xs.itemsize}"
                ref, same = _ref(xs, 0, T)
                got = runtime.call("sum_lead", lib=lib, x=xs)["y"]
                assert_close_policy(got, ref, same, T, "sum_lead " + what)
                orc = oracle.run(built["ops"]["sum_lead"], x=xs.copy())["y"]  # type: ignore[index]
                assert_close_policy(orc, ref, same, T, "oracle sum_lead " + what)
                both = runtime.call("sum_lead_scaled", lib=lib, x=xs)
                assert both["y"].tobytes() == got.tobytes(), what
                assert np.array_equal(both["z"].astype(np.float64), xs.astype(np.float64) * 2), what
                x4 = rounded(rng.standard_normal((2, b, n, d)), T)
                ref4, same4 = _ref(x4, 1, T)
                got4 = runtime.call("sum_middle", lib=lib, x=x4)["y"]
                assert_close_policy(got4, ref4, same4, T, "sum_middle " + what)


def test_the_same_bits_on_1_and_3_threads(built, rng):
    """Which thread adds which unit never changes a sum: 1 and 3 threads give the same bits
    (collapsed units split differently), and the walk's sums are those of the 2-D column sum of
    the same rows (the same additions in the same order; with one chunk stored straight, where
    the 2-D sum adds its one partial to +0), columns of -0 included."""
    gomp = ctypes.CDLL("libgomp.so.1")
    team = gomp.omp_get_max_threads()
    lib = built["lib"]
    for b in ROWS:
        x = rounded(rng.standard_normal((b, 5, 24)), "f32")
        x[:, 4] = -0.0  # (a column of -0: +0 summed in partials or straight)
        got = {}
        for threads in (1, 3):
            gomp.omp_set_num_threads(threads)
            try:
                got[threads] = runtime.call("sum_lead", lib=lib, x=x)["y"]
            finally:
                gomp.omp_set_num_threads(team)
        assert got[1].tobytes() == got[3].tobytes(), b
        for n in range(5):
            col = runtime.call("sum_cols", lib=lib, x=np.ascontiguousarray(x[:, n]))["y"]
            assert col.tobytes() == got[1][n].tobytes(), (b, n)


SANITIZED = """
import sys, numpy as np, ml_dtypes
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(0)
for dt in (np.float32, ml_dtypes.bfloat16, np.float16):
    for b in (1, 31, 32, 33, 71):
        for n, d in ((1, 1), (3, 17), (2, 40)):
            x = rng.standard_normal((b, n, 2 * d)).astype(dt)
            runtime.call("sum_lead", lib=lib, x=x[..., ::2])
            runtime.call("sum_lead_scaled", lib=lib, x=np.ascontiguousarray(x[..., :d]))
            runtime.call("sum_middle", lib=lib, x=rng.standard_normal((2, b, n, d)).astype(dt))
            runtime.call("sum_cols", lib=lib, x=np.ascontiguousarray(x[:, 0]))
print("done")
"""


def test_column_sums_are_clean_under_asan_and_ubsan(built):
    """The walks (lengths around the chunks, strided rows, every dtype) under ASan/UBSan."""
    assert_clean_under_sanitizers(built, SANITIZED)
