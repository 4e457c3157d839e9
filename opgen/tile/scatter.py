"""The owner-computes walk of a row group whose rows are a scatter-add's rows (part of
``lower-to-tiles``).

``scatter_add(values[N, c], idx[N]) -> [V, c]`` with every value of ``idx`` in ``[0, V)`` (the
host converted and checked the indices, see opgen/tile/indices.py). Each core owns blocks of
``seg_rows`` consecutive table rows (block-cyclic over the cores); for a block it scans the
indices once to find each row's *segment* — the positions ``n`` with ``idx[n]`` equal to that
row, in increasing ``n`` (``tile.segments``). Then it walks the block's row tiles as any row
group does; the scatter-add's tile starts at zero and each of its rows ``r`` adds, position by
position in increasing ``n``, the value at ``n`` (one row copied in from each ``[N, c]`` input,
``tile.add_row``). No two cores write the same row, and every row is the same sum in the same
order on any number of cores: deterministic, with no atomics.

Values read at a position are evaluated *at that position*: an ``[N, c]`` input is the row copied
in; an ``[N]`` value derived from the indices is a scalar of the row (the index itself is the
row; ``gather(bincount(idx), idx)`` is the segment's length), computed once per row. Other
per-position values are not supported yet.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Block, BlockArgument, Operation, SSAValue

from opgen.ir import dialect as ir
from opgen.lower.to_loops import _Lowering
from opgen.tile import dialect as t
from opgen.tile.indices import IndexUnsupported, index_root


@dataclass
class _Entry:
    """The context of one scatter-add's accumulation over the current row tile."""

    block: Block  # the per-row loop body, where per-row scalars go (before the position loop)
    anchor: Operation  # the position loop
    root: BlockArgument  # the index parameter
    row: SSAValue  # the table row (global)
    count: SSAValue  # the row's segment length
    n: SSAValue | None = None  # the position
    env: dict[SSAValue, SSAValue] = field(default_factory=dict)  # values at the position
    row_env: dict[SSAValue, SSAValue] = field(default_factory=dict)  # per-row scalars


