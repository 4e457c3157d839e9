"""``lower-to-tiles``: every ``opgen.func`` -> its ``tile.kernel``s, per dtype binding an NPU
target computes (per compute type) and per part: a matmul chain's passes (opgen/tile/chain.py),
or the row groups of a row-wise function, each with whole rows and, where it can, rows in column
tiles (opgen/tile/lower.py). The host entry runs the parts one after the other and, within a
part, the first schedule whose tiling fits."""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower.row_groups import RowGroupLowering
from opgen.lower.to_loops import NotFusable
from opgen.tile.chain import chain_passes, chain_plan, lower_chain
from opgen.tile.lower import TileUnsupported, lower_func, npu_bindings


def parts(func: ir.FuncOp) -> int:
    """How many kernels, run one after the other, the function's outputs need: a matmul chain's
    passes, or its row groups."""
    ch = chain_plan(func)
    if ch is not None:
        return len(chain_passes(ch))
    try:
        return len(RowGroupLowering(func, set(func.aliased_outputs)).plan())
    except NotFusable:
        return 1  # (lowering it reports why)


class LowerToTiles(ModulePass):
    """Replace every ``opgen.func`` with its ``tile.kernel``s (see the module docstring)."""

    name = "lower-to-tiles"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in list(op.body.block.ops):
            if not isinstance(f, ir.FuncOp):
                continue
            chain = chain_plan(f) is not None
            for b in npu_bindings(f):
                for part in range(parts(f)):
                    if chain:
                        op.body.block.insert_op_before(lower_chain(f, b, part), f)
                        continue
                    op.body.block.insert_op_before(lower_func(f, b, part=part), f)
                    try:
                        op.body.block.insert_op_before(lower_func(f, b, streamed=True, part=part), f)
                    except TileUnsupported:
                        pass  # (rows of one element always fit)
            op.body.block.erase_op(f)
