"""``chunk-gpu-loops`` and ``place-gpu-barriers``: how a CUDA block's threads share its work.

Both run after map-gpu and plan-gpu-workspace (opgen/lower/gpu_map.py), on loop IR shared by
every dtype binding of a kernel instance:

* ``chunk-gpu-loops`` marks a ``threads`` loop (not collapsed) or a ``block_reduce`` loop
  ``gpu_chunk = 16`` when every memory access that moves with the loop is ``buf[..., i]``
  (contiguous): thread t then takes chunks t, t + T, ... of consecutive iterations, a chunk being
  one 16-byte vector of the widest element the loop moves (:func:`chunk_width`: 4 f32, 8 bf16
  values). A batched 1-D buffer (rows through a row table), a nested loop or a load of an
  aliasable pair after a store to one keeps the loop unchunked. It marks a per-block scratch
  vector ``gpu_thread_owned`` when only thread ``e % T``'s chunks ever touch its element
  ``e`` under every binding: every access is ``buf[i]`` in a loop over ``[0, n)`` strided over
  the block's threads from the block's uniform code, with one chunk width.
* ``place-gpu-barriers`` inserts ``sched.barrier`` in the code a whole block runs uniformly
  (``block`` and ``single`` kernels): around each step that shares memory with the block's other
  steps — a thread loop touching scratch or temporaries or what another step reads, a store from
  uniform code (thread 0 does it), a zero fill of scratch that is not thread-owned, a block
  matmul — and at the end of each block iteration (its reads of scratch finish before the next
  iteration writes it; every writing step has its own barrier before it too, so an iteration
  that a failed ``sched.require`` cut short, skipping the last barrier, is still safe).
  Canonicalization then drops a barrier that follows another with only side-effect-free ops
  between (``AdjacentBarrier``, beside ``sched.barrier``).

``opgen show OP --target cuda --stage place-gpu-barriers`` shows both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xdsl.context import Context
from xdsl.dialects.builtin import IntAttr, ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.gpu_map import (
    COLLAPSE,
    KERNEL,
    MAPPING,
    accessed,
    inside,
    kernel_id,
    mapping,
    nested,
    register,
    thread_chain,
)
from opgen.lower.sched import GpuMapping, GpuMappingAttr

CHUNK = "gpu_chunk"
OWNED = "gpu_thread_owned"
#: bytes of one thread's chunk: the widest vector load/store of CUDA
CHUNK_BYTES = 16


def chunk_bytes(lp: s.ForOp) -> int:
    """The loop's ``gpu_chunk`` (0: not chunked)."""
    a = lp.attributes.get(CHUNK)
    return a.data if isinstance(a, IntAttr) else 0


def moving(lp: s.ForOp) -> list[s.LoadOp | s.StoreOp | s.AccumOp]:
    """The memory accesses of ``lp``'s body at ``buf[..., i]`` (``i`` the loop's variable)."""
    return [o for o in lp.body.block.ops if isinstance(o, s.LoadOp | s.StoreOp | s.AccumOp)
            and not register(o.buf) and list(o.idx) and o.idx[-1] is lp.iv]


def chunk_width(lp: s.ForOp, elem_bytes: Callable[[s.BufType], int]) -> int:
    """Iterations per chunk of a chunked loop, given each buffer's element size under a binding:
    one ``gpu_chunk``-byte vector of the widest moving element (1: no chunks)."""
    nbytes = chunk_bytes(lp)
    sizes = [elem_bytes(s.buf_type(o.buf)) for o in moving(lp)]
    if not nbytes or not sizes:
        return 1
    v = nbytes // max(sizes)
    return v if v >= 2 else 1


def _varies(v: SSAValue, lp: s.ForOp) -> bool:
    """``v`` may change between iterations of ``lp`` (defined in it, or its variable)."""
    owner = v.owner if isinstance(v.owner, Operation) else v.owner.parent_op()
    return inside(owner, lp)


def chunkable(k: s.KernelOp, lp: s.ForOp) -> bool:
    """Every access of memory that moves with ``lp`` is contiguous in its last index (module
    docstring)."""
    names = k.param_names
    aliased, batched = k.aliased, k.batched_params
    stored_shared = False
    any_moving = False
    for o in lp.body.block.ops:
        if o.regions or isinstance(o, s.RequireOp | s.BufferMatmulOp | s.SegmentsOp | s.BarrierOp):
            return False
        if isinstance(o, s.AllocOp):
            if not register(o.result):
                return False
            continue
        if isinstance(o, s.LoadBitOp):
            if _varies(o.i, lp):
                return False
            continue
        if not isinstance(o, s.LoadOp | s.StoreOp | s.AccumOp) or register(o.buf):
            continue
        idx = list(o.idx)
        if any(_varies(v, lp) for v in idx[:-1]):
            return False
        if not idx or idx[-1] is not lp.iv:
            if (idx and _varies(idx[-1], lp)) or not isinstance(o, s.LoadOp):
                return False
            continue
        name = names.get(o.buf)
        if name is not None:
            if s.buf_type(o.buf).rank == 1 and name in batched:
                return False
            if name in aliased:  # an aliased pair: no load after a store
                if isinstance(o, s.LoadOp) and stored_shared:
                    return False
                stored_shared |= not isinstance(o, s.LoadOp)
        any_moving = True
    return any_moving


def _zero(v: SSAValue) -> bool:
    return isinstance(v.owner, ir.ConstantOp) and v.owner.value.value.data == 0  # type: ignore[union-attr]


