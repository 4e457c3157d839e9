"""``matmul-into-output``: a matmul whose result only feeds an elementwise epilogue writes the
epilogue's output directly, and the epilogue then updates that output in place.

A linear layer ``relu(x @ w.T + b)`` lowers to a matmul into a workspace temporary the size of
the output, then a loop nest reading it and storing ``y``. Retargeted, the matmul writes ``y``
and the loop nest reads ``y`` where it read the temporary: no workspace of N x M floats (whose
fresh pages cost as much to fault in as to write), one output-sized stream fewer.

Valid because every element of the temporary is read only by the iteration that then stores the
same element of ``y``, and nothing else reads or writes ``y``. Exactly:

* the temporary is a ``temp`` buffer written only by one ``sched.matmul`` (as C, not
  accumulating, not also an operand) and otherwise only loaded;
* every load of it sits in the one loop body that, after those loads, stores into a caller
  output ``y`` at the same index values (one store: a second one, in another loop, would read
  ``y`` already overwritten);
* ``y`` has the temporary's shape and its dtype, stored as the matmul computes it in every
  instance (f32 or f64: not a dtype variable with a bf16 or f16 member) — or the epilogue is
  the identity (the store's value is the load, through casts only) and both operands are
  caller inputs (a bf16 linear layer: the runtime GEMM rounds each element once as it writes
  ``y``, ``opgen_gemm_bf16_out``) — is not a ``may_alias``
  parameter, and is used by nothing but those stores;
* the matmul comes before those loops in the kernel's body.

The k order of the matmul and every value computed are unchanged: results are bitwise the same.
An identity epilogue (``y = cast(t)``) is then a copy of ``y`` onto itself: it is removed.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.transforms.dead_code_elimination import DeadCodeElimination

from opgen.ir import dialect as ir
from opgen.lower import sched as s


def _top(op: Operation, k: s.KernelOp) -> Operation:
    """The ancestor of ``op`` directly in the kernel's body."""
    while op.parent_op() is not k:
        parent = op.parent_op()
        assert parent is not None
        op = parent
    return op


def _through_casts(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, ir.CastOp):
        v = v.owner.x
    return v


def target(k: s.KernelOp, alloc: s.AllocOp) -> tuple[SSAValue, s.StoreOp | None] | None:
    """The caller output the matmul into ``alloc``'s temporary may write instead (module
    docstring), with the epilogue's store when the epilogue is the identity; or None."""
    t = alloc.result
    if s.buf_type(t).role.data != "temp":
        return None
    users = [u.operation for u in t.uses]
    mms = [u for u in users if isinstance(u, s.BufferMatmulOp)]
    loads = [u for u in users if isinstance(u, s.LoadOp)]
    if len(mms) != 1 or len(mms) + len(loads) != len(users) or not loads:
        return None
    mm = mms[0]
    if mm.c is not t or t in (mm.a, mm.b) or mm.accumulate.data:
        return None
    names = k.param_names
    body_ops = list(k.body.block.ops)
    ys: set[SSAValue] = set()
    stores: set[Operation] = set()
    for ld in loads:
        block = ld.parent_block()
        assert block is not None
        ops = list(block.ops)
        later = [o for o in ops[ops.index(ld) + 1:] if isinstance(o, s.StoreOp) and o.buf in names
                 and len(o.idx) == len(ld.idx) and all(a is b for a, b in zip(o.idx, ld.idx, strict=True))]
        if not later or body_ops.index(_top(mm, k)) >= body_ops.index(_top(ld, k)):
            return None
        ys.add(later[0].buf)
        stores.add(later[0])
    if len(ys) != 1 or len(stores) != 1:  # (two stores: a second loop would read the first one's y)
        return None
    (y,) = ys
    (store,) = stores
    assert isinstance(store, s.StoreOp)
    identity = len(loads) == 1 and _through_casts(store.value) is loads[0].result
    b, tb = s.buf_type(y), s.buf_type(t)
    held = all(d.compute == d for d in k.dtype_options(b.dtype)) or (
        identity and all(s.buf_type(x).role.data == "in" for x in (mm.a, mm.b)))
    if (b.role.data != "out" or tuple(b.shape) != tuple(tb.shape) or b.dtype != tb.dtype or not held
            or names[y] in k.aliased or any(u.operation not in stores for u in y.uses)):
        return None
    return y, store if identity else None


class MatmulIntoOutput(ModulePass):
    """Let a matmul write its epilogue's output directly (module docstring)."""

    name = "matmul-into-output"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        removed = False
        for k in op.body.block.ops:
            if not isinstance(k, s.KernelOp):
                continue
            for alloc in [x for x in k.walk() if isinstance(x, s.AllocOp)]:
                if (found := target(k, alloc)) is None:
                    continue
                y, store = found
                alloc.result.replace_all_uses_with(y)
                alloc.detach()
                alloc.erase()
                if store is not None:  # y = y: nothing to do
                    store.detach()
                    store.erase(safe_erase=False)
                    removed = True
        if removed:  # (the epilogue's loop nest, now without effects, and the scalars only it used)
            DeadCodeElimination().apply(ctx, op)
