"""The CUDA target: ``__global__`` kernels plus host launchers behind the plain C ABI.

A small subclass of the C-family printer (scalar expressions, loads/stores with bf16/f16
conversions, addressing are inherited) that prints ``sched`` loops as the passes mapped them:
map-gpu outlines the steps and kernels and marks grid, thread and block-reduction loops,
plan-gpu-workspace numbers the workspace regions (opgen/lower/gpu_map.py), chunk-gpu-loops
gives thread loops their vector chunks and place-gpu-barriers places ``sched.barrier``
(opgen/lower/gpu_sync.py). A chunk's width in elements follows from the IR's chunk bytes and
the binding's element sizes (:func:`~opgen.lower.gpu_sync.chunk_width`).
First increment: simple, correct by construction, deterministic; performance comes later.

Mapping (one kernel instance = one variant x dtype binding):

* The kernel's top-level statements are split into *steps*: host checks (``sched.require`` whose
  condition only needs dims and scalars: checked on the host before anything is launched, so
  the status returns synchronously and nothing is written), zero-filled temporaries
  (``cudaMemsetAsync``), ``sched.segments`` (a stable radix sort on the device, in the runtime),
  top-level ``sched.matmul`` (a grid-stride kernel, one output element per thread), and device
  groups: maximal runs of the other statements, each one ``__global__`` kernel launched on the
  caller's stream. Kernels of one call run in stream order; every kernel first reads the call's
  status word and returns at once when an earlier kernel failed a device-side check.
* A device group that is one ``parallel`` loop whose body holds work for a whole block (an inner
  parallel or reduce loop, a matmul, a scratch buffer) maps its iterations to blocks (a
  grid-stride loop over ``blockIdx.x``). Inside a block, code runs *uniformly* (every thread
  executes it with the same values) except:
    - an inner ``parallel`` loop (perfect nests with loop-invariant bounds are collapsed into one)
      whose body needs no block cooperation is strided over ``threadIdx.x``;
    - a ``reduce`` loop accumulating into scalars is a block reduction: thread t sums iterations
      t, t + T, t + 2T, ... in order, then the T partials are combined in a fixed tree
      (``opgen_block_reduce``); T = ``OPGEN_CUDA_THREADS`` is a compile-time constant, so the
      result never depends on timing or on the grid size;
    - ``sched.matmul`` on scratch buffers is a block-cooperative tiled GEMM (fixed k order);
    - stores/accumulations into memory in uniform code are done by thread 0.
  ``serial`` loops and loops that cannot be distributed run uniformly, in order. Scalars are
  computed redundantly by every thread (identical instructions, identical values). Barriers
  (``sched.barrier``, placed by place-gpu-barriers) fence every step that shares per-block
  scratch, temporaries or memory another step reads.
* A device group that is one ``parallel`` loop with scalar work only, or a ``serial`` loop whose
  iterations are provably independent (stores indexed by the loop variable, integer counts),
  maps one iteration per thread over the whole grid. Integer accumulations at data-dependent
  indices (counts) use integer atomics — exact and order-independent; floating-point atomics are
  never emitted (the printer raises instead).
* Anything else becomes a single-block kernel running the group uniformly (always correct).
* Per-iteration ``local`` buffers with a shape live in per-block slices of the workspace; scalar
  locals are registers. The workspace layout (status word, temporaries, scratch sized by the
  grid, segment buffers) is computed by one host function used both for sizing and launching.
* A ``sched.require`` that must run on the device (index range checks) never lets a bad index be
  used: the failing thread records ``OPGEN_ERR_INDEX`` (integer atomicCAS) and skips the rest of
  its iteration; every later kernel of the call returns immediately, so the call writes nothing
  (see opgen_cuda.h). No out-of-bounds access happens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from xdsl.ir import Operation, SSAValue

from opgen import dtypes
from opgen.dsl.opdef import OpDef
from opgen.emit import cnames, cpu, render
from opgen.emit.c_family import SCALAR_FIELD, BufInfo, CPrinter
from opgen.emit.render import STATUS_C
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.gpu_map import (
    ATOMIC_TYPES,
    KernelFacts,
    kernel_id,
    mapping,
    operands_of,
    region_id,
    register,
    thread_chain,
)
from opgen.lower.gpu_map import scalar_value as _scalar_value
from opgen.lower.gpu_sync import chunk_width, owned
from opgen.lower.sched import GpuMapping

THREADS = 256  # must equal OPGEN_CUDA_THREADS in templates/cuda/opgen_cuda_rt.cuh.j2
MAX_WS = 32  # OPGEN_CUDA_MAX_WS
REDUCE_KIND = {"sum": 0, "max": 1, "min": 2}
#: storage dtypes whose values TF32 holds exactly: a tensor-core operand exact in one of them
#: (sched.matmul's ``exact``) is taken without the error-compensating high/low split
TF32_EXACT = (dtypes.BF16, dtypes.F16)


class CudaUnsupported(NotImplementedError):
    """The CUDA printer met a loop structure it cannot map safely (never silently wrong)."""


@dataclass
class WorkspaceRegion:
    """A workspace region: ``kind`` temp (count elements), scratch (count elements per block of
    kernel ``kid``), or cub (radix-sort scratch for ``n`` indices into ``rows`` rows)."""

    ctype: str
    count: str
    kind: str
    kid: int = -1
    rows: SSAValue | None = None
    size: str = ""  # the count as a saturating size_t (host code sizing the workspace)
    uses: frozenset[str] = frozenset()  # the identifiers count and size refer to (dims)

    def bytes(self, sat: bool) -> str:
        """Bytes of one copy (aligned); ``sat``: saturating, for the host's workspace sizing."""
        if sat:
            return f"opgen_align(opgen_sz_mul(sizeof({self.ctype}), {self.size or self.count}))"
        return f"opgen_align(sizeof({self.ctype}) * {self.count})"


@dataclass
class KernelGroup:
    ops: list[Operation]
    kid: int
    mode: str = "single"  # its gpu_mapping: single | block | flat | columns | matmul (map-gpu)
    loop: s.ForOp | None = None  # block / flat / columns: the loop mapped onto the grid


