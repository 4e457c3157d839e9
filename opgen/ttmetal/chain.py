"""Matmul chains on TT-Metal: the tile level's chain kernels (opgen/tile/chain.py) and their kernel
of data checks, lowered by ``lower-to-ttkernel`` (opgen/ttmetal/lower.py calls these).

A chain kernel walks, per core, blocks of output rows; per span of the other dim it recomputes a
product into the core's region of the workspace, computes ``G`` from it tile by tile, multiplies
``G`` (split into a rounded high part and its rounded remainder) and adds the product into the
block's f32 accumulator. On Tensix:

* **``tile.matmul``** -> a unit of all three kernels, in one of two schedules chosen by the host
  (``matmul``): a *panel* (the operand with at most 4 rows or columns of output tiles kept whole
  in L1, the other streamed once, one output column or row per DST section) when it fits
  ``PANEL_BYTES``, else *groups* of 4 output tiles of a row (A's tile read once per group, B's per
  output tile). Compute accumulates ``matmul_tiles`` over the inner tiles in order in one DST
  section (f32 accumulation: the same sum in either schedule, on any grid) and packs the tiles;
  the writer writes them. The matrix unit transposes its second operand itself
  (``matmul_init(.., transpose)``); a transposed first operand is transposed by the reader in L1.
  The inner dim's last tile has its tail zeroed by the reader (tile padding is not data, and
  0 x NaN is NaN). Operands are bf16: the FPU multiplies them exactly (f32 operands would be read
  as TF32), products are summed in f32.
* **``tile.fence``** (the core's DRAM writes complete before its later reads): the writer waits
  for its writes (``noc_async_write_barrier``) and pushes a token into a one-page CB, which the
  reader waits for and pops before its next read.
* **One-hot tiles** (a ``tile.for`` building a tile with ``tile.set_at`` from scalar loads): the
  reader builds the tile in L1 — zeroed pages, the loop's scalars evaluated by the reader
  (``tile.load`` / ``tile.load_bit`` read an element of a row-layout tensor) and one word set
  per row.
* **Col values of 1-d tensors** (``[R, 1]``: ``logits_max`` at the block's rows) -> column 0 of
  a tile, built by the reader from the row-layout tensor.
* **The kernel of checks** (``schedule = "check"``: ``tile.fail_unless`` over rows) -> host row
  checks (``ttk.row_check``): the host reads the tensors (blocking) and evaluates the condition
  per row before anything is enqueued; a failing row is an error, nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import StringAttr
from xdsl.ir import Block, Region, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.ttmetal import dialect as k
from opgen.ttmetal.sizes import TILE

if TYPE_CHECKING:
    from opgen.ttmetal.lower import KernelBuilder, Lowering

def elem_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype``."""
    return dtypes.by_name(dtype).itemsize


def _cbn(i: int) -> str:
    return f"tt::CBIndex::c_{i}"


# ------------------------------------------------------------------------------ the check kernel
def row_checks(low: Lowering, kernel: t.KernelOp) -> list[k.RowCheckOp]:
    """The host row checks of a kernel of checks (one per ``tile.fail_unless``), their host
    scalars emitted into ``low.host``."""
    messages = [m.data for _, m in (c.data for c in kernel.attributes["checks"].data)]  # type: ignore[attr-defined]
    args = dict(zip([a.data for a in kernel.arg_names.data], kernel.body.block.args, strict=True))
    arg_of = {v: n for n, v in args.items()}
    return [_row_check(low, fail, arg_of, messages[fail.bit.data])
            for fail in kernel.walk() if isinstance(fail, t.FailUnlessOp)]


