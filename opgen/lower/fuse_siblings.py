"""``fuse-siblings``: adjacent ``parallel`` loops over the same range become one loop (CPU).

A ``concat`` lowers to one loop nest per span. Rotary-embedding backward's output row
``dx[n, h, :]`` is two spans (``u[k:]`` then ``-u[:k]``), so each ``n`` ran one loop over the
heads writing the first half of every head's row, then a second loop writing the second halves:
the output went out in two sweeps of every other 256 bytes over 16 KiB, and each input row was
read in both. Fused, each head's row is written whole and in order, its input read once from
memory: rope backward 4096x32x128 (outputs given, 2 threads, the same bits) f32 2.66 -> 2.34 ms,
1.87 -> 1.35 in the host's fast windows (the streaming copy at 100 GB/s), bf16 1.29 -> 1.09.

Two loops ``A`` and ``B``, ``B`` right after ``A`` in the same block, fuse when:

* both are ``sched.for parallel`` with the same ``lo`` and ``hi`` values and hold no matmul,
  packing, segment table, check, or ``serial`` loop (a column sum down a serial loop is
  column-strips' pattern, one nest at a time: LayerNorm's two final column sums fused lost
  their 64-column strips, bf16 4.2 -> 6.3 ms); a ``reduce`` loop (a row's sum) may be inside;
* every buffer either writes (but the allocations inside them) is accessed in both only at
  indices naming the loop's own counter at one axis, the same for all its accesses
  (:func:`opgen.lower.sched.counter_axes`), and every caller buffer that may alias another
  parameter at one axis common to all of them: iteration ``i`` of one never touches what
  iteration ``j != i`` of the other does, so ``A(i)`` then ``B(i)`` for each ``i`` computes what
  all of ``A`` then all of ``B`` did, bit for bit. Buffers only read are free. A softmax over
  the last axis of a 4-D tensor (attention scores ``(B, H, S, S)``) lowered to a nest of row sums
  into ``sum[h, s]`` and then a nest reading them and writing ``dx[b, h, s, :]``: the counter of
  ``h`` at axis 0 of one and axis 1 of the other, each buffer's slices its own; fused, each row
  is read a second time from cache instead of from memory (4x16x1024x1024, 2 threads, outputs
  given, the libraries alternating: f32 19.8 -> 13.3 ms, bf16 9.4 -> 5.3; PyTorch 24.2, 16.2).

``B``'s body goes after ``A``'s in ``A``, its counter replaced by ``A``'s; a third sibling may
follow.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from opgen.lower import sched as s

#: off (False) builds the library without the pass (tests compare the two bitwise)
ENABLED = True


def fusible(a: s.ForOp, b: s.ForOp, aliased: set[SSAValue]) -> bool:
    """Whether ``b`` (right after ``a``) may fuse into ``a`` (module docstring). ``aliased``: the
    kernel's caller buffers that may share memory with another parameter."""
    if not (a.kind.data == b.kind.data == "parallel" and a.lo == b.lo and a.hi == b.hi):
        return False
    local: set[SSAValue] = set()
    for loop in (a, b):
        for o in loop.walk():
            if isinstance(o, s.OPAQUE):
                return False
            if isinstance(o, s.ForOp) and o.kind.data == "serial":
                return False
            if isinstance(o, s.AllocOp):
                local.add(o.result)
    shared = (s.effects(a)[1] | s.effects(b)[1] | aliased) - local
    groups = [{buf} for buf in shared - aliased] + [shared & aliased]  # (buffers that may alias: one group)
    for group in groups:
        axes = s.counter_axes(a, group) | s.counter_axes(b, group)
        if len(axes) > 1 or -1 in axes:
            return False
    return True


def fuse(a: s.ForOp, b: s.ForOp) -> None:
    """``b``'s body after ``a``'s, in ``a``; ``b`` erased."""
    b.iv.replace_all_uses_with(a.iv)
    for op in list(b.body.block.ops):
        op.detach()
        a.body.block.add_op(op)
    b.detach()
    b.erase()


def fuse_block(block: Block, aliased: set[SSAValue]) -> int:
    """Fuse adjacent siblings in ``block`` and, recursively, in the blocks nested in it (after
    fusing: the fused body's own siblings too); returns how many fusions."""
    n = 0
    op = block.first_op
    while op is not None:
        nxt = op.next_op
        if isinstance(op, s.ForOp) and isinstance(nxt, s.ForOp) and fusible(op, nxt, aliased):
            fuse(op, nxt)
            n += 1
            continue
        op = nxt
    for o in block.ops:
        for r in o.regions:
            for blk in r.blocks:
                n += fuse_block(blk, aliased)
    return n


class FuseSiblings(ModulePass):
    """Fuse adjacent parallel loops over the same range (module docstring)."""

    name = "fuse-siblings"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if not ENABLED:
            return
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                fuse_block(k.body.block, k.aliased_args)