class CudaPrinter(CPrinter):
    """Prints one kernel instance: its ``__global__`` kernels, workspace layout and launcher."""

    restrict = "__restrict__"

    def __init__(self, kernel: s.KernelOp, binding: dict[str, dtypes.DType], fn_name: str,
                 buf_info: dict[str, BufInfo], dim_ids: dict[str, int], param_index: dict[str, int],
                 no_restrict: Iterable[str] = ()):
        super().__init__(kernel, binding, fn_name, buf_info, dim_ids, param_index)
        self.no_restrict = set(no_restrict)
        self.base_name = fn_name  # names the instance's layout/size/check functions (shared by flavours)
        self.helpers = True  # print those functions (a second flavour uses the first's)
        self.ctx = "uniform"  # uniform (whole block) | thread (one thread) | flat (grid-strided thread)
        self.owned: tuple[SSAValue, ...] = ()  # loop variables identifying this thread's iteration
        self.private: set[SSAValue] = set()  # scalar locals allocated in the current thread context
        self.regions: list[WorkspaceRegion] = []
        self.region_of: dict[SSAValue, int] = {}
        self.group: KernelGroup | None = None
        self.vec_subst: dict[tuple[SSAValue, tuple[SSAValue, ...]], str] = {}  # element -> vector lane
        self.facts = KernelFacts(kernel)
        self.top, self.order = self.facts.top, self.facts.order
        #: kernel arguments -> their identifiers in the printed code (DSL names: self.arg_of)
        self.arg_names: dict[SSAValue, str] = {a: cnames.local(n) for a, n in self.arg_of.items()}
        self.names = dict(self.arg_names)

    # ------------------------------------------------------------------ helpers
    def begin_body(self) -> None:
        """Start printing a new function body (a kernel, the layout, the checks, the launcher)."""
        self.lines, self.depth, self.mentioned = [], 1, set()

    def new_region(self, make: Callable[[], WorkspaceRegion], index: int | None) -> int:
        """Add region ``index`` of plan-gpu-workspace's layout, built by ``make``, recording the
        identifiers its sizes refer to (a body printing them declares those: ``use_region``)."""
        if index != len(self.regions):
            raise CudaUnsupported(f"{self.fn_name}: workspace region {index} met as region {len(self.regions)} "
                                  "(plan-gpu-workspace did not run, or the printer left its order)")
        outer, self.mentioned = self.mentioned, set()
        r = make()
        r.uses, self.mentioned = frozenset(self.mentioned), outer | self.mentioned
        return self.add_region(r)

    def segment_regions(self, op: s.SegmentsOp) -> tuple[int, int, int]:
        """The regions of a ``sched.segments``: sort keys, sort values, the sort's scratch."""
        def words() -> WorkspaceRegion:
            n = self.extents(op.idx)[0]
            return WorkspaceRegion("int64_t", f"(size_t){n}", "temp", size=f"opgen_sz_dim({n})")

        first = region_id(op)
        if first is None:
            raise CudaUnsupported(f"{self.fn_name}: sched.segments has no workspace region (plan-gpu-workspace)")
        rk, rv = self.new_region(words, first), self.new_region(words, first + 1)
        return rk, rv, self.new_region(lambda: WorkspaceRegion("char", self.extents(op.idx)[0], "cub", rows=op.rows),
                                       first + 2)

    def use_region(self, r: WorkspaceRegion) -> WorkspaceRegion:
        """``r``, its sizes about to be printed in the current body."""
        self.mentioned |= r.uses
        return r

    def add_region(self, r: WorkspaceRegion) -> int:
        self.regions.append(r)
        if len(self.regions) > MAX_WS:
            raise CudaUnsupported(f"{self.fn_name}: more than {MAX_WS} workspace regions")
        return len(self.regions) - 1

    def count_expr(self, buf: SSAValue) -> str:
        """Elements of an allocated buffer (``size_t``)."""
        return " * ".join(f"(size_t){d}" for d in self.extents(buf)) or "1"

    def define_ops(self, ops: Iterable[Operation]) -> None:
        for op in ops:
            self.define(op.results[0], self.scalar_expr(op))

    # ------------------------------------------------------------------ analysis
    def atomic_ok(self, op: s.AccumOp) -> bool:
        return op.kind.data == "sum" and self.storage_ctype(s.buf_type(op.buf)) in ATOMIC_TYPES

    # ------------------------------------------------------------------ vectorisation
    def elem_bytes(self, b: s.BufType) -> int:
        return s.binding_bytes(self.binding)(b)

    def vec_width(self, lp: s.ForOp) -> int:
        """Iterations per thread chunk of ``lp`` under this binding (chunk-gpu-loops' ``gpu_chunk``)."""
        return chunk_width(lp, self.elem_bytes)

    def elem_ref(self, buf: SSAValue, idx: list[SSAValue]) -> str:
        return self.vec_subst.get((buf, tuple(idx))) or super().elem_ref(buf, idx)

    def chunked_loop(self, lp: s.ForOp, v: int, lo: str, hi: str) -> None:
        """Thread t takes chunks t, t + T, ... of ``v`` consecutive iterations (in order). When
        every moving address at ``lo`` is aligned, a full chunk is one vector load/store per
        buffer; otherwise (and for the last, partial chunk) the same iterations run one by one, so
        results never depend on alignment."""
        iv = self.fresh("i")
        self.names[lp.iv] = iv
        body = list(lp.body.block.ops)
        keys: dict[tuple[SSAValue, tuple[SSAValue, ...]], tuple[str, bool, bool]] = {}
        for o in body:
            if isinstance(o, s.LoadOp | s.StoreOp | s.AccumOp) and not register(o.buf) \
                    and list(o.idx) and o.idx[-1] is lp.iv:
                key = (o.buf, tuple(o.idx))
                name, load, store = keys.get(key, (self.fresh("vec"), False, False))
                keys[key] = (name, load or not isinstance(o, s.StoreOp), store or not isinstance(o, s.LoadOp))
        ok, vb, q = self.fresh("vok"), self.fresh("vb"), self.fresh("vq")
        if self.unit_last:  # alignment of every moving address at the first iteration (uniform)
            self.names[lp.iv] = lo
            conds = []
            for (buf, idx), _ in keys.items():
                nbytes = v * self.elem_bytes(s.buf_type(buf))
                conds.append(f"((uintptr_t)&{super().elem_ref(buf, list(idx))} % {nbytes}u == 0)")
            self.line(f"const bool {ok} = {' && '.join(conds)};")
        self.line(f"for (int64_t {q} = threadIdx.x; {lo} + {q} * {v} < {hi}; {q} += OPGEN_CUDA_THREADS) {{")
        self.depth += 1
        self.line(f"const int64_t {vb} = {lo} + {q} * {v};")
        if not self.unit_last:  # strided memory: the same chunks, element by element
            self.chunk_elements(lp, iv, vb, v, hi)
            self.depth -= 1
            self.line("}")
            return
        self.line(f"if ({ok} && {vb} + {v} <= {hi}) {{")
        self.depth += 1
        self.names[lp.iv] = vb
        vecs = []
        for (buf, idx), (name, load, store) in keys.items():
            ct = self.storage_ctype(s.buf_type(buf))
            vt = f"opgen_vec<{ct}, {v}>"
            ref = super().elem_ref(buf, list(idx))
            if load:
                self.line(f"{vt} {name} = *(const {vt} *)&{ref};")
            else:
                self.line(f"{vt} {name};")
            vecs.append((buf, idx, name, store, vt, ref))
        j = self.fresh("vj")
        self.line("#pragma unroll")
        self.line(f"for (int {j} = 0; {j} < {v}; {j}++) {{")
        self.depth += 1
        self.names[lp.iv] = iv
        saved_subst, outer_lines = self.vec_subst, self.lines
        self.vec_subst = {**saved_subst, **{(b, i): f"{n}.v[{j}]" for b, i, n, _, _, _ in vecs}}
        self.lines = []
        self.walk(iter(body))
        inner, self.lines, self.vec_subst = self.lines, outer_lines, saved_subst
        if iv in self.mentioned:  # (nvcc warns about unused variables)
            self.line(f"const int64_t {iv} = {vb} + {j};")
        self.lines += inner
        self.depth -= 1
        self.line("}")
        self.names[lp.iv] = vb
        for _, _, name, store, vt, ref in vecs:
            if store:
                self.line(f"*({vt} *)&{ref} = {name};")
        self.depth -= 1
        self.line("} else {")
        self.depth += 1
        self.chunk_elements(lp, iv, vb, v, hi)
        self.depth -= 1
        self.line("}")
        self.depth -= 1
        self.line("}")

    def chunk_elements(self, lp: s.ForOp, iv: str, vb: str, v: int, hi: str) -> None:
        """The iterations of one chunk, one by one."""
        self.line(f"for (int64_t {iv} = {vb}; {iv} < {vb} + {v} && {iv} < {hi}; {iv}++) {{")
        self.depth += 1
        self.names[lp.iv] = iv
        self.walk(iter(lp.body.block.ops))
        self.depth -= 1
        self.line("}")

    # ------------------------------------------------------------------ statements
    def walk(self, ops: Iterator[Operation]) -> None:
        opened = 0
        for op in ops:
            if isinstance(op, s.RequireOp):
                self.fail(op)
                opened += 1
            else:
                self.stmt(op)
        for _ in range(opened):
            self.depth -= 1
            self.line("}")

    def fail(self, op: s.RequireOp) -> None:
        code = f"(unsigned int){STATUS_C[op.status.data]}"
        who = "if (threadIdx.x == 0) " if self.ctx == "uniform" else ""
        self.line(f"/* {op.message.data.replace('*/', '* /')}: record, skip the rest */")
        self.line(f"if (!({self.name(op.cond)})) {{ {who}opgen_dev_fail(a.err, a.sticky, {code}); }} else {{")
        self.depth += 1

    def stmt(self, op: Operation) -> None:
        if op.results and not any(r.uses for r in op.results):
            return
        if isinstance(op, s.ForOp):
            self.loop(op)
        elif isinstance(op, s.AllocOp):
            self.alloc(op)
        elif isinstance(op, s.StoreOp | s.AccumOp):
            self.update(op)
        elif isinstance(op, s.RequireOp):
            self.walk(iter([op]))
        elif isinstance(op, s.SegmentsOp):
            raise CudaUnsupported(f"{self.fn_name}: sched.segments inside a loop")
        elif isinstance(op, s.BufferMatmulOp):
            self.matmul(op)
        elif isinstance(op, s.BarrierOp):
            self.line("__syncthreads();")
        else:
            super().stmt(op)

    def update(self, op: s.StoreOp | s.AccumOp) -> None:
        b = s.buf_type(op.buf)
        target = self.lvalue(op.buf, list(op.idx))
        v = self.name(op.value)
        if isinstance(op, s.StoreOp):
            text = f"{target} = {self.store_value(b, v, ir.tensor_type(op.value).dtype)};"
        elif op.kind.data == "sum":
            text = f"{target} += {v};"
        else:
            cmp = ">" if op.kind.data == "max" else "<"
            text = f"if ({v} {cmp} {target} || {v} != {v}) {target} = {v};"
        if register(op.buf):
            if self.ctx != "uniform" and op.buf not in self.private and op.buf not in self.lanes:
                raise CudaUnsupported(f"{self.fn_name}: a thread updates a scalar shared by the block")
            self.line(text)
        elif self.ctx == "uniform":
            self.line(f"if (threadIdx.x == 0) {{ {text} }}")
        elif isinstance(op, s.StoreOp) or all(o in op.idx for o in self.owned):
            self.line(text)
        elif self.atomic_ok(op):
            t = ATOMIC_TYPES[self.storage_ctype(b)]
            self.line(f"atomicAdd(({t} *)&{target}, ({t})({v})); /* integer: exact in any order */")
        else:
            raise CudaUnsupported(f"{self.fn_name}: accumulation at an index other threads share "
                                  "(floating-point atomics are never emitted)")

    def alloc(self, op: s.AllocOp) -> None:
        b = s.buf_type(op.result)
        ct = self.storage_ctype(b)
        if b.rank == 0 and b.role.data == "local":
            n = self.fresh("l")
            self.names[op.result] = n
            self.line(f"{ct} {n} = ({ct})0;")
            if self.ctx != "uniform":
                self.private.add(op.result)
            return
        if b.role.data != "local" or self.ctx != "uniform":
            raise CudaUnsupported(f"{self.fn_name}: a {b.role.data} buffer allocated inside a thread's code")
        assert self.group is not None
        n = self.fresh("l")
        self.names[op.result] = n
        before = self.scratch_bytes(self.group.kid)
        kid = self.group.kid
        r = self.new_region(lambda: WorkspaceRegion(ct, self.count_expr(op.result), "scratch", kid,
                                                    size=self.size_count(op.sizes)), region_id(op))
        count = self.regions[r].count
        smem = "opgen_dyn_smem()" if before == "0" else f"(opgen_dyn_smem() + {before})"
        self.line(f"{ct} *{self.restrict} {n} = a.smem ? ({ct} *){smem} : ({ct} *)a.wsp[{r}] + "
                  f"(size_t)blockIdx.x * ({count});")
        if op.zero is not None and op.zero.data:
            z = self.fresh("z")
            w = 1
            if owned(op):  # (chunk-gpu-loops: only the thread whose chunks use an element touches it)
                self.line("/* thread-owned elements (gpu_thread_owned): no barrier */")
                loops = [u.operation.parent_op() for u in op.result.uses]
                w = self.vec_width(loops[0]) if loops and isinstance(loops[0], s.ForOp) else 1
            if w == 1:
                self.line(f"for (size_t {z} = threadIdx.x; {z} < {count}; {z} += OPGEN_CUDA_THREADS) "
                          f"{n}[{z}] = ({ct})0;")
            else:  # the chunks of the loops that use it: a whole chunk in one vector store when aligned
                za = self.fresh("za")
                self.line(f"const bool {za} = (uintptr_t){n} % (sizeof({ct}) * {w}) == 0;")
                self.line(f"for (size_t {z} = threadIdx.x * {w}; {z} < {count}; {z} += OPGEN_CUDA_THREADS * {w}) {{")
                self.depth += 1
                vec = f"opgen_vec<{ct}, {w}>"
                self.line(f"if ({za} && {z} + {w} <= {count}) *({vec} *)&{n}[{z}] = {vec}{{}};")
                self.line(f"else for (size_t {z}j = {z}; {z}j < {z} + {w} && {z}j < {count}; {z}j++) "
                          f"{n}[{z}j] = ({ct})0;")
                self.depth -= 1
                self.line("}")

    # ------------------------------------------------------------------ loops
    def plain_loop(self, op: s.ForOp, iv: str, lo: str, hi: str) -> None:
        self.line(f"for (int64_t {iv} = {lo}; {iv} < {hi}; {iv}++) {{")
        self.depth += 1
        self.walk(iter(op.body.block.ops))
        self.depth -= 1
        self.line("}")

    def loop(self, op: s.ForOp) -> None:
        iv = self.fresh("i")
        self.names[op.iv] = iv
        lo, hi = self.name(op.lo), self.name(op.hi)
        if self.ctx != "uniform":
            self.plain_loop(op, iv, lo, hi)  # a thread runs its loops in order
            return
        m = mapping(op)  # (decided by map-gpu)
        if m == GpuMapping.BLOCK_REDUCE:
            self.block_reduce(op, iv, lo, hi, s.scalar_accums(op))
            return
        if m == GpuMapping.THREADS:
            self.thread_loop(thread_chain(op))
            return
        self.plain_loop(op, iv, lo, hi)  # uniform: every thread walks it, cooperating inside

    def enter_thread(self, owned: tuple[SSAValue, ...]) -> tuple[str, tuple[SSAValue, ...], set[SSAValue]]:
        saved = (self.ctx, self.owned, self.private)
        self.ctx, self.owned, self.private = "thread", owned, set()
        return saved

    def leave_thread(self, saved: tuple[str, tuple[SSAValue, ...], set[SSAValue]]) -> None:
        self.ctx, self.owned, self.private = saved

    def thread_loop(self, chain: list[s.ForOp]) -> None:
        """Iterations of a (collapsed) parallel nest strided over the block's threads."""
        outer = chain[0]
        width = self.vec_width(outer) if len(chain) == 1 else 1
        if width > 1:
            saved = self.enter_thread((outer.iv,))
            self.chunked_loop(outer, width, self.name(outer.lo), self.name(outer.hi))
            self.leave_thread(saved)
        elif len(chain) == 1:
            iv = self.name(outer.iv)
            lo, hi = self.name(outer.lo), self.name(outer.hi)
            self.line(f"for (int64_t {iv} = {lo} + (int64_t)threadIdx.x; {iv} < {hi}; {iv} += OPGEN_CUDA_THREADS) {{")
            saved = self.enter_thread((outer.iv,))
            self.depth += 1
            self.walk(iter(outer.body.block.ops))
            self.depth -= 1
            self.leave_thread(saved)
            self.line("}")
        else:
            self.line("{")
            self.depth += 1
            ns = []
            for lp in chain:
                n = self.fresh("n")
                lo, hi = self.name(lp.lo), self.name(lp.hi)
                self.line(f"const int64_t {n} = {hi} > {lo} ? {hi} - {lo} : 0;")
                ns.append(n)
            f = self.fresh("f")
            self.line(f"for (int64_t {f} = threadIdx.x; {f} < {' * '.join(ns)}; {f} += OPGEN_CUDA_THREADS) {{")
            self.depth += 1
            for k, lp in enumerate(chain):
                iv = self.fresh("i")
                self.names[lp.iv] = iv
                inner = " * ".join(ns[k + 1:])
                q = f"({f} / ({inner}))" if inner else f
                q = f"{q} % {ns[k]}" if k else q
                self.line(f"const int64_t {iv} = {self.name(lp.lo)} + {q};")
            saved = self.enter_thread(tuple(lp.iv for lp in chain))
            for k, lp in enumerate(chain):
                ops = list(lp.body.block.ops)
                self.walk(iter(ops if k == len(chain) - 1 else ops[:-1]))
            self.leave_thread(saved)
            self.depth -= 1
            self.line("}")
            self.depth -= 1
            self.line("}")

    def block_reduce(self, op: s.ForOp, iv: str, lo: str, hi: str, accs: list[s.AccumOp]) -> None:
        """Thread t sums iterations t, t+T, ... in order; the T partials meet in a fixed tree."""
        self.line("{")
        self.depth += 1
        parts: dict[SSAValue, tuple[str, str, str]] = {}
        for a in accs:
            if a.buf in parts:
                continue
            ct = self.storage_ctype(s.buf_type(a.buf))
            pn = self.fresh("part")
            acc = self.name(a.buf)
            init = f"threadIdx.x == 0 ? {acc} : ({ct})0" if a.kind.data == "sum" else acc
            self.line(f"{ct} {pn} = {init};")
            parts[a.buf] = (pn, ct, a.kind.data)
        saved_lanes = dict(self.lanes)
        for buf, (pn, _, _) in parts.items():
            self.lanes[buf] = pn
        saved = self.enter_thread((op.iv,))
        width = self.vec_width(op)
        if width > 1:
            self.chunked_loop(op, width, lo, hi)
        else:
            self.line(f"for (int64_t {iv} = {lo} + (int64_t)threadIdx.x; {iv} < {hi}; {iv} += OPGEN_CUDA_THREADS) {{")
            self.depth += 1
            self.walk(iter(op.body.block.ops))
            self.depth -= 1
            self.line("}")
        self.leave_thread(saved)
        self.lanes = saved_lanes
        sets: dict[tuple[str, str], list[tuple[SSAValue, str]]] = {}
        for buf, (pn, ct, kind) in parts.items():
            sets.setdefault((kind, ct), []).append((buf, pn))
        for (kind, ct), members in sets.items():
            if len(members) == 1:
                (buf, pn), = members
                self.line(f"{self.name(buf)} = opgen_block_reduce<{REDUCE_KIND[kind]}, {ct}>({pn});")
                continue
            arr = self.fresh("red")  # several accumulators of one kind: one set of barriers
            self.line(f"{ct} {arr}[{len(members)}] = {{{', '.join(pn for _, pn in members)}}};")
            self.line(f"opgen_block_reduce_n<{REDUCE_KIND[kind]}, {ct}, {len(members)}>({arr});")
            for i, (buf, _) in enumerate(members):
                self.line(f"{self.name(buf)} = {arr}[{i}];")
        self.depth -= 1
        self.line("}")

    # ------------------------------------------------------------------ matmul
    def matmul(self, op: s.BufferMatmulOp) -> None:
        if op.c_row is not None:  # (the CUDA pipeline's chains own their rows: no partial sums)
            raise NotImplementedError("CUDA printer: sched.matmul into rows of a buffer (c_row)")
        bufs = [s.buf_type(x) for x in (op.a, op.b, op.c)]
        cts = {self.storage_ctype(t) for t in bufs}
        ta, tb = (t.data for t in op.trans.data)
        m, n, k = self.name(op.m), self.name(op.n), self.name(op.k)
        if self.ctx == "uniform" and len(cts) == 1 and cts <= {"float", "double"} \
                and all(t.role.data in ("local", "temp") for t in bufs):
            def strides(x: SSAValue, trans: int) -> tuple[str, str]:
                ld = self.extents(x)[1]
                return ("1", ld) if trans else (ld, "1")

            ars, acs = strides(op.a, ta)
            brs, bcs = strides(op.b, tb)
            ct = cts.pop()
            # f32: tensor cores (TF32); an operand not exact in a dtype TF32 keeps (exact-operands) split in two
            exact = [e.data for e in op.exact.data] if op.exact is not None else ["", ""]
            split = [not (e and self.dtype(e) in TF32_EXACT) for e in exact]
            fn = (f"opgen_block_gemm_tc<{str(split[0]).lower()}, {str(split[1]).lower()}>") if ct == "float" \
                else f"opgen_block_gemm<{ct}>"
            self.line(f"{fn}({m}, {n}, {k}, {self.name(op.a)}, {ars}, {acs}, "
                      f"{self.name(op.b)}, {brs}, {bcs}, {self.name(op.c)}, {self.extents(op.c)[1]}, "
                      f"{op.accumulate.data});")
            return
        self.matmul_elements(op, "block" if self.ctx == "uniform" else "seq")

    def matmul_elements(self, op: s.BufferMatmulOp, mode: str) -> None:
        """One output element per iteration, k summed in order: ``seq`` (this thread does all),
        ``block`` (strided over the block's threads) or ``grid`` (over the whole grid)."""
        bufs = [s.buf_type(x) for x in (op.a, op.b, op.c)]
        ta, tb = (t.data for t in op.trans.data)
        m, n, k = self.name(op.m), self.name(op.n), self.name(op.k)
        i, j, kk, acc, f = (self.fresh(p) for p in ("i", "j", "k", "acc", "f"))
        ct = self.ctype(bufs[2].dtype)
        if mode == "seq":
            self.line(f"for (int64_t {f} = 0; {f} < {m} * {n}; {f}++) {{")
        elif mode == "block":
            self.line(f"for (int64_t {f} = threadIdx.x; {f} < {m} * {n}; {f} += OPGEN_CUDA_THREADS) {{")
        else:
            self.line(f"for (int64_t {f} = (int64_t)blockIdx.x * OPGEN_CUDA_THREADS + threadIdx.x; {f} < {m} * {n}; "
                      f"{f} += (int64_t)gridDim.x * OPGEN_CUDA_THREADS) {{")
        self.line(f"    const int64_t {i} = {f} / {n}, {j} = {f} % {n};")
        init = self._elem(op.c, (i, j)) if op.accumulate.data else f"({ct})0"
        self.line(f"    {ct} {acc} = {init};")
        ea = self._elem(op.a, (kk, i) if ta else (i, kk))
        eb = self._elem(op.b, (j, kk) if tb else (kk, j))
        self.line(f"    for (int64_t {kk} = 0; {kk} < {k}; {kk}++) {acc} += ({ct}){ea} * ({ct}){eb};")
        self.line(f"    {self.name(op.c)}[{self._raw_offset(op.c, (i, j))}] = "
                  f"{self.store_value(bufs[2], acc, bufs[2].dtype)};")
        self.line("}")

    # ------------------------------------------------------------------ instance
    def prologue(self) -> list[str]:
        """Kernel-side bindings of the arguments, dims and temporaries the body just printed
        uses (``mention``: nvcc rejects unused ones under -Werror, even cast to void)."""
        decls: list[tuple[str, str]] = []
        for a, n in self.arg_of.items():
            t = a.type
            cn = self.arg_names[a]
            if s.unread(a):
                continue
            if isinstance(t, s.BufType):
                ct = self.storage_ctype(t)
                const = "const " if t.role.data == "in" else ""
                info = self.buf_info[n]
                k = info.param_index
                rs = "" if n in self.no_restrict else f"{self.restrict} "  # may-alias pairs: no restrict
                decls.append((cn, f"{const}{ct} *{rs}{cn} = ({const}{ct} *)a.bufs[{k}].data;"))
                for i in range(t.rank):
                    if not self.unit_axis(n, i, t.rank):
                        st = self.stride_name(n, i)
                        decls.append((st, f"const int64_t {st} = a.bufs[{k}].st[{i}];"))
                if info.batch:
                    ro = self.rows_name(n)
                    decls.append((ro, f"const int64_t *{ro} = a.bufs[{k}].ro;"))
            else:
                field = SCALAR_FIELD[ir.tensor_type(a).dtype]
                decls.append((cn, f"const {self.ctype(ir.tensor_type(a).dtype)} {cn} = "
                                  f"a.sc[{self.param_index[n]}].{field};"))
        for d, i in self.dim_ids.items():
            decls.append((f"d_{d}", f"const int64_t d_{d} = a.dims[{i}];"))
        for v, r in self.region_of.items():
            reg = self.regions[r]
            if reg.kind == "temp":
                n = self.names_temp[v]
                decls.append((n, f"{reg.ctype} *{self.restrict} {n} = ({reg.ctype} *)a.wsp[{r}];"))
        return [d for n, d in decls if n in self.mentioned]

    def host_prologue(self, scalars: bool) -> list[str]:
        """Host-side bindings of the scalars (``scalars``) and dims the body just printed uses."""
        decls: list[tuple[str, str]] = []
        if scalars:
            for a, n in self.arg_of.items():
                if isinstance(a.type, ir.TensorType):
                    cn = self.arg_names[a]
                    field = SCALAR_FIELD[ir.tensor_type(a).dtype]
                    decls.append((cn, f"const {self.ctype(ir.tensor_type(a).dtype)} {cn} = "
                                      f"sc[{self.param_index[n]}].{field};"))
        for d, i in self.dim_ids.items():
            decls.append((f"d_{d}", f"const int64_t d_{d} = dims[{i}];"))
        return [d for n, d in decls if n in self.mentioned]

    def print_group(self, g: KernelGroup) -> str:
        """The ``__global__`` kernel of one device group."""
        self.group = g
        self.names = dict(self.arg_names)
        for v, n in self.names_temp.items():
            self.names[v] = n
        self.begin_body()
        self.ctx, self.owned, self.private = "uniform", (), set()
        need = self.facts.needed(operands_of(g.ops))
        first = min(self.order[o] for o in g.ops)
        last = max(self.order[o] for o in g.ops)
        before = [o for o in need if self.order[o] < first]
        self.define_ops(before)
        if g.mode == "block":
            lp = g.loop
            assert lp is not None
            iv = self.fresh("i")
            self.names[lp.iv] = iv
            lo, hi = self.name(lp.lo), self.name(lp.hi)
            self.line(f"for (int64_t {iv} = {lo} + (int64_t)blockIdx.x; {iv} < {hi}; {iv} += (int64_t)gridDim.x) {{")
            self.depth += 1
            self.walk(iter(lp.body.block.ops))
            self.depth -= 1
            self.line("}")
        elif g.mode == "flat":
            lp = g.loop
            assert lp is not None
            iv = self.fresh("i")
            self.names[lp.iv] = iv
            lo, hi = self.name(lp.lo), self.name(lp.hi)
            self.line(f"for (int64_t {iv} = {lo} + (int64_t)blockIdx.x * OPGEN_CUDA_THREADS + (int64_t)threadIdx.x; "
                      f"{iv} < {hi}; {iv} += (int64_t)gridDim.x * OPGEN_CUDA_THREADS) {{")
            saved = self.enter_thread((lp.iv,))
            self.ctx = "flat"
            self.depth += 1
            self.walk(iter(lp.body.block.ops))
            self.depth -= 1
            self.leave_thread(saved)
            self.line("}")
        elif g.mode == "columns":
            assert g.loop is not None
            self.column_loop(g.loop)
        else:
            members = set(g.ops)
            needed_inside = {o for o in need if self.order[o] > first}
            self.walk(o for o in self.top[first:last + 1] if o in members or o in needed_inside)
        body = self.lines
        return render.render("cuda/kernel.cu.j2", kernel=f"{self.fn_name}_k{g.kid}", note=True,
                             prologue=self.prologue(), body=body)

    def column_loop(self, lp: s.ForOp) -> None:
        """A ``columns`` kernel (map-gpu): lane l of each block owns iteration base + l; the
        ``slices`` loop is split over the warps (warp w: its iterations w, w + W, ...), the W
        partials are combined in warp order by warp 0 (opgen_column_combine), which runs the rest
        of the body."""
        alloc, inner, *rest = list(lp.body.block.ops)
        assert isinstance(alloc, s.AllocOp) and isinstance(inner, s.ForOp)
        acc = next(o for o in inner.body.block.ops if isinstance(o, s.AccumOp))
        iv, base = self.fresh("i"), self.fresh("b")
        self.names[lp.iv] = iv
        lo, hi = self.name(lp.lo), self.name(lp.hi)
        self.line(f"for (int64_t {base} = {lo} + (int64_t)blockIdx.x * OPGEN_CUDA_COLUMNS; {base} < {hi}; "
                  f"{base} += (int64_t)gridDim.x * OPGEN_CUDA_COLUMNS) {{")
        self.depth += 1
        self.line(f"const int64_t {iv} = {base} + (int64_t)(threadIdx.x % OPGEN_CUDA_COLUMNS);")
        saved = self.enter_thread((lp.iv,))
        self.ctx = "flat"
        self.walk(iter([alloc]))
        jv = self.fresh("i")
        self.names[inner.iv] = jv
        self.line(f"if ({iv} < {hi}) {{")
        self.depth += 1
        self.line("#pragma unroll 4")  # (the loads of 4 iterations in flight before their sums)
        self.line(f"for (int64_t {jv} = {self.name(inner.lo)} + (int64_t)(threadIdx.x / OPGEN_CUDA_COLUMNS); "
                  f"{jv} < {self.name(inner.hi)}; {jv} += OPGEN_CUDA_THREADS / OPGEN_CUDA_COLUMNS) {{")
        self.depth += 1
        self.walk(iter(inner.body.block.ops))
        self.depth -= 1
        self.line("}")
        self.depth -= 1
        self.line("}")
        ct = self.storage_ctype(s.buf_type(alloc.result))
        n = self.name(alloc.result)
        self.line(f"{n} = opgen_column_combine<{REDUCE_KIND[acc.kind.data]}, {ct}>({n});")
        self.line(f"if (threadIdx.x < OPGEN_CUDA_COLUMNS && {iv} < {hi}) {{")
        self.depth += 1
        self.walk(iter(rest))
        self.depth -= 1
        self.line("}")
        self.leave_thread(saved)
        self.depth -= 1
        self.line("}")

    def smem_fits(self, kid: int) -> str:
        """Host condition: kernel ``kid``'s per-block scratch goes to dynamic shared memory."""
        return f"({self.scratch_bytes(kid, sat=True)} <= OPGEN_CUDA_SMEM_MAX)"

    def scratch_bytes(self, kid: int, sat: bool = False) -> str:
        """Per-block scratch bytes of kernel ``kid`` (``sat``: saturating, for host sizing)."""
        terms = [self.use_region(r).bytes(sat) for r in self.regions if r.kind == "scratch" and r.kid == kid]
        if not sat:
            return " + ".join(terms) or "0"
        out = terms[0] if terms else "0"
        for t in terms[1:]:
            out = f"opgen_sz_add({out}, {t})"
        return out

    def print_instance(self) -> str:
        """Kernels, workspace layout, size function and launcher of this instance."""
        # the steps and kernels map-gpu decided (opgen/lower/gpu_map.py), in program order
        steps: list[tuple[str, object]] = []
        groups: list[KernelGroup] = []
        self.names_temp: dict[SSAValue, str] = {}
        for op in self.top:
            m = mapping(op)
            if m is None:
                if not _scalar_value(op):
                    raise CudaUnsupported(f"{self.fn_name}: {op.name} not mapped (map-gpu did not run)")
                continue
            if m == GpuMapping.HOST:
                if isinstance(op, s.AllocOp):
                    b = s.buf_type(op.result)
                    n = self.fresh("t")
                    self.names_temp[op.result] = n
                    self.region_of[op.result] = self.new_region(lambda b=b, a=op: WorkspaceRegion(  # type: ignore[misc]
                        self.storage_ctype(b), self.count_expr(a.result), "temp", size=self.size_count(a.sizes)),
                        region_id(op))
                    if op.zero is not None and op.zero.data:
                        steps.append(("memset", op))
                else:
                    steps.append(("check" if isinstance(op, s.RequireOp) else "segments", op))
                continue
            kid = kernel_id(op)
            assert kid is not None
            if kid == len(groups):
                loop = op if m in (GpuMapping.BLOCK, GpuMapping.FLAT, GpuMapping.COLUMNS) else None
                groups.append(KernelGroup([], kid, m, loop))  # type: ignore[arg-type]
                steps.append(("group", groups[-1]))
            groups[kid].ops.append(op)
        # segments scratch regions
        seg_regions: dict[Operation, tuple[int, int, int]] = {}
        for kind, x in steps:
            if kind == "segments":
                op = x
                assert isinstance(op, s.SegmentsOp)
                for b in (op.idx, op.seg, op.order):
                    if b not in self.region_of:
                        raise CudaUnsupported(f"{self.fn_name}: segments on a non-temporary buffer")
                if not self.facts.host_ok(op.rows, scalars=False):
                    raise CudaUnsupported(f"{self.fn_name}: segment rows must follow from dims")
                seg_regions[op] = self.segment_regions(op)
        # kernels (their scratch regions are registered while printing)
        kernels = []
        for g in groups:
            if g.mode == "matmul":
                kernels.append(self.print_matmul_kernel(g))
            else:
                kernels.append(self.print_group(g))
        # layout: status word, then every region in order
        self.names = dict(self.arg_names)
        self.begin_body()
        roots: list[SSAValue] = []
        for g in groups:
            if g.mode == "block" and any(r.kind == "scratch" and r.kid == g.kid for r in self.regions):
                assert g.loop is not None
                if self.facts.host_ok(g.loop.lo, False) and self.facts.host_ok(g.loop.hi, False):
                    roots += [g.loop.lo, g.loop.hi]
        roots += [r.rows for r in self.regions if r.rows is not None]
        self.define_ops(self.facts.needed(roots))
        grids: list[dict[str, object]] = []  # per kernel with scratch: its blocks (0: shared memory)
        grid_of: dict[int, str] = {}
        for g in groups:
            if not any(r.kind == "scratch" and r.kid == g.kid for r in self.regions):
                continue
            grid_of[g.kid] = f"g{g.kid}"
            grid = {"var": grid_of[g.kid], "smem": self.smem_fits(g.kid), "n": None, "bytes": None}
            if g.mode == "block":
                assert g.loop is not None
                known = self.facts.host_ok(g.loop.lo, False) and self.facts.host_ok(g.loop.hi, False)
                grid["n"] = f"{self.name(g.loop.hi)} - {self.name(g.loop.lo)}" if known else "INT64_MAX"
                grid["bytes"] = self.scratch_bytes(g.kid, sat=True)
            grids.append(grid)
        lasting = []  # temporaries and segment buffers: live all call long
        for i, r in enumerate(self.regions):
            if r.kind == "temp":
                lasting.append({"index": i, "size": self.use_region(r).bytes(sat=True)})
            elif r.kind != "scratch":
                assert r.rows is not None
                lasting.append({"index": i, "size": f"opgen_align(opgen_cuda_segments_tmp({self.use_region(r).count}, "
                                                     f"{self.name(r.rows)}))"})
        # per-block scratch: kernels of a call run one after another on its stream, so each
        # kernel's scratch starts at the same place (the arena is the largest of them)
        arenas = [{"grid": grid_of[kid], "regions": [
            {"index": i, "ctype": r.ctype, "count": self.use_region(r).size or r.count}
            for i, r in enumerate(self.regions) if r.kind == "scratch" and r.kid == kid]} for kid in sorted(grid_of)]
        layout = {"scalars": self.lines, "grids": grids, "lasting": lasting, "arenas": arenas}
        layout_prologue = self.host_prologue(False)
        # the leading checks form the entry's `pre` function (run by the binder before anything
        # else, also when only the workspace size is asked); the launcher does not repeat them
        lead = 0
        while lead < len(steps) and steps[lead][0] == "check":
            lead += 1
        pre_lines = self.host_checks([x for _, x in steps[:lead]])  # type: ignore[misc]
        pre_prologue = self.host_prologue(True)
        steps = steps[lead:]
        # launcher
        self.names = dict(self.arg_names)
        self.begin_body()
        host_roots: list[SSAValue] = []
        for kind, x in steps:
            if kind == "check":
                host_roots.append(x.cond)  # type: ignore[attr-defined]
            elif kind == "segments":
                host_roots.append(x.rows)  # type: ignore[attr-defined]
            elif kind == "group":
                g = x
                assert isinstance(g, KernelGroup)
                if g.loop is not None:
                    host_roots += [g.loop.lo, g.loop.hi]
                if g.mode == "matmul":
                    mm = g.ops[0]
                    assert isinstance(mm, s.BufferMatmulOp)
                    host_roots += [mm.m, mm.n]
        for v in host_roots:
            if not self.facts.host_ok(v):
                raise CudaUnsupported(f"{self.fn_name}: a launch parameter is not known on the host")
        self.define_ops(self.facts.needed(host_roots))
        launches = [self.launch_step(kind, x, seg_regions) for kind, x in steps]
        host = render.render("cuda/instance_host.cu.j2", helpers=self.helpers, base=self.base_name, fn=self.fn_name,
                             layout_prologue=layout_prologue, layout=layout, pre_prologue=pre_prologue,
                             pre=pre_lines, nparams=len(self.param_index), ndims=len(self.dim_ids),
                             launcher_prologue=self.host_prologue(True), launcher_scalars=self.lines,
                             steps=launches)
        return "\n".join([*kernels, host.removesuffix("\n")]) + "\n"

    def launch_step(self, kind: str, x: object,
                    seg_regions: dict[Operation, tuple[int, int, int]]) -> dict[str, object]:
        """What the launcher template needs for one host step: its kind and its expressions."""
        if kind == "check":
            assert isinstance(x, s.RequireOp)
            return {"kind": kind, "cond": self.name(x.cond), "status": STATUS_C[x.status.data],
                    "message": f"{self.k.sym_name.data}: {x.message.data}".replace('"', "'")}
        if kind == "memset":
            assert isinstance(x, s.AllocOp)
            r = self.region_of[x.result]
            return {"kind": kind, "region": r, "ctype": self.regions[r].ctype,
                    "count": self.use_region(self.regions[r]).count}
        if kind == "segments":
            assert isinstance(x, s.SegmentsOp)
            rk, rv, rt = seg_regions[x]
            ri, rs, ro = (self.region_of[b] for b in (x.idx, x.seg, x.order))
            return {"kind": kind, "n": self.extents(x.idx)[0], "rows": self.name(x.rows),
                    "idx": ri, "seg": rs, "order": ro, "sort_keys": rk, "sort_values": rv, "tmp": rt}
        g = x
        assert isinstance(g, KernelGroup)
        step: dict[str, object] = {"kind": g.mode, "kernel": f"{self.fn_name}_k{g.kid}", "smem": None, "bytes": "0"}
        if g.mode in ("single", "block"):
            step["bytes"] = self.scratch_bytes(g.kid)
            if step["bytes"] != "0":
                step["smem"] = self.smem_fits(g.kid)
        if g.mode != "single":
            step["grid"] = self.fresh("grid")
            if g.mode == "matmul":
                mm = g.ops[0]
                assert isinstance(mm, s.BufferMatmulOp)
                step["n"] = f"{self.name(mm.m)} * {self.name(mm.n)}"
            else:
                assert g.loop is not None
                step["n"] = f"{self.name(g.loop.hi)} - {self.name(g.loop.lo)}"
        return step

    def host_checks(self, checks: list[s.RequireOp]) -> dict[str, list]:
        """Host code returning the status of the first failing check: the scalar statements the
        conditions need and the checks (template steps)."""
        self.names = dict(self.arg_names)
        self.begin_body()
        self.define_ops(self.facts.needed([op.cond for op in checks]))
        return {"scalars": self.lines, "checks": [self.launch_step("check", op, {}) for op in checks]}

    def print_matmul_kernel(self, g: KernelGroup) -> str:
        self.group = g
        self.names = dict(self.arg_names)
        for v, n in self.names_temp.items():
            self.names[v] = n
        self.begin_body()
        self.ctx, self.owned, self.private = "flat", (), set()
        op = g.ops[0]
        assert isinstance(op, s.BufferMatmulOp)
        self.define_ops(self.facts.needed(op.operands))
        self.matmul_elements(op, "grid")
        self.ctx = "uniform"
        return render.render("cuda/kernel.cu.j2", kernel=f"{self.fn_name}_k{g.kid}", note=False,
                             prologue=self.prologue(), body=self.lines)


