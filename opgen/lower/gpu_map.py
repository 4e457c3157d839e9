"""``map-gpu``: kernel outlining and grid mapping of the CUDA target, decided on the loop level.

Each top-level statement of a ``sched.kernel`` gets a ``gpu_mapping`` (``#sched<gpu_mapping ...>``):

* ``host``: work of the host launcher — a ``sched.require`` whose condition only needs dims and
  scalars, outside a run of device statements (the leading ones are checked before anything is
  launched, so the status returns synchronously and nothing is written), a workspace temporary (``sched.alloc``
  of role ``temp``: a workspace region, zero-filled with ``cudaMemsetAsync`` when it asks for
  zeros) and ``sched.segments`` (a stable radix sort on the device, in the runtime);
* a device kernel, ``gpu_kernel = k`` on each of its statements: a top-level ``sched.matmul``
  alone (``matmul``: a grid-stride kernel, one output element per thread), else a maximal run
  of statements — one per top-level loop, statements sharing a scalar local kept together —
  mapped as ``block`` (one ``parallel`` loop with work for a whole block: iterations over
  ``blockIdx.x``), ``flat`` (one ``parallel`` loop with scalar work, or a ``serial`` loop with
  provably independent iterations: one iteration per thread over the grid), ``columns`` (a
  ``parallel`` loop whose iterations each sum a long loop into a register, reading memory at the
  parallel index: 32 iterations per block, one per lane; the long loop, marked ``slices``, is
  split over the 8 warps, warp w taking its iterations w, w + 8, ..., and the 8 partials are
  combined in warp order — a column sum reads whole rows at once, where ``flat`` would give
  one thread a column's whole serial chain) or ``single`` (one block runs it uniformly: always
  correct).

Inside a ``block`` or ``single`` kernel, whose code every thread of a block runs with the same
values, loops get ``threads`` (a parallel loop, and the perfect nest under it counted by
``gpu_collapse``, strided over the block's threads) or ``block_reduce`` (a reduce loop into
scalars: thread t takes iterations t, t + 256, ..., the partials meet in a fixed tree); other
loops stay uniform. The chunks of a thread's iterations and the block's barriers are placed
next, by chunk-gpu-loops and place-gpu-barriers (opgen/lower/gpu_sync.py).

Scalar statements (rank-0 values) get no mapping: each kernel and the launcher compute the ones
they need. ``opgen show OP --target cuda --stage map-gpu`` shows the decisions; the printer
(opgen/emit/cuda.py) follows them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntAttr, ModuleOp
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.sched import GpuMapping, GpuMappingAttr

MAPPING = "gpu_mapping"
KERNEL = "gpu_kernel"
REGION = "gpu_region"
COLLAPSE = "gpu_collapse"
#: C types whose integer sums may use atomicAdd (exact in any order), with the type atomicAdd takes
ATOMIC_TYPES = {"int32_t": "int", "uint32_t": "unsigned int", "int64_t": "unsigned long long",
                "uint64_t": "unsigned long long"}
#: C types a block reduction shuffles (opgen_block_reduce)
SHUFFLE_CTYPES = ("float", "double", "int32_t", "uint32_t", "int64_t", "uint64_t")


def mapping(op: Operation) -> str | None:
    """The op's ``gpu_mapping`` (None: a scalar statement, or the pass did not run)."""
    a = op.attributes.get(MAPPING)
    return a.data.value if isinstance(a, GpuMappingAttr) else None


def kernel_id(op: Operation) -> int | None:
    a = op.attributes.get(KERNEL)
    return a.data if isinstance(a, IntAttr) else None


def thread_chain(op: s.ForOp) -> list[s.ForOp]:
    """The loops a ``threads`` loop spreads over the block's threads as one iteration space: it
    and the ``gpu_collapse - 1`` loops nested last in it."""
    a = op.attributes.get(COLLAPSE)
    chain = [op]
    for _ in range((a.data if isinstance(a, IntAttr) else 1) - 1):
        inner = chain[-1].body.block.last_op
        assert isinstance(inner, s.ForOp)
        chain.append(inner)
    return chain


