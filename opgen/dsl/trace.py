"""Tracing: running an op's Python body on symbolic values that record ``opgen`` IR.

A :class:`Value` stands for one SSA value of the function being built. Operators on values
(``+``, ``*``, ``@``, ``==``, ``x[:, None]``, ``x.T``) and the primitives in
:mod:`opgen.dsl.primitives` append ops to the current :class:`Tracer`'s block, applying numpy's
broadcasting and the dtype promotion rules of :func:`opgen.dtypes.promote`.
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.ir import Block, Operation, SSAValue
from xdsl.utils.exceptions import VerifyException

from opgen import dtypes
from opgen.dsl.spec import DSLError, DTypeVar
from opgen.ir import dialect as ir

_OPGEN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CURRENT: contextvars.ContextVar[Tracer | None] = contextvars.ContextVar("opgen_tracer", default=None)


def user_location() -> str:
    """``file:line`` of the innermost stack frame outside the opgen package (the op's source)."""
    f = sys._getframe(1)
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(_OPGEN_DIR + os.sep) and "importlib" not in fn:
            return f"{os.path.relpath(fn)}:{f.f_lineno}"
        f = f.f_back  # type: ignore[assignment]
    return "<unknown>"


class Variant(Exception):
    """Raised by :func:`opgen.dsl.reject` to mark an optional-parameter combination invalid."""

    def __init__(self, message: str, status: str):
        super().__init__(message)
        self.status = status


@dataclass
class Tracer:
    """The function being built: its block, dtype variables and the op name for messages."""

    op_name: str
    block: Block
    dtype_vars: dict[str, DTypeVar]
    #: ``file:line`` for errors raised after the op body has returned (checks of its outputs),
    #: when no frame of the op's source is on the stack any more.
    location: str | None = None

    def __enter__(self) -> Tracer:
        self._token = _CURRENT.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self._token)

    def emit(self, op: Operation) -> Operation:
        self.block.add_op(op)
        try:
            op.verify_()  # the whole function is verified once complete
        except VerifyException as e:
            raise self.error(str(e)) from None
        return op

    def error(self, msg: str) -> DSLError:
        return DSLError(f"{self.location or user_location()}: in op '{self.op_name}': {msg}")

    # --------------------------------------------------------------- dtype rules
    def members(self, name: str) -> tuple[dtypes.DType, ...]:
        if name in dtypes.BY_NAME:
            return (dtypes.BY_NAME[name],)
        return self.dtype_vars[name].members

    def kinds(self, name: str) -> set[str]:
        return {d.kind for d in self.members(name)}

    def promote(self, a: str, b: str) -> str:
        """Promote two dtype names (concrete or variables); ambiguous results are an error."""
        if a == b:
            return a
        results = {dtypes.promote(x, y).name for x in self.members(a) for y in self.members(b)}
        if len(results) == 1:
            return results.pop()
        for cand in (a, b):
            if cand not in dtypes.BY_NAME:
                ma = self.members(cand)
                other = b if cand == a else a
                if all(dtypes.promote(x, y) == x for x in ma for y in self.members(other)):
                    return cand
        raise self.error(f"cannot promote {a} and {b}: the result depends on the binding "
                         f"(cast one side explicitly)")


def tracer() -> Tracer:
    t = _CURRENT.get()
    if t is None:
        raise DSLError(f"{user_location()}: DSL primitives can only be used inside an @op body "
                       f"being traced")
    return t