# ---------------------------------------------------------------------- translation unit
def op_source(o: OpDef, fuse: bool = True) -> str:
    """The CUDA translation unit of one op: kernels and launchers of every variant x dtype
    binding, the op's signature table, and its plain C entry points."""
    _, dim_ids, _, pidx, info = cpu.op_layout(o)
    aliased = {n for pair in o.may_alias for n in pair}
    parts = [f"/* {o.name}: CUDA kernels generated by opgen from {o.where}. Do not edit. */",
             '#include "opgen_cuda_rt.cuh"', ""]
    inst: dict[tuple[str, ...], list[cpu.Instance]] = {}
    ks = cpu.kernels(o, "cuda", fuse)
    for present, k in ks.items():
        kinfo = cpu.kernel_buf_info(k, info)
        for b in cpu.bindings(k):
            fn = cpu.instance_name(o, present, b)
            pr = CudaPrinter(k, b, fn, kinfo, dim_ids, pidx, no_restrict=aliased)
            flavours = cpu.stride_flavours(k, pr.unit_last_check())
            if flavours != "both":
                pr.unit_last = flavours == "unit"
                parts.append(pr.print_instance())
            else:  # memory-bound: a unit-stride flavour (contiguous, vectorisable) chosen at run time
                pr.fn_name = fn + "_g"
                parts.append(pr.print_instance())
                fast = CudaPrinter(k, b, fn + "_u", kinfo, dim_ids, pidx, no_restrict=aliased)
                fast.unit_last, fast.base_name, fast.helpers = True, fn, False
                parts.append(fast.print_instance())
                parts.append(render.render(
                    "cpu/flavour_dispatch.c.j2", fn=fn, check=fast.unit_last_check(),
                    why="every caller buffer's last dim contiguous: the unit-stride, vectorised flavour",
                    extra_params=", cudaStream_t stream", extra_args=", stream"))
            inst.setdefault(present, []).append(cpu.Instance(present, b, fn))
    parts += cpu.op_tables(o, inst, {p: k.converted for p, k in ks.items()})
    parts += cpu.entry_points(o, prefix="opgen_cuda_", run="opgen_cuda_run", extra_params=", void *stream",
                              extra_args=", stream", decl='extern "C" OPGEN_API ')
    return "\n".join(parts) + "\n"
