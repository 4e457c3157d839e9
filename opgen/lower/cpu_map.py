"""``map-cpu``: where the C11/OpenMP target runs threads and splits reductions into lanes.

Each ``sched.for`` (and top-level ``sched.matmul``, and ``sched.store``) the CPU printer treats
specially gets a ``cpu_mapping`` (``#sched<cpu_mapping ...>``):

* ``omp_for``: the outermost ``parallel`` loop of each loop nest (and a ``sched.matmul`` outside
  any parallel loop: its rows) is an ``omp parallel for`` with a static schedule over the team;
* ``lanes``: a ``reduce`` loop whose body accumulates into scalars and holds no loop is split
  into fixed lanes (:func:`lanes`: 16, or 32 where it reads 2-byte elements) combined pairwise
  in a fixed order (opgen/emit/c_family.py), so the result never depends on the thread count;
* ``simd``: an innermost ``parallel`` loop inside a parallel loop whose iterations each touch
  their own elements (:func:`independent`) runs under ``#pragma omp simd``. The C compiler
  cannot see that itself inside an OpenMP region (the outlined body loses ``restrict``), and
  with many f32 pointers it gives up on runtime alias checks: LayerNorm backward's grad_x loop
  stayed scalar in f32 while its bf16 twin was vectorised;
* ``stream``: such a loop that also streams rows of caller
  tensors (a load indexed by enclosing loops' counters only, this loop's last) which no earlier
  loop of the same body has read. It runs in strips of one cache line (:func:`strip`), and each
  strip starts with a ``sched.prefetch`` ``PREFETCH_AHEAD`` bytes ahead in every such row (into
  L2 only, ``l2``, where the loop writes no caller tensor: :func:`reads_only`; there jam-rows'
  pairs of rows, indexed by expressions of the counters, are streamed too; past the end of a row
  of a group read side by side, the prefetch goes into the row the group loop's next iteration
  reads in its place: :func:`_wrap`). Compute-heavy
  loops (``exp``, a division) otherwise keep too few cache misses in flight to overlap their
  arithmetic with memory (SiLU backward, 8192x4096 f32, 2 threads: 20.1 -> 13.4 ms in a C
  harness; docs/backend_cpu.md). A row a sibling loop has just read is in cache already, and
  prefetching it again only costs; instead, such a loop directly inside the row loop
  prefetches the same row's columns of the *next* row (:func:`next_rows`), which the
  sibling loop will read next: the second pass over a row (softmax's, a norm's gradient) then
  keeps memory busy while it computes (softmax backward, 8192x4096, 2 threads, outputs given:
  13.2 -> 12.1 ms f32, 7.1 -> 6.5 ms bf16; :func:`_prefetch_next_rows`). A stream loop whose
  body computes something slow from what it reads (:func:`slow`) gets ``copies = 4``: an f32
  instance runs four strips a step, a bf16 one two, their bodies interleaved (:func:`copies`);

* a second pass over a row (a stream loop with next-row prefetches) also prefetches the rows it
  writes (its :func:`staged_stores`) ``PREFETCH_AHEAD`` bytes ahead, for writing
  (``sched.prefetch ... write``): its reads come from cache, so the stores' misses were the
  memory traffic left, each store waiting for its line in turn; owned ahead, they stream (outputs
  given, 8192x4096, 2 threads: RMSNorm backward f32 23.0 -> 15.2 ms, bf16 10.7 -> 10.2;
  LayerNorm f32 20.2 -> 16.7; softmax f32 14.2 -> 13.0, bf16 7.3 -> 6.5). In a single pass (GELU,
  SiLU) it gained nothing in f32 and cost SiLU bf16 7%, so single passes do not;
* ``staged``: a store of a stream loop into a caller's row (:func:`staged_stores`): in a bf16
  instance the strip's values stay in f32 and the whole strip is rounded at once (the runtime's
  ``opgen_bf16_store_strip``: one ``vcvtne2ps2bf16`` per 32 values on AVX512-BF16, the same bits
  as the scalar rounding). The compiler's vectorised scalar rounding took ten instructions per
  16 values (GELU backward bf16, 8192x4096, outputs given: 17.0 -> 16.1 ms; SiLU 11.3 -> 10.1).
  A load of a stream loop from a caller's row (:func:`staged_loads`) too: in an f16 instance the
  strip is widened at once before its arithmetic (``opgen_f16_load_strip``: two ``vcvtph2ps``
  per 32; SiLU backward f16 in cache 0.47 -> 0.265 ns an element).

* ``nontemporal``: every store into a caller's output of rank 2 or more (1 in a ``flat`` loop:
  opgen/lower/flat_chunks.py) that the kernel never reads (no load, accumulation, matmul or pack
  of it; only stores), where each store walks a row in a ``stream`` loop or a ``simd`` one (which
  then becomes a ``stream`` loop: strips of one line, no prefetches). The strip is staged (f32
  too) and stored by the runtime's ``opgen_f32_store_strip``/``opgen_bf16_store_strip``, which,
  when the output is at least ``opgen_nt_bytes()`` (the last-level cache; decided per call by
  ``opgen_nt``), writes each whole aligned line around the caches: a line stored whole need not be
  read first, so such an output costs its bytes once instead of twice (embedding backward f32
  V=32000 D=1024, 2 threads, outputs given: 5.89 -> 3.77 ms; RMSNorm backward f32 8192x4096: 11.8
  -> 9.6 ms on the Zen 5 machine). The write prefetch of a second pass then runs only when the
  output does not stream; the parallel loop around such stores fences them at its end, on each
  thread.

* ``pairs`` (a unit attribute beside ``lanes`` or ``stream``; ``pair`` on the loop's loads of
  rows that may be bf16): in a bf16 instance the loop's strips run as pairs of consecutive
  elements, each pair's 32-bit word widened by a shift and a mask (:func:`paired`).

Everything else is a plain C loop. ``opgen show OP --target cpu --stage map-cpu`` shows the
decisions; the printer (opgen/emit/cpu.py, opgen/emit/c_family.py) follows them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from xdsl.context import Context
from xdsl.dialects.builtin import FloatAttr, IntAttr, IntegerAttr, ModuleOp, UnitAttr
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.dtypes import DType
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.flat_chunks import FLAT
from opgen.lower.sched import CpuMapping, CpuMappingAttr
from opgen.lower.to_loops import CHUNKS, ROWS

MAPPING = "cpu_mapping"
#: the fixed lanes of a ``lanes`` reduction that reads no 2-byte element (:func:`lanes`; lane l
#: takes iterations l, l + LANES, ...; combined pairwise 8-4-2-1): the C printer and
#: lower-to-std print the same split
LANES = 16
#: times as many lanes for a reduction whose accumulations are all maxima or minima
#: (:func:`lanes`)
EXTREMA_CHAINS = 4
#: bytes of a cache line: a ``stream`` loop's strip (and where tile-transposes cuts an output's rows)
LINE = 64
#: strips of one f32 vector a slow ``stream`` loop runs side by side (:func:`copies`), in its
#: ``copies`` attribute
COPIES = 4
COPIES_ATTR = "copies"
#: how far ahead of the strip a ``stream`` loop prefetches, in bytes (best of 1, 2, 4 and 16 KiB
#: measured on SiLU backward)
PREFETCH_AHEAD = 2048
#: a ``lanes`` or ``stream`` loop that may run in :func:`paired` form (a unit attribute), and
#: each of its loads that reads a row along the loop (:func:`pair_loads`)
PAIRS = "pairs"
PAIR = "pair"
#: an ``omp_for`` loop whose body is a column sum's loop over chunks of rows alone (kept axes
#: walked outside the chunks: opgen/lower/to_loops.py ``hoist``), or a row group's next row loop
#: alone (its rows over several leading dims: ``ROWS``, and so on inward): the nest shares the
#: team (``collapse(n)``, an integer attribute: the loops collapsed), so that a few chunks, a few
#: kept rows or a small leading dim still use every thread (on rotary embeddings' (N, H) loops
#: the collapse cost 10-50%: only these)
COLLAPSE = "collapse"


def collapsible(o: s.ForOp) -> int:
    """How many loops ``omp_for`` loop ``o`` and the loops nested in it share the team over
    (:data:`COLLAPSE`; 1: ``o`` alone): while a body is one loop alone, a parallel loop over a
    column sum's chunks (``CHUNKS``) or a row group's rows (``ROWS``) with bounds defined outside
    ``o``."""
    n, cur = 1, o
    while True:
        ops = [x for x in cur.body.block.ops if not isinstance(x, s.YieldOp)]
        if len(ops) != 1 or not isinstance(inner := ops[0], s.ForOp) or inner.kind.data != "parallel":
            return n
        if not (CHUNKS in inner.attributes or ROWS in inner.attributes) or any(
                o.is_ancestor(v.owner) for v in (inner.lo, inner.hi) if isinstance(v.owner, Operation)):
            return n
        n, cur = n + 1, inner


def cpu_mapping(op: Operation) -> str | None:
    """The op's ``cpu_mapping`` (None: a plain loop)."""
    a = op.attributes.get(MAPPING)
    return a.data.value if isinstance(a, CpuMappingAttr) else None


