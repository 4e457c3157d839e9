"""Shape-changing primitives: slicing with bounds, ``concat``, ``reshape``, and the run-time
sizes of derived dims (``size(D // 2)``).

Derived dims (``D // 2``, ``D - D // 2``, ``H * D``) are canonical spellings (opgen.ir.dims).
Where a derived dim is only valid under a condition the tracer cannot prove — a slice's bounds
inside its axis, a reshape's groups holding equal element counts — an ``opgen.check`` with
status ``shape`` is recorded, so a call that breaks it fails before anything is written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opgen.dsl.spec import Batch, DimArith
from opgen.dsl.trace import Value, _emit1, as_value, broadcast_to, cast, const, tracer
from opgen.ir import dialect as ir
from opgen.ir import dims


def spelled(d: Any, what: str) -> str:
    """A dim-like (``Dim``, ``D // 2``, a non-negative int, a dim's name) as its spelling."""
    if isinstance(d, DimArith | Batch):
        return d.name
    if isinstance(d, int) and not isinstance(d, bool) and d >= 0:
        return str(d)
    if isinstance(d, str) and (d.isidentifier() or d.isdigit()):
        return d
    raise tracer().error(f"{what}: {d!r} is not a dim (a Dim, a dim expression or an int >= 0)")


def size_of(d: str) -> Value:
    """The run-time size of spelled dim ``d`` as a weak i64 scalar."""
    if d.isdigit():
        return const(int(d), "i64")
    head, args, plus = ir.split_dim(d)
    if head in ir.SIZE_OPS:
        v = _emit1(ir.SIZE_OPS[head](size_of(args[0]).ssa, size_of(args[1]).ssa))
    elif args:
        raise tracer().error(f"size(): {d} is not a dim of the DSL")
    else:
        v = _emit1(ir.DimOp(head))
    if plus:
        v = _emit1(ir.SizeAddOp(v.ssa, const(plus, "i64").ssa))
    return Value(v.ssa, weak=True)


def _check(cond: Value, message: str) -> None:
    tracer().emit(ir.CheckOp(cond.ssa, message, "shape"))


def _bound(b: Any, dim: str, default: str) -> str:
    if b is None:
        return default
    if isinstance(b, int) and not isinstance(b, bool) and b < 0:
        try:
            return dims.sub(dim, str(-b))
        except ValueError:
            raise tracer().error(f"slice bound {b} of dim {dim}") from None
    return spelled(b, "slice bound")


def slice_axis(x: Value, axis: int, start: Any, stop: Any) -> Value:
    """``x[..., start:stop, ...]`` on ``axis`` (bounds: dims, dim expressions, ints; a negative
    int counts from the end). Unlike numpy, bounds outside the axis are an error (status
    ``shape``) rather than clamped."""
    dim = x.shape[axis]
    lo, hi = _bound(start, dim, "0"), _bound(stop, dim, dim)
    try:
        length = dims.sub(hi, lo)
    except ValueError:
        raise tracer().error(f"slice [{lo}:{hi}] of dim {dim} has a negative length") from None
    if lo == "0" and hi == dim:
        return x
    fits = dims.form(dim) - dims.form(hi)
    if not (dims.form(hi) - dims.form(lo)).provably_nonnegative or not fits.provably_nonnegative:
        ok = (size_of(lo) <= size_of(hi)) & (size_of(hi) <= size_of(dim))
        _check(ok, f"slice [{lo}:{hi}] is outside dim {dim}")
    return _emit1(ir.SliceOp(x.ssa, axis, lo, length), weak=x.weak)


def getitem(x: Value, key: Any) -> Value:
    """``x[...]`` with ``:``, bounded slices (step 1) and ``None`` (a new axis of size 1)."""
    t = tracer()
    keys = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in keys) > 1:
        raise t.error("an index can only have a single ellipsis ('...')")
    if Ellipsis in keys:
        i = keys.index(Ellipsis)
        n_real = sum(k is not None and k is not Ellipsis for k in keys)
        keys = keys[:i] + (slice(None),) * (x.ndim - n_real) + keys[i + 1:]
    for k in keys:
        if not (k is None or isinstance(k, slice)):
            raise t.error(f"indexing supports ':', bounded slices 'a:b' and None (got {k!r}); "
                          f"use gather() to select rows")
        if isinstance(k, slice) and k.step not in (None, 1):
            raise t.error(f"slices take no step (got {k.step!r})")
    n_colon = sum(k is not None for k in keys)
    if n_colon > x.ndim:
        raise t.error(f"too many indices for a rank-{x.ndim} tensor")
    keys = keys + (slice(None),) * (x.ndim - n_colon)
    axis = 0
    for k in keys:
        if k is not None:
            if k != slice(None):
                x = slice_axis(x, axis, k.start, k.stop)
            axis += 1
    shape: list[str] = []
    dim_map: list[int] = []
    src = iter(x.shape)
    for k in keys:
        if k is None:
            shape.append("1")
        else:
            dim_map.append(len(shape))
            shape.append(next(src))
    return broadcast_to(x, shape, dim_map)