def _row_check(low: Lowering, fail: t.FailUnlessOp, arg_of: dict[SSAValue, str], message: str) -> k.RowCheckOp:
    """``fail``'s condition per row of its walk, as a host row function; scalar loads read the
    tensors the host reads back."""
    from opgen.ttmetal.lower import TtUnsupported, host_region_val

    loop = fail.parent_op()
    if not isinstance(loop, t.ForOp) or not isinstance(loop.lo.owner, t.BlockIdxOp):
        raise TtUnsupported(low.name, "a data check outside the walk over the rows")
    block = Block(arg_types=[loop.iv.type])
    reads: list[str] = []

    def leaf(x: SSAValue) -> SSAValue:
        op = x.owner
        if not isinstance(op, (t.LoadOp, t.LoadBitOp)):
            raise TtUnsupported(low.name, f"a data check computed with {getattr(op, 'name', 'a loop variable')}")
        name = arg_of[op.src]
        if name not in reads:
            reads.append(name)
        load = k.HostLoadOp(name, val(op.pos), op.result.type, isinstance(op, t.LoadBitOp))
        block.add_op(load)
        return load.result

    val = host_region_val(block, {loop.iv: block.args[0]}, arg_of, leaf)
    block.add_op(k.RowOkOp(val(fail.cond)))
    return k.RowCheckOp(reads, message, low.host_val(loop.hi), Region(block))


# ------------------------------------------------------------------------------ fences
def fence(low: Lowering) -> None:
    """The core's DRAM writes (the writer's) complete before its later reads (the reader's)."""
    if low.fence_cb < 0:
        low.fence_cb = low.cb("UInt32", 1, "fence token (writer -> reader: the core's writes are done)", "fence")
    f = _cbn(low.fence_cb)
    w, r = low.w, low.r
    w.call("noc_async_write_barrier")
    w.call("cb_reserve_back", f, "1")
    w.call("cb_push_back", f, "1")
    r.call("cb_wait_front", f, "1")
    r.call("cb_pop_front", f, "1")


def reader_scratch(low: Lowering, pages: int = 1, what: str = "scalar loads") -> SSAValue:
    """The reader's L1 scratch of ``pages`` 128-byte pages (scalar loads; a scatter plan's page
    cache), reserved before its loops; pushed at the end of the launch and popped there by
    compute. One per launch."""
    if low.scratch_cb < 0:
        low.scratch_cb = low.cb("UInt32", pages, f"the reader's scratch ({what})", "in")
        low.scratch_pages = pages
        with low.r.prologue():
            low.r.call("cb_reserve_back", _cbn(low.scratch_cb), str(pages))
            low.scratch_l1 = low.r.call("get_write_ptr", _cbn(low.scratch_cb), result=True)
    assert low.scratch_pages == pages, "one reader scratch per launch"
    return low.scratch_l1


def end_scratch(low: Lowering) -> None:
    """At the end of a launch: the reader's scratch pushed, and popped by compute."""
    if low.scratch_cb >= 0:
        n = str(low.scratch_pages)
        low.r.call("cb_push_back", _cbn(low.scratch_cb), n)
        low.c.call("cb_wait_front", _cbn(low.scratch_cb), n)
        low.c.call("cb_pop_front", _cbn(low.scratch_cb), n)


# ------------------------------------------------------------------------------ reader-built tiles
def copy_in_col(low: Lowering, op: t.CopyInOp) -> None:
    """A col value ``[R, 1]`` of a 1-d tensor: elements ``[row0, row0 + nrows)`` in column 0 of a tile."""
    from opgen.ttmetal.lower import Node, TtUnsupported

    gm = op.src
    dt = gm.type.dtype
    if len(gm.type.shape) != 1 or dt not in ("f32", "bf16"):
        raise TtUnsupported(low.name, "copying in a col tile of a 2-d or integer tensor")
    fmt, name = low.gm_format(gm), low.gm_name(gm)
    cb = low.cb(fmt, 1, f"{name} (col: the block's rows)", "in")
    if len(low.scopes) > 1:
        low.dbuf.add(cb)
    r = low.r
    acc = r.accessor(gm, name)
    scratch = reader_scratch(low)
    r.call("cb_reserve_back", _cbn(cb), "1")
    r.call("opgen_tt_col_from_row", acc, str(elem_bytes(dt)), r.val(op.row0), r.val(op.nrows),
           r.call("get_write_ptr", _cbn(cb), result=True), scratch)
    r.call("cb_push_back", _cbn(cb), "1")
    low.c.call("cb_wait_front", _cbn(cb), "1")
    low.scopes[-1].append((cb, None))
    low.env[op.results[0]] = Node("leaf", cb=cb, mode="first")


