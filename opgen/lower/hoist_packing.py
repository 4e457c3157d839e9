"""``hoist-packing``: a matmul inside loops that leave its right-hand operand B alone gets B
packed once, before the outermost of those loops, instead of at every call.

The CPU runtime's GEMMs pack B at each call: ``opgen_bgemm`` into its bf16 units' layout (bf16
pairs in groups of 16 columns), ``opgen_sgemm`` into panels of 32 columns. In a matmul chain's
tile loop the same B comes back for every row block: FLCE's ``W_j`` (``X_i W_j^T`` and
``G W_j``) is the same for all the row blocks of column block j, and under ``perf`` packing took
about as long as the AMX products themselves (an AMX machine). The pass places ``sched.pack`` (B into a ``local``
f32 buffer of round32(k) x round32(n) elements, room for either layout) right before that loop
and gives the matmul the packed buffer (``b_packed``); the printer calls the runtime's packing for
the instance's products there (``opgen_bpack`` for bf16, ``opgen_spack`` for f32 and f16,
which run on the f32 GEMM) and the matching GEMM in the loop (``opgen_bgemm_pb``, ``opgen_sgemm_pb``), whose
products are the same instructions on the same packed words: the same bits.

Conditions: the matmul sits inside a parallel loop (so it runs on one thread, and its local
buffers are per thread) and B is a ``local``/``temp`` buffer of an allocation (held in the compute
type: f32 for the narrow floats); each loop hoisted across neither writes B nor defines B, k or
n. The pack's ``products`` are the matmul's, or f32 (the f32 GEMM) where it has none.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s

#: the packed layout's row and column granule (the runtime's round32)
GRANULE = 32


def _inside(v: SSAValue, loop: Operation) -> bool:
    """Whether ``v`` is defined inside ``loop`` (by an op in it, or as a block argument of it)."""
    owner = v.owner if isinstance(v.owner, Operation) else v.owner.parent_op()
    return owner is not None and loop.is_ancestor(owner)


def hoist_target(mm: s.BufferMatmulOp) -> s.ForOp | None:
    """The outermost loop around ``mm`` that B's packing may go before, or None."""
    if mm.b_packed is not None or not isinstance(mm.b.owner, s.AllocOp):
        return None
    if s.buf_type(mm.b).role.data not in ("local", "temp"):
        return None
    target, p = None, mm.parent_op()
    while isinstance(p, s.ForOp):
        if mm.b in s.effects(p)[1] or any(_inside(v, p) for v in (mm.b, mm.k, mm.n)):
            break
        target, p = p, p.parent_op()
    while p is not None and not (isinstance(p, s.ForOp) and p.kind.data == "parallel"):
        p = p.parent_op()
    return target if p is not None else None


def _rounded(v: SSAValue, before: Operation) -> SSAValue:
    """``v`` rounded up to a multiple of GRANULE, by ops inserted before ``before``."""
    g = ir.ConstantOp(GRANULE, "i64")
    q = ir.CeilDivOp(v, g.result)
    r = ir.SizeMulOp(q.result, g.result)
    for new in (g, q, r):
        before.parent_block().insert_op_before(new, before)
    return r.result


def _spelled(d: str) -> str:
    return str(-(-int(d) // GRANULE) * GRANULE) if d.isdigit() else f"mul(cdiv({d},{GRANULE}),{GRANULE})"


def hoist(mm: s.BufferMatmulOp, loop: s.ForOp) -> None:
    """Pack ``mm``'s B before ``loop`` and hand the matmul the packed buffer."""
    b_alloc = mm.b.owner
    assert isinstance(b_alloc, s.AllocOp)
    ta, tb = (t.data for t in mm.trans.data)
    rows, cols = s.buf_type(mm.b).shape
    k_dim, n_dim = (cols, rows) if tb else (rows, cols)
    k_size, n_size = (b_alloc.sizes[1], b_alloc.sizes[0]) if tb else (b_alloc.sizes[0], b_alloc.sizes[1])
    alloc = s.AllocOp(s.BufType.make([_spelled(k_dim), _spelled(n_dim)], "f32", "local"),
                      [_rounded(k_size, loop), _rounded(n_size, loop)])
    loop.parent_block().insert_op_before(alloc, loop)
    products = mm.products.data if mm.products is not None else "f32"
    loop.parent_block().insert_op_before(s.PackOp(mm.b, alloc.result, mm.k, mm.n, bool(tb), products), loop)
    new = s.BufferMatmulOp(mm.a, mm.b, mm.c, mm.m, mm.n, mm.k, bool(ta), bool(tb), bool(mm.accumulate.data),
                           mm.products.data if mm.products is not None else None, mm.c_row, alloc.result)
    for name, value in mm.properties.items():
        if name != "operandSegmentSizes":
            new.properties.setdefault(name, value)
    new.attributes.update(mm.attributes)
    mm.parent_block().insert_op_before(new, mm)
    mm.detach()
    mm.erase()


class HoistPacking(ModulePass):
    """Pack a matmul's right-hand operand once, before the loops that leave it alone (module
    docstring)."""

    name = "hoist-packing"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for mm in list(op.walk()):
            if isinstance(mm, s.BufferMatmulOp) and (loop := hoist_target(mm)) is not None:
                hoist(mm, loop)
