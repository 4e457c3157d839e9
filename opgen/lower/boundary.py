"""``convert-at-boundary``: read index and mask tensors in one dtype, converted once by the binder.

An op such as ``embedding_dense_backward`` accepts its indices in nine dtypes, but its first
step is always ``cast(indices) -> i64``: the rest of the kernel never sees the index dtype.
Printing a kernel per index dtype multiplies the generated code (8x for ``embedding_backward``)
for one different load instruction. This pass moves that cast to the call boundary:

* an input tensor parameter whose dtype is a dtype variable, and whose every read is an
  ``opgen.cast`` to one dtype ``D`` (``i64`` or ``bool``; directly, or through dtype-preserving
  ``opgen.broadcast`` ops) or the index operand of a gather/scatter-add/bincount (read as its
  i64 value), is retyped to ``D`` and its casts are removed. The function records
  it in ``boundary_casts`` (``{parameter: D}``); the runtime's binder converts such a tensor
  into a dense ``D`` copy in the workspace when its dtype is not ``D`` or its last dim is not
  contiguous, with the cast's exact semantics (``opgen.cast``: integers widen or wrap, floats
  truncate toward zero with NaN/out of range giving the minimum, anything->bool is ``!= 0``);
* a tensor parameter the function never reads (it only gives sizes) no longer types anything;
* ``dtype_vars`` keeps only the variables the function's values still depend on: the kernels
  are instantiated per binding of those (per compute type), and the binder matches any dtype
  for the others.

Range checks stay where the op wrote them (on the converted values), so every status and every
result bit is the same as with a kernel per index dtype.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from opgen.ir import dialect as ir

#: the dtypes a parameter may be converted to at the boundary
TARGETS = ("i64", "bool")
#: ops reading an operand ``idx`` as indices: any integer dtype, used as its i64 value
INDEXED = (ir.GatherOp, ir.ScatterAddOp, ir.BincountOp)


def read_only_as(v: SSAValue, targets: tuple[str, ...] = TARGETS) -> str | None:
    """The one dtype of :data:`TARGETS` that every read of ``v`` casts it to (through
    broadcasts), or None when some read uses the value in its own dtype (or ``v`` is unread)."""
    seen: set[str] = set()
    for use in v.uses:
        op = use.operation
        if isinstance(op, ir.CastOp):
            seen.add(ir.tensor_type(op.result).dtype)
        elif isinstance(op, INDEXED) and op.idx is v:  # indexes by the i64 value (opgen.gather)
            seen.add("i64")
        elif isinstance(op, ir.BroadcastOp):
            inner = read_only_as(op.result, targets)
            if inner is None:
                return None
            seen.add(inner)
        else:
            return None
    if len(seen) != 1:
        return None
    d = seen.pop()
    return d if d in targets else None


def _retype(v: SSAValue, dtype: str) -> None:
    """Give ``v`` (and the broadcasts of it) ``dtype``; its casts to ``dtype`` disappear."""
    t = ir.tensor_type(v)
    new = Rewriter.replace_value_with_new_type(v, ir.TensorType.make(t.shape, dtype))
    for use in list(new.uses):
        op = use.operation
        if isinstance(op, ir.CastOp):
            op.result.replace_all_uses_with(new)
            Rewriter.erase_op(op)
        elif isinstance(op, ir.BroadcastOp):
            _retype(op.results[0], dtype)


def indexes(v: SSAValue) -> bool:
    """Some read of ``v`` (directly or through casts and broadcasts) is the index operand of a
    gather/scatter-add/bincount."""
    for use in v.uses:
        op = use.operation
        if isinstance(op, INDEXED) and op.idx is v:
            return True
        if isinstance(op, ir.CastOp | ir.BroadcastOp) and indexes(op.results[0]):
            return True
    return False


def convert_params(func: ir.FuncOp, indices: bool = True, targets: tuple[str, ...] = TARGETS) -> dict[str, str]:
    """Apply the pass to one function; returns ``{parameter: dtype}`` of the converted ones.
    Without ``indices``, parameters read as indices are left alone (the tile level converts
    them to range-checked int32 itself: opgen/tile/indices.py); ``targets``: the dtypes it may
    convert to."""
    dvars = func.dtype_var_map()
    outs = {n.data for n in func.body.block.last_op.names.data}  # type: ignore[union-attr]
    names = [a.data for a in func.arg_names.data]
    done: dict[str, str] = {}
    for i, n in enumerate(names):
        a = func.body.block.args[i]
        if n in outs or ir.tensor_type(a).dtype not in dvars:
            continue
        d = read_only_as(a, targets)
        if d is not None and (indices or not indexes(a)):
            _retype(a, d)
            done[n] = d
    used: set[str] = set()
    for i, a in enumerate(func.body.block.args):
        if a.uses or names[i] in outs:
            used.add(ir.tensor_type(a).dtype)
    for op in func.body.walk():
        used.update(ir.tensor_type(r).dtype for r in op.results if isinstance(r.type, ir.TensorType))
    func.dtype_vars = DictionaryAttr({k: v for k, v in func.dtype_vars.data.items() if k in used})
    if done:
        func.boundary_casts = DictionaryAttr({k: StringAttr(v) for k, v in done.items()})
    return done


class ConvertAtBoundary(ModulePass):
    """Index and mask parameters read in one dtype, converted by the binder (module docstring;
    the NPU targets' variant: opgen/tile/boundary.py)."""

    name = "convert-at-boundary"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in op.body.block.ops:
            if isinstance(f, ir.FuncOp):
                convert_params(f)

