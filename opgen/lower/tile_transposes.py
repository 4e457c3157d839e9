"""``tile-transposes``: a loop nest that writes rows while reading columns walks tiles (CPU).

An output computed from a transposed input (``y = x.T * 2``, ``a + b.T``) lowers to::

    P: sched.for parallel i = 0 to hi_i {
      Q: sched.for parallel j = 0 to hi_j {
        ... sched.load %x[j, i] ...            // the column i of x: a row length apart
        sched.store %v, %y[i, j]               // the row i of y: contiguous
      }
    }

Every iteration of ``Q`` reads a different line of ``x``; a line is used again only ``hi_j`` loads
later, for the next ``i``, by when the caches hold 8192 other lines (8192x4096 f32: 131 ms, 30
times the copy's time). This pass walks ``TI x TJ`` tiles instead, numbered row-major over
``(tj, ti)`` in one parallel loop::

    sched.for parallel t = 0 to cdiv(hi_j, TJ) * cdiv(hi_i, TI) {
      tj = t / cdiv(hi_i, TI);  ti = t - tj * cdiv(hi_i, TI)
      j0 = tj * TJ;  j1 = min(j0 + TJ, hi_j);  i0 = ti * TI;  i1 = min(i0 + TI, hi_i)   // (shifted: below)
      %t = sched.alloc stage [TI, TJ]                          // (staged loads only)
      sched.transpose_tile %x[j0, i0] -> %t, (j1 - j0) x (i1 - i0)
      sched.for serial i = i0 to i1 {
        sched.prefetch_share %x[j0', i0'], rows' x cols' share i - i0 of i1 - i0   // (staged loads only)
        sched.for parallel j = j0 to j1 { ... sched.load %t[i - i0, j - j0] ... }
      }
    }

A thread's share of the tiles is a run of consecutive numbers: it walks ``TJ`` rows of ``x``
along them, tile after tile, and writes the ``TJ`` columns of ``y`` they give, row after row
(tiles of ``i`` in parallel instead, each thread reading a little of every row of ``x`` in turn,
took twice the time); with fewer tiles of rows than threads, the threads split a row of tiles
(``x`` of 128 x 65536: one thread did it all when only the loop over ``tj`` was parallel).

A load of a caller's tensor whose last two indices are ``j`` and ``i`` (the others fixed for the
nest) in a dtype of ``STAGED`` is *staged*: each tile of it is copied transposed into a ``stage``
tile by ``sched.transpose_tile`` (the runtime's 16x16 in-register transposes with AVX-512), and the
body reads the tile along its rows, so the vector loop over ``j`` loads vectors instead of one
element a row apart each. A ``stage`` tile holds bf16 as its 16-bit words (``sched.STAGE_HELD``;
its loads widen them): half the bytes of f32 values written and read again (8192x4096 bf16, 2
threads: 5-10% less time; docs/backend_cpu.md). The tiles are then long (``STAGED_TILE``: ``x``
read 512 elements a row, ``y`` written 128 a row, four 64-byte lines of bf16 together: the
streaming stores' strips); a nest with an unstaged transposed load keeps 16 x 16 tiles, whose 16
rows of ``x`` stay in L1 between its strided loads. Each element is computed by the same operations
from the same values: the bits do not change.

A row of ``y`` is written a tile's ``TJ`` columns at a time, the tiles beside each other written
far apart in time; where ``y`` does not start a 64-byte line (numpy's large arrays start 16 bytes
past a page, malloc's too), every cut between two tiles would fall inside a line, which each
tile then reads for ownership and writes part of: the tiles of ``j`` start ``shift`` elements
earlier instead, ``shift = min(sched.line_phase y[..., 0, 0], hi_j)`` (the first stored output's
first element's place in its line; the first tile is clipped at 0), so that they cut the rows at
lines wherever ``y``'s row stride is a multiple of 64 bytes (8192x4096, 2 threads, the Zen 5 VM,
``x`` and ``y`` 16 bytes past a line against both on lines, alternating: f32 1.45x -> 1.09x the
time, bf16 1.49x -> 1.04-1.07x). Only where the tiles are at least a line wide in every dtype of
``y``; the values do not change.

A tile's transpose only reads and its rows of ``y`` only write, so each row of a staged tile
prefetches a share of the next tile's lines (tile ``t + 1``, ``[j0', i0']`` of ``rows' x cols'``;
the last tile its own) into L2: the next transpose reads L2 while this tile's streaming stores
run (8192x4096, 2 threads, the Zen 5 VM: f32 8.8 -> 7.1 ms, bf16 5.6 -> 5.0; docs/backend_cpu.md).

Only that shape is rewritten: both loops from 0, ``P``'s body ``Q`` alone, ``Q``'s bound fixed for
``P``, its body holding no loop, branch, check, allocation, accumulation or matmul, every store's
last index ``j``, and some load of a caller's input with ``j`` and ``i`` as its last two indices.
A staged tensor is neither batched (a row table) nor one of a ``may_alias`` pair.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import LINE  # (a cache line's bytes: the tiles of j are cut at y's lines)

#: (TI, TJ) of a nest without staged loads: a 64-byte line of 16 f32 read from each of 16 rows of
#: ``x``, a line written to each of 16 of ``y`` (8192x4096, 2 threads, the Zen 5 VM: f32 9.6 ms,
#: bf16 12.9; tiles of 32: 13.8 and 23.8; of 8: 21.2 and 24.5; of 64: 30.0 and 30.4)
TILE = (16, 16)
#: (TI, TJ) of a nest with staged loads (8192x4096, 2 threads, the Zen 5 VM, in units of the time
#: of a numpy copy of x beside it, f32 / bf16: 16 x 16 2.2 / 3.9, 64 x 64 1.65 / 2.9, 512 x 32
#: 1.6 / 2.6, 32 x 512 2.6 / 3.0; unstaged 16 x 16: 3.6 / 8.1. Tenth session, A/B in one
#: process, ms: 512 x 32 10.1 / 9.5, 512 x 128 9.6 / 7.6, 1024 x 64 9.5 / 7.5, 1024 x 128
#: 10.1 / 7.6; x of 16384 x 1000 (rows of 2000 bytes) 5.4 / 4.1, 5.1 / 4.3, 5.1 / 5.1, 5.3 / 4.4)
STAGED_TILE = (512, 128)

#: the dtypes whose tiles are staged transposed (sched.transpose_tile: the CPU runtime's
#: opgen_<dtype>_transpose_tile, 16x16 in registers with AVX-512)
STAGED = ("f32", "bf16", "f16")



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
    if any(isinstance(o, s.NOT_STRAIGHT) for o in body):
        return None
    stores = [o for o in body if isinstance(o, s.StoreOp)]
    if not stores or any(list(st.idx)[-1] is not q.iv for st in stores):
        return None
    return q if _transposed(p, q) else None


def _tiles(hi: SSAValue, tile: SSAValue, where: InsertPoint) -> SSAValue:
    """(hi + tile - 1) / tile, inserted at ``where`` (integer ops: ``hi`` need not be a size)."""
    less = ir.ConstantOp(ir.constant_int(tile) - 1, "i64")
    up = ir.AddOp(hi, less.result)
    count = ir.DivOp(up.result, tile)
    for o in (less, up, count):
        Rewriter.insert_op(o, where)
    return count.result


def _span(block_ops: list[Operation], hi: SSAValue, t: SSAValue, tile: SSAValue,
          shift: SSAValue | None = None) -> tuple[SSAValue, SSAValue]:
    """(t * tile, min(that + tile, hi)), its ops appended to ``block_ops``; with a ``shift``
    (``0 <= shift < tile``) the tiles start ``shift`` earlier, the first clipped at 0:
    (max(t * tile - shift, 0), min(t * tile + tile - shift, hi))."""
    start = ir.MulOp(t, tile)
    end = ir.AddOp(start.result, tile)
    block_ops.extend([start, end])
    lo: SSAValue = start.result
    if shift is not None:
        back, zero = ir.SubOp(start.result, shift), ir.ConstantOp(0, "i64")
        first, end = ir.MaxOp(back.result, zero.result), ir.SubOp(end.result, shift)
        block_ops.extend([back, zero, first, end])
        lo = first.result
    stop = ir.MinOp(end.result, hi)
    block_ops.append(stop)
    return lo, stop.result


def _transposed(p: s.ForOp, q: s.ForOp) -> list[s.LoadOp]:
    """The loads of ``q``'s body from a caller's input with ``j`` and ``i`` as their last two indices."""
    return [o for o in q.body.block.ops if isinstance(o, s.LoadOp) and s.buf_type(o.buf).role.data == "in"
            and len(o.idx) >= 2 and o.idx[-1] is p.iv and o.idx[-2] is q.iv]


def _staged(k: s.KernelOp, p: s.ForOp, loads: list[s.LoadOp]) -> list[s.LoadOp]:
    """Those of ``loads`` staged through a transposed tile (module docstring)."""
    names = k.param_names
    return [o for o in loads if o.buf in names and all(s.defined_outside(p, v) for v in o.idx[:-2])
            and names[o.buf] not in k.batched_params | k.aliased
            and all(d.name in STAGED for d in k.dtype_options(s.buf_type(o.buf).dtype))]


def _stage(loads: list[s.LoadOp], tile: tuple[SSAValue, SSAValue], spans: tuple[tuple[SSAValue, SSAValue], ...],
           loop: s.ForOp, head: list[Operation]) -> dict[s.LoadOp, SSAValue]:
    """One local tile per distinct staged tensor (allocated in the tile ``loop``'s body, still
    empty), filled at the head of each tile (appended to ``head``): ``{load: its tile}``."""
    (i0, i1), (j0, j1) = spans
    rows, cols = ir.SubOp(j1, j0), ir.SubOp(i1, i0)
    head.extend([rows, cols])
    tiles: dict[tuple[SSAValue, tuple[SSAValue, ...]], SSAValue] = {}
    out: dict[s.LoadOp, SSAValue] = {}
    for ld in loads:
        lead = tuple(ld.idx)[:-2]
        key = (ld.buf, lead)
        if key not in tiles:
            alloc = s.AllocOp(s.BufType.make([ir.constant_int(t) for t in tile], s.buf_type(ld.buf).dtype, "stage"),
                              list(tile))
            loop.body.block.add_op(alloc)
            tiles[key] = alloc.result
            head.append(s.TransposeTileOp(ld.buf, [*lead, j0, i0], alloc.result, rows.result, cols.result))
        out[ld] = tiles[key]
    return out


Spans = tuple[tuple[SSAValue, SSAValue], tuple[SSAValue, SSAValue]]


def _tile(t: SSAValue, n_i: SSAValue, tile: tuple[SSAValue, SSAValue], his: tuple[SSAValue, SSAValue],
          block_ops: list[Operation], shift: SSAValue | None) -> Spans:
    """Tile number ``t``'s spans ``((i0, i1), (j0, j1))``, numbered row-major (its row of tiles
    ``tj = t / n_i``, its column ``ti = t - tj * n_i``; ``j``'s tiles ``shift`` earlier: :func:`_span`),
    its ops appended to ``block_ops``."""
    tj = ir.DivOp(t, n_i)
    tj_n = ir.MulOp(tj.result, n_i)
    ti = ir.SubOp(t, tj_n.result)
    block_ops.extend([tj, tj_n, ti])
    j = _span(block_ops, his[1], tj.result, tile[1], shift)
    i = _span(block_ops, his[0], ti.result, tile[0])
    return i, j


def _prefetch_next(t: s.ForOp, n_i: SSAValue, n_tiles: SSAValue, tile: tuple[SSAValue, SSAValue],
                   his: tuple[SSAValue, SSAValue], span_i: tuple[SSAValue, SSAValue], head: list[Operation],
                   rows: s.ForOp, shift: SSAValue | None) -> None:
    """The next tile's staged blocks (tile ``t + 1``, the last tile's own), a share of their
    lines a row of the current tile (``sched.prefetch_share`` at the start of the row loop
    ``rows``): the tile is read into the cache while the rows of ``y`` are written, instead of
    before them (module docstring). ``head``: the tile's ops so far, its transposes among them."""
    one = ir.ConstantOp(1, "i64")
    after = ir.AddOp(t.iv, one.result)
    final = ir.SubOp(n_tiles, one.result)
    nxt = ir.MinOp(after.result, final.result)
    ops: list[Operation] = [one, after, final, nxt]
    (i0, i1), (j0, j1) = _tile(nxt.result, n_i, tile, his, ops, shift)
    n_rows, n_cols = ir.SubOp(j1, j0), ir.SubOp(i1, i0)
    part, parts = ir.SubOp(rows.iv, span_i[0]), ir.SubOp(span_i[1], span_i[0])
    head.extend([*ops, n_rows, n_cols, parts])
    rows.body.block.add_op(part)
    for tr in [o for o in head if isinstance(o, s.TransposeTileOp)]:
        lead = list(tr.idx)[:-2]
        rows.body.block.add_op(s.PrefetchShareOp(tr.src, [*lead, j0, i0], n_rows.result, n_cols.result,
                                                 part.result, parts.result))


