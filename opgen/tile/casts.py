"""``split-casts``: vector casts the Ascend vector unit lacks, split in two through f16.

The A2 ``Cast`` instruction converts ``uint8_t``/``int8_t`` to ``half`` only (docs/ascendc_model.md,
the pair table), so a tile of u8, bool or i8 values cast to f32 (``cast(mask, f32)``, a bool
condition used as a factor) becomes ``cast(cast(x, f16), f32)``: both steps are exact (every
8-bit integer is a half). Scalars (rank 0) are cast by the scalar unit and stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.tile.buffers import is_mask

#: (source dtype, destination dtype) -> the dtype to go through
THROUGH = {("u8", "f32"): "f16", ("bool", "f32"): "f16", ("i8", "f32"): "f16"}


@dataclass(frozen=True)
class SplitCasts(ModulePass):
    """Split every vector cast of :data:`THROUGH` in two (module docstring)."""

    name = "split-casts"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for c in [o for o in op.walk() if isinstance(o, ir.CastOp)]:
            src, dst = ir.tensor_type(c.x), ir.tensor_type(c.result)
            via = THROUGH.get((src.dtype, dst.dtype))
            if via is None or src.rank == 0 or is_mask(c.x):  # (a comparison's bits: printed as a select)
                continue
            mid = ir.CastOp(c.x, via)
            Rewriter.insert_op(mid, InsertPoint.before(c))
            c.operands = [mid.result]