class Value:
    """A traced tensor (rank 0 = scalar). Reads like a numpy array."""

    __array_priority__ = 1000

    def __init__(self, ssa: SSAValue, weak: bool = False):
        self.ssa = ssa
        self.weak = weak  # a scalar attribute/literal: adopts the other operand's dtype

    # ------------------------------------------------------------- inspection
    @property
    def type(self) -> ir.TensorType:
        return ir.tensor_type(self.ssa)

    @property
    def shape(self) -> tuple[str, ...]:
        """The symbolic shape (dim names, or digits for literal sizes)."""
        return self.type.shape

    @property
    def dtype(self) -> str:
        """The element type's name (a dtype or a dtype variable)."""
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return self.type.rank

    def __repr__(self) -> str:
        return f"<opgen value {list(self.shape)} {self.dtype}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        raise tracer().error("a traced value has no Python truth value; use where()/check() "
                             "instead of if/and/or on tensors")

    def __iter__(self) -> Any:
        raise tracer().error("traced values cannot be iterated")

    # ------------------------------------------------------------- arithmetic
    def __add__(self, o: Any) -> Value: return binary(ir.AddOp, self, o)
    def __radd__(self, o: Any) -> Value: return binary(ir.AddOp, o, self)
    def __sub__(self, o: Any) -> Value: return binary(ir.SubOp, self, o)
    def __rsub__(self, o: Any) -> Value: return binary(ir.SubOp, o, self)
    def __mul__(self, o: Any) -> Value: return binary(ir.MulOp, self, o)
    def __rmul__(self, o: Any) -> Value: return binary(ir.MulOp, o, self)
    def __truediv__(self, o: Any) -> Value: return binary(ir.DivOp, self, o, float_result=True)
    def __rtruediv__(self, o: Any) -> Value: return binary(ir.DivOp, o, self, float_result=True)
    def __pow__(self, o: Any) -> Value: return binary(ir.PowOp, self, o, float_result=True)
    def __rpow__(self, o: Any) -> Value: return binary(ir.PowOp, o, self, float_result=True)
    def __and__(self, o: Any) -> Value: return binary(ir.AndOp, self, o)
    def __rand__(self, o: Any) -> Value: return binary(ir.AndOp, o, self)
    def __or__(self, o: Any) -> Value: return binary(ir.OrOp, self, o)
    def __ror__(self, o: Any) -> Value: return binary(ir.OrOp, o, self)
    def __neg__(self) -> Value: return unary(ir.NegOp, self)
    def __invert__(self) -> Value: return unary(ir.NotOp, self)
    def __abs__(self) -> Value: return unary(ir.AbsOp, self)
    def __matmul__(self, o: Any) -> Value: return matmul(self, o)
    def __rmatmul__(self, o: Any) -> Value: return matmul(o, self)

    def __eq__(self, o: Any) -> Value: return compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Value: return compare("ne", self, o)  # type: ignore[override]
    def __lt__(self, o: Any) -> Value: return compare("lt", self, o)
    def __le__(self, o: Any) -> Value: return compare("le", self, o)
    def __gt__(self, o: Any) -> Value: return compare("gt", self, o)
    def __ge__(self, o: Any) -> Value: return compare("ge", self, o)

    # ------------------------------------------------------------- methods
    @property
    def T(self) -> Value:  # noqa: N802 - numpy's name
        """Transpose of a 2-D tensor."""
        if self.ndim != 2:
            raise tracer().error(f".T needs a 2-D tensor, got shape {list(self.shape)}")
        return Value(tracer().emit(ir.TransposeOp(self.ssa, [1, 0])).results[0])

    def astype(self, dtype: dtypes.DType | DTypeVar) -> Value:
        """Convert to ``dtype`` (float->int truncates toward zero; see ``opgen.cast``)."""
        return cast(self, dtype)

    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:
        return reduce("sum", self, axis, keepdims)

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:
        return reduce("max", self, axis, keepdims)

    def min(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:
        return reduce("min", self, axis, keepdims)

    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:
        return mean(self, axis, keepdims)

    def __getitem__(self, key: Any) -> Value:
        """``x[:, None]`` (new axes), ``x[..., a:b]`` (bounded slices; see opgen.dsl.shapes)."""
        from opgen.dsl.shapes import getitem

        return getitem(self, key)

    def reshape(self, *shape: Any) -> Value:
        """Row-major reshape: ``x.reshape(N, H * D)`` or ``x.reshape((N, H, D))``."""
        from opgen.dsl.shapes import reshape

        if len(shape) == 1 and isinstance(shape[0], tuple | list):
            shape = tuple(shape[0])
        return reshape(self, shape)


# ------------------------------------------------------------------ building helpers


def _emit1(op: Operation, weak: bool = False) -> Value:
    return Value(tracer().emit(op).results[0], weak)


def const(value: float | int | bool, dtype: str) -> Value:
    """A scalar constant of dtype ``dtype`` (weak: it adopts a partner's dtype)."""
    t = tracer()
    kinds = t.kinds(dtype)
    if isinstance(value, float) and kinds <= {"int", "uint", "bool"}:
        raise t.error(f"float literal {value} used as {dtype}")
    return _emit1(ir.ConstantOp(value, dtype), weak=True)


def as_value(x: Any, like: Value | None = None) -> Value:
    """Wrap a Python scalar as a weak constant typed after ``like``."""
    if isinstance(x, Value):
        return x
    t = tracer()
    if isinstance(x, bool):
        return const(x, "bool")
    if isinstance(x, int | float):
        if like is not None:
            lk = t.kinds(like.dtype)
            if lk == {"float"} or (isinstance(x, int) and lk <= {"int", "uint"}):
                return const(x, like.dtype)
            if lk == {"bool"} and isinstance(x, int):
                return const(x, "i32")
        return const(x, "f32" if isinstance(x, float) else "i64")
    raise t.error(f"cannot use {type(x).__name__} {x!r} as a tensor value")


def cast(x: Value, dtype: dtypes.DType | DTypeVar | str) -> Value:
    name = dtype if isinstance(dtype, str) else dtype.name
    x = as_value(x)
    if x.dtype == name:
        return x
    return _emit1(ir.CastOp(x.ssa, name), weak=x.weak)


def broadcast_shapes(a: Sequence[str], b: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else "1"
        db = b[len(b) - 1 - i] if i < len(b) else "1"
        if da == db or db == "1":
            out.append(da)
        elif da == "1":
            out.append(db)
        else:
            raise tracer().error(f"shapes {tuple(a)} and {tuple(b)} do not broadcast "
                                 f"(dim {da} vs {db})")
    return out[::-1]


def broadcast_to(x: Value, shape: Sequence[str], dim_map: Sequence[int] | None = None) -> Value:
    """Broadcast ``x`` to ``shape`` (right-aligned like numpy unless ``dim_map`` is given)."""
    shape = list(shape)
    if dim_map is None:
        if x.ndim > len(shape):
            raise tracer().error(f"cannot broadcast shape {x.shape} to {tuple(shape)}")
        dim_map = list(range(len(shape) - x.ndim, len(shape)))
    if list(x.shape) == shape:
        return x
    return _emit1(ir.BroadcastOp(x.ssa, dim_map, ir.TensorType.make(shape, x.dtype)), weak=x.weak)


def _unify(a: Any, b: Any, float_result: bool = False) -> tuple[Value, Value]:
    t = tracer()
    a = as_value(a, b if isinstance(b, Value) else None)
    b = as_value(b, a)
    if a.weak != b.weak:
        w, s = (a, b) if a.weak else (b, a)
        wk, sk = t.kinds(w.dtype), t.kinds(s.dtype)
        weak_wins = (wk == {"float"} and sk != {"float"}) or (sk == {"bool"} and wk != {"bool"})
        dt = t.promote(a.dtype, b.dtype) if weak_wins else s.dtype
    else:
        dt = t.promote(a.dtype, b.dtype)
    if float_result and t.kinds(dt) != {"float"}:
        dt = "f32"
    shape = broadcast_shapes(a.shape, b.shape)
    weak = a.weak and b.weak
    a2, b2 = broadcast_to(cast(a, dt), shape), broadcast_to(cast(b, dt), shape)
    a2.weak = b2.weak = weak
    return a2, b2


def binary(cls: type[ir.BinaryOp], a: Any, b: Any, float_result: bool = False) -> Value:
    a, b = _unify(a, b, float_result)
    return _emit1(cls(a.ssa, b.ssa), weak=a.weak and b.weak)


def compare(pred: str, a: Any, b: Any) -> Value:
    a, b = _unify(a, b)
    return _emit1(ir.CmpOp(pred, a.ssa, b.ssa))


def unary(cls: type[ir.UnaryOp], x: Any) -> Value:
    x = as_value(x)
    if cls.FLOAT_ONLY and tracer().kinds(x.dtype) != {"float"}:
        x = cast(x, "f32")
    return _emit1(cls(x.ssa), weak=x.weak)


def _axes(x: Value, axis: int | Sequence[int] | None) -> list[int]:
    if axis is None:
        return list(range(x.ndim))
    ax = [axis] if isinstance(axis, int) else list(axis)
    out = []
    for a in ax:
        if not -x.ndim <= a < x.ndim:
            raise tracer().error(f"axis {a} out of range for shape {x.shape}")
        out.append(a % x.ndim)
    return sorted(set(out))


def reduce(kind: str, x: Any, axis: int | Sequence[int] | None, keepdims: bool) -> Value:
    x = as_value(x)
    ax = _axes(x, axis)
    if not ax:
        return x
    if kind == "sum" and tracer().kinds(x.dtype) == {"bool"}:
        x = cast(x, "i32")
    r = _emit1(ir.ReduceOp(x.ssa, kind, ax))
    if keepdims:
        shape = ["1" if i in ax else d for i, d in enumerate(x.shape)]
        r = broadcast_to(r, shape, [i for i in range(x.ndim) if i not in ax])
    return r


def size(d: Any) -> Value:
    """The run-time size of a dim as an i64 scalar."""
    if isinstance(d, int) and not isinstance(d, bool):
        return const(d, "i64")
    if not isinstance(d, str) and not hasattr(d, "name"):
        raise tracer().error(f"size(): {d!r} is not a dim")
    name = d if isinstance(d, str) else d.name
    if not name.isidentifier():  # a derived dim (D // 2)
        from opgen.dsl.shapes import size_of

        return size_of(name)
    return _emit1(ir.DimOp(name), weak=True)


def mean(x: Any, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Value:
    x = as_value(x)
    ax = _axes(x, axis)
    total = reduce("sum", x, ax, keepdims)
    count: Value | None = None
    for a in ax:
        s = size(x.shape[a]) if not x.shape[a].isdigit() else const(int(x.shape[a]), "i64")
        count = s if count is None else count * s
    return total / count if count is not None else total


def matmul(a: Any, b: Any) -> Value:
    t = tracer()
    a, b = as_value(a), as_value(b)
    if a.ndim != 2 or b.ndim != 2:
        raise t.error(f"matmul needs 2-D operands, got {a.shape} @ {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise t.error(f"matmul inner dims differ: {a.shape} @ {b.shape}")
    dt = t.promote(a.dtype, b.dtype)
    if t.kinds(dt) != {"float"}:
        raise t.error(f"matmul needs floating operands, got {a.dtype} and {b.dtype}")
    return _emit1(ir.MatmulOp(cast(a, dt).ssa, cast(b, dt).ssa))


def build(op_factory: Callable[[], Operation]) -> Value:
    return _emit1(op_factory())
