"""``prefetch-gathers`` (opgen/lower/gather_prefetch.py): rows read through an index table are
prefetched a few iterations ahead.

The pass's decisions are checked on the CPU pipeline's IR (a scatter-add's segment loop, a
gather's row loop; nothing where rows are not picked by a table); the built library's results
against numpy, for tables shorter than the prefetch distance and both stride flavours, and
under ASan and UBSan.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from opgen import registry, runtime
from opgen.binding import OpError
from opgen.emit import cpu
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.gather_prefetch import AHEAD
from tests.ops_dirs import built_ops
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

OPS = '''
"""A gather of rows."""
from opgen.dsl import *

N, D, V = dims("N D V")
T = dtype_var("T", f32, bf16)


@op
def rows_of(weight: Tensor[T, V, D], idx: Tensor[i64, N], *, out: Output[T, N, D]):
    """out[n] = 2 weight[idx[n]]"""
    return {"out": gather(weight, idx) * 2.0}
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("gather_prefetch"), "opgen_test_gather_prefetch", {"g.py": OPS}) as b:
        yield b


def _span_prefetches(name: str) -> list[s.PrefetchOp]:
    out = []
    for k in cpu.kernels(registry.get(name)).values():
        out += [o for o in k.walk() if isinstance(o, s.PrefetchOp) and o.span is not None]
    return out


def _checked_row(p: s.PrefetchOp) -> tuple[s.LoadOp, ir.AndOp]:
    """The table load giving ``p``'s row, and the condition guarding ``p``."""
    guard = p.parent_op()
    assert isinstance(guard, s.IfOp)
    cond = guard.cond.owner
    assert isinstance(cond, ir.AndOp)
    (row,) = [v for v in p.idx if isinstance(v.owner, s.LoadOp)]
    assert isinstance(row.owner, s.LoadOp)
    return row.owner, cond


def test_a_scatter_adds_gathered_rows_are_prefetched_ahead():
    """Embedding backward: the loop over an output row's segment prefetches, at its start, the
    grad row of position s + AHEAD of the sorted order (clamped to the table), checked in
    [0, N), over the whole row (span D)."""
    ps = _span_prefetches("embedding_dense_backward")
    assert ps, "no gathered-row prefetch"
    for p in ps:
        k = p.parent_op()
        while not isinstance(k, s.KernelOp):
            k = k.parent_op()
        assert k.param_names[p.buf] == "grad"
        tab, cond = _checked_row(p)
        pos = tab.idx[0].owner
        assert isinstance(pos, ir.MinOp)
        nxt = pos.lhs.owner
        assert isinstance(nxt, ir.AddOp) and ir.constant_int(nxt.rhs) == AHEAD
        loop = p.parent_op().parent_op()
        assert isinstance(loop, s.ForOp) and nxt.lhs is loop.iv and loop.kind.data == "serial"
        bounds = {c.owner.predicate.data for c in (cond.lhs, cond.rhs)}
        assert bounds == {"ge", "lt"}
        assert isinstance(p.span.owner, ir.DimOp) and p.span.owner.dim.data == "D"


def test_rows_read_in_order_are_not_gathered():
    """RMSNorm backward reads rows by its loop counter: no gathered-row prefetch."""
    assert _span_prefetches("rms_norm_backward") == []


def test_a_gathers_rows_are_prefetched_in_its_parallel_loop(built):
    """``gather(weight, idx)``: the parallel loop over n prefetches weight's row idx[n + AHEAD]
    (checked in [0, V)); the C of the unit-stride flavour walks the row a line at a time."""
    ps = _span_prefetches("rows_of")
    assert ps, "no gathered-row prefetch"
    p = ps[0]
    _, cond = _checked_row(p)
    assert any(isinstance(c.owner.rhs.owner, ir.DimOp) and c.owner.rhs.owner.dim.data == "V"
               for c in (cond.lhs, cond.rhs))
    src = (Path(built["out"]) / "cpu" / "rows_of.c").read_text()  # type: ignore[arg-type]
    for line_elems in (16, 32):  # (f32, bf16: one 64-byte line a prefetch)
        assert re.search(rf"q\d+ \+= {line_elems}\) OPGEN_PREFETCH\(p_weight, ", src)


CASES = [(1, 1, 1), (3, 5, 17), (AHEAD, 7, 64), (AHEAD + 1, 9, 33), (200, 50, 96)]


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n,v,d", CASES)
def test_gathered_rows_match_numpy(built, rng, dt, n, v, d):
    """Tables shorter and longer than the prefetch distance; a contiguous weight and a view
    with a strided last axis (the general flavour); repeated and boundary indices."""
    w = rng.standard_normal((v, d)).astype(dt)
    idx = rng.integers(0, v, n).astype(np.int64)
    idx[0], idx[-1] = v - 1, 0
    want = (w.astype(np.float32)[idx] * 2).astype(dt)
    for weight in (w, np.asfortranarray(w)):
        got = runtime.call("rows_of", lib=built["lib"], weight=weight, idx=idx)["out"]
        assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def test_an_index_out_of_range_is_refused_before_any_row_is_read(built, rng):
    """An index past V: the index status, nothing written (the table is checked before the
    loop that prefetches through it)."""
    w = rng.standard_normal((6, 8)).astype(np.float32)
    out = np.full((5, 8), 7.0, np.float32)
    for bad in (6, -1, 1 << 40):
        idx = np.array([0, 1, 2, 3, bad], np.int64)
        with pytest.raises(OpError, match="index"):
            runtime.call("rows_of", lib=built["lib"], weight=w, idx=idx, out=out)
        assert (out == 7.0).all()


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    rng = np.random.default_rng(0)
    for dt in (np.float32, ml_dtypes.bfloat16):
        for n, v, d in ((1, 1, 1), (3, 2, 5), (9, 4, 40), (300, 64, 128)):
            w = rng.standard_normal((v, d)).astype(dt)
            idx = rng.integers(0, v, n).astype(np.int64)
            for weight in (w, np.asfortranarray(w)):
                runtime.call("rows_of", lib=lib, weight=weight, idx=idx)
    print("done")
""")


def test_gathered_rows_are_clean_under_asan_and_ubsan(built):
    """The gather with tables shorter than the distance, both flavours, under AddressSanitizer
    and UndefinedBehaviorSanitizer (the seed scatter-adds' cases: tests/test_cpu_sanitizers.py)."""
    assert_clean_under_sanitizers(built, SANITIZED)