def lane_split(op: s.ForOp) -> list[s.AccumOp]:
    """The scalar accumulations a ``reduce`` loop splits into lanes (empty: it is not split)."""
    accs = s.scalar_accums(op)
    if op.kind.data == "reduce" and accs and not any(isinstance(o, s.ForOp) for o in op.body.block.ops):
        return accs
    return []


def lanes(elem_bytes: list[int], kinds: Sequence[str] = ()) -> int:
    """Lanes of a ``lanes`` reduction whose loads read elements of these sizes (in bytes) and
    whose accumulations are of these ``kinds`` (sum, max, min): ``LANES``, one 64-byte vector of
    f32, or twice that where an element of 2 bytes (bf16, f16) is read. GCC sizes a loop's
    vectors by its narrowest element: 16 lanes of bf16 fill 32 bytes, so the f32 arithmetic ran
    in 32-byte vectors too, half the width (LayerNorm backward's row sums in bf16). Lane ``l``
    takes iterations ``l``, ``l + lanes``, ...; the lanes combine pairwise (``lanes / 2``, ...,
    1): a fixed order per kernel instance. Where every accumulation is a maximum or a minimum,
    ``EXTREMA_CHAINS`` times as many: a vector of lanes is one chain of dependent instructions
    a strip (a compare, a compare of the value with itself, a blend: 7-8 cycles on the Zen 5
    VM), so one vector held a row's max pass to a strip per chain's latency (a third of
    cross-entropy backward's time at 4096x32000 f32); four vectors run four chains side by side.
    The maximum's value does not depend on the split (a sum's bits would), only which NaN or
    which signed zero wins a tie."""
    base = 2 * LANES if elem_bytes and min(elem_bytes) <= 2 else LANES
    return base * EXTREMA_CHAINS if kinds and all(k in ("max", "min") for k in kinds) else base


