"""``tile-transposes``: a loop nest that writes rows while reading columns walks square tiles (CPU).

An output computed from a transposed input (``y = x.T * 2``, ``a + b.T``) lowers to::

    P: sched.for parallel i = 0 to hi_i {
      Q: sched.for parallel j = 0 to hi_j {
        ... sched.load %x[j, i] ...            // the column i of x: a row length apart
        sched.store %v, %y[i, j]               // the row i of y: contiguous
      }
    }

Every iteration of ``Q`` reads a different line of ``x``; a line is used again only ``hi_j`` loads
later, for the next ``i``, by when the caches hold 8192 other lines (8192x4096 f32: 131 ms, 30
times the copy's time). This pass walks ``TILE x TILE`` tiles instead::

    sched.for parallel tj = 0 to cdiv(hi_j, TILE) {
      j0 = tj * TILE;  j1 = min(j0 + TILE, hi_j)
      sched.for serial ti = 0 to cdiv(hi_i, TILE) {
        i0 = ti * TILE;  i1 = min(i0 + TILE, hi_i)
        sched.for serial i = i0 to i1 { sched.for parallel j = j0 to j1 { ...the body... } }
      }
    }

so a tile's ``TILE`` rows of ``x`` stay in L1 while its ``TILE`` rows of ``y`` are written (map-cpu
then makes the inner loop a vector loop, as before), and a thread walks its ``TILE`` rows of ``x``
along them, tile after tile (tiles of ``i`` in parallel instead, each thread reading 128 bytes of
every row of ``x`` in turn, took 30 ms with tiles of 32; 13.8 in this order). Each element is
computed by the same operations from the same values: the bits do not change. Only that shape is
rewritten: both loops from 0, ``P``'s body ``Q`` alone, ``Q``'s bound fixed for ``P``, its body
holding no loop, branch, check, allocation, accumulation or matmul, every store's last index
``j``, and some load of a caller's input with ``j`` and ``i`` as its last two indices.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.lower import sched as s

#: rows and columns of a tile: a 64-byte line of 16 f32 read from each of 16 rows, a line written
#: to each of 16 (8192x4096, 2 threads, the Zen 5 VM: f32 9.6 ms, bf16 12.9; tiles of 32: 13.8 and
#: 23.8; of 8: 21.2 and 24.5; of 64: 30.0 and 30.4)
TILE = 16

_NOT_IN_BODY = (s.ForOp, s.IfOp, s.RequireOp, s.AllocOp, s.AccumOp, s.BufferMatmulOp, s.PackOp, s.SegmentsOp)


def _nest(p: Operation) -> s.ForOp | None:
    """The inner loop ``Q`` when ``p`` is the outer loop of the rewritten shape (module docstring)."""
    if not isinstance(p, s.ForOp) or p.kind.data != "parallel" or ir.constant_int(p.lo) != 0:
        return None
    ops = list(p.body.block.ops)
    if len(ops) != 1 or not isinstance(ops[0], s.ForOp) or ops[0].kind.data != "parallel":
        return None
    q = ops[0]
    if ir.constant_int(q.lo) != 0 or not s.defined_outside(p, q.hi):
        return None
    body = list(q.body.block.ops)
    if any(isinstance(o, _NOT_IN_BODY) for o in body):
        return None
    stores = [o for o in body if isinstance(o, s.StoreOp)]
    if not stores or any(list(st.idx)[-1] is not q.iv for st in stores):
        return None
    return q if any(isinstance(o, s.LoadOp) and s.buf_type(o.buf).role.data == "in" and len(o.idx) >= 2
                    and o.idx[-1] is p.iv and o.idx[-2] is q.iv for o in body) else None


def _tiles(hi: SSAValue, tile: SSAValue, where: InsertPoint) -> SSAValue:
    """(hi + TILE - 1) / TILE, inserted at ``where`` (integer ops: ``hi`` need not be a size)."""
    less = ir.ConstantOp(TILE - 1, "i64")
    up = ir.AddOp(hi, less.result)
    count = ir.DivOp(up.result, tile)
    for o in (less, up, count):
        Rewriter.insert_op(o, where)
    return count.result


def _span(block_ops: list[Operation], hi: SSAValue, t: SSAValue, tile: SSAValue) -> tuple[SSAValue, SSAValue]:
    """(t * tile, min(that + tile, hi)), its ops appended to ``block_ops``."""
    start = ir.MulOp(t, tile)
    end = ir.AddOp(start.result, tile)
    stop = ir.MinOp(end.result, hi)
    block_ops.extend([start, end, stop])
    return start.result, stop.result


def _rewrite(p: s.ForOp, q: s.ForOp) -> None:
    tile, zero = ir.ConstantOp(TILE, "i64"), ir.ConstantOp(0, "i64")
    where = InsertPoint.before(p)
    Rewriter.insert_op(tile, where)
    Rewriter.insert_op(zero, where)
    tj = s.ForOp(zero.result, _tiles(q.hi, tile.result, where), "parallel", "t")
    head: list[Operation] = []
    j0, j1 = _span(head, q.hi, tj.iv, tile.result)
    ti = s.ForOp(zero.result, _tiles(p.hi, tile.result, where), "serial", "t")
    tj.body.block.add_ops([*head, ti])
    inner: list[Operation] = []
    i0, i1 = _span(inner, p.hi, ti.iv, tile.result)
    rows = s.ForOp(i0, i1, "serial", "i")
    cols = s.ForOp(j0, j1, "parallel", "j")
    ti.body.block.add_ops([*inner, rows])
    rows.body.block.add_op(cols)
    mapping: dict[SSAValue, SSAValue] = {p.iv: rows.iv, q.iv: cols.iv}
    for op in q.body.block.ops:
        cols.body.block.add_op(op.clone(value_mapper=mapping))
    Rewriter.insert_op(tj, InsertPoint.before(p))
    p.detach()
    p.erase()


class TileTransposes(ModulePass):
    """Walk a nest that reads a transposed input in square tiles (module docstring)."""

    name = "tile-transposes"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        nests = [(p, q) for p in op.walk() if (q := _nest(p)) is not None]  # (Q holds no loop: no overlap)
        for p, q in nests:
            _rewrite(p, q)