def _strided(lp: s.ForOp, block_loop: s.ForOp) -> bool:
    """``lp`` is strided over the block's threads straight from the block's uniform code."""
    m = mapping(lp)
    if not (m == GpuMapping.BLOCK_REDUCE or (m == GpuMapping.THREADS and thread_chain(lp) == [lp])):
        return False
    p = lp.parent_op()
    while p is not block_loop:
        if not isinstance(p, s.ForOp) or p.kind.data != "serial":
            return False
        p = p.parent_op()
    return True


def thread_owned(k: s.KernelOp, block_loop: s.ForOp) -> list[s.AllocOp]:
    """Scratch vectors of a block kernel whose element ``e`` only thread ``e % T`` touches."""
    sizes = [s.binding_bytes(b) for b in s.bindings(k)]
    out = []
    for a in nested(block_loop):
        if not isinstance(a, s.AllocOp) or register(a.result) or s.buf_type(a.result).rank != 1:
            continue
        loops = []
        for use in a.result.uses:
            o, lp = use.operation, use.operation.parent_op()
            if not (isinstance(o, s.LoadOp | s.StoreOp | s.AccumOp) and isinstance(lp, s.ForOp)
                    and list(o.idx) == [lp.iv] and _zero(lp.lo) and _strided(lp, block_loop)):
                break
            loops.append(lp)
        else:
            if all(len({chunk_width(lp, size) for lp in loops}) <= 1 for size in sizes):
                out.append(a)
    return out


def chunk_kernel(k: s.KernelOp) -> None:
    """Mark ``k``'s chunked loops and thread-owned scratch (module docstring)."""
    for op in k.body.block.ops:
        if mapping(op) not in (GpuMapping.BLOCK, GpuMapping.SINGLE):
            continue
        for lp in op.walk():
            if isinstance(lp, s.ForOp) and (mapping(lp) == GpuMapping.BLOCK_REDUCE or (
                    mapping(lp) == GpuMapping.THREADS and COLLAPSE not in lp.attributes)) and chunkable(k, lp):
                lp.attributes[CHUNK] = IntAttr(CHUNK_BYTES)
        if mapping(op) == GpuMapping.BLOCK:
            assert isinstance(op, s.ForOp)
            for a in thread_owned(k, op):
                a.attributes[OWNED] = UnitAttr()


def owned(a: s.AllocOp) -> bool:
    return OWNED in a.attributes


class _Placer:
    """Barriers of one ``block`` or ``single`` kernel: ``group`` is its top-level statements."""

    def __init__(self, k: s.KernelOp, group: list[Operation], kid: int):
        self.k, self.group, self.kid = k, group, kid
        self.owned = {o.result for g in group for o in g.walk() if isinstance(o, s.AllocOp) and owned(o)}

    def insert(self, op: Operation, after: bool) -> None:
        """A barrier before or after ``op`` (one of the kernel's own statements at the top level)."""
        b = s.BarrierOp()
        if op.parent_op() is self.k:
            b.attributes[MAPPING] = GpuMappingAttr(GpuMapping.SINGLE)
            b.attributes[KERNEL] = IntAttr(self.kid)
        block = op.parent_block()
        assert block is not None
        (block.insert_op_after if after else block.insert_op_before)(b, op)

    def around(self, op: Operation) -> None:
        self.insert(op, after=False)
        self.insert(op, after=True)

    def shares_memory(self, loop: s.ForOp) -> bool:
        """A thread loop shares memory with the block's other steps."""
        reads, writes = accessed(loop)
        reads, writes = reads - self.owned, writes - self.owned
        if any(s.buf_type(b).role.data in ("local", "temp") for b in reads | writes):
            return True
        for o in self.group:
            for x in o.walk():
                if not inside(x, loop) and isinstance(x, s.LoadOp | s.LoadBitOp | s.StoreOp | s.AccumOp) \
                        and x.buf in writes:
                    return True
        return False

    def uniform(self, ops: Iterable[Operation]) -> None:
        """Place the barriers of code every thread of the block runs with the same values."""
        for o in list(ops):
            if isinstance(o, s.ForOp):
                m = mapping(o)
                if m == GpuMapping.THREADS:
                    if self.shares_memory(o):
                        self.around(o)
                elif m != GpuMapping.BLOCK_REDUCE:
                    self.uniform(o.body.block.ops)
            elif isinstance(o, s.StoreOp | s.AccumOp) and not register(o.buf):
                self.around(o)  # thread 0 stores
            elif isinstance(o, s.AllocOp) and not register(o.result) and o.result.uses \
                    and o.zero is not None and o.zero.data and not owned(o):
                self.around(o)  # the block zero-fills
            elif isinstance(o, s.BufferMatmulOp):
                self.around(o)


def place_barriers(k: s.KernelOp) -> None:
    """Insert the barriers of ``k``'s block and single-block kernels (module docstring)."""
    groups: dict[int, list[Operation]] = {}
    for op in k.body.block.ops:
        kid = kernel_id(op)
        if kid is not None and mapping(op) in (GpuMapping.BLOCK, GpuMapping.SINGLE):
            groups.setdefault(kid, []).append(op)
    for kid, ops in groups.items():
        p = _Placer(k, ops, kid)
        if mapping(ops[0]) == GpuMapping.BLOCK:
            assert isinstance(ops[0], s.ForOp)
            body: Block = ops[0].body.block
            p.uniform(body.ops)
            body.add_op(s.BarrierOp())
        else:
            p.uniform(ops)


class ChunkGpuLoops(ModulePass):
    """Mark the chunked thread loops and the thread-owned scratch of each CUDA kernel instance."""

    name = "chunk-gpu-loops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                chunk_kernel(k)


class PlaceGpuBarriers(ModulePass):
    """Insert ``sched.barrier`` where a CUDA block's threads share memory between steps."""

    name = "place-gpu-barriers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                place_barriers(k)
