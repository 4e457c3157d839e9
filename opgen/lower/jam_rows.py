"""``jam-rows``: rows whose second pass adds into a column accumulator go ``FACTOR`` at a time (CPU),
rows of a loop that only sums columns ``READ_STREAMS`` tensor rows at a time, and rows of a
parallel loop whose body is one column loop reading column vectors ``ROW_FACTOR`` at a time.

A norm's backward (RMSNorm's ``dgamma``, LayerNorm's ``dgamma`` and ``dbeta``) walks its rows
one at a time: a first pass sums over the row, then a second pass writes the row's gradient and
adds each column's term into a per-thread accumulator row of f32 (``acc[d] += term(i, d)``). That
accumulator is read and written once per row: 16 KiB of f32 at D = 4096, as much traffic in the
core's caches as the row's own bf16 input and output together. Where the host lends more memory
bandwidth (this VM's two-thread copy at 60-79 GB/s), those read-modify-writes, not memory, set
the kernel's pace.

This pass unrolls the row loop by ``FACTOR`` and jams the copies' second passes into one loop:
the first passes of rows ``i, i + 1, ...`` run one after another, then one loop over the columns
computes every row's term for column ``d`` and adds them into ``acc[d]`` in row order, so the
accumulator is read and written once per ``FACTOR`` rows. Each column's sum is the same chain of
additions in the same order (``(acc + t_i) + t_{i+1}``), so the results are bitwise those of the
row-at-a-time loop. The rows left over (fewer than ``FACTOR``) run in the original loop after it.
(The first passes' reductions over the same range are siblings then; the CPU pipeline runs
``fuse-reductions`` again to read the rows in one loop.)

Pattern (before map-cpu, which then streams the jammed loop and prefetches each row's next rows:
opgen/lower/cpu_map.py)::

    sched.for serial %lo to %hi {            // the row loop, counter %i
      ...                                    // first passes: scalars, reductions, locals
      sched.for parallel %a to %b { %d:      // the second pass: the body's last op
        ... sched.accum sum %t, %acc[%d] ... // %acc defined outside the row loop
      }
    }

becomes::

    sched.for serial 0 to (%hi - %lo) / F { %p:
      %i0 = %lo + F * %p;  %i1 = %i0 + 1; ...
      ... (first passes for %i0), ... (first passes for %i1), ...
      sched.for parallel %a to %b { %d: (body for %i0) (body for %i1) ... }
    }
    sched.for serial %lo + F * ((%hi - %lo) / F) to %hi { ...the original body... }

It applies only where that is safe: the row loop is serial, over bounds not read at run time;
its body's last op is the second pass, an :func:`~opgen.lower.cpu_map.independent` loop with
bounds fixed for the whole row loop; every buffer the body writes is a local allocated in it,
an accumulator the second pass alone touches (by ``sum``, at an index holding its counter and
otherwise values fixed for the row loop), or a caller tensor; every access to a written caller
tensor, or to one that may alias another parameter, names the row counter itself at one and
the same axis (distinct rows never meet).

RMSNorm backward, 8192x4096 bf16, outputs given, 2 threads on the Zen 5 machine of
docs/performance.md, libraries called alternately: 4.45 -> 3.72 ms while the host's copy ran at
72-78 GB/s; 4.25 -> 4.30 ms (within noise) while it ran at 43-47 GB/s.

Two more shapes go several rows at a time, for the misses in flight rather than the
accumulator's traffic (each row read is a stream of its own):

* a row loop of that shape that writes no caller tensor (column sums only: a sum over the middle
  axis, BatchNorm backward's first pass, the sums of a column reduction's 32-row partials) runs
  ``READ_STREAMS // (tensors a row reads)`` rows an iteration (:func:`rows_per_iteration`);
  combine-accums then reads and writes each accumulator element once for all of them;
* a parallel row loop whose body is one column loop reading column vectors and writing rows of
  caller tensors (BatchNorm backward's second pass, a bias after a GEMM) runs ``ROW_FACTOR`` rows
  an iteration (:func:`jammable_rows`), the groups' loop parallel in its place.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import counter_expr, independent, reads_only

#: rows per iteration of the jammed loop (module docstring; below 2 the pass changes nothing).
#: 4 measured slower than 2 (RMSNorm backward bf16 4.8 ms against 4.1 in the slow windows).
FACTOR = 2
#: a row loop that writes no caller tensor (column sums only: a sum over the middle axis,
#: BatchNorm backward's first pass) reads this many rows of tensors at once, in
#: ``READ_STREAMS // (tensors a row reads)`` rows an iteration (at least ``FACTOR``): a pass
#: that only reads is bound by the misses a core keeps in flight, and each row is a stream of its
#: own (a C harness summing 128x64x4096 f32 rows into a row of 4096 sums, 2 threads on the Zen 5
#: VM, GB/s read: 1 row a time 21-25, 2 rows 25-33, 4 rows 37-41, 8 rows 43-45; one contiguous
#: read 27-30)
READ_STREAMS = 8
#: rows per iteration of a parallel row loop whose body is one column loop reading column vectors
#: (:func:`jammable_rows`): such a loop, one row at a time, kept too few misses in flight (a C
#: harness computing (g - a) b + x d by rows of 4096 f32, a, b, d per column, streaming stores,
#: 2 threads on the Zen 5 VM, GB/s moved against a copy's beside it: 1 row 34-40 against 67-72,
#: 2 rows 50-52, 4 rows 58-59; in slow windows 31-35, 37-40, 39-42 against 39-46). BatchNorm
#: backward's second pass, 8192x4096: bf16 11.3-12.1 -> 10.2-10.3 ms, f32 16.5-19.4 -> 15.3-18.5
#: (4 rows: no better than 2). Its rows' own prefetches ahead are left out (map-cpu prefetches
#: rows named by counter expressions only in loops that write no caller tensor): prefetching them
#: measured within noise (bf16 10.1 against 10.3 ms, f32 18.5 against 18.0).
ROW_FACTOR = 2


def _accumulators(loop: s.ForOp, second: s.ForOp) -> set[SSAValue] | None:
    """The accumulators of the second pass (buffers defined outside the row loop that it adds
    into, at its counter), or None where one of its accumulations is not such."""
    accs: set[SSAValue] = set()
    for o in second.body.block.ops:
        if isinstance(o, s.AccumOp) and s.defined_outside(loop, o.buf):
            if o.kind.data != "sum" or second.iv not in o.idx:
                return None
            if not all(v is second.iv or s.defined_outside(loop, v) for v in o.idx):  # (so never the row counter)
                return None
            accs.add(o.buf)
    return accs


def _column_pass(loop: s.ForOp, kind: str) -> s.ForOp | None:
    """The last op of row loop ``loop`` of ``kind`` (bounds not read at run time) where it is an
    :func:`independent` loop with bounds fixed for the row loop, else None."""
    if loop.kind.data != kind or not (counter_expr(loop.lo) and counter_expr(loop.hi)):
        return None  # (a range read at run time, a scatter-add's segment: empty-ranges' and prefetch-gathers')
    last = loop.body.block.last_op
    if not (isinstance(last, s.ForOp) and independent(last)
            and s.defined_outside(loop, last.lo) and s.defined_outside(loop, last.hi)):
        return None
    return last


def _rows_apart(loop: s.ForOp, bufs: set[SSAValue]) -> bool:
    """Whether every access inside ``loop`` to ``bufs`` names its counter itself at one and the
    same axis (distinct rows of a jammed group never meet)."""
    axes = s.counter_axes(loop, bufs)
    return len(axes) <= 1 and -1 not in axes


def jammable(loop: s.ForOp, aliased: set[SSAValue]) -> s.ForOp | None:
    """The second pass of a row loop this pass may jam (module docstring), else None.
    ``aliased``: the kernel's caller buffers that may share memory with another parameter."""
    second = _column_pass(loop, "serial")
    if second is None:
        return None
    accs = _accumulators(loop, second)
    if not accs:
        return None
    local = {o.result for o in loop.walk() if isinstance(o, s.AllocOp)}
    written = s.effects(loop)[1] - local - accs
    if any(s.buf_type(b).role.data not in ("in", "out") for b in written):
        return None  # (a temp shared by the rows)
    for o in loop.walk():
        if isinstance(o, (s.IfOp, *s.OPAQUE)):
            return None
        if isinstance(o, s.AccumOp) and o.buf in accs:
            if o.parent_op() is not second:
                return None
        elif isinstance(o, s.LoadOp | s.LoadBitOp | s.LoadFnOp | s.PrefetchOp | s.StoreOp | s.AccumOp):
            if o.buf in accs:
                return None
    return second if _rows_apart(loop, written | aliased) else None