class ScatterWalk:
    """Mixin of :class:`opgen.tile.lower.TileLowering` (see the module docstring)."""

    # ------------------------------------------------------------------ the walk
    def emit_scatter_walk(self) -> None:  # type: ignore[misc]
        """Blocks of ``seg_rows`` table rows, block-cyclic over the cores; each block's segments,
        then its row tiles (in column chunks when the rows are streamed)."""
        self.cur = self.block
        rows = self.add(t.ParamOp("rows"))
        seg_rows = self.add(t.ParamOp("seg_rows"))
        blocks = self.add(t.ParamOp("seg_blocks"))
        if self.streamed:
            chunk = self.add(t.ParamOp("chunk"))
            chunks = self.add(t.ParamOp("chunks"))
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        self.rows = rows
        self.zero = self.const(0)
        self.one = self.const(1)
        self.full_cols = self.ncols = self.dim(self.cols)
        self.col0 = self.zero
        self.col_env = {}
        outer = t.ForOp(core, blocks, ncores, hint="b")
        self.add(outer)
        self.anchor = outer
        self.cur = outer.body.block
        b0 = self.add(ir.MulOp(outer.iv, seg_rows))
        nb = self.add(ir.MinOp(self.add(ir.SubOp(self.dim(self.x), b0)), seg_rows))
        self.segs: dict[BlockArgument, SSAValue] = {}
        for op in self.scatters:
            root = self.index_arg(op)
            if root not in self.segs:
                self.segs[root] = self.add(t.SegmentsOp(self.args[self.names[root.index]], b0, nb))
        ntiles = self.add(ir.DivOp(self.add(ir.SubOp(self.add(ir.AddOp(nb, rows)), self.one)), rows))
        loop = t.ForOp(self.zero, ntiles, self.one, hint="t")
        self.add(loop)
        self.cur = loop.body.block
        self.trow = self.add(ir.MulOp(loop.iv, rows))
        self.row0 = self.add(ir.AddOp(b0, self.trow))
        self.nrows = self.add(ir.MinOp(self.add(ir.SubOp(nb, self.trow)), rows))
        tile_scope = self.cur
        self.env = {}
        if self.streamed:
            cl = t.ForOp(self.zero, chunks, self.one, hint="c")
            self.add(cl)
            self.cur = cl.body.block
            self.col0 = self.add(ir.MulOp(cl.iv, chunk))
            self.ncols = self.add(ir.MinOp(self.add(ir.SubOp(self.full_cols, self.col0)), chunk))
        self.copy_outputs()
        if self.streamed:
            self.add(t.YieldOp())
            self.cur = tile_scope
        self.add(t.YieldOp())
        self.cur = outer.body.block
        self.add(t.YieldOp())
        self.anchor = None
        self.ncols, self.col0 = self.full_cols, self.zero

    def index_arg(self, op: ir.ScatterAddOp) -> BlockArgument:
        try:
            return index_root(op.idx)
        except IndexUnsupported as e:
            raise self.unsupported(str(e)) from None

    # ------------------------------------------------------------------ one scatter-add's tile
    def scatter_tile(self, op: ir.ScatterAddOp) -> SSAValue:
        """The row tile of ``op``'s result: zero, plus each row's segment in order."""
        if ir.tensor_type(op.values).rank != 2:
            raise self.unsupported("a scatter_add of rank-1 values")
        dt = self.cdt(op.result)
        zero = self.add(ir.ConstantOp(0, dt), self.block)
        init = self.add(ir.BroadcastOp(zero, [], ir.TensorType.make([t.ROWS, self.tcols], dt)))
        rloop = t.ForOp(self.zero, self.nrows, self.one, [init], hint="r")
        self.add(rloop)
        saved = self.cur
        self.cur = rloop.body.block
        r = rloop.iv
        segs = self.segs[self.index_arg(op)]
        local = self.add(ir.AddOp(self.trow, r))
        lo = self.add(t.SegStartOp(segs, local))
        hi = self.add(t.SegStartOp(segs, self.add(ir.AddOp(local, self.one))))
        row = self.add(ir.AddOp(self.row0, r))
        count = self.add(ir.SubOp(hi, lo))
        ploop = t.ForOp(lo, hi, self.one, [rloop.body.block.args[1]], hint="p")
        self.add(ploop)
        ctx = _Entry(rloop.body.block, ploop, self.index_arg(op), row, count)
        self.cur = ploop.body.block
        ctx.n = self.add(t.SegAtOp(segs, ploop.iv))
        self.ectx = ctx
        val = self.entry(op.values)
        if ir.tensor_type(val).dtype != dt:
            val = self.add(ir.CastOp(val, dt))
        acc = self.add(t.AddRowOp(ploop.body.block.args[1], r, val))
        self.add(t.YieldOp([acc]))
        self.cur = rloop.body.block
        self.add(t.YieldOp([ploop.res[0]]))
        self.cur = saved
        return rloop.res[0]

    def entry(self, v: SSAValue) -> SSAValue:
        """``v`` at the current position: a ``[1, c]`` tile, or a scalar."""
        ctx = self.ectx
        if v in ctx.env:
            return ctx.env[v]
        tt = ir.tensor_type(v)
        pos_dim = ir.tensor_type(ctx.root).shape[0]
        shape = ["1", self.tcols]
        if tt.rank == 0:
            res = self.scalar(v)
        elif tt.rank == 1 and tt.shape[0] == pos_dim:
            res = self.row_scalar(v)
        elif tt.rank == 1:  # along the columns
            res = self.tile(v)
        elif tt.rank == 2 and tt.shape[0] == pos_dim:
            res = self._entry_op(v, shape)
        else:
            raise self.unsupported(f"a value of shape {list(tt.shape)} in a scatter_add's values")
        ctx.env[v] = res
        return res

    def _entry_op(self, v: SSAValue, shape: list[str]) -> SSAValue:
        dt = self.cdt(v)
        if isinstance(v, BlockArgument):
            src = self.args[self.names[v.index]]
            raw = self.add(t.CopyInOp(src, self.ectx.n, self.one, self.col0, self.ncols, shape))  # type: ignore[arg-type]
            return self._cast(raw, dt)
        op = v.owner
        assert isinstance(op, Operation)
        if isinstance(op, ir.BroadcastOp | ir.FullOp):
            x = self.entry(op.operands[0])
            if ir.tensor_type(x).rank == 0:
                return self.add(ir.BroadcastOp(x, [], ir.TensorType.make(shape, ir.tensor_type(x).dtype)))
            return x  # a column vector: already a [1, c] tile
        if isinstance(op, ir.CastOp):
            return self._cast(self.entry(op.x), dt)
        if isinstance(op, ir.BinaryOp | ir.UnaryOp | ir.CmpOp | ir.SelectOp):
            operands = [self.entry(o) for o in op.operands]
            operands = [self.add(ir.BroadcastOp(o, [], ir.TensorType.make(shape, ir.tensor_type(o).dtype)))
                        if ir.tensor_type(o).rank == 0 else o for o in operands]
            return self.add(self._rebuild(op, operands))
        raise self.unsupported(f"{op.name} in a scatter_add's values")

    def row_scalar(self, v: SSAValue) -> SSAValue:
        """An ``[N]`` value at the current position as a scalar of the row (computed once per
        row, before the position loop)."""
        ctx = self.ectx
        if v in ctx.row_env:
            return ctx.row_env[v]
        op = v.owner
        res: SSAValue
        if v is ctx.root or (isinstance(op, ir.CastOp) and op.x is ctx.root):
            res = self._row_add(ir.CastOp(ctx.row, self._scalar_dt(v))) if self._scalar_dt(v) != "i64" else ctx.row
        elif isinstance(op, ir.GatherOp) and _Lowering.counted_by_segments(op.table.owner) \
                and self._same_index(op.idx) and self._same_index(op.table.owner.idx):  # type: ignore[union-attr]
            dt = self._scalar_dt(v)
            res = ctx.count if dt == "i64" else self._row_add(ir.CastOp(ctx.count, dt))
        elif isinstance(op, ir.BroadcastOp | ir.FullOp) and ir.tensor_type(op.operands[0]).rank == 0:
            res = self.scalar(op.operands[0])
        elif isinstance(op, ir.CastOp):
            x = self.row_scalar(op.x)
            dt = self._scalar_dt(v)
            res = x if ir.tensor_type(x).dtype == dt else self._row_add(ir.CastOp(x, dt))
        elif isinstance(op, ir.BinaryOp | ir.UnaryOp | ir.CmpOp | ir.SelectOp):
            res = self._row_add(self._rebuild(op, [self.row_scalar(o) if ir.tensor_type(o).rank else self.scalar(o)
                                                   for o in op.operands]))
        else:
            raise self.unsupported("a per-position value read by a scatter_add (other than its indices)")
        ctx.row_env[v] = res
        return res

    def _same_index(self, v: SSAValue) -> bool:
        try:
            return index_root(v) is self.ectx.root
        except IndexUnsupported:
            return False

    def _scalar_dt(self, v: SSAValue) -> str:
        """The dtype a per-row scalar is computed in (an index dtype variable: i64)."""
        name = ir.tensor_type(v).dtype
        if name in self.free:
            return "i64"
        return self.cdt(v)

    def _row_add(self, op: Operation) -> SSAValue:
        self.ectx.block.insert_op_before(op, self.ectx.anchor)
        return op.results[0]
