"""The numpy oracle: executes an op's L0 IR (not its Python body) on concrete arrays.

Floats are held in their compute type (f32 for f16/bf16/f32, f64 for f64) and rounded to the
storage dtype once, when an output is written (bf16 through ml_dtypes, round-to-nearest-even).
``precision="f64"`` instead computes every float in f64 and returns unrounded f64 outputs: the
exact-math reference the tests compare against PyTorch's float64 results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from opgen import dtypes
from opgen.binding import Binding, OpError, bind
from opgen.dsl.opdef import OpDef
from opgen.ir import dialect as ir
from opgen.ir import dims

Array = np.ndarray


class _Interp:
    def __init__(self, b: Binding, precision: str):
        self.b = b
        self.f64 = precision == "f64"
        self.env: dict[Any, Array] = {}

    # ------------------------------------------------------------------ types
    def np_type(self, t: ir.TensorType) -> np.dtype:
        d = self.b.resolve(t.dtype)
        if d.is_float:
            return np.dtype(np.float64) if self.f64 else d.compute.np_dtype
        return d.np_dtype

    def shape(self, t: ir.TensorType) -> tuple[int, ...]:
        return tuple(dims.evaluate(d, self.b.dims) for d in t.shape)

    def val(self, v: Any) -> Array:
        return self.env[v]

    def prevalidate(self, func: ir.FuncOp) -> None:
        """Run-time checks first (as the C ABI does): every scalar-only computation and its
        ``opgen.check``s, then mask lengths — before any index is looked at."""
        for op in func.body.block.ops:
            if isinstance(op, ir.CheckOp):
                if ir.tensor_type(op.cond).rank == 0 and op.cond in self.env:
                    self.check(op)
            elif isinstance(op, ir.UnpackBitsOp):
                _unpack_bits(self, op)
            elif (op.results and ir.tensor_type(op.results[0]).rank == 0 and type(op) in _HANDLERS
                  and all(o in self.env for o in op.operands)):
                rt = ir.tensor_type(op.results[0])
                self.env[op.results[0]] = np.asarray(_HANDLERS[type(op)](self, op)).astype(self.np_type(rt))

    def check(self, op: ir.CheckOp) -> None:
        """Fail with the check's status unless every element of its condition holds."""
        if not bool(np.all(self.val(op.cond))):
            raise OpError(op.status.data, f"{self.b.op.name}: {op.message.data}")

    # ------------------------------------------------------------------ run
    def run(self) -> dict[str, Array]:
        func = self.b.func
        for name, arg in zip((a.data for a in func.arg_names.data), func.body.block.args,
                             strict=True):
            t = ir.tensor_type(arg)
            if name in self.b.arrays:
                self.env[arg] = np.asarray(self.b.arrays[name]).astype(self.np_type(t))
            else:
                self.env[arg] = np.asarray(self.b.scalars[name]).astype(self.np_type(t))
        self.prevalidate(func)
        for op in func.body.block.ops:
            if isinstance(op, ir.ReturnOp):
                return {n.data: self.val(v) for n, v in zip(op.names.data, op.values, strict=True)}
            if isinstance(op, ir.CheckOp):
                self.check(op)  # a check on data: where the op puts it (again for scalar checks: no-op)
                continue
            if op.results and op.results[0] in self.env:
                continue
            handler = _HANDLERS.get(type(op))
            if handler is None:
                raise NotImplementedError(f"oracle: no rule for {op.name}")
            res = handler(self, op)
            rt = ir.tensor_type(op.results[0])
            res = np.asarray(res)
            want = self.shape(rt)
            if res.shape != want:
                res = np.broadcast_to(res, want)
            self.env[op.results[0]] = res.astype(self.np_type(rt), copy=False)
        raise AssertionError("function without return")


def _elementwise(fn: Callable[..., Array]) -> Callable[[_Interp, Any], Array]:
    def h(it: _Interp, op: Any) -> Array:
        with np.errstate(all="ignore"):
            return fn(*(it.val(o) for o in op.operands))
    return h


_ERF64 = np.frompyfunc(math.erf, 1, 1)


def _erf(x: Array) -> Array:
    """erf in float64 (math.erf), rounded once to ``x``'s dtype."""
    return np.asarray(_ERF64(np.asarray(x, np.float64)), np.float64).astype(x.dtype)


def _int_div(a: Array, b: Array) -> Array:
    """Float division, or integer division truncating toward zero with the kernels' total rules:
    ``x / 0`` is 0 and ``MIN / -1`` wraps to MIN (no trap, no undefined behaviour)."""
    if a.dtype.kind == "f":
        return a / b
    a, b = np.broadcast_arrays(a, b)
    safe = np.where((b == 0) | ((a.dtype.kind == "i") & (b == -1)), 1, b).astype(b.dtype)
    q = a // safe
    q = q + ((q * safe != a) & ((a < 0) != (safe < 0))).astype(q.dtype)  # floor -> toward zero
    if a.dtype.kind == "i":
        q = np.where(b == -1, np.negative(a), q)  # wraps for MIN
    return np.where(b == 0, 0, q).astype(a.dtype)


