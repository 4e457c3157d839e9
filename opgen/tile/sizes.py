"""The tiling decisions of a ``tile.kernel``, written as host code into its ``tile.tiling`` region
(printed as the host tiling function; the kernel reads the results with ``tile.param``).

* ``size-tiles`` — the rows per tile under the on-chip capacity (and the tiles per group of a
  column reduction's partial sum): every buffer plan-buffers made
  costs its depth times its tile's bytes; tiles are ``rows`` rows of ``pitch`` elements (the row
  length rounded up to 32 bytes, the copy engine's and the vector unit's alignment), per-row
  values ``rows`` elements (rounded up to 32 bytes). Copy queues are two deep (double buffering)
  when two fit, else one deep (``nbuf``). ``rows`` never depends on the number of cores, so the
  column reductions' partial sums — and so the results — are the same on any number of cores.
* a scatter-add's walk (opgen/tile/scatter.py) takes blocks of ``seg_rows`` table rows — as
  many rows as give every core a block, at most ``SEG_ROWS`` (its segment table lives on chip:
  two int32 per row, a window of ``SEG_WINDOW`` sorted positions and a ``SEG_SCAN``-index copy-in
  buffer); its row tiles are at most a block high. The sums never depend on the blocks.
* ``split-cores`` — how many cores the launch uses (``block_dim``): the walks are block-cyclic over
  whatever number the launch gets, so this only decides how busy the cores are.
* ``plan-workspace`` — where the tiling data and every ``tile.workspace`` region sit in the call's
  workspace, and its total size (``ws_bytes``), with overflow checks.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t

#: bytes the tiling data may take at the start of the workspace
TILING_BYTES = 2048
#: buffer layouts of tile.segments (plan-buffers)
SEG_LAYOUTS = ("segrows", "segwin", "segchunk")
#: the alignment of on-chip tiles and copies (bytes)
ALIGN = 32
#: largest and smallest column chunk of the column-sum phase (elements)
MAX_COL_CHUNK = 4096
MIN_COL_CHUNK = 8
#: most rows one tile copy moves (DataCopyPad's blockCount is at most 4095)
MAX_ROWS = 4095
#: rows per partial sum of a column reduction (the partials' traffic is 2/GROUP_ROWS of a pass)
GROUP_ROWS = 64
#: most table rows of a scatter-add block; sorted positions one window holds; indices per scan copy
SEG_ROWS = 2048
SEG_WINDOW = 2048
SEG_SCAN = 1024
#: rows of a matmul chain's output blocks, and the span of the other dim one product covers
#: (opgen/tile/chain.py): a block's accumulator goes through global memory once per span
CHAIN_BLOCK = 128
CHAIN_SPAN = 16 * CHAIN_BLOCK


class _Builder:
    """Scalar host code appended to a ``tile.tiling`` region."""

    def __init__(self, tiling: t.TilingOp):
        self.block: Block = tiling.body.block
        self.params: dict[str, SSAValue] = {}
        self.consts: dict[int, SSAValue] = {}
        for op in self.block.ops:
            if isinstance(op, t.SetParamOp):
                self.params[op.param.data] = op.value

    def add(self, op: Operation) -> SSAValue:
        self.block.add_op(op)
        return op.results[0]

    def c(self, v: int) -> SSAValue:
        if v not in self.consts:
            self.consts[v] = self.add(ir.ConstantOp(v, "i64"))
        return self.consts[v]

    def dim(self, d: str) -> SSAValue:
        return self.c(int(d)) if d.isdigit() else self.add(ir.DimOp(d))

    def platform(self, what: str) -> SSAValue:
        return self.add(t.PlatformOp(what))

    def bin(self, cls: type, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(cls(a, b))

    def cdiv(self, a: SSAValue, b: SSAValue) -> SSAValue:
        """ceil(a / b) for a >= 0, b > 0, without overflow."""
        q = self.bin(ir.DivOp, a, b)
        r = self.bin(ir.SubOp, a, self.bin(ir.MulOp, q, b))
        return self.bin(ir.AddOp, q, self.add(ir.CastOp(self.add(ir.CmpOp("ne", r, self.c(0))), "i64")))

    def round_up(self, a: SSAValue, m: int) -> SSAValue:
        return self.bin(ir.MulOp, self.cdiv(a, self.c(m)), self.c(m))

    def select(self, cond: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.add(ir.SelectOp(cond, a, b))

    def set(self, name: str, v: SSAValue) -> SSAValue:
        self.block.add_op(t.SetParamOp(name, v))
        self.params[name] = v
        return v

    def check(self, cond: SSAValue, message: str, status: str = "shape") -> None:
        self.block.add_op(ir.CheckOp(cond, message, status))


def _kernel_parts(k: t.KernelOp) -> tuple[t.TilingOp, list[t.BufferOp]]:
    tiling = next(op for op in k.body.block.ops if isinstance(op, t.TilingOp))
    bufs = [op for op in k.body.block.ops if isinstance(op, t.BufferOp)]
    return tiling, bufs


def rows_dim(k: t.KernelOp) -> str | None:
    """The op's dim the row tiles walk (the rows of the first copy-in with a tile of ``tile.rows``
    rows), None when no copy walks rows."""
    for op in k.body.block.walk():
        if (isinstance(op, t.CopyInOp) and ir.tensor_type(op.result).shape[0] != "1"
                and not isinstance(op.src.owner, t.WorkspaceOp)):
            return t.gm_type(op.src).shape[0]
    for op in k.body.block.walk():
        if (isinstance(op, t.CopyOutOp) and ir.tensor_type(op.value).shape[0] != "1"
                and not isinstance(op.dst.owner, t.WorkspaceOp)):
            return t.gm_type(op.dst).shape[0]
    return None


def cols_dim(k: t.KernelOp) -> str:
    """The row length the tiles walk (the last dim of the views the kernel copies rows of)."""
    for op in k.body.block.walk():
        if isinstance(op, t.CopyInOp | t.CopyOutOp):
            gm = t.gm_type(op.src if isinstance(op, t.CopyInOp) else op.dst)
            tt = ir.tensor_type(op.result if isinstance(op, t.CopyInOp) else op.value)
            if tt.shape[1] not in ("1", t.COL_CHUNK) and not isinstance(op.operands[0].owner, t.WorkspaceOp):
                return gm.shape[-1]
    return "1"


def _itemsize(b: t.BufferOp) -> int:
    return dtypes.by_name(b.attributes["elem"].data).itemsize  # type: ignore[attr-defined]


def _is_mask(b: t.BufferOp) -> bool:
    """A comparison's mask: a bit an element (plan-buffers)."""
    return "bits" in b.attributes


