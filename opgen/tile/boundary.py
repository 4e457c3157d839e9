"""``convert-at-boundary`` for the NPU targets (Ascend C, TT-Metal).

The same pass as the CPU/CUDA one (opgen/lower/boundary.py) with two limits of the tile level:

* parameters read as indices are left alone: the tile level converts them to range-checked int32
  itself (opgen/tile/indices.py);
* a parameter is converted to ``i64`` only in a matmul chain, whose per-row values the kernels
  read with the scalar unit (opgen/tile/rows.py). Elsewhere the vector unit would read it, and it
  computes no 64-bit integers: such a parameter keeps one kernel per dtype of its variable (the
  ``i64`` member has none, as before). Conversion to ``bool`` is always possible.

The host then converts the caller's tensor once before the kernels run: an NPU kernel per dtype
on Ascend (opgen_ascendc_index.cpp), a read-back and upload on TT-Metal (host.cpp).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower.boundary import convert_params
from opgen.tile.chain import chain_plan


@dataclass(frozen=True)
class ConvertAtBoundaryTiles(ModulePass):
    """Parameters read only cast to ``bool`` (or to ``i64`` in a matmul chain), converted by the
    host (module docstring)."""

    name = "convert-at-boundary"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in op.body.block.ops:
            if isinstance(f, ir.FuncOp):
                convert_params(f, indices=False, targets=("i64", "bool") if chain_plan(f) is not None else ("bool",))