def is_one_hot(op: t.ForOp) -> bool:
    """A loop building a tile with ``tile.set_at`` (the tile level's one-hot walk)."""
    return len(op.inits) == 1 and any(isinstance(o, t.SetAtOp) for o in op.body.block.ops)


def one_hot(low: Lowering, op: t.ForOp) -> None:
    """The loop's tile, built by the reader in L1 (see the module docstring)."""
    from opgen.ttmetal.lower import SCALAR_OPS, Node, TtUnsupported

    init = op.inits[0]
    tt_ = ir.tensor_type(init)
    if tt_.dtype != "f32" or not isinstance(init.owner, ir.BroadcastOp) or \
            not isinstance(init.owner.operands[0].owner, ir.ConstantOp) or \
            float(init.owner.operands[0].owner.value.value.data) != 0.0:
        raise TtUnsupported(low.name, "a tile built element by element from anything but f32 zeros")
    sets = [o for o in op.body.block.ops if isinstance(o, t.SetAtOp)]
    if len(sets) != 1 or sets[0].acc is not op.body.block.args[1]:
        raise TtUnsupported(low.name, "a tile built with more than one tile.set_at per step")
    dim = tt_.shape[1]
    cap = low.cap_tiles(dim)
    cb = low.cb("Float32", dim, "one-hot tile (built by the reader)", "in")
    if len(low.scopes) > 1:
        low.dbuf.add(cb)
    r = low.r
    scratch = reader_scratch(low)
    rcap = r.val(cap)
    r.call("cb_reserve_back", _cbn(cb), rcap)
    base = r.call("get_write_ptr", _cbn(cb), result=True)
    r.call("opgen_tt_zero_l1", base, r.arith(ir.MulOp, rcap, r.const(4096)))
    iv = r.open_loop(r.val(op.lo), r.val(op.hi), r.val(op.step), op.iv.name_hint or "h")
    r.maps[-1][op.iv] = iv
    for o in op.body.block.ops:
        if isinstance(o, t.LoadOp | t.LoadBitOp):
            name = low.gm_name(o.src)
            acc = r.accessor(o.src, name)
            if isinstance(o, t.LoadOp):
                v = r.call("opgen_tt_load_elem", acc, str(elem_bytes(o.src.type.dtype)), r.val(o.pos), scratch,
                           result=True)
                if o.src.type.dtype == "bool":  # (the byte as a word: its truth, as the bool it holds)
                    v = r.emit(ir.CmpOp("ne", v, r.const(0))).results[0]
            else:
                bit = r.call("opgen_tt_load_bit", acc, "1" if o.src.type.dtype == "u8" else "0", r.val(o.pos),
                             scratch, result=True)
                v = r.emit(ir.CmpOp("ne", bit, r.const(0))).results[0]
            r.maps[-1][o.result] = v
        elif isinstance(o, t.SetAtOp):
            if ir.tensor_type(o.value).dtype != "f32":
                raise TtUnsupported(low.name, "a tile element set to a non-f32 value")
            r.call("opgen_tt_set_word", base, r.val(o.row), r.val(o.col), r.val(o.ncols), r.val(o.value))
        elif isinstance(o, (t.YieldOp, *SCALAR_OPS)):
            continue  # (scalars: evaluated on use)
        else:
            raise TtUnsupported(low.name, f"{o.name} in a tile built element by element")
    r.close_loop()
    r.call("cb_push_back", _cbn(cb), rcap)
    cc = low.c.val(cap)
    low.c.call("cb_wait_front", _cbn(cb), cc)
    low.scopes[-1].append((cb, cc))
    low.env[op.results[0]] = Node("leaf", cb=cb, mode="tile", n=low.ncols_tiles(sets[0].ncols))


