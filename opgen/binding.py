"""Binding concrete arguments to an op's signature: dims, dtype variables, variant, validation.

The same rules are generated into the C ABI's validation (issue 3); here they serve the oracle
and the Python runtime. Every failure is an :class:`OpError` carrying an abstract status that
each ABI maps to its own code: ``null``, ``param``, ``shape``, ``dtype``, ``strides``, ``index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgen import dtypes
from opgen.dsl.opdef import OpDef, Rejected
from opgen.dsl.spec import AttrSpec, Batch, DTypeVar, SizeSpec, TensorSpec
from opgen.ir.dialect import FuncOp

STATUSES = ("null", "param", "shape", "dtype", "strides", "index", "workspace", "alloc", "internal")


class OpError(Exception):
    """An op call rejected with an abstract status (see :data:`STATUSES`)."""

    def __init__(self, status: str, message: str):
        assert status in STATUSES, status
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message


def to_numpy(x: Any) -> np.ndarray:
    """numpy view of an array-like (torch CPU tensors included, bf16 via ml_dtypes)."""
    if isinstance(x, np.ndarray):
        return x
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        if x.dtype == torch.bfloat16:
            return x.detach().view(torch.int16).numpy().view(dtypes.BF16.np_dtype)
        return x.detach().numpy()
    return np.asarray(x)


@dataclass
class Binding:
    """A validated call: which variant, dim sizes, dtype variables, logical arrays."""

    op: OpDef
    func: FuncOp
    dims: dict[str, int] = field(default_factory=dict)
    dtypes: dict[str, dtypes.DType] = field(default_factory=dict)
    batch_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # logical shape views
    scalars: dict[str, float | int | bool] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # caller's arrays (full shape)

    def resolve(self, name: str) -> dtypes.DType:
        return dtypes.BY_NAME[name] if name in dtypes.BY_NAME else self.dtypes[name]


def _bind_dtype(b: Binding, pname: str, spec_dt: dtypes.DType | DTypeVar, got: dtypes.DType) -> None:
    allowed = spec_dt.members if isinstance(spec_dt, DTypeVar) else (spec_dt,)
    if got not in allowed:
        raise OpError("dtype", f"{pname}: dtype {got} not in {{{', '.join(map(str, allowed))}}}")
    if isinstance(spec_dt, DTypeVar):
        prev = b.dtypes.setdefault(spec_dt.name, got)
        if prev != got:
            raise OpError("dtype", f"{pname}: dtype {got} but {spec_dt.name} is already {prev}")


def _bind_dim(b: Binding, pname: str, name: str, size: int) -> None:
    prev = b.dims.setdefault(name, size)
    if prev != size:
        raise OpError("shape", f"{pname}: dim {name} is {size} but was bound to {prev}")


def _bind_tensor(b: Binding, pname: str, spec: TensorSpec, arr: np.ndarray) -> np.ndarray:
    try:
        got = dtypes.from_numpy(arr.dtype)
    except KeyError:
        raise OpError("dtype", f"{pname}: unsupported dtype {arr.dtype}") from None
    _bind_dtype(b, pname, spec.dtype, got)
    shape = arr.shape
    lead = spec.shape[0] if spec.shape else None
    n_fixed = len(spec.shape) - (1 if isinstance(lead, Batch) else 0)
    if isinstance(lead, Batch):
        nb = len(shape) - n_fixed
        if not lead.min_rank <= nb <= lead.max_rank:
            raise OpError("shape", f"{pname}: rank {len(shape)} not in "
                                   f"[{lead.min_rank + n_fixed}, {lead.max_rank + n_fixed}]")
        bshape = tuple(shape[:nb])
        prev = b.batch_shapes.setdefault(lead.name, bshape)
        if prev != bshape:
            raise OpError("shape", f"{pname}: leading shape {bshape} differs from {prev}")
        _bind_dim(b, pname, lead.name, int(np.prod(bshape, dtype=np.int64)))
        rest, rest_spec = shape[nb:], spec.shape[1:]
        logical = arr.reshape((b.dims[lead.name], *rest))
    else:
        if len(shape) != len(spec.shape):
            raise OpError("shape", f"{pname}: expected rank {len(spec.shape)} "
                                   f"{spec.logical_shape}, got shape {shape}")
        rest, rest_spec = shape, spec.shape
        logical = arr
    for d, n in zip(rest_spec, rest, strict=True):
        if isinstance(d, int):
            if n != d:
                raise OpError("shape", f"{pname}: dim must be {d}, got {n}")
        else:
            _bind_dim(b, pname, d.name, int(n))
    if (spec.last_contiguous and arr.ndim and arr.size and arr.shape[-1] > 1
            and arr.strides[-1] != arr.itemsize):  # an empty array's strides mean nothing
        raise OpError("strides", f"{pname}: last dim must be contiguous")
    return logical


def bind(op: OpDef, args: dict[str, Any]) -> Binding:
    """Validate ``args`` (by parameter name) against ``op``'s signature and pick the variant."""
    sig = op.signature
    unknown = set(args) - {p.name for p in sig.params}
    if unknown:
        raise OpError("param", f"{op.name}: unknown argument(s) {sorted(unknown)}")
    present = [p.name for p in sig.optionals if args.get(p.name) is not None]
    variant = op.variant_for(present)
    if isinstance(variant, Rejected):
        raise OpError(variant.status, f"{op.name}: {variant.message}")
    b = Binding(op, variant)
    pending_outputs = []
    for p in sig.params:
        v = args.get(p.name)
        if isinstance(p.spec, TensorSpec):
            if v is None:
                if p.is_output and not p.optional:
                    pending_outputs.append(p)
                elif not p.optional:
                    raise OpError("null", f"{op.name}: required tensor '{p.name}' is missing")
                continue
            arr = to_numpy(v)
            logical = _bind_tensor(b, p.name, p.spec, arr)
            b.arrays[p.name] = logical
            if p.is_output:
                b.outputs[p.name] = arr
        elif isinstance(p.spec, AttrSpec):
            if v is None:
                if not p.spec.has_default:
                    raise OpError("null", f"{op.name}: attribute '{p.name}' is required")
                v = p.spec.default
            b.scalars[p.name] = _attr_value(p.spec, p.name, v)
        elif isinstance(p.spec, SizeSpec):
            if v is None:
                raise OpError("null", f"{op.name}: size '{p.name}' is required")
            if int(v) < 0:
                raise OpError("param", f"{op.name}: size '{p.name}' must be >= 0")
            _bind_dim(b, p.name, p.spec.dim.name, int(v))
            b.scalars[p.name] = int(v)
    for p in pending_outputs:  # allocate outputs whose shape is fully bound by the inputs
        spec = p.spec
        assert isinstance(spec, TensorSpec)
        if isinstance(spec.dtype, DTypeVar) and spec.dtype.name not in b.dtypes:
            raise OpError("null", f"{op.name}: output '{p.name}' must be given (its dtype "
                                  f"{spec.dtype.name} is not bound by any input)")
        shape = []
        for d in spec.shape:
            if isinstance(d, Batch):
                shape.extend(b.batch_shapes.get(d.name, (b.dims.get(d.name, -1),)))
            elif isinstance(d, int):
                shape.append(d)
            else:
                shape.append(b.dims.get(d.name, -1))
        if -1 in shape:
            raise OpError("null", f"{op.name}: output '{p.name}' must be given (its shape is "
                                  f"not bound by the inputs)")
        dt = spec.dtype if isinstance(spec.dtype, dtypes.DType) else b.dtypes[spec.dtype.name]
        arr = np.zeros(shape, dt.np_dtype)
        b.outputs[p.name] = arr
        b.arrays[p.name] = _bind_tensor(b, p.name, spec, arr)
    used = {ir_t.dtype for ir_t in (a.type for a in variant.body.block.args)}  # type: ignore[attr-defined]
    for dvar in sig.dtype_vars():
        if dvar not in b.dtypes and dvar in used:
            raise OpError("dtype", f"{op.name}: dtype variable {dvar} is not bound")
    return b


def _attr_value(spec: AttrSpec, name: str, v: Any) -> float | int | bool:
    if spec.dtype == dtypes.BOOL:
        return bool(v)
    if spec.dtype == dtypes.I64:
        if isinstance(v, float) and not float(v).is_integer():
            raise OpError("param", f"attribute '{name}' must be an integer, got {v}")
        iv = int(v)
        if iv >= 2**63:  # an unsigned 64-bit ABI value read as int64 (two's complement)
            iv -= 2**64
        return iv
    return float(np.float32(v))