def region_id(op: Operation) -> int | None:
    """The workspace region ``plan-gpu-workspace`` gave ``op`` (the first of a segments op's)."""
    a = op.attributes.get(REGION)
    return a.data if isinstance(a, IntAttr) else None


# ---------------------------------------------------------------------- analysis helpers
def scalar_value(op: Operation) -> bool:
    """A scalar computation (no side effect): its result is a rank-0 value."""
    return bool(op.results) and isinstance(op.results[0].type, ir.TensorType)


def nested(op: Operation) -> Iterator[Operation]:
    """Every operation inside ``op``'s regions (not ``op`` itself)."""
    for r in op.regions:
        for b in r.blocks:
            for o in b.ops:
                yield o
                yield from nested(o)


def inside(op: Operation | None, anc: Operation) -> bool:
    while op is not None:
        if op is anc:
            return True
        op = op.parent_op()
    return False


def defined_inside(v: SSAValue, op: Operation) -> bool:
    """``v`` is computed (or is a block argument) inside ``op``."""
    return inside(v.owner if isinstance(v.owner, Operation) else v.owner.parent_op(), op)


def register(buf: SSAValue) -> bool:
    """A rank-0 local buffer: a register of the thread (or of every thread, in uniform code)."""
    t = s.buf_type(buf)
    return t.rank == 0 and t.role.data == "local"


def accessed(op: Operation) -> tuple[set[SSAValue], set[SSAValue]]:
    """Buffers read and written (non-register) inside ``op``."""
    reads, writes = s.effects(op)
    return {b for b in reads if not register(b)}, {b for b in writes if not register(b)}


def operands_of(ops: Iterable[Operation]) -> list[SSAValue]:
    """The values ``ops`` (and the ops nested in them) refer to by name (sizes are printed in
    place: :func:`~opgen.lower.sched.sizes_in_place`)."""
    out: list[SSAValue] = []
    for op in ops:
        for o in op.walk():
            if not s.sizes_in_place(o):
                out.extend(o.operands)
    return out