def concat(parts: Sequence[Any], axis: int = 0) -> Value:
    """The tensors of ``parts`` joined along ``axis`` (numpy's ``concatenate``): equal ranks,
    every other dim spelled alike; dtypes promote as in arithmetic."""
    t = tracer()
    if isinstance(parts, Value) or len(parts) < 2:
        raise t.error("concat() takes a list of at least two tensors")
    vals = [as_value(p) for p in parts]
    dt = vals[0].dtype
    for v in vals[1:]:
        dt = t.promote(dt, v.dtype)
    vals = [cast(v, dt) for v in vals]
    rank = vals[0].ndim
    if any(v.ndim != rank for v in vals) or rank == 0:
        raise t.error(f"concat(): operands need one rank >= 1, got {[v.shape for v in vals]}")
    if not -rank <= axis < rank:
        raise t.error(f"concat(): axis {axis} out of range for rank {rank}")
    axis %= rank
    for v in vals[1:]:
        if any(a != b for i, (a, b) in enumerate(zip(v.shape, vals[0].shape, strict=True)) if i != axis):
            raise t.error(f"concat(): shapes {vals[0].shape} and {v.shape} differ off axis {axis}")
    weak = all(v.weak for v in vals)
    return _emit1(ir.ConcatOp([v.ssa for v in vals], axis), weak=weak)


def _product(names: Sequence[str]) -> Value:
    if not names:
        return const(1, "i64")
    out = size_of(names[0])
    for n in names[1:]:
        out = Value(_emit1(ir.SizeMulOp(out.ssa, size_of(n).ssa)).ssa, weak=True)
    return out


def reshape(x: Value, shape: Sequence[Any]) -> Value:
    """``x`` reshaped row-major to ``shape`` (dims, dim expressions, ints). Consecutive axes
    regroup: a group's element counts must agree, checked at run time unless the dims show it
    (``(N, H, D) -> (N, H * D)`` needs no check)."""
    dst = [spelled(d, "reshape") for d in shape]
    if not dst and x.ndim == 0:
        return x
    for src_ax, dst_ax in dims.reshape_groups(x.shape, dst):
        a, b = [x.shape[i] for i in src_ax], [dst[j] for j in dst_ax]
        fa = sorted(f for d in a for f in dims.factors(d) if f != "1")
        fb = sorted(f for d in b for f in dims.factors(d) if f != "1")
        if fa != fb:
            pa, pb = _product(a), _product(b)
            _check((pa == pb) & (pa < const(dims.I64_MAX, "i64")),
                   f"reshape: {' * '.join(a) or '1'} elements do not fill {' * '.join(b) or '1'}")
    if list(dst) == list(x.shape):
        return x
    return _emit1(ir.ReshapeOp(x.ssa, dst), weak=x.weak)
