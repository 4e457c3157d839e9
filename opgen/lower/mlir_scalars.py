"""Scalar arithmetic in upstream MLIR's ``arith``/``math`` with the C library's semantics.

Shared by the loop level's lowering (opgen/lower/to_std.py) and the L0 export
(opgen/lower/to_linalg.py): compute types (f16/bf16 in f32), C's comparisons and NaN rules,
the float -> int sentinel of ``OPGEN_F2I``, integer division by 0 giving 0, the saturating size
ops. :class:`Scalars` appends the ops it makes to ``block``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects import arith, math
from xdsl.dialects.builtin import (
    BFloat16Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    IndexType,
    IntegerAttr,
    IntegerType,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, SSAValue

from opgen import dtypes
from opgen.dtypes import DType
from opgen.emit.render import STATUSES
from opgen.ir import dialect as ir

INDEX = IndexType()
#: an abstract status (``param``, ``shape``, ``index``) -> the C ABI's code
STATUS = {st["abstract"]: st["value"] for st in STATUSES if "abstract" in st}
FLOAT_TYPES: dict[str, Attribute] = {"f16": Float16Type(), "bf16": BFloat16Type(), "f32": Float32Type(),
                                     "f64": Float64Type()}


def scalar_type(d: DType) -> Attribute:
    """The MLIR type a value of dtype ``d`` is computed in (f16/bf16 in f32; bool as i1)."""
    c = d.compute
    if c.is_float:
        return FLOAT_TYPES[c.name]
    return i1 if c.is_bool else IntegerType(c.bits)


def storage_type(d: DType, caller: bool) -> Attribute:
    """The element type of a buffer of dtype ``d``: a caller's tensor stores ``d`` itself, a
    workspace or scratch buffer its compute type; bools are bytes."""
    if d.is_bool:
        return i8
    if d.is_float:
        return FLOAT_TYPES[d.name if caller else d.compute.name]
    return IntegerType(d.bits)


class Scalars:
    """Builds scalar ops into ``block`` for one dtype binding (``{var: DType}``)."""

    def __init__(self, binding: dict[str, DType]):
        self.binding = binding
        self.block = Block()
        #: the caller's dims (i64 values) by name
        self.dims: dict[str, SSAValue] = {}

    def dtype(self, name: str) -> DType:
        return dtypes.BY_NAME[name] if name in dtypes.BY_NAME else self.binding[name]

    def add(self, op: Operation) -> SSAValue:
        self.block.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def const(self, value: float | int | bool, t: Attribute) -> SSAValue:
        if isinstance(t, IntegerType | IndexType):
            if t == i1:
                value = int(bool(value))
            elif isinstance(t, IntegerType) and value >= 2 ** (t.width.data - 1):
                value -= 2 ** t.width.data  # (an unsigned constant: the same bits, signless)
            return self.add(arith.ConstantOp(IntegerAttr(int(value), t)))
        return self.add(arith.ConstantOp(FloatAttr(float(value), t)))  # type: ignore[arg-type]

    def index(self, v: SSAValue) -> SSAValue:
        return self.add(arith.IndexCastOp(v, INDEX))

    def agree(self, shaped: Sequence[tuple[SSAValue, Sequence[str]]], dim_op: type,
              sizes: Sequence[tuple[SSAValue, str]]) -> SSAValue:
        """Each caller dim from the first of the ``shaped`` values (memrefs or tensors, with their
        spelled shapes; ``dim_op`` reads an extent) carrying it, or from a size parameter (an i64
        value with its dim) when none does, into :attr:`dims`. Returns an i1 that is true when
        every other extent agrees with them and with the literal dims, and no size is negative."""
        ok = self.const(1, i1)
        for v, shape in shaped:
            for axis, d in enumerate(shape):
                got = self.add(arith.IndexCastOp(self.add(dim_op(v, self.const(axis, INDEX))), i64))
                if d.isidentifier() and d not in self.dims:
                    self.dims[d] = got
                    continue
                want = self.dims[d] if d.isidentifier() else self.const(int(d), i64)
                ok = self.add(arith.AndIOp(ok, self.add(arith.CmpiOp(got, want, "eq"))))
        for v, d in sizes:
            ok = self.add(arith.AndIOp(ok, self.add(arith.CmpiOp(v, self.const(0, i64), "sge"))))
            if d in self.dims:
                ok = self.add(arith.AndIOp(ok, self.add(arith.CmpiOp(v, self.dims[d], "eq"))))
            else:
                self.dims[d] = v
        return ok

    def next_status(self, cur: SSAValue, ok: SSAValue, status: str) -> SSAValue:
        """The i32 status after a check: ``status`` when ``ok`` is false and ``cur`` is 0 (no
        earlier check failed), else ``cur``."""
        first = self.add(arith.CmpiOp(cur, self.const(0, i32), "eq"))
        fail = self.add(arith.AndIOp(first, self.add(arith.XOrIOp(ok, self.const(1, i1)))))
        return self.add(arith.SelectOp(fail, self.const(STATUS[status], i32), cur))

    def nested(self, block: Block) -> Nested:
        return Nested(self, block)

    def combine(self, kind: str, cur: SSAValue, v: SSAValue, d: DType) -> SSAValue:
        """``cur (kind) v`` as the C library: a sum, or ``v`` when it is larger (smaller) or NaN."""
        if kind == "sum":
            return self.add(arith.AddfOp(cur, v) if d.compute.is_float else arith.AddiOp(cur, v))
        return self.pick(kind, v, cur, d)

    def pick(self, kind: str, a: SSAValue, b: SSAValue, d: DType) -> SSAValue:
        """C's ``(a > b || a != a) ? a : b`` (``<`` for min)."""
        c = d.compute
        if c.is_float:
            beats = self.add(arith.CmpfOp(a, b, "ogt" if kind == "max" else "olt"))
            nan = self.add(arith.CmpfOp(a, a, "une"))
            beats = self.add(arith.OrIOp(beats, nan))
        else:
            pred = ("s" if c.kind == "int" else "u") + ("gt" if kind == "max" else "lt")
            beats = self.add(arith.CmpiOp(a, b, pred))
        return self.add(arith.SelectOp(beats, a, b))

    def elementwise(self, op: Operation, args: list[SSAValue]) -> SSAValue:
        """An L0 scalar op (elementwise, cast, compare, select, size op) on MLIR values ``args``."""
        rt = self.dtype(ir.tensor_type(op.results[0]).dtype)
        t = scalar_type(rt)
        if isinstance(op, ir.ConstantOp):
            return self.const(op.number, t)
        if isinstance(op, ir.CastOp):
            return self.cast(args[0], self.dtype(ir.tensor_type(op.x).dtype), rt)
        if isinstance(op, ir.CmpOp):
            return self.compare(op.predicate.data, args[0], args[1], self.dtype(ir.tensor_type(op.lhs).dtype))
        if isinstance(op, ir.SelectOp):
            return self.add(arith.SelectOp(*args))
        if isinstance(op, ir.CeilDivOp | ir.SizeAddOp | ir.SizeSubOp | ir.SizeMulOp | ir.SizeDivOp):
            return self.size(type(op), args[0], args[1])
        return self.math(op, args, rt, t)

    def size(self, kind: type, a: SSAValue, b: SSAValue) -> SSAValue:
        """A size op on i64 sizes: ``ceil_div`` (no overflow near INT64_MAX), the saturating
        ``size_add``/``sub``/``mul``, ``size_div`` by a positive constant."""
        if kind is ir.CeilDivOp:  # a / k + (a % k != 0)
            q = self.add(arith.DivSIOp(a, b))
            r = self.add(arith.RemSIOp(a, b))
            return self.add(arith.AddiOp(q, self.add(arith.ExtUIOp(self.add(arith.CmpiOp(
                r, self.const(0, i64), "ne")), i64))))
        if kind is ir.SizeAddOp:
            return self.sat_add(a, b)
        if kind is ir.SizeSubOp:
            return self.add(arith.SelectOp(self.add(arith.CmpiOp(a, b, "sgt")), self.add(arith.SubiOp(a, b)),
                                           self.const(0, i64)))
        if kind is ir.SizeMulOp:
            big = self.const(2**63 - 1, i64)
            safe_b = self.add(arith.MaxSIOp(b, self.const(1, i64)))
            over = self.add(arith.AndIOp(self.add(arith.CmpiOp(b, self.const(0, i64), "ne")),
                                         self.add(arith.CmpiOp(a, self.add(arith.DivSIOp(big, safe_b)), "sgt"))))
            return self.add(arith.SelectOp(over, big, self.add(arith.MuliOp(a, b))))
        assert kind is ir.SizeDivOp
        return self.add(arith.DivSIOp(a, b))

    def sat_add(self, a: SSAValue, b: SSAValue) -> SSAValue:
        big = self.const(2**63 - 1, i64)
        over = self.add(arith.CmpiOp(a, self.add(arith.SubiOp(big, b)), "sgt"))
        return self.add(arith.SelectOp(over, big, self.add(arith.AddiOp(a, b))))

    def compare(self, pred: str, a: SSAValue, b: SSAValue, d: DType) -> SSAValue:
        c = d.compute
        if c.is_float:  # C's comparisons: all false on NaN but !=
            return self.add(arith.CmpfOp(a, b, {"eq": "oeq", "ne": "une", "lt": "olt", "le": "ole", "gt": "ogt",
                                                "ge": "oge"}[pred]))
        if pred in ("eq", "ne"):
            return self.add(arith.CmpiOp(a, b, pred))
        return self.add(arith.CmpiOp(a, b, ("s" if c.kind == "int" else "u") + pred))

    def cast(self, x: SSAValue, src: DType, dst: DType) -> SSAValue:
        """``opgen.cast`` as the C library's (``c_cast``): saturating-to-sentinel float -> int,
        ``!= 0`` to bool, C's conversions otherwise."""
        a, b = src.compute, dst.compute
        if a == b:
            return x
        tb = scalar_type(b)
        if b.is_bool:
            if a.is_float:
                return self.add(arith.CmpfOp(x, self.const(0.0, x.type), "une"))
            return self.add(arith.CmpiOp(x, self.const(0, x.type), "ne"))
        if a.is_float and b.is_float:
            return self.add(arith.ExtFOp(x, tb) if b.bits > a.bits else arith.TruncFOp(x, tb))
        if a.is_float:  # OPGEN_F2I: NaN and out-of-range values give the sentinel
            lo, hi = b.int_range
            f64 = Float64Type()
            xd = self.add(arith.ExtFOp(x, f64)) if a != dtypes.F64 else x
            ok = self.add(arith.AndIOp(self.add(arith.CmpfOp(xd, self.const(float(lo) - 1.0, f64), "ogt")),
                                       self.add(arith.CmpfOp(xd, self.const(float(hi) + 1.0, f64), "olt"))))
            safe = self.add(arith.SelectOp(ok, x, self.const(0.0, x.type)))
            conv = self.add(arith.FPToUIOp(safe, tb) if b.kind == "uint" else arith.FPToSIOp(safe, tb))
            return self.add(arith.SelectOp(ok, conv, self.const(hi if b.kind == "uint" else lo, tb)))
        if b.is_float:
            return self.add(arith.SIToFPOp(x, tb) if a.kind == "int" else arith.UIToFPOp(x, tb))
        wa, wb = (1 if a.is_bool else a.bits), b.bits
        if wb > wa:
            return self.add(arith.ExtSIOp(x, tb) if a.kind == "int" else arith.ExtUIOp(x, tb))
        return self.add(arith.TruncIOp(x, tb)) if wb < wa else x

    UNARY: ClassVar[dict[type, type]] = {ir.ExpOp: math.ExpOp, ir.LogOp: math.LogOp, ir.SqrtOp: math.SqrtOp,
                                         ir.TanhOp: math.TanhOp, ir.ErfOp: math.ErfOp}

    def math(self, op: Operation, args: list[SSAValue], rt: DType, t: Attribute) -> SSAValue:
        c = rt.compute
        if type(op) in self.UNARY:
            return self.add(self.UNARY[type(op)](args[0]))
        if isinstance(op, ir.RsqrtOp):  # 1 / sqrt(x), as the C library (not an approximation)
            return self.add(arith.DivfOp(self.const(1.0, t), self.add(math.SqrtOp(args[0]))))
        if isinstance(op, ir.RecipOp):
            return self.add(arith.DivfOp(self.const(1.0, t), args[0]))
        if isinstance(op, ir.SigmoidOp):
            one = self.const(1.0, t)
            e = self.add(math.ExpOp(self.add(arith.NegfOp(args[0]))))
            return self.add(arith.DivfOp(one, self.add(arith.AddfOp(one, e))))
        if isinstance(op, ir.PowOp):
            return self.add(math.PowFOp(*args))
        if isinstance(op, ir.NegOp):
            return self.add(arith.NegfOp(args[0]) if c.is_float else arith.SubiOp(self.const(0, t), args[0]))
        if isinstance(op, ir.AbsOp):  # (x < 0 ? -x : x): -0.0 stays -0.0
            x = args[0]
            if c.kind == "uint":
                return x
            neg = self.add(arith.CmpfOp(x, self.const(0.0, t), "olt") if c.is_float
                           else arith.CmpiOp(x, self.const(0, t), "slt"))
            return self.add(arith.SelectOp(neg, self.scalar_neg(x, c), x))
        if isinstance(op, ir.NotOp):
            return self.add(arith.XOrIOp(args[0], self.const(1, i1)))
        if isinstance(op, ir.MaxOp | ir.MinOp):
            return self.pick("max" if isinstance(op, ir.MaxOp) else "min", args[0], args[1], rt)
        if isinstance(op, ir.AndOp | ir.OrOp):
            return self.add(arith.AndIOp(*args) if isinstance(op, ir.AndOp) else arith.OrIOp(*args))
        if isinstance(op, ir.DivOp) and not c.is_float:
            return self.int_div(args[0], args[1], c, t)
        float_ops = {ir.AddOp: arith.AddfOp, ir.SubOp: arith.SubfOp, ir.MulOp: arith.MulfOp, ir.DivOp: arith.DivfOp}
        int_ops = {ir.AddOp: arith.AddiOp, ir.SubOp: arith.SubiOp, ir.MulOp: arith.MuliOp}
        table = float_ops if c.is_float else int_ops
        if type(op) in table:
            return self.add(table[type(op)](*args))
        raise NotImplementedError(f"lower-to-std: no rule for {op.name}")

    def scalar_neg(self, x: SSAValue, c: DType) -> SSAValue:
        return self.add(arith.NegfOp(x) if c.is_float else arith.SubiOp(self.const(0, x.type), x))

    def int_div(self, a: SSAValue, b: SSAValue, c: DType, t: Attribute) -> SSAValue:
        """The C library's integer division: ``x / 0`` is 0, ``MIN / -1`` wraps (never a trap)."""
        zero, one = self.const(0, t), self.const(1, t)
        by_zero = self.add(arith.CmpiOp(b, zero, "eq"))
        if c.kind == "uint" or c.is_bool:
            q = self.add(arith.DivUIOp(a, self.add(arith.SelectOp(by_zero, one, b))))
            return self.add(arith.SelectOp(by_zero, zero, q))
        by_m1 = self.add(arith.CmpiOp(b, self.const(-1, t), "eq"))
        safe = self.add(arith.SelectOp(self.add(arith.OrIOp(by_zero, by_m1)), one, b))
        q = self.add(arith.DivSIOp(a, safe))
        q = self.add(arith.SelectOp(by_m1, self.add(arith.SubiOp(zero, a)), q))
        return self.add(arith.SelectOp(by_zero, zero, q))


class Nested:
    """``with builder.nested(block) as inner:`` builds into ``block``, then returns to where it
    was; ``inner.close(term)`` ends the block with its terminator."""

    def __init__(self, k: Scalars, block: Block):
        self.k, self.block = k, block

    def __enter__(self) -> Nested:
        self.saved = self.k.block
        self.k.block = self.block
        return self

    def close(self, term: Operation) -> None:
        self.k.block.add_op(term)

    def __exit__(self, *exc: object) -> None:
        self.k.block = self.saved
