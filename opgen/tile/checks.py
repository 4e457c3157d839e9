"""Checks on tensor data on the tile level: a kernel of their own, run before any kernel that
writes an output.

A check whose condition is a per-row value (``check(outside | (0 <= t) & (t < V))`` over the rows
of FLCE's targets) runs on the cores' scalar units: each core takes rows block-cyclically,
evaluates the condition from single elements of the parameters (opgen/tile/rows.py) and records a
bit per failed check (``tile.fail_unless``); it writes its bits to its 32-byte slot of the
workspace (``tile.flags_out``). The host waits for the kernel, ORs the slots and answers the
status of the first failed check in program order (as the oracle does) — before the op's other
kernels run, so nothing is written.
"""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, StringAttr

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.tile.lower import TileLowering, TileUnsupported
from opgen.tile.rows import RowValues

#: the int32 words of a core's slot of failed-check bits (32 bytes: the copy engine's unit)
SLOT_WORDS = 8


def data_checks(func: ir.FuncOp) -> list[ir.CheckOp]:
    """The function's checks on tensor data, in program order."""
    return [op for op in func.body.block.ops if isinstance(op, ir.CheckOp) and ir.tensor_type(op.cond).rank]


class CheckTiles(RowValues, TileLowering):
    """The check kernel of one dtype binding (see the module docstring)."""

    def __init__(self, func: ir.FuncOp, binding: dict[str, dtypes.DType]):
        super().__init__(func, binding, part=0)

    def run(self) -> t.KernelOp:
        checks = data_checks(self.func)
        if len(checks) > 31:
            raise TileUnsupported(self.name, "more than 31 checks on tensor data")
        k = self.begin_kernel("check", "check")
        k.attributes["checks"] = ArrayAttr([ArrayAttr([StringAttr(c.status.data), StringAttr(c.message.data)])
                                            for c in checks])
        k.attributes["rows"] = ArrayAttr([StringAttr(ir.tensor_type(c.cond).shape[0]) for c in checks])
        self.zero, self.one = self.const(0), self.const(1)
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        flags = self.add(t.WorkspaceOp("ws_flags", t.GmType.make([t.param_dim("flag_words")], "i32")))
        for bit, c in enumerate(checks):
            loop = t.ForOp(core, self.dim(ir.tensor_type(c.cond).shape[0]), ncores, hint="i")
            self.add(loop)
            self.anchor, self.cur = loop, loop.body.block  # (scalars the rows read go before the loop)
            self.add(t.FailUnlessOp(self.row_value(c.cond, loop.iv, {}), bit))
            self.add(t.YieldOp())
            self.anchor, self.cur = None, self.block
        self.add(t.FlagsOutOp(flags, self.add(ir.MulOp(core, self.const(SLOT_WORDS)))))
        return k