def loaded_bytes(op: s.ForOp, binding: dict[str, DType]) -> list[int]:
    """The element sizes, in bytes, that the loads in ``op``'s body read under a kernel instance's
    ``binding`` (:func:`~opgen.lower.sched.binding_bytes`); a load of a kept row counts the
    elements it was computed from too (``sched.LANE_DTYPES``)."""
    size = s.binding_bytes(binding)
    out = []
    for o in op.body.block.ops:
        if isinstance(o, s.LoadOp):
            out.append(size(s.buf_type(o.buf)))
            if isinstance(a := o.buf.owner, s.AllocOp) and s.LANE_DTYPES in a.attributes:  # (a kept row)
                out += [s.bound_dtype(d.data, binding).bits // 8 for d in a.attributes[s.LANE_DTYPES].data]
    return out


def strip(elem_bytes: list[int]) -> int:
    """Iterations per strip of a ``stream`` loop whose prefetched rows have these element sizes:
    one line of the widest, so that every line of every row is prefetched (a strip of 16 bf16
    elements, half a line, vectorises badly: SiLU backward 15.0 -> 20.9 ms; a strip of 32 f32,
    two lines, leaves every other line unprefetched: 12.5 -> 19.0 ms)."""
    return LINE // max(elem_bytes)


def copies(op: s.ForOp, elem_bytes: list[int]) -> int:
    """Strips of ``stream`` loop ``op`` (:func:`strip` iterations each, one line; ``elem_bytes``
    as for :func:`strip`) that one step of its loop runs side by side, as interleaved copies of
    the body: its ``copies`` attribute (map-cpu's: ``COPIES`` where the body is :func:`slow`)
    counts them for a strip of one f32 vector (``LANES`` iterations); a strip of ``w`` vectors
    (bf16 and f16: 32 iterations, two vectors of f32 arithmetic) runs ``copies / w`` (at least
    one), so that the same number of vectors' chains are in flight. GCC turns a strip into one
    vector per value, and a slow body into one long chain of dependent instructions per vector:
    the core's schedulers fill with a strip's chains before the next strip's independent work
    arrives. Interleaved, four chains overlap (in cache, one thread: GELU-tanh backward f32 0.54
    -> 0.41 ns an element, SiLU 0.24 -> 0.21, GELU 0.50 -> 0.46; bf16, two strips of 32: SiLU
    0.286 -> 0.256, GELU 0.308 -> 0.305, GELU-tanh 0.298 -> 0.300). Four bf16 strips (eight
    vectors) cost more than they gained (register spills: GELU backward's table lookups 0.27 ->
    0.33). A light body only grows: RMSNorm backward f32 (its row statistics are
    loop-invariant) 2-3% slower, the embedding gradient's f32 rows 2%."""
    attr = op.attributes.get(COPIES_ATTR)
    if not isinstance(attr, IntegerAttr):
        return 1
    return max(1, attr.value.data // -(-strip(elem_bytes) // LANES))


def pair_loads(op: s.ForOp) -> list[s.LoadOp]:
    """The loads of loop ``op`` that read a caller's row along it: ``op``'s counter is their last
    index and appears nowhere else, their other indices are defined outside ``op``, and their
    dtype is bf16 in some instance of the kernel. None where any other load of ``op``'s body
    depends on the counter (a row read at an offset, a bool mask, an f32 column of statistics:
    read at a pair's two indices, the compiler shuffles them apart, which cost more than the
    widening saved: rotary-embedding backward bf16 2.6 -> 3.2 ms, dropout's mask in cache 1.65 ->
    1.9 ms), or where the body is :func:`slow` (SiLU backward bf16, whose exp and division
    dwarf the widening: 3% slower)."""
    if slow(op):
        return []
    out = []
    for ld in op.body.block.ops:
        if not isinstance(ld, s.LoadOp) or not any(uses_counter(i, op) for i in ld.idx):
            continue
        idx = list(ld.idx)
        along = idx[-1] is op.iv and op.iv not in idx[:-1] and all(s.defined_outside(op, i) for i in idx[:-1])
        if not (along and s.buf_type(ld.buf).role.data in ("in", "out")
                and dtypes.BF16 in ir.dtype_members(ld, s.buf_type(ld.buf).dtype)):
            return []
        out.append(ld)
    return out


def mark_pairs(op: s.ForOp) -> None:
    """Mark a ``lanes`` or ``stream`` loop ``pairs`` and its :func:`pair_loads` ``pair`` where it
    has any: in an instance where one of them reads bf16 (:func:`paired`), the printer runs the
    loop's strips as pairs of elements (opgen/emit/c_family.py)."""
    loads = pair_loads(op)
    if loads:
        op.attributes[PAIRS] = UnitAttr()
        for ld in loads:
            ld.attributes[PAIR] = UnitAttr()


def paired(op: s.ForOp, binding: dict[str, DType]) -> bool:
    """Whether ``pairs`` loop ``op`` runs as pairs of elements in the kernel instance of
    ``binding``: one of its ``pair`` loads reads bf16 there. A strip (a ``lanes`` loop's lanes,
    a ``stream`` loop's strip of one line) then takes each pair of consecutive elements as a
    first and a second: lane ``j`` of the first half holds element ``2 j``, lane ``j`` of the
    second half element ``2 j + 1``. A bf16 row's pair is one 32-bit word, which widens to two
    f32 vectors by a shift and a mask (``opgen_bf16_first``/``opgen_bf16_second``) where widening
    32 elements in order takes six instructions (in cache, one thread, on the Zen 5 machine: a
    bf16 dot product 0.080 -> 0.039 ns an element, softmax backward's second pass 0.112 ->
    0.064); a staged bf16 strip is rounded as two vectors and interleaved by one ``vpermw``
    (``opgen_bf16_store_strip_pairs``). A lanes reduction so split sums its elements in another
    fixed order (lower-to-std builds the same); the tail after the last whole strip runs in
    order. Decided by the dtypes alone, not by strides: the same instance gives the same bits
    for any layout of its arguments (a strided row loads its elements one by one). (A stream
    loop, whose order changes no value, the printer runs in pairs only where one of its pairs is
    read as a word in the flavour it prints.)"""
    if PAIRS not in op.attributes:
        return False
    return any(PAIR in ld.attributes and s.bound_dtype(s.buf_type(ld.buf).dtype, binding) == dtypes.BF16
               for ld in op.body.block.ops if isinstance(ld, s.LoadOp))


def mark_stream(op: s.ForOp) -> None:
    """Map ``op`` as a ``stream`` loop, with ``copies = COPIES`` where its body is :func:`slow`."""
    op.attributes[MAPPING] = CpuMappingAttr(CpuMapping.STREAM)
    if slow(op):
        op.attributes[COPIES_ATTR] = IntegerAttr(COPIES, 64)


#: ops that take many cycles per value, or a chain of them (a vector unit's division and square
#: root; exp, log, tanh, erf and the sigmoid as polynomials)
SLOW_OPS = (ir.ExpOp, ir.LogOp, ir.TanhOp, ir.ErfOp, ir.SigmoidOp, ir.DivOp, ir.SqrtOp, ir.RsqrtOp, ir.RecipOp,
            ir.PowOp)


def slow(op: s.ForOp) -> bool:
    """Whether ``op``'s iterations compute something slow (``SLOW_OPS``, also inside a
    ``sched.load_fn``) from values that change from one iteration to the next (a loop-invariant
    one, such as a norm's row statistics read from a register, the compiler computes once)."""
    varying: set[SSAValue] = {op.iv}
    for o in op.body.block.ops:
        if any(v in varying for v in o.operands):  # (a load: where its indices vary)
            varying.update(o.results)
            if any(isinstance(x, SLOW_OPS) for x in o.walk()):
                return True
    return False


def independent(op: s.ForOp) -> bool:
    """Whether vector lanes may run ``op``'s iterations side by side: a ``parallel`` loop
    holding no loop, check, segment, matmul, pack or allocation op, whose stores and
    accumulations all index with its counter (each iteration writes its own elements; no scalar
    carried between iterations)."""
    if op.kind.data != "parallel":
        return False
    for o in op.body.block.ops:
        if isinstance(o, (s.ForOp, s.AllocOp, *s.OPAQUE)):
            return False
        if isinstance(o, s.StoreOp | s.AccumOp) and not any(i is op.iv for i in o.idx):
            return False
    return True


def _along_row(op: s.ForOp, idx: list[SSAValue]) -> bool:
    """Whether indices ``idx`` of a buffer of rank 2 or more walk one row with ``op``'s counter:
    the counter is the last index and appears nowhere else; in a ``flat`` loop (a chunk of a
    loop over 1-D tensors: opgen/lower/flat_chunks.py) a 1-D buffer indexed by the counter alone
    is such a row too."""
    if len(idx) == 1:
        return FLAT in op.attributes and idx[0] is op.iv
    return len(idx) >= 2 and idx[-1] is op.iv and op.iv not in idx[:-1]


def _row_loads(op: s.ForOp, lanes: bool = False, exprs: bool = False) -> list[s.LoadOp]:
    """The loads of an :func:`independent` loop ``op`` (or, ``lanes``, of a lanes loop) that read
    rows (:func:`_along_row`: of 2-D or larger buffers, or 1-D ones in a flat loop): indexed by
    enclosing loops' counters only (``exprs``: or expressions of them, :func:`counter_expr`),
    ``op``'s last and nowhere else (one per buffer and index)."""
    if not (lanes or independent(op)):
        return []
    out: dict[tuple[SSAValue, ...], s.LoadOp] = {}
    for ld in op.body.block.ops:
        if not isinstance(ld, s.LoadOp):
            continue
        idx = list(ld.idx)
        if not _along_row(op, idx):
            continue
        if all(counter_expr(i) if exprs else _is_counter(i) for i in idx):
            out.setdefault((ld.buf, *idx), ld)
    return list(out.values())


def _is_counter(v: SSAValue) -> bool:
    """Whether ``v`` is a loop's counter."""
    return isinstance(v, BlockArgument) and isinstance(v.owner.parent_op(), s.ForOp)


def counter_expr(v: SSAValue) -> bool:
    """Whether ``v`` is computed from loop counters, sizes and constants alone (no load): a loop
    counter, or a scalar op of the opgen dialect on such values (jam-rows' rows ``lo + 2 p + 1``)."""
    if isinstance(v, BlockArgument):
        return _is_counter(v)
    op = v.owner
    return (isinstance(op, Operation) and op.dialect_name() == "opgen" and not op.regions
            and all(counter_expr(x) for x in op.operands))


def uses_counter(v: SSAValue, loop: s.ForOp) -> bool:
    """Whether the counter expression ``v`` (:func:`counter_expr`) depends on ``loop``'s counter."""
    if v is loop.iv:
        return True
    op = v.owner
    return isinstance(op, Operation) and any(uses_counter(x, loop) for x in op.operands)


def at_counter(v: SSAValue, loop: s.ForOp, at: SSAValue, before: Operation,
                memo: dict[SSAValue, SSAValue]) -> SSAValue:
    """The counter expression ``v`` evaluated with ``loop``'s counter at ``at``: the ops between
    them copied before ``before`` once each (``memo``; ``v`` itself where it does not depend on
    that counter)."""
    if v is loop.iv:
        return at
    op = v.owner
    if not isinstance(op, Operation) or not uses_counter(v, loop):
        return v
    if v not in memo:
        new = op.clone(value_mapper={x: at_counter(x, loop, at, before, memo) for x in op.operands})
        before.parent_block().insert_op_before(new, before)
        memo[v] = new.results[0]
    return memo[v]


def reads_only(op: s.ForOp) -> bool:
    """Whether ``op`` writes nothing of a caller's tensors (only its own scratch: accumulators)."""
    return all(s.buf_type(b).role.data in s.SCRATCH_ROLES for b in s.effects(op)[1])


def streams(op: s.ForOp, read_before: set[SSAValue]) -> list[s.LoadOp]:
    """The loads a ``stream`` loop prefetches ahead in their own row: rows of caller tensors
    (:func:`_row_loads`; in a loop that :func:`reads_only`, also rows indexed by expressions of
    counters, jam-rows' pairs) that no earlier loop of the enclosing body (``read_before``) has
    read."""
    return [ld for ld in _row_loads(op, exprs=reads_only(op))
            if ld.buf not in read_before and s.buf_type(ld.buf).role.data in ("in", "out")]


def shifted_streams(op: s.ForOp, read_before: set[SSAValue]) -> list[tuple[s.LoadOp, SSAValue]]:
    """The loads of an :func:`independent` loop ``op`` that read a row at a column offset,
    ``buf[..., j + k]`` (``j`` ``op``'s counter, ``k`` defined outside ``op``, the other indices
    enclosing loops' counters: a concat's or a rotation's other half of the row), in caller
    tensors no earlier loop of the enclosing body (``read_before``) has read, with their ``k``;
    a ``stream`` loop prefetches them ahead as it does its plain rows (``sched.prefetch ...
    shift k``). Rotary-embedding backward f32 4096x32x128, 2 threads, outputs given: the
    rotated half's lines had been left to the hardware, 2.59 -> 2.38 ms."""
    if not independent(op):
        return []
    out: dict[tuple[SSAValue, ...], tuple[s.LoadOp, SSAValue]] = {}
    for ld in op.body.block.ops:
        if not isinstance(ld, s.LoadOp) or s.buf_type(ld.buf).role.data not in ("in", "out") or ld.buf in read_before:
            continue
        *rest, last = ld.idx
        add = last.owner
        if len(rest) < 1 or not isinstance(add, ir.AddOp) or not all(_is_counter(i) and i is not op.iv for i in rest):
            continue
        k = add.rhs if add.lhs is op.iv else add.lhs if add.rhs is op.iv else None
        if k is None or not s.defined_outside(op, k):
            continue
        out.setdefault((ld.buf, *rest, k), (ld, k))
    return list(out.values())


def staged_stores(op: s.ForOp) -> list[s.StoreOp]:
    """The stores of a ``stream`` loop ``op`` it stages: into caller tensors' rows (:func:`_along_row`),
    indexed by ``op``'s counter last and nowhere else (a strip's values are consecutive elements
    of one row). An instance whose bound dtype has a block conversion in the printer's table
    (bf16) stages them; others store each value as it comes."""
    return [st for st in op.body.block.ops if isinstance(st, s.StoreOp)
            and s.buf_type(st.buf).role.data in ("in", "out") and _along_row(op, list(st.idx))]


def staged_loads(op: s.ForOp) -> list[s.LoadOp | s.LoadFnOp]:
    """The loads of a ``stream`` loop ``op`` it stages: from caller tensors' rows (:func:`_along_row`),
    indexed by ``op``'s counter last and nowhere else, by values from outside it before (a strip's
    values are consecutive elements of one row, known before the strip), ahead of every store
    into a caller's tensor, which must all be along the row (widened at the strip's start, a
    load then reads no element an earlier iteration's store may have written: at most its own
    element, which a store of its own iteration writes after it). An instance whose bound dtype
    has a block conversion in the printer's table (f16: ``vcvtph2ps``) widens a strip at a time
    before the strip's arithmetic; others load each value as it comes. A ``sched.load_fn`` of such
    a row is staged too: an instance that looks it up in a table (bf16, f16: opgen/lower/tabulate.py)
    looks up a strip at a time (``opgen_table_load_strip``: scalar loads, which the Zen 5 machine
    runs faster than the vectorised loop's gather)."""
    def caller(o: Operation) -> bool:
        return isinstance(o, s.StoreOp | s.AccumOp) and s.buf_type(o.buf).role.data in ("in", "out")

    body = list(op.body.block.ops)
    if any(caller(o) and (o.parent_op() is not op or not _along_row(op, list(o.idx))) for o in op.walk()):
        return []
    first = next((i for i, o in enumerate(body) if caller(o)), len(body))
    return [ld for ld in body[:first] if isinstance(ld, s.LoadOp | s.LoadFnOp)
            and s.buf_type(ld.buf).role.data in ("in", "out") and _along_row(op, list(ld.idx))
            and all(s.defined_outside(op, i) for i in ld.idx[:-1])]


def next_rows(op: s.ForOp, parent: Operation, read_before: set[SSAValue]) -> list[s.LoadOp]:
    """The loads whose next row a ``stream`` loop prefetches: rows of caller inputs
    ``buf[..., r, j]`` (:func:`_row_loads`) that an earlier loop of the same body
    (``read_before``) has read, ``r`` the counter of ``parent`` (the loop ``op`` sits in: its
    next iteration reads row ``r + 1``) or an expression of it (:func:`counter_expr`; jam-rows'
    ``lo + 2 p + 1``) and ``j`` ``op``'s."""
    if not isinstance(parent, s.ForOp):
        return []
    return [ld for ld in _row_loads(op, exprs=True) if ld.buf in read_before and s.buf_type(ld.buf).role.data == "in"
            and len(ld.idx) >= 2 and uses_counter(ld.idx[-2], parent)
            and not any(uses_counter(i, parent) for i in ld.idx[:-2])]


def _next_rows(o: s.ForOp, parent: s.ForOp) -> Callable[[s.LoadOp], SSAValue]:
    """For a load of ``o`` reading row ``buf[..., r, j]``, the row the parent's next iteration
    reads in its place (``r`` evaluated at the parent's counter + 1: :func:`at_counter`),
    clamped to the tensor's rows, ``max(0, min(row, rows - 1))``, so that no row outside the
    tensor is named (and the last iteration of a group of rows names the next group's first
    rows); where the tensor's rows are an expression and not a dim, the parent's last iteration
    names its own rows instead (``min(r + 1, hi - 1)``). The ops are built before ``o``, each
    once."""
    def before(*ops: Operation) -> None:
        for new in ops:
            o.parent_block().insert_op_before(new, o)

    consts: list[SSAValue] = []  # (1, 0 and the parent's counter + 1, built at the first call)
    memo: dict[SSAValue, SSAValue] = {}
    rows: dict[tuple[SSAValue, str], SSAValue] = {}  # (row, the tensor's rows) -> the next row

    def next_row(ld: s.LoadOp) -> SSAValue:
        key = (ld.idx[-2], s.buf_type(ld.buf).shape[-2])
        if key in rows:
            return rows[key]
        if not consts:
            one, zero = ir.ConstantOp(1, "i64"), ir.ConstantOp(0, "i64")
            nxt = ir.AddOp(parent.iv, one.result)
            before(one, zero, nxt)
            consts.extend((one.result, zero.result, nxt.result))
        one, zero, nxt = consts
        ext = s.extent_of(ld.buf, s.buf_type(ld.buf).rank - 2)
        if ext is None:
            hi = ir.SubOp(parent.hi, one)
            last = ir.MinOp(nxt, hi.result)
            before(hi, last)
            rows[key] = at_counter(ld.idx[-2], parent, last.result, o, {})
            return rows[key]
        ops, n = ext
        top = ir.SubOp(n, one)
        below = ir.MinOp(at_counter(ld.idx[-2], parent, nxt, o, memo), top.result)
        clamped = ir.MaxOp(below.result, zero)
        before(*ops, top, below, clamped)
        rows[key] = clamped.result
        return rows[key]

    return next_row


def _prefetch_next_rows(o: s.ForOp, next_row: Callable[[s.LoadOp], SSAValue], loads: list[s.LoadOp]) -> None:
    """A prefetch of each load's element in its next row, at the start of ``o``'s strips: the row
    the parent's next iteration reads (``next_row``, :func:`_next_rows`: the last iteration of a
    group of rows, row-groups' 32 rows or jam-rows' pairs within them, fetches the next group's
    first rows: 2-3% less time for RMSNorm bf16 8192x4096, 1 and 2 threads). The next row is
    fetched while this row's second pass computes. For every element size: narrow elements
    (bf16, f16) were once prefetched during the first pass instead, which measured faster when
    the second pass was slower; on the Zen 5 machine the second pass is faster for them too
    (bf16, 8192x4096, 2 threads, outputs given, libraries alternating in one process: RMSNorm
    4.6 -> 4.4 ms, softmax 4.2 -> 4.0, LayerNorm 5.0 -> 4.7; docs/backend_cpu.md)."""
    start = o.body.block.first_op
    for ld in loads:
        o.body.block.insert_op_before(s.PrefetchOp(ld.buf, [*ld.idx[:-2], next_row(ld), ld.idx[-1]], 0), start)


def _one_a_step(row: SSAValue, loop: s.ForOp) -> bool:
    """Whether ``row`` is ``loop``'s counter or the counter plus a value defined outside the loop:
    the loop's next iteration reads the row after it."""
    if row is loop.iv:
        return True
    add = row.owner
    if not isinstance(add, ir.AddOp):
        return False
    other = add.rhs if add.lhs is loop.iv else add.lhs if add.rhs is loop.iv else None
    return other is not None and not uses_counter(other, loop)


def _wrap(o: s.ForOp, parent: s.ForOp, ld: s.LoadOp, next_row: Callable[[s.LoadOp], SSAValue],
          lengths: dict[str, SSAValue]) -> tuple[SSAValue, SSAValue] | None:
    """Where the ``PREFETCH_AHEAD`` prefetch of stream load ``ld`` goes once it passes the end of
    its row (``sched.prefetch ... wrap``): the row the parent's next iteration reads in its place
    (``next_row``) and the row's length, for a row that is an expression of the parent's counter
    other than one a step (a group of rows read side by side: a loop that only sums columns,
    jam-rows' 8 rows; BatchNorm's column sums, 4), whose rows' ends had spilled into the group's
    next row, read already, where the next group's rows were to come. A sum over the middle axis,
    128x64x4096 bf16, 2 threads, outputs given: 1.87-2.00 -> 1.78-1.82 ms (the first quarter of
    each 8 KiB row had been left to the hardware); f32 within the noise. None for a row one a
    step (:func:`_one_a_step`: its end spills into the next row, as it should) and for a row
    whose length is not known. ``lengths``: the rows' lengths built before ``o`` so far, by size."""
    if len(ld.idx) < 2:
        return None
    row = ld.idx[-2]
    if _one_a_step(row, parent) or not uses_counter(row, parent) or any(uses_counter(i, parent) for i in ld.idx[:-2]):
        return None
    size = s.buf_type(ld.buf).shape[-1]
    if size not in lengths:
        ext = s.extent_of(ld.buf, s.buf_type(ld.buf).rank - 1)
        if ext is None:
            return None
        for new in ext[0]:
            o.parent_block().insert_op_before(new, o)
        lengths[size] = ext[1]
    return next_row(ld), lengths[size]


def _map(op: Operation, in_parallel: bool) -> None:
    """Mark the loops nested in ``op`` (``in_parallel``: inside a parallel loop)."""
    for r in op.regions:
        for b in r.blocks:
            read: set[SSAValue] = set()  # buffers read by the ops so far in this block
            for o in list(b.ops):
                inner = in_parallel
                if isinstance(o, s.ForOp):
                    if o.kind.data == "parallel" and not in_parallel:
                        o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.OMP_FOR)
                        if (n := collapsible(o)) > 1:
                            o.attributes[COLLAPSE] = IntAttr(n)
                    elif lane_split(o):
                        o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.LANES)
                        mark_pairs(o)
                    elif in_parallel and any(hints := (streams(o, read), next_rows(o, op, read),
                                                       shifted_streams(o, read))):
                        loads, nexts, shifted = hints
                        mark_stream(o)
                        mark_pairs(o)
                        first = o.body.block.first_op
                        l2 = reads_only(o)
                        next_row = _next_rows(o, op) if isinstance(op, s.ForOp) else None
                        lengths: dict[str, SSAValue] = {}
                        for ld in loads:
                            wrap = _wrap(o, op, ld, next_row, lengths) if next_row is not None else None
                            hint = s.PrefetchOp(ld.buf, list(ld.idx), PREFETCH_AHEAD, l2=l2, wrap=wrap)
                            o.body.block.insert_op_before(hint, first)
                        for ld, k in shifted:
                            hint = s.PrefetchOp(ld.buf, [*ld.idx[:-1], o.iv], PREFETCH_AHEAD, shift=k, l2=l2)
                            o.body.block.insert_op_before(hint, first)
                        if nexts and next_row is not None:
                            _prefetch_next_rows(o, next_row, nexts)
                        for ld in staged_loads(o):
                            ld.attributes[MAPPING] = CpuMappingAttr(CpuMapping.STAGED)
                        for st in staged_stores(o):
                            st.attributes[MAPPING] = CpuMappingAttr(CpuMapping.STAGED)
                            if nexts:  # (a second pass over the row: see the module docstring)
                                own = s.PrefetchOp(st.buf, list(st.idx), PREFETCH_AHEAD, write=True)
                                o.body.block.insert_op_before(own, o.body.block.first_op)
                    elif in_parallel and independent(o):
                        o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.SIMD)
                    inner = in_parallel or o.kind.data == "parallel"
                elif isinstance(o, s.BufferMatmulOp) and not in_parallel:
                    o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.OMP_FOR)
                _map(o, inner)
                read |= s.effects(o)[0]


