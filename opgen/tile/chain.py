"""Matmul chains on the tile level: ``G = f(A @ B, ...)`` over an (M, N) space, consumed only by
``G @ C`` (outputs with M rows) and ``G^T @ D`` (outputs with N rows) — the loop level's plan
(opgen/lower/matmul_chain.py), here as kernels of the matrix unit and the vector unit.

One kernel per pass (the row pass, then the column pass, one after the other). A core owns blocks
of at most ``BLOCK`` output rows (block-cyclic over the vector cores; fewer rows per block, down
to 16, when there are too few blocks for every core — an output row's sum does not depend on the
rows beside it, so neither do the results) and, for each span of ``SPAN``
(16 blocks) of the other dim in order:

1. ``tile.matmul`` recomputes the product tile ``P = A B`` (``BLOCK x SPAN``, f32; transposed in
   the column pass) into the core's region of the workspace;
2. a walk over its row tiles computes ``G`` with the L0 ops (on the vector unit, as every other
   tile-level kernel does: the other inputs copied in at the tile's rows and columns) and writes
   it, rounded to the dtype of the tensor it multiplies next (the matrix unit takes one dtype), to
   the core's ``G`` region;
3. ``tile.matmul`` multiplies it: ``G C`` (row pass) or ``G^T D`` (column pass) into a product
   region, which a walk adds to the block's f32 accumulator (in the workspace: a block's rows of
   the output do not fit on chip). With f16/bf16 operands G is split into a rounded high part and
   its rounded remainder, two products whose sum keeps G's f32 accuracy (as the CUDA backend's
   split tensor-core products do).

After the last block the accumulator, cast to the output's dtype, is copied out. With
``split_spans`` (TT-Metal) a unit is a block and a *slice* of its spans (``splits`` slices of
``slice`` spans, tiling parameters of the sizes only): each unit accumulates its slice into its own
accumulator, and after a ``tile.sync_all`` each block's slices are added in slice order and
copied out (a block of one slice is copied out at once). Every output row
is summed by one core in a fixed order (blocks of the other dim, then the matrix unit's own fixed
order), so results are bitwise identical for any number of cores; ``G`` never exists in global
memory beyond one tile per core. ``tile.fence`` orders a core's copies to global memory before
its later reads of the same region (the matrix unit reads what the vector unit wrote, and back).
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects.builtin import ArrayAttr, IntAttr, StringAttr
from xdsl.ir import BlockArgument, Operation, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.lower.matmul_chain import Chain, MatmulChainLowering, _strip_cast
from opgen.lower.to_loops import NotFusable
from opgen.tile import dialect as t
from opgen.tile.lower import CHUNK, ROWS, TileLowering, TileUnsupported
from opgen.tile.rows import RowValues, one_hot, scalar_bcast
from opgen.tile.sizes import CHAIN_BLOCK, CHAIN_SPAN

#: the output rows of a block (and the column chunk of every walk); the other dim's span per product
BLOCK, SPAN = CHAIN_BLOCK, CHAIN_SPAN
#: Matmul objects one kernel may register (the API's limit)
MAX_MATMULS = 4
#: L0 ops a chain's G may not use on the tile level
NOT_IN_G = {ir.ReduceOp: "a reduction", ir.ScatterAddOp: "a scatter_add", ir.GatherOp: "a gather",
            ir.BincountOp: "a bincount", ir.PowOp: "pow", ir.TanhOp: "tanh", ir.ErfOp: "erf"}


@dataclass
class _Operand:
    """A matmul operand read from global memory: parameter ``arg``, transposed when ``trans``."""

    arg: str
    trans: bool


def chain_plan(func: ir.FuncOp) -> Chain | None:
    """The function's matmul chain, or None when it is not one."""
    if not any(isinstance(op, ir.MatmulOp) for op in func.body.block.walk()):
        return None
    try:
        return MatmulChainLowering(func, set(func.aliased_outputs)).plan()
    except NotFusable:
        return None


def chain_passes(ch: Chain) -> list[tuple[list[tuple[str, SSAValue, ir.MatmulOp]], bool]]:
    """(outputs, by rows) of each pass that has outputs: the row pass first."""
    return [(outs, by_rows) for outs, by_rows in ((ch.row_out, True), (ch.col_out, False)) if outs]


