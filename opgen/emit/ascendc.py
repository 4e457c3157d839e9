"""The Ascend C target: one ``__global__ __aicore__`` kernel per op variant x dtype binding, its
tiling struct and host tiling function, and host launchers behind the plain C ABI
(``opgen_ascendc_<op>``, declared in ``include/opgen_ascendc.h``).

The printer prints the tile level (opgen/tile/) after the ascendc pipeline; every decision —
tile sizes, queues, double buffering, the split over cores, the workspace layout — was made by a
pass and is read off the IR. Spellings are CANN's Ascend C (``kernel_operator.h``): ``TPipe``,
``TQue``/``TBuf``, ``LocalTensor``/``GlobalTensor``, ``DataCopyPad`` with ``DataCopyExtParams``,
count-form vector ops (``Add``, ``Muls``, ``Cast``, ``ReduceSum``...). f16/bf16 tiles are cast to
f32 for the math and back before they are stored, rounding once (``RoundMode::CAST_RINT``).

Op -> text, one IR op at a time:

* ``tile.copy_in`` -> ``AllocTensor`` from its queue, ``DataCopyPad`` (each GM row padded to the
  tile's 32-byte row pitch in the unified buffer), ``EnQue``/``DeQue``;
* ``tile.copy_out`` -> ``EnQue``/``DeQue`` of the value's copy-out queue, ``DataCopyPad`` back,
  ``FreeTensor``;
* an elementwise L0 op on tiles -> one count-form vector op over the whole tile, or, when an
  operand is a folded broadcast (plan-buffers), the scalar form (``Adds``/``Muls``...) with the
  scalar, the row's value (one call per row) or the column vector (one call per row);
* ``tile.reduce`` along the rows -> ``ReduceSum``/``ReduceMax``/``ReduceMin`` per row into the
  per-row tile; across the rows -> ``Add`` of the valid rows in order;
* scalar ops -> C expressions (the tiling struct's fields for ``tile.param``).
"""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

from xdsl.dialects.builtin import IntAttr
from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from opgen import dtypes
from opgen.dsl.opdef import OpDef
from opgen.emit import cnames, cpu
from opgen.emit.c_family import SCALAR_FIELD, c_literal
from opgen.emit.render import STATUS_C
from opgen.ir import dialect as ir
from opgen.lower.boundary import TARGETS as BOUNDARY_TARGETS
from opgen.passes import pipeline
from opgen.tile import dialect as t
from opgen.tile.buffers import is_mask, layout
from opgen.tile.indices import INDEX_DTYPES
from opgen.tile.lower import TileUnsupported
from opgen.tile.sizes import MASK_GRAIN, TILING_BYTES

#: storage C types on the AI core
ACL_CTYPE = {"f32": "float", "f16": "half", "bf16": "bfloat16_t", "i32": "int32_t", "i64": "int64_t",
             "i16": "int16_t", "i8": "int8_t", "u8": "uint8_t", "bool": "uint8_t", "u16": "uint16_t",
             "u32": "uint32_t", "u64": "uint64_t"}
#: scalar C types
SCALAR_CTYPE = {"f32": "float", "i64": "int64_t", "bool": "bool", "i32": "int32_t", "i16": "int16_t", "i8": "int8_t",
                "u8": "uint8_t"}
#: the plain ABI's status of a check's status name

BINARY_VEC = {ir.AddOp: "Add", ir.SubOp: "Sub", ir.MulOp: "Mul", ir.DivOp: "Div", ir.MaxOp: "Max",
              ir.MinOp: "Min"}
SCALAR_FORM = {ir.AddOp: "Adds", ir.MulOp: "Muls", ir.MaxOp: "Maxs", ir.MinOp: "Mins"}
UNARY_VEC = {ir.ExpOp: "Exp", ir.LogOp: "Ln", ir.SqrtOp: "Sqrt", ir.RsqrtOp: "Rsqrt", ir.RecipOp: "Reciprocal",
             ir.AbsOp: "Abs"}
REDUCE_VEC = {"sum": "ReduceSum", "max": "ReduceMax", "min": "ReduceMin"}
C_BINARY = {ir.AddOp: "+", ir.SubOp: "-", ir.MulOp: "*", ir.AndOp: "&&", ir.OrOp: "||"}
#: the host tiling function's expressions of tile.platform queries
PLATFORM = {"cores": "cores", "ub_bytes": "ub_bytes", "sys_ws_bytes": "opgen_ascendc_sys_ws_bytes()"}
#: the Matmul API's names of the matrix unit's operand dtypes
MM_DTYPE = {"f16": "DT_FLOAT16", "bf16": "DT_BF16", "f32": "DT_FLOAT"}
C_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
#: the vector unit's comparison modes, and each predicate with its operands swapped
CMP_MODE = {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}
CMP_SWAPPED = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}


def _cbool(a: IntAttr) -> str:
    return "true" if a.data else "false"


def index_dtypes() -> list[dict[str, object]]:
    """The dtypes the runtime's conversion kernels read (index tensors: opgen/tile/indices.py;
    tensors read only cast: opgen/lower/boundary.py): name, C type, the type the range check
    reads, the type opgen.cast reads, whether the vector unit widens them first, C enum."""
    out: list[dict[str, object]] = []
    for name in INDEX_DTYPES:
        d = dtypes.by_name(name)
        read = "float" if d.is_float else ("uint64_t" if name == "u64" else "int64_t")
        out.append({"name": name, "ctype": ACL_CTYPE[name], "read": read, "cast_read": "bool" if d.is_bool else read,
                    "widen": name in ("f16", "bf16"), "enum": f"OPGEN_{name.upper()}"})
    return out


def boundary_targets() -> list[dict[str, str]]:
    """The dtypes the conversion kernels convert to (opgen/lower/boundary.py's TARGETS)."""
    return [{"name": n, "ctype": "uint8_t" if n == "bool" else ACL_CTYPE[n], "enum": f"OPGEN_{n.upper()}"}
            for n in BOUNDARY_TARGETS]


def inst_name(kernel: t.KernelOp) -> str:
    """``k_<variant>_<dtypes>``, the C name of a kernel instance (sym ``variant.dt1.dt2``)."""
    return "k_" + kernel.sym_name.data.replace(".", "_")


@dataclass
class _Arg:
    name: str  # DSL parameter name
    value: BlockArgument
    index: int  # parameter index (opgen_buf_t / scalar slot)