def nontemporal_outputs(k: s.KernelOp) -> dict[SSAValue, list[s.StoreOp]]:
    """The outputs of ``k`` whose stores may stream around the caches, with those stores (module
    docstring): rank 2 or more (1 in a flat loop), used by stores only, each walking a row in a ``stream`` loop
    (staged there) or a ``simd`` loop."""
    out: dict[SSAValue, list[s.StoreOp]] = {}
    for buf in k.body.block.args:
        t = buf.type
        if not isinstance(t, s.BufType) or t.role.data != "out" or t.rank < 1:
            continue
        stores: list[s.StoreOp] = []
        for use in buf.uses:
            o, loop = use.operation, use.operation.parent_op()
            if isinstance(o, s.PrefetchOp | s.LinePhaseOp):  # (neither reads an element)
                continue
            if not (isinstance(o, s.StoreOp) and o.buf is buf and isinstance(loop, s.ForOp)
                    and _along_row(loop, list(o.idx))
                    and (cpu_mapping(loop) == CpuMapping.SIMD
                         or (cpu_mapping(loop) == CpuMapping.STREAM and cpu_mapping(o) == CpuMapping.STAGED))):
                break
            stores.append(o)
        else:
            if stores:
                out[buf] = stores
    return out


def hoist_invariant(loop: s.ForOp, v: SSAValue) -> None:
    """Move the scalar ops computing ``v`` inside ``loop`` before it when they use nothing the
    loop defines or loads (a row of zeros: the value is converted once for the whole strip)."""
    chain: list[Operation] = []
    todo = [v]
    while todo:
        x = todo.pop()
        op = x.owner
        if not isinstance(op, Operation):
            if op.parent_op() is not None and loop.is_ancestor(op.parent_op()):
                return  # (a counter of the loop or of a loop in it)
            continue
        if not loop.is_ancestor(op):
            continue
        if op.dialect_name() != "opgen" or op.regions or op.parent_op() is not loop:
            return
        chain.append(op)
        todo.extend(op.operands)
    for op in sorted(set(chain), key=list(loop.body.block.ops).index):
        op.detach()
        loop.parent_block().insert_op_before(op, loop)


