"""``narrow-products``: a matmul whose operands hold values of a narrow float storage dtype takes
its products in that dtype (``sched.matmul``'s ``products``), which the CPU runtime runs on bf16
units (AMX tiles, or AVX512-BF16 dot products) where the machine has them; the sums stay in f32.

Each operand must be

* *exact* in a dtype D: a caller's input of dtype D, or a ``local``/``temp`` buffer of dtype D
  (or f32/f64) whose every store copies an element just loaded from such an input, through
  widening casts only — rounding it to D changes nothing; or
* *rounded anyway*: the matmul's C is used by nothing but matmuls accumulating into it and loads
  whose values, through casts and sums into buffers that are themselves rounded anyway (the
  one-pass chain's partial sums), are stored into caller outputs of dtype D — the result is
  rounded to D, so rounding this operand to D adds an error of the same order (the bf16 paths of
  PyTorch and Liger-Kernel round the logits' gradient so).

At least one operand must be exact, and D a narrow float (below 32 bits) or a dtype variable,
whose instances decide: the cross-entropy gradient's ``T`` gives bf16 products in its bf16
instance and f32 ones (``opgen_sgemm``) in its f32 instance.

``exact-operands`` records the first rule's answer for each operand of every matmul
(``sched.matmul``'s ``exact``) for the CUDA target, whose TF32 tensor-core products split an f32
operand in two (high and low parts) unless its values are exact in TF32 (bf16 and f16 values
are).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.lower import sched as s


def _narrow(dtype: str) -> bool:
    d = dtypes.BY_NAME.get(dtype)
    return d is None or (d.is_float and d.bits < 32)  # (None: a dtype variable)


WIDE = ("f32", "f64")  # a cast to these (or to the value's own dtype) keeps a narrow float exact


def _loaded(v: SSAValue) -> str | None:
    """D when ``v`` is an element of an input of dtype D, through widening casts only."""
    op = v.owner
    if isinstance(op, s.LoadOp):
        t = s.buf_type(op.buf)
        return t.dtype if t.role.data == "in" else None
    if isinstance(op, ir.CastOp):
        d = _loaded(op.x)
        to = op.result.type.dtype  # type: ignore[attr-defined]
        return d if d is not None and (to in WIDE or to == d) else None
    return None


def exact(buf: SSAValue) -> str | None:
    """D when ``buf`` holds only elements of inputs of dtype D (module docstring), else None."""
    t = s.buf_type(buf)
    if t.role.data == "in":
        return t.dtype
    if t.role.data not in ("local", "temp"):
        return None
    found: set[str | None] = set()
    for use in buf.uses:
        op = use.operation
        if isinstance(op, s.StoreOp):
            found.add(_loaded(op.value))
        elif isinstance(op, s.BufferMatmulOp):
            if op.c is buf:
                return None
        elif not isinstance(op, s.LoadOp | s.PrefetchOp):
            return None
    if len(found) != 1 or None in found:
        return None
    (d,) = found
    return d if t.dtype in (d, *WIDE) else None


def _stored_as(v: SSAValue, dtype: str, seen: frozenset[SSAValue]) -> bool:
    """Every use of ``v``, through casts and sums into rounded buffers, stores it into a caller
    output of ``dtype``."""
    for use in v.uses:
        op = use.operation
        if isinstance(op, ir.CastOp):
            if not _stored_as(op.result, dtype, seen):
                return False
        elif isinstance(op, s.AccumOp) and op.value is v and op.kind.data == ir.ReduceKind.SUM:
            if not rounded(op.buf, dtype, seen):
                return False
        elif not (isinstance(op, s.StoreOp) and op.value is v and s.buf_type(op.buf).role.data == "out"
                  and s.buf_type(op.buf).dtype == dtype):
            return False
    return True


def rounded(c: SSAValue, dtype: str, seen: frozenset[SSAValue] = frozenset()) -> bool:
    """C (a matmul's result buffer) only reaches caller outputs of ``dtype`` (module docstring)."""
    if c in seen or s.buf_type(c).role.data not in ("local", "temp"):
        return False
    seen = seen | {c}
    for use in c.uses:
        op = use.operation
        if isinstance(op, s.BufferMatmulOp):
            if op.c is not c or c in (op.a, op.b):
                return False
        elif isinstance(op, s.LoadOp):
            if not _stored_as(op.result, dtype, seen):
                return False
        elif not (isinstance(op, s.AccumOp) and op.buf is c):
            return False
    return True


def products(mm: s.BufferMatmulOp) -> str | None:
    """The narrow dtype ``mm`` may take its products in, or None."""
    da, db = exact(mm.a), exact(mm.b)
    dtype = da or db
    if dtype is None or not _narrow(dtype):
        return None
    for d in (da, db):
        if d is None and not rounded(mm.c, dtype):
            return None
        if d is not None and d != dtype:
            return None
    return dtype


class NarrowProducts(ModulePass):
    """Mark the matmuls whose products may run in their operands' narrow dtype (module docstring)."""

    name = "narrow-products"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for mm in op.walk():
            if isinstance(mm, s.BufferMatmulOp) and (d := products(mm)) is not None:
                mm.properties["products"] = StringAttr(d)


class ExactOperands(ModulePass):
    """Record, for each operand of every matmul, the dtype it holds exact values of (module
    docstring): ``sched.matmul``'s ``exact``."""

    name = "exact-operands"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for mm in op.walk():
            if isinstance(mm, s.BufferMatmulOp):
                mm.properties["exact"] = ArrayAttr([StringAttr(exact(x) or "") for x in (mm.a, mm.b)])
