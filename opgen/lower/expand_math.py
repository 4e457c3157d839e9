"""``expand-math``: erf and tanh as elementwise L0 ops, for a target whose vector unit has neither.

Each ``opgen.erf`` / ``opgen.tanh`` named in the pass's ``functions`` is replaced by the steps of
the shared polynomial kernels (opgen/vmath.py: the CPU runtime's C functions use the same
coefficients): multiplies, adds, a division, min/max clamps, ``exp``, comparisons and selects,
each of the replaced op's type. The target then prints ops it has. The steps' error is measured
over f32 inputs in tests/test_vmath.py (docs/backend_ascendc.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen import vmath
from opgen.ir import dialect as ir

#: the L0 op each function name replaces
OPS: dict[str, type[ir.UnaryOp]] = {"erf": ir.ErfOp, "tanh": ir.TanhOp}


class _L0Steps:
    """vmath's steps as L0 ops of ``like``'s type, inserted before ``at``."""

    def __init__(self, at: Operation, like: SSAValue):
        self.at = at
        self.type = ir.tensor_type(like)
        self.consts: dict[str, SSAValue] = {}

    def emit(self, op: Operation) -> SSAValue:
        Rewriter.insert_op(op, InsertPoint.before(self.at))
        return op.results[0]

    def const(self, c: str) -> SSAValue:
        if c not in self.consts:  # (a scalar broadcast, as the DSL traces a Python number)
            scalar = self.emit(ir.ConstantOp(vmath.f32(c), self.type.dtype))
            self.consts[c] = self.emit(ir.BroadcastOp(scalar, [], self.type))
        return self.consts[c]

    def abs(self, x: SSAValue) -> SSAValue:
        return self.emit(ir.AbsOp(x))

    def neg(self, x: SSAValue) -> SSAValue:
        return self.emit(ir.NegOp(x))

    def exp(self, x: SSAValue) -> SSAValue:
        return self.emit(ir.ExpOp(x))

    def add(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.AddOp(a, b))

    def mul(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.MulOp(a, b))

    def div(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.DivOp(a, b))

    def max(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.MaxOp(a, b))

    def min(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.MinOp(a, b))

    def lt(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.CmpOp("lt", a, b))

    def gt(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.CmpOp("gt", a, b))

    def select(self, mask: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.emit(ir.SelectOp(mask, a, b))


@dataclass(frozen=True)
class ExpandMath(ModulePass):
    """Replace the L0 ops of ``functions`` (names of vmath.FUNCTIONS) by vmath's steps."""

    name = "expand-math"
    functions: tuple[str, ...] = ("erf", "tanh")

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        kinds = tuple(OPS[f] for f in self.functions)
        for f in op.body.block.ops:
            if not isinstance(f, ir.FuncOp):
                continue
            for u in [o for o in f.body.block.walk() if isinstance(o, kinds)]:
                fn = next(n for n in self.functions if isinstance(u, OPS[n]))
                result = vmath.FUNCTIONS[fn](_L0Steps(u, u.x), u.x)
                u.result.replace_all_uses_with(result)
                Rewriter.erase_op(u)