#: the attribute of a ``nontemporal`` store of +0 (:func:`mark_zero_fill`)
ZERO_FILL = "zero_fill"


def _positive_zero(v: SSAValue) -> bool:
    """Whether ``v`` is the constant +0 (through casts: +0 in every float dtype, 0 in an integer)."""
    op = v.owner
    while isinstance(op, ir.CastOp):
        op = op.operands[0].owner
    if not isinstance(op, ir.ConstantOp):
        return False
    val = op.value
    if isinstance(val, FloatAttr):
        x = float(val.value.data)
        return x == 0.0 and math.copysign(1.0, x) > 0  # (+0 only: -0's sign bit is stored)
    return isinstance(val, IntegerAttr) and val.value.data == 0


def mark_zero_fill(st: s.StoreOp) -> None:
    """Mark a ``nontemporal`` store of +0 ``zero_fill``: where the caller has said the output
    holds zeros already (the runtime's ``opgen_zero_hint``: a fresh output from the Python API),
    the loop of such stores does not run, so the output's pages that only they would touch are
    never faulted in (the rows of an embedding table no index hits: 3 in 4 of the benchmark's)."""
    if cpu_mapping(st) == CpuMapping.NONTEMPORAL and _positive_zero(st.value):
        st.attributes[ZERO_FILL] = UnitAttr()