class AscendPrinter:
    """Prints one kernel instance: tiling struct, kernel, host tiling function and launcher."""

    def __init__(self, k: t.KernelOp, dims: list[str], pidx: dict[str, int]):
        self.k = k
        self.inst = inst_name(k)
        self.dims = dims
        self.pidx = pidx
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.depth = 1
        self.counter = 0
        self.buffers = {op.sym.data: op for op in k.body.block.ops if isinstance(op, t.BufferOp)}
        self.tiling = next(op for op in k.body.block.ops if isinstance(op, t.TilingOp))
        self.params = list(dict.fromkeys(op.param.data for op in self.tiling.body.block.ops
                                         if isinstance(op, t.SetParamOp)))  # (a later set overrides)
        names = [a.data for a in k.arg_names.data]
        self.args = [_Arg(n, a, pidx.get(n, -1)) for n, a in zip(names, k.body.block.args, strict=True)]
        #: the kernel's products on the matrix unit, one Matmul object each (a MIX kernel)
        self.matmuls = [op for op in k.body.block.walk() if isinstance(op, t.TileMatmulOp)]

    # ------------------------------------------------------------------ helpers
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def name(self, v: SSAValue) -> str:
        return self.names[v]

    @staticmethod
    def ctype(dt: str) -> str:
        return ACL_CTYPE[dt]

    def sctype(self, v: SSAValue) -> str:
        dt = ir.tensor_type(v).dtype
        if dt not in SCALAR_CTYPE:
            raise TileUnsupported(self.k.sym_name.data, f"a {dt} scalar")
        return SCALAR_CTYPE[dt]

    def pitch_of(self, v: SSAValue) -> str:
        """Elements per row of a tile value's buffer."""
        cols = ir.tensor_type(v).shape[1]
        return "tl.col_chunk" if cols == t.COL_CHUNK else "tl.pitch"

    def count_of(self, v: SSAValue) -> str:
        """Elements a vector op covers for a tile value (its whole buffer)."""
        lay = layout(ir.tensor_type(v).shape)
        if lay == "tile":
            return f"(int32_t)(tl.rows * {self.pitch_of(v)})"
        if lay == "vec":
            return "(int32_t)tl.rows"
        return f"(int32_t){self.pitch_of(v)}"

    def mask_repeats(self, v: SSAValue) -> str:
        """The whole comparison repeats (MASK_GRAIN elements each) covering tile value ``v``: the
        unit a comparison and the logical ops on its mask work in (size-tiles sized the mask so)."""
        return f"(({self.count_of(v)} + {MASK_GRAIN - 1}) / {MASK_GRAIN})"

    def copy_count(self, v: SSAValue) -> str:
        """Elements a UB -> UB DataCopy of ``v``'s buffer moves: whole 32-byte blocks (a per-row
        tile's buffer is rounded up to them)."""
        if layout(ir.tensor_type(v).shape) != "vec":
            return f"(uint32_t){self.count_of(v)}"
        ct = self.ctype(ir.tensor_type(v).dtype)
        return f"(uint32_t)((tl.rows * sizeof({ct}) + 31) / 32 * 32 / sizeof({ct}))"

    # ------------------------------------------------------------------ scalar expressions
    def scalar_expr(self, op: Operation, host: bool = False) -> str:
        """A C expression for a scalar op (kernel side, or ``host`` in the tiling function)."""
        if isinstance(op, ir.ConstantOp):
            return c_literal(op.number, dtypes.by_name(ir.tensor_type(op.result).dtype))
        if isinstance(op, ir.DimOp):
            return f"d_{op.dim.data}"
        if isinstance(op, t.ParamOp):
            return f"tl.{op.param.data}"
        if isinstance(op, t.BlockIdxOp):
            return "(int64_t)GetBlockIdx()"
        if isinstance(op, t.BlockNumOp):  # (vector cores: two per AI core in a MIX kernel)
            return "(int64_t)(GetBlockNum() * GetTaskRation())" if self.matmuls else "(int64_t)GetBlockNum()"
        if isinstance(op, t.PlatformOp):
            return PLATFORM[op.what.data]
        args = [self.name(o) for o in op.operands]
        rt = ir.tensor_type(op.results[0]).dtype
        if type(op) in C_BINARY:
            return f"{args[0]} {C_BINARY[type(op)]} {args[1]}"
        if isinstance(op, ir.DivOp):
            if dtypes.by_name(rt).is_float:
                return f"{args[0]} / {args[1]}"
            return f"({args[1]} == 0 ? 0 : {args[0]} / {args[1]})"
        if isinstance(op, ir.MinOp):
            return f"({args[0]} < {args[1]} ? {args[0]} : {args[1]})"
        if isinstance(op, ir.MaxOp):
            return f"({args[0]} > {args[1]} ? {args[0]} : {args[1]})"
        if isinstance(op, ir.CmpOp):
            return f"{args[0]} {C_CMP[op.predicate.data]} {args[1]}"
        if isinstance(op, ir.SelectOp):
            return f"({args[0]} ? {args[1]} : {args[2]})"
        if isinstance(op, ir.NegOp):
            return f"-{args[0]}"
        if isinstance(op, ir.NotOp):
            return f"!{args[0]}"
        if isinstance(op, ir.CastOp):
            return f"({SCALAR_CTYPE.get(rt, ACL_CTYPE.get(rt, 'float'))})({args[0]})"
        raise TileUnsupported(self.k.sym_name.data, f"the scalar op {op.name}")

    def define(self, v: SSAValue, expr: str) -> None:
        n = self.fresh()
        self.names[v] = n
        self.line(f"const {self.sctype(v)} {n} = {expr};")

    # ------------------------------------------------------------------ kernel
    def kernel(self) -> str:
        params = [f"GM_ADDR {cnames.local(a.name)}" for a in self.args if isinstance(a.value.type, t.GmType)]
        head = [f'extern "C" __global__ __aicore__ void {self.inst}({", ".join(params)}, GM_ADDR tiling)', "{"]
        if self.matmuls:  # a MIX kernel: the vector cores issue the products to their cube core
            ws = cnames.local("workspace")
            head += ["    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);", f"    SetSysWorkspace({ws});",
                     f"    GM_ADDR usr = GetUserWorkspace({ws});"]
        head += [f"    {self.inst}_tiling_t tl;", "    opgen_load_tiling(&tl, tiling, sizeof tl);"]
        for d, i in ((d, i) for i, d in enumerate(self.dims)):
            head.append(f"    const int64_t d_{d} = tl.dims[{i}]; (void)d_{d};")
        for a in self.args:
            if isinstance(a.value.type, t.GmType):
                gm = a.value.type
                ct = self.ctype(gm.dtype)
                n = cnames.local(a.name)
                self.names[a.value] = f"g_{a.name}"
                if a.name == "workspace":
                    self.names[a.value] = n
                    continue
                count = " * ".join(f"(uint64_t)d_{d}" if not d.isdigit() else f"(uint64_t){d}" for d in gm.shape)
                head.append(f"    GlobalTensor<{ct}> g_{a.name};")
                head.append(f"    g_{a.name}.SetGlobalBuffer((__gm__ {ct} *){n}, {count or '1'});")
            else:
                n = cnames.local(a.name)
                self.names[a.value] = n
                st = SCALAR_CTYPE[ir.tensor_type(a.value).dtype]
                head.append(f"    const {st} {n} = tl.{cnames.local(a.name)}; (void){n};")
        if any(isinstance(op, t.FailUnlessOp) for op in self.k.body.block.walk()):
            head.append("    int32_t opgen_bad = 0; /* a bit per failed check on tensor data */")
        head.append("    TPipe pipe;")
        mms = list(dict.fromkeys(op.sym.data for op in self.matmuls))
        for op in {op.sym.data: op for op in self.matmuls}.values():
            a, b, c = (self.ctype(t.gm_type(x).dtype) for x in (op.a, op.b, op.c))
            gm = "MatmulType<TPosition::GM, CubeFormat::ND, "
            head.append(f"    Matmul<{gm}{a}, {_cbool(op.trans_a)}>, {gm}{b}, {_cbool(op.trans_b)}>, {gm}{c}>, "
                        f"{gm}{c}>> {op.sym.data};")
        if mms:  # (before any InitBuffer, as the API requires)
            objs = ", ".join(f"{m}, &tl.{m}" for m in mms)
            head.append(f"    REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), {objs});")
        for sym, b in self.buffers.items():
            ct = self.ctype(b.attributes["elem"].data)  # type: ignore[attr-defined]
            kind = b.kind.data
            if kind == t.BufferKind.CALC:
                head.append(f"    TBuf<TPosition::VECCALC> b_{sym};")
                head.append(f"    pipe.InitBuffer(b_{sym}, (uint32_t)tl.bytes_{sym});")
                head.append(f"    LocalTensor<{ct}> {sym} = b_{sym}.Get<{ct}>();")
            else:
                pos = "VECIN" if kind == t.BufferKind.IN else "VECOUT"
                depth = b.depth.data
                num = "(uint8_t)tl.nbuf" if depth == 2 else "1"
                head.append(f"    TQue<TPosition::{pos}, {depth}> q_{sym};")
                head.append(f"    pipe.InitBuffer(q_{sym}, {num}, (uint32_t)tl.bytes_{sym});")
        self.lines = []
        self.depth = 1
        self.walk(self.k.body.block)
        for m in mms:
            self.line(f"{m}.End();")
        return "\n".join([*head, *self.lines, "}"]) + "\n"

    def walk(self, block: Block) -> None:
        for op in block.ops:
            self.stmt(op)

    def buffer_of(self, v: SSAValue) -> str:
        owner = v.owner
        if isinstance(owner, Operation) and "buffer" in owner.attributes:
            return owner.attributes["buffer"].data  # type: ignore[attr-defined]
        if isinstance(v, BlockArgument):
            loop = v.owner.parent_op()
            return loop.attributes[f"buffer{v.index}"].data  # type: ignore[union-attr]
        raise AssertionError(f"no buffer for {v}")

    def target(self, v: SSAValue) -> str:
        """The LocalTensor an op writes ``v`` into (allocating it from a copy-out queue)."""
        sym = self.buffer_of(v)
        b = self.buffers[sym]
        if b.kind.data == t.BufferKind.CALC:
            self.names[v] = sym
            return sym
        n = self.fresh("o")
        ct = self.ctype(ir.tensor_type(v).dtype)
        self.line(f"LocalTensor<{ct}> {n} = q_{sym}.AllocTensor<{ct}>();")
        self.names[v] = n
        return n

    def stmt(self, op: Operation) -> None:
        if isinstance(op, t.TilingOp | t.BufferOp | ir.CheckOp):
            return  # host side / prologue
        if op.results and all(not r.uses for r in op.results) and not isinstance(op, t.ForOp):
            return
        if isinstance(op, t.ForOp):
            self.loop(op)
        elif isinstance(op, t.YieldOp):
            return  # carried tiles stay in their buffer (plan-buffers)
        elif isinstance(op, t.WorkspaceOp):
            gm = op.result.type
            assert isinstance(gm, t.GmType)
            ct = self.ctype(gm.dtype)
            n = self.fresh("w")
            count = " * ".join(f"(uint64_t)tl.{p}" if (p := t.dim_param(d)) else f"(uint64_t){d}" if d.isdigit()
                               else f"(uint64_t)d_{d}" for d in gm.shape)
            self.line(f"GlobalTensor<{ct}> {n};")
            base = "usr" if self.matmuls else self.name(self.k.body.block.args[-1])
            self.line(f"{n}.SetGlobalBuffer((__gm__ {ct} *)({base} + tl.{op.offset.data}), {count});")
            self.names[op.result] = n
        elif isinstance(op, t.CopyInOp):
            self.copy_in(op)
        elif isinstance(op, t.CopyOutOp):
            self.copy_out(op)
        elif isinstance(op, t.ReleaseOp):
            sym = self.buffer_of(op.value)
            self.line(f"q_{sym}.FreeTensor({self.name(op.value)});")
        elif isinstance(op, t.SyncAllOp):
            self.line("SyncAll();")
        elif isinstance(op, t.FenceOp):
            self.line("PipeBarrier<PIPE_ALL>();")
        elif isinstance(op, t.LoadOp):
            self.define(op.result, f"{self.name(op.src)}.GetValue({self.name(op.pos)})")
        elif isinstance(op, t.LoadBitOp):
            src, pos = self.name(op.src), self.name(op.pos)
            if t.gm_type(op.src).dtype == "u8":  # bit-packed, LSB first
                self.define(op.result, f"(({src}.GetValue({pos} >> 3) >> ({pos} & 7)) & 1) != 0")
            else:
                self.define(op.result, f"{src}.GetValue({pos}) != 0")
        elif isinstance(op, t.SetAtOp):
            dst = self.target(op.result)
            col = self.name(op.col)
            ct = self.ctype(ir.tensor_type(op.result).dtype)
            self.line(f"if ({col} >= 0 && {col} < {self.name(op.ncols)}) {dst}.SetValue((uint32_t)("
                      f"{self.name(op.row)} * {self.pitch_of(op.result)} + {col}), ({ct}){self.name(op.value)});")
        elif isinstance(op, t.FailUnlessOp):
            self.line(f"opgen_bad |= (int32_t)!({self.name(op.cond)}) << {op.bit.data};")
        elif isinstance(op, t.FlagsOutOp):
            dst, pos = self.name(op.dst), self.name(op.pos)
            self.line(f"{dst}.SetValue({pos}, opgen_bad);")
            self.line(f"DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>"
                      f"({dst}[{pos}]);")
        elif isinstance(op, t.TileMatmulOp):
            self.matmul(op)
        elif isinstance(op, t.MoveOp):
            dst = self.target(op.result)
            self.line(f"DataCopy({dst}, {self.name(op.x)}, {self.copy_count(op.result)});")
        elif isinstance(op, t.ReduceOp):
            self.reduce(op)
        elif isinstance(op, t.SegmentsOp):
            n = self.fresh("seg")
            self.names[op.result] = n
            start, cur, win, scan = op.attributes["buffers"].data.split()  # type: ignore[attr-defined]
            gm = t.gm_type(op.idx)
            self.line(f"OpgenSegments {n}({start}, {cur}, {win}, q_{scan}, tl.seg_window, tl.seg_scan);")
            self.line(f"{n}.Build({self.name(op.idx)}, d_{gm.shape[0]}, {self.name(op.row0)}, {self.name(op.nrows)});")
        elif isinstance(op, t.SegStartOp):
            self.define(op.result, f"{self.name(op.segs)}.Start({self.name(op.row)})")
        elif isinstance(op, t.SegAtOp):
            self.define(op.result, f"{self.name(op.segs)}.At({self.name(op.pos)})")
        elif isinstance(op, t.AddRowOp):
            self.add_row(op)
        elif op.results and ir.tensor_type(op.results[0]).rank == 2:
            self.tile_op(op)
        elif op.results:
            self.define(op.results[0], self.scalar_expr(op))
        else:
            raise TileUnsupported(self.k.sym_name.data, op.name)

    def loop(self, op: t.ForOp) -> None:
        iv = self.fresh("t")
        self.names[op.iv] = iv
        for arg, init, res in zip(op.body.block.args[1:], op.inits, op.res, strict=True):
            if ir.tensor_type(arg).rank == 2:
                self.names[arg] = self.names[init]
                self.names[res] = self.names[init]
            else:
                raise TileUnsupported(self.k.sym_name.data, "a loop-carried scalar")
        lo, hi, step = (self.name(x) for x in (op.lo, op.hi, op.step))
        self.line(f"for (int64_t {iv} = {lo}; {iv} < {hi}; {iv} += {step}) {{")
        self.depth += 1
        self.walk(op.body.block)
        self.depth -= 1
        self.line("}")

    # ------------------------------------------------------------------ the matrix unit
    def org_shape(self, op: t.TileMatmulOp, m: str, n: str, k: str, host: bool = False) -> str:
        """``orgM, orgN, orgKa, orgKb`` of a product: the operands' leading dims (their views' row
        lengths) where they are stored, the product's extents elsewhere (on the host at least 1:
        the tiling of a product nothing runs)."""
        lda, ldb = (self._gm_row(t.gm_type(x)) for x in (op.a, op.b))
        if host:
            lda, ldb = (x if x.isdigit() else f"({x} > 0 ? {x} : 1)" for x in (lda, ldb))
        org_m, org_ka = (lda, k) if op.trans_a.data else (m, lda)
        org_n, org_kb = (n, ldb) if op.trans_b.data else (ldb, k)
        return ", ".join(f"(int32_t)({x})" for x in (org_m, org_n, org_ka, org_kb))

    def matmul(self, op: t.TileMatmulOp) -> None:
        mm = op.sym.data
        m, n, k = (self.name(x) for x in (op.m, op.n, op.k))
        ldc = self._gm_row(t.gm_type(op.c))
        self.line(f"{mm}.SetOrgShape({self.org_shape(op, m, n, k)}, (int32_t)({ldc}));")
        self.line(f"{mm}.SetSingleShape((int32_t){m}, (int32_t){n}, (int32_t){k});")
        self.line(f"{mm}.SetTensorA({self.name(op.a)}[{self.name(op.a_off)}], {_cbool(op.trans_a)});")
        self.line(f"{mm}.SetTensorB({self.name(op.b)}[{self.name(op.b_off)}], {_cbool(op.trans_b)});")
        self.line(f"{mm}.IterateAll({self.name(op.c)}[{self.name(op.c_off)}]);")

    def host_matmul(self, op: t.TileMatmulOp) -> None:
        """The Matmul API's tiling of one product (host side), for its largest extents."""
        def ext(x: str) -> str:
            return x if x.isdigit() else f"(d_{x} > 0 ? d_{x} : 1)"

        bm, bn, bk = (ext(x.data) for x in op.bounds.data)
        op_name = self.k.sym_name.data.split(".")[0]
        sizes = [d for d in [*(x.data for x in op.bounds.data),
                             *(t.gm_type(v).shape[-1] for v in (op.a, op.b, op.c))] if not d.isdigit()]
        for d in dict.fromkeys(sizes):
            self.line(f"if (d_{d} > INT32_MAX) return opgen_fail(OPGEN_ERR_SHAPE, "
                      f'"{op_name}: {d} exceeds the Matmul API\'s int32 sizes");')
        ty = "matmul_tiling::TPosition::GM, matmul_tiling::CubeFormat::ND, matmul_tiling::DataType::"
        a, b, c = (MM_DTYPE[t.gm_type(x).dtype] for x in (op.a, op.b, op.c))
        self.line("{")
        self.depth += 1
        self.line("matmul_tiling::MatmulApiTiling mt(*platform_ascendc::PlatformAscendCManager::GetInstance());")
        self.line(f"mt.SetAType({ty}{a}, {_cbool(op.trans_a)});")
        self.line(f"mt.SetBType({ty}{b}, {_cbool(op.trans_b)});")
        self.line(f"mt.SetCType({ty}{c});")
        self.line(f"mt.SetBiasType({ty}{c});")
        self.line(f"mt.SetShape((int32_t)({bm}), (int32_t)({bn}), (int32_t)({bk}));")
        self.line(f"mt.SetOrgShape({self.org_shape(op, bm, bn, bk, host=True)});")
        self.line("mt.SetBias(false);")
        self.line("mt.SetBufferSpace(-1, -1, -1);")
        self.line(f"if (mt.GetTiling(tl->{op.sym.data}) == -1) return opgen_fail(OPGEN_ERR_INTERNAL, "
                  f'"{op_name}: the Matmul API found no tiling for {op.sym.data}");')
        self.depth -= 1
        self.line("}")

    # ------------------------------------------------------------------ data movement
    def _gm_row(self, gm: t.GmType) -> str:
        """Elements per row of a dense global view (1 for a rank-1 view seen as rows of one)."""
        return f"d_{gm.shape[-1]}" if len(gm.shape) == 2 and not gm.shape[-1].isdigit() else \
            (gm.shape[-1] if len(gm.shape) == 2 else "1")

    def _copy_params(self, v: SSAValue, gm: t.GmType, nrows: str, ncols: str) -> tuple[str, str]:
        """(DataCopyExtParams initializer, element offset expression part) for a tile of ``v``."""
        ct = self.ctype(ir.tensor_type(v).dtype)
        lay = layout(ir.tensor_type(v).shape)
        if lay == "vec" or len(gm.shape) == 1:  # one block of consecutive elements
            n = nrows if lay == "vec" else ncols
            return f"{{1, (uint32_t)({n} * sizeof({ct})), 0, 0, 0}}", ""
        row = self._gm_row(gm)
        src_gap = f"(uint32_t)(({row} - {ncols}) * sizeof({ct}))"
        padded = f"(({ncols} * sizeof({ct}) + 31) / 32 * 32)"
        dst_gap = f"(uint32_t)(({self.pitch_of(v)} * sizeof({ct}) - {padded}) / 32)"
        return f"{{(uint16_t){nrows}, (uint32_t)({ncols} * sizeof({ct})), {src_gap}, {dst_gap}, 0}}", row

    def _gm_offset(self, gm: t.GmType, row0: str, col0: str) -> str:
        if len(gm.shape) == 1:
            return f"{row0} + {col0}" if row0 != "0" else col0
        return f"{row0} * {self._gm_row(gm)} + {col0}"

    def copy_in(self, op: t.CopyInOp) -> None:
        v = op.result
        sym = self.buffer_of(v)
        ct = self.ctype(ir.tensor_type(v).dtype)
        n = self.fresh("x")
        self.names[v] = n
        gm = t.gm_type(op.src)
        nrows, ncols = self.name(op.nrows), self.name(op.ncols)
        params, _ = self._copy_params(v, gm, nrows, ncols)
        off = self._gm_offset(gm, self.name(op.row0), self.name(op.col0))
        self.line(f"LocalTensor<{ct}> {n} = q_{sym}.AllocTensor<{ct}>();")
        self.line(f"DataCopyPad({n}, {self.name(op.src)}[{off}], DataCopyExtParams{params}, "
                  f"DataCopyPadExtParams<{ct}>{{false, 0, 0, ({ct})0}});")
        self.line(f"q_{sym}.EnQue({n});")
        self.line(f"{n} = q_{sym}.DeQue<{ct}>();")

    def copy_out(self, op: t.CopyOutOp) -> None:
        v = op.value
        sym = self.buffer_of(v)
        ct = self.ctype(ir.tensor_type(v).dtype)
        gm = t.gm_type(op.dst)
        nrows, ncols = self.name(op.nrows), self.name(op.ncols)
        params, _ = self._copy_params(v, gm, nrows, ncols)
        # UB -> GM: the source rows are padded in UB (srcStride in 32-byte blocks), the GM rows
        # are spaced by dstStride bytes
        if params.startswith("{(uint16_t)"):
            row = self._gm_row(gm)
            padded = f"(({ncols} * sizeof({ct}) + 31) / 32 * 32)"
            params = (f"{{(uint16_t){nrows}, (uint32_t)({ncols} * sizeof({ct})), "
                      f"(uint32_t)(({self.pitch_of(v)} * sizeof({ct}) - {padded}) / 32), "
                      f"(uint32_t)(({row} - {ncols}) * sizeof({ct})), 0}}")
        off = self._gm_offset(gm, self.name(op.row0), self.name(op.col0))
        n = self.name(v)
        self.line(f"q_{sym}.EnQue({n});")
        self.line(f"{n} = q_{sym}.DeQue<{ct}>();")
        self.line(f"DataCopyPad({self.name(op.dst)}[{off}], {n}, DataCopyExtParams{params});")
        self.line(f"q_{sym}.FreeTensor({n});")

    # ------------------------------------------------------------------ compute
    def _bcast(self, v: SSAValue) -> tuple[str, str] | None:
        """A folded broadcast operand: (kind, C source) — kind scalar | rows | cols."""
        op = v.owner
        if not (isinstance(op, ir.BroadcastOp) and "folded" in op.attributes):
            return None
        src = op.x
        st = ir.tensor_type(src)
        if st.rank == 0:
            return "scalar", self.name(src)
        lay = layout(st.shape)
        return ("rows" if lay == "vec" else "cols"), self.name(src)

    def tile_op(self, op: Operation) -> None:
        v = op.results[0]
        if isinstance(op, ir.BroadcastOp) and "folded" in op.attributes:
            return
        dst = self.target(v)
        count = self.count_of(v)
        pitch = self.pitch_of(v)
        rows = "tl.rows"
        if isinstance(op, ir.BroadcastOp):
            src = op.x
            st = ir.tensor_type(src)
            if st.rank == 0:
                self.line(f"Duplicate({dst}, {self.name(src)}, {count});")
            elif layout(st.shape) == "vec":
                r = self.fresh("r")
                self.line("PipeBarrier<PIPE_ALL>(); /* scalar reads of vector results */")
                self.line(f"for (int64_t {r} = 0; {r} < {rows}; {r}++) "
                          f"Duplicate({dst}[{r} * {pitch}], {self.name(src)}.GetValue({r}), (int32_t){pitch});")
            else:
                r = self.fresh("r")
                self.line(f"for (int64_t {r} = 0; {r} < {rows}; {r}++) "
                          f"DataCopy({dst}[{r} * {pitch}], {self.name(src)}, (uint32_t){pitch});")
            return
        if isinstance(op, ir.CmpOp):
            self.compare(op, dst)
            return
        if is_mask(v):  # and/or/not of masks: on their bits, 16 at a time
            words = f"(int32_t)({self.mask_repeats(v)} * {MASK_GRAIN // 16})"
            bits = [f"{self.name(x)}.ReinterpretCast<uint16_t>()" for x in op.operands]
            fn = {ir.AndOp: "And", ir.OrOp: "Or", ir.NotOp: "Not"}[type(op)]
            self.line(f"{fn}({dst}.ReinterpretCast<uint16_t>(), {', '.join(bits)}, {words});")
            return
        if isinstance(op, ir.CastOp) and is_mask(op.x):  # 1 where the mask's bit is set, else 0
            self.line(f"Duplicate({dst}, (float)1, {count});")
            self.line(f"Select({dst}, {self.name(op.x)}, {dst}, (float)0, SELMODE::VSEL_TENSOR_SCALAR_MODE, "
                      f"(uint32_t){count});")
            return
        if isinstance(op, ir.CastOp):
            src_dt = ir.tensor_type(op.x).dtype
            dst_dt = ir.tensor_type(v).dtype
            mode = "RoundMode::CAST_NONE" if dtypes.by_name(dst_dt).itemsize >= dtypes.by_name(src_dt).itemsize \
                and dtypes.by_name(dst_dt).is_float else "RoundMode::CAST_RINT"
            self.line(f"Cast({dst}, {self.name(op.x)}, {mode}, {count});")
            return
        if type(op) in UNARY_VEC:
            self.line(f"{UNARY_VEC[type(op)]}({dst}, {self.name(op.operands[0])}, {count});")
            return
        if isinstance(op, ir.SelectOp):
            self.select(op, dst)
            return
        if isinstance(op, ir.NegOp):
            self.line(f"Muls({dst}, {self.name(op.x)}, (float)-1, {count});")
            return
        if isinstance(op, ir.SigmoidOp):  # 1 / (1 + exp(-x)), each step rounded as the oracle does
            x = self.name(op.x)
            self.line(f"Muls({dst}, {x}, (float)-1, {count});")
            self.line(f"Exp({dst}, {dst}, {count});")
            self.line(f"Adds({dst}, {dst}, (float)1, {count});")
            self.line(f"Reciprocal({dst}, {dst}, {count});")
            return
        if type(op) in BINARY_VEC:
            a, b = op.operands
            ba, bb = self._bcast(a), self._bcast(b)
            fn = BINARY_VEC[type(op)]
            if ba is None and bb is None:
                self.line(f"{fn}({dst}, {self.name(a)}, {self.name(b)}, {count});")
                return
            self.binary_bcast(op, dst, a, b, ba, bb)
            return
        raise TileUnsupported(self.k.sym_name.data, f"{op.name} on tiles")

    def binary_bcast(self, op: Operation, dst: str, a: SSAValue, b: SSAValue,
                     ba: tuple[str, str] | None, bb: tuple[str, str] | None) -> None:
        """An elementwise op one of whose operands is a folded broadcast."""
        v = op.results[0]
        count, pitch = self.count_of(v), self.pitch_of(v)
        swapped = ba is not None
        x, (kind, s) = (b, ba) if swapped else (a, bb)  # type: ignore[misc]
        xn = self.name(x)
        commutative = not isinstance(op, ir.SubOp)
        if kind == "cols":  # the same row vector against every row of the tile
            fn = BINARY_VEC[type(op)]
            r = self.fresh("r")
            lhs, rhs = (s, f"{xn}[{r} * {pitch}]") if swapped else (f"{xn}[{r} * {pitch}]", s)
            self.line(f"for (int64_t {r} = 0; {r} < tl.rows; {r}++) "
                      f"{fn}({dst}[{r} * {pitch}], {lhs}, {rhs}, (int32_t){pitch});")
            return

        def scalar_form(out: str, src: str, scal: str, n: str) -> list[str]:
            if isinstance(op, ir.SubOp) and not swapped:  # x - s = x + (-s), exact
                return [f"Adds({out}, {src}, -({scal}), {n});"]
            if isinstance(op, ir.SubOp):  # s - x = (-x) + s, exact
                return [f"Muls({out}, {src}, (float)-1, {n});", f"Adds({out}, {out}, {scal}, {n});"]
            assert commutative
            return [f"{SCALAR_FORM[type(op)]}({out}, {src}, {scal}, {n});"]

        if kind == "scalar":
            for text in scalar_form(dst, xn, s, count):
                self.line(text)
            return
        r = self.fresh("r")  # a per-row value: one scalar-form call per row
        self.line("PipeBarrier<PIPE_ALL>(); /* scalar reads of vector results */")
        self.line(f"for (int64_t {r} = 0; {r} < tl.rows; {r}++) {{")
        self.depth += 1
        sv = self.fresh("s")
        self.line(f"const float {sv} = {s}.GetValue({r});")
        for text in scalar_form(f"{dst}[{r} * {pitch}]", f"{xn}[{r} * {pitch}]", sv, f"(int32_t){pitch}"):
            self.line(text)
        self.depth -= 1
        self.line("}")

    def add_row(self, op: t.AddRowOp) -> None:
        """``acc[row] += value`` in place (plan-buffers gave the result the accumulator's buffer)."""
        acc = self.name(op.acc)
        self.names[op.result] = acc
        pitch = self.pitch_of(op.acc)
        row = f"{acc}[{self.name(op.row)} * {pitch}]"
        folded = self._bcast(op.value)
        if folded is not None:
            self.line(f"Adds({row}, {row}, {folded[1]}, (int32_t){pitch});")
        else:
            self.line(f"Add({row}, {row}, {self.name(op.value)}, (int32_t){pitch});")

    def compare(self, op: ir.CmpOp, dst: str) -> None:
        """A comparison into a mask (a bit an element): ``Compare``, or ``CompareScalar`` against
        a folded scalar. Both cover whole 256-byte repeats: the count is rounded up to them
        (plan-buffers padded the operands' buffers, size-tiles sized the mask)."""
        what = self.k.sym_name.data
        if any(ir.tensor_type(x).dtype != "f32" for x in op.operands):
            raise TileUnsupported(what, "a comparison of tiles that are not f32")
        self.check_mask_uses(op.result)
        count = f"(uint32_t)({self.mask_repeats(op.result)} * {MASK_GRAIN})"
        a, b = op.operands
        pred = op.predicate.data
        if self._bcast(a) is not None:  # s < x is x > s
            a, b, pred = b, a, CMP_SWAPPED[pred]
        mode = f"CMPMODE::{CMP_MODE[pred]}"
        folded = self._bcast(b)
        if folded is None:
            self.line(f"Compare({dst}, {self.name(a)}, {self.name(b)}, {mode}, {count});")
        else:
            self.line(f"CompareScalar({dst}, {self.name(a)}, (float){folded[1]}, {mode}, {count});")

    def check_mask_uses(self, v: SSAValue) -> None:
        """A mask is a select's condition, cast to a float, or and/or/not-ed with masks."""
        for u in v.uses:
            o = u.operation
            if isinstance(o, ir.AndOp | ir.OrOp | ir.NotOp) and is_mask(o.results[0]):
                self.check_mask_uses(o.results[0])
            elif not (isinstance(o, ir.SelectOp) and u.index == 0) and \
                    not (isinstance(o, ir.CastOp) and dtypes.by_name(ir.tensor_type(o.result).dtype).is_float):
                raise TileUnsupported(self.k.sym_name.data,
                                      "a comparison used other than as a select's condition or a number")

    def select(self, op: ir.SelectOp, dst: str) -> None:
        """A select on tiles: by a mask (a comparison), ``Select`` of two tiles or of a tile and a
        folded scalar; by one scalar condition (a folded broadcast), a copy of the operand it
        picks."""
        v = op.result
        cond = self._bcast(op.cond)
        if cond is None:  # a mask
            count = f"(uint32_t){self.count_of(v)}"
            other = self._bcast(op.b)
            if other is None:
                self.line(f"Select({dst}, {self.name(op.cond)}, {self.name(op.a)}, {self.name(op.b)}, "
                          f"SELMODE::VSEL_TENSOR_TENSOR_MODE, {count});")
            else:
                self.line(f"Select({dst}, {self.name(op.cond)}, {self.name(op.a)}, (float){other[1]}, "
                          f"SELMODE::VSEL_TENSOR_SCALAR_MODE, {count});")
            return
        if cond[0] != "scalar":
            raise TileUnsupported(self.k.sym_name.data, "a select on tiles by a per-row or per-column condition")
        count = self.count_of(v)
        self.line(f"if ({cond[1]}) {{")
        for i, x in enumerate((op.a, op.b)):
            if i == 1:
                self.line("} else {")
            b = self._bcast(x)
            self.depth += 1
            if b is not None and b[0] == "scalar":
                self.line(f"Duplicate({dst}, {b[1]}, {count});")
            elif b is None:
                self.line(f"DataCopy({dst}, {self.name(x)}, {self.copy_count(v)});")
            else:
                raise TileUnsupported(self.k.sym_name.data, "a select of a broadcast row or column")
            self.depth -= 1
        self.line("}")

    def reduce(self, op: t.ReduceOp) -> None:
        v = op.result
        dst = self.target(v)
        x = self.name(op.x)
        pitch = self.pitch_of(op.x)
        kind = op.kind.data
        if op.axis.data == 1:  # along each row: into the per-row tile
            rdst, rwork = op.attributes["scratch"].data.split()  # type: ignore[attr-defined]
            r = self.fresh("r")
            self.line(f"for (int64_t {r} = 0; {r} < tl.rows; {r}++) {{")
            self.depth += 1
            extra = ", false" if kind != "sum" else ""
            count = self.name(op.count)
            self.line(f"{REDUCE_VEC[kind]}({rdst}, {x}[{r} * {pitch}], {rwork}, (int32_t){count}{extra});")
            self.line("PipeBarrier<PIPE_ALL>(); /* the scalar read of the result */")
            self.line(f"{dst}.SetValue({r}, {rdst}.GetValue(0));")
            self.depth -= 1
            self.line("}")
            self.line("PipeBarrier<PIPE_ALL>(); /* scalar writes before vector reads */")
            return
        # across the valid rows, in order: row 0, then + row 1, + row 2, ...
        fn = {"sum": "Add", "max": "Max", "min": "Min"}[kind]
        r = self.fresh("r")
        self.line(f"DataCopy({dst}, {x}, (uint32_t){pitch});")
        self.line(f"for (int64_t {r} = 1; {r} < {self.name(op.count)}; {r}++) "
                  f"{fn}({dst}, {dst}, {x}[{r} * {pitch}], (int32_t){pitch});")

    # ------------------------------------------------------------------ host side
    def tiling_struct(self) -> str:
        fields = [f"    int64_t dims[{max(len(self.dims), 1)}];"]
        for a in self.args:
            if not isinstance(a.value.type, t.GmType):
                st = SCALAR_CTYPE[ir.tensor_type(a.value).dtype]
                fields.append(f"    {st} {cnames.local(a.name)};")
        fields += [f"    int64_t {p};" for p in self.params]
        fields += [f"    TCubeTiling {m};" for m in dict.fromkeys(op.sym.data for op in self.matmuls)]
        return ("typedef struct {\n" + "\n".join(fields) + f"\n}} {self.inst}_tiling_t;\n"
                f"static_assert(sizeof({self.inst}_tiling_t) <= {TILING_BYTES}, \"tiling data too large\");\n")

    def host_tiling(self) -> str:
        """``<inst>_tiling(dims, sc, cores, ub_bytes, tl)``: the tiling region, then the op's checks."""
        saved = self.lines, self.depth, dict(self.names)
        self.lines, self.depth, self.names = [], 1, {}  # (the kernel's names are not the host's)
        for d, i in ((d, i) for i, d in enumerate(self.dims)):
            self.line(f"const int64_t d_{d} = dims[{i}]; (void)d_{d};")
            self.line(f"tl->dims[{i}] = d_{d};")
        for a in self.args:
            if not isinstance(a.value.type, t.GmType):
                n = cnames.local(a.name)
                st = SCALAR_CTYPE[ir.tensor_type(a.value).dtype]
                self.line(f"const {st} {n} = sc[{a.index}].{SCALAR_FIELD[ir.tensor_type(a.value).dtype]}; (void){n};")
                self.line(f"tl->{n} = {n};")
                self.names[a.value] = n
        for op in self.k.body.block.ops:  # the op's checks on attributes and sizes
            if isinstance(op, ir.CheckOp):
                self._host_check(op)
        for op in self.tiling.body.block.ops:
            if isinstance(op, t.SetParamOp):
                self.line(f"tl->{op.param.data} = {self.name(op.value)};")
            elif isinstance(op, ir.CheckOp):
                self._host_check(op, status="shape")
            else:
                self.define(op.results[0], self.scalar_expr(op, host=True))
        for op in {op.sym.data: op for op in self.matmuls}.values():
            self.host_matmul(op)
        body = self.lines
        self.lines, self.depth, self.names = saved
        head = (f"static opgen_status_t {self.inst}_tiling(const int64_t *dims, const opgen_scalar_t *sc, "
                f"int64_t cores, int64_t ub_bytes, {self.inst}_tiling_t *tl) {{")
        tail = ["    (void)dims; (void)sc; (void)cores; (void)ub_bytes;", "    return OPGEN_SUCCESS;", "}"]
        return "\n".join([head, "    *tl = {};", *body, *tail]) + "\n"

    def _host_check(self, op: ir.CheckOp, status: str | None = None) -> None:
        needed: list[Operation] = []
        todo = [op.cond]
        seen: set[SSAValue] = set()
        while todo:
            x = todo.pop()
            if x in self.names or x in seen or not isinstance(x.owner, Operation):
                continue
            seen.add(x)
            needed.append(x.owner)
            todo.extend(x.owner.operands)
        for o in sorted(needed, key=lambda o: self._order(o)):
            self.define(o.results[0], self.scalar_expr(o, host=True))
        st = STATUS_C[status or op.status.data]
        msg = op.message.data.replace('"', "'")
        op_name = self.k.sym_name.data.split(".")[0]
        self.line(f'if (!({self.name(op.cond)})) return opgen_fail({st}, "{op_name}: {msg}");')

    def _order(self, op: Operation) -> int:
        for i, o in enumerate(self.k.body.block.walk()):
            if o is op:
                return i
        return 0

    def launcher(self) -> str:
        """``<inst>_launch``: the tiling data into the workspace, then the kernel on the stream."""
        ptrs = []
        for a in self.args:
            if isinstance(a.value.type, t.GmType):
                ptrs.append("ws" if a.name == "workspace" else f"bufs[{a.index}].data")
        # the tiling data sits at the start of the kernel's own workspace (after the Matmul API's)
        at = "ws + tl->sys_ws" if self.matmuls else "ws"
        return "\n".join([
            f"static opgen_status_t {self.inst}_launch(const opgen_buf_t *bufs, const {self.inst}_tiling_t *tl, "
            "char *ws, void *stream) {",
            f'    opgen_status_t put = opgen_ascendc_put_tiling({at}, tl, sizeof *tl, stream, "{self.inst}");',
            "    if (put != OPGEN_SUCCESS) return put;",
            f"    ACLRT_LAUNCH_KERNEL({self.inst})((uint32_t)tl->block_dim, (aclrtStream)stream, "
            f"{', '.join([*ptrs, at])});",
            *self.read_checks(),
            f'    return opgen_ascendc_launched("{self.inst}");',
            "}",
        ]) + "\n"

    def read_checks(self) -> list[str]:
        """A check kernel's launcher waits for it and answers the first failed check's status."""
        if "checks" not in self.k.attributes:
            return []
        op_name = self.k.sym_name.data.split(".")[0]
        lines = [f'    opgen_status_t st = opgen_ascendc_launched("{self.inst}");',
                 "    if (st != OPGEN_SUCCESS) return st;", "    int32_t bad = 0;",
                 "    st = opgen_ascendc_check_flags(ws + tl->ws_flags, tl->block_dim, stream, &bad);",
                 "    if (st != OPGEN_SUCCESS) return st;"]
        for bit, c in enumerate(self.k.attributes["checks"].data):  # type: ignore[attr-defined]
            status, msg = (x.data for x in c.data)
            msg = msg.replace('"', "'")
            lines.append(f'    if (bad & (1 << {bit})) return opgen_fail({STATUS_C[status]}, "{op_name}: {msg}");')
        return lines