# ------------------------------------------------------------------------------ matmuls
def _ld(low: Lowering, gm: SSAValue) -> SSAValue:
    """A tile-level scalar: the row length of a 2-d view (a dim, a tiling parameter or a number)."""
    sym = gm.type.shape[1]
    if sym.isdigit():
        o = ir.ConstantOp(int(sym), "i64")
    elif sym in low.params:
        o = t.ParamOp(sym)
    else:
        o = ir.DimOp(sym)
    low._scratch.add_op(o)
    return o.results[0]


class _View:
    """Tile coordinates of a matmul operand in kernel ``b``: element offset -> first tile row and
    column; page of tile (tr, tc) = (row0/32 + tr) * tiles(ld) + col0/32 + tc."""

    def __init__(self, low: Lowering, b: KernelBuilder, gm: SSAValue, off: SSAValue):
        ld = b.val(_ld(low, gm))
        o = b.val(off)
        row0 = b.arith(ir.DivOp, o, ld)
        col0 = b.arith(ir.SubOp, o, b.arith(ir.MulOp, row0, ld))
        c31, c32 = b.const(TILE - 1), b.const(TILE)
        self.b = b
        self.tr0, self.tc0 = b.arith(ir.DivOp, row0, c32), b.arith(ir.DivOp, col0, c32)
        self.wt = b.arith(ir.DivOp, b.arith(ir.AddOp, ld, c31), c32)

    def page(self, tr: SSAValue, tc: SSAValue) -> SSAValue:
        b = self.b
        return b.arith(ir.AddOp, b.arith(ir.MulOp, b.arith(ir.AddOp, self.tr0, tr), self.wt),
                       b.arith(ir.AddOp, self.tc0, tc))


#: L1 a matmul's resident operand panel may take per core (the rest of a chain's launch: ~0.2 MB)
PANEL_BYTES = 1 << 20


def panel_side(op: t.TileMatmulOp) -> str:
    """Which operand a matmul keeps resident in L1 (``a``: at most ``DST_SLOTS`` rows of output
    tiles by its bounds, ``b``: at most that many columns; ``""``: neither): with a panel, every
    tile of the other operand is read once per unit, and each serves a column (row) of outputs."""
    from opgen.ttmetal.lower import DST_SLOTS

    m, n = (x.data for x in op.bounds.data[:2])
    if m.isdigit() and int(m) <= DST_SLOTS * TILE:
        return "a"
    if n.isdigit() and int(n) <= DST_SLOTS * TILE:
        return "b"
    return ""


