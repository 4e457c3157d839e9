"""The ``fuse-reductions`` pass: independent sibling reductions over one range become one loop;
a reduction that needs another's result (softmax: max, then sum of exp(x - max)) stays apart.
Numerical results of the fused kernels are checked against the oracle by the CPU and emulated
CUDA tests of every seed op (RMSNorm backward is the seed op this pass changes)."""

from __future__ import annotations

import pytest

from opgen import registry
from opgen.emit import cpu
from opgen.lower import sched as s
from opgen.passes import pipeline

STATS = '''\
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32)


@op
def row_stats(x: Tensor[T, N, D], g: Tensor[T, N, D], *, y: Output[T, N, D]):
    """softmax(x) plus two independent row sums."""
    m = max(x, axis=-1, keepdims=True)
    e = exp(x - m)
    s = sum(e, axis=-1, keepdims=True)
    q = sum(g * x, axis=-1, keepdims=True)
    r = sum(g, axis=-1, keepdims=True)
    return {"y": e / s + q * r}
'''


def reduce_loops(k: s.KernelOp) -> list[s.ForOp]:
    return [o for o in k.walk() if isinstance(o, s.ForOp) and o.kind.data == "reduce"]


def accumulators(loop: s.ForOp) -> set[str]:
    return {o.kind.data for o in loop.walk() if isinstance(o, s.AccumOp)}


def fused(o: object, target: str) -> list[s.KernelOp]:
    """The op's kernels right after fuse-reductions (the CPU's jam-rows later copies a row's
    loops for the second row of a pair: tests/test_jam_rows.py)."""
    m = pipeline.run(o.module(), target, until="fuse-reductions")  # type: ignore[attr-defined]
    return [k for k in m.body.block.ops if isinstance(k, s.KernelOp)]


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_rms_norm_backward_row_reductions_fuse(target):
    (k,) = fused(registry.get("rms_norm_backward"), target)
    loops = reduce_loops(k)
    assert len(loops) == 1, "sum(x*x) and sum(dy*w*x) over a row should be one loop"
    assert sum(isinstance(o, s.AccumOp) for o in loops[0].walk()) == 2


def test_dependent_reductions_stay_apart(op_files):
    o = op_files({"row_stats.py": STATS})["row_stats"]
    (k,) = cpu.kernels(o, "cpu").values()
    (unfused,) = cpu.kernels(o, "cpu", fuse=False).values()
    assert len(reduce_loops(unfused)) == 4
    loops = reduce_loops(k)
    # max | sum exp(x - max) + sum g*x + sum g: the max must finish before the exp sum starts
    assert [accumulators(lp) for lp in loops] == [{"max"}, {"sum"}]
    assert sum(isinstance(x, s.AccumOp) for x in loops[1].walk()) == 3
    k.verify()


def test_reductions_reading_a_rows_saved_statistics_fuse(op_files):
    """LayerNorm backward from saved statistics: the row's mean and rstd are loaded between the
    two row sums (sum dy*w and sum dy*w*xhat); those loads move above the first loop, so the sums
    fuse (one read of the row)."""
    from tests.test_new_op_backends import LN_CAST

    o = op_files({"ln.py": LN_CAST})["ln_cast_backward"]
    for k in fused(o, "cpu"):
        loops = reduce_loops(k)
        assert len(loops) == 1, "the two row sums should be one loop"
        assert sum(isinstance(x, s.AccumOp) for x in loops[0].walk()) == 2
        k.verify()