def host_entries(base: str, insts: list[str]) -> str:
    """The binder's kernel entry of one variant x binding: the first schedule (in the order the
    lowering gave them: whole rows, then column tiles) whose tiling succeeds runs."""
    plat = "opgen_ascendc_cores(), opgen_ascendc_ub_bytes()"
    run = [f"static opgen_status_t {base}(const opgen_buf_t *bufs, const int64_t *dims, const opgen_scalar_t *sc, "
           "char *ws, void *stream) {", "    opgen_status_t st = OPGEN_ERR_INTERNAL;"]
    size = [f"static size_t {base}_ws(const int64_t *dims) {{", "    opgen_scalar_t sc[OPGEN_MAX_PARAMS];",
            "    memset(sc, 0, sizeof sc); /* the sizes never depend on scalar values */"]
    pre = [f"static opgen_status_t {base}_pre(const opgen_buf_t *bufs, const int64_t *dims, "
           "const opgen_scalar_t *sc) {", "    opgen_status_t st = OPGEN_ERR_INTERNAL;", "    (void)bufs;"]
    for n in insts:
        run += ["    {", f"        {n}_tiling_t tl;", f"        st = {n}_tiling(dims, sc, {plat}, &tl);",
                f"        if (st == OPGEN_SUCCESS) return {n}_launch(bufs, &tl, ws, stream);", "    }"]
        size += ["    {", f"        {n}_tiling_t tl;",
                 f"        if ({n}_tiling(dims, sc, {plat}, &tl) == OPGEN_SUCCESS) return (size_t)tl.ws_bytes;",
                 "    }"]
        pre += ["    {", f"        {n}_tiling_t tl;", f"        st = {n}_tiling(dims, sc, {plat}, &tl);",
                "        if (st == OPGEN_SUCCESS) return st;", "    }"]
    run += ["    return st;", "}"]
    size += [f"    return {TILING_BYTES}; /* the pre-check reports why */", "}"]
    pre += ["    return st;", "}"]
    return "\n".join([*size, *pre, *run]) + "\n"