@dataclass
class KernelFacts:
    """Questions about one ``sched.kernel`` shared by the pass and the printer."""

    k: s.KernelOp

    def __post_init__(self) -> None:
        self.top = list(self.k.body.block.ops)
        self.order = {op: i for i, op in enumerate(self.top)}

    def top_level(self, v: SSAValue) -> Operation | None:
        """The top-level pure op defining ``v`` (None for block arguments and nested values)."""
        op = v.owner
        if isinstance(op, Operation) and op.parent_op() is self.k and scalar_value(op):
            return op
        return None

    def host_ok(self, v: SSAValue, scalars: bool = True) -> bool:
        """``v`` can be computed on the host (from dims, constants and, if allowed, scalar args)."""
        if isinstance(v, BlockArgument):
            return scalars and v.owner is self.k.body.block and isinstance(v.type, ir.TensorType)
        op = self.top_level(v)
        if op is None or isinstance(op, s.LoadOp | s.LoadBitOp):
            return False
        if isinstance(op, ir.ConstantOp | ir.DimOp | s.FlagsPerElemOp):
            return True
        return all(self.host_ok(o, scalars) for o in op.operands)

    def needed(self, roots: Iterable[SSAValue]) -> list[Operation]:
        """Top-level pure ops ``roots`` depend on, in program order."""
        seen: set[Operation] = set()
        todo = list(roots)
        while todo:
            v = todo.pop()
            op = self.top_level(v)
            if op is None or op in seen:
                continue
            seen.add(op)
            if not isinstance(op, s.FlagsPerElemOp) and not s.sizes_in_place(op):
                todo.extend(op.operands)
        return sorted(seen, key=lambda o: self.order[o])

    def atomic_ok(self, op: s.AccumOp) -> bool:
        """An integer sum every binding of the kernel stores in an atomically addable type."""
        return op.kind.data == "sum" and all(c in ATOMIC_TYPES for c in self.storage_ctypes(s.buf_type(op.buf)))

    def storage_ctypes(self, b: s.BufType) -> list[str]:
        """The C types buffer ``b`` stores its elements in under every binding of the kernel
        (the caller's dtype for ``in``/``out``, its compute type otherwise)."""
        return [(d if b.role.data in ("in", "out") else d.compute).c_type for d in self.k.dtype_options(b.dtype)]

    def thread_mappable(self, loop: s.ForOp) -> bool:
        """The loop's iterations can be spread over the block's threads as they are."""
        for o in nested(loop):
            if isinstance(o, s.BufferMatmulOp | s.SegmentsOp):
                return False
            if isinstance(o, s.AllocOp) and not register(o.result):
                return False
            if isinstance(o, s.StoreOp | s.AccumOp) and register(o.buf) \
                    and not inside(o.buf.owner, loop):  # type: ignore[arg-type]
                return False
        return True

    def block_reducible(self, loop: s.ForOp) -> list[s.AccumOp] | None:
        """The scalar accumulations of a reduce loop that can become block reductions (in a type
        the block reduction shuffles, under every binding)."""
        accs: list[s.AccumOp] = []
        kinds: dict[SSAValue, str] = {}
        for o in loop.body.block.ops:
            if isinstance(o, s.ForOp | s.BufferMatmulOp | s.SegmentsOp | s.AllocOp | s.RequireOp | s.StoreOp):
                return None
            if isinstance(o, s.AccumOp):
                if not register(o.buf) or inside(o.buf.owner, loop):  # type: ignore[arg-type]
                    return None
                if not all(c in SHUFFLE_CTYPES for c in self.storage_ctypes(s.buf_type(o.buf))):
                    return None
                if kinds.setdefault(o.buf, o.kind.data) != o.kind.data:
                    return None
                accs.append(o)
        return accs or None

    def collapse(self, loop: s.ForOp) -> list[s.ForOp]:
        """A perfect nest of parallel loops (scalar code between them allowed) whose inner bounds
        are defined outside the nest: spread over the threads as one flat iteration space."""
        chain = [loop]
        while True:
            ops = list(chain[-1].body.block.ops)
            if not ops or not isinstance(ops[-1], s.ForOp) or ops[-1].kind.data != "parallel":
                break
            inner = ops[-1]
            if not all(scalar_value(o) for o in ops[:-1]):
                break
            if any(defined_inside(v, loop) for v in (inner.lo, inner.hi)):
                break
            chain.append(inner)
        if len(chain) > 1:  # the scalar code between the loops now runs once per element: it must
            _, writes = accessed(chain[-1])  # not read what the inner iterations write
            for lp in chain[:-1]:
                for o in list(lp.body.block.ops)[:-1]:
                    if isinstance(o, s.LoadOp | s.LoadBitOp) and o.buf in writes:
                        return [loop]
        return chain

    def needs_block(self, loop: s.ForOp) -> bool:
        """The loop's body has work for a whole block (a nested loop, a matmul, scratch)."""
        for o in nested(loop):
            if isinstance(o, s.ForOp) and o.kind.data in ("parallel", "reduce"):
                return True
            if isinstance(o, s.BufferMatmulOp):
                return True
            if isinstance(o, s.AllocOp) and not register(o.result):
                return True
        return False

    def column_sliced(self, loop: s.ForOp) -> bool:
        """``loop`` (a parallel loop with scalar work) is ``[zeroed register, loop accumulating
        into it, ...]`` and the inner loop only loads and accumulates, reading some buffer at
        ``loop``'s index last (consecutive lanes, consecutive addresses): the ``columns`` mapping."""
        ops = list(loop.body.block.ops)
        if len(ops) < 2 or not isinstance(ops[0], s.AllocOp) or not isinstance(ops[1], s.ForOp):
            return False
        acc, inner = ops[0].result, ops[1]
        if not register(acc) or ops[0].zero is None or not ops[0].zero.data \
                or inner.kind.data not in ("serial", "reduce"):
            return False
        if any(defined_inside(v, loop) for v in (inner.lo, inner.hi)):
            return False
        if not all(c in SHUFFLE_CTYPES for c in self.storage_ctypes(s.buf_type(acc))):
            return False
        kinds, coalesced = set(), False
        for o in inner.body.block.ops:
            if isinstance(o, s.AccumOp):
                if o.buf is not acc:
                    return False
                kinds.add(o.kind.data)
            elif isinstance(o, s.LoadOp):
                if o.buf is acc:  # a running value: each warp would see only its own slice's
                    return False
                coalesced |= bool(o.idx) and o.idx[-1] is loop.iv and not register(o.buf)
            elif not scalar_value(o):
                return False
        return len(kinds) == 1 and coalesced

    def independent(self, loop: s.ForOp) -> bool:
        """Iterations of a ``serial`` loop touch disjoint memory (or only count atomically)."""
        iv = loop.iv
        owned: set[SSAValue] = set()
        atomic: set[SSAValue] = set()
        for o in nested(loop):
            if isinstance(o, s.BufferMatmulOp | s.SegmentsOp):
                return False
            if isinstance(o, s.AllocOp) and not register(o.result):
                return False
            if isinstance(o, s.StoreOp | s.AccumOp):
                if register(o.buf):
                    if not inside(o.buf.owner, loop):  # type: ignore[arg-type]
                        return False
                elif iv in o.idx:
                    owned.add(o.buf)
                elif isinstance(o, s.AccumOp) and self.atomic_ok(o):
                    atomic.add(o.buf)
                else:
                    return False
        for o in nested(loop):
            if isinstance(o, s.LoadOp | s.LoadBitOp):
                idx = list(o.idx) if isinstance(o, s.LoadOp) else [o.i]
                if o.buf in atomic or (o.buf in owned and iv not in idx):
                    return False
        return not (owned & atomic)


