"""lower-to-linalg: the L0 IR exported as upstream MLIR's ``tensor``/``linalg`` (value semantics).

Each ``opgen.func`` (after the L0 clean-up and ``convert-at-boundary``) becomes one ``func.func``
per dtype binding, ``<variant>_<dtype>...``, over ``func``, ``linalg``, ``tensor``, ``scf``,
``arith`` and ``math``:

- parameters: every input tensor (and an output whose prior contents the op reads) as a ranked
  tensor of its dtype with ``?`` for symbolic dims (``bool`` as ``i8``; a tensor the binder
  converts, as the loop level takes it); attributes and sizes by value; an ``i64`` per dim no
  parameter gives (``opgen.params`` names them, ``dim:<D>``);
- results: the C ABI's status (``i32``), then the outputs the variant writes, in its return order.
  A failed check (``opgen.check``, an index out of range, a mask too short, tensors that disagree
  on a dim) gives its status; the output values are then unspecified and the caller discards them
  (nothing is written in place: value semantics), and no read goes out of bounds;
- values of f16/bf16 are computed in f32 and rounded once, at the results, as the loop level does.

Elementwise ops, broadcasts, transposes, reductions, ``opgen.matmul``, ``opgen.gather``,
``opgen.iota``, ``opgen.unpack_bits`` and ``opgen.reshape`` (reading the source at the same
row-major position) are ``linalg.generic`` ops whose scalar bodies are the loop level's
(opgen/lower/mlir_scalars.py); slices and concatenations are ``tensor.extract_slice`` and
``tensor.concat``; ``opgen.scatter_add`` and ``opgen.bincount`` are ``scf.for`` loops over the
indices in order (duplicates summed in index order, as every backend does) — upstream MLIR has no
deterministic scatter-add on tensors. Reductions and matmuls fix no
summation order (``linalg``'s semantics); the loop level (opgen/lower/to_std.py) fixes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import arith, func, scf, tensor
from xdsl.dialects.builtin import (
    DYNAMIC_INDEX,
    AffineMapAttr,
    ArrayAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    i1,
    i8,
    i32,
    i64,
)
from xdsl.dialects.linalg import attrs as linalg_attrs
from xdsl.dialects.linalg import ops as linalg
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue
from xdsl.ir.affine import AffineExpr, AffineMap
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.dtypes import DType
from opgen.ir import dialect as ir
from opgen.lower.mlir_scalars import INDEX, Scalars, scalar_type, storage_type
from opgen.lower.sched import bindings
from opgen.lower.to_std import RESULTS_ATTR, instance

PAR, RED = linalg_attrs.IteratorTypeAttr.parallel(), linalg_attrs.IteratorTypeAttr.reduction()


@dataclass(frozen=True)
class LowerToLinalg(ModulePass):
    """Replace every ``opgen.func`` by its ``func.func`` instances (see the module doc)."""

    name = "lower-to-linalg"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in list(op.body.block.ops):
            if isinstance(f, ir.FuncOp):
                for b in bindings(f):
                    op.body.block.insert_op_before(_Export(f, b).build(), f)
                op.body.block.erase_op(f)


def _identity(rank: int) -> AffineMapAttr:
    return AffineMapAttr(AffineMap.identity(rank))


def _map(rank: int, results: Sequence[int | None]) -> AffineMapAttr:
    """``(d0..d{rank-1}) -> (...)``: a dim number, or None for the constant 0."""
    return AffineMapAttr(AffineMap(rank, 0, tuple(AffineExpr.constant(0) if r is None else AffineExpr.dimension(r)
                                                  for r in results)))


class _Export(Scalars):
    """Builds one instance: ``values`` maps L0 values to MLIR scalars (rank 0) or tensors."""

    def __init__(self, f: ir.FuncOp, binding: dict[str, DType]):
        super().__init__(binding)
        self.f = f
        self.values: dict[SSAValue, SSAValue] = {}
        self.status: SSAValue | None = None

    # ------------------------------------------------------------------ types and sizes
    def ttype(self, t: ir.TensorType, storage: bool = False) -> TensorType:
        shape = [int(d) if d.isdigit() else DYNAMIC_INDEX for d in t.shape]
        return TensorType(storage_type(self.dtype(t.dtype), storage), shape)

    def dim_value(self, d: str) -> SSAValue:
        """The i64 size spelled ``d`` (a caller's dim, a literal, or a derived dim: the size ops'
        semantics, as opgen.ir.dims.evaluate)."""
        if d.isdigit():
            return self.const(int(d), i64)
        head, args, plus = ir.split_dim(d)
        if not args:
            v = self.dims[head]
        elif head in ir.SIZE_OPS:
            v = self.size(ir.SIZE_OPS[head], self.dim_value(args[0]), self.dim_value(args[1]))
        elif head == "cdiv":
            v = self.size(ir.CeilDivOp, self.dim_value(args[0]), self.dim_value(args[1]))
        else:
            raise NotImplementedError(f"lower-to-linalg: no size for dim {d!r}")
        return self.sat_add(v, self.const(plus, i64)) if plus else v

    def empty(self, t: ir.TensorType, storage: bool = False) -> SSAValue:
        sizes = [self.index(self.dim_value(d)) for d in t.shape if not d.isdigit()]
        return self.add(tensor.EmptyOp(sizes, self.ttype(t, storage)))

    def fill(self, t: ir.TensorType, value: SSAValue) -> SSAValue:
        """A tensor of type ``t`` holding scalar ``value`` everywhere."""
        return self.generic([], [], t, [PAR] * t.rank, lambda _: self.byte(value))

    def byte(self, v: SSAValue) -> SSAValue:
        """A scalar as a tensor element: an ``i1`` becomes a byte."""
        return self.add(arith.ExtUIOp(v, i8)) if v.type == i1 else v

    def flag(self, v: SSAValue, d: DType) -> SSAValue:
        """A tensor element of dtype ``d`` as a scalar: a bool byte becomes ``i1``."""
        return self.add(arith.CmpiOp(v, self.const(0, i8), "ne")) if d.is_bool and v.type == i8 else v

    def generic(self, inputs: Sequence[SSAValue], maps: Sequence[AffineMapAttr], out: ir.TensorType,
                iterators: Sequence[Attribute], body: Callable[[list[SSAValue]], SSAValue],
                init: SSAValue | None = None, out_map: AffineMapAttr | None = None, storage: bool = False) -> SSAValue:
        """``linalg.generic`` over ``iterators`` into a tensor of ``out`` (``init``: its starting
        contents, for reductions); ``body`` gets the element block arguments (inputs, then the
        output's) and returns the yielded value."""
        dest = init if init is not None else self.empty(out, storage)
        types = [v.type.element_type for v in (*inputs, dest)]  # type: ignore[attr-defined]
        blk = Block(arg_types=types)
        om = out_map or _identity(len(iterators))
        g = linalg.GenericOp(list(inputs), [dest], Region(blk), [*maps, om], list(iterators), [dest.type])
        self.add(g)
        with self.nested(blk) as inner:
            inner.close(linalg.YieldOp(body(list(blk.args))))
        return g.results[0]

    def fail_unless(self, ok: SSAValue, status: str) -> None:
        """The status becomes ``status`` when ``ok`` is false and no earlier check failed."""
        assert self.status is not None
        self.status = self.next_status(self.status, ok, status)

    def all_of(self, x: SSAValue, xt: ir.TensorType, pred: Callable[[SSAValue], SSAValue]) -> SSAValue:
        """Whether ``pred`` holds for every element of tensor ``x`` (an i1 scalar)."""
        one = ir.TensorType.make([], "bool")
        acc = self.fill(one, self.const(1, i1))
        d = self.dtype(xt.dtype)
        red = self.generic([x], [_identity(xt.rank)], one, [RED] * xt.rank,
                           lambda a: self.add(arith.AndIOp(a[1], self.byte(pred(self.flag(a[0], d))))), init=acc,
                           out_map=_map(xt.rank, []))
        return self.flag(self.add(tensor.ExtractOp(red, [], i8)), dtypes.BOOL)

    def in_range(self, i: SSAValue, rows: SSAValue) -> SSAValue:
        """``0 <= i < rows`` for an integer element ``i`` (any width, signed) and an i64 ``rows``."""
        w = i.type.width.data  # type: ignore[attr-defined]
        i64v = self.add(arith.ExtSIOp(i, i64)) if w < 64 else i
        lo = self.add(arith.CmpiOp(i64v, self.const(0, i64), "sge"))
        return self.add(arith.AndIOp(lo, self.add(arith.CmpiOp(i64v, rows, "slt"))))

    # ------------------------------------------------------------------ the function
    def build(self) -> func.FuncOp:
        f = self.f
        names = [a.data for a in f.arg_names.data]
        sizes = {n: v.data for n, v in f.sizes.data.items()} if f.sizes else {}  # type: ignore[attr-defined]
        ret = next(o for o in f.body.block.ops if isinstance(o, ir.ReturnOp))
        out_names = [n.data for n in ret.names.data]
        params: list[tuple[SSAValue, Attribute, str]] = []
        for n, a in zip(names, f.body.block.args, strict=True):
            t = ir.tensor_type(a)
            if not a.uses and (n in out_names or t.rank > 0 or self.in_memory(n)):
                continue  # a tensor nothing reads: an output written only, a tensor giving sizes only
            if t.rank == 0 and not self.in_memory(n):
                params.append((a, scalar_type(self.dtype(t.dtype)), n))
            else:
                params.append((a, self.ttype(t, storage=True), n))
        carried = {d for a, t, _ in params if isinstance(t, TensorType) for d in ir.tensor_type(a).shape
                   if d.isidentifier()}
        size_dims = set(sizes.values())
        wanted: set[str] = {op.dim.data for op in f.walk() if isinstance(op, ir.DimOp)}
        for o in f.walk():
            for r in o.results:
                if isinstance(r.type, ir.TensorType):
                    wanted |= set(_atoms(r.type.shape))
        wanted |= size_dims
        extra = sorted(d for d in wanted if d.isidentifier() and d not in carried and d not in size_dims)
        types = [t for _, t, _ in params] + [i64] * len(extra)
        self.block = Block(arg_types=types)
        args = list(self.block.args)
        self.status = self.const(0, i32)
        for d, v in zip(extra, args[len(params):], strict=True):
            v.name_hint = f"dim_{d}"
            self.dims[d] = v
        given = list(zip(params, args, strict=False))
        shaped = [(v, ir.tensor_type(a).shape) for (a, t, _), v in given if isinstance(t, TensorType)]
        self.fail_unless(self.agree(shaped, tensor.DimOp, [(v, sizes[n]) for (_, _, n), v in given if n in sizes]),
                         "shape")
        self.out_types = [self.ttype(ir.tensor_type(v), True) for v in ret.operands]
        body = [op for op in f.body.block.ops if not isinstance(op, ir.ReturnOp)]

        def run() -> list[SSAValue]:
            for (a, t, n), v in zip(params, args, strict=False):
                v.name_hint = n
                self.values[a] = self.entry_value(a, v, t)
            return self.emit(body, ret)

        results = self.guard(run)
        rtypes: list[Attribute] = [i32, *self.out_types]
        self.add(func.ReturnOp(*results))
        fn = instance(f.sym_name.data, self.binding, types, rtypes, self.block, [n for _, _, n in params], extra,
                      f.boundary_casts)
        fn.attributes[RESULTS_ATTR] = ArrayAttr([StringAttr("status"), *(StringAttr(n) for n in out_names)])
        return fn

    def emit(self, ops: list[Operation], ret: ir.ReturnOp) -> list[SSAValue]:
        """Convert ``ops``; after a check, the rest runs only if no check failed (:meth:`guard`).
        Returns the status and the outputs."""
        for i, op in enumerate(ops):
            self.convert(op)
            if isinstance(op, ir.CheckOp) and i + 1 < len(ops):
                return self.guard(lambda rest=ops[i + 1:]: self.emit(rest, ret))
        return [self.status, *(self.to_storage(self.values[v], ir.tensor_type(v)) for v in ret.operands)]

    def guard(self, then: Callable[[], list[SSAValue]]) -> list[SSAValue]:
        """``scf.if`` no check failed: ``then()`` (the status and outputs it computes); else the
        status and empty outputs (sizes that failed a check are never used: no allocation of a
        negative size, no slice out of bounds)."""
        assert self.status is not None
        failed = self.status
        clean = self.add(arith.CmpiOp(failed, self.const(0, i32), "eq"))
        yes, no = Block(), Block()
        fi = scf.IfOp(clean, [i32, *self.out_types], Region(yes), Region(no))
        self.add(fi)
        with self.nested(yes) as inner:
            inner.close(scf.YieldOp(*then()))
        with self.nested(no) as inner:
            empty = [self.add(tensor.EmptyOp([self.const(0, INDEX)] * sum(1 for d in t.get_shape() if d < 0), t))
                     for t in self.out_types]
            inner.close(scf.YieldOp(failed, *empty))
        self.status = fi.results[0]
        return list(fi.results)

    def in_memory(self, name: str) -> bool:
        r0 = self.f.rank0_tensors
        return r0 is not None and name in {x.data for x in r0.data}

    def entry_value(self, a: SSAValue, v: SSAValue, t: Attribute) -> SSAValue:
        """A parameter as the body reads it: a tensor in its compute type, a scalar."""
        lt = ir.tensor_type(a)
        d = self.dtype(lt.dtype)
        if not isinstance(t, TensorType):
            return v
        if lt.rank == 0:
            x = self.add(tensor.ExtractOp(v, [], t.element_type))
            return self.flag(self.cast_storage(x, d, to_storage=False), d)
        if t.element_type == storage_type(d, False):
            return v
        return self.generic([v], [_identity(lt.rank)], lt, [PAR] * lt.rank,
                            lambda e: self.cast_storage(e[0], d, to_storage=False))

    def cast_storage(self, x: SSAValue, d: DType, to_storage: bool) -> SSAValue:
        want = storage_type(d, to_storage)
        if x.type == want:
            return x
        return self.add(arith.TruncFOp(x, want) if to_storage else arith.ExtFOp(x, want))

    def to_storage(self, v: SSAValue, lt: ir.TensorType) -> SSAValue:
        d = self.dtype(lt.dtype)
        if lt.rank == 0:
            return self.add(tensor.FromElementsOp(self.byte(self.cast_storage(v, d, True)),
                                                  result_type=self.ttype(lt, True)))
        if self.ttype(lt, True) == v.type:
            return v
        return self.generic([v], [_identity(lt.rank)], lt, [PAR] * lt.rank,
                            lambda e: self.cast_storage(e[0], d, True), storage=True)

    # ------------------------------------------------------------------ ops
    def convert(self, op: Operation) -> None:
        if isinstance(op, ir.DimOp):
            self.values[op.result] = self.dims[op.dim.data]
            return
        if isinstance(op, ir.CheckOp):
            c = self.values[op.cond]
            ct = ir.tensor_type(op.cond)
            self.fail_unless(c if ct.rank == 0 else self.all_of(c, ct, lambda x: x), op.status.data)
            return
        rt = ir.tensor_type(op.results[0])
        args = [self.values[v] for v in op.operands]
        self.values[op.results[0]] = self.value(op, rt, args)

    def value(self, op: Operation, rt: ir.TensorType, args: list[SSAValue]) -> SSAValue:
        if rt.rank == 0 and not isinstance(op, ir.ReduceOp | ir.MatmulOp):
            return self.elementwise(op, args)
        r = rt.rank
        if isinstance(op, ir.FullOp):
            return self.fill(rt, args[0])
        if isinstance(op, ir.IotaOp):
            ax = op.axis.data
            et = storage_type(self.dtype(rt.dtype), False)
            return self.generic([], [], rt, [PAR] * r,
                                lambda _: self.add(arith.IndexCastOp(self.add(linalg.IndexOp(ax)), et)))
        if isinstance(op, ir.BroadcastOp):
            return self.broadcast(op, rt, args[0])
        if isinstance(op, ir.TransposeOp):
            perm = list(op.perm.get_values())
            inv = [perm.index(j) for j in range(r)]
            return self.generic(args, [_map(r, inv)], rt, [PAR] * r, lambda e: e[0])
        if isinstance(op, ir.SliceOp):
            return self.slice(op, rt, args[0])
        if isinstance(op, ir.ConcatOp):
            return self.add(tensor.ConcatOp(args, op.axis.data, self.ttype(rt)))
        if isinstance(op, ir.ReshapeOp):
            return self.reshape(args[0], ir.tensor_type(op.x), rt)
        if isinstance(op, ir.ReduceOp):
            red = self.reduce(op, rt, args[0])
            if r:
                return red
            return self.flag(self.add(tensor.ExtractOp(red, [], red.type.element_type)),  # type: ignore[attr-defined]
                             self.dtype(rt.dtype))
        if isinstance(op, ir.MatmulOp):
            return self.matmul(rt, args)
        if isinstance(op, ir.GatherOp):
            return self.gather(op, rt, args)
        if isinstance(op, ir.ScatterAddOp | ir.BincountOp):
            return self.scatter(op, rt, args)
        if isinstance(op, ir.UnpackBitsOp):
            return self.unpack_bits(op, rt, args[0])
        maps = [_identity(r)] * len(args)  # an elementwise op: operands of the result's shape
        kinds = [self.dtype(ir.tensor_type(v).dtype) for v in op.operands]
        return self.generic(args, maps, rt, [PAR] * r, lambda e: self.byte(self.elementwise(
            op, [self.flag(x, d) for x, d in zip(e, kinds, strict=False)])))

    def broadcast(self, op: ir.BroadcastOp, rt: ir.TensorType, x: SSAValue) -> SSAValue:
        xt = ir.tensor_type(op.x)
        if xt.rank == 0:
            return self.fill(rt, x)
        dims = list(op.dims.get_values())
        res = [None if xt.shape[i] == "1" and rt.shape[dims[i]] != "1" else dims[i] for i in range(xt.rank)]
        return self.generic([x], [_map(rt.rank, res)], rt, [PAR] * rt.rank, lambda e: e[0])

    def slice(self, op: ir.SliceOp, rt: ir.TensorType, x: SSAValue) -> SSAValue:
        axis = op.axis.data
        offsets: list[SSAValue | int] = [0] * rt.rank
        offsets[axis] = self.index(self.dim_value(op.start.data))
        sizes: list[SSAValue | int] = [int(d) if d.isdigit() else self.index(self.dim_value(d)) for d in rt.shape]
        return self.add(tensor.ExtractSliceOp(x, offsets, sizes, [1] * rt.rank, self.ttype(rt)))

    def reshape(self, x: SSAValue, xt: ir.TensorType, rt: ir.TensorType) -> SSAValue:
        """A row-major reshape: each result element reads ``x`` at the same row-major position
        (a ``linalg.generic`` with ``tensor.extract``: upstream lowers ``tensor.expand_shape``
        with two run-time sizes in one group by an assertion failure, so it is not used)."""
        src = [self.index(self.dim_value(d)) for d in xt.shape]
        dst = [self.index(self.dim_value(d)) for d in rt.shape]
        et = storage_type(self.dtype(rt.dtype), False)

        def body(_: list[SSAValue]) -> SSAValue:
            pos = self.const(0, INDEX)
            for k, n in enumerate(dst):
                pos = self.add(arith.AddiOp(self.add(arith.MuliOp(pos, n)), self.add(linalg.IndexOp(k))))
            at: list[SSAValue] = []
            for n in reversed(src):
                at.insert(0, self.add(arith.RemUIOp(pos, n)))
                pos = self.add(arith.DivUIOp(pos, n))
            return self.add(tensor.ExtractOp(x, at, et))

        return self.generic([], [], rt, [PAR] * rt.rank, body)

    def reduce(self, op: ir.ReduceOp, rt: ir.TensorType, x: SSAValue) -> SSAValue:
        xt = ir.tensor_type(op.x)
        axes = set(op.axes.get_values())
        kind = op.kind.data
        d = self.dtype(xt.dtype)
        c = d.compute
        et = storage_type(d, False)
        if kind == "sum":
            start: float | int = 0
        elif c.is_float:
            start = float("-inf") if kind == "max" else float("inf")
        else:
            lo, hi = c.int_range
            start = lo if kind == "max" else hi
        init = self.fill(rt, self.const(start, et))
        keep = [i for i in range(xt.rank) if i not in axes]
        its = [RED if i in axes else PAR for i in range(xt.rank)]
        return self.generic([x], [_identity(xt.rank)], rt, its, lambda e: self.combine(kind, e[1], e[0], d),
                            init=init, out_map=_map(xt.rank, keep))

    def matmul(self, rt: ir.TensorType, args: list[SSAValue]) -> SSAValue:
        d = self.dtype(rt.dtype)
        zero = self.fill(rt, self.const(0, storage_type(d, False)))

        def body(e: list[SSAValue]) -> SSAValue:
            if d.compute.is_float:
                return self.add(arith.AddfOp(e[2], self.add(arith.MulfOp(e[0], e[1]))))
            return self.add(arith.AddiOp(e[2], self.add(arith.MuliOp(e[0], e[1]))))

        return self.generic(args, [_map(3, [0, 2]), _map(3, [2, 1])], rt, [PAR, PAR, RED], body, init=zero,
                            out_map=_map(3, [0, 1]))

    def gather(self, op: ir.GatherOp, rt: ir.TensorType, args: list[SSAValue]) -> SSAValue:
        table, idx = args
        rows = self.add(arith.IndexCastOp(self.add(tensor.DimOp(table, self.const(0, INDEX))), i64))
        it = ir.tensor_type(op.idx)
        self.fail_unless(self.all_of(idx, it, lambda i: self.in_range(i, rows)), "index")
        et = storage_type(self.dtype(rt.dtype), False)

        def body(e: list[SSAValue]) -> SSAValue:
            rest = [self.add(linalg.IndexOp(k)) for k in range(1, rt.rank)]
            ok = self.in_range(e[0], rows)
            then, other = Block(), Block()
            fi = scf.IfOp(ok, [et], Region(then), Region(other))
            self.add(fi)
            with self.nested(then) as t:
                i = self.add(arith.IndexCastOp(e[0], INDEX))
                t.close(scf.YieldOp(self.add(tensor.ExtractOp(table, [i, *rest], et))))
            with self.nested(other) as o:
                o.close(scf.YieldOp(self.const(0, et)))
            return fi.results[0]

        return self.generic([idx], [_map(rt.rank, [0])], rt, [PAR] * rt.rank, body)

    def scatter(self, op: ir.ScatterAddOp | ir.BincountOp, rt: ir.TensorType, args: list[SSAValue]) -> SSAValue:
        """``result = 0; result[idx[n], ...] += values[n, ...]`` (bincount: ``+= 1``) for n in order."""
        counting = isinstance(op, ir.BincountOp)
        idx = args[0] if counting else args[1]
        it = ir.tensor_type(op.idx)
        rows = self.dim_value(rt.shape[0])
        self.fail_unless(self.all_of(idx, it, lambda i: self.in_range(i, rows)), "index")
        d = self.dtype(rt.dtype)
        et = storage_type(d, False)
        acc0 = self.fill(rt, self.const(0, et))
        n = self.add(tensor.DimOp(idx, self.const(0, INDEX)))
        rest = [self.add(tensor.DimOp(acc0, self.const(k, INDEX))) for k in range(1, rt.rank)]

        def loops(bounds: list[SSAValue], acc: SSAValue, body: Callable[[list[SSAValue], SSAValue], SSAValue],
                  ivs: list[SSAValue]) -> SSAValue:
            if not bounds:
                return body(ivs, acc)
            blk = Block(arg_types=[INDEX, acc.type])
            loop = scf.ForOp(self.const(0, INDEX), bounds[0], self.const(1, INDEX), [acc], blk)
            self.add(loop)
            with self.nested(blk) as inner:
                inner.close(scf.YieldOp(loops(bounds[1:], blk.args[1], body, [*ivs, blk.args[0]])))
            return loop.results[0]

        def add_row(ivs: list[SSAValue], acc: SSAValue) -> SSAValue:
            i = self.add(tensor.ExtractOp(idx, [ivs[0]], idx.type.element_type))  # type: ignore[attr-defined]
            ok = self.in_range(i, rows)
            then, other = Block(), Block()
            fi = scf.IfOp(ok, [acc.type], Region(then), Region(other))
            self.add(fi)
            with self.nested(then) as t:
                row = self.add(arith.IndexCastOp(i, INDEX))

                def add_one(jv: list[SSAValue], a: SSAValue) -> SSAValue:
                    at = [row, *jv]
                    cur = self.add(tensor.ExtractOp(a, at, et))
                    v = self.const(1, et) if counting else self.add(tensor.ExtractOp(args[0], [ivs[0], *jv], et))
                    return self.add(tensor.InsertOp(self.combine("sum", cur, v, d), a, at))

                t.close(scf.YieldOp(loops(rest, acc, add_one, [])))
            with self.nested(other) as o:
                o.close(scf.YieldOp(acc))
            return fi.results[0]

        return loops([n], acc0, add_row, [])

    def unpack_bits(self, op: ir.UnpackBitsOp, rt: ir.TensorType, packed: SSAValue) -> SSAValue:
        """Flag i: bit i % 8 of byte i // 8 (u8) or element i (bool); a mask too short: ``shape``."""
        u8 = self.dtype(ir.tensor_type(op.packed).dtype) == dtypes.U8
        length = self.add(arith.IndexCastOp(self.add(tensor.DimOp(packed, self.const(0, INDEX))), i64))
        n = self.dim_value(rt.shape[0])
        have = self.add(arith.MuliOp(self.add(arith.MinSIOp(length, self.const(2**59, i64))), self.const(8, i64)))
        self.fail_unless(self.add(arith.CmpiOp(have if u8 else length, n, "sge")), "shape")
        et = packed.type.element_type  # type: ignore[attr-defined]

        def body(_: list[SSAValue]) -> SSAValue:
            i = self.add(linalg.IndexOp(0))
            at = self.add(arith.ShRUIOp(i, self.const(3, INDEX))) if u8 else i
            ok = self.add(arith.CmpiOp(self.add(arith.IndexCastOp(at, i64)), length, "slt"))
            then, other = Block(), Block()
            fi = scf.IfOp(ok, [i1], Region(then), Region(other))
            self.add(fi)
            with self.nested(then) as t:
                byte = self.add(tensor.ExtractOp(packed, [at], et))
                if u8:
                    sh = self.add(arith.IndexCastOp(self.add(arith.AndIOp(i, self.const(7, INDEX))), et))
                    bit = self.add(arith.AndIOp(self.add(arith.ShRUIOp(byte, sh)), self.const(1, et)))
                    flag = self.add(arith.TruncIOp(bit, i1))
                else:
                    flag = self.flag(byte, dtypes.BOOL)
                t.close(scf.YieldOp(flag))
            with self.nested(other) as o:
                o.close(scf.YieldOp(self.const(0, i1)))
            return self.byte(fi.results[0])

        return self.generic([], [], rt, [PAR], body)


def _atoms(shape: Sequence[str]) -> list[str]:
    """The caller's dim names a shape's dims mention (``sub(D,div(D,2))`` -> D)."""
    out: list[str] = []
    for d in shape:
        if d.isdigit():
            continue
        head, args, _ = ir.split_dim(d)
        out += _atoms(args) if args else [head]
    return out