def chain_entries(base: str, parts: list[str]) -> str:
    """The entry of an op whose outputs lie in several row groups: their kernels one after the
    other, each in its own part of the workspace."""
    args = "bufs, dims, sc"
    size = [f"static size_t {base}_ws(const int64_t *dims) {{", "    size_t s = 0;"]
    size += [f"    s = opgen_sz_add(s, opgen_sz_round64({p}_ws(dims)));" for p in parts]
    size += ["    return s;", "}"]
    pre = [f"static opgen_status_t {base}_pre(const opgen_buf_t *bufs, const int64_t *dims, "
           "const opgen_scalar_t *sc) {", "    opgen_status_t st = OPGEN_SUCCESS;"]
    pre += [f"    if ((st = {p}_pre({args})) != OPGEN_SUCCESS) return st;" for p in parts]
    pre += ["    return st;", "}"]
    run = [f"static opgen_status_t {base}(const opgen_buf_t *bufs, const int64_t *dims, const opgen_scalar_t *sc, "
           "char *ws, void *stream) {", "    opgen_status_t st = OPGEN_SUCCESS;", "    size_t off = 0;"]
    for p in parts:
        run += [f"    if ((st = {p}({args}, ws + off, stream)) != OPGEN_SUCCESS) return st;",
                f"    off += opgen_sz_round64({p}_ws(dims));"]
    run += ["    return st;", "}"]
    return "\n".join([*size, *pre, *run]) + "\n"


