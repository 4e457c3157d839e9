"""``size-tiles-tt``: the tile sizes of TT-Metal kernels, as the host's ``tile.tiling`` function.

Tensix tiles are 32x32 (four 16x16 faces), so a row block is 32 rows (``rows``) and a column chunk
32 columns (``col_chunk``). Row blocks are walked in groups of ``group`` consecutive blocks; a
group is the unit a core takes and the unit of the partial column sums (one partial row per
group, added in group order by the next launch). ``group`` depends on the number of row blocks
only — never on the number of cores — so results are bitwise identical on any grid: the groups
are at most ``GROUPS`` (enough for an 8x8 Wormhole grid).

Both schedules of the tile level are kept: *resident* (whole rows of a row block in L1) and, for
rows too long for it, *streamed* (each row block walked in column chunks of ``CHUNK_TILES``
tiles: once for the row sums, once for the outputs; one partial row per block). The *cached*
copy of a streamed kernel (opgen/ttmetal/cache.py) is sized as the streamed one. The host
function runs the first whose CBs fit L1 (opgen/emit/ttmetal.py).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter

from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.tile.dialect import INDEX
from opgen.tile.sizes import CHAIN_BLOCK, CHAIN_SPAN, cols_dim, rows_dim

TILE = 32
#: the most groups (partial rows) a row walk is split into: one per core of an 8x8 grid
GROUPS = 64
#: tiles of a column chunk in the column-chunk schedule (rows too long for L1)
CHUNK_TILES = 8


class SizeTilesTt(ModulePass):
    """Fill each ``tile.kernel``'s ``tile.tiling`` with TT tile sizes (see the module docstring)."""

    name = "size-tiles-tt"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in list(op.body.block.ops):
            if not isinstance(k, t.KernelOp):
                continue
            streamed = k.attributes.get("schedule") in (StringAttr("streamed"), StringAttr("cached"))
            tiling = next(o for o in k.body.block.ops if isinstance(o, t.TilingOp))
            for o in list(tiling.body.block.ops):
                tiling.body.block.erase_op(o)
            b = _Builder(tiling.body.block)
            if k.attributes.get("schedule") == StringAttr("chain"):
                self.size_chain(k, b)
                continue
            one, tile = b.const(1), b.const(TILE)
            rows, cols = rows_dim(k), cols_dim(k)  # (the op's own dims, whatever their names)
            n = b.op(ir.DimOp(rows)) if rows else one
            tiles = b.ceil_div(n, tile)
            group = b.op(ir.MaxOp(b.ceil_div(tiles, b.const(GROUPS)), one))
            b.set("rows", tile)
            b.set("tiles", tiles)
            d = one if cols == "1" else b.op(ir.DimOp(cols))
            if streamed:  # rows in column chunks of CHUNK_TILES tiles, one partial row per block
                chunk = b.op(ir.MinOp(b.const(CHUNK_TILES * TILE), b.op(ir.MulOp(b.ceil_div(d, tile), tile))))
                chunk = b.op(ir.MaxOp(chunk, tile))
                b.set("chunk", chunk)
                b.set("chunks", b.ceil_div(d, chunk))
                b.set("groups", tiles)
            else:
                b.set("group", group)
                b.set("groups", b.ceil_div(tiles, group))
            b.set("col_chunk", tile)
            b.set("col_chunks", b.ceil_div(d, tile))


    @staticmethod
    def size_chain(k: t.KernelOp, b: _Builder) -> None:
        """A matmul chain (opgen/tile/chain.py, opgen/ttmetal/chain.py): blocks of ``CHAIN_BLOCK``
        output rows (a multiple of 32: whole tiles) walked in 32-row tiles of ``CHAIN_BLOCK``
        columns, spans of ``CHAIN_SPAN`` of the other dim; each core's workspace region is
        ``CHAIN_BLOCK`` rows (products and G: ``g_rows``). None of it depends on the number of
        cores but the workspace's size, so results are the same on any grid."""
        tile, blk = b.const(TILE), b.const(CHAIN_BLOCK)
        own, oth, *widths = (b.op(ir.DimOp(x.data)) for x in k.attributes["blocks"].data)  # type: ignore[attr-defined]
        zero = b.const(0)
        empty = b.op(ir.CmpOp("eq", own, zero))
        for w in widths:
            empty = b.op(ir.OrOp(empty, b.op(ir.CmpOp("eq", w, zero))))
        b.set("rows", tile)
        b.set("chunk", blk)
        b.set("col_chunk", blk)
        b.set("blk", blk)
        blocks = b.op(ir.SelectOp(empty, zero, b.ceil_div(own, blk)))
        b.set("blocks", blocks)
        b.set("groups", blocks)
        xblocks = b.ceil_div(oth, b.const(CHAIN_SPAN))
        b.set("xblocks", xblocks)
        # fewer blocks than GROUPS: each block's spans in ``splits`` slices of ``slice`` spans, one
        # unit each (a number of the sizes, never of the cores: the same sums on any grid)
        one = b.const(1)
        spans = b.op(ir.MaxOp(xblocks, one))
        want = b.op(ir.MinOp(b.op(ir.MaxOp(b.op(ir.DivOp(b.const(GROUPS), b.op(ir.MaxOp(blocks, one)))), one)),
                             spans))
        per = b.ceil_div(spans, want)
        splits = b.ceil_div(spans, per)
        b.set("slice", per)
        b.set("splits", splits)
        units = b.op(ir.MulOp(blocks, splits))
        b.set("units", units)
        b.set("cblocks", b.op(ir.SelectOp(b.op(ir.CmpOp("eq", splits, one)), zero, blocks)))
        cores = b.op(t.BlockNumOp())
        b.set("ws_rows", b.op(ir.MulOp(cores, blk)))
        b.set("ws_arows", b.op(ir.MulOp(b.op(ir.MaxOp(cores, units)), blk)))
        b.set("ws_grows", b.op(ir.MulOp(cores, b.const(k.attributes["g_rows"].data))))  # type: ignore[attr-defined]


class _Builder:
    def __init__(self, block):
        self.block = block

    def op(self, o):
        Rewriter.insert_op(o, InsertPoint.at_end(self.block))
        return o.results[0] if o.results else o

    def const(self, v: int) -> SSAValue:
        return self.op(ir.ConstantOp(v, INDEX.dtype))

    def ceil_div(self, a: SSAValue, b: SSAValue) -> SSAValue:
        one = self.const(1)
        return self.op(ir.DivOp(self.op(ir.SubOp(self.op(ir.AddOp(a, b)), one)), b))

    def set(self, param: str, v: SSAValue) -> None:
        self.op(t.SetParamOp(param, v))