def _mark(op: Operation, m: GpuMapping, kid: int | None = None) -> None:
    op.attributes[MAPPING] = GpuMappingAttr(m)
    if kid is not None:
        op.attributes[KERNEL] = IntAttr(kid)


def map_kernel(k: s.KernelOp) -> None:
    """Mark every top-level statement of ``k`` (module docstring)."""
    f = KernelFacts(k)
    groups: list[list[Operation]] = []
    cur: list[Operation] = []
    cur_regs: set[SSAValue] = set()

    def flush() -> None:
        if cur:
            groups.append(list(cur))
            cur.clear()

    for op in f.top:
        if scalar_value(op):
            continue
        if isinstance(op, s.AllocOp) and s.buf_type(op.result).role.data == "temp":
            _mark(op, GpuMapping.HOST)
            if op.zero is not None and op.zero.data:
                flush()  # (the zero fill is a step between kernels)
            continue
        if isinstance(op, s.RequireOp) and not cur and f.host_ok(op.cond):
            _mark(op, GpuMapping.HOST)
            continue
        if isinstance(op, s.SegmentsOp | s.BufferMatmulOp):
            flush()
            if isinstance(op, s.BufferMatmulOp):
                groups.append([op])
            else:
                _mark(op, GpuMapping.HOST)
            continue
        # one kernel per top-level loop; statements sharing a scalar local stay together
        # (also through the top-level scalars they need, e.g. a load of a full reduction)
        deps = operands_of([op])
        deps += [v for p in f.needed(deps) for v in p.operands]
        used = {v for v in deps
                if isinstance(v.type, s.BufType) and s.buf_type(v).role.data == "local" and v.owner is not op}
        if not (cur and used & cur_regs):
            flush()
            cur_regs.clear()
        cur.append(op)
        if isinstance(op, s.AllocOp):
            cur_regs.add(op.result)
    flush()
    for kid, g in enumerate(groups):
        m = GpuMapping.SINGLE
        if len(g) == 1 and isinstance(g[0], s.BufferMatmulOp):
            m = GpuMapping.MATMUL
        elif len(g) == 1 and isinstance(g[0], s.ForOp):
            lp = g[0]
            if f.host_ok(lp.lo) and f.host_ok(lp.hi):
                if lp.kind.data == "parallel" and f.needs_block(lp):
                    m = GpuMapping.BLOCK
                elif lp.kind.data == "parallel" and f.column_sliced(lp):
                    m = GpuMapping.COLUMNS
                    lp.body.block.ops.first.next_op.attributes[MAPPING] = GpuMappingAttr(GpuMapping.SLICES)
                elif lp.kind.data == "parallel" or (lp.kind.data == "serial" and f.independent(lp)):
                    m = GpuMapping.FLAT
        for op in g:
            _mark(op, m, kid)
        if m == GpuMapping.BLOCK:  # the loop's body runs uniformly in each block
            _map_uniform(f, list(g[0].regions[0].block.ops))
        elif m == GpuMapping.SINGLE:
            _map_uniform(f, g)


