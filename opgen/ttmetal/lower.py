"""``lower-to-ttkernel``: each resident ``tile.kernel`` -> a ``ttk.program`` (opgen/ttmetal/dialect.py).

Every decision of the TT-Metal backend is made here, none in the printer:

* **Launches.** The tile level's ``tile.sync_all`` splits the kernel into launches enqueued in
  order (no barrier across the cores of one TT-Metal program). A launch's core-distributed loop
  (``tile.for`` from ``block_idx`` by ``block_num``) runs on ``min(grid, units)`` cores.
* **Units.** Each kernel of the tile level becomes three: ``tile.copy_in`` -> the reader
  (``noc_async_read_page`` of whole tiles into a CB), ``tile.copy_out`` -> the writer, everything
  else -> the compute kernel. All three walk the same loops (identical trip counts).
* **Values and CBs.** A tile-level value of shape ``[tile.rows, D]`` (*full*: 32 rows x ``Wt``
  tiles), ``[tile.rows, 1]`` (*col*: one tile, column 0 valid) or ``[1, D]`` (*row*: ``Wt`` tiles, row 0 valid).
  Copied-in values live in a CB of ``Wt`` pages for the row block (resident schedule); col values
  that a broadcast reads, and reduction results, get a one-page CB; loop-carried row values (the
  column sums) a ``Wt``-page CB that is popped and pushed tile by tile. Elementwise math on full
  and row values is never stored: each consumer recomputes it per tile in DST.
* **DST.** Every stored tile is one ``tile_regs_acquire ... release`` section evaluating an
  expression tree in DST slots (Sethi-Ullman order; at most 4 slots: f32 accumulation in
  half-sync mode): CB tiles enter DST with ``copy_tile`` or ``unary_bcast<ROW|COL>``, math is SFPU
  (``*_binary_tile``, ``*_unary_tile`` with a scalar, ``rsqrt_tile`` ...), exact in f32. Every
  call is preceded by its init.
* **Reductions.** A row sum (axis 1) stores its operand's ``Wt`` tiles (pad columns of the last
  tile masked with ``mask_tile``), then ``reduce_tile<SUM, REDUCE_ROW>`` over them into one tile.
  A column sum (axis 0) stores the operand tile (pad rows masked), then ``REDUCE_COL`` inside the
  section that consumes it. The scaler tile (1.0) and the masks are built by the reader.
* **Layout.** Tensors are in tile layout (32x32 tiles of four 16x16 faces, row-major tile order);
  a ``[D]`` tensor is one row of tiles (row 0 valid); the workspace holds one tile row per
  partial row. Elements outside the logical shape (tile padding) are neither read as data (masked
  in reductions) nor defined in outputs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr, UnitAttr
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.tile.lower import TileUnsupported
from opgen.tile.sizes import cols_dim
from opgen.ttmetal import chain
from opgen.ttmetal import dialect as k
from opgen.ttmetal.sizes import TILE

#: L1 bytes per core the CBs of one launch may use (Wormhole L1 is 1,499,136 B; firmware and
#: kernels' code use the rest) — the host checks it before enqueueing anything
L1_BUDGET = 1_400_000
#: DST tiles a section may use: 4 with f32 accumulation in half-sync mode
DST_SLOTS = 4
#: tiles of a row sum's operand stored at a time (its scratch CB holds the SPLIT parts of each)
REDUCE_CHUNK = 2
#: an f32 reduction operand is split into this many tiles, each exact in the FPU's operands
SPLIT = 3
#: bits of an f32 kept in the hi part of a reduction operand (sign, exponent, 10 mantissa bits)
SPLIT_MASK = "0xFFFFE000u"
FORMAT = {"bf16": "Float16_b", "f32": "Float32"}
#: page bytes of a CB per data format: a tile; for UInt32 a page of 32 words (plans, headers)
TILE_BYTES = {"Float16_b": 2048, "Float32": 4096, "UInt32": 128}
TT_DTYPES = ("bf16", "f32")
SCALAR_OPS = (ir.ConstantOp, ir.DimOp, ir.AddOp, ir.SubOp, ir.MulOp, ir.DivOp, ir.MinOp, ir.MaxOp, ir.CmpOp,
              ir.SelectOp, ir.CastOp, ir.AndOp, ir.OrOp, ir.NotOp)
#: unary math on a float scalar (a function of parameters: Adam's ``sqrt(bc2)``): evaluated by
#: the host with the other scalar ops, read by the kernels as a runtime argument
HOST_MATH = (ir.SqrtOp, ir.RsqrtOp, ir.RecipOp, ir.ExpOp, ir.LogOp, ir.TanhOp, ir.ErfOp, ir.SigmoidOp, ir.NegOp,
             ir.AbsOp)
SFPU_BINARY = {ir.AddOp: "add", ir.SubOp: "sub", ir.MulOp: "mul", ir.DivOp: "div"}
SFPU_UNARY = {ir.RsqrtOp: "rsqrt", ir.RecipOp: "recip", ir.ExpOp: "exp", ir.SigmoidOp: "sigmoid", ir.TanhOp: "tanh",
              ir.LogOp: "log", ir.SqrtOp: "sqrt", ir.NegOp: "negative", ir.AbsOp: "abs", ir.ErfOp: "erf"}
#: template arguments of an SFPU op's init and call: erf's default is its fast approximation
SFPU_TEMPLATE = {"erf": ("false",)}
#: masks: a comparison is the SFPU's f32 ``P_binary_tile`` of two DST tiles (a scalar filled into
#: one): 1.0 where ``a P b`` holds, else 0.0 (NaN: only ``ne`` holds; subnormals compare as zero).
#: ``a & b`` is the product of two masks, ``a | b`` whether their sum is nonzero (``nez_tile``),
#: ``~a`` whether it is zero (``eqz_tile``); ``where`` picks by a mask (``where_tile``)
MASK_OPS = (ir.AndOp, ir.OrOp, ir.NotOp)
#: the tile-level ops this lowering handles (anything else: TtUnsupported naming it)
LOWERED = (t.KernelOp, t.TilingOp, t.ParamOp, t.BlockIdxOp, t.BlockNumOp, t.ForOp, t.YieldOp, t.SyncAllOp,
           t.WorkspaceOp, t.CopyInOp, t.CopyOutOp, t.ReduceOp, ir.BroadcastOp, ir.CastOp, ir.CheckOp, *SFPU_UNARY,
           ir.SelectOp, *MASK_OPS, *SCALAR_OPS, t.TileMatmulOp, t.FenceOp, t.LoadOp, t.LoadBitOp, t.SetAtOp)
#: what the scatter-add lowering (opgen/ttmetal/scatter.py) reads of the tile level
SCATTER_OPS = (t.SegmentsOp, t.SegStartOp, t.SegAtOp, t.AddRowOp)
WHAT = {t.SegmentsOp: "owner-computes scatter-add segments", t.SegStartOp: "scatter-add segments",
        t.SegAtOp: "scatter-add segments", t.AddRowOp: "scatter-add rows", t.TileMatmulOp: "matmul chains",
        t.LoadOp: "scalar loads", t.LoadBitOp: "scalar loads of packed bits", t.SetAtOp: "scalar stores",
        t.FailUnlessOp: "data checks", t.FlagsOutOp: "data checks", t.FenceOp: "fences"}


class TtUnsupported(TileUnsupported):
    """The op uses something the TT-Metal backend does not lower (the message names it)."""

    def __init__(self, kernel: str, what: str):
        super().__init__(kernel, what)
        self.args = (f"not supported on ttmetal: {what} (in {kernel})",)


def kind(v: SSAValue) -> str:
    """``full``, ``row``, ``col``, ``index`` (integer scalar) or ``float`` (float scalar)."""
    tt = ir.tensor_type(v)
    shape = tt.shape
    if len(shape) == 0:
        return "float" if dtypes.by_name(tt.dtype).is_float else "index"
    if len(shape) == 2 and shape[1] == "1" and shape[0] != "1":
        return "col"
    if len(shape) == 2 and shape[0] == "1":
        return "row"
    if len(shape) == 2:
        return "full"
    raise TtUnsupported("?", f"a tile of shape {list(shape)}")


# ------------------------------------------------------------------------------ expressions
@dataclass(eq=False)
class Node:
    """A tile value the compute kernel evaluates per tile: ``leaf`` (a CB tile: ``cb``, ``mode``
    ``tile`` = tile j of the block, ``first`` = tile 0, ``front`` = the front tile, popped after
    use), ``bcast_row``/``bcast_col`` (a leaf broadcast), ``scalar`` (an f32 runtime argument),
    ``binary``/``unary`` SFPU math, ``cmp`` (a comparison: 1.0 or 0.0), ``select`` (``where``:
    condition, picked, otherwise), ``colsum`` (REDUCE_COL of a full expression)."""

    op: str
    kids: list[Node] = field(default_factory=list)
    cb: int = -1
    mode: str = "tile"
    fn: str = ""
    scalar: SSAValue | None = None
    count: SSAValue | None = None
    n: SSAValue | None = None  # tile-level scalar: column tiles of a full/row value (None: one tile)
    base: SSAValue | None = None  # compute value: the CB index of tile 0 (a cached chunk of a block)
    mask: int = -1  # colsum: the CB of its row-mask tile

    def tiles(self) -> SSAValue | None:
        if self.n is not None:
            return self.n
        return next((k.tiles() for k in self.kids if k.op != "bcast_col" and k.tiles() is not None), None)

    def side_by_side(self) -> bool:
        """Whether its operands are evaluated into consecutive DST tiles (an SFPU op of several
        tiles: a binary op without a scalar, a comparison, a select)."""
        return self.op in ("cmp", "select") or (self.op == "binary" and not any(c.op == "scalar" for c in self.kids))

    def need(self) -> int:
        """DST tiles evaluating it takes (a column sum's operand is stored before its section)."""
        if self.op == "colsum":
            return 1
        if self.side_by_side():  # (the deepest first, each later one a slot further)
            return max(n + i for i, n in enumerate(sorted((c.need() for c in self.kids), reverse=True)))
        if self.kids:
            return max(c.need() for c in self.kids if c.op != "scalar")
        return 1


def extremum(a: Node, b: Node, larger: bool) -> Node:
    """``maximum(a, b)`` (``larger``) or ``minimum(a, b)`` of tiles as the oracle (numpy) and the
    C targets define them, ``a`` where ``a > b`` (``a < b``) or ``a`` is NaN, else ``b``: a
    ``where_tile`` picking by the comparison's mask or-ed with ``a != a`` (NaN propagates from
    either side; of equal values, -0.0 and +0.0 among them, ``b``). The SFPU's own
    ``binary_max_tile`` orders by the bits' sign and magnitude: a NaN wins or loses by its sign,
    and -0.0 < +0.0. As every comparison here, subnormals compare as zeros (docs/backend_ttmetal.md)."""
    return Node("select", [either(Node("cmp", [a, b], fn="gt" if larger else "lt"), Node("cmp", [a, a], fn="ne")),
                           a, b])


def either(a: Node, b: Node) -> Node:
    """The mask ``a | b`` of two masks (1.0 or 0.0 tiles): whether their sum is nonzero (``nez_tile``)."""
    return Node("unary", [Node("binary", [a, b], fn="add")], fn="nez")


def op_ident(kind: str, name: str) -> str:
    """The C++ name, in host code and kernels, of the op's argument ``name`` of ``kind``
    (``tensor`` or a scalar's): ``t_<name>`` or ``a_<name>`` (see :class:`KernelBuilder`)."""
    return ("t_" if kind == "tensor" else "a_") + name


class KernelBuilder:
    """Appends one kernel's ops; maps tile-level scalars to kernel values lazily (runtime args for
    dims, params and the core index, cloned arithmetic for the rest), one map per loop scope.

    The op's names get the prefix of their kind (:func:`op_ident`): runtime
    args ``d_<dim>`` and ``a_<arg>``, accessors ``t_<tensor>`` (with ``addr_``/``args_`` before
    them), which none of the compiler's own names (tiling parameters, ``core``, ``strip``,
    ``f<k>``, workspace regions, plans) starts with: a dim named ``rows`` and the ``rows``
    parameter, or a tensor named ``cores`` and the host's core set, stay apart."""

    def __init__(self, low: Lowering, role: str):
        self.low, self.role = low, role
        self.block = Block()
        self.args_block = Block()
        self.stack: list[Block] = [self.block]
        self.maps: list[dict[SSAValue, SSAValue]] = [{}]
        self.rt: dict[str, tuple[int, SSAValue]] = {}  # name -> (index, host value)
        self.rt_vals: dict[str, SSAValue] = {}
        self.top = False  # emit into the prologue (constant tiles, masks), with its own scalars
        self.top_block = Block()
        self.top_map: dict[SSAValue, SSAValue] = {}
        self.accessors: list[str] = []
        self.acc_vals: dict[str, str] = {}

    # -- emission
    def emit(self, op: Operation) -> Operation:
        if self.top:  # the prologue: before every other statement
            Rewriter.insert_op(op, InsertPoint.at_end(self.top_block))
        else:
            Rewriter.insert_op(op, InsertPoint.at_end(self.stack[-1]))
        return op

    def call(self, callee: str, *args: SSAValue | str | int, template: tuple[str, ...] = (),
             result: bool = False, rtype: str = "") -> SSAValue | None:
        op = self.emit(k.CallOp(callee, list(args), template, result, rtype))
        return op.results[0] if result else None

    def const(self, v: int) -> SSAValue:
        return self.emit(ir.ConstantOp(v, "i64")).results[0]

    def arith(self, cls, *vals: SSAValue) -> SSAValue:
        return self.emit(cls(*vals)).results[0]

    # -- runtime arguments
    def rt_arg(self, name: str, host: SSAValue) -> SSAValue:
        if name not in self.rt:
            self.rt[name] = (len(self.rt), host)
            arg = k.ArgOp(self.rt[name][0])
            Rewriter.insert_op(arg, InsertPoint.at_end(self.args_block))
            self.rt_vals[name] = arg.results[0]
        return self.rt_vals[name]

    # -- scalars
    def val(self, v: SSAValue) -> SSAValue:
        for m in [self.top_map] if self.top else reversed(self.maps):
            if v in m:
                return m[v]
        low = self.low
        op = v.owner
        if kind(v) == "float":
            r = self.rt_arg(f"f{len(self.rt)}", low.host_op(k.BitsOp(low.host_val(v))))
        elif v in low.arg_of:  # an integer or bool argument of the op
            r = self.rt_arg(op_ident("scalar", low.arg_of[v]), low.host_val(v))
        elif isinstance(op, Block):
            raise TtUnsupported(low.name, "a loop variable used outside its loop")
        elif isinstance(op, t.ParamOp):
            r = self.rt_arg(op.param.data, low.host_val(v))
        elif isinstance(op, ir.DimOp):
            r = self.rt_arg(f"d_{op.dim.data}", low.host_val(v))
        elif isinstance(op, t.BlockIdxOp):
            r = self.rt_arg("core", low.host_val(v))
        elif isinstance(op, t.BlockNumOp):
            r = self.rt_arg("cores", low.host_val(v))
        elif isinstance(op, SCALAR_OPS):
            c = op.clone_without_regions()
            for i, o in enumerate(op.operands):
                c.operands[i] = self.val(o)
            r = self.emit(c).results[0]
        else:
            raise TtUnsupported(low.name, f"the scalar op {op.name}")
        (self.top_map if self.top else self.maps[-1])[v] = r
        return r

    def accessor_named(self, name: str, page: int) -> str:
        """The kernel's TensorAccessor over the host's buffer ``name`` with pages of ``page`` B."""
        if name not in self.acc_vals:
            self._declare_accessor(name, name, page)
        return self.acc_vals[name]

    def accessor(self, gm: SSAValue, name: str) -> str:
        """The kernel's TensorAccessor over tensor argument (or workspace region) ``name``
        (declared once): its C++ name, the host's for the buffer (:func:`op_ident` for a tensor
        argument)."""
        if name not in self.acc_vals:
            ident = op_ident("tensor", name) if name in self.low.args else name
            self._declare_accessor(name, ident, self.low.page_bytes(gm))
        return self.acc_vals[name]

    def _declare_accessor(self, buffer: str, ident: str, page: int) -> None:
        addr = self.rt_arg(f"addr_{ident}", self.low.host_op(k.BufferAddrOp(buffer)))
        after = self.accessors[-1] if self.accessors else ""
        Rewriter.insert_op(k.AccessorOp(ident, after, page, addr), InsertPoint.at_end(self.args_block))
        self.accessors.append(ident)
        self.acc_vals[buffer] = ident

    @contextlib.contextmanager
    def prologue(self) -> Iterator[None]:
        """Emit into the prologue (before the kernel's loops), with its own scalars."""
        self.top = True
        try:
            yield
        finally:
            self.top = False

    # -- loops
    def open_loop(self, lo: SSAValue, hi: SSAValue, step: SSAValue, hint: str) -> SSAValue:
        loop = self.emit(t.ForOp(lo, hi, step, (), hint=hint))
        self.stack.append(loop.body.block)
        self.maps.append({})
        return loop.body.block.args[0]

    def close_loop(self) -> None:
        self.emit(t.YieldOp())
        self.stack.pop()
        self.maps.pop()

    def finish(self) -> Region:
        """The kernel body: runtime args and accessors first, then the code; unused scalars and
        empty loops removed."""
        _prune(self.block)
        _prune(self.top_block)
        body = Block()
        for o in [*self.args_block.ops, *self.top_block.ops, *self.block.ops]:
            o.detach()
            body.add_op(o)
        return Region(body)


def _prune(block: Block) -> None:
    changed = True
    while changed:
        changed = False
        for o in reversed(list(_ops(block))):
            if isinstance(o, t.ForOp) and _empty(o):
                o.detach()
                o.erase()
                changed = True
            elif _droppable(o) and all(not r.uses for r in o.results):
                o.detach()
                o.erase()
                changed = True


def _replace(node: Node, old: Node, new: Node) -> Node:
    """A copy of the tree ``node`` with the subtree ``old`` replaced by ``new``."""
    if node is old:
        return new
    if not node.kids:
        return node
    kids = [_replace(k, old, new) for k in node.kids]
    if all(a is b for a, b in zip(kids, node.kids, strict=True)):
        return node
    return Node(node.op, kids, cb=node.cb, mode=node.mode, fn=node.fn, scalar=node.scalar, count=node.count,
                n=node.n, mask=node.mask)


def _droppable(o: Operation) -> bool:
    """A scalar op or a ``get_*`` query (its result unused: nothing to keep)."""
    return isinstance(o, SCALAR_OPS) or (isinstance(o, k.CallOp) and bool(o.res) and o.callee.data.startswith("get_"))


def _push(ops: list[Operation], op: Operation) -> SSAValue:
    ops.append(op)
    return op.results[0]


def _ops(block: Block):
    for o in block.ops:
        yield o
        for r in o.regions:
            for b in r.blocks:
                yield from _ops(b)


def _empty(loop: t.ForOp) -> bool:
    return all(isinstance(o, (t.YieldOp, *SCALAR_OPS)) for o in loop.body.block.ops)


def host_region_val(block: Block, vals: dict[SSAValue, SSAValue], arg_of: dict[SSAValue, str],
                    leaf: Callable[[SSAValue], SSAValue]) -> Callable[[SSAValue], SSAValue]:
    """``val(x)``: tile-level scalar ``x`` re-evaluated in ``block`` (a host function's region: a
    scatter plan's row function, a row check) — ``vals`` first (fixed values), then arguments
    (``ttk.scalar_arg``), scalar ops cloned, anything else by ``leaf(x)`` (which adds its ops to
    ``block`` or raises)."""

    def val(x: SSAValue) -> SSAValue:
        if x in vals:
            return vals[x]
        op = x.owner
        if x in arg_of or isinstance(op, SCALAR_OPS):
            new = k.ScalarArgOp(arg_of[x], x.type) if x in arg_of else op.clone_without_regions()
            for i, o in enumerate(new.operands):
                new.operands[i] = val(o)
            block.add_op(new)
            vals[x] = new.results[0]
        else:
            vals[x] = leaf(x)
        return vals[x]

    return val


# ------------------------------------------------------------------------------ the lowering
class Lowering:
    """One resident ``tile.kernel`` -> one ``ttk.program`` (see the module docstring)."""

    def __init__(self, kernel: t.KernelOp, launch_base: int = 0, part: int = 0):
        self.k = kernel
        self.launch_base, self.part = launch_base, part
        self.name = kernel.sym_name.data
        self.args = dict(zip([a.data for a in kernel.arg_names.data], kernel.body.block.args, strict=True))
        self.arg_of = {v: n for n, v in self.args.items()}
        dv = {n: a.data for n, a in kernel.dtype_vars.data.items()}
        for d in dv.values():
            if dtypes.by_name(d).is_float and d not in TT_DTYPES:
                raise TtUnsupported(self.name, f"dtype {d} (TT-Metal computes bf16 and f32)")
        scatter = any(isinstance(o, t.SegmentsOp) for o in kernel.walk())
        self.is_chain = any(isinstance(o, t.TileMatmulOp) for o in kernel.walk())  # a matmul chain (chain.py)
        for o in kernel.walk():
            if o.parent_op() is not None and isinstance(o.parent_op(), t.TilingOp):
                continue
            if scatter and isinstance(o, SCATTER_OPS):
                continue
            if not isinstance(o, LOWERED):
                raise TtUnsupported(self.name, f"{o.name}" + (f" ({WHAT[type(o)]})" if type(o) in WHAT else ""))
        tiling = next(o for o in kernel.body.block.ops if isinstance(o, t.TilingOp))
        self.params = {o.param.data: o.value for o in tiling.body.block.ops if isinstance(o, t.SetParamOp)}
        self._tiles: dict[str, SSAValue] = {}
        self.cols = cols_dim(kernel)  # the op's dim the kernel's rows run along
        self.ws_done: set[str] = set()
        self._scratch = Block()  # tile-level scalars the lowering makes up (tile counts)

    # -- host side
    @staticmethod
    def arg_of_name(kernel: t.KernelOp, v: SSAValue) -> str:
        """The name of kernel argument ``v`` of ``kernel``."""
        return kernel.arg_names.data[kernel.body.block.args.index(v)].data

    def host_op(self, op: Operation) -> SSAValue:
        Rewriter.insert_op(op, InsertPoint.at_end(self.host))
        return op.results[0] if op.results else None  # type: ignore[return-value]

    def host_val(self, v: SSAValue) -> SSAValue:
        if v in self.hmap:
            return self.hmap[v]
        op = v.owner
        if v in self.arg_of and kind(v) in ("float", "index"):
            r = self.host_op(k.ScalarArgOp(self.arg_of[v], v.type))
        elif isinstance(op, Block):
            raise TtUnsupported(self.name, "a loop variable on the host")
        elif isinstance(op, t.ParamOp):
            r = self.host_val(self.params[op.param.data])
        elif isinstance(op, t.BlockIdxOp):
            r = self.host_op(k.CoreIndexOp())
        elif isinstance(op, t.BlockNumOp):
            r = self.cores
        elif isinstance(op, (*SCALAR_OPS, t.PlatformOp)) or (isinstance(op, HOST_MATH) and kind(v) == "float"):
            c = op.clone_without_regions()
            for i, o in enumerate(op.operands):
                c.operands[i] = self.host_val(o)
            r = self.host_op(c)
        else:
            raise TtUnsupported(self.name, f"the host scalar {op.name}")
        self.hmap[v] = r
        return r

    def hconst(self, v: int) -> SSAValue:
        return self.host_op(ir.ConstantOp(v, "i64"))

    def host_dim(self, dim: str) -> SSAValue:
        """Host: the size a shape dim stands for: a tiling parameter's (``tile.chunk``), a
        number, or the op's dim."""
        if param := t.dim_param(dim):
            return self.host_val(self.params[param])
        return self.hconst(int(dim)) if dim.isdigit() else self.host_op(ir.DimOp(dim))

    def host_tiles(self, dim: str) -> SSAValue:
        """Host: tiles along a shape dim, ceil(size / 32) (:meth:`host_dim`; a number folded)."""
        if dim.isdigit():
            return self.hconst((int(dim) + TILE - 1) // TILE)
        d = self.host_dim(dim)
        return self.host_op(ir.DivOp(self.host_op(ir.AddOp(d, self.hconst(TILE - 1))), self.hconst(TILE)))

    def layout(self, gm: SSAValue) -> str:
        """``row`` for a 1-d tensor and the workspace of partial rows (row vectors in pages of 32
        elements: a row value moves 32 elements per tile, not 1024), ``tile`` for the rest (a matmul
        chain's workspace too: products and blocks of ``G``)."""
        if len(gm.type.shape) == 1:
            return "row"
        if isinstance(gm.owner, t.WorkspaceOp):
            return "tile" if self.is_chain else "row"
        return "tile"

    def page_bytes(self, gm: SSAValue) -> int:
        """A tile (1,024 elements) or a row page (32 elements)."""
        return (TILE * TILE if self.layout(gm) == "tile" else TILE) * chain.elem_bytes(gm.type.dtype)

    def gm_format(self, gm: SSAValue) -> str:
        return FORMAT.get(gm.type.dtype, "Float32") if isinstance(gm.type, t.GmType) else "Float32"

    def gm_name(self, gm: SSAValue) -> str:
        if gm in self.arg_of:
            return self.arg_of[gm]
        if isinstance(gm.owner, t.WorkspaceOp):
            sym = f"ws{self.part or ''}_{gm.owner.offset.data}"  # one DRAM buffer per workspace region
            if sym not in self.ws_done:  # one page row per row of the region (row layout), or tiles
                rows, cols = gm.type.shape
                nrows = self.host_dim(rows)
                if self.layout(gm) == "tile":
                    nrows = self.host_op(ir.DivOp(self.host_op(ir.AddOp(nrows, self.hconst(TILE - 1))),
                                                  self.hconst(TILE)))
                tiles = self.host_op(ir.MulOp(nrows, self.host_tiles(cols)))
                tiles = self.host_op(ir.MaxOp(tiles, self.hconst(1)))  # (a buffer has at least one page)
                page = self.page_bytes(gm)
                self.host_op(k.WorkspaceOp(sym, self.host_op(ir.MulOp(tiles, self.hconst(page))), page))
                self.ws_done.add(sym)
            return sym
        raise TtUnsupported(self.name, "a global tensor that is not an argument or the workspace")

    # -- CBs
    def cb(self, fmt: str, pages: int | str | tuple[str, str], what: str, use: str = "own",
           host_pages: SSAValue | None = None) -> int:
        """A CB of ``pages`` tiles (a count, or the tiles of a tile dim symbol: ``max(ceil/32, 1)``,
        a dim may be 0; or ``(param, dim)``: the parameter times the dim's tiles; or, given
        ``host_pages``, that host value, ``pages`` naming it for reuse). ``use``: ``in``
        (the reader fills it), ``out`` (the writer drains it) or ``own`` (compute alone). A CB
        every kernel has emptied (a finished scope's, a drained output's) is reused for the same
        format, pages and use — the same use keeps the kernels' FIFO order on it — since a launch
        has 32."""
        key = (fmt, str(pages), use)
        if self.free.get(key):
            i = self.free[key].pop()
            cbop = self.cbs[i]
            cbop.what = StringAttr(f"{cbop.what.data}; {what}")
            return i
        if host_pages is not None:
            n = host_pages
        elif isinstance(pages, tuple):
            param, dim = pages
            tiles = self.host_op(ir.MaxOp(self.host_tiles(dim), self.hconst(1)))
            n = self.host_op(ir.MulOp(self.host_val(self.params[param]), tiles))
        else:
            n = self.hconst(pages) if isinstance(pages, int) else self.host_tiles(pages)
        n = self.host_op(ir.MaxOp(n, self.hconst(1)))
        i = len(self.cbs)
        if i >= 32:
            raise TtUnsupported(self.name, "more than 32 live circular buffers in one launch")
        self.cbs.append(k.CbOp(i, fmt, TILE_BYTES[fmt], n, what))
        self.cb_keys.append(key)
        return i

    def release(self, cb: int) -> None:
        """``cb`` is empty from here on in every kernel: later values may reuse it."""
        self.free.setdefault(self.cb_keys[cb], []).append(cb)

    # -- the program
    def program(self) -> k.ProgramOp:
        """An empty program with this kernel's parameters."""
        kinds = ["tensor" if isinstance(a.type, t.GmType) else "scalar" for a in self.k.body.block.args]
        prog = k.ProgramOp(self.name, list(self.args), kinds, [a.type for a in self.k.body.block.args],
                           self.k.dtype_vars)
        prog.boundary_casts = self.k.boundary_casts
        return prog

    def run(self) -> k.ProgramOp:
        prog = self.program()
        for ln in self.launches():
            prog.body.block.add_op(ln)
        return self.finish_program(prog, [self.k])

    def launches(self) -> list[k.LaunchOp]:
        """The kernel's launches, numbered from ``launch_base``."""
        if any(isinstance(o, t.SegmentsOp) for o in self.k.walk()):
            from opgen.ttmetal.scatter import lower_scatter

            return [lower_scatter(self)]
        phases: list[list[Operation]] = [[]]
        for op in self.k.body.block.ops:
            if isinstance(op, t.TilingOp):
                continue
            if isinstance(op, t.SyncAllOp):
                phases.append([])
            else:
                phases[-1].append(op)
        return [self.launch(self.launch_base + i, ops) for i, ops in enumerate(phases)]

    def finish_program(self, prog: k.ProgramOp, kernels: list[t.KernelOp],
                       checks: list[t.KernelOp] = ()) -> k.ProgramOp:
        """The layouts of the program's tensors; first of all on the host, the kernels' argument
        checks, then the checks on tensor data (``checks``: kernels of checks), then its return
        when every output of every part is empty."""
        from xdsl.dialects.builtin import ArrayAttr
        prog.attributes["layouts"] = ArrayAttr([StringAttr(self.layout(a) if isinstance(a.type, t.GmType) else "-")
                                                for a in self.k.body.block.args])
        first = prog.body.block.first_op
        assert isinstance(first, k.LaunchOp)
        self.host = first.body.block
        self.nothing_to_do(first, kernels)
        self.data_checks(first, kernels, checks)
        self.arg_checks(first)
        return prog

    def data_checks(self, first: k.LaunchOp, kernels: list[t.KernelOp], checks: list[t.KernelOp]) -> None:
        """Host, before the return when outputs are empty: the checks on tensor data (host row
        checks, opgen/ttmetal/chain.py), and for matmul chains that every tensor's element offsets
        fit the kernels' 32-bit arithmetic."""
        tmp = Block()
        self.host, self.hmap = tmp, {}
        for kn in checks:
            for rc in chain.row_checks(self, kn):
                self.host_op(rc)
        if any(isinstance(o, t.TileMatmulOp) for kn in kernels for o in kn.walk()):
            for name, a in self.args.items():
                if isinstance(a.type, t.GmType) and len(a.type.shape) == 2:
                    r, c = (self.host_tiles(d) for d in a.type.shape)
                    n = self.host_op(ir.MulOp(self.host_op(ir.MulOp(r, c)), self.hconst(TILE * TILE)))
                    self.host_op(k.CheckOp(self.host_op(ir.CmpOp("le", n, self.hconst(2**32 - 1))),
                                           f"{name} has more than 2^32 - 1 elements (kernels index elements in "
                                           "32 bits)", arg=True))
        anchor = first.body.block.first_op
        for o in list(tmp.ops):
            o.detach()
            Rewriter.insert_op(o, InsertPoint.before(anchor) if anchor else InsertPoint.at_end(first.body.block))
        self.host = first.body.block

    def arg_checks(self, first: k.LaunchOp) -> None:
        """The kernel's ``opgen.check``s on its scalar arguments, as host checks before anything."""
        checks = [o for o in self.k.body.block.ops if isinstance(o, ir.CheckOp)]
        if not checks:
            return
        tmp = Block()
        self.host, self.hmap = tmp, {}
        for c in checks:
            self.host_op(k.CheckOp(self.host_val(c.operands[0]), c.message.data, arg=True))
        anchor = first.body.block.first_op
        for o in list(tmp.ops):
            o.detach()
            Rewriter.insert_op(o, InsertPoint.before(anchor) if anchor else InsertPoint.at_end(first.body.block))
        self.host = first.body.block

    def nothing_to_do(self, first: k.LaunchOp, kernels: list[t.KernelOp]) -> None:
        """Host, first of all: return when every output (a tensor some copy_out writes) is empty."""
        outs = {self.arg_of_name(kn, o.dst) for kn in kernels for o in kn.walk()
                if isinstance(o, t.CopyOutOp) and isinstance(o.dst.owner, Block)}
        conds = []
        for name in sorted(outs):
            zero = [ir.CmpOp("eq", ir.DimOp(d).results[0], ir.ConstantOp(0, "i64").results[0]) for d in
                    self.args[name].type.shape if not d.isdigit()]
            conds.append(zero)
        ops: list[Operation] = []
        all_empty = None
        for zero in conds:
            any_zero = None
            for z in zero:
                ops += [z.operands[0].owner, z.operands[1].owner, z]
                any_zero = z.results[0] if any_zero is None else _push(ops, ir.OrOp(any_zero, z.results[0]))
            if any_zero is None:
                return  # an output of fixed size: never empty
            all_empty = any_zero if all_empty is None else _push(ops, ir.AndOp(all_empty, any_zero))
        if all_empty is None:
            return
        ops.append(k.ReturnIfOp(all_empty))
        anchor = first.body.block.first_op
        for o in ops:
            Rewriter.insert_op(o, InsertPoint.before(anchor) if anchor else InsertPoint.at_end(first.body.block))

    def launch(self, index: int, ops: list[Operation]) -> k.LaunchOp:
        dist = [o for o in ops if isinstance(o, t.ForOp) and isinstance(o.lo.owner, t.BlockIdxOp)]
        if len(dist) != 1:
            raise TtUnsupported(self.name, "a launch without exactly one loop over the cores")
        launch = self.begin_launch(index, lambda: self.host_val(dist[0].hi))
        for op in ops:
            self.lower_op(op)
        return self.end_launch(launch, index)

    def begin_launch(self, index: int, units) -> k.LaunchOp:
        """A new launch: its host block, CB plan and three kernel builders; ``units()`` gives the
        host value of how many units its cores share."""
        launch = k.LaunchOp(index)
        self.host = launch.body.block
        self.hmap: dict[SSAValue, SSAValue] = {}
        self.cbs: list[k.CbOp] = []
        self.cb_keys: list[tuple[str, str, str]] = []
        self.free: dict[tuple[str, str, str], list[int]] = {}
        self.dbuf: set[int] = set()  # CBs the reader fills from DRAM
        self.cores = self.host_op(k.CoresOp(units()))
        self.r = KernelBuilder(self, "reader")
        self.c = KernelBuilder(self, "compute")
        self.w = KernelBuilder(self, "writer")
        self.b = [self.r, self.c, self.w]
        self.env: dict[SSAValue, Node] = {}
        self.scopes: list[list[tuple[int, SSAValue | None]]] = [[]]  # CBs compute pops at scope end
        self.one_cb = -1
        self.masks: list[dict[tuple[str, SSAValue], int]] = [{}]  # per scope: mask CBs by count
        self.copied: set[int] = set()
        self.scratch: dict[str, int] = {}  # CBs read by copy_tile / unary_bcast: unpacked to DST in f32
        self.fence_cb = self.scratch_cb = self.panel_cb = -1  # matmul chains (opgen/ttmetal/chain.py)
        self.scratch_pages = 0
        self.scratch_l1: SSAValue | None = None
        self.cached: dict[int, int] = {}  # cache number (opgen/ttmetal/cache.py) -> its CB
        self.at_top(self.c, "compute_kernel_hw_startup", "tt::CBIndex::c_0", "tt::CBIndex::c_0")
        return launch

    def end_launch(self, launch: k.LaunchOp, index: int) -> k.LaunchOp:
        """Pop what is left, plan L1 and add the CBs and kernels to ``launch``."""
        chain.end_scratch(self)
        self.close_scope()
        self.plan_l1(launch, index)
        for b in self.b:
            body = b.finish()
            names = sorted(b.rt, key=lambda n: b.rt[n][0])
            launch.body.block.add_op(k.KernelOp(
                b.role, f"{b.role}_{index}.cpp", names, [b.rt[n][1] for n in names], b.accessors,
                b.role == "compute", body))
        return launch

    def plan_l1(self, launch: k.LaunchOp, index: int) -> None:
        """Host: the CBs' L1 must fit the budget (else the launch cannot run); the CBs the reader
        fills from DRAM get twice their pages (double buffering: the reader fetches the next
        block while compute works on this one) when that still fits."""
        chain.bind_panel_pages(self)  # (runtime arguments naming a CB's final size)
        zero = self.hconst(0)
        need, extra = zero, zero
        for cb in self.cbs:
            nb = self.host_op(ir.MulOp(cb.pages, self.hconst(cb.page.data)))
            need = self.host_op(ir.AddOp(need, nb))
            if cb.index.data in self.dbuf:
                extra = self.host_op(ir.AddOp(extra, nb))
        budget = self.hconst(L1_BUDGET)
        ok = self.host_op(ir.CmpOp("le", need, budget))
        self.host_op(k.CheckOp(ok, f"the CBs of launch {index} need more than {L1_BUDGET} B of L1 per core "
                                   "(rows too long for this schedule: the next one takes over)"))
        fits2 = self.host_op(ir.CmpOp("le", self.host_op(ir.AddOp(need, extra)), budget))
        depth = self.host_op(ir.SelectOp(fits2, self.hconst(2), self.hconst(1)))
        for cb in self.cbs:
            if cb.index.data in self.copied and cb.format.data == "Float32":
                cb.attributes["unpack_to_dest_fp32"] = UnitAttr()
            if cb.index.data in self.dbuf:
                cb.operands[0] = self.host_op(ir.MulOp(cb.pages, depth))
                cb.what = StringAttr(cb.what.data + "; double-buffered when L1 allows")
            launch.body.block.add_op(cb)

    # -- scopes (compute pops the CBs of a loop iteration at its end)
    def close_scope(self) -> None:
        self.masks.pop()
        for cb, _ in reversed(self.scopes[-1]):
            self.release(cb)
        for cb, n in reversed(self.scopes.pop()):
            self.c.call("cb_pop_front", f"tt::CBIndex::c_{cb}", "1" if n is None else n)

    def all_val(self, v: SSAValue) -> list[SSAValue]:
        return [b.val(v) for b in self.b]

    # -- ops
    def lower_op(self, op: Operation) -> None:
        if isinstance(op, (t.ParamOp, t.BlockIdxOp, t.BlockNumOp, t.WorkspaceOp, t.YieldOp)):
            return
        if isinstance(op, ir.CheckOp):
            if op.parent_op() is not self.k:
                raise TtUnsupported(self.name, "a check inside a loop (on tensor data)")
            return  # (arg_checks: on the host, before anything)
        if isinstance(op, SCALAR_OPS) and kind(op.results[0]) in ("index", "float"):
            return
        if isinstance(op, t.ForOp):
            return self.lower_for(op)
        if isinstance(op, t.CopyInOp):
            return self.copy_in(op)
        if isinstance(op, t.CopyOutOp):
            return self.copy_out(op)
        if isinstance(op, t.ReduceOp):
            return self.reduce(op)
        if isinstance(op, t.TileMatmulOp):
            return chain.matmul(self, op)
        if isinstance(op, t.FenceOp):
            return chain.fence(self)
        if isinstance(op, (t.LoadOp, t.LoadBitOp, t.SetAtOp)):
            raise TtUnsupported(self.name, f"{op.name} outside a tile built element by element")
        if isinstance(op, ir.BroadcastOp):
            src = op.operands[0]
            sk, rk = kind(src), kind(op.results[0])
            if sk == "float":
                self.env[op.results[0]] = Node("scalar", scalar=src)
            elif sk == rk:
                self.env[op.results[0]] = self.env[src]
            elif sk == "row" and rk == "full":
                self.env[op.results[0]] = Node("bcast_row", [self.env[src]])
            elif sk == "col" and rk == "full":
                self.env[op.results[0]] = Node("bcast_col", [self.env[src]])
            else:
                raise TtUnsupported(self.name, f"a broadcast from {sk} to {rk}")
            return
        if isinstance(op, ir.CastOp):
            self.env[op.results[0]] = self.env[op.operands[0]]  # compute is f32; the pack converts
            if ir.tensor_type(op.results[0]).dtype == "bf16" and kind(op.results[0]) in ("full", "row") and \
                    any(not isinstance(u.operation, t.CopyOutOp) for u in op.results[0].uses):
                self.round_bf16(op.results[0])  # used in math: rounded here, as the pack would
            return
        if isinstance(op, ir.CmpOp):
            self.env[op.results[0]] = Node("cmp", [self.node(op.lhs), self.node(op.rhs)], fn=op.predicate.data)
            return
        if isinstance(op, (ir.AndOp, ir.OrOp)):
            a, b = (self.node(o) for o in op.operands)
            self.env[op.results[0]] = Node("binary", [a, b], fn="mul") if isinstance(op, ir.AndOp) else either(a, b)
            return
        if isinstance(op, ir.NotOp):
            self.env[op.results[0]] = Node("unary", [self.node(op.operands[0])], fn="eqz")
            return
        if isinstance(op, ir.SelectOp):
            self.env[op.results[0]] = Node("select", [self.node(o) for o in op.operands])
            return
        if type(op) in SFPU_BINARY:
            a, b = (self.node(o) for o in op.operands)
            self.env[op.results[0]] = Node("binary", [a, b], fn=SFPU_BINARY[type(op)])
            return
        if isinstance(op, (ir.MaxOp, ir.MinOp)):
            a, b = (self.node(o) for o in op.operands)
            self.env[op.results[0]] = extremum(a, b, isinstance(op, ir.MaxOp))
            return
        if isinstance(op, HOST_MATH) and kind(op.results[0]) == "float":
            return  # (a float scalar: its users read it through node(), from the host: host_val)
        if type(op) in SFPU_UNARY:
            self.env[op.results[0]] = Node("unary", [self.env[op.operands[0]]], fn=SFPU_UNARY[type(op)])
            return
        raise TtUnsupported(self.name, f"the primitive {op.name}")

    def node(self, v: SSAValue) -> Node:
        if kind(v) == "float":
            return Node("scalar", scalar=v)
        return self.env[v]

    def round_bf16(self, v: SSAValue) -> None:
        """``v`` (a cast to bf16 that later math reads) stored into a bf16 CB — the packer rounds —
        and read back from it: every tile of its capacity, so that no reservation wraps."""
        dim = ir.tensor_type(v).shape[1]
        cb = self.cb("Float16_b", dim, "rounded to bf16 (read by later math)")
        cap = self.c.val(self.cap_tiles(dim))
        self.store_tiles(self.env[v], cb, cap)
        self.copied.add(cb)
        self.c.call("cb_wait_front", f"tt::CBIndex::c_{cb}", cap)
        self.scopes[-1].append((cb, cap))
        self.env[v] = Node("leaf", cb=cb, mode="tile", n=self.env[v].tiles())

    def lower_for(self, op: t.ForOp) -> None:
        if chain.is_one_hot(op):
            return chain.one_hot(self, op)
        carried = list(op.inits)
        accs = []
        for init in carried:
            kd = kind(init)
            if kd not in ("row", "col"):
                raise TtUnsupported(self.name, f"a loop-carried {kd} value")
            pages = ir.tensor_type(init).shape[1] if kd == "row" else 1
            acc = self.cb("Float32", pages, f"loop-carried {kd} (sums)")
            self.store_tiles(self.env[init], acc, self.carried_tiles(init))  # the initial value
            accs.append(acc)
        bounds = zip(self.all_val(op.lo), self.all_val(op.hi), self.all_val(op.step), strict=True)
        ivs = [b.open_loop(*bv, op.iv.name_hint or "i") for b, bv in zip(self.b, bounds, strict=True)]
        for b, iv in zip(self.b, ivs, strict=True):
            b.maps[-1][op.iv] = iv
        self.scopes.append([])
        self.masks.append({})
        for arg, acc in zip(op.body.block.args[1:], accs, strict=True):
            self.env[arg] = Node("leaf", cb=acc, mode="front")
        for o in op.body.block.ops:
            self.lower_op(o)
        y = op.body.block.last_op
        assert isinstance(y, t.YieldOp)
        for v, acc, init in zip(y.values, accs, carried, strict=True):
            self.store_tiles(self.env[v], acc, self.carried_tiles(init))
        self.close_scope()
        for b in self.b:
            b.close_loop()
        for res, acc, init in zip(op.results, accs, carried, strict=True):
            # the final value: read as often as needed, popped at the end of the enclosing scope
            n = self.carried_tiles(init)
            self.c.call("cb_wait_front", f"tt::CBIndex::c_{acc}", n)
            self.scopes[-1].append((acc, n))
            row = kind(init) == "row"
            self.env[res] = Node("leaf", cb=acc, mode="tile" if row else "first",
                                 n=self.tiles(ir.tensor_type(init).shape[1]) if row else None)

    def carried_tiles(self, init: SSAValue) -> SSAValue:
        """Compute: the tiles of a loop-carried value (its type's column dim; one for a col)."""
        if kind(init) == "col":
            return self.c.const(1)
        dim = ir.tensor_type(init).shape[1]
        if dim not in (self.cols, t.COL_CHUNK):
            raise TtUnsupported(self.name, f"a loop-carried row of {dim} columns")
        return self.c.val(self.tiles(dim))

    def cap_tiles(self, dim: str) -> SSAValue:
        """A tile-level scalar: the pages of a CB holding ``dim`` columns of tiles,
        ``max(ceil(X / 32), 1)`` for X the dim or the chunk parameter. Copies reserve, push, wait
        and pop all of them even when fewer tiles are valid (the last chunk of a row), so that no
        reservation wraps the CB."""
        key = f"cap:{dim}"
        if key not in self._tiles:
            param = t.dim_param(dim)
            x = t.ParamOp(param) if param else ir.DimOp(dim)
            c1 = ir.ConstantOp(1, "i64")
            self._scratch.add_op(x)
            self._scratch.add_op(c1)
            n = self.ncols_tiles(x.results[0])
            mx = ir.MaxOp(n, c1.results[0])
            self._scratch.add_op(mx)
            self._tiles[key] = mx.results[0]
        return self._tiles[key]

    def ncols_tiles(self, ncols: SSAValue) -> SSAValue:
        """A tile-level scalar: ``ceil(ncols / 32)`` (the tiles a copy or a reduction spans)."""
        c31, c32 = ir.ConstantOp(TILE - 1, "i64"), ir.ConstantOp(TILE, "i64")
        add = ir.AddOp(ncols, c31.results[0])
        div = ir.DivOp(add.results[0], c32.results[0])
        for o in (c31, c32, add, div):
            self._scratch.add_op(o)
        return div.results[0]

    def tiles(self, dim: str) -> SSAValue:
        """A tile-level scalar (built in a scratch block, cloned into kernels on use): tiles along
        tile dim ``dim`` — ``ceil(D / 32)`` of the op's dim, 1 for a 32-column chunk
        (``tile.col_chunk``)."""
        if dim not in self._tiles:
            if dim == t.COL_CHUNK:
                ops = [ir.ConstantOp(1, "i64")]
            elif dim.isdigit():  # (a chain's workspace: a fixed number of columns)
                ops = [ir.ConstantOp((int(dim) + TILE - 1) // TILE, "i64")]
            else:
                d, c31, c32 = ir.DimOp(dim), ir.ConstantOp(TILE - 1, "i64"), ir.ConstantOp(TILE, "i64")
                add = ir.AddOp(d.results[0], c31.results[0])
                ops = [d, c31, c32, add, ir.DivOp(add.results[0], c32.results[0])]
            for o in ops:
                self._scratch.add_op(o)
            self._tiles[dim] = ops[-1].results[0]
        return self._tiles[dim]

    # -- copies
    def tile_row(self, b: KernelBuilder, gm: SSAValue, row0: SSAValue, value: SSAValue) -> SSAValue:
        """The first page of ``value``'s row in ``gm``: full values are 32-row blocks of a tile
        layout; a row of a row-layout tensor is ``Wt`` pages."""
        shape = gm.type.shape
        if len(shape) == 1:
            return b.const(0)
        wt = b.val(self.tiles(shape[1]))
        r = b.val(row0)
        if kind(value) == "full":
            r = b.arith(ir.DivOp, r, b.const(TILE))
        return b.arith(ir.MulOp, r, wt)

    def copy_in(self, op: t.CopyInOp) -> None:
        v = op.results[0]
        kd = kind(v)
        if kd == "col":
            return chain.copy_in_col(self, op)
        if kd not in ("full", "row"):
            raise TtUnsupported(self.name, f"copying in a {kd} tile")
        if "cache" in op.attributes:
            return self.copy_in_cached(op, op.attributes["cache"].data)
        gm = op.src
        fmt = self.gm_format(gm)
        name = self.gm_name(gm)
        cb = self.cb(fmt, ir.tensor_type(v).shape[1], f"{name} ({kd})", "in")
        if len(self.scopes) > 1:  # read per loop iteration (not once per core)
            self.dbuf.add(cb)
        self.read_chunk(op, cb)
        cap = self.cap_tiles(ir.tensor_type(v).shape[1])
        cn = self.c.val(cap)
        self.c.call("cb_wait_front", f"tt::CBIndex::c_{cb}", cn)
        self.scopes[-1].append((cb, cn))
        self.env[v] = Node("leaf", cb=cb, mode="tile", n=self.ncols_tiles(op.ncols))

    def copy_in_cached(self, op: t.CopyInOp, key: int) -> None:
        """A copy the cache-rows-tt pass numbered (opgen/ttmetal/cache.py). The first walk's fills
        chunk ``c`` of one CB that holds the block's every chunk (``chunks`` x the chunk's tiles):
        the reader pushes each chunk; compute waits for the cumulative count (the documented use
        of ``cb_wait_front`` without pops) and reads tile ``c * chunk_tiles + j``. The second
        walk's twin only reads the same tiles back. The block's scope pops the whole CB."""
        v = op.results[0]
        c = self.c
        cap = self.cap_tiles(ir.tensor_type(v).shape[1])
        base = c.arith(ir.DivOp, c.val(op.col0), c.const(TILE))
        if key not in self.cached:
            name = self.gm_name(op.src)
            cb = self.cb(self.gm_format(op.src), ("chunks", ir.tensor_type(v).shape[1]),
                         f"{name} (the block's chunks, read once for both walks)", "in")
            self.cached[key] = cb
            self.read_chunk(op, cb)
            c.call("cb_wait_front", f"tt::CBIndex::c_{cb}", c.arith(ir.AddOp, base, c.val(cap)))
            total = self.top_val(c, self.chunks_tiles(cap))
            self.scopes[-2].append((cb, total))
        self.env[v] = Node("leaf", cb=self.cached[key], mode="tile", n=self.ncols_tiles(op.ncols), base=base)

    def chunks_tiles(self, cap: SSAValue) -> SSAValue:
        """A tile-level scalar: ``chunks`` x ``cap`` (the pages of a cached block)."""
        p = t.ParamOp("chunks")
        self._scratch.add_op(p)
        mul = ir.MulOp(p.results[0], cap)
        self._scratch.add_op(mul)
        return mul.results[0]

    @staticmethod
    def top_val(b: KernelBuilder, v: SSAValue) -> SSAValue:
        """Kernel ``b``'s value of tile-level scalar ``v``, computed in its prologue (so that it
        is defined in every scope)."""
        with b.prologue():
            return b.val(v)

    def read_chunk(self, op: t.CopyInOp, cb: int) -> None:
        """Reader: the copy's tiles (or row-vector pages) into ``cb``: reserve the CB's chunk
        capacity, read, push it."""
        v, gm = op.results[0], op.src
        kd, fmt, name = kind(v), self.gm_format(gm), self.gm_name(gm)
        r = self.r
        acc = r.accessor(gm, name)
        tiles = self.ncols_tiles(op.ncols)
        cap = self.cap_tiles(ir.tensor_type(v).shape[1])
        n = r.val(tiles)
        first = r.arith(ir.AddOp, self.tile_row(r, gm, op.row0, v), r.arith(ir.DivOp, r.val(op.col0), r.const(TILE)))
        cbn = f"tt::CBIndex::c_{cb}"
        r.call("cb_reserve_back", cbn, r.val(cap))
        base = r.call("get_write_ptr", cbn, result=True)
        j = r.open_loop(r.const(0), n, r.const(1), "j")
        page, l1 = r.arith(ir.AddOp, first, j), r.arith(ir.AddOp, base, r.arith(ir.MulOp, j, r.const(TILE_BYTES[fmt])))
        if self.layout(gm) == "tile":
            r.call("noc_async_read_page", page, acc, l1)
        else:
            if kd != "row":
                raise TtUnsupported(self.name, "a full tile of a row-layout tensor")
            for face, off in self.row0_faces(fmt):  # row 0 of faces 0 and 1 (the rest: never read)
                src = r.call(f"{acc}.get_noc_addr", page, str(off), result=True, rtype="uint64_t")
                r.call("noc_async_read", src, r.arith(ir.AddOp, l1, r.const(face)), str(self.half(fmt)))
        r.close_loop()
        r.call("noc_async_read_barrier")
        r.call("cb_push_back", cbn, r.val(cap))

    def copy_out(self, op: t.CopyOutOp) -> None:
        v = op.value
        kd = kind(v)
        if kd not in ("full", "row"):
            raise TtUnsupported(self.name, f"copying out a {kd} tile")
        gm = op.dst
        fmt = self.gm_format(gm)
        name = self.gm_name(gm)
        out = self.cb(fmt, 2, f"{name} (out)", "out")
        tiles = self.ncols_tiles(op.ncols)
        self.store_tiles(self.env[v], out, self.c.val(tiles))
        w = self.w
        acc = w.accessor(gm, name)
        n = w.val(tiles)
        first = w.arith(ir.AddOp, self.tile_row(w, gm, op.row0, v), w.arith(ir.DivOp, w.val(op.col0), w.const(TILE)))
        cbn = f"tt::CBIndex::c_{out}"
        j = w.open_loop(w.const(0), n, w.const(1), "j")
        w.call("cb_wait_front", cbn, "1")
        page, l1 = w.arith(ir.AddOp, first, j), w.call("get_read_ptr", cbn, result=True)
        if self.layout(gm) == "tile":
            w.call("noc_async_write_page", page, acc, l1)
        else:
            if kd != "row":
                raise TtUnsupported(self.name, "a full tile into a row-layout tensor")
            for face, off in self.row0_faces(fmt):
                dst = w.call(f"{acc}.get_noc_addr", page, str(off), result=True, rtype="uint64_t")
                w.call("noc_async_write", w.arith(ir.AddOp, l1, w.const(face)), dst, str(self.half(fmt)))
        w.call("noc_async_writes_flushed")
        w.call("cb_pop_front", cbn, "1")
        w.close_loop()
        w.call("noc_async_write_barrier")
        self.release(out)  # drained by the writer before any later use

    @staticmethod
    def half(fmt: str) -> int:
        """Bytes of 16 elements (one row of a face)."""
        return TILE_BYTES[fmt] // 64

    def row0_faces(self, fmt: str) -> list[tuple[int, int]]:
        """(L1 offset in the tile, byte offset in the 32-element page) of row 0 of faces 0 and 1."""
        return [(0, 0), (TILE_BYTES[fmt] // 4, self.half(fmt))]

    # -- reader-built constant tiles
    def scaler(self) -> int:
        if self.one_cb < 0:
            self.one_cb = self.cb("Float16_b", 1, "reduce scaler (1.0)", "in")
            self.at_top(self.r, "opgen_tt_fill_scaler", f"tt::CBIndex::c_{self.one_cb}")
            self.at_top(self.c, "cb_wait_front", f"tt::CBIndex::c_{self.one_cb}", "1")
            self.scopes[0].append((self.one_cb, None))
        return self.one_cb

    def col_mask(self, count: SSAValue) -> int:
        """Two mask tiles for a row sum over ``count`` columns: all ones (every tile but the
        last), then the last tile's valid columns. Built by the reader where the sum is (once per
        loop iteration there), popped at the end of that iteration."""
        key = ("col", count)
        if key not in self.masks[-1]:
            cb = self.cb("Float16_b", 2, "column masks (all ones, last tile)", "in")
            cbn = f"tt::CBIndex::c_{cb}"
            self.r.call("opgen_tt_fill_col_masks", cbn, self.r.val(self.last_cols(count)))
            self.c.call("cb_wait_front", cbn, "2")
            self.scopes[-1].append((cb, "2"))
            self.masks[-1][key] = cb
        return self.masks[-1][key]

    def last_cols(self, count: SSAValue) -> SSAValue:
        """A tile-level scalar: the valid columns of the last of ``count``'s tiles,
        ``count - 32 * (ceil(count / 32) - 1)``."""
        c1, c32 = ir.ConstantOp(1, "i64"), ir.ConstantOp(TILE, "i64")
        sub = ir.SubOp(self.ncols_tiles(count), c1.results[0])
        mul = ir.MulOp(sub.results[0], c32.results[0])
        last = ir.SubOp(count, mul.results[0])
        for o in (c1, c32, sub, mul, last):
            self._scratch.add_op(o)
        return last.results[0]

    def _dim(self, dim: str) -> SSAValue:
        d = ir.DimOp(dim)
        self._scratch.add_op(d)
        return d.results[0]

    @staticmethod
    def at_top(b: KernelBuilder, callee: str, *args) -> None:
        """A call at the top level of kernel ``b``, before its loops (its scalars too)."""
        with b.prologue():
            b.call(callee, *(b.val(a) if isinstance(a, SSAValue) else a for a in args))

    def row_mask_cb(self, count: SSAValue) -> int:
        """A CB with one mask tile per row block: 1.0 in the block's ``count`` valid rows."""
        key = ("row", count)
        if key not in self.masks[-1]:
            cb = self.cb("Float16_b", 1, "row mask (valid rows of the block)", "in")
            cbn = f"tt::CBIndex::c_{cb}"
            self.r.call("opgen_tt_fill_row_mask", cbn, self.r.val(count))
            self.c.call("cb_wait_front", cbn, "1")
            self.scopes[-1].append((cb, None))
            self.masks[-1][key] = cb
        return self.masks[-1][key]

    def reduce(self, op: t.ReduceOp) -> None:
        if op.kind.data != "sum":
            raise TtUnsupported(self.name, f"a {op.kind.data} reduction")
        x = self.env[op.x]
        if op.axis.data == 0:
            self.env[op.results[0]] = Node("colsum", [x], count=op.count, mask=self.row_mask_cb(op.count))
            return
        if kind(op.x) != "full":
            raise TtUnsupported(self.name, f"a row sum of a {kind(op.x)} tile")
        c = self.c
        one = self.scaler()
        mask = self.col_mask(op.count)
        n = c.val(self.ncols_tiles(op.count))
        self.materialize_cols(x)
        red = self.shared("row-sum operand (hi, mid, lo)", "Float32", SPLIT * REDUCE_CHUNK)
        out = self.cb("Float32", 1, "row sums (column 0)")
        redn, onen, outn = (f"tt::CBIndex::c_{i}" for i in (red, one, out))
        self.zero_tile(out)
        # chunks of REDUCE_CHUNK tiles: the operand's tiles (pad columns of the last masked),
        # their row sums in DST, plus the running sum
        c0 = c.open_loop(c.const(0), n, c.const(REDUCE_CHUNK), "c")
        m = c.arith(ir.MinOp, c.arith(ir.SubOp, n, c0), c.const(REDUCE_CHUNK))
        jj = c.open_loop(c.const(0), m, c.const(1), "j")
        j = c.arith(ir.AddOp, c0, jj)
        is_last = c.emit(ir.CmpOp("eq", c.arith(ir.AddOp, j, c.const(1)), n)).results[0]
        self.section(x, red, j, mask=(mask, c.arith(ir.SelectOp, is_last, c.const(1), c.const(0))), split=True)
        c.close_loop()
        c.call("cb_wait_front", outn, "1")
        c.call("tile_regs_acquire")
        c.call("reconfig_data_format", redn, onen)
        c.call("reduce_init", redn, onen, outn, template=("PoolType::SUM", "ReduceDim::REDUCE_ROW"))
        c.open_loop(c.const(0), m, c.const(1), "j")  # one tile at a time: no wait wraps the CB
        c.call("cb_wait_front", redn, str(SPLIT))
        for part in range(SPLIT):
            c.call("reduce_tile", redn, onen, str(part), "0", "0", template=("PoolType::SUM", "ReduceDim::REDUCE_ROW"))
        c.call("cb_pop_front", redn, str(SPLIT))
        c.close_loop()
        c.call("reduce_uninit")
        self.copied.add(out)
        for call in (("reconfig_data_format_srca", outn), ("copy_init", outn), ("copy_tile", outn, "0", "1"),
                     ("add_binary_tile_init",), ("add_binary_tile", "0", "1", "0"), ("tile_regs_commit",)):
            c.call(*call)
        c.call("cb_pop_front", outn, "1")
        self.pack(out)
        c.close_loop()
        c.call("cb_wait_front", outn, "1")
        self.scopes[-1].append((out, None))
        self.env[op.results[0]] = Node("leaf", cb=out, mode="first")

    def shared(self, what: str, fmt: str, pages: int) -> int:
        """A scratch CB every user empties before the next one fills it (one per launch)."""
        if what not in self.scratch:
            self.scratch[what] = self.cb(fmt, pages, what)
        return self.scratch[what]

    def pack(self, cb: int, slots: tuple[int, ...] = (0,)) -> None:
        """The end of a section: DST ``slots`` packed, in order, into ``cb``."""
        c, cbn, n = self.c, f"tt::CBIndex::c_{cb}", str(len(slots))
        c.call("tile_regs_wait")
        c.call("cb_reserve_back", cbn, n)
        c.call("pack_reconfig_data_format", cbn)
        for s in slots:
            c.call("pack_tile", str(s), cbn)
        c.call("cb_push_back", cbn, n)
        c.call("tile_regs_release")

    def zero_tile(self, cb: int) -> None:
        """A section pushing a tile of zeros into ``cb``."""
        self.c.call("tile_regs_acquire")
        self.c.call("fill_tile_init")
        self.c.call("fill_tile_bitcast", "0", "0")
        self.c.call("tile_regs_commit")
        self.pack(cb)

    # -- sections
    def materialize_cols(self, node: Node) -> None:
        """Store every col expression a broadcast in ``node`` reads into a one-page CB first."""
        for kid in node.kids:
            self.materialize_cols(kid)
        if node.op == "bcast_col" and node.kids[0].op != "leaf":
            cb = self.cb("Float32", 1, "per-row values")
            self.section(node.kids[0], cb, self.c.const(0))
            self.c.call("cb_wait_front", f"tt::CBIndex::c_{cb}", "1")
            self.scopes[-1].append((cb, None))
            node.kids[0] = Node("leaf", cb=cb, mode="first")

    def store_tiles(self, node: Node, cb: int, n: SSAValue) -> None:
        """Evaluate ``node`` for column tiles 0..n-1 and push each into ``cb``."""
        self.materialize_cols(node)
        c = self.c
        j = c.open_loop(c.const(0), n, c.const(1), "j")
        self.section(node, cb, j)
        c.close_loop()

    def section(self, node: Node, cb: int, j: SSAValue, mask: tuple[int, SSAValue] | None = None,
                split: bool = False) -> None:
        """One DST section: ``node``'s tile j into slot 0 (masked by mask tile ``mask[1]`` of CB
        ``mask[0]``), packed into ``cb``; the front tiles it read are popped. ``split``: a
        reduction's operand, packed as two tiles hi + lo (below)."""
        c = self.c
        pre: list[tuple[Node, int]] = []
        self.colsum_operands(node, j, pre)
        node, spills = self.spill(node, j)
        pops: list[tuple[int, int]] = []
        c.call("tile_regs_acquire")
        self.eval(node, 0, j, pops)
        if mask:
            mn = f"tt::CBIndex::c_{mask[0]}"
            c.call("reconfig_data_format_srca", mn)
            c.call("copy_init", mn)
            c.call("copy_tile", mn, mask[1], "1")
            c.call("mask_tile_init")
            c.call("mask_tile", "0", "1")
        if split:
            self.split_hi_lo()
        c.call("tile_regs_commit")
        for p, n in pops:
            c.call("cb_pop_front", f"tt::CBIndex::c_{p}", str(n))
        self.pack(cb, (1, 2, 0) if split else (0,))
        for sp in spills:
            self.release(sp)

    def spill(self, node: Node, j: SSAValue) -> tuple[Node, list[int]]:
        """``node`` within the DST slots: while it needs more than DST_SLOTS tiles, the subtree of
        its deepest operand chain that fits is computed first, in its own section, into a one-page
        CB, and read back as a leaf (a rewritten copy of the tree; shared nodes are untouched).
        Returns the tree and the spill CBs (free after the section)."""
        spills: list[int] = []
        while node.need() > DST_SLOTS:
            path = [node]
            while path[-1].need() > DST_SLOTS - 1:  # descend to a subtree with room to spare
                path.append(max((k for k in path[-1].kids if k.op != "scalar"), key=Node.need))
            sub = path[-1]
            cb = self.cb("Float32", 1, "spilled DST tile")
            self.copied.add(cb)
            self.section(sub, cb, j)
            leaf = Node("leaf", cb=cb, mode="front", n=sub.tiles())
            spills.append(cb)
            node = _replace(node, sub, leaf)
        return node, spills

    def split_hi_lo(self) -> None:
        """DST slot 0 = x -> three tiles whose sum is x exactly, each exact in the FPU's source
        registers (10 mantissa bits; the FPU reads f32 operands no wider): slot 1 = hi = x with its
        low 13 mantissa bits cleared, slot 2 = mid = the same of r = x - hi, slot 0 = lo = r - mid
        (at most 3 significant bits). A reduction over hi, mid and lo adds x's exact value."""
        c = self.c
        for dst in ("1", "2"):
            c.call("copy_dest_values_init")
            c.call("copy_dest_values", "0", dst, template=("DataFormat::Float32",))
            c.call("bitwise_and_tile_init")
            c.call("bitwise_and_tile", dst, SPLIT_MASK, template=("DataFormat::Int32",))
            c.call("sub_binary_tile_init")
            c.call("sub_binary_tile", "0", dst, "0")

    def colsum_operands(self, node: Node, j: SSAValue, pre: list) -> None:
        """Before a section: store the operand tile of each column sum in ``node`` (pad rows masked)."""
        for kid in node.kids:
            self.colsum_operands(kid, j, pre)
        if node.op == "colsum" and node.cb < 0:
            self.materialize_cols(node.kids[0])
            node.cb = self.shared("column-sum operand (hi, mid, lo)", "Float32", SPLIT)
            self.section(node.kids[0], node.cb, j, mask=(node.mask, self.c.const(0)), split=True)
            self.c.call("cb_wait_front", f"tt::CBIndex::c_{node.cb}", str(SPLIT))

    def eval(self, node: Node, slot: int, j: SSAValue, pops: list[tuple[int, int]]) -> bool:
        """Code computing ``node``'s tile j into DST ``slot`` (slots above it are free); returns
        whether a reduce ran (its packer mask is then reset after the section)."""
        c = self.c
        if node.op == "leaf":
            cbn = f"tt::CBIndex::c_{node.cb}"
            if node.mode == "front":
                c.call("cb_wait_front", cbn, "1")
                pops.append((node.cb, 1))
            self.copied.add(node.cb)
            c.call("reconfig_data_format_srca", cbn)
            c.call("copy_init", cbn)
            at = j if node.mode == "tile" else "0"
            if node.base is not None:
                at = c.arith(ir.AddOp, node.base, j)
            c.call("copy_tile", cbn, at, str(slot))
            return False
        if node.op in ("bcast_row", "bcast_col"):
            leaf = node.kids[0]
            cbn = f"tt::CBIndex::c_{leaf.cb}"
            bt = "BroadcastType::ROW" if node.op == "bcast_row" else "BroadcastType::COL"
            self.copied.add(leaf.cb)
            c.call("reconfig_data_format_srca", cbn)
            c.call("unary_bcast_init", cbn, template=(bt,))
            c.call("unary_bcast", cbn, j if node.op == "bcast_row" else "0", str(slot), template=(bt,))
            return False
        if node.op == "scalar":
            c.call("fill_tile_init")
            c.call("fill_tile_bitcast", str(slot), c.val(node.scalar))
            return False
        if node.op == "unary":
            r = self.eval(node.kids[0], slot, j, pops)
            c.call(f"{node.fn}_tile_init", template=SFPU_TEMPLATE.get(node.fn, ()))
            c.call(f"{node.fn}_tile", str(slot), template=SFPU_TEMPLATE.get(node.fn, ()))
            return r
        if node.op == "colsum":
            cbn, onen = f"tt::CBIndex::c_{node.cb}", f"tt::CBIndex::c_{self.scaler()}"
            c.call("reconfig_data_format", cbn, onen)
            c.call("reduce_init", cbn, onen, cbn, template=("PoolType::SUM", "ReduceDim::REDUCE_COL"))
            for part in range(SPLIT):
                c.call("reduce_tile", cbn, onen, str(part), "0", str(slot),
                       template=("PoolType::SUM", "ReduceDim::REDUCE_COL"))
            c.call("reduce_uninit")  # a normal pack: the packer keeps every row
            pops.append((node.cb, SPLIT))
            node.cb = -1
            return True
        if node.op == "binary":
            a, b = node.kids
            if b.op == "scalar" or a.op == "scalar":
                x, s = (a, b) if b.op == "scalar" else (b, a)
                r = self.eval(x, slot, j, pops)
                fn = node.fn if b.op == "scalar" else {"sub": "rsub", "add": "add", "mul": "mul"}.get(node.fn)
                c.call("binop_with_scalar_tile_init")
                if fn is None:  # scalar / x
                    c.call("recip_tile_init")
                    c.call("recip_tile", str(slot))
                    c.call("binop_with_scalar_tile_init")
                    fn = "mul"
                c.call(f"{fn}_unary_tile", str(slot), c.val(s.scalar))
                return r
        if node.side_by_side():  # (a comparison's scalar operand: filled into its own tile)
            slots, r = self.eval_side_by_side(node.kids, slot, j, pops)
            if node.op == "select":
                c.call("where_tile_init")
                c.call("where_tile", *slots, str(slot), template=("DataFormat::Float32",))
            else:
                c.call(f"{node.fn}_binary_tile_init")
                c.call(f"{node.fn}_binary_tile", *slots, str(slot))
            return r
        raise TtUnsupported(self.name, f"evaluating {node.op}")

    def eval_side_by_side(self, kids: list[Node], slot: int, j: SSAValue,
                          pops: list[tuple[int, int]]) -> tuple[list[str], bool]:
        """``kids`` evaluated into DST ``slot``, ``slot + 1``, ... the deepest first (in their
        order on ties; what Node.need counts): each kid's slot, and whether any popped a CB."""
        slots = [""] * len(kids)
        r = False
        for pos, i in enumerate(sorted(range(len(kids)), key=lambda i: -kids[i].need())):
            slots[i] = str(slot + pos)
            r = self.eval(kids[i], slot + pos, j, pops) or r
        return slots, r


class LowerToTtKernel(ModulePass):
    """Replace every resident ``tile.kernel`` by its ``ttk.program`` (see the module docstring)."""

    name = "lower-to-ttkernel"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for kern in list(op.body.block.ops):
            if isinstance(kern, t.KernelOp):
                if any(dtypes.by_name(d.data).is_float and d.data not in TT_DTYPES
                       for d in kern.dtype_vars.data.values()):
                    op.body.block.erase_op(kern)  # (f16, f64: no TT-Metal instance)
                    continue
                sched = kern.attributes.get("schedule")
                if sched is not None and sched.data == "streamed" and \
                        any(isinstance(o, t.SegmentsOp) for o in kern.walk()):
                    op.body.block.erase_op(kern)  # (a scatter-add's TT plan does not depend on row length)
                    continue
        # the parts of one instance (same name) run one after the other: one program
        groups: dict[str, list[t.KernelOp]] = {}
        for kern in list(op.body.block.ops):
            if isinstance(kern, t.KernelOp):  # (parts are named <instance>.part<i>[.streamed], checks .check)
                groups.setdefault(re.sub(r"\.(part\d+|check)", "", kern.sym_name.data), []).append(kern)
        for name, kerns in list(groups.items()):  # f32 products: the FPU multiplies bf16 only (no instance)
            if any(isinstance(o, t.TileMatmulOp) and "f32" in (o.a.type.dtype, o.b.type.dtype)
                   for kern in kerns for o in kern.walk()):
                for kern in kerns:
                    op.body.block.erase_op(kern)
                del groups[name]
        for name, kerns in groups.items():
            kerns.sort(key=lambda kn: kn.attributes["part"].data if "part" in kn.attributes else 0)
            checks = [kn for kn in kerns if kn.attributes.get("schedule") == StringAttr("check")]
            parts = [kn for kn in kerns if kn not in checks]
            low = Lowering(parts[0])
            low.name = name
            prog = low.program()
            for i, kern in enumerate(parts):
                part = low if i == 0 else Lowering(kern, launch_base=len(list(prog.body.block.ops)), part=i)
                for ln in part.launches():
                    prog.body.block.add_op(ln)
            low.finish_program(prog, parts, checks)
            op.body.block.insert_op_before(prog, kerns[0])
            for kern in kerns:
                op.body.block.erase_op(kern)