@dataclass
class _Index:
    """A parameter a host entry converts: position, name, dtype, C count, and either the bounds of
    an index tensor (converted to range-checked int32) or the dtype a tensor read only cast is
    converted to (``to``)."""

    index: int
    name: str
    dtype: str
    count: str
    bounds: list[tuple[str, str]]  # (dim name, C value)
    to: str | None = None


def _served(o: OpDef, k: t.KernelOp, base: str, dims: list[str],
            pidx: dict[str, int]) -> list[tuple[dict[str, dtypes.DType], str, list[_Index]]]:
    """Every full dtype binding the kernels of ``k``'s binding serve (each member of the free
    dtype variables: index dtypes the runtime converts, dtypes of unread tensors, dtypes of
    tensors read only cast), with the host entry that serves it and the parameters it converts
    (opgen/tile/indices.py, opgen/lower/boundary.py)."""
    sig_vars = o.signature.dtype_vars()
    binding = {v: dtypes.by_name(d.data) for v, d in k.dtype_vars.data.items()}  # type: ignore[attr-defined]
    indices = {n: [b.data for b in arr.data] for n, arr in k.attributes["indices"].data.items()}  # type: ignore[attr-defined]
    converted = k.converted
    free = [v.data for v in k.attributes["free"].data]  # type: ignore[attr-defined]
    params = {p.name: p for p in o.signature.params}
    spec_var = {n: params[n].spec.dtype.name for n in [*indices, *converted]}  # type: ignore[attr-defined]
    free += [v for v in dict.fromkeys(spec_var[n] for n in converted) if v in sig_vars and v not in binding
             and v not in free]
    choices = [[m for m in sig_vars[v].members if v not in spec_var.values() or m.name in INDEX_DTYPES] for v in free]
    names = [a.data for a in k.arg_names.data]
    out = []
    for combo in itertools.product(*choices):
        full = {**binding, **dict(zip(free, combo, strict=True))}
        idx = []
        for n in [*indices, *converted]:
            spec_dt = params[n].spec.dtype  # type: ignore[attr-defined]
            dt = full[spec_dt.name] if spec_dt.name in full else spec_dt
            gm = t.gm_type(k.body.block.args[names.index(n)])
            count = " * ".join(f"dims[{dims.index(d)}]" if not d.isdigit() else d for d in gm.shape) or "1"
            bounds = [(b, f"dims[{dims.index(b)}]" if not b.isdigit() else b) for b in indices.get(n, [])]
            idx.append(_Index(pidx[n], n, dt.name, count, bounds, converted.get(n)))
        fn = base + "".join(f"__{i.dtype}" for i in idx)
        work = [i for i in idx if i.to != i.dtype]
        out.append(({v: full[v] for v in sig_vars}, fn if work else base, work))
    return out