def _cast(it: _Interp, op: ir.CastOp) -> Array:
    x = it.val(op.x)
    to = it.b.resolve(ir.tensor_type(op.result).dtype)
    if to.is_bool:
        return x != 0
    if to.is_int and x.dtype.kind == "f":
        # truncation toward zero; NaN, +-Inf and values outside the target's range give its
        # minimum (signed) or maximum (unsigned), as the kernels' OPGEN_F2I does: a value that
        # every index check refuses
        lo, hi = to.int_range
        xd = np.asarray(x, np.float64)
        with np.errstate(all="ignore"):
            ok = (xd == xd) & (xd > float(lo) - 1.0) & (xd < float(hi) + 1.0)
            out = np.trunc(np.where(ok, xd, 0.0)).astype(to.np_dtype)
        out[~ok] = hi if to.kind == "uint" else lo
        return out
    return x.astype(it.np_type(ir.tensor_type(op.result)))


def _broadcast(it: _Interp, op: ir.BroadcastOp) -> Array:
    x = it.val(op.x)
    out_shape = it.shape(ir.tensor_type(op.result))
    expanded = [1] * len(out_shape)
    for i, d in enumerate(op.dim_map):
        expanded[d] = x.shape[i]
    return np.broadcast_to(x.reshape(expanded), out_shape)


def _reduce(it: _Interp, op: ir.ReduceOp) -> Array:
    x = it.val(op.x)
    ax = op.axis_list
    kind = op.kind.data
    if kind == "sum":
        return np.sum(x, axis=ax, dtype=x.dtype)
    if any(x.shape[a] == 0 for a in ax):
        raise OpError("shape", f"{kind}-reduction over an empty axis")
    return (np.max if kind == "max" else np.min)(x, axis=ax)


def _check_index(idx: Array, rows: int, what: str) -> Array:
    i = idx.astype(np.int64)
    if i.size and (i.min() < 0 or i.max() >= rows):
        bad = idx[(i < 0) | (i >= rows)][0]  # as given (a huge u64 wraps negative in i)
        raise OpError("index", f"{what}: index {bad} out of range [0, {rows})")
    return i


def _gather(it: _Interp, op: ir.GatherOp) -> Array:
    t = it.val(op.table)
    return t[_check_index(it.val(op.idx), t.shape[0], "gather")]


def _scatter_add(it: _Interp, op: ir.ScatterAddOp) -> Array:
    v = it.val(op.values)
    rt = ir.tensor_type(op.result)
    out = np.zeros(it.shape(rt), it.np_type(rt))
    i = _check_index(it.val(op.idx), out.shape[0], "scatter_add")
    with np.errstate(all="ignore"):  # IEEE results (inf - inf is NaN), as everywhere in the oracle
        for n in range(i.shape[0]):  # index order: the deterministic order every backend reproduces
            out[i[n]] += v[n]
    return out


def _bincount(it: _Interp, op: ir.BincountOp) -> Array:
    rt = ir.tensor_type(op.result)
    rows = it.shape(rt)[0]
    i = _check_index(it.val(op.idx), rows, "bincount")
    return np.bincount(i, minlength=rows)


def _matmul(it: _Interp, op: ir.MatmulOp) -> Array:
    a, b = it.val(op.lhs), it.val(op.rhs)
    if a.shape[1] == 0:
        return np.zeros((a.shape[0], b.shape[1]), a.dtype)
    return a @ b


def _unpack_bits(it: _Interp, op: ir.UnpackBitsOp) -> Array:
    p = it.val(op.packed)
    n = it.shape(ir.tensor_type(op.result))[0]
    if p.dtype == np.bool_:
        if p.shape[0] < n:
            raise OpError("shape", f"mask has {p.shape[0]} flags, needs {n}")
        return p[:n]
    if p.shape[0] * 8 < n:
        raise OpError("shape", f"packed mask has {p.shape[0] * 8} bits, needs {n}")
    return np.unpackbits(p.astype(np.uint8), bitorder="little")[:n].astype(bool)


def _iota(it: _Interp, op: ir.IotaOp) -> Array:
    rt = ir.tensor_type(op.result)
    shape = it.shape(rt)
    ax = op.axis.data
    r = np.arange(shape[ax], dtype=np.int64).reshape([-1 if i == ax else 1 for i in range(len(shape))])
    return np.broadcast_to(r, shape)