def _align(b: t.BufferOp) -> int:
    """The bytes the buffer's size is rounded to (plan-buffers: a comparison's operands 256)."""
    return int(b.attributes["align"].data) if "align" in b.attributes else ALIGN  # type: ignore[attr-defined]


#: elements a comparison covers are rounded up to this (256 bytes of f32: its whole repeats)
MASK_GRAIN = 64
#: more than a mask's bytes exceed a bit an element by (MASK_GRAIN / 8 and a 32-byte rounding)
MASK_SLACK = 64


def _sized(b: _Builder, x: t.BufferOp, count: SSAValue, round_to: int = 1) -> SSAValue:
    """The bytes of buffer ``x`` holding ``count`` elements: a mask's bits (of whole repeats,
    32-byte rounded), else count elements rounded up to ``round_to`` bytes or the buffer's
    alignment where that is larger than 32 bytes."""
    if _is_mask(x):
        return b.round_up(b.bin(ir.DivOp, b.round_up(count, MASK_GRAIN), b.c(8)), ALIGN)
    nbytes = b.bin(ir.MulOp, count, b.c(_itemsize(x)))
    step = max(round_to, _align(x) if _align(x) > ALIGN else 1)
    return nbytes if step == 1 else b.round_up(nbytes, step)


def _buffer_bytes(b: _Builder, bufs: list[t.BufferOp], rows: SSAValue, pitch: SSAValue, cc: SSAValue) -> None:
    """Every buffer's bytes: a tile ``rows`` rows of ``pitch`` elements, a per-row value ``rows``
    elements (32-byte rounded), a row ``pitch`` elements (``cc`` in the column-sum phase), a
    scratch block 32 bytes; the segment tables are sized by size_segments."""
    for x in bufs:
        lay = x.attributes["layout"].data  # type: ignore[attr-defined]
        if lay == "tile":
            count = b.bin(ir.MulOp, rows, pitch)
        elif lay == "vec":
            count = rows
        elif lay == "row":
            count = cc if x.attributes["cols"].data == t.COL_CHUNK else pitch  # type: ignore[attr-defined]
        elif lay in SEG_LAYOUTS:
            continue
        else:
            b.set(x.bytes.data, b.c(ALIGN))
            continue
        b.set(x.bytes.data, _sized(b, x, count, ALIGN if lay == "vec" else 1))