def index_entries(fn: str, base: str, op: str, idx: list[_Index], nparams: int) -> str:
    """The host entry of one binding of the converted dtypes: each index parameter converted to
    int32 (and checked), each tensor read only cast converted to its dtype, in its own part of
    the workspace, then the kernels of ``base``."""
    size = [f"static size_t {fn}_ws(const int64_t *dims) {{", f"    size_t s = {base}_ws(dims);"]
    size += [f"    s = opgen_sz_add(s, opgen_ascendc_index_ws({i.count}));" if i.to is None else
             f"    s = opgen_sz_add(s, opgen_ascendc_convert_ws({i.count}, OPGEN_{i.to.upper()}));" for i in idx]
    size += ["    return s;", "}"]
    pre = [f"static opgen_status_t {fn}_pre(const opgen_buf_t *bufs, const int64_t *dims, const opgen_scalar_t *sc) {{",
           *(["    opgen_status_t st = OPGEN_SUCCESS;"] if any(i.to is None for i in idx) else [])]
    run = [f"static opgen_status_t {fn}(const opgen_buf_t *bufs, const int64_t *dims, const opgen_scalar_t *sc, "
           "char *ws, void *stream) {", f"    opgen_buf_t b[{nparams}];", "    memcpy(b, bufs, sizeof b);",
           "    opgen_status_t st = OPGEN_SUCCESS;", "    size_t used = 0, part = 0;"]
    for i in idx:
        if i.to is not None:
            run += [f"    st = opgen_ascendc_convert(&b[{i.index}], OPGEN_{i.dtype.upper()}, {i.count}, "
                    f'OPGEN_{i.to.upper()}, "{op}", "{i.name}", ws + used, &part, stream);',
                    "    if (st != OPGEN_SUCCESS) return st;", "    used += part;"]
            continue
        (name0, v0), rest = i.bounds[0], i.bounds[1:]
        bound = [f"        int64_t bound = {v0};", f'        const char *bound_name = "{name0}";']
        bound += [f'        if ({v} < bound) {{ bound = {v}; bound_name = "{n}"; }}' for n, v in rest]
        pre += ["    {", *bound, "        (void)bound_name;",
                f'        if ((st = opgen_ascendc_index_check({i.count}, bound, "{op}", "{i.name}")) != OPGEN_SUCCESS) '
                "return st;", "    }"]
        run += ["    {", *bound,
                f"        st = opgen_ascendc_indices(&b[{i.index}], OPGEN_{i.dtype.upper()}, {i.count}, bound, "
                f'"{op}", "{i.name}", bound_name, ws + used, &part, stream);',
                "        if (st != OPGEN_SUCCESS) return st;", "        used += part;", "    }"]
    pre += [f"    return {base}_pre(bufs, dims, sc);", "}"]
    run += [f"    return {base}(b, dims, sc, ws + used, stream);", "}"]
    return "\n".join([*size, *pre, *run]) + "\n"