def _line_shift(k: s.KernelOp, p: s.ForOp, q: s.ForOp, tj_size: int, where: InsertPoint) -> SSAValue | None:
    """How many elements earlier the tiles of ``j`` start so that they cut the rows of the first
    stored output at its cache lines (module docstring): ``min(phase, hi_j)``, the phase of its
    element ``[..., 0, 0]`` (``sched.line_phase``), inserted at ``where``; None where the tiles
    are narrower than a line of its smallest dtype or its store is not ``[..., i, j]``."""
    st = next(o for o in q.body.block.ops if isinstance(o, s.StoreOp))
    idx = list(st.idx)
    if s.buf_type(st.buf).role.data != "out" or len(idx) < 2 or idx[-2] is not p.iv \
            or not all(s.defined_outside(p, v) for v in idx[:-2]):
        return None
    if any(tj_size * d.itemsize < LINE for d in k.dtype_options(s.buf_type(st.buf).dtype)):
        return None
    zero = ir.ConstantOp(0, "i64")
    phase = s.LinePhaseOp(st.buf, [*idx[:-2], zero.result, zero.result])
    shift = ir.MinOp(phase.result, q.hi)
    for o in (zero, phase, shift):
        Rewriter.insert_op(o, where)
    return shift.result


def _rewrite(k: s.KernelOp, p: s.ForOp, q: s.ForOp) -> None:
    transposed = _transposed(p, q)
    loads = _staged(k, p, transposed)
    ti_size, tj_size = STAGED_TILE if loads == transposed else TILE
    tile_i, tile_j, zero = ir.ConstantOp(ti_size, "i64"), ir.ConstantOp(tj_size, "i64"), ir.ConstantOp(0, "i64")
    where = InsertPoint.before(p)
    for c in (tile_i, tile_j, zero):
        Rewriter.insert_op(c, where)
    shift = _line_shift(k, p, q, tj_size, where)
    n_i = _tiles(p.hi, tile_i.result, where)
    hi_j = q.hi
    if shift is not None:  # (the tiles of j cover [-shift, hi_j))
        shifted = ir.AddOp(q.hi, shift)
        Rewriter.insert_op(shifted, where)
        hi_j = shifted.result
    n_tiles = ir.MulOp(_tiles(hi_j, tile_j.result, where), n_i)
    Rewriter.insert_op(n_tiles, where)
    t = s.ForOp(zero.result, n_tiles.result, "parallel", "t")
    head: list[Operation] = []
    (i0, i1), (j0, j1) = _tile(t.iv, n_i, (tile_i.result, tile_j.result), (p.hi, q.hi), head, shift)
    staged = _stage(loads, (tile_i.result, tile_j.result), ((i0, i1), (j0, j1)), t, head) if loads else {}
    rows = s.ForOp(i0, i1, "serial", "i")
    cols = s.ForOp(j0, j1, "parallel", "j")
    if staged:
        _prefetch_next(t, n_i, n_tiles.result, (tile_i.result, tile_j.result), (p.hi, q.hi), (i0, i1), head, rows,
                       shift)
    t.body.block.add_ops([*head, rows])
    rows.body.block.add_op(cols)
    mapping: dict[SSAValue, SSAValue] = {p.iv: rows.iv, q.iv: cols.iv}
    if staged:  # (the tile's row and column of the element: i - i0, j - j0)
        di, dj = ir.SubOp(rows.iv, i0), ir.SubOp(cols.iv, j0)
        rows.body.block.insert_op_before(di, cols)
        cols.body.block.add_op(dj)
    for op in q.body.block.ops:
        if op in staged:
            ld = s.LoadOp(staged[op], [di.result, dj.result])
            mapping[op.results[0]] = ld.result
            cols.body.block.add_op(ld)
        else:
            cols.body.block.add_op(op.clone(value_mapper=mapping))
    Rewriter.insert_op(t, InsertPoint.before(p))
    p.detach()
    p.erase()


class TileTransposes(ModulePass):
    """Walk a nest that reads a transposed input in tiles, staged transposed where it can (module
    docstring)."""

    name = "tile-transposes"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.walk():
            if isinstance(k, s.KernelOp):
                nests = [(p, q) for p in k.walk() if (q := _nest(p)) is not None]  # (Q holds no loop: no overlap)
                for p, q in nests:
                    _rewrite(k, p, q)