class SizeTiles(ModulePass):
    """Rows per tile, row pitch, queue depth and every buffer's bytes (see the module docstring)."""

    name = "size-tiles"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, t.KernelOp):
                self.size(k)

    @staticmethod
    def size(k: t.KernelOp) -> None:
        tiling, bufs = _kernel_parts(k)
        b = _Builder(tiling)
        ub = b.platform("ub_bytes")
        cores = b.platform("cores")
        rd = rows_dim(k)
        n = b.dim(rd) if rd else b.c(1)
        cols = b.dim(cols_dim(k))
        sizes = [_itemsize(x) for x in bufs if x.attributes["layout"].data in ("tile", "row")]  # type: ignore[attr-defined]
        align = ALIGN // min(sizes, default=ALIGN)
        if k.attributes.get("schedule") == StringAttr("chain"):  # tiles of a block's columns
            cols = b.c(CHAIN_BLOCK)
        pitch = b.set("pitch", b.select(b.add(ir.CmpOp("gt", cols, b.c(0))), b.round_up(cols, align), b.c(align)))

        def cost(depth_q: int) -> tuple[SSAValue, SSAValue, SSAValue]:
            """(bytes per row of a tile, bytes independent of the rows, bytes per column of the
            column-sum phase's chunk) with queues depth_q deep. The chunk's buffers are counted at
            MIN_COL_CHUNK columns here: the rows never depend on the number of cores."""
            per_row, fixed, per_col = b.c(0), b.c(0), b.c(0)
            for x in bufs:
                nb = x.depth.data if x.kind.data == t.BufferKind.CALC else min(x.depth.data, depth_q)
                lay, sz = x.attributes["layout"].data, _itemsize(x)  # type: ignore[attr-defined]
                if _is_mask(x):  # a bit an element, and its roundings (under MASK_SLACK bytes)
                    fixed = b.bin(ir.AddOp, fixed, b.c(nb * MASK_SLACK))
                    if lay == "tile":  # (pitch is a multiple of 8 elements)
                        per_row = b.bin(ir.AddOp, per_row, b.bin(ir.MulOp, b.bin(ir.DivOp, pitch, b.c(8)), b.c(nb)))
                    elif lay == "vec":  # (a byte a row: more than enough)
                        per_row = b.bin(ir.AddOp, per_row, b.c(nb))
                    elif x.attributes["cols"].data == t.COL_CHUNK:  # type: ignore[attr-defined]
                        per_col = b.bin(ir.AddOp, per_col, b.c(nb))
                        fixed = b.bin(ir.AddOp, fixed, b.c(nb * MIN_COL_CHUNK))
                    else:
                        fixed = b.bin(ir.AddOp, fixed, b.bin(ir.MulOp, b.bin(ir.DivOp, pitch, b.c(8)), b.c(nb)))
                    continue
                if _align(x) > ALIGN:  # (its padding, at most)
                    fixed = b.bin(ir.AddOp, fixed, b.c(nb * _align(x)))
                if lay == "tile":
                    per_row = b.bin(ir.AddOp, per_row, b.bin(ir.MulOp, pitch, b.c(nb * sz)))
                elif lay == "vec":
                    per_row = b.bin(ir.AddOp, per_row, b.c(nb * sz))
                    fixed = b.bin(ir.AddOp, fixed, b.c(nb * ALIGN))
                elif lay == "row" and x.attributes["cols"].data == t.COL_CHUNK:  # type: ignore[attr-defined]
                    per_col = b.bin(ir.AddOp, per_col, b.c(nb * sz))
                    fixed = b.bin(ir.AddOp, fixed, b.c(nb * sz * MIN_COL_CHUNK))
                elif lay == "row":
                    fixed = b.bin(ir.AddOp, fixed, b.bin(ir.MulOp, pitch, b.c(nb * sz)))
                elif lay in SEG_LAYOUTS:  # sized by size_segments
                    fixed = b.bin(ir.AddOp, fixed, b.params[x.bytes.data])
                else:  # scratch: one 32-byte block
                    fixed = b.bin(ir.AddOp, fixed, b.c(nb * ALIGN))
            return per_row, fixed, per_col

        def rows_for(c: tuple[SSAValue, SSAValue, SSAValue]) -> SSAValue:
            per_row, fixed, _ = c
            room = b.bin(ir.SubOp, ub, fixed)
            fits = b.add(ir.AndOp(b.add(ir.CmpOp("gt", room, b.c(0))), b.add(ir.CmpOp("gt", per_row, b.c(0)))))
            safe = b.add(ir.MaxOp(per_row, b.c(1)))
            return b.select(fits, b.bin(ir.DivOp, room, safe), b.c(0))

        if k.attributes.get("schedule") == StringAttr("chain"):
            SizeTiles.size_chain(k, b, bufs, ub, cores, cost)
            return
        if k.attributes.get("schedule") == StringAttr("check"):  # scalar code only: no buffers
            for name, v in (("nbuf", 1), ("rows", 1), ("col_chunk", 8)):
                b.set(name, b.c(v))
            rows = [b.dim(x.data) for x in k.attributes["rows"].data]  # type: ignore[attr-defined]
            most = b.c(0)
            for r in rows:
                most = b.add(ir.MaxOp(most, r))
            b.set("groups", most)
            return
        seg_rows = SizeTiles.size_segments(k, b, bufs, n, cols, cores)
        c2, c1 = cost(2), cost(1)
        if k.attributes.get("schedule") == StringAttr("streamed"):
            SizeTiles.size_streamed(k, b, bufs, n, cols, align, cores, ub, cost)
            return
        double, single = rows_for(c2), rows_for(c1)
        two = b.add(ir.CmpOp("ge", double, b.c(1)))
        b.set("nbuf", b.select(two, b.c(2), b.c(1)))
        rows = b.select(two, double, single)
        b.check(b.add(ir.CmpOp("ge", rows, b.c(1))),
                "a whole row does not fit the unified buffer (the column-tile kernel takes over)")
        rows = b.add(ir.MinOp(rows, b.c(MAX_ROWS)))  # DataCopyPad moves at most 4095 rows at once
        if seg_rows is not None:  # row tiles inside a scatter-add's blocks
            rows = b.add(ir.MinOp(rows, seg_rows))
        rows = b.set("rows", b.add(ir.MinOp(rows, b.add(ir.MaxOp(n, b.c(1))))))
        # the column-sum phase's chunk: the cores share the columns, within what the walk leaves
        per_row, fixed, per_col = (b.select(two, x2, x1) for x2, x1 in zip(c2, c1, strict=True))
        left = b.bin(ir.SubOp, ub, b.bin(ir.AddOp, fixed, b.bin(ir.MulOp, per_row, rows)))
        room_cols = b.bin(ir.DivOp, left, b.add(ir.MaxOp(per_col, b.c(1))))
        room_cols = b.bin(ir.MulOp, b.bin(ir.DivOp, room_cols, b.c(8)), b.c(8))
        cc = b.round_up(b.cdiv(b.add(ir.MaxOp(cols, b.c(1))), cores), 8)
        cc = b.add(ir.MinOp(b.add(ir.MinOp(cc, b.c(MAX_COL_CHUNK))), b.bin(ir.AddOp, room_cols, b.c(MIN_COL_CHUNK))))
        cc = b.set("col_chunk", cc)
        # rows of no element (a zero-length row dim) need no walk at all
        tiles = b.set("tiles", b.select(b.add(ir.CmpOp("gt", cols, b.c(0))), b.cdiv(n, rows), b.c(0)))
        if seg_rows is not None:  # the walk shares out blocks
            tiles = b.params["seg_blocks"]
        # column reductions: a partial row per GROUP_ROWS rows or so (a group is whole tiles)
        partials = any(isinstance(op, t.WorkspaceOp) for op in k.body.block.walk())
        group = b.cdiv(b.c(GROUP_ROWS), rows) if partials else b.c(1)
        group = b.set("group", group)
        b.set("groups", b.cdiv(tiles, group))
        _buffer_bytes(b, bufs, rows, pitch, cc)

    @staticmethod
    def size_chain(k: t.KernelOp, b: _Builder, bufs: list[t.BufferOp], ub: SSAValue, cores: SSAValue,
                   cost: object) -> None:
        """A matmul chain (opgen/tile/chain.py): tiles of one block's ``CHAIN_BLOCK`` columns, as
        many rows (at most a block) as fit; ``blocks`` of ``blk`` rows the pass owns (none when
        its outputs are empty: ``CHAIN_BLOCK`` rows, or fewer — a multiple of 16, the cube's
        fractal — when that leaves vector cores idle) and ``xblocks`` spans of the other dim."""
        costs = [cost(2), cost(1)]  # type: ignore[operator]
        fit = []
        for per_row, fixed, _ in costs:
            room = b.bin(ir.SubOp, ub, fixed)
            fit.append(b.select(b.add(ir.CmpOp("gt", room, b.c(0))), b.bin(ir.DivOp, room, per_row), b.c(0)))
        two = b.add(ir.CmpOp("ge", fit[0], b.c(1)))
        b.set("nbuf", b.select(two, b.c(2), b.c(1)))
        rows = b.select(two, fit[0], fit[1])
        b.check(b.add(ir.CmpOp("ge", rows, b.c(1))), "one tile row of a matmul chain does not fit the unified buffer")
        rows = b.set("rows", b.add(ir.MinOp(rows, b.c(CHAIN_BLOCK))))
        own, oth, *widths = (b.dim(x.data) for x in k.attributes["blocks"].data)  # type: ignore[attr-defined]
        empty = b.add(ir.CmpOp("eq", own, b.c(0)))
        for w in widths:
            empty = b.add(ir.OrOp(empty, b.add(ir.CmpOp("eq", w, b.c(0)))))
        share = b.bin(ir.MulOp, b.bin(ir.DivOp, b.bin(ir.DivOp, own, b.add(ir.MaxOp(cores, b.c(1)))), b.c(16)), b.c(16))
        blk = b.set("blk", b.add(ir.MinOp(b.c(CHAIN_BLOCK), b.add(ir.MaxOp(share, b.c(16))))))
        b.set("blocks", b.select(empty, b.c(0), b.cdiv(own, blk)))
        b.set("xblocks", b.cdiv(oth, b.c(CHAIN_SPAN)))
        b.set("groups", b.params["blocks"])
        b.set("col_chunk", b.c(CHAIN_BLOCK))
        _buffer_bytes(b, bufs, rows, b.params["pitch"], b.params["col_chunk"])

    @staticmethod
    def size_segments(k: t.KernelOp, b: _Builder, bufs: list[t.BufferOp], n: SSAValue, cols: SSAValue,
                      cores: SSAValue) -> SSAValue | None:
        """A scatter-add walk's blocks (``seg_rows``, ``seg_blocks``) and its segment buffers'
        bytes; None for other kernels."""
        if not any(isinstance(op, t.SegmentsOp) for op in k.body.block.walk()):
            return None
        seg_rows = b.add(ir.MinOp(b.add(ir.MaxOp(b.cdiv(n, cores), b.c(1))), b.c(SEG_ROWS)))
        seg_rows = b.set("seg_rows", seg_rows)
        b.set("seg_blocks", b.select(b.add(ir.CmpOp("gt", cols, b.c(0))), b.cdiv(n, seg_rows), b.c(0)))
        b.set("seg_window", b.c(SEG_WINDOW))
        b.set("seg_scan", b.c(SEG_SCAN))
        for x in bufs:
            lay = x.attributes["layout"].data  # type: ignore[attr-defined]
            if lay == "segrows":
                b.set(x.bytes.data, b.round_up(b.bin(ir.MulOp, b.bin(ir.AddOp, seg_rows, b.c(1)), b.c(4)), ALIGN))
            elif lay == "segwin":
                b.set(x.bytes.data, b.c(4 * SEG_WINDOW))
            elif lay == "segchunk":
                b.set(x.bytes.data, b.c(4 * SEG_SCAN))
        return seg_rows

    @staticmethod
    def size_streamed(k: t.KernelOp, b: _Builder, bufs: list[t.BufferOp], n: SSAValue, cols: SSAValue, align: int,
                      cores: SSAValue, ub: SSAValue, cost: object) -> None:
        """Column tiles: one row per tile, the longest chunk of columns (a multiple of the alignment)
        whose buffers fit; the tile's pitch is the chunk."""
        del cost
        per_col, fixed = b.c(0), b.c(0)
        for x in bufs:
            nb = x.depth.data
            lay, sz, xc = x.attributes["layout"].data, _itemsize(x), x.attributes["cols"].data  # type: ignore[attr-defined]
            if _is_mask(x):  # (a byte a column: more than enough)
                sz = 1
                fixed = b.bin(ir.AddOp, fixed, b.c(nb * MASK_SLACK))
            elif lay in ("tile", "row", "vec") and _align(x) > ALIGN:  # (its padding, at most)
                fixed = b.bin(ir.AddOp, fixed, b.c(nb * _align(x)))
            if lay in ("tile", "row") and xc != t.COL_CHUNK:  # one row of the chunk
                per_col = b.bin(ir.AddOp, per_col, b.c(nb * sz))
            elif lay == "row":  # the column-sum phase: at least MIN_COL_CHUNK columns
                fixed = b.bin(ir.AddOp, fixed, b.c(nb * sz * MIN_COL_CHUNK))
            elif lay in SEG_LAYOUTS:
                fixed = b.bin(ir.AddOp, fixed, b.params[x.bytes.data])
            else:
                fixed = b.bin(ir.AddOp, fixed, b.c(nb * ALIGN))
        room = b.bin(ir.SubOp, ub, fixed)
        chunk = b.bin(ir.DivOp, b.add(ir.MaxOp(room, b.c(0))), b.add(ir.MaxOp(per_col, b.c(1))))
        chunk = b.bin(ir.MulOp, b.bin(ir.DivOp, chunk, b.c(align)), b.c(align))
        chunk = b.add(ir.MinOp(chunk, b.round_up(b.add(ir.MaxOp(cols, b.c(1))), align)))
        b.check(b.add(ir.CmpOp("ge", chunk, b.c(align))), "not even one 32-byte column tile fits the unified buffer")
        b.set("nbuf", b.c(2))
        b.set("rows", b.c(1))
        pitch = b.set("pitch", chunk)
        b.set("chunk", chunk)
        b.set("chunks", b.cdiv(cols, chunk))
        left = b.bin(ir.SubOp, room, b.bin(ir.MulOp, per_col, chunk))
        cc_bytes = b.c(sum(_itemsize(x) * x.depth.data for x in bufs if x.attributes["cols"].data == t.COL_CHUNK) or 1)  # type: ignore[attr-defined]
        room_cols = b.bin(ir.MulOp, b.bin(ir.DivOp, b.bin(ir.DivOp, left, cc_bytes), b.c(8)), b.c(8))
        cc = b.round_up(b.cdiv(b.add(ir.MaxOp(cols, b.c(1))), cores), 8)
        cc = b.add(ir.MinOp(b.add(ir.MinOp(cc, b.c(MAX_COL_CHUNK))), b.bin(ir.AddOp, room_cols, b.c(MIN_COL_CHUNK))))
        cc = b.set("col_chunk", cc)
        tiles = b.set("tiles", b.select(b.add(ir.CmpOp("gt", cols, b.c(0))), n, b.c(0)))
        if "seg_blocks" in b.params:  # the walk shares out blocks
            tiles = b.params["seg_blocks"]
        b.set("group", b.c(1))
        b.set("groups", tiles)
        for x in bufs:
            lay = x.attributes["layout"].data  # type: ignore[attr-defined]
            if lay in ("tile", "row"):
                width = cc if x.attributes["cols"].data == t.COL_CHUNK else pitch  # type: ignore[attr-defined]
                nbytes = _sized(b, x, width)
            elif lay == "vec" and (_is_mask(x) or _align(x) > ALIGN):  # (one row)
                nbytes = _sized(b, x, b.c(1), ALIGN)
            elif lay in SEG_LAYOUTS:
                continue
            else:
                nbytes = b.c(ALIGN)
            b.set(x.bytes.data, nbytes)


