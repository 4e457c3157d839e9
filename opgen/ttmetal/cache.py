"""``cache-rows-tt``: a third TT schedule between *resident* and *streamed* — the row block held
in L1, its row vectors streamed.

The streamed schedule walks each 32-row block in column chunks twice: once for the row sums,
once for the outputs, so every full tile it copies in is read from DRAM twice (RMSNorm backward,
f32, D = 4,096: 1.71x the minimal traffic). The resident schedule reads them once, but keeps
every value of the block in L1 at full width — row vectors too (``w``, the column sums), which
take a whole 32x32 tile per 32 columns for their one valid row — and at that size it does not fit.

This pass adds, for each streamed kernel that walks its blocks twice, a *cached* copy
(``<instance>.cached``, schedule ``cached``): a full-tile ``tile.copy_in`` in the second walk that
reads the same rows and chunk of the same tensor as one in the first walk gets the first one's
``cache`` number. The TT lowering (opgen/ttmetal/lower.py) then fills one CB holding the block's
every chunk of that tensor in the first walk and reads it back in the second. Row vectors stay
streamed (a re-read moves only their valid row). The host tries resident, cached, streamed, and
runs the first whose CBs fit L1.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import IntAttr, ModuleOp, StringAttr
from xdsl.ir import Block, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.tile import dialect as t


class CacheRowsTt(ModulePass):
    """Add each twice-walking streamed ``tile.kernel``'s cached copy (see the module docstring)."""

    name = "cache-rows-tt"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in list(op.body.block.ops):
            if not isinstance(k, t.KernelOp) or k.attributes.get("schedule") != StringAttr("streamed"):
                continue
            if any(isinstance(o, t.SegmentsOp | t.TileMatmulOp) for o in k.walk()):
                continue
            cached = k.clone()
            if not mark_twins(cached):
                continue
            cached.sym_name = StringAttr(k.sym_name.data.removesuffix(".streamed") + ".cached")
            cached.attributes["schedule"] = StringAttr("cached")
            op.body.block.insert_op_before(cached, k)


def mark_twins(k: t.KernelOp) -> bool:
    """Number each first-walk / second-walk pair of full-tile copies of ``k``; whether any."""
    n = 0
    for block in _blocks(k):
        loops = [o for o in block.ops if isinstance(o, t.ForOp)]
        for i, first in enumerate(loops):
            for second in loops[i + 1:]:
                if not _same_bounds(first, second):
                    continue
                for a in _full_copies(first):
                    for b in _full_copies(second):
                        if "cache" not in b.attributes and _same_view(a, first, b, second):
                            if "cache" not in a.attributes:
                                a.attributes["cache"] = IntAttr(n)
                                n += 1
                            b.attributes["cache"] = a.attributes["cache"]
    return n > 0


def _blocks(k: t.KernelOp):
    for o in k.walk():
        for r in o.regions:
            yield from r.blocks


def _full_copies(loop: t.ForOp) -> list[t.CopyInOp]:
    """The loop body's own copies of full tiles (``[R, C]``: rows x a column chunk)."""
    out = []
    for o in loop.body.block.ops:
        if isinstance(o, t.CopyInOp):
            shape = ir.tensor_type(o.result).shape
            if len(shape) == 2 and shape[0] != "1" and shape[1] != "1":
                out.append(o)
    return out


def _same_bounds(a: t.ForOp, b: t.ForOp) -> bool:
    return a.lo == b.lo and a.hi == b.hi and a.step == b.step


def _same_view(a: t.CopyInOp, la: t.ForOp, b: t.CopyInOp, lb: t.ForOp) -> bool:
    """The same tensor, rows and column chunk (the chunk as the same function of each loop's
    variable)."""
    return a.src == b.src and all(_same_expr(x, la.iv, y, lb.iv) for x, y in (
        (a.row0, b.row0), (a.nrows, b.nrows), (a.col0, b.col0), (a.ncols, b.ncols)))


def _same_expr(x: SSAValue, ix: SSAValue, y: SSAValue, iy: SSAValue) -> bool:
    if x is ix or y is iy:
        return x is ix and y is iy
    if x == y:
        return True
    ox, oy = x.owner, y.owner
    if isinstance(ox, Block) or isinstance(oy, Block) or type(ox) is not type(oy):
        return False
    if ox.properties != oy.properties or ox.attributes != oy.attributes or ox.regions or oy.regions:
        return False
    return len(ox.operands) == len(oy.operands) and all(
        _same_expr(p, ix, q, iy) for p, q in zip(ox.operands, oy.operands, strict=True))