# ---------------------------------------------------------------------- translation unit
#: id(op definition) -> (a reference to it, its kernels): op definitions are not hashable
_KERNELS: dict[int, tuple[weakref.ref[OpDef], dict[tuple[str, ...], list[t.KernelOp]]]] = {}


def kernels(o: OpDef) -> dict[tuple[str, ...], list[t.KernelOp]]:
    """Each valid variant's kernel instances after the ascendc pipeline (TileUnsupported when the
    tile level cannot express the op); computed once per op definition."""
    hit = _KERNELS.get(id(o))
    if hit is not None and hit[0]() is o:
        return hit[1]
    m = o.module()
    pipeline.run(m, "ascendc")
    names = {o.variant_name(p): p for p in o.variants}
    out: dict[tuple[str, ...], list[t.KernelOp]] = {}
    for k in m.body.block.ops:
        assert isinstance(k, t.KernelOp)
        out.setdefault(names[k.sym_name.data.split(".")[0]], []).append(k)
    _KERNELS[id(o)] = (weakref.ref(o), out)
    return out


def op_sources(o: OpDef) -> dict[str, str]:
    """The Ascend C sources of one op, split as CANN builds them: ``<op>_tiling.h`` (the tiling
    structs, shared), ``<op>_kernel.cpp`` (the ``__global__ __aicore__`` kernels) and
    ``<op>_host.cpp`` (host tiling, launchers through ``ACLRT_LAUNCH_KERNEL``, plain entries)."""
    try:
        ks = kernels(o)
    except pipeline.StageFailed as e:
        if isinstance(e.__cause__, TileUnsupported):
            raise e.__cause__ from None
        raise
    dims, _, _, pidx, _ = cpu.op_layout(o)
    where = f"generated by opgen from {o.where}. Do not edit."
    guard = f"OPGEN_ASCENDC_{o.name.upper()}_TILING_H"
    tiling = [f"/* {o.name}: tiling data of the Ascend C kernels, {where} */", f"#ifndef {guard}",
              f"#define {guard}", "#include <stdint.h>", ""]
    kern = [f"/* {o.name}: Ascend C kernels, {where} */", '#include "kernel_operator.h"',
            '#include "opgen_ascendc_kernel.h"', f'#include "{o.name}_tiling.h"', "", "using namespace AscendC;", ""]
    host = [f"/* {o.name}: host tiling and launchers of the Ascend C kernels, {where} */",
            '#include "opgen_ascendc_rt.h"', f'#include "{o.name}_tiling.h"']
    if any(isinstance(op, t.TileMatmulOp) for kl in ks.values() for k in kl for op in k.body.block.walk()):
        tiling.insert(-1, '#include "kernel_tiling/kernel_tiling.h"')
        kern[2:2] = ['#include "lib/matmul_intf.h"']
        kern.insert(-1, "using namespace matmul;")
        host += ['#include "tiling/tiling_api.h"', '#include "tiling/platform/platform_ascendc.h"']
    host_body: list[str] = []
    inst: dict[tuple[str, ...], list[cpu.Instance]] = {}
    wrappers: set[str] = set()
    for present, kl in ks.items():
        groups: dict[str, dict[int, list[t.KernelOp]]] = {}  # variant x binding -> row group -> schedules
        for k in kl:
            key = ".".join(k.sym_name.data.split(".")[:1 + len(k.dtype_vars.data)])
            groups.setdefault(key, {}).setdefault(k.attributes["part"].data, []).append(k)  # type: ignore[attr-defined]
        for key, partmap in groups.items():
            bases = []
            for _, sched in sorted(partmap.items()):
                names = []
                for k in sched:
                    p = AscendPrinter(k, dims, pidx)
                    tiling.append(p.tiling_struct())
                    kern.append(p.kernel())
                    host.append(f'#include "aclrtlaunch_{p.inst}.h"')
                    host_body += [p.host_tiling(), p.launcher()]
                    names.append(p.inst)
                bases.append(f"h_{names[0]}")
                host_body.append(host_entries(bases[-1], names))
            base = bases[0]
            if len(bases) > 1:
                base = "h_" + key.replace(".", "_")
                host_body.append(chain_entries(base, bases))
            first = next(iter(partmap.values()))[0]
            for full, fn, idx in _served(o, first, base, dims, pidx):
                if idx and fn not in wrappers:
                    wrappers.add(fn)
                    host_body.append(index_entries(fn, base, o.name, idx, len(o.signature.params)))
                inst.setdefault(present, []).append(cpu.Instance(present, full, fn))
    tiling.append(f"#endif /* {guard} */")
    host += ["", *host_body, *_tables(o, inst)]
    host += cpu.entry_points(o, prefix="opgen_ascendc_", run="opgen_ascendc_run", extra_params=", void *stream",
                             extra_args=", stream", decl='extern "C" OPGEN_API ')
    return {f"ascendc/{o.name}_tiling.h": "\n".join(tiling) + "\n",
            f"ascendc/{o.name}_kernel.cpp": "\n".join(kern) + "\n",
            f"ascendc/{o.name}_host.cpp": "\n".join(host) + "\n"}


def _tables(o: OpDef, inst: dict[tuple[str, ...], list[cpu.Instance]]) -> list[str]:
    """The op's signature table over this target's host entries (``h_<inst>``, ``_ws``, ``_pre``)."""
    return cpu.op_tables(o, inst, {})  # index dtypes: converted by the host entries (index_entries)


def unsupported_reason(o: OpDef) -> str | None:
    """Why the op has no Ascend C kernels (None when it has)."""
    try:
        kernels(o)
    except pipeline.StageFailed as e:
        if isinstance(e.__cause__, TileUnsupported):
            return e.__cause__.what
        raise
    return None