class SplitCores(ModulePass):
    """The cores a launch uses: as many as there are row-tile groups (or scatter-add blocks) or,
    with a column-sum phase, column chunks to share out."""

    name = "split-cores"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, t.KernelOp):
                tiling, _ = _kernel_parts(k)
                b = _Builder(tiling)
                cores = b.platform("cores")
                cols = b.dim(cols_dim(k))
                chunks = b.set("col_chunks", b.cdiv(cols, b.params["col_chunk"]))
                if any(isinstance(x, t.TileMatmulOp) for x in k.body.block.walk()):
                    # a kernel of the matrix unit: launched on AI cores of one cube and two vector
                    # cores each; every vector core owns one block of rows of the workspace
                    aic = b.cdiv(cores, b.c(2))
                    dim = b.set("block_dim", b.add(ir.MaxOp(b.add(ir.MinOp(aic, b.cdiv(b.params["blocks"], b.c(2)))),
                                                            b.c(1))))
                    b.set("ws_rows", b.bin(ir.MulOp, b.bin(ir.MulOp, dim, b.c(2)), b.c(CHAIN_BLOCK)))
                    g_rows = k.attributes["g_rows"].data  # type: ignore[attr-defined]
                    b.set("ws_grows", b.bin(ir.MulOp, b.bin(ir.MulOp, dim, b.c(2)), b.c(g_rows)))
                    continue
                if k.attributes.get("schedule") == StringAttr("check"):  # a 32-byte slot per core
                    dim = b.set("block_dim", b.add(ir.MaxOp(b.add(ir.MinOp(cores, b.params["groups"])), b.c(1))))
                    b.set("flag_words", b.bin(ir.MulOp, dim, b.c(8)))
                    continue
                combine = any(isinstance(x, t.SyncAllOp) for x in k.body.block.walk())  # a column-sum phase
                work = b.add(ir.MaxOp(b.params["groups"], chunks)) if combine else b.params["groups"]
                b.set("block_dim", b.add(ir.MaxOp(b.add(ir.MinOp(cores, work)), b.c(1))))


