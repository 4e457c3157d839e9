"""``lower-to-tiles``: every ``opgen.func`` -> its ``tile.kernel``s, per dtype binding an NPU
target computes (per compute type) and per part: a matmul chain's passes (opgen/tile/chain.py),
after the kernel of its checks on tensor data (opgen/tile/checks.py),
or the row groups of a row-wise function, each with whole rows and, where it can, rows in column
tiles (opgen/tile/lower.py). The host entry runs the parts one after the other and, within a
part, the first schedule whose tiling fits."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower.row_groups import RowGroupLowering
from opgen.lower.to_loops import NotFusable
from opgen.tile import dialect as t
from opgen.tile.chain import chain_passes, chain_plan, lower_chain
from opgen.tile.checks import CheckTiles, data_checks
from opgen.tile.lower import NPU_DTYPES, TileUnsupported, lower_func, npu_bindings


def parts(func: ir.FuncOp) -> int:
    """How many kernels, run one after the other, the function's outputs need: a matmul chain's
    passes (after the kernel of its checks on tensor data, if it has any), or its row groups."""
    ch = chain_plan(func)
    if ch is not None:
        return len(chain_passes(ch)) + bool(data_checks(func))
    try:
        return len(RowGroupLowering(func, set(func.aliased_outputs)).plan())
    except NotFusable:
        return 1  # (lowering it reports why)


@dataclass(frozen=True)
class LowerToTiles(ModulePass):
    """Replace every ``opgen.func`` with its ``tile.kernel``s (see the module docstring)."""

    name = "lower-to-tiles"

    #: matmul chains: a block's spans of the other dim split into slices on several cores when
    #: there are too few blocks for the grid, the slices' partial sums added after a
    #: ``tile.sync_all`` (TT-Metal: a second launch; see opgen/tile/chain.py)
    split_spans: bool = False
    #: the NPU target (``ascendc`` or ``tt-metal``): the L0 ops it has no form for
    #: (opgen/tile/lower.py, ``TARGET_UNSUPPORTED``)
    target: str = "ascendc"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in list(op.body.block.ops):
            if not isinstance(f, ir.FuncOp):
                continue
            chain = chain_plan(f) is not None
            first = int(chain and bool(data_checks(f)))  # the check kernel runs first
            for b in npu_bindings(f, scalar_reads=True):
                ks = []
                for part in range(parts(f)):
                    if chain:
                        ks.append(CheckTiles(f, b).run() if part < first
                                  else lower_chain(f, b, part, first, self.split_spans))
                        continue
                    ks.append(lower_func(f, b, part=part, target=self.target))
                    try:
                        ks.append(lower_func(f, b, streamed=True, part=part, target=self.target))
                    except TileUnsupported:
                        pass  # (rows of one element always fit)
                if all(scalar_reads_only(k) for k in ks):
                    for k in ks:
                        op.body.block.insert_op_before(k, f)
            op.body.block.erase_op(f)


def scalar_reads_only(k: t.KernelOp) -> bool:
    """The kernel reads tensors of a dtype the vector unit does not compute (64-bit integers) only
    with the scalar unit: else its binding has no kernel on the NPU."""
    for a in k.body.block.args:
        if isinstance(a.type, t.GmType) and a.type.dtype not in NPU_DTYPES:
            if not all(isinstance(u.operation, t.LoadOp) for u in a.uses):
                return False
    return True