def matmul(low: Lowering, op: t.TileMatmulOp) -> None:
    """``tile.matmul`` as a unit of the three kernels (see the module docstring): with the panel
    schedule when the panel fits ``PANEL_BYTES`` (a host decision, passed as a 0/1 runtime
    argument that is the trip count of the schedule's loop), else output tiles in groups of
    ``DST_SLOTS`` along a row."""
    from opgen.ttmetal.lower import DST_SLOTS, TILE_BYTES, TtUnsupported

    for x in (op.a, op.b):
        if x.type.dtype != "bf16":
            raise TtUnsupported(low.name, f"a matmul of {x.type.dtype} operands (the FPU multiplies bf16 exactly; "
                                          "it reads f32 as TF32)")
    ta, tb = bool(op.trans_a.data), bool(op.trans_b.data)
    fa, fb, fc = (low.gm_format(x) for x in (op.a, op.b, op.c))
    g_max = DST_SLOTS  # output tiles per DST section
    mt, nt, kt = (low.ncols_tiles(v) for v in (op.m, op.n, op.k))
    side = panel_side(op)
    use_panel = None
    if side:  # host: the panel's pages (DST_SLOTS x the inner dim's tiles) fit PANEL_BYTES
        fmt = fa if side == "a" else fb
        kb = op.bounds.data[2].data
        pages = low.host_op(ir.MulOp(low.hconst(g_max), low.host_op(ir.MaxOp(low.host_tiles(kb), low.hconst(1)))))
        fits = low.host_op(ir.CmpOp("le", low.host_op(ir.MulOp(pages, low.hconst(TILE_BYTES[fmt]))),
                                    low.hconst(PANEL_BYTES)))
        use_panel = low.host_op(ir.SelectOp(fits, low.hconst(1), low.hconst(0)))
        need = low.host_op(ir.SelectOp(fits, pages, low.hconst(1)))
        what = f"{low.gm_name(op.a if side == 'a' else op.b)} (a matmul's panel)"
        # one panel CB per launch, as large as its largest panel; every panel is pushed, waited
        # for and popped as the CB's whole capacity (runtime argument ``panel_pages``), so that
        # each starts at the CB's first page
        # (the kernels' ``panel_pages`` is bound to the CB's final pages by bind_panel_pages)
        if low.panel_cb < 0:
            low.panel_cb = low.cb(fmt, "panel", what, "in", host_pages=need)
        else:
            pcb = low.cbs[low.panel_cb]
            pcb.operands[0] = low.host_op(ir.MaxOp(pcb.pages, need))
            pcb.what = StringAttr(f"{pcb.what.data}; {what}")
        cp = low.panel_cb
        cap = {b: b.rt_arg("panel_pages", low.cbs[cp].pages) for b in (low.r, low.c)}
    ca = low.cb(fa, 2, f"{low.gm_name(op.a)} (matmul A tiles)", "in")
    cbb = low.cb(fb, 2 * g_max, f"{low.gm_name(op.b)} (matmul B tiles, a group's)", "in")
    co = low.cb(fc, 2, f"{low.gm_name(op.c)} (matmul C tiles)", "out")

    def schedule(b: KernelBuilder, panel: bool) -> None:
        """Open the loop of one iteration when the host chose this schedule, else of none."""
        flag = b.rt_arg(f"{op.sym.data}_panel", use_panel)
        b.open_loop(b.const(0), flag if panel else b.arith(ir.SubOp, b.const(1), flag), b.const(1), "p")

    # reader: operand tiles, the inner dim's tail zeroed
    r = low.r
    acc_a, acc_b = r.accessor(op.a, low.gm_name(op.a)), r.accessor(op.b, low.gm_name(op.b))
    va, vb = _View(low, r, op.a, op.a_off), _View(low, r, op.b, op.b_off)
    full = r.const(TILE)

    def read(cb: int, acc: str, page: SSAValue, keep: tuple, trans: bool, fmt: str,
             at: SSAValue | None = None) -> None:
        """One tile into ``cb`` (reserved and pushed), or to L1 address ``at`` of a reserved panel."""
        elem = str(TILE_BYTES[fmt] // 1024)
        if at is None:
            r.call("cb_reserve_back", _cbn(cb), "1")
        l1 = r.call("get_write_ptr", _cbn(cb), result=True) if at is None else at
        r.call("noc_async_read_page", page, acc, l1)
        r.call("noc_async_read_barrier")
        r.call("opgen_tt_keep", l1, elem, *keep)
        if trans:
            r.call("opgen_tt_transpose", l1, elem)
        if at is None:
            r.call("cb_push_back", _cbn(cb), "1")

    def valid(kk: SSAValue) -> SSAValue:
        return r.arith(ir.SubOp, r.val(op.k), r.arith(ir.MulOp, kk, r.const(TILE)))

    def read_a(cb: int, i: SSAValue, kk: SSAValue, at: SSAValue | None = None) -> None:
        v = valid(kk)
        read(cb, acc_a, va.page(kk, i) if ta else va.page(i, kk), (v, full) if ta else (full, v), ta, fa, at)

    def read_b(cb: int, kk: SSAValue, j: SSAValue, at: SSAValue | None = None) -> None:
        v = valid(kk)
        read(cb, acc_b, vb.page(j, kk) if tb else vb.page(kk, j), (full, v) if tb else (v, full), False, fb, at)

    def panel_at(base: SSAValue, x: SSAValue, kk: SSAValue, fmt: str) -> SSAValue:
        """L1 address of panel tile ``x * kt + kk``."""
        return r.arith(ir.AddOp, base, r.arith(ir.MulOp, r.arith(ir.AddOp, r.arith(ir.MulOp, x, r.val(kt)), kk),
                                                r.const(TILE_BYTES[fmt])))

    def loop(b: KernelBuilder, n: SSAValue, hint: str) -> SSAValue:
        """for x in [0, n) (a tile-level scalar)."""
        return b.open_loop(b.const(0), b.val(n), b.const(1), hint)

    if side:
        schedule(r, True)
        r.call("cb_reserve_back", _cbn(cp), cap[r])
        base = r.call("get_write_ptr", _cbn(cp), result=True)
        if side == "a":  # the panel: A's rows of tiles (i, kk); then B's column j, once each
            i = loop(r, mt, "i")
            kk = loop(r, kt, "kk")
            read_a(cp, i, kk, panel_at(base, i, kk, fa))
            r.close_loop()
            r.close_loop()
            r.call("cb_push_back", _cbn(cp), cap[r])
            j = loop(r, nt, "j")
            read_b(cbb, loop(r, kt, "kk"), j)
        else:  # the panel: B's columns of tiles (kk, j); then A's row i, once each
            j = loop(r, nt, "j")
            kk = loop(r, kt, "kk")
            read_b(cp, kk, j, panel_at(base, j, kk, fb))
            r.close_loop()
            r.close_loop()
            r.call("cb_push_back", _cbn(cp), cap[r])
            i = loop(r, mt, "i")
            read_a(ca, i, loop(r, kt, "kk"))
        for _ in range(3):
            r.close_loop()
        schedule(r, False)
    # (groups: for i, for j0 in steps of G: per inner tile kk, A (i, kk) once, B (kk, j) per j)
    i = loop(r, mt, "i")
    j0 = r.open_loop(r.const(0), r.val(nt), r.const(g_max), "j")
    ng = r.arith(ir.MinOp, r.arith(ir.SubOp, r.val(nt), j0), r.const(g_max))
    kk = loop(r, kt, "kk")
    read_a(ca, i, kk)
    g = r.open_loop(r.const(0), ng, r.const(1), "g")
    read_b(cbb, kk, r.arith(ir.AddOp, j0, g))
    for _ in range(4 + bool(side)):
        r.close_loop()

    # compute: per DST section, the inner tiles' products summed in order in each slot
    c = low.c

    def section(c_in0: int, c_in1: int, outer: int, n: SSAValue, idx: Callable[[SSAValue, SSAValue], tuple],
                per_slot: int | None = None) -> None:
        """One DST section: for kk, wait for one tile of the streamed CB (``outer``) and multiply
        it into slots 0..n-1 (``idx(kk, s)``: the tile indices in in0 and in1; ``per_slot``: a CB
        with one tile per slot, waited for and popped around its product); pack the slots."""
        c.call("tile_regs_acquire")
        c.call("reconfig_data_format_srca", _cbn(c_in1))  # (the matrix unit: in1 -> SrcA, in0 -> SrcB)
        c.call("reconfig_data_format_srcb", _cbn(c_in0))
        c.call("matmul_init", _cbn(c_in0), _cbn(c_in1), "1" if tb else "0")
        kk = loop(c, kt, "kk")
        c.call("cb_wait_front", _cbn(outer), "1")
        s = c.open_loop(c.const(0), n, c.const(1), "g")
        if per_slot is not None:
            c.call("cb_wait_front", _cbn(per_slot), "1")
        c.call("matmul_tiles", _cbn(c_in0), _cbn(c_in1), *idx(kk, s), s)
        if per_slot is not None:
            c.call("cb_pop_front", _cbn(per_slot), "1")
        c.close_loop()
        c.call("cb_pop_front", _cbn(outer), "1")
        c.close_loop()
        c.call("tile_regs_commit")
        c.call("tile_regs_wait")
        c.call("pack_reconfig_data_format", _cbn(co))
        s = c.open_loop(c.const(0), n, c.const(1), "g")
        c.call("cb_reserve_back", _cbn(co), "1")
        c.call("pack_tile", s, _cbn(co))
        c.call("cb_push_back", _cbn(co), "1")
        c.close_loop()
        c.call("tile_regs_release")

    if side:
        schedule(c, True)
        n_panel = c.val(mt if side == "a" else nt)
        c.call("cb_wait_front", _cbn(cp), cap[c])
        loop(c, nt if side == "a" else mt, "j" if side == "a" else "i")
        zero = c.const(0)
        if side == "a":  # slot s: output (s, j); A's tile (s, kk) in the panel
            section(cp, cbb, cbb, n_panel, lambda kk, s: (c.arith(ir.AddOp, c.arith(ir.MulOp, s, c.val(kt)), kk), zero))
        else:  # slot s: output (i, s); B's tile (kk, s) in the panel
            section(ca, cp, ca, n_panel, lambda kk, s: (zero, c.arith(ir.AddOp, c.arith(ir.MulOp, s, c.val(kt)), kk)))
        c.close_loop()
        c.call("cb_pop_front", _cbn(cp), cap[c])
        c.close_loop()
        schedule(c, False)
    # (groups: A's tile (i, kk) waited for once, B's tiles streamed: one per slot)
    loop(c, mt, "i")
    j0 = c.open_loop(c.const(0), c.val(nt), c.const(g_max), "j")
    ng = c.arith(ir.MinOp, c.arith(ir.SubOp, c.val(nt), j0), c.const(g_max))
    section(ca, cbb, ca, ng, lambda kk, s: ("0", "0"), per_slot=cbb)
    for _ in range(2 + bool(side)):
        c.close_loop()

    # writer: C's tiles in the order compute packs them
    w = low.w
    acc_c = w.accessor(op.c, low.gm_name(op.c))
    vc = _View(low, w, op.c, op.c_off)

    def write(i: SSAValue, j: SSAValue) -> None:
        w.call("cb_wait_front", _cbn(co), "1")
        w.call("noc_async_write_page", vc.page(i, j), acc_c, w.call("get_read_ptr", _cbn(co), result=True))
        w.call("noc_async_writes_flushed")
        w.call("cb_pop_front", _cbn(co), "1")

    if side:
        schedule(w, True)
        if side == "a":
            j = loop(w, nt, "j")
            write(loop(w, mt, "i"), j)
        else:
            i = loop(w, mt, "i")
            write(i, loop(w, nt, "j"))
        for _ in range(3):
            w.close_loop()
        schedule(w, False)
    i = loop(w, mt, "i")
    j0 = w.open_loop(w.const(0), w.val(nt), w.const(g_max), "j")
    ng = w.arith(ir.MinOp, w.arith(ir.SubOp, w.val(nt), j0), w.const(g_max))
    g = w.open_loop(w.const(0), ng, w.const(1), "g")
    write(i, w.arith(ir.AddOp, j0, g))
    for _ in range(3 + bool(side)):
        w.close_loop()
    w.call("noc_async_write_barrier")
    for cb in (ca, cbb, co):
        low.release(cb)


def bind_panel_pages(low: Lowering) -> None:
    """The runtime argument ``panel_pages`` of the launch's reader and compute: the panel CB's
    pages once every panel of the launch has grown it (its largest panel), before L1 planning."""
    if low.panel_cb < 0:
        return
    pages = low.cbs[low.panel_cb].pages
    for b in (low.r, low.c):
        if "panel_pages" in b.rt:
            b.rt["panel_pages"] = (b.rt["panel_pages"][0], pages)
