"""lower-to-std: the CPU loop level (``sched`` after map-cpu) as upstream MLIR's own dialects.

Each ``sched.kernel`` becomes one ``func.func`` per dtype binding (``<kernel>_<dtype>...``) over
``func``, ``scf``, ``memref``, ``arith`` and ``math``, which ``mlir-opt`` and MLIR's Python bindings
parse, verify, lower and run (tests/test_mlir.py). The function:

- takes each tensor parameter the kernel reads or writes as a strided memref of its storage type
  (``memref<?x?xbf16, strided<[?, ?], offset: ?>>``; ``bool`` and ``u8`` as ``i8``; a batched
  parameter with its batch dims flattened into the first), attributes and sizes by value (``f32``,
  ``i64``, ``i1``), and, last, an ``i64`` per dim no tensor parameter carries;
- checks that the memrefs agree on every dim (and a size parameter with its dim), then runs the
  kernel, and returns the C ABI's status (``0``, or ``OPGEN_ERR_SHAPE`` / ``_INDEX`` / ``_PARAM``
  when a check fails: then no output is written);
- computes exactly as the CPU library does where the math is the same: values in the compute
  type, rounding once per store, reductions split into map-cpu's lanes and combined in the same
  order, matmuls in :data:`~opgen.lower.sched.GEMM_KC` blocks of fused multiply-adds. Transcendental
  functions are ``math`` ops (the C library uses its own polynomials: results differ in the last
  bits). Parallel loops are ``scf.parallel``.

A segment table (``sched.segments``) is a counting sort into ``rows + 1`` words here (the C runtime
chooses between layouts); ``sched.segment_start`` reads it accordingly. Per-iteration scratch is
``memref.alloca`` inside ``memref.alloca_scope``; workspace buffers are ``memref.alloc``/``dealloc``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, math, memref, scf
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    ArrayAttr,
    DictionaryAttr,
    Float32Type,
    MemRefType,
    ModuleOp,
    StridedLayoutAttr,
    StringAttr,
    UnitAttr,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.dtypes import DType
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import cpu_mapping, lanes, loaded_bytes, paired
from opgen.lower.mlir_scalars import INDEX, Scalars, scalar_type, storage_type
from opgen.lower.sched import GEMM_KC, CpuMapping, bindings

#: the function attribute naming its parameters in order (``dim:<D>`` for a trailing dim argument)
PARAMS_ATTR = "opgen.params"
#: the variant (the kernel's symbol), the dtype binding ``{var: dtype}``, and the parameters the
#: C binder converts to another dtype first (``{name: dtype}``: this function takes them converted)
VARIANT_ATTR, DTYPES_ATTR, CONVERTED_ATTR = "opgen.variant", "opgen.dtypes", "opgen.converted"
#: the tensor level's result names (``status``, then the outputs)
RESULTS_ATTR = "opgen.results"


def instance(variant: str, binding: dict[str, DType], types: Sequence[Attribute], results: Sequence[Attribute],
             body: Block, params: Sequence[str], extra: Sequence[str], converted: DictionaryAttr | None) -> func.FuncOp:
    """The ``func.func`` of one variant and dtype binding, ``<variant>_<dtype>...`` (as the C
    library's instances), with the attributes callers read: parameter names (``dim:<D>`` for the
    trailing dim arguments), variant, binding, converted parameters, the C interface."""
    name = variant + "".join(f"_{d.name}" for d in binding.values())
    fn = func.FuncOp(name, func.FunctionType.from_lists(list(types), list(results)), Region(body))
    fn.attributes["llvm.emit_c_interface"] = UnitAttr()
    fn.attributes[PARAMS_ATTR] = ArrayAttr([StringAttr(n) for n in params] + [StringAttr(f"dim:{d}") for d in extra])
    fn.attributes[VARIANT_ATTR] = StringAttr(variant)
    fn.attributes[DTYPES_ATTR] = DictionaryAttr({v: StringAttr(d.name) for v, d in binding.items()})
    if converted:
        fn.attributes[CONVERTED_ATTR] = converted
    return fn



@dataclass(frozen=True)
class LowerToStd(ModulePass):
    """Replace every ``sched.kernel`` by its ``func.func`` instances (see the module doc)."""

    name = "lower-to-std"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in list(op.body.block.ops):
            if not isinstance(k, s.KernelOp):
                continue
            for b in bindings(k):
                op.body.block.insert_op_before(_Kernel(k, b).build(), k)
            op.body.block.erase_op(k)


class _Kernel(Scalars):
    """Builds one instance: ``values`` maps the kernel's scalars to MLIR values, ``bufs`` its
    buffers to memrefs; ``lanes`` the accumulators of the lane loop being built to (lanes, l)."""

    def __init__(self, k: s.KernelOp, binding: dict[str, DType]):
        super().__init__(binding)
        self.k = k
        self.values: dict[SSAValue, SSAValue] = {}
        self.bufs: dict[SSAValue, SSAValue] = {}
        self.lanes: dict[SSAValue, tuple[SSAValue, list[SSAValue]]] = {}
        self.status: SSAValue | None = None
        self.fallible = {op for r in k.walk() if isinstance(r, s.RequireOp) for op in _ancestors(r, k)}

    # ------------------------------------------------------------------ the function
    def build(self) -> func.FuncOp:
        k = self.k
        names = [a.data for a in k.arg_names.data]
        sizes = {n: v.data for n, v in k.sizes.data.items()} if k.sizes else {}  # type: ignore[attr-defined]
        params: list[tuple[SSAValue, Attribute, str]] = []
        for n, a in zip(names, k.body.block.args, strict=True):
            t = a.type
            if isinstance(t, s.BufType) and s.unread(a):
                continue  # (a tensor giving sizes only: its dims come from another or a dim argument)
            if isinstance(t, s.BufType):
                layout = StridedLayoutAttr([None] * t.rank, None)
                mt = MemRefType(storage_type(self.dtype(t.dtype), True), [DYNAMIC_INDEX] * t.rank, layout)
                params.append((a, mt, n))
            else:
                params.append((a, scalar_type(self.dtype(ir.tensor_type(a).dtype)), n))
        carried = {d for a, _, _ in params if isinstance(a.type, s.BufType) for d in a.type.shape if d.isidentifier()}
        size_dims = set(sizes.values())
        wanted = sorted({op.dim.data for op in k.walk() if isinstance(op, ir.DimOp)} | size_dims)
        extra = [d for d in wanted if d not in carried and d not in size_dims]
        types = [t for _, t, _ in params] + [i64] * len(extra)
        self.block = Block(arg_types=types)
        fn_args = list(self.block.args)
        for (a, _, n), v in zip(params, fn_args, strict=False):
            v.name_hint = n
            (self.bufs if isinstance(a.type, s.BufType) else self.values)[a] = v
        for d, v in zip(extra, fn_args[len(params):], strict=True):
            v.name_hint = f"dim_{d}"
            self.dims[d] = v
        entry = self.block
        status = self.add(memref.AllocaOp.get(i32, shape=[]))
        self.status = status
        self.add(memref.StoreOp.get(self.const(0, i32), status, []))
        ok = self.agree([(self.bufs[a], a.type.shape) for a, _, _ in params if isinstance(a.type, s.BufType)],
                        memref.DimOp, [(self.values[a], sizes[n]) for a, _, n in params if n in sizes])
        self.require(ok, "shape")
        with self.nested(self.guarded()) as guard:
            self.convert(list(k.body.block.ops))
            guard.close(scf.YieldOp())
        self.block = entry
        self.add(func.ReturnOp(self.add(memref.LoadOp.get(status, []))))
        return instance(k.sym_name.data, self.binding, types, [i32], entry, [n for _, _, n in params], extra,
                        k.boundary_casts)

    # ------------------------------------------------------------------ checks
    def require(self, cond: SSAValue, status: str) -> None:
        """Record ``status`` unless ``cond`` holds or an earlier check failed."""
        assert self.status is not None
        cur = self.add(memref.LoadOp.get(self.status, []))
        self.add(memref.StoreOp.get(self.next_status(cur, cond, status), self.status, []))

    def guarded(self) -> Block:
        """An ``scf.if`` running what follows only while no check has failed: its block."""
        assert self.status is not None
        cur = self.add(memref.LoadOp.get(self.status, []))
        clean = self.add(arith.CmpiOp(cur, self.const(0, i32), "eq"))
        body = Block()
        self.add(scf.IfOp(clean, [], Region(body)))
        return body

    # ------------------------------------------------------------------ statements
    def convert(self, ops: Sequence[Operation]) -> None:
        """Convert ``ops`` into the current block; after an op that may fail a check, the rest
        runs under :meth:`guarded`. Workspace buffers allocated here are freed at the end."""
        temps: list[SSAValue] = []
        for i, op in enumerate(ops):
            self.stmt(op, temps)
            if op in self.fallible and i + 1 < len(ops):
                with self.nested(self.guarded()) as inner:
                    self.convert(ops[i + 1:])
                    inner.close(scf.YieldOp())
                break
        for t in reversed(temps):
            self.add(memref.DeallocOp.get(t))

    def stmt(self, op: Operation, temps: list[SSAValue]) -> None:
        if isinstance(op, s.ForOp):
            self.loop(op)
        elif isinstance(op, s.AllocOp):
            self.alloc(op, temps)
        elif isinstance(op, s.StoreOp):
            b = s.buf_type(op.buf)
            ref, idx = self.ref(op.buf, list(op.idx))
            self.add(memref.StoreOp.get(self.to_storage(self.values[op.value], ir.tensor_type(op.value).dtype, b),
                                        ref, idx))
        elif isinstance(op, s.AccumOp):
            self.accum(op)
        elif isinstance(op, s.RequireOp):
            self.require(self.values[op.cond], op.status.data)
        elif isinstance(op, s.SegmentsOp):
            self.segments(op)
        elif isinstance(op, s.BufferMatmulOp):
            self.matmul(op)
        elif isinstance(op, s.PrefetchOp):
            pass  # a hint (map-cpu's streams): upstream's memref.prefetch names an element in bounds, not one ahead
        elif isinstance(op, ir.DimOp):
            self.values[op.result] = self.dims[op.dim.data]
        elif len(op.results) == 1:
            self.values[op.results[0]] = self.scalar(op)
        else:
            raise NotImplementedError(f"lower-to-std: no rule for {op.name}")

    def alloc(self, op: s.AllocOp, temps: list[SSAValue]) -> None:
        b = s.buf_type(op.result)
        et = storage_type(self.dtype(b.dtype), False)
        sizes = [self.index(self.values[v]) for v in op.sizes]
        if b.role.data == "temp":
            ref = self.add(memref.AllocOp.get(et, shape=[DYNAMIC_INDEX] * b.rank, dynamic_sizes=sizes))
            temps.append(ref)
        else:
            ref = self.add(memref.AllocaOp.get(et, shape=[DYNAMIC_INDEX] * b.rank, dynamic_sizes=sizes))
        self.bufs[op.result] = ref
        if op.zero is not None and op.zero.data:
            zero = self.const(0, et)
            self.nest_loops(sizes, lambda ivs: self.add(memref.StoreOp.get(zero, ref, ivs)))

    def nest_loops(self, sizes: list[SSAValue], body: object) -> None:
        """``for ivs in sizes: body(ivs)`` (index loops)."""
        if not sizes:
            body([])  # type: ignore[operator]
            return
        lo, one = self.const(0, INDEX), self.const(1, INDEX)
        ivs: list[SSAValue] = []
        outer = self.block
        for n in sizes:
            blk = Block(arg_types=[INDEX])
            self.add(scf.ForOp(lo, n, one, [], blk))
            ivs.append(blk.args[0])
            self.block = blk
        body(ivs)  # type: ignore[operator]
        for iv in reversed(ivs):
            iv.owner.add_op(scf.YieldOp())  # type: ignore[union-attr]
        self.block = outer

    def ref(self, buf: SSAValue, idx: list[SSAValue]) -> tuple[SSAValue, list[SSAValue]]:
        """The memref and index operands addressing ``buf[idx]`` (an accumulator of the lane
        loop being built: its lane)."""
        if buf in self.lanes:
            return self.lanes[buf]
        return self.bufs[buf], [self.index(self.values[v]) for v in idx]

    def load(self, buf: SSAValue, idx: list[SSAValue]) -> SSAValue:
        """``buf[idx]`` in its compute type (f16/bf16 widened, bytes of bools compared to 0)."""
        ref, ix = self.ref(buf, idx)
        raw = self.add(memref.LoadOp.get(ref, ix))
        d = self.dtype(s.buf_type(buf).dtype)
        if d.is_bool:
            return self.add(arith.CmpiOp(raw, self.const(0, i8), "ne"))
        if d in (dtypes.F16, dtypes.BF16) and raw.type != Float32Type():
            return self.add(arith.ExtFOp(raw, Float32Type()))
        return raw

    def to_storage(self, v: SSAValue, vdtype: str, b: s.BufType) -> SSAValue:
        """Value ``v`` (compute type of ``vdtype``) as an element of buffer ``b``."""
        d = self.dtype(b.dtype)
        v = self.cast(v, self.dtype(vdtype), d)
        if d.is_bool:
            return self.add(arith.ExtUIOp(v, i8))
        et = storage_type(d, b.role.data in ("in", "out"))
        return self.add(arith.TruncFOp(v, et)) if v.type != et else v

    def accum(self, op: s.AccumOp) -> None:
        ref, idx = self.ref(op.buf, list(op.idx))
        d = self.dtype(s.buf_type(op.buf).dtype)
        cur = self.load(op.buf, list(op.idx))
        v = self.cast(self.values[op.value], self.dtype(ir.tensor_type(op.value).dtype), d)
        new = self.combine(op.kind.data, cur, v, d)
        self.add(memref.StoreOp.get(self.to_storage(new, d.name, s.buf_type(op.buf)), ref, idx))

    # ------------------------------------------------------------------ loops
    def loop(self, op: s.ForOp) -> None:
        lo, hi = self.values[op.lo], self.values[op.hi]
        if cpu_mapping(op) == CpuMapping.LANES:
            self.lane_loop(op, lo, hi)
            return
        if op.kind.data == "parallel":
            body = Block(arg_types=[INDEX])
            self.add(scf.ParallelOp([self.index(lo)], [self.index(hi)], [self.const(1, INDEX)], Region(body)))
            with self.nested(body) as inner:
                self.values[op.iv] = self.add(arith.IndexCastOp(body.args[0], i64))
                self.scoped(list(op.body.block.ops))
                inner.close(scf.ReduceOp())
            return
        body = Block(arg_types=[i64])
        self.add(scf.ForOp(lo, hi, self.const(1, i64), [], body))
        with self.nested(body) as inner:
            self.values[op.iv] = body.args[0]
            self.scoped(list(op.body.block.ops))
            inner.close(scf.YieldOp())

    def scoped(self, ops: list[Operation]) -> None:
        """A loop body: in an ``alloca_scope`` when it allocates scratch (freed every iteration)."""
        if not any(isinstance(o, s.AllocOp) for o in ops):
            self.convert(ops)
            return
        body = Block()
        self.add(memref.AllocaScopeOp(result_types=[[]], regions=[Region(body)]))
        with self.nested(body) as inner:
            self.convert(ops)
            inner.close(memref.AllocaScopeReturnOp(operands=[[]]))

    def lane_loop(self, op: s.ForOp, lo: SSAValue, hi: SSAValue) -> None:
        """map-cpu's reduction: the C printer's lanes per accumulator
        (:func:`~opgen.lower.cpu_map.lanes`; lane 0 starts from it, the others from 0 for a sum),
        iterations ``base + l`` in steps of the lane count (in a :func:`~opgen.lower.cpu_map.paired`
        loop, iteration ``base + l`` in lane ``l / 2``, or ``l / 2 + lanes / 2`` for odd ``l``), then
        the tail; the lanes combined pairwise (``l += l + width`` for width lanes / 2, ..., 2, 1)."""
        accs = s.scalar_accums(op)
        n_lanes = lanes(loaded_bytes(op, self.binding), [a.kind.data for a in accs])
        lane_bufs: dict[SSAValue, SSAValue] = {}
        for a in accs:
            b = s.buf_type(a.buf)
            et = storage_type(self.dtype(b.dtype), False)
            ln = self.add(memref.AllocaOp.get(et, shape=[n_lanes]))
            lane_bufs[a.buf] = ln
            acc = self.add(memref.LoadOp.get(self.bufs[a.buf], []))
            zero = self.const(0, et)
            for lane in range(n_lanes):
                init = zero if a.kind.data == "sum" and lane else acc
                self.add(memref.StoreOp.get(init, ln, [self.const(lane, INDEX)]))
        n = self.add(arith.MaxSIOp(self.add(arith.SubiOp(hi, lo)), self.const(0, i64)))
        width = self.const(n_lanes, i64)
        main_end = self.add(arith.AddiOp(lo, self.add(arith.MuliOp(self.add(arith.DivSIOp(n, width)), width))))

        def body(base: SSAValue, count: SSAValue, pairs: bool) -> None:
            inner_blk = Block(arg_types=[INDEX])
            self.add(scf.ForOp(self.const(0, INDEX), count, self.const(1, INDEX), [], inner_blk))
            with self.nested(inner_blk) as inner:
                lane = inner_blk.args[0]
                self.values[op.iv] = self.add(arith.AddiOp(base, self.add(arith.IndexCastOp(lane, i64))))
                if pairs:  # (element 2 j of the strip in lane j, element 2 j + 1 in lane j + n_lanes / 2)
                    odd = self.add(arith.AndIOp(lane, self.const(1, INDEX)))
                    lane = self.add(arith.AddiOp(self.add(arith.ShRUIOp(lane, self.const(1, INDEX))),
                                                 self.add(arith.MuliOp(odd, self.const(n_lanes // 2, INDEX)))))
                saved = dict(self.lanes)
                self.lanes.update({b: (ln, [lane]) for b, ln in lane_bufs.items()})
                self.scoped(list(op.body.block.ops))
                self.lanes = saved
                inner.close(scf.YieldOp())

        main = Block(arg_types=[i64])
        self.add(scf.ForOp(lo, main_end, width, [], main))
        with self.nested(main) as inner:
            body(main.args[0], self.const(n_lanes, INDEX), paired(op, self.binding))
            inner.close(scf.YieldOp())
        body(main_end, self.index(self.add(arith.SubiOp(hi, main_end))), False)
        for a in accs:
            ln = lane_bufs[a.buf]
            d = self.dtype(s.buf_type(a.buf).dtype)
            w = n_lanes // 2
            while w >= 1:
                for lane in range(w):
                    i0, i1_ = self.const(lane, INDEX), self.const(lane + w, INDEX)
                    x = self.add(memref.LoadOp.get(ln, [i0]))
                    y = self.add(memref.LoadOp.get(ln, [i1_]))
                    self.add(memref.StoreOp.get(self.combine(a.kind.data, x, y, d), ln, [i0]))
                w //= 2
            self.add(memref.StoreOp.get(self.add(memref.LoadOp.get(ln, [self.const(0, INDEX)])), self.bufs[a.buf], []))

    # ------------------------------------------------------------------ segments, matmul
    def segments(self, op: s.SegmentsOp) -> None:
        """A stable counting sort of ``idx`` (values in [0, rows)) into ``order``; afterwards
        ``seg[v]`` is where segment ``v + 1`` starts (see :meth:`segment_start`)."""
        idx, seg, order = self.bufs[op.idx], self.bufs[op.seg], self.bufs[op.order]
        rows = self.values[op.rows]
        words = self.add(memref.DimOp(seg, self.const(0, INDEX)))
        n = self.add(memref.DimOp(idx, self.const(0, INDEX)))
        zero, one = self.const(0, i64), self.const(1, i64)
        self.nest_loops([words], lambda iv: self.add(memref.StoreOp.get(zero, seg, iv)))

        def count(iv: list[SSAValue]) -> None:
            at = self.index(self.add(arith.AddiOp(self.add(memref.LoadOp.get(idx, iv)), one)))
            self.add(memref.StoreOp.get(self.add(arith.AddiOp(self.add(memref.LoadOp.get(seg, [at])), one)), seg, [at]))

        self.nest_loops([n], count)

        def prefix(iv: list[SSAValue]) -> None:
            nxt = self.add(arith.AddiOp(iv[0], self.const(1, INDEX)))
            here, there = self.add(memref.LoadOp.get(seg, iv)), self.add(memref.LoadOp.get(seg, [nxt]))
            total = self.add(arith.AddiOp(there, here))
            self.add(memref.StoreOp.get(total, seg, [nxt]))

        self.nest_loops([self.index(rows)], prefix)

        def scatter(iv: list[SSAValue]) -> None:
            at = self.index(self.add(memref.LoadOp.get(idx, iv)))
            pos = self.add(memref.LoadOp.get(seg, [at]))
            self.add(memref.StoreOp.get(self.add(arith.IndexCastOp(iv[0], i64)), order, [self.index(pos)]))
            self.add(memref.StoreOp.get(self.add(arith.AddiOp(pos, one)), seg, [at]))

        self.nest_loops([n], scatter)

    def segment_start(self, op: s.SegmentStartOp) -> SSAValue:
        v = self.values[op.v]
        zero = self.const(0, i64)
        first = self.add(arith.CmpiOp(v, zero, "eq"))
        prev = self.add(arith.MaxSIOp(self.add(arith.SubiOp(v, self.const(1, i64))), zero))
        at = self.add(memref.LoadOp.get(self.bufs[op.seg], [self.index(prev)]))
        return self.add(arith.SelectOp(first, zero, at))

    def matmul(self, op: s.BufferMatmulOp) -> None:
        """``C (= | +=) op(A) @ op(B)``, every element in the fixed order of ``sched.matmul``:
        blocks of GEMM_KC k terms, each summed by fused multiply-adds from 0, added in order."""
        ta, tb = (t.data for t in op.trans.data)
        acc_flag = bool(op.accumulate.data)
        m, n, kk = (self.values[v] for v in (op.m, op.n, op.k))
        cd = self.dtype(s.buf_type(op.c).dtype)
        ct = scalar_type(cd)
        zero64, one64 = self.const(0, i64), self.const(1, i64)
        kc = self.const(GEMM_KC, i64)
        outer = self.block

        def loop(lo: SSAValue, hi: SSAValue, step: SSAValue, inits: list[SSAValue]) -> tuple[Block, scf.ForOp]:
            blk = Block(arg_types=[i64, *(v.type for v in inits)])
            f = scf.ForOp(lo, hi, step, inits, blk)
            self.add(f)
            self.block = blk
            return blk, f

        bi, _ = loop(zero64, m, one64, [])
        bj, _ = loop(zero64, n, one64, [])
        i, j = bi.args[0], bj.args[0]
        ci = i if op.c_row is None else self.add(arith.AddiOp(self.values[op.c_row], i))  # (C's row)
        start = self.load_at(op.c, [ci, j]) if acc_flag else self.const(0, ct)
        bk, fk = loop(zero64, kk, kc, [start])
        k0, cur = bk.args
        end = self.add(arith.MinSIOp(self.add(arith.AddiOp(k0, kc)), kk))
        bq, fq = loop(k0, end, one64, [self.const(0, ct)])
        q, t = bq.args
        a = self.load_at(op.a, [q, i] if ta else [i, q])
        b = self.load_at(op.b, [j, q] if tb else [q, j])
        if cd.compute.is_float:
            prod = self.add(math.FmaOp(self.cast(a, self.dtype(s.buf_type(op.a).dtype), cd),
                                       self.cast(b, self.dtype(s.buf_type(op.b).dtype), cd), t))
        else:
            prod = self.add(arith.AddiOp(t, self.add(arith.MuliOp(a, b))))
        self.add(scf.YieldOp(prod))
        self.block = bk
        blocksum = fq.results[0]
        if acc_flag:
            new = self.add(arith.AddfOp(cur, blocksum) if cd.compute.is_float else arith.AddiOp(cur, blocksum))
        else:
            first = self.add(arith.CmpiOp(k0, zero64, "eq"))
            added = self.add(arith.AddfOp(cur, blocksum) if cd.compute.is_float else arith.AddiOp(cur, blocksum))
            new = self.add(arith.SelectOp(first, blocksum, added))
        self.add(scf.YieldOp(new))
        self.block = bj
        ix = [self.add(arith.IndexCastOp(v, INDEX)) for v in (ci, j)]
        self.add(memref.StoreOp.get(self.to_storage(fk.results[0], cd.name, s.buf_type(op.c)), self.bufs[op.c], ix))
        self.add(scf.YieldOp())
        self.block = bi
        self.add(scf.YieldOp())
        self.block = outer

    def load_at(self, buf: SSAValue, idx: list[SSAValue]) -> SSAValue:
        """``load`` at i64 MLIR values (not kernel values)."""
        ref = self.bufs[buf]
        raw = self.add(memref.LoadOp.get(ref, [self.add(arith.IndexCastOp(v, INDEX)) for v in idx]))
        d = self.dtype(s.buf_type(buf).dtype)
        if d in (dtypes.F16, dtypes.BF16) and raw.type != Float32Type():
            return self.add(arith.ExtFOp(raw, Float32Type()))
        return raw

    # ------------------------------------------------------------------ scalars
    def scalar(self, op: Operation) -> SSAValue:
        if isinstance(op, s.LoadOp):
            return self.load(op.buf, list(op.idx))
        if isinstance(op, s.LoadBitOp):
            return self.load_bit(op)
        if isinstance(op, s.FlagsPerElemOp):
            return self.const(8 if self.dtype(s.buf_type(op.buf).dtype) == dtypes.U8 else 1, i64)
        if isinstance(op, s.SegmentStartOp):
            return self.segment_start(op)
        if isinstance(op, s.SegWordsOp):  # this target's segment table: rows + 1 words
            return self.sat_add(self.values[op.rows], self.const(1, i64))
        return self.elementwise(op, [self.values[v] for v in op.operands])

    def load_bit(self, op: s.LoadBitOp) -> SSAValue:
        """Flag ``i`` of a mask: a bool element, or bit ``i & 7`` of byte ``i >> 3``."""
        if self.dtype(s.buf_type(op.buf).dtype) == dtypes.BOOL:
            return self.load(op.buf, [op.i])
        i = self.values[op.i]
        byte_at = self.index(self.add(arith.ShRSIOp(i, self.const(3, i64))))
        byte = self.add(arith.ExtUIOp(self.add(memref.LoadOp.get(self.bufs[op.buf], [byte_at])), i64))
        bit = self.add(arith.AndIOp(self.add(arith.ShRUIOp(byte, self.add(arith.AndIOp(i, self.const(7, i64))))),
                                    self.const(1, i64)))
        return self.add(arith.TruncIOp(bit, i1))

def _ancestors(op: Operation, stop: Operation) -> list[Operation]:
    """``op`` and every op containing it, up to (not including) ``stop``."""
    out: list[Operation] = []
    cur: Operation | None = op
    while cur is not None and cur is not stop:
        out.append(cur)
        cur = cur.parent_op()
    return out


