"""The DSL's primitives. Each records one or a few ``opgen`` ops; see docs/dsl.md for the full
reference. Shapes broadcast like numpy; Python numbers and scalar attributes are *weak* (they
take their partner's dtype). Float math on f16/bf16 is carried out in f32 and rounded once, when
an output is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opgen import dtypes
from opgen.dsl.shapes import concat
from opgen.dsl.spec import Batch, Dim, DimArith, DTypeVar
from opgen.dsl.trace import (
    Value,
    Variant,
    _emit1,
    _unify,
    as_value,
    broadcast_shapes,
    broadcast_to,
    cast,
    matmul,
    mean,
    reduce,
    size,
    tracer,
    unary,
)
from opgen.ir import dialect as ir

__all__ = [
    "absolute",
    "bincount",
    "cast",
    "check",
    "concat",
    "erf",
    "exp",
    "full",
    "gather",
    "iota",
    "log",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "reciprocal",
    "reject",
    "rsqrt",
    "scatter_add",
    "sigmoid",
    "size",
    "sqrt",
    "sum",
    "tanh",
    "unpack_bits",
    "where",
    "zeros",
]

DimLike = Dim | Batch | int | str


def _dim_name(d: DimLike) -> str:
    if isinstance(d, DimArith | Batch):
        return d.name
    if isinstance(d, int) and not isinstance(d, bool):
        return str(d)
    if isinstance(d, str):
        return d
    raise tracer().error(f"{d!r} is not a dim")


# ----------------------------------------------------------------------- elementwise math


def exp(x: Any) -> Value:
    """``e**x`` elementwise (integers are converted to f32 first)."""
    return unary(ir.ExpOp, x)


def log(x: Any) -> Value:
    """Natural logarithm."""
    return unary(ir.LogOp, x)


def sqrt(x: Any) -> Value:
    """Square root."""
    return unary(ir.SqrtOp, x)


def rsqrt(x: Any) -> Value:
    """``1 / sqrt(x)``."""
    return unary(ir.RsqrtOp, x)


def reciprocal(x: Any) -> Value:
    """``1 / x``."""
    return unary(ir.RecipOp, x)


def tanh(x: Any) -> Value:
    """Hyperbolic tangent."""
    return unary(ir.TanhOp, x)


def erf(x: Any) -> Value:
    """The error function (``erf(x / sqrt(2))`` gives the exact GELU's normal CDF)."""
    return unary(ir.ErfOp, x)


def sigmoid(x: Any) -> Value:
    """``1 / (1 + exp(-x))``."""
    return unary(ir.SigmoidOp, x)


def absolute(x: Any) -> Value:
    """``|x|`` (also ``abs(x)``)."""
    return unary(ir.AbsOp, as_value(x))


def maximum(a: Any, b: Any) -> Value:
    """Elementwise maximum (broadcasting)."""
    a, b = _unify(a, b)
    return _emit1(ir.MaxOp(a.ssa, b.ssa))


def minimum(a: Any, b: Any) -> Value:
    """Elementwise minimum (broadcasting)."""
    a, b = _unify(a, b)
    return _emit1(ir.MinOp(a.ssa, b.ssa))


def where(cond: Any, a: Any, b: Any) -> Value:
    """``cond ? a : b`` elementwise; ``cond`` is bool, all three broadcast together."""
    t = tracer()
    cond = as_value(cond)
    if cond.dtype != "bool":
        raise t.error(f"where(): condition must be bool, got {cond.dtype} (compare first)")
    a, b = _unify(a, b)
    shape = broadcast_shapes(broadcast_shapes(cond.shape, a.shape), b.shape)
    c, a, b = (broadcast_to(v, shape) for v in (cond, a, b))
    return _emit1(ir.SelectOp(c.ssa, a.ssa, b.ssa), weak=a.weak and b.weak and c.weak)


# ----------------------------------------------------------------------------- reductions


def sum(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:  # noqa: A001
    """Sum over ``axis`` (all axes when None); floats accumulate in f32/f64, in a fixed order."""
    return reduce("sum", x, axis, keepdims)


def max(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:  # noqa: A001
    """Maximum over ``axis``."""
    return reduce("max", x, axis, keepdims)


def min(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:  # noqa: A001
    """Minimum over ``axis``."""
    return reduce("min", x, axis, keepdims)


# ------------------------------------------------------------------------ index primitives


def _index(idx: Any, what: str) -> Value:
    t = tracer()
    idx = as_value(idx)
    if idx.ndim != 1:
        raise t.error(f"{what}: indices must be 1-D, got shape {idx.shape}")
    if t.kinds(idx.dtype) - {"int", "uint"}:
        raise t.error(f"{what}: indices must be integers, got {idx.dtype}; "
                      f"use cast(idx, i32) (floats truncate toward zero)")
    return idx


def gather(table: Any, idx: Any) -> Value:
    """``table[idx]``: rows of ``table`` picked by the 1-D integer ``idx``. An index outside
    ``[0, rows)`` makes the op fail (status code, nothing written)."""
    table, idx = as_value(table), _index(idx, "gather")
    if table.ndim < 1:
        raise tracer().error("gather: table must have at least one dim")
    return _emit1(ir.GatherOp(table.ssa, idx.ssa))


def scatter_add(values: Any, idx: Any, rows: DimLike) -> Value:
    """A ``(rows, *values.shape[1:])`` tensor of zeros with ``values[n]`` added to row ``idx[n]``;
    duplicate indices are summed in index order (deterministically on every backend).
    An index outside ``[0, rows)`` makes the op fail."""
    t = tracer()
    values, idx = as_value(values), _index(idx, "scatter_add")
    if values.ndim < 1 or values.shape[0] != idx.shape[0]:
        raise t.error(f"scatter_add: values {values.shape} and indices {idx.shape} must share "
                      f"the leading dim")
    if t.kinds(values.dtype) == {"bool"}:
        values = cast(values, "i32")
    return _emit1(ir.ScatterAddOp(values.ssa, idx.ssa, _dim_name(rows)))


def bincount(idx: Any, rows: DimLike, dtype: dtypes.DType = dtypes.I32) -> Value:
    """How often each value in ``[0, rows)`` occurs in ``idx`` (a 1-D integer tensor)."""
    idx = _index(idx, "bincount")
    if not isinstance(dtype, dtypes.DType) or not dtype.is_int:
        raise tracer().error("bincount: count dtype must be an integer type")
    return _emit1(ir.BincountOp(idx.ssa, _dim_name(rows), dtype.name))


def unpack_bits(packed: Any, n: DimLike) -> Value:
    """A bool mask of length ``n`` from a bit-packed u8 tensor (flag i is bit ``i % 8`` of byte
    ``i // 8``, LSB first) or from a bool tensor (one flag per element). The caller's tensor must
    cover ``n`` flags (checked at run time)."""
    packed = as_value(packed)
    t = tracer()
    if packed.ndim != 1:
        raise t.error(f"unpack_bits: packed mask must be 1-D, got {packed.shape}")
    ok = all(d == dtypes.BOOL or d == dtypes.U8 for d in t.members(packed.dtype))
    if not ok:
        raise t.error(f"unpack_bits: mask dtype must be u8 or bool, got {packed.dtype}")
    return _emit1(ir.UnpackBitsOp(packed.ssa, _dim_name(n)))


# ------------------------------------------------------------------------------ creation


def full(shape: Sequence[DimLike], value: Any, dtype: dtypes.DType | DTypeVar | None = None) -> Value:
    """A tensor of ``shape`` filled with ``value`` (dtype defaults to the value's)."""
    v = as_value(value)
    if dtype is not None:
        v = cast(v, dtype)
    names = [_dim_name(d) for d in shape]
    return _emit1(ir.FullOp(v.ssa, ir.TensorType.make(names, v.dtype)))


def zeros(shape: Sequence[DimLike], dtype: dtypes.DType | DTypeVar = dtypes.F32) -> Value:
    """A tensor of zeros."""
    return full(shape, 0, dtype)


def iota(shape: Sequence[DimLike], axis: int = 0, dtype: dtypes.DType = dtypes.I64) -> Value:
    """Integer tensor whose value is its index along ``axis`` (``iota((V,))`` is arange(V))."""
    names = [_dim_name(d) for d in shape]
    if not names:
        raise tracer().error("iota(): shape must have at least one dim")
    if not isinstance(dtype, dtypes.DType) or not dtype.is_int:
        raise tracer().error("iota(): dtype must be a concrete integer dtype")
    return _emit1(ir.IotaOp(axis % len(names), ir.TensorType.make(names, dtype.name)))


# ------------------------------------------------------------------------- preconditions


def check(cond: Any, message: str, status: str = "param") -> None:
    """Run-time precondition: ``check(label_smoothing == 0, ...)`` on attributes and sizes, or a
    bool tensor every element of which must hold (``check((t >= 0) & (t < size(V)), ...,
    status="index")``). When it fails the op returns the ABI's ``param``, ``shape`` or ``index``
    status and writes nothing."""
    c = as_value(cond)
    if c.dtype != "bool":
        raise tracer().error("check(): condition must be bool (compare first)")
    if status not in ir.CHECK_STATUSES:
        raise tracer().error(f"check(): status must be one of {', '.join(ir.CHECK_STATUSES)}, got {status!r}")
    if not isinstance(message, str) or not message:
        raise tracer().error("check(): message must be a non-empty string")
    tracer().emit(ir.CheckOp(c.ssa, message, status))


def reject(message: str, status: str = "param") -> None:
    """Declare the current combination of optional tensors unsupported. ``status`` is ``null``
    (a required pointer is missing) or ``param``."""
    if status not in ("null", "param"):
        raise tracer().error(f"reject(): status must be 'null' or 'param', got {status!r}")
    raise Variant(message, status)


__all__ += ["Value", "matmul"]