def _map_uniform(f: KernelFacts, ops: list[Operation]) -> None:
    """Mark the loops of code every thread of a block runs with the same values: a reduce loop
    into scalars is a ``block_reduce``; a parallel loop (with the perfect nest under it,
    ``gpu_collapse``) whose body needs no cooperation is ``threads``; other loops stay uniform
    (every thread walks them) and their bodies are uniform code too."""
    for o in ops:
        if not isinstance(o, s.ForOp):
            continue
        if o.kind.data == "reduce" and f.block_reducible(o):
            o.attributes[MAPPING] = GpuMappingAttr(GpuMapping.BLOCK_REDUCE)
            continue
        if o.kind.data == "parallel":
            chain = f.collapse(o)
            if f.thread_mappable(chain[0]):
                o.attributes[MAPPING] = GpuMappingAttr(GpuMapping.THREADS)
                if len(chain) > 1:
                    o.attributes[COLLAPSE] = IntAttr(len(chain))
                continue
        _map_uniform(f, list(o.body.block.ops))


class MapGpu(ModulePass):
    """Outline each CUDA kernel instance's device kernels and map them onto the grid."""

    name = "map-gpu"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                map_kernel(k)


def plan_workspace(k: s.KernelOp) -> None:
    """Number the workspace regions of a mapped kernel instance (``gpu_region``), in the order
    the layout places them: every top-level ``temp`` buffer (all call long), three per
    ``sched.segments`` (sort keys, sort values, the sort's scratch), then each device kernel's
    per-block scratch (non-scalar ``local`` buffers, in program order; a kernel's scratch
    starts where the previous kernel's did: they run one after the other)."""
    n = 0
    top = list(k.body.block.ops)
    for op in top:
        if isinstance(op, s.AllocOp) and s.buf_type(op.result).role.data == "temp":
            op.attributes[REGION] = IntAttr(n)
            n += 1
    for op in top:
        if isinstance(op, s.SegmentsOp):
            op.attributes[REGION] = IntAttr(n)
            n += 3
    kernels: dict[int, list[Operation]] = {}
    for op in top:
        kid = kernel_id(op)
        if kid is not None:
            kernels.setdefault(kid, []).append(op)
    for _, ops in sorted(kernels.items()):
        for op in ops:
            for o in op.walk():
                if isinstance(o, s.AllocOp) and not register(o.result) and s.buf_type(o.result).role.data == "local" \
                        and o.result.uses:
                    o.attributes[REGION] = IntAttr(n)
                    n += 1


class PlanGpuWorkspace(ModulePass):
    """Lay out each CUDA kernel instance's workspace regions (:func:`plan_workspace`)."""

    name = "plan-gpu-workspace"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                plan_workspace(k)
