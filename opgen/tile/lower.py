"""``lower-to-tiles``: an L0 function -> a ``tile.kernel`` walking row tiles (the tile level).

The plan is the loop level's row-group plan (opgen.lower.row_groups): every output is a row-wise
function of its row-group dim ``X`` (rows), with row-local reductions along the trailing dim and
column reductions over all rows. Each core takes row tiles ``t = core, core + cores, ...`` of ``R``
rows (``R``, the number of tiles ``tiles`` and the rest are ``tile.param``s the host tiling
computes: see size-tiles): copies the tiles of its inputs in, computes whole tiles with the L0 ops
(in the compute dtype: f16/bf16 data is cast to f32 right after the copy and back right before
the copy out), and copies outputs out. Values that do not depend on the rows — column vectors
such as a weight ``w[D]`` — are copied in once per core, before the walk.

A column reduction (``sum(v, axis=0)`` over the rows) is deterministic whatever the number of
cores: the cores walk *groups* of consecutive row tiles (how many is a tiling parameter that does
not depend on the number of cores); each group's partial sum (its rows in order) goes to its own
row of a workspace array, and after a ``tile.sync_all`` the cores add the partials in group order,
each core owning a range of columns. The partials' precision is the compute dtype.

What the tile level cannot express yet raises :class:`TileUnsupported` naming the primitive; the
build then leaves the op out of that target (it is not an error of the op).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr
from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.lower.row_groups import RowGroupLowering
from opgen.lower.to_loops import NotFusable, _Lowering
from opgen.tile import dialect as t
from opgen.tile.indices import IndexUnsupported, free_dtype_vars, index_params, mark_converted
from opgen.tile.scatter import ScatterWalk

#: L0 ops the tile level has no form for yet (name -> what the message calls it)
UNSUPPORTED = {ir.MatmulOp: "matmul", ir.UnpackBitsOp: "unpack_bits", ir.TransposeOp: "transpose",
               ir.IotaOp: "iota", ir.PowOp: "pow", ir.SliceOp: "slicing with bounds",
               ir.ConcatOp: "concat", ir.ReshapeOp: "reshape", **dict.fromkeys(ir.SIZE_OPS.values(), "derived dims")}
#: L0 ops one NPU target has no form for (its pipeline's ``LowerToTiles(target=...)``). None at
#: present: Ascend C's vector unit has no erf or tanh, and its pipeline expands them into the
#: shared polynomial kernels first (expand-math, opgen/vmath.py); TT-Metal's SFPU has both
#: (erf_tile<false>, tanh_tile)
TARGET_UNSUPPORTED: dict[str, dict[type, str]] = {"ascendc": {}, "tt-metal": {}}

#: tile dims: rows of a tile, and the columns of a column tile (streamed schedule)
ROWS, CHUNK = t.ROWS, t.CHUNK
#: the rows of the column sums' partials in the workspace: one per group of row tiles
GROUPS = t.param_dim("groups")


class TileUnsupported(NotImplementedError):
    """The op uses something the tile level (and so the NPU targets) cannot express yet."""

    def __init__(self, op: str, what: str, where: str = "the tile level (ascendc, tt-metal)"):
        super().__init__(f"not supported on {where}: {what}")
        self.op = op
        self.what = what


#: dtypes the NPU targets compute; a binding using another one (f64, 64-bit integers) has no kernel
NPU_DTYPES = ("f16", "bf16", "f32", "i32", "i16", "i8", "u8", "bool")


def compute_dtype(d: dtypes.DType) -> str:
    """The dtype tiles of ``d`` are computed in: f32 for every float (the NPU targets compute
    f16/bf16 in f32), the dtype itself otherwise."""
    return "f32" if d.is_float else d.name


#: dtypes a kernel may read only with the scalar unit (tile.load): 64-bit integers
SCALAR_ONLY_DTYPES = ("i64",)


def npu_bindings(func: ir.FuncOp, scalar_reads: bool = False) -> list[dict[str, dtypes.DType]]:
    """The dtype bindings of ``func`` an NPU target instantiates (every member computable; with
    ``scalar_reads`` also those whose other members the kernels may only read with the scalar
    unit — lower-to-tiles keeps them when they do), over its dtype variables that are not free
    (opgen/tile/indices.py)."""
    free = free_dtype_vars(func)
    dvars = {k: v for k, v in func.dtype_var_map().items() if k not in free}
    ok = NPU_DTYPES + (SCALAR_ONLY_DTYPES if scalar_reads else ())
    out = []
    for combo in itertools.product(*dvars.values()):
        if all(d.name in ok for d in combo):
            out.append(dict(zip(dvars, combo, strict=True)))
    return out


@dataclass
class _Kind:
    """How an L0 value appears on the tile level: per row tile ([R, c] or [R, 1]), per column
    ([1, c]), or a scalar ([])."""

    kind: str  # "rows" | "cols" | "scalar"
    cols: str = "1"  # the column dim name, or "1"


@dataclass
class _Group:
    x: str  # the rows' dim
    outputs: list[tuple[str, SSAValue]] = field(default_factory=list)
    colreds: list[tuple[str, ir.ReduceOp]] = field(default_factory=list)
    scatters: list[ir.ScatterAddOp] = field(default_factory=list)  # row-local scatter-adds


class TileLowering(ScatterWalk):
    """Lowers row group ``part`` of one ``opgen.func`` (see the module docstring)."""

    def __init__(self, func: ir.FuncOp, binding: dict[str, dtypes.DType], streamed: bool = False, part: int = 0,
                 target: str = "ascendc"):
        self.func = func
        self.target = target
        self.name = func.sym_name.data
        self.binding = binding
        self.streamed = streamed
        self.part = part
        self.free = free_dtype_vars(func)
        self.names = [a.data for a in func.arg_names.data]
        self.ret = func.body.block.last_op
        assert isinstance(self.ret, ir.ReturnOp)
        self.in_memory = set(func.in_memory_scalars)

    def unsupported(self, what: str) -> TileUnsupported:
        return TileUnsupported(self.name, what)

    # ------------------------------------------------------------------ analysis
    def check_supported(self) -> None:
        try:
            self.index = index_params(self.func)
        except IndexUnsupported as e:
            raise TileUnsupported(self.name, str(e)) from None
        for op in self.func.body.block.walk():
            what = UNSUPPORTED.get(type(op))
            if what:
                raise TileUnsupported(self.name, what)
            what = TARGET_UNSUPPORTED[self.target].get(type(op))
            if what:
                raise TileUnsupported(self.name, what, where=self.target)
            if isinstance(op, ir.BincountOp) and not _Lowering.counted_by_segments(op):
                raise TileUnsupported(self.name, "bincount")
            if isinstance(op, ir.GatherOp) and not isinstance(op.table.owner, ir.BincountOp):
                raise TileUnsupported(self.name, "gather")
            if isinstance(op, ir.CheckOp) and ir.tensor_type(op.cond).rank:
                raise TileUnsupported(self.name, "checks on tensor data")
            if isinstance(op, ir.ReduceOp):
                src = ir.tensor_type(op.x)
                if src.rank != 2 and not (src.rank == 1 and op.axis_list == (0,)):
                    raise TileUnsupported(self.name, f"a reduction of a rank-{src.rank} tensor")
        for n, a in zip(self.names, self.func.body.block.args, strict=True):
            tt = ir.tensor_type(a)
            if tt.rank > 2:
                raise TileUnsupported(self.name, f"a rank-{tt.rank} tensor ({n})")
            if n in self.in_memory:
                raise TileUnsupported(self.name, f"a rank-0 tensor parameter ({n})")

    def plan(self) -> list[_Group]:
        """The row groups of the outputs (the loop level's plan); a kernel walks one of them."""
        try:
            groups = RowGroupLowering(self.func, set(self.func.aliased_outputs)).plan()
        except NotFusable as e:
            raise TileUnsupported(self.name, f"outputs that are not row-wise ({e})") from None
        out = []
        for g in groups:
            scatters = [m.owner for m in g.rowlocal if isinstance(m.owner, ir.ScatterAddOp)]
            if scatters and g.colreds:
                raise TileUnsupported(self.name, "a column reduction beside a scatter_add")
            out.append(_Group(g.dim, list(g.outputs), list(g.colreds), scatters))  # type: ignore[arg-type]
        return out

    def kind_of(self, v: SSAValue, x: str) -> _Kind:
        shape = ir.tensor_type(v).shape
        if not shape or all(d == "1" for d in shape):
            return _Kind("scalar")
        if shape[0] == x:
            if len(shape) == 1:
                return _Kind("rows")
            return _Kind("rows", shape[1])
        if len(shape) == 1:
            return _Kind("cols", shape[0])
        if shape[0] == "1" and len(shape) == 2:
            return _Kind("cols", shape[1])
        raise TileUnsupported(self.name, f"a value of shape {shape} outside the row dim {x}")

    # ------------------------------------------------------------------ build
    def run(self) -> t.KernelOp:
        self.check_supported()
        groups = self.plan()
        g = groups[self.part]
        x = g.x
        arg_types = []
        for n, a in zip(self.names, self.func.body.block.args, strict=True):
            tt = ir.tensor_type(a)
            if tt.rank == 0:
                arg_types.append(tt)
            elif n in self.index:  # converted to int32 by the host (opgen/tile/indices.py)
                arg_types.append(t.GmType.make(tt.shape, "i32"))
            elif tt.dtype in self.free:  # never read
                arg_types.append(t.GmType.make(tt.shape, "u8"))
            else:
                arg_types.append(t.GmType.make(tt.shape, self.dt(tt.dtype)))
        # one symbol per instance, row group and schedule
        sym = ".".join([self.name, *(d.name for d in self.binding.values()),
                        *([f"part{self.part}"] if len(groups) > 1 else []), *(["streamed"] if self.streamed else [])])
        k = t.KernelOp(sym, [*self.names, "workspace"], [*arg_types, t.GmType.make([t.WS_BYTES], "u8")],
                       DictionaryAttr({v: StringAttr(d.name) for v, d in self.binding.items()}))
        k.attributes["part"] = IntAttr(self.part)
        k.attributes["indices"] = DictionaryAttr({n: ArrayAttr([StringAttr(d) for d in ip.bounds])
                                                  for n, ip in self.index.items()})
        k.attributes["free"] = ArrayAttr([StringAttr(v) for v in sorted(self.free)])
        mark_converted(k, self.func)
        self.scatters = g.scatters
        self.block = k.body.block
        self.args = dict(zip(self.names, k.body.block.args, strict=False))
        self.env: dict[SSAValue, SSAValue] = {}  # L0 value -> tile-level value
        self.scalars: dict[SSAValue, SSAValue] = {}
        for a, ka in zip(self.func.body.block.args, k.body.block.args, strict=False):
            if ir.tensor_type(a).rank == 0:
                self.scalars[a] = ka
        self.anchor: Operation | None = None
        self.partials: list[SSAValue] = []
        self.tiling = t.TilingOp()
        self.block.add_op(self.tiling)
        self.x = x
        self.group = g
        self.cols = self._column_dim(g)
        self.tcols = CHUNK if self.streamed else self.cols  # a tile's column dim
        self.rowvals: dict[SSAValue, SSAValue] = {}
        self.emit_checks()
        if g.scatters:
            if self.streamed and (self.cols == "1" or self._row_reductions()):
                raise TileUnsupported(self.name, "column tiles of a scatter_add's rows")
            k.attributes["schedule"] = StringAttr("streamed" if self.streamed else "resident")
            self.emit_scatter_walk()
        elif self.streamed:
            if self.cols == "1":
                raise TileUnsupported(self.name, "column tiles of rows of one element")
            k.attributes["schedule"] = StringAttr("streamed")
            self.emit_streamed_walk()
        else:
            k.attributes["schedule"] = StringAttr("resident")
            self.emit_walk()
        if g.colreds:
            self.emit_combine()
        return k

    def _column_dim(self, g: _Group) -> str:
        """The length of the group's rows (every value the group reads has it, or is a column)."""
        cols: set[str] = set()
        pos = {ir.tensor_type(op.idx).shape[0] for op in g.scatters}
        todo = [v for _, v in g.outputs] + [r.x for _, r in g.colreds]
        seen: set[SSAValue] = set()
        while todo:
            v = todo.pop()
            if v in seen:
                continue
            seen.add(v)
            shape = ir.tensor_type(v).shape
            if shape and shape[0] in pos:  # read at a scatter-add's positions
                if len(shape) == 2:
                    cols.add(shape[1])
            elif (k := self.kind_of(v, g.x)).cols != "1":
                cols.add(k.cols)
            if isinstance(v.owner, Operation):
                todo.extend(v.owner.operands)
        if len(cols) > 1:
            raise TileUnsupported(self.name, f"rows of different lengths {sorted(cols)}")
        return cols.pop() if cols else "1"

    def add(self, op: Operation, block: Block | None = None) -> SSAValue:
        """Append ``op`` to ``block`` (default: the current one); at the kernel's top level,
        values made while the walk is being built go before the walk."""
        block = block or self.cur
        if block is self.block and self.anchor is not None:
            block.insert_op_before(op, self.anchor)
        else:
            block.add_op(op)
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def const(self, v: int, block: Block | None = None) -> SSAValue:
        return self.add(ir.ConstantOp(v, "i64"), block)

    def dim(self, d: str, block: Block | None = None) -> SSAValue:
        return self.const(int(d), block) if d.isdigit() else self.add(ir.DimOp(d), block)

    def emit_checks(self) -> None:
        """The op's checks on attributes and sizes, and that each bit-packed mask covers its
        flags (a u8 mask holds 8 per element): the host runs them before the launch."""
        self.cur = self.block
        for op in self.func.body.block.ops:
            if isinstance(op, ir.CheckOp) and not ir.tensor_type(op.cond).rank:
                self.add(ir.CheckOp(self.scalar(op.cond), op.message.data, op.status.data))
            elif isinstance(op, ir.UnpackBitsOp):
                p, n = ir.tensor_type(op.packed), ir.tensor_type(op.result).shape[0]
                per = 8 if self.dt(p.dtype) == "u8" else 1
                have = self.add(ir.MulOp(self.dim(p.shape[0]), self.const(per)))
                self.add(ir.CheckOp(self.add(ir.CmpOp("ge", have, self.dim(n))), f"mask must hold at least {n} flags",
                                    "shape"))

    # ------------------------------------------------------------------ scalars
    def scalar(self, v: SSAValue) -> SSAValue:
        """Scalar code for a rank-0 (or all-ones) L0 value, placed at the kernel's top level."""
        if v in self.scalars:
            return self.scalars[v]
        op = v.owner
        assert isinstance(op, Operation)
        saved, self.cur = self.cur, self.block
        try:
            if isinstance(op, ir.ConstantOp):
                res = self.add(ir.ConstantOp(op.number, self.cdt(v)))
            elif isinstance(op, ir.DimOp):
                res = self.add(ir.DimOp(op.dim.data))
            elif isinstance(op, ir.BroadcastOp | ir.FullOp):
                res = self.scalar(op.operands[0])
            elif isinstance(op, ir.CastOp):
                res = self._cast(self.scalar(op.x), self.cdt(v))
            elif isinstance(op, ir.ReduceOp):
                raise TileUnsupported(self.name, "a reduction to a scalar")
            else:
                res = self.add(self._rebuild(op, [self.scalar(o) for o in op.operands]))
        finally:
            self.cur = saved
        self.scalars[v] = res
        return res

    def dt(self, name: str) -> str:
        """A dtype name with this binding's dtype variables resolved."""
        return self.binding[name].name if name in self.binding else name

    def cdt(self, v: SSAValue) -> str:
        return compute_dtype(dtypes.by_name(self.dt(ir.tensor_type(v).dtype)))

    def _cast(self, v: SSAValue, dt: str) -> SSAValue:
        return v if ir.tensor_type(v).dtype == dt else self.add(ir.CastOp(v, dt))

    @staticmethod
    def _rebuild(op: Operation, operands: list[SSAValue]) -> Operation:
        """``op`` over new operands (its result type follows from them)."""
        if isinstance(op, ir.CmpOp):
            return ir.CmpOp(op.predicate.data, *operands)
        if isinstance(op, ir.SelectOp):
            return ir.SelectOp(*operands)
        if isinstance(op, ir.BinaryOp | ir.UnaryOp):
            return type(op)(*operands)
        raise TileUnsupported("", op.name)

    # ------------------------------------------------------------------ the walk
    def emit_walk(self) -> None:
        """The walk over row tiles: groups of ``group`` consecutive tiles, block-cyclic over the
        cores; a column reduction sums each group's tiles (in order) into one partial row."""
        self.cur = self.block
        rows = self.add(t.ParamOp("rows"))
        tiles = self.add(t.ParamOp("tiles"))
        group = self.add(t.ParamOp("group"))
        groups = self.add(t.ParamOp("groups"))
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        self.rows, self.ntiles, self.ngroups = rows, tiles, groups
        self.ncols = self.dim(self.cols)
        self.zero = self.const(0)
        self.one = self.const(1)
        self.col0 = self.zero
        self.col_env: dict[SSAValue, SSAValue] = {}
        outer = t.ForOp(core, groups, ncores, hint="g")
        self.add(outer)
        self.anchor = outer
        self.cur = outer.body.block
        t0 = self.add(ir.MulOp(outer.iv, group))
        t1 = self.add(ir.MinOp(self.add(ir.AddOp(t0, group)), tiles))
        inits = []
        for _, r in self.group.colreds:
            dt = self.cdt(r.x)
            zero = self.add(ir.ConstantOp(0, dt), self.block)
            inits.append(self.add(ir.BroadcastOp(zero, [], ir.TensorType.make(["1", self.cols], dt))))
        loop = t.ForOp(t0, t1, self.one, inits, hint="t")
        self.add(loop)
        self.cur = loop.body.block
        self.row0 = self.add(ir.MulOp(loop.iv, rows))
        left = self.add(ir.SubOp(self.dim(self.x), self.row0))
        self.nrows = self.add(ir.MinOp(left, rows))
        # column-reduction partials first: every output's tile is then copied out last
        accs = []
        for (_, r), acc in zip(self.group.colreds, loop.body.block.args[1:], strict=True):
            part = self.add(t.ReduceOp("sum", self.tile(r.x), 0, self.nrows))
            accs.append(self.add(ir.AddOp(acc, part)))  # tile order within the group
        self.copy_outputs()
        self.add(t.YieldOp(accs))
        self.cur = outer.body.block
        for i, ((_, r), total) in enumerate(zip(self.group.colreds, loop.res, strict=True)):
            ws = self.add(t.WorkspaceOp(f"partials{i}", t.GmType.make([GROUPS, self.cols], self.cdt(r.x))), self.block)
            self.partials.append(ws)
            self.add(t.CopyOutOp(total, ws, outer.iv, self.one, self.zero, self.ncols))
        self.add(t.YieldOp())
        self.anchor = None

    def copy_outputs(self) -> None:
        """Every output's tile of the current row tile (and column chunk), computed and copied
        out; outputs that alias an input last (reads before writes)."""
        outs = [(name, self._cast_tile(self.tile(v), self.dt(ir.tensor_type(v).dtype)), v)
                for name, v in sorted(self.group.outputs, key=lambda nv: nv[0] in self.func.aliased_outputs)]
        for name, val, v in outs:
            if isinstance(val.owner, t.CopyInOp):
                raise TileUnsupported(self.name, f"an output ({name}) that is an unmodified input")
            self.add(t.CopyOutOp(val, self.args[name], self.row0, self.nrows, self.col0_of(v), self.ncols_of(v)))

    def ncols_of(self, v: SSAValue) -> SSAValue:
        return self.ncols if self.kind_of(v, self.x).cols != "1" else self.one

    def col0_of(self, v: SSAValue) -> SSAValue:
        return self.col0 if self.kind_of(v, self.x).cols != "1" else self.zero

    def tile_shape(self, v: SSAValue) -> list[str]:
        k = self.kind_of(v, self.x)
        cols = self.tcols if k.cols != "1" else "1"
        return [ROWS, cols] if k.kind == "rows" else ["1", cols]

    def _cast_tile(self, v: SSAValue, storage: str) -> SSAValue:
        """``v`` in the storage dtype of an output (a dtype variable stays a variable)."""
        return v if ir.tensor_type(v).dtype == storage else self.add(ir.CastOp(v, storage))

    def tile(self, v: SSAValue) -> SSAValue:
        """The tile-level value of L0 value ``v`` for the current row tile."""
        k = self.kind_of(v, self.x)
        if k.kind == "scalar":
            return self.scalar(v)
        if k.kind == "cols" and not self.streamed:
            return self.column(v)
        if v in self.env:
            return self.env[v]
        if isinstance(v, BlockArgument) and k.kind == "cols":  # a column vector's chunk
            src = self.args[self.names[v.index]]
            raw = self.add(t.CopyInOp(src, self.zero, self.one, self.col0, self.ncols, self.tile_shape(v)))
            res = self._cast(raw, self.cdt(v))
        elif isinstance(v, BlockArgument):
            src = self.args[self.names[v.index]]
            raw = self.add(t.CopyInOp(src, self.row0, self.nrows, self.col0_of(v), self.ncols_of(v),
                                      self.tile_shape(v)))
            res = self._cast(raw, self.cdt(v))
        elif isinstance(v.owner, ir.ScatterAddOp):
            res = self.scatter_tile(v.owner)
        else:
            res = self._tile_op(v.owner, v)  # type: ignore[arg-type]
        self.env[v] = res
        return res

    def column(self, v: SSAValue) -> SSAValue:
        """A value along the columns only (e.g. a weight row): computed once, before the walk."""
        if v in self.col_env:
            return self.col_env[v]
        saved, self.cur = self.cur, self.block
        saved_env, self.env = self.env, self.col_env
        try:
            if isinstance(v, BlockArgument):
                src = self.args[self.names[v.index]]
                raw = self.add(t.CopyInOp(src, self.zero, self.one, self.zero, self.ncols, ["1", self.cols]),
                               self.block)
                res = self._cast(raw, self.cdt(v))
            else:
                res = self._tile_op(v.owner, v)  # type: ignore[arg-type]
        finally:
            self.cur, self.env = saved, saved_env
        self.col_env[v] = res
        return res

    def _tile_op(self, op: Operation, v: SSAValue) -> SSAValue:
        shape = self.tile_shape(v)
        dt = self.cdt(v)
        if isinstance(op, ir.BroadcastOp):
            src = op.x
            sk = self.kind_of(src, self.x)
            x = self.tile(src)
            if sk.kind == "scalar":
                return self.add(ir.BroadcastOp(x, [], ir.TensorType.make(shape, dt)))
            if sk.kind == "rows":  # [R, 1] -> [R, c]
                return self.add(ir.BroadcastOp(x, [0, 1], ir.TensorType.make(shape, dt)))
            return self.add(ir.BroadcastOp(x, [0, 1], ir.TensorType.make(shape, dt)))  # [1, c] -> [R, c]
        if isinstance(op, ir.FullOp):
            return self.add(ir.BroadcastOp(self.scalar(op.value), [], ir.TensorType.make(shape, dt)))
        if isinstance(op, ir.CastOp):
            return self._cast(self.tile(op.x), dt)
        if isinstance(op, ir.ReduceOp):
            src = ir.tensor_type(op.x)
            if src.rank == 2 and op.axis_list == (1,):
                if self.streamed:  # computed over every chunk of the row beforehand
                    return self.rowvals[v]
                return self.add(t.ReduceOp(op.kind.data, self.tile(op.x), 1, self.ncols))
            raise TileUnsupported(self.name, "a reduction across row tiles used by the rows")
        operands = []
        for o in op.operands:
            ok = self.kind_of(o, self.x)
            val = self.tile(o)
            if ok.kind != "rows" and self.kind_of(v, self.x).kind == "rows":
                val = self.add(ir.BroadcastOp(val, [] if ok.kind == "scalar" else [0, 1],
                                              ir.TensorType.make(shape, ir.tensor_type(val).dtype)))
            operands.append(val)
        return self.add(self._rebuild(op, operands))

    def emit_streamed_walk(self) -> None:
        """Rows too long for one tile: a row tile is walked in chunks of ``C`` columns, once per
        row reduction (level by level, each accumulating its chunks' partial results in order),
        then once more for the outputs. A column reduction's partial is then per row tile."""
        self.cur = self.block
        rows = self.add(t.ParamOp("rows"))
        tiles = self.add(t.ParamOp("tiles"))
        chunk = self.add(t.ParamOp("chunk"))
        chunks = self.add(t.ParamOp("chunks"))
        self.add(t.ParamOp("groups"))
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        self.rows, self.ntiles = rows, tiles
        self.ngroups = tiles
        self.full_cols = self.dim(self.cols)
        self.zero = self.const(0)
        self.one = self.const(1)
        self.col_env = {}
        outer = t.ForOp(core, tiles, ncores, hint="t")
        self.add(outer)
        self.anchor = outer
        self.cur = outer.body.block
        self.row0 = self.add(ir.MulOp(outer.iv, rows))
        self.nrows = self.add(ir.MinOp(self.add(ir.SubOp(self.dim(self.x), self.row0)), rows))
        row_scope = self.cur

        def chunk_loop(inits: list[SSAValue]) -> t.ForOp:
            loop = t.ForOp(self.zero, chunks, self.one, inits, hint="c")
            self.add(loop)
            self.cur = loop.body.block
            self.env = {}
            self.col0 = self.add(ir.MulOp(loop.iv, chunk))
            self.ncols = self.add(ir.MinOp(self.add(ir.SubOp(self.full_cols, self.col0)), chunk))
            return loop

        for level in self._row_reduction_levels():  # one walk over the chunks per level
            inits = []
            for red in level:
                dt = self.cdt(red.x)
                ident = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[red.kind.data]
                inits.append(self.add(ir.BroadcastOp(self.add(ir.ConstantOp(ident, dt), self.block), [],
                                                     ir.TensorType.make([ROWS, "1"], dt))))
            loop = chunk_loop(inits)
            nexts = []
            for red, acc in zip(level, loop.body.block.args[1:], strict=True):
                part = self.add(t.ReduceOp(red.kind.data, self.tile(red.x), 1, self.ncols))
                comb = {"sum": ir.AddOp, "max": ir.MaxOp, "min": ir.MinOp}[red.kind.data]
                nexts.append(self.add(comb(acc, part)))  # chunk order
            self.add(t.YieldOp(nexts))
            self.cur = row_scope
            for red, res in zip(level, loop.res, strict=True):
                self.rowvals[red.result] = res
        chunk_loop([])
        for i, (_, r) in enumerate(self.group.colreds):
            part = self.add(t.ReduceOp("sum", self.tile(r.x), 0, self.nrows))
            ws = self.add(t.WorkspaceOp(f"partials{i}", t.GmType.make([GROUPS, self.cols], self.cdt(r.x))), self.block)
            self.partials.append(ws)
            self.add(t.CopyOutOp(part, ws, outer.iv, self.one, self.col0, self.ncols))
        self.copy_outputs()
        self.add(t.YieldOp())
        self.cur = row_scope
        self.add(t.YieldOp())
        self.anchor = None
        self.ncols = self.full_cols

    def _row_reduction_levels(self) -> list[list[ir.ReduceOp]]:
        """The row reductions grouped by level: a reduction's level is one more than the highest
        level of the reductions it reads, so a level's reductions share one walk over the chunks."""
        reds = self._row_reductions()
        level: dict[ir.ReduceOp, int] = {}
        for red in reds:
            deps, todo, seen = 0, [red.x], set()
            while todo:
                v = todo.pop()
                op = v.owner
                if not isinstance(op, Operation) or op in seen:
                    continue
                seen.add(op)
                if op in level:
                    deps = max(deps, level[op] + 1)
                    continue
                todo.extend(op.operands)
            level[red] = deps
        return [[r for r in reds if level[r] == n] for n in range(max(level.values(), default=-1) + 1)]

    def _row_reductions(self) -> list[ir.ReduceOp]:
        """The reductions along the rows the outputs need, in program order (so every one comes
        after those it depends on)."""
        need: set[Operation] = set()
        todo = [v for _, v in self.group.outputs] + [r.x for _, r in self.group.colreds]
        while todo:
            v = todo.pop()
            op = v.owner
            if not isinstance(op, Operation) or op in need:
                continue
            need.add(op)
            todo.extend(op.operands)
        return [op for op in self.func.body.block.ops if op in need and isinstance(op, ir.ReduceOp)
                and ir.tensor_type(op.x).rank == 2 and op.axis_list == (1,)]

    # ------------------------------------------------------------------ column reductions
    def emit_combine(self) -> None:
        """After every core wrote its tiles' partials: each core adds, for a range of columns, the
        partials of every tile in tile order and writes the column sums (rounded once)."""
        self.cur = self.block
        self.add(t.SyncAllOp())
        chunk = self.add(t.ParamOp("col_chunk"))
        nchunks = self.add(t.ParamOp("col_chunks"))
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        loop = t.ForOp(core, nchunks, ncores, hint="c")
        self.add(loop)
        self.cur = loop.body.block
        c0 = self.add(ir.MulOp(loop.iv, chunk))
        nc = self.add(ir.MinOp(self.add(ir.SubOp(self.ncols, c0)), chunk))
        for (name, r), ws in zip(self.group.colreds, self.partials, strict=True):
            dt = self.cdt(r.x)
            zero = self.add(ir.ConstantOp(0, dt))
            init = self.add(ir.BroadcastOp(zero, [], ir.TensorType.make(["1", t.COL_CHUNK], dt)))
            acc_loop = t.ForOp(self.zero, self.ngroups, self.one, [init], hint="p")  # group order
            self.add(acc_loop)
            inner = acc_loop.body.block
            p = self.add(t.CopyInOp(ws, acc_loop.iv, self.one, c0, nc, ["1", t.COL_CHUNK]), inner)
            s = self.add(ir.AddOp(inner.args[1], p), inner)  # tile order: the same sum on any core count
            self.add(t.YieldOp([s]), inner)
            # (to the output's dtype: a column sum's output may be its cast)
            out = self._cast_tile(acc_loop.res[0], self.dt(ir.tensor_type(self.ret.output(name)).dtype))
            self.add(t.CopyOutOp(out, self.args[name], self.zero, self.one, c0, nc))
        self.add(t.YieldOp())


def lower_func(func: ir.FuncOp, binding: dict[str, dtypes.DType], streamed: bool = False,
               part: int = 0, target: str = "ascendc") -> t.KernelOp:
    return TileLowering(func, binding, streamed, part, target).run()