def _slice(it: _Interp, op: ir.SliceOp) -> Array:
    x = it.val(op.x)
    a = op.axis.data
    lo = dims.evaluate(op.start.data, it.b.dims)
    n = it.shape(ir.tensor_type(op.result))[a]
    return x[(slice(None),) * a + (slice(lo, lo + n),)]


def _size_op(fn: Callable[[int, int], int]) -> Callable[[_Interp, Any], Array]:
    return lambda it, op: np.asarray(fn(int(it.val(op.lhs)), int(it.val(op.rhs))), np.int64)


def _sigmoid(x: Array) -> Array:
    return 1 / (1 + np.exp(-x))


def _cmp(it: _Interp, op: ir.CmpOp) -> Array:
    f = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
         "gt": np.greater, "ge": np.greater_equal}[op.predicate.data]
    return f(it.val(op.lhs), it.val(op.rhs))


_HANDLERS: dict[type, Callable[[_Interp, Any], Array]] = {
    ir.ConstantOp: lambda it, op: np.asarray(op.number),
    ir.DimOp: lambda it, op: np.asarray(it.b.dims[op.dim.data], np.int64),
    ir.FullOp: lambda it, op: it.val(op.value),
    ir.IotaOp: _iota,
    ir.NegOp: _elementwise(np.negative),
    ir.AbsOp: _elementwise(np.abs),
    ir.ExpOp: _elementwise(np.exp),
    ir.LogOp: _elementwise(np.log),
    ir.SqrtOp: _elementwise(np.sqrt),
    ir.RsqrtOp: _elementwise(lambda x: 1 / np.sqrt(x)),
    ir.RecipOp: _elementwise(lambda x: 1 / x),
    ir.TanhOp: _elementwise(np.tanh),
    ir.SigmoidOp: _elementwise(_sigmoid),
    ir.ErfOp: _elementwise(_erf),
    ir.NotOp: _elementwise(np.logical_not),
    ir.AddOp: _elementwise(np.add),
    ir.SubOp: _elementwise(np.subtract),
    ir.MulOp: _elementwise(np.multiply),
    ir.DivOp: _elementwise(_int_div),
    ir.MaxOp: _elementwise(np.maximum),
    ir.MinOp: _elementwise(np.minimum),
    ir.PowOp: _elementwise(np.power),
    ir.AndOp: _elementwise(np.logical_and),
    ir.OrOp: _elementwise(np.logical_or),
    ir.CmpOp: _cmp,
    ir.SelectOp: _elementwise(np.where),
    ir.CastOp: _cast,
    ir.BroadcastOp: _broadcast,
    ir.SizeAddOp: _size_op(ir.SizeAddOp.EVAL),
    ir.SizeSubOp: _size_op(ir.SizeSubOp.EVAL),
    ir.SizeMulOp: _size_op(ir.SizeMulOp.EVAL),
    ir.SizeDivOp: _size_op(ir.SizeDivOp.EVAL),
    ir.SliceOp: _slice,
    ir.ConcatOp: lambda it, op: np.concatenate([it.val(p) for p in op.parts], axis=op.axis.data),
    ir.ReshapeOp: lambda it, op: np.reshape(it.val(op.x), it.shape(ir.tensor_type(op.result))),
    ir.TransposeOp: lambda it, op: np.transpose(it.val(op.x), op.permutation),
    ir.ReduceOp: _reduce,
    ir.GatherOp: _gather,
    ir.ScatterAddOp: _scatter_add,
    ir.BincountOp: _bincount,
    ir.MatmulOp: _matmul,
    ir.UnpackBitsOp: _unpack_bits,
}


def run_bound(b: Binding, precision: str = "native") -> dict[str, Array]:
    """Execute a bound call; returns each output in its caller-visible shape.

    ``native``: outputs rounded once to their storage dtype. ``f64``: exact-math f64 outputs.
    """
    logical = _Interp(b, precision).run()
    out: dict[str, Array] = {}
    for name, val in logical.items():
        target = b.outputs[name]
        exact = precision == "f64" and dtypes.from_numpy(target.dtype).is_float
        dt = np.dtype(np.float64) if exact else target.dtype
        out[name] = np.asarray(val).astype(dt).reshape(target.shape)
    return out


def run(op: OpDef, precision: str = "native", **args: Any) -> dict[str, Array]:
    """Bind ``args`` to ``op`` (validating them like the C ABI) and execute with the oracle.

    Outputs not passed are allocated when their shape follows from the inputs (zero-filled where
    the op reads them before writing; the values returned are new arrays either way).
    Raises :class:`opgen.binding.OpError` with the ABI-independent status on bad input.
    """
    return run_bound(bind(op, args), precision)