def zero_fill_loop(op: s.ForOp) -> SSAValue | None:
    """The output a loop only fills with +0 (every op in it a ``zero_fill`` store into that
    output, or the constant and casts computing the zero), else None."""
    bufs = set()
    for o in op.body.block.ops:
        if isinstance(o, s.StoreOp) and ZERO_FILL in o.attributes:
            bufs.add(o.buf)
        elif not isinstance(o, ir.ConstantOp | ir.CastOp):
            return None
    return bufs.pop() if len(bufs) == 1 else None


def _nontemporal(k: s.KernelOp) -> None:
    """Mark the stores of :func:`nontemporal_outputs` (their ``simd`` loops become streams; a
    value the same in every iteration is computed before the loop)."""
    for stores in nontemporal_outputs(k).values():
        for st in stores:
            loop = st.parent_op()
            assert isinstance(loop, s.ForOp)
            if cpu_mapping(loop) == CpuMapping.SIMD:
                mark_stream(loop)
            st.attributes[MAPPING] = CpuMappingAttr(CpuMapping.NONTEMPORAL)
            hoist_invariant(loop, st.value)
            mark_zero_fill(st)


class MapCpu(ModulePass):
    """Mark the CPU target's OpenMP loops, lane-split reductions, vector loops, prefetching
    streams and streaming stores (module docstring)."""

    name = "map-cpu"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                _map(k, False)
                _nontemporal(k)