class PlanWorkspace(ModulePass):
    """Offsets of the tiling data and of every workspace region, and the workspace's size."""

    name = "plan-workspace"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, t.KernelOp):
                tiling, _ = _kernel_parts(k)
                b = _Builder(tiling)
                off = b.c(TILING_BYTES)  # the tiling data first
                for w in k.body.block.walk():
                    if not isinstance(w, t.WorkspaceOp):
                        continue
                    gm = t.gm_type(w.result)
                    count = b.c(dtypes.by_name(gm.dtype).itemsize)
                    for d in gm.shape:
                        v = b.params[p] if (p := t.dim_param(d)) else b.dim(d)
                        limit = b.bin(ir.DivOp, b.c(2**62), b.add(ir.MaxOp(v, b.c(1))))
                        b.check(b.add(ir.CmpOp("le", count, limit)), "the workspace would not fit in 64 bits")
                        count = b.bin(ir.MulOp, count, v)
                    b.set(w.offset.data, off)
                    off = b.bin(ir.AddOp, off, b.round_up(count, 64))
                if any(isinstance(x, t.TileMatmulOp) for x in k.body.block.walk()):
                    # the Matmul API's system workspace comes first; the kernel's own after it
                    sys_ws = b.set("sys_ws", b.platform("sys_ws_bytes"))
                    off = b.bin(ir.AddOp, off, sys_ws)
                b.set("ws_bytes", off)
