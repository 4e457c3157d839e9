"""``column-strips``: a parallel loop over columns that sums each column down a serial loop runs
strips of columns side by side, so that the C compiler vectorises it.

Column reductions sum fixed 32-row partials (lower-to-loops); their last step is::

    P: sched.for parallel j = 0 to D {
        A = sched.alloc zero                      // a register scratch (rank 0)
        R: sched.for serial c = lo to hi { ... t[c, j] ...; sched.accum sum v, A[] }
        post                                      // loads of A[], a store into out[..., j]
    }

Each iteration walks a column of ``t`` with a stride of a row: GCC does not vectorise the outer
loop, so RMSNorm backward's dgamma took 1 ms of its 8 (bf16, 8192x4096, 2 threads; 13% of the
kernel under ``perf``). This pass rewrites it into strips of ``WIDTH`` columns::

    sched.for parallel b = 0 to cdiv(D, WIDTH) {
        j0 = b * WIDTH; n = min(WIDTH, D - j0)
        A' = sched.alloc zero [WIDTH]             // one accumulator a column
        sched.for serial c = lo to hi { sched.for parallel l = 0 to n { j = j0 + l; ...; accum A'[l] } }
        sched.for parallel l = 0 to n { j = j0 + l; post, loads of A[] reading A'[l] }
    }

whose inner loops map-cpu makes ``simd`` loops. Every column still sums its rows in the same
order, one at a time, so the bits are the same. Only that shape is rewritten: one zeroed rank-0
scratch, one serial loop that only accumulates into it (with sums), the counter used by nothing
but indices whose last entry it is (loads in the serial loop, loads and stores after it), and
no other loop, branch, check or matmul in the body.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.lower import sched as s

#: columns per strip: four vectors of 16 f32 lanes
WIDTH = 64


def _indexes_last(op: Operation, iv: SSAValue) -> bool:
    """``op`` uses ``iv`` only as the last index of a load or store (or not at all)."""
    if iv not in op.operands:
        return True
    if isinstance(op, s.LoadOp | s.StoreOp):
        idx = list(op.idx)
        return idx[-1] is iv and iv not in idx[:-1] and not (isinstance(op, s.StoreOp) and op.value is iv)
    return False


def _shape(p: s.ForOp) -> tuple[s.AllocOp, s.ForOp, list[Operation]] | None:
    """(scratch, serial loop, post) when ``p`` has the rewritten shape (module docstring)."""
    if p.kind.data != "parallel" or ir.constant_int(p.lo) != 0:
        return None
    ops = list(p.body.block.ops)
    loops = [o for o in ops if isinstance(o, s.ForOp)]
    allocs = [o for o in ops if isinstance(o, s.AllocOp)]
    if len(loops) != 1 or len(allocs) != 1 or ops.index(allocs[0]) > ops.index(loops[0]):
        return None
    (a,), (r,) = allocs, loops
    t = s.buf_type(a.result)
    if t.role.data != "local" or t.rank != 0 or not (a.zero is not None and a.zero.data) or r.kind.data != "serial":
        return None
    if any(isinstance(o, (s.ForOp, s.IfOp, s.AllocOp, *s.OPAQUE)) for o in r.body.block.ops):
        return None
    pre = ops[:ops.index(a)] + ops[ops.index(a) + 1:ops.index(r)]
    post = ops[ops.index(r) + 1:]
    if pre or any(isinstance(o, (s.IfOp, s.AccumOp, *s.OPAQUE)) for o in post):
        return None
    for use in a.result.uses:  # the scratch: sums in the serial loop, loads after it
        u = use.operation
        inside = isinstance(u, s.AccumOp) and u.kind.data == "sum" and u.parent_op() is r and u.buf is a.result
        if not (inside or (isinstance(u, s.LoadOp) and u in post)):
            return None
    if not all(_indexes_last(o, p.iv) for o in [*r.body.block.ops, *post]):
        return None
    if not any(isinstance(o, s.StoreOp) for o in post):
        return None
    return a, r, post


def _rewrite(p: s.ForOp, a: s.AllocOp, r: s.ForOp, post: list[Operation]) -> None:
    width = ir.ConstantOp(WIDTH, "i64")
    zero = ir.ConstantOp(0, "i64")
    strips = ir.CeilDivOp(p.hi, width.result)
    q = s.ForOp(zero.result, strips.result, "parallel", "b")
    for op in (width, zero, strips):
        Rewriter.insert_op(op, InsertPoint.before(p))
    j0 = ir.MulOp(q.iv, width.result)
    left = ir.SubOp(p.hi, j0.result)
    n = ir.MinOp(width.result, left.result)
    acc = s.AllocOp(s.BufType.make([str(WIDTH)], s.buf_type(a.result).dtype, "local"), [width.result], zero=True)
    rows = s.ForOp(r.lo, r.hi, "serial", "c")
    lanes = s.ForOp(zero.result, n.result, "parallel", "l")
    rows.body.block.add_op(lanes)
    tail = s.ForOp(zero.result, n.result, "parallel", "l")
    q.body.block.add_ops([j0, left, n, acc, rows, tail])

    def fill(loop: s.ForOp, ops: list[Operation], mapping: dict[SSAValue, SSAValue]) -> None:
        """``ops`` cloned into ``loop`` (column j0 + its counter; the scratch's lane)."""
        j = ir.AddOp(j0.result, loop.iv)
        loop.body.block.add_op(j)
        mapping[p.iv] = j.result
        for op in ops:
            if isinstance(op, s.AccumOp) and op.buf is a.result:
                new: Operation = s.AccumOp(op.kind.data, mapping.get(op.value, op.value), acc.result, [loop.iv])
            elif isinstance(op, s.LoadOp) and op.buf is a.result:
                new = s.LoadOp(acc.result, [loop.iv])
                mapping[op.result] = new.results[0]
            else:
                new = op.clone(value_mapper=mapping)
            loop.body.block.add_op(new)

    mapping: dict[SSAValue, SSAValue] = {r.iv: rows.iv}
    fill(lanes, list(r.body.block.ops), mapping)
    fill(tail, post, mapping)
    Rewriter.insert_op(q, InsertPoint.before(p))
    p.detach()
    p.erase()


class ColumnStrips(ModulePass):
    """Run column sums in strips of columns side by side (module docstring)."""

    name = "column-strips"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for p in [o for o in op.walk() if isinstance(o, s.ForOp)]:
            found = _shape(p)
            if found:
                _rewrite(p, *found)