def rows_per_iteration(loop: s.ForOp, second: s.ForOp) -> int:
    """The rows an iteration of the jammed ``loop`` runs: :data:`FACTOR`, or for a loop that
    writes no caller tensor :data:`READ_STREAMS` over the tensors (caller's or workspace partials)
    whose rows its second pass reads (at least ``FACTOR``)."""
    if not reads_only(loop):
        return FACTOR
    rows = {o.buf for o in second.body.block.ops if isinstance(o, s.LoadOp) and loop.iv in o.idx
            and s.buf_type(o.buf).role.data not in ("local", "stage")}
    return max(FACTOR, READ_STREAMS // max(1, len(rows)))


def jammable_rows(loop: s.ForOp, aliased: set[SSAValue]) -> s.ForOp | None:
    """The column loop of a parallel row loop this pass may jam (:data:`ROW_FACTOR` rows an
    iteration), else None: the row loop's body is that loop alone, an :func:`independent` loop
    with bounds fixed for the row loop that reads some column vector (a rank-1 buffer at its
    counter: BatchNorm's statistics, a norm's weight), writes caller tensors only, each access to
    a written or aliased one naming the row counter itself at one axis."""
    cols = _column_pass(loop, "parallel") if ROW_FACTOR >= 2 else None
    if cols is None or cols is not loop.body.block.first_op:
        return None
    if any(isinstance(o, (s.IfOp, s.AccumOp, *s.OPAQUE)) for o in cols.walk()):
        return None
    if not any(isinstance(o, s.LoadOp) and list(o.idx) == [cols.iv] for o in cols.body.block.ops):
        return None
    written = s.effects(loop)[1]
    if not written or any(s.buf_type(b).role.data not in ("in", "out") for b in written):
        return None
    return cols if _rows_apart(loop, written | aliased) else None


def jam(loop: s.ForOp, second: s.ForOp, factor: int) -> None:
    """Unroll ``loop`` by ``factor`` and jam its copies' second passes (module docstring)."""
    block = loop.parent_block()
    assert block is not None
    f, zero = ir.ConstantOp(factor, "i64"), ir.ConstantOp(0, "i64")
    span = ir.SubOp(loop.hi, loop.lo)
    n = ir.MaxOp(span.result, zero.result)  # (the rows: none where hi <= lo)
    groups = ir.DivOp(n.result, f.result)
    done = ir.MulOp(groups.result, f.result)
    rest_lo = ir.AddOp(loop.lo, done.result)
    for op in (f, zero, span, n, groups, done, rest_lo):
        block.insert_op_before(op, loop)
    outer = s.ForOp(zero.result, groups.result, loop.kind.data, hint="p")
    block.insert_op_before(outer, loop)
    body = outer.body.block
    step = ir.MulOp(outer.iv, f.result)
    base = ir.AddOp(loop.lo, step.result)
    body.add_ops([step, base])
    maps: list[dict[SSAValue, SSAValue]] = []
    for k in range(factor):
        row = base.result
        if k:
            c = ir.ConstantOp(k, "i64")
            nxt = ir.AddOp(base.result, c.result)
            body.add_ops([c, nxt])
            row = nxt.result
        vmap: dict[SSAValue, SSAValue] = {loop.iv: row}
        for op in loop.body.block.ops:
            if op is not second:
                body.add_op(op.clone(value_mapper=vmap))
        maps.append(vmap)
    jammed = s.ForOp(second.lo, second.hi, second.kind.data, hint=second.iv.name_hint or "j")
    jammed.attributes.update(second.attributes)
    body.add_op(jammed)
    for vmap in maps:
        vmap[second.iv] = jammed.iv
        for op in second.body.block.ops:
            jammed.body.block.add_op(op.clone(value_mapper=vmap))
    loop.operands = [rest_lo.result, loop.hi]


class JamRows(ModulePass):
    """Unroll-and-jam row loops whose second pass adds into column accumulators (module
    docstring)."""

    name = "jam-rows"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if FACTOR < 2:
            return
        for k in op.body.block.ops:
            if not isinstance(k, s.KernelOp):
                continue
            aliased = k.aliased_args
            for loop in [o for o in k.walk() if isinstance(o, s.ForOp)]:
                second = jammable(loop, aliased)
                if second is not None:
                    jam(loop, second, rows_per_iteration(loop, second))
                elif (cols := jammable_rows(loop, aliased)) is not None:
                    jam(loop, cols, ROW_FACTOR)