class ChainTiles(RowValues, TileLowering):
    """Lowers pass ``part`` of a matmul chain (see the module docstring)."""

    def __init__(self, func: ir.FuncOp, binding: dict[str, dtypes.DType], part: int = 0, first: int = 0,
                 split_spans: bool = False):
        super().__init__(func, binding, streamed=True, part=part)
        self.first = first  # the part of the first pass (a check kernel may come before)
        self.split_spans = split_spans  # units of (block, slice of spans), partials combined after

    # ------------------------------------------------------------------ analysis
    def check_chain(self, ch: Chain) -> None:
        """Raise TileUnsupported naming everything the chain uses that the tile level lacks."""
        self.index = self.index_params()
        missing = []
        if self.index:
            missing.append("index parameters")
        todo, seen = [ch.g], set()
        while todo:  # what G reads, up to the product and the parameters
            v = todo.pop()
            if v in seen or (ch.p is not None and v is ch.p.result) or not isinstance(v.owner, Operation):
                continue
            seen.add(v)
            what = NOT_IN_G.get(type(v.owner))
            if what or isinstance(v.owner, ir.MatmulOp | ir.TransposeOp):
                missing.append(f"{what or v.owner.name} in a matmul chain's tile")
            todo.extend(v.owner.operands)
        if missing:
            raise TileUnsupported(self.name, ", ".join(dict.fromkeys(missing)))
        for n, a in zip(self.names, self.func.body.block.args, strict=True):
            if ir.tensor_type(a).rank > 2:
                raise TileUnsupported(self.name, f"a rank-{ir.tensor_type(a).rank} tensor ({n})")
            if n in self.in_memory:
                raise TileUnsupported(self.name, f"a rank-0 tensor parameter ({n})")

    def _widening(self, c: ir.CastOp) -> bool:
        """A cast the matrix unit makes anyway: a float to f32 (its products are exact in f32)."""
        return (self.dt(ir.tensor_type(c.result).dtype) == "f32"
                and dtypes.by_name(self.dt(ir.tensor_type(c.x).dtype)).is_float)

    def operand(self, v: SSAValue) -> _Operand:
        """The global view a matmul operand reads (a parameter or its transpose)."""
        v = _strip_cast(v, self._widening)
        trans = isinstance(v.owner, ir.TransposeOp)
        if trans:
            v = _strip_cast(v.owner.x, self._widening)  # type: ignore[union-attr]
        if not isinstance(v, BlockArgument):
            raise TileUnsupported(self.name, "a matmul operand that is not a parameter (or its transpose)")
        return _Operand(self.names[v.index], trans)

    # ------------------------------------------------------------------ build
    def run(self) -> t.KernelOp:  # type: ignore[override]
        ch = chain_plan(self.func)
        if ch is None:
            raise TileUnsupported(self.name, "matmul")
        self.check_chain(ch)
        outs, by_rows = chain_passes(ch)[self.part - self.first]
        many = len(chain_passes(ch)) + self.first > 1
        k = self.begin_kernel(f"part{self.part}" if many else "", "chain")
        m_dim, n_dim = ir.tensor_type(ch.g).shape
        own, oth = (m_dim, n_dim) if by_rows else (n_dim, m_dim)
        k.attributes["g_rows"] = IntAttr(BLOCK if by_rows else SPAN)
        k.attributes["blocks"] = ArrayAttr([StringAttr(own), StringAttr(oth),
                                            *(StringAttr(ir.tensor_type(mm.result).shape[1]) for _, _, mm in outs)])
        self.emit_pass(ch, outs, by_rows)
        return k

    def _tile_op(self, op: Operation, v: SSAValue) -> SSAValue:
        """A select by a one-hot of per-row targets: a tile of the other value with one element
        per row set by the scalar unit; else the L0 op on tiles."""
        if isinstance(op, ir.SelectOp) and (oh := one_hot(op.cond)) is not None:
            a, b = op.a, op.b
            if (ir.tensor_type(a).rank and not scalar_bcast(a)) or (ir.tensor_type(b).rank and not scalar_bcast(b)):
                raise TileUnsupported(self.name, "a one-hot select of tensors")
            dt = self.cdt(v)
            hot, cold = (self._cast(self.scalar(scalar_bcast(x) or x), dt) for x in (a, b))
            init = self.add(ir.BroadcastOp(cold, [], ir.TensorType.make([ROWS, CHUNK], dt)))
            self.add(t.FenceOp())  # (the vector unit's fill, then the scalar unit's stores)
            loop = t.ForOp(self.zero, self.nrows, self.one, [init], hint="h")
            self.add(loop)
            outer, self.cur = self.cur, loop.body.block
            row = self.add(ir.AddOp(self.row0, loop.iv))
            memo: dict[SSAValue, SSAValue] = {}
            target = self._cast(self.row_value(oh[0], row, memo), "i64")
            ok: SSAValue | None = None
            for c in oh[1]:
                cv = self.row_value(c, row, memo)
                ok = cv if ok is None else self.add(ir.AndOp(ok, cv))
            col = self.add(ir.SubOp(target, self.col0))
            if ok is not None:
                col = self.add(ir.SelectOp(ok, col, self.add(ir.ConstantOp(-1, "i64"))))
            res = self.add(t.SetAtOp(loop.body.block.args[1], loop.iv, col, self.ncols, hot))
            self.add(t.YieldOp([res]))
            self.cur = outer
            self.add(t.FenceOp())
            return loop.res[0]
        return super()._tile_op(op, v)

    # ------------------------------------------------------------------ helpers
    def loop(self, lo: SSAValue, hi: SSAValue, step: SSAValue, hint: str) -> t.ForOp:
        f = t.ForOp(lo, hi, step, hint=hint)
        self.add(f)
        return f

    def close(self, f: t.ForOp, outer: object) -> None:
        self.add(t.YieldOp(), f.body.block)
        self.cur = outer  # type: ignore[assignment]

    def cdiv(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(ir.DivOp(self.add(ir.SubOp(self.add(ir.AddOp(a, b)), self.one)), b))

    def span(self, iv: SSAValue, size: SSAValue, total: SSAValue) -> tuple[SSAValue, SSAValue]:
        """(start, count) of block ``iv`` of ``size`` elements within ``total``."""
        start = self.add(ir.MulOp(iv, size))
        return start, self.add(ir.MinOp(self.add(ir.SubOp(total, start)), size))

    def off(self, start: SSAValue, on_rows: bool, view: SSAValue) -> SSAValue:
        """Element offset of a start along a view's stored rows (``on_rows``) or columns."""
        if not on_rows:
            return start
        shape = t.gm_type(view).shape
        return self.add(ir.MulOp(start, self.dim(shape[-1]) if len(shape) == 2 else self.one))

    def tiles_of(self, n: SSAValue, width: SSAValue, body: object) -> None:
        """``body(r0, nr, c0, nc)`` over row tiles of ``n`` rows and column chunks of ``width``."""
        outer = self.cur
        rl = self.loop(self.zero, self.cdiv(n, self.rows), self.one, "r")
        self.cur = rl.body.block
        r0, nr = self.span(rl.iv, self.rows, n)
        cl = self.loop(self.zero, self.cdiv(width, self.blk), self.one, "c")
        self.cur = cl.body.block
        c0, nc = self.span(cl.iv, self.blk, width)
        body(r0, nr, c0, nc)  # type: ignore[operator]
        self.close(cl, rl.body.block)
        self.close(rl, outer)

    # ------------------------------------------------------------------ the pass
    def emit_pass(self, ch: Chain, outs: list[tuple[str, SSAValue, ir.MatmulOp]], by_rows: bool) -> None:
        m_dim, n_dim = ir.tensor_type(ch.g).shape
        own_dim, oth_dim = (m_dim, n_dim) if by_rows else (n_dim, m_dim)
        self.x, self.cols, self.tcols = m_dim, n_dim, CHUNK
        self.zero, self.one = self.const(0), self.const(1)
        self.rows = self.add(t.ParamOp("rows"))
        blocks = self.add(t.ParamOp("blocks"))
        xblocks = self.add(t.ParamOp("xblocks"))
        self.blk = self.const(BLOCK)
        core = self.add(t.BlockIdxOp())
        ncores = self.add(t.BlockNumOp())
        own_n, oth_n = self.dim(own_dim), self.dim(oth_dim)
        # the core's regions: a block of output rows; G's tile is a block by a span (rows x
        # columns in the row pass, columns x rows in the column pass)
        g_rows, g_cols = (BLOCK, SPAN) if by_rows else (SPAN, BLOCK)
        wrow = self.add(ir.MulOp(core, self.blk))
        wrow_g = self.add(ir.MulOp(core, self.const(g_rows)))
        cube_dt = {t.gm_type(self.args[self.operand(mm.rhs).arg]).dtype for _, _, mm in outs}
        if len(cube_dt) != 1:
            raise TileUnsupported(self.name, "products with tensors of different dtypes")
        gdt = cube_dt.pop()
        ws_grows = t.param_dim("ws_grows")
        ws_p = self.add(t.WorkspaceOp("ws_p", t.GmType.make([ws_grows, str(g_cols)], "f32"))) if ch.p else None
        # G in the matrix unit's dtype: f32, or (f16/bf16) a high and a low part whose products
        # add up to the f32 G's to f32 accuracy (G's rounding error would otherwise dominate)
        parts = [""] if gdt == "f32" else ["", "l"]
        ws_g = [self.add(t.WorkspaceOp(f"ws_g{x}", t.GmType.make([ws_grows, str(g_cols)], gdt))) for x in parts]
        accs, prods = [], []
        split = self.split_spans
        for i, (_, _, mm) in enumerate(outs):
            width = ir.tensor_type(mm.result).shape[1]
            prods.append([self.add(t.WorkspaceOp(f"ws_c{i}{x}", t.GmType.make([t.param_dim("ws_rows"), width], "f32")))
                          for x in parts])
            accs.append(self.add(t.WorkspaceOp(f"ws_acc{i}", t.GmType.make(
                [t.param_dim("ws_arows" if split else "ws_rows"), width], "f32"))))
        if ch.p is not None:  # the matrix unit needs a contraction of at least one element
            kd = self.dim(ir.tensor_type(ch.p.lhs).shape[1])
            ok = self.add(ir.CmpOp("gt", kd, self.zero))
            for d in [own_dim, *(ir.tensor_type(mm.result).shape[1] for _, _, mm in outs)]:  # or no output
                ok = self.add(ir.OrOp(ok, self.add(ir.CmpOp("eq", self.dim(d), self.zero))))
            self.add(ir.CheckOp(ok, f"the product over "
                                f"{ir.tensor_type(ch.p.lhs).shape[1]} = 0 (no elements) is not supported on "
                                "the matrix unit", "shape"))
        ob = self.loop(core, self.add(t.ParamOp("units")) if split else blocks, ncores, "b")
        self.anchor = ob  # (scalars made inside the walk go before it)
        top = self.cur
        self.cur = ob.body.block
        zero = self.const(0)
        blk = self.add(t.ParamOp("blk"), self.block)
        arow, x_lo, x_hi, direct = wrow, zero, xblocks, None
        if split:  # unit u: block u / splits, spans [s * slice, (s + 1) * slice) for s = u mod splits
            splits = self.add(t.ParamOp("splits"), self.block)
            per = self.add(t.ParamOp("slice"), self.block)
            bi = self.add(ir.DivOp(ob.iv, splits))
            x_lo = self.add(ir.MulOp(self.add(ir.SubOp(ob.iv, self.add(ir.MulOp(bi, splits)))), per))
            x_hi = self.add(ir.MinOp(xblocks, self.add(ir.AddOp(x_lo, per))))
            # one slice: the core's accumulator, copied out at the unit's end; else the unit's own
            direct = self.add(ir.CmpOp("eq", splits, self.one))
            arow = self.add(ir.MulOp(self.add(ir.SelectOp(direct, core, ob.iv)), self.blk))
            o0, on = self.span(bi, blk, own_n)
        else:
            o0, on = self.span(ob.iv, blk, own_n)
        for (_, _, mm), acc in zip(outs, accs, strict=True):  # the accumulators start at zero
            width = self.dim(ir.tensor_type(mm.result).shape[1])

            def clear(r0: SSAValue, nr: SSAValue, c0: SSAValue, nc: SSAValue, acc: SSAValue = acc) -> None:
                z = self.add(ir.BroadcastOp(self.add(ir.ConstantOp(0.0, "f32"), self.block), [],
                                            ir.TensorType.make([ROWS, CHUNK], "f32")))
                self.add(t.CopyOutOp(z, acc, self.add(ir.AddOp(arow, r0)), nr, c0, nc))

            self.tiles_of(on, width, clear)
        xb = self.loop(x_lo, x_hi, self.one, "x")
        block_scope = self.cur
        self.cur = xb.body.block
        x0, xn = self.span(xb.iv, self.const(SPAN), oth_n)
        g0, gn, h0, hn = (o0, on, x0, xn) if by_rows else (x0, xn, o0, on)  # G rows, G columns
        if ch.p is not None:
            a, b = self.operand(ch.p.lhs), self.operand(ch.p.rhs)
            ga, gb = self.args[a.arg], self.args[b.arg]
            if t.gm_type(ga).dtype != t.gm_type(gb).dtype:
                raise TileUnsupported(self.name, "a product of tensors of different dtypes")
            kdim = ir.tensor_type(ch.p.lhs).shape[1]
            self.add(t.FenceOp())
            self.add(t.TileMatmulOp("mm_p", ga, self.off(g0, not a.trans, ga), a.trans, gb, self.off(h0, b.trans, gb),
                                b.trans, ws_p, self.off(wrow_g, True, ws_p), [gn, hn, self.dim(kdim)],
                                [str(g_rows), str(g_cols), kdim]))
            self.add(t.FenceOp())
        self.emit_g_walk(ch, ws_p, ws_g, wrow_g, g0, gn, h0, hn)
        for i, ((_, _, mm), prod, acc) in enumerate(zip(outs, prods, accs, strict=True)):
            c = self.operand(mm.rhs)
            gc = self.args[c.arg]
            width = ir.tensor_type(mm.result).shape[1]
            self.add(t.FenceOp())
            for g, pr in zip(ws_g, prod, strict=True):  # (both parts: one Matmul object)
                self.add(t.TileMatmulOp(f"mm_{i}", g, self.off(wrow_g, True, g), not by_rows, gc,
                                    self.off(x0, not c.trans, gc), c.trans, pr, self.off(wrow, True, pr),
                                    [on, self.dim(width), xn], [str(BLOCK), width, str(SPAN)]))
            self.add(t.FenceOp())

            def accumulate(r0: SSAValue, nr: SSAValue, c0: SSAValue, nc: SSAValue, prod: list[SSAValue] = prod,
                           acc: SSAValue = acc) -> None:
                row, arow_r = self.add(ir.AddOp(wrow, r0)), self.add(ir.AddOp(arow, r0))
                self.add_tiles(acc, arow_r, [(x, row) for x in prod], nr, c0, nc)  # (high + low) first; block order

            self.tiles_of(on, self.dim(width), accumulate)
        self.close(xb, block_scope)
        if len(outs) + (ch.p is not None) > MAX_MATMULS:
            raise TileUnsupported(self.name, f"more than {MAX_MATMULS} products on the matrix unit")
        self.add(t.FenceOp())
        if direct is None:
            self.emit_stores(outs, accs, arow, o0, on)
        else:  # (a loop of one iteration when the block is one slice, else of none)
            once = self.loop(zero, self.add(ir.SelectOp(direct, self.one, zero)), self.one, "d")
            self.cur = once.body.block
            self.emit_stores(outs, accs, arow, o0, on)
            self.close(once, ob.body.block)
        self.close(ob, top)
        if split:
            self.emit_combine_slices(outs, accs, own_n)

    def emit_stores(self, outs: list[tuple[str, SSAValue, ir.MatmulOp]], accs: list[SSAValue], arow: SSAValue,
                    o0: SSAValue, on: SSAValue) -> None:
        """The block's accumulators (at workspace row ``arow``), cast to the outputs' dtypes, to the
        outputs' rows ``o0``.. (``on`` rows)."""
        for (name, v, mm), acc in zip(outs, accs, strict=True):
            if _strip_cast(v) is not mm.result:
                raise TileUnsupported(self.name, f"an epilogue on the product {name}")
            storage = self.dt(ir.tensor_type(v).dtype)

            def store(r0: SSAValue, nr: SSAValue, c0: SSAValue, nc: SSAValue, acc: SSAValue = acc,
                      name: str = name, storage: str = storage) -> None:
                s = self.add(t.CopyInOp(acc, self.add(ir.AddOp(arow, r0)), nr, c0, nc, [ROWS, CHUNK]))
                out = self._cast_tile(s, storage)
                self.add(t.CopyOutOp(out, self.args[name], self.add(ir.AddOp(o0, r0)), nr, c0, nc))

            self.tiles_of(on, self.dim(ir.tensor_type(mm.result).shape[1]), store)

    def add_tiles(self, acc: SSAValue, acc_row: SSAValue, sources: list[tuple[SSAValue, SSAValue]],
                  nr: SSAValue, c0: SSAValue, nc: SSAValue) -> None:
        """One tile (``nr`` rows from ``acc_row``, columns ``c0..c0+nc``) of workspace ``acc``
        plus the same tile of each ``(buffer, row)`` source: the sources summed first, in order,
        then added to ``acc`` and written back."""
        s = self.add(t.CopyInOp(acc, acc_row, nr, c0, nc, [ROWS, CHUNK]))
        total = None
        for buf, row in sources:
            p = self.add(t.CopyInOp(buf, row, nr, c0, nc, [ROWS, CHUNK]))
            total = p if total is None else self.add(ir.AddOp(total, p))
        assert total is not None
        self.add(t.CopyOutOp(self.add(ir.AddOp(s, total)), acc, acc_row, nr, c0, nc))

    def emit_combine_slices(self, outs: list[tuple[str, SSAValue, ir.MatmulOp]], accs: list[SSAValue],
                            own_n: SSAValue) -> None:
        """After every unit (``tile.sync_all``), for blocks of more than one slice: the first
        slice's accumulator plus the others' in slice order (a fixed order: the same sums on any
        number of cores), then the outputs."""
        self.anchor = None
        self.cur = self.block
        self.add(t.SyncAllOp())
        core, ncores = self.add(t.BlockIdxOp()), self.add(t.BlockNumOp())
        cb = self.loop(core, self.add(t.ParamOp("cblocks")), ncores, "b")
        self.anchor = cb
        self.cur = cb.body.block
        splits = self.add(t.ParamOp("splits"), self.block)
        o0, on = self.span(cb.iv, self.add(t.ParamOp("blk"), self.block), own_n)
        first = self.add(ir.MulOp(self.add(ir.MulOp(cb.iv, splits)), self.blk))
        sl = self.loop(self.one, splits, self.one, "s")
        self.cur = sl.body.block
        self.add(t.FenceOp())  # (the previous slice's sums are written)
        other = self.add(ir.AddOp(first, self.add(ir.MulOp(sl.iv, self.blk))))
        for (_, _, mm), acc in zip(outs, accs, strict=True):
            def add_slice(r0: SSAValue, nr: SSAValue, c0: SSAValue, nc: SSAValue, acc: SSAValue = acc) -> None:
                row = self.add(ir.AddOp(first, r0))
                self.add_tiles(acc, row, [(acc, self.add(ir.AddOp(other, r0)))], nr, c0, nc)

            self.tiles_of(on, self.dim(ir.tensor_type(mm.result).shape[1]), add_slice)
        self.close(sl, cb.body.block)
        self.add(t.FenceOp())
        self.emit_stores(outs, accs, first, o0, on)
        self.close(cb, self.block)
        self.anchor = None

    def emit_g_walk(self, ch: Chain, ws_p: SSAValue | None, ws_g: list[SSAValue], wrow: SSAValue, g0: SSAValue,
                    gn: SSAValue, h0: SSAValue, hn: SSAValue) -> None:
        """G's tile (rows g0.., columns h0..) by row tiles and column chunks, in the ``ws_g`` dtype:
        rounded, and with a second region, the rounding error rounded too."""
        def tile(r0: SSAValue, nr: SSAValue, c0: SSAValue, nc: SSAValue) -> None:
            self.row0, self.nrows = self.add(ir.AddOp(g0, r0)), nr
            self.col0, self.ncols = self.add(ir.AddOp(h0, c0)), nc
            self.env = {}
            row = self.add(ir.AddOp(wrow, r0))
            if ch.p is not None and ws_p is not None:
                self.env[ch.p.result] = self.add(t.CopyInOp(ws_p, row, nr, c0, nc, [ROWS, CHUNK]))
            g = self.tile(ch.g)
            hi = self._cast_tile(g, t.gm_type(ws_g[0]).dtype)
            self.add(t.CopyOutOp(hi, ws_g[0], row, nr, c0, nc))
            if len(ws_g) > 1:
                lo = self._cast_tile(self.add(ir.SubOp(g, self._cast_tile(hi, "f32"))), t.gm_type(ws_g[1]).dtype)
                self.add(t.CopyOutOp(lo, ws_g[1], row, nr, c0, nc))

        self.tiles_of(gn, hn, tile)


def lower_chain(func: ir.FuncOp, binding: dict[str, dtypes.DType], part: int, first: int = 0,
                split_spans: bool = False) -> t.KernelOp:
    return ChainTiles(func, binding, part, first, split_spans).run()
