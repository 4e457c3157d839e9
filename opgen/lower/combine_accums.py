"""``combine-accums``: sums into one element of a column accumulator, in one iteration of a
vector loop, read it once and write it once (CPU).

jam-rows runs several rows in one loop over the columns, each adding its term into the same
accumulator element (a middle-axis sum's ``acc[d]``, BatchNorm's column sums)::

    sched.for parallel %d {
      %v0 = ... row i0 ...;  sched.accum sum %v0, %acc[%d]
      %v1 = ... row i1 ...;  sched.accum sum %v1, %acc[%d]
      ...
    }

GCC 12 keeps the element in a register between those additions but stores it after each: the
loads of the caller's rows in between are through pointers it does not know apart from the
accumulator (restrict does not survive into OpenMP's outlined functions), so 8 rows at a time
stored each 16-lane vector 8 times (under ``perf``, the stores took most of a middle-axis sum's
samples). This pass reads the element once, adds the terms in the same order, and writes it
once::

    sched.for parallel %d {
      %a = sched.load %acc[%d]
      %v0 = ...;  %s0 = opgen.add %a, %v0
      %v1 = ...;  %s1 = opgen.add %s0, %v1
      ...
      sched.store %sN, %acc[%d]
    }

The additions are the same (``(acc + v0) + v1 ...``, each rounded to the accumulator's f32 or
f64), so the bits are too. Only where nothing else in the loop touches the accumulator: a
``parallel`` loop's direct ``sched.accum sum`` ops (two or more) into a ``local`` or ``temp``
buffer of f32 or f64 defined outside the loop, of values of that dtype, all at the same
indices, which hold the loop's counter (each iteration its own element).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s

#: the accumulator dtypes whose additions the pass writes out (no rounding to a narrower storage
#: type between them)
DTYPES = ("f32", "f64")


def _runs(loop: s.ForOp) -> list[list[s.AccumOp]]:
    """The accumulations of ``loop``'s body the pass combines, one list per accumulator (module
    docstring)."""
    by_buf: dict[SSAValue, list[s.AccumOp]] = {}
    for o in loop.body.block.ops:
        if isinstance(o, s.AccumOp):
            by_buf.setdefault(o.buf, []).append(o)
    out = []
    for buf, accs in by_buf.items():
        t = s.buf_type(buf)
        if (len(accs) < 2 or t.role.data not in ("local", "temp") or t.dtype not in DTYPES
                or not s.defined_outside(loop, buf)
                or any(ir.tensor_type(a.value).dtype != t.dtype for a in accs)):
            continue
        idx = list(accs[0].idx)
        if loop.iv not in idx or any(a.kind.data != "sum" or list(a.idx) != idx for a in accs):
            continue
        if any(use.operation not in accs for use in buf.uses if loop.is_ancestor(use.operation)):
            continue  # (read or written otherwise in the loop)
        out.append(accs)
    return out


def _combine(accs: list[s.AccumOp]) -> None:
    first = accs[0]
    block = first.parent_block()
    assert block is not None
    load = s.LoadOp(first.buf, list(first.idx))
    block.insert_op_before(load, first)
    total: SSAValue = load.result
    for a in accs:
        add = ir.AddOp(total, a.value)
        block.insert_op_before(add, a)
        total = add.result
    block.insert_op_after(s.StoreOp(total, first.buf, list(first.idx)), accs[-1])
    for a in accs:
        a.detach()
        a.erase()


class CombineAccums(ModulePass):
    """One read and one write of an accumulator element a vector loop's iteration sums into
    several times (module docstring)."""

    name = "combine-accums"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for loop in [o for o in op.walk() if isinstance(o, s.ForOp) and o.kind.data == "parallel"]:
            for accs in _runs(loop):
                _combine(accs)
