"""``chunk-flat-loops``: a kernel's parallel loop over the elements of 1-D tensors, in chunks.

An elementwise op on 1-D tensors (an optimizer's step over a flat parameter vector, a 1-D
activation) lowers to a single parallel loop with a straight-line body::

    sched.for parallel lo to hi { x = p[i]; ...; q[i] = ... }

which map-cpu makes an ``omp parallel for`` and nothing more: no inner loop for ``omp simd``, no
strips, prefetches or streaming stores, which map-cpu gives only to a loop *inside* a parallel
loop walking rows. In the outlined OpenMP body the C compiler loses ``restrict``, and with several
pointers it gives up the runtime alias checks it would need, so such a loop stayed scalar (an
Adam step over 32M f32, 4 inputs and 3 outputs, 2 threads: 70 ms, PyTorch's fused Adam 16 ms).
This pass rewrites it as chunks of ``CHUNK`` elements::

    sched.for parallel 0 to ceil((hi - lo) / CHUNK) {     // omp_for: the chunks over the threads
      sched.for parallel lo + c * CHUNK to min(that + CHUNK, hi) attributes {flat} {...}
    }

and marks the inner loop ``flat``: map-cpu then reads each 1-D tensor indexed by its counter as
a row (cpu_map's ``_along_row``), so the loop becomes a ``stream`` loop like a row of a 2-D op:
strips of a cache line under ``omp simd``, prefetches ahead, staged stores, and streaming stores
into large outputs it never reads (the same Adam step: 20 ms). Every element is computed by the
same operations: the bits do not change.

Only that shape is rewritten: a ``parallel`` loop directly in the kernel whose body holds no
loop, branch, allocation, accumulation, matmul or opaque op, every store indexed by the counter
alone into a 1-D buffer (each iteration writes its own elements; loads are free).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.lower import sched as s

#: elements a chunk (a multiple of every strip: 64 KB of f32, 32 KB of bf16)
CHUNK = 16384
#: the unit attribute of a chunk's loop (read by map-cpu)
FLAT = "flat"


def flat_loop(loop: s.ForOp) -> bool:
    """Whether ``loop`` is the rewritten shape (module docstring)."""
    if loop.kind.data != "parallel" or not isinstance(loop.parent_op(), s.KernelOp):
        return False
    stores = 0
    for o in loop.body.block.ops:
        if isinstance(o, s.NOT_STRAIGHT):
            return False
        if isinstance(o, s.StoreOp):
            if list(o.idx) != [loop.iv]:
                return False
            stores += 1
    return stores > 0


def _chunk(loop: s.ForOp) -> None:
    where = InsertPoint.before(loop)
    size, less, zero = ir.ConstantOp(CHUNK, "i64"), ir.ConstantOp(CHUNK - 1, "i64"), ir.ConstantOp(0, "i64")
    n = ir.SubOp(loop.hi, loop.lo)
    up = ir.AddOp(n.result, less.result)
    count = ir.DivOp(up.result, size.result)
    for o in (size, less, zero, n, up, count):
        Rewriter.insert_op(o, where)
    outer = s.ForOp(zero.result, count.result, "parallel", "c")
    at = ir.MulOp(outer.iv, size.result)
    start = ir.AddOp(loop.lo, at.result)
    end = ir.AddOp(start.result, size.result)
    stop = ir.MinOp(end.result, loop.hi)
    Rewriter.insert_op(outer, where)
    loop.detach()
    outer.body.block.add_ops([at, start, end, stop, loop])
    loop.operands = (start.result, stop.result)
    loop.attributes[FLAT] = UnitAttr()


class ChunkFlatLoops(ModulePass):
    """Run a kernel's parallel loop over 1-D tensors in chunks, each a ``flat`` loop (module
    docstring)."""

    name = "chunk-flat-loops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for loop in [o for o in op.walk() if isinstance(o, s.ForOp) and flat_loop(o)]:
            _chunk(loop)
