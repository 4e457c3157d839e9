"""``prefetch-gathers``: rows read through an index are prefetched a few iterations ahead (CPU).

A loop that reads whole rows of a caller's input picked by a table — a scatter-add's
owner-computes loop reading ``grad[order[s], :]`` for each position ``s`` of an output row's
segment, an embedding lookup's ``weight[idx[i], :]`` — jumps to an unrelated row at each
iteration. The hardware prefetcher follows a stream within a row but cannot guess the next
row, so each row starts with a full memory latency, and a short row (2 KiB: D = 1024 in bf16)
is mostly that latency. The next rows' addresses are in the table already: this pass prefetches
them, ``AHEAD`` iterations ahead, while the current row is summed.

Pattern (after map-cpu: the row loop is a vector loop, ``simd`` or ``stream``)::

    sched.for ... %s {                        // the row loop's parent: any loop
      %r = sched.load %tab[%s]                 // a 1-D i64 table, at the parent's counter
      ...
      sched.for ... %j {  %x = sched.load %buf[%r, %j]  ... }   // a row of a caller's input

becomes, at the start of the parent's body::

      %p = min(%s + AHEAD, extent(tab) - 1)    // a position of the table (never past it)
      %r2 = sched.load %tab[%p]
      sched.if (0 <= %r2 < rows(buf)) { sched.prefetch %buf[%r2, 0] span cols(buf) ahead 0 }

``sched.prefetch ... span`` names every line of the row (the C printer prints a loop of
prefetch instructions, one a line; they never fault). The table's entry is read in bounds and
the row checked against the buffer's extent, so no address outside the buffer is formed from a
table whose values the kernel has not checked. Values computed by the kernel do not change: a
prefetch is a hint.

Embedding backward (V = 32,000, N = 8192, D = 1024, outputs given, 2 threads on the Zen 5 of
docs/performance.md; libraries called in alternating order, each call after an untimed one):
bf16 1.85 -> 1.53 ms, f32 3.04 -> 2.90 ms. 4, 8, 16, 32 and 64 rows ahead measured at D = 64,
256, 1024 and 4096: 4 to 16 the same everywhere; 32 and 64 up to 11% slower at D = 4096 (8-16
KiB rows: the rows ahead no longer fit the caches).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import cpu_mapping
from opgen.lower.sched import CpuMapping

#: how many iterations of the parent loop ahead a gathered row is prefetched (module docstring)
AHEAD = 4
#: the row loops whose gathered rows are prefetched: map-cpu's vector loops
ROW_LOOPS = frozenset({CpuMapping.SIMD, CpuMapping.STREAM})


def _defined_outside(loop: Operation, v: SSAValue) -> bool:
    """``v`` is available before ``loop``'s body starts (defined outside it, or its counter)."""
    owner = v.owner
    if isinstance(owner, Operation):
        return not loop.is_ancestor(owner)
    parent = owner.parent_op()
    return parent is loop or parent is None or not loop.is_ancestor(parent)


def gathered_rows(row_loop: s.ForOp) -> list[tuple[s.LoadOp, s.LoadOp, int]]:
    """The loads of ``row_loop`` that read rows of caller inputs picked by a table: each as
    (the row load, the table load in the parent's body, the axis the table picks), one per
    buffer and table load."""
    parent = row_loop.parent_op()
    if not isinstance(parent, s.ForOp):
        return []
    out: dict[tuple[SSAValue, SSAValue], tuple[s.LoadOp, s.LoadOp, int]] = {}
    for ld in row_loop.body.block.ops:
        if not isinstance(ld, s.LoadOp):
            continue
        t, idx = s.buf_type(ld.buf), list(ld.idx)
        if t.role.data != "in" or t.rank < 2 or idx[-1] is not row_loop.iv or row_loop.iv in idx[:-1]:
            continue
        picked = [a for a, v in enumerate(idx[:-1]) if isinstance(v.owner, s.LoadOp)
                  and v.owner.parent_op() is parent]
        if len(picked) != 1:
            continue
        axis = picked[0]
        tab_ld = idx[axis].owner
        assert isinstance(tab_ld, s.LoadOp)
        if s.buf_type(tab_ld.buf).rank != 1 or tab_ld.idx[0] is not parent.iv:
            continue
        if not all(_defined_outside(parent, v) for a, v in enumerate(idx[:-1]) if a != axis):
            continue
        out.setdefault((ld.buf, tab_ld.result), (ld, tab_ld, axis))
    return list(out.values())


def prefetch_ahead(row: s.LoadOp, tab_ld: s.LoadOp, axis: int) -> None:
    """Insert the prefetch of the row ``AHEAD`` iterations ahead at the start of the parent's
    body (module docstring); nothing where an extent is not a plain value."""
    parent = tab_ld.parent_op()
    assert isinstance(parent, s.ForOp)
    b = s.buf_type(row.buf)
    sizes = [s.extent_of(tab_ld.buf, 0), s.extent_of(row.buf, axis), s.extent_of(row.buf, b.rank - 1)]
    if any(x is None for x in sizes):
        return
    (tab_ops, tab_n), (rows_ops, rows), (cols_ops, cols) = sizes  # type: ignore[misc]
    ahead, one, zero = ir.ConstantOp(AHEAD, "i64"), ir.ConstantOp(1, "i64"), ir.ConstantOp(0, "i64")
    nxt = ir.AddOp(parent.iv, ahead.result)
    last = ir.SubOp(tab_n, one.result)
    pos = ir.MinOp(nxt.result, last.result)
    r2 = s.LoadOp(tab_ld.buf, [pos.result])
    lo = ir.CmpOp("ge", r2.result, zero.result)
    hi = ir.CmpOp("lt", r2.result, rows)
    ok = ir.AndOp(lo.result, hi.result)
    idx = [r2.result if a == axis else v for a, v in enumerate(row.idx)]
    idx[-1] = zero.result
    hint = s.IfOp(ok.result, [s.PrefetchOp(row.buf, idx, 0, span=cols)])
    first = parent.body.block.first_op
    for op in [*tab_ops, *rows_ops, *cols_ops, ahead, one, zero, nxt, last, pos, r2, lo, hi, ok, hint]:
        parent.body.block.insert_op_before(op, first)


class PrefetchGathers(ModulePass):
    """Prefetch rows read through an index table ``AHEAD`` iterations ahead (module docstring)."""

    name = "prefetch-gathers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if not isinstance(k, s.KernelOp):
                continue
            loops = [o for o in k.walk() if isinstance(o, s.ForOp) and cpu_mapping(o) in ROW_LOOPS]
            for loop in loops:
                for row, tab_ld, axis in gathered_rows(loop):
                    prefetch_ahead(row, tab_ld, axis)
