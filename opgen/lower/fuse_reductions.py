"""``fuse-reductions``: merge sibling ``reduce`` loops over the same range into one loop.

RMSNorm backward, for instance, lowers to two reductions over a row (``sum x*x`` and
``sum dy*w*x``) that do not depend on each other; fused, the row is read once and a target
reduces both accumulators together (one CPU lane loop, one pass + one combine on a GPU block).

Each accumulator keeps its own summation order (iterations in increasing order, the target's
lanes unchanged), so fusing never changes a result bit. Two loops ``A`` and ``B`` fuse when:

* both are ``sched.for`` of kind ``reduce`` with the same ``lo``/``hi`` values, neither holds
  a nested loop, matmul or check, and every update in them is an accumulation into a rank-0
  ``local`` buffer allocated outside the loop;
* ``B`` neither reads nor updates what ``A`` updates, and ``A`` does not read what ``B``
  updates;
* the operations between them can be moved: allocations, pure scalar code and loads from
  buffers that neither ``A`` nor any of them writes (a row's saved statistics), over values
  defined before ``A``, go above ``A``; everything else goes below ``B``, which must not use
  its results nor touch what it stores, nor store into what it reads.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir.dialect import TensorType
from opgen.lower import sched as s


def _uses(op: Operation) -> set[SSAValue]:
    """Values ``op`` and its nested operations use."""
    return {v for o in op.walk() for v in o.operands}


def _scalar_code(op: Operation) -> bool:
    return (bool(op.results) and isinstance(op.results[0].type, TensorType)
            and not isinstance(op, s.LoadOp | s.LoadBitOp) and not op.regions)


def _simple_reduction(loop: Operation) -> bool:
    if not (isinstance(loop, s.ForOp) and loop.kind.data == "reduce"):
        return False
    for o in loop.walk():
        if o is loop:
            continue
        if isinstance(o, s.ForOp | s.BufferMatmulOp | s.RequireOp | s.SegmentsOp | s.AllocOp):
            return False
        if isinstance(o, s.StoreOp):
            return False
        if isinstance(o, s.AccumOp):
            t = s.buf_type(o.buf)
            if t.rank or t.role.data != "local":
                return False
    return True


def _try_fuse(a: s.ForOp, b: s.ForOp, between: list[Operation]) -> bool:
    """Fuse ``b`` into ``a`` (``between`` are the operations separating them)."""
    if a.lo != b.lo or a.hi != b.hi or not (_simple_reduction(a) and _simple_reduction(b)):
        return False
    ra, wa = s.effects(a)
    rb, wb = s.effects(b)
    if wa & (rb | wb) or wb & ra:
        return False
    above: list[Operation] = []
    below: list[Operation] = []
    moved_below: set[SSAValue] = set()
    written = wa | {x for op in between for x in s.effects(op)[1]}
    # loads move up only while nothing here writes a caller's buffer (an output may alias an input)
    loads_move = all(isinstance(x.owner, s.AllocOp) for x in written)
    for op in between:
        hoistable = _scalar_code(op) or (loads_move and isinstance(op, s.LoadOp) and op.buf not in written)
        if isinstance(op, s.AllocOp) or (hoistable and not set(op.operands) & moved_below):
            above.append(op)
            continue
        if op.regions or isinstance(op, s.RequireOp | s.BufferMatmulOp | s.SegmentsOp):
            return False
        r, w = s.effects(op)
        if w & (rb | wb) or r & wb:
            return False
        below.append(op)
        moved_below |= set(op.results)
    if _uses(b) & moved_below:
        return False
    parent = a.parent_block()
    assert parent is not None
    for op in above:
        op.detach()
        parent.insert_op_before(op, a)
    body: Block = b.body.block
    b.iv.replace_all_uses_with(a.iv)
    for op in list(body.ops):
        op.detach()
        a.body.block.add_op(op)
    b.detach()
    b.erase()
    return True


def fuse_block(block: Block) -> int:
    """Fuse reductions in ``block`` and, recursively, in nested blocks; returns how many."""
    n = 0
    changed = True
    while changed:
        changed = False
        ops = list(block.ops)
        for i, a in enumerate(ops):
            if not isinstance(a, s.ForOp) or a.kind.data != "reduce":
                continue
            for j in range(i + 1, len(ops)):
                b = ops[j]
                if isinstance(b, s.ForOp) and b.kind.data == "reduce":
                    if _try_fuse(a, b, ops[i + 1:j]):
                        n += 1
                        changed = True
                    break
                if b.regions:
                    break
            if changed:
                break
    for op in block.ops:
        for r in op.regions:
            for blk in r.blocks:
                n += fuse_block(blk)
    return n


class FuseReductions(ModulePass):
    """Merge independent sibling reductions over the same range (see module docstring)."""

    name = "fuse-reductions"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                fuse_block(k.body.block)
