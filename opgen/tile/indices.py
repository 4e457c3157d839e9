"""Index tensors on the tile level: converted once, at the boundary.

The NPU kernels read every index tensor (the ``idx`` of a scatter-add, a bincount or a gather)
as int32 that is known to lie in range: before the kernels run, the host converts each index
parameter — whatever its dtype — to int32 in the workspace, checking that every value lies in
``[0, rows)`` for every row count it indexes (one small conversion kernel per *index* dtype, in
the runtime; the status ``index`` when a value does not). So index dtypes are not multiplied
into the op's kernel instances, as CANN's aclnn layer casts indices before its kernels.

Likewise a tensor parameter the op never reads (it only gives a size) has no dtype in a kernel.
A dtype variable typing only such parameters is *free*: the kernels are instantiated over the
other variables only, and the host serves every member of a free variable with them.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.ir import BlockArgument, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t

#: index dtypes the conversion kernels read (64-bit floats: no AI-core arithmetic)
INDEX_DTYPES = ("f32", "f16", "bf16", "i64", "i32", "i16", "i8", "u64", "u32", "u16", "u8", "bool")


class IndexUnsupported(ValueError):
    """An index tensor the boundary conversion cannot produce (computed on the device)."""


@dataclass
class IndexParam:
    """An index parameter: its name, its position and the row counts its values index."""

    name: str
    index: int
    bounds: list[str]


def index_root(v: SSAValue) -> BlockArgument:
    """The parameter an index value is (``p`` or ``cast(p)`` to an integer dtype)."""
    if isinstance(v.owner, ir.CastOp):
        v = v.owner.x
    if not isinstance(v, BlockArgument):
        raise IndexUnsupported("indices computed inside the op")
    return v


def index_params(func: ir.FuncOp) -> dict[str, IndexParam]:
    """The function's index parameters by name. Every use of one must be as indices (directly
    or through a cast to an integer dtype): the kernels never see its original values."""
    names = [a.data for a in func.arg_names.data]
    out: dict[str, IndexParam] = {}
    for op in func.body.block.ops:
        if isinstance(op, ir.GatherOp):
            rows = ir.tensor_type(op.table).shape[0]
        elif isinstance(op, ir.ScatterAddOp | ir.BincountOp):
            rows = ir.tensor_type(op.result).shape[0]
        else:
            continue
        p = index_root(op.idx)
        ip = out.setdefault(names[p.index], IndexParam(names[p.index], p.index, []))
        if rows not in ip.bounds:
            ip.bounds.append(rows)
    for ip in out.values():
        arg = func.body.block.args[ip.index]
        for use in arg.uses:
            u = use.operation
            if isinstance(u, ir.CastOp) and not _is_float(ir.tensor_type(u.result).dtype):
                continue
            if isinstance(u, ir.GatherOp | ir.ScatterAddOp | ir.BincountOp) and u.idx is arg:
                continue
            raise IndexUnsupported(f"the values of index tensor '{ip.name}' read as data")
    return out


def _is_float(dt: str) -> bool:
    return dt in ("f16", "bf16", "f32", "f64")


def unused_params(func: ir.FuncOp) -> set[str]:
    """Tensor parameters the function never reads (they only give sizes)."""
    names = [a.data for a in func.arg_names.data]
    outs = {n.data for n in func.body.block.last_op.names.data}  # type: ignore[union-attr]
    return {n for n, a in zip(names, func.body.block.args, strict=True)
            if not a.uses and n not in outs and ir.tensor_type(a).rank > 0}


def free_dtype_vars(func: ir.FuncOp) -> set[str]:
    """Dtype variables typing only index parameters and unread parameters (see the module
    docstring); the variables of outputs and of read data are never free. (A variable
    convert-at-boundary dropped from ``dtype_vars`` still types an unread parameter.)"""
    names = [a.data for a in func.arg_names.data]
    dvars = set(func.dtype_var_map()) | {d for a in func.body.block.args
                                         if (d := ir.tensor_type(a).dtype) not in dtypes.BY_NAME}
    try:
        special = set(index_params(func)) | unused_params(func)
    except IndexUnsupported:
        special = unused_params(func)
    used_by_data = {ir.tensor_type(a).dtype for n, a in zip(names, func.body.block.args, strict=True)
                    if n not in special}
    return {v for v in dvars if v not in used_by_data}


def mark_converted(k: t.KernelOp, func: ir.FuncOp) -> None:
    """Keep on kernel ``k`` the function's ``boundary_casts``: the parameters its host converts
    before it runs (read only cast to that dtype: opgen/lower/boundary.py)."""
    k.boundary_casts = func.boundary_casts
