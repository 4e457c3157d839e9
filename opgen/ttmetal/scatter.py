"""Scatter-adds on TT-Metal (``out[idx[n]] += grad[n]``): owner computes, no atomics.

The tile level walks blocks of table rows, each with the segments of the indices that hit it
(``tile.segments``), and adds every hitting grad row into its table row (``tile.add_row``). On
TT-Metal the same sums are made per *unit* = (32-row table tile T, column tile j), the units
split over the cores in strips of ``STRIP`` consecutive units, so every output tile has one owner
and cores stay busy when the table is short or narrow:

* the host builds the plan once (``ttk.scatter_plan``): it reads the indices, refuses an
  out-of-range one before any launch, and groups each table tile's contributions into
  *batches*: batch k holds the k-th contribution (in ascending n) of each of the tile's rows;
* the reader of a unit reads the tile's header from the plan (one page, pushed to compute:
  compute reads the batch count with ``read_tile_value``), then per batch gathers the grad rows
  into a zeroed tile at their table rows (``opgen_tt_gather_rows``: two 16-element NOC reads
  per row); plan pages go through a small L1 cache, so the units of a strip (one table tile's
  column tiles, mostly) read them from DRAM once;
* compute adds the batches in order into one DST tile (f32) inside one section, so each table
  row sums its contributions in ascending n, on any number of cores (bitwise identical);
* the writer writes the tile (zero where nothing hit).

Each grad row is read once per column tile. A contribution of the form
``select(keep(row), grad_row * factor(row), 0)`` (padding_idx, scale_grad_by_freq) keeps its
per-row scalars: the plan's row function evaluates them per table row on the host (a row not
kept gets no contributions) and the tile's sums are multiplied by their factors (a column-0 tile
the reader builds) before the pack. Initial tables (embedding_backward's accumulate) are not
lowered yet.
"""

from __future__ import annotations

from xdsl.ir import Block, Region, SSAValue

from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.tile.dialect import INDEX
from opgen.ttmetal import dialect as k
from opgen.ttmetal.chain import reader_scratch
from opgen.ttmetal.lower import TILE, TILE_BYTES, Lowering, TtUnsupported, host_region_val

#: the plan's pages: 32 uint32
PLAN_PAGE = 128
#: the reader's plan page cache (templates/ttmetal/opgen_tt_dataflow.h.j2): the header cache (a
#: tag page, a data page), then the page cache (a tag page, PLAN_SLOTS direct-mapped data pages)
PLAN_SLOTS = 16
PLAN_CACHE_PAGES = 3 + PLAN_SLOTS
#: the most units a core walks in a row (strips of one table tile's column tiles share its plan
#: pages); fewer when the units are fewer than STRIP per core, so that every core has work
STRIP = 8


def _strip(v: SSAValue) -> SSAValue:
    while isinstance(v.owner, ir.CastOp | ir.BroadcastOp) and ir.tensor_type(v.owner.operands[0]).shape == \
            ir.tensor_type(v).shape:
        v = v.owner.operands[0]
    while isinstance(v.owner, ir.CastOp):
        v = v.owner.operands[0]
    return v


def _scalar_of(v: SSAValue) -> SSAValue | None:
    """The scalar a broadcast of a scalar broadcasts, else None."""
    if isinstance(v.owner, ir.BroadcastOp) and ir.tensor_type(v.owner.operands[0]).shape == ():
        return v.owner.operands[0]
    return None


def _is_zero(v: SSAValue) -> bool:
    s = _scalar_of(v)
    return s is not None and isinstance(s.owner, ir.ConstantOp) and float(s.owner.value.value.data) == 0.0


def _initial(v: SSAValue, low: Lowering) -> tuple[str, SSAValue | None] | None:
    """``select(flag, copy_in(table), 0)`` (or the copy alone) -> (table, flag), else None."""
    v = _strip(v)
    flag = None
    if isinstance(v.owner, ir.SelectOp) and _is_zero(v.owner.operands[2]) and _scalar_of(v.owner.operands[0]):
        flag = _scalar_of(v.owner.operands[0])
        v = _strip(v.owner.operands[1])
    if isinstance(v.owner, t.CopyInOp) and v.owner.src in low.arg_of and (flag is None or flag in low.arg_of):
        return low.arg_of[v.owner.src], flag
    return None


def _pattern(low: Lowering) -> tuple:
    """(indices, grad, out, N dim, table-rows dim, keep conditions, factors, the add, initial) of
    a scatter-add whose contribution is ``select(keep, row * factor, 0)`` with per-row scalars
    (any of them absent), onto zero or an initial table (``initial`` = (table, flag) or None),
    or TtUnsupported."""
    segs = [o for o in low.k.walk() if isinstance(o, t.SegmentsOp)]
    adds = [o for o in low.k.walk() if isinstance(o, t.AddRowOp)]
    outs = [o for o in low.k.walk() if isinstance(o, t.CopyOutOp)]
    ins = [o for o in low.k.walk() if isinstance(o, t.CopyInOp)]
    initial = None
    plain = len(segs) == len(adds) == len(outs) == 1 and len(ins) in (1, 2)
    if plain:  # the copied-out value: the sums, or an initial table plus the sums
        res = _strip(outs[0].value)
        if isinstance(res.owner, ir.AddOp):
            a, b = res.owner.operands
            for x, y in ((a, b), (b, a)):
                if _initial(x, low) is not None:
                    initial, res = _initial(x, low), _strip(y)
                    break
        ins = [i for i in ins if initial is None or low.arg_of.get(i.src) != initial[0]]  # the grad rows
        plain = len(ins) == 1
    keep: list[SSAValue] = []
    factors: list[SSAValue] = []
    if plain:
        v = _strip(adds[0].value)
        while isinstance(v.owner, ir.SelectOp) and _is_zero(v.owner.operands[2]) and \
                _scalar_of(v.owner.operands[0]) is not None:
            keep.append(_scalar_of(v.owner.operands[0]))
            v = _strip(v.owner.operands[1])
        while isinstance(v.owner, ir.MulOp):
            a, b = v.owner.operands
            if _scalar_of(b) is not None:
                factors.append(_scalar_of(b))
                v = _strip(a)
            elif _scalar_of(a) is not None:
                factors.append(_scalar_of(a))
                v = _strip(b)
            else:
                break
        zero = [f for f in low.k.walk() if isinstance(f, t.ForOp) and f.inits
                and isinstance(f.inits[0].owner, ir.BroadcastOp)]
        # the sums start at zero and are what is copied out (an initial table added, if any)
        plain = v.owner is ins[0] and len(zero) == 1 and _is_zero(zero[0].inits[0]) and res is zero[0].res[0]
    if not plain or segs[0].idx not in low.arg_of or ins[0].src not in low.arg_of or outs[0].dst not in low.arg_of:
        raise TtUnsupported(low.name, "scatter-adds whose contributions are not select(keep(row), grad_row * "
                                      "factor(row), 0) onto zero or an initial table")
    idx, grad, out = (low.arg_of[x] for x in (segs[0].idx, ins[0].src, outs[0].dst))
    return (idx, grad, out, low.args[grad].type.shape[0], low.args[out].type.shape[0], keep, factors, adds[0],
            initial)


def _row_fn(low: Lowering, add: t.AddRowOp, keep: list[SSAValue], factors: list[SSAValue]) -> Region:
    """The plan's row function: ``keep`` and ``factor`` of table row v, the tile level's scalars
    re-evaluated with the row walk fixed at v (one block of all rows: row v = tile v/32, row v%32
    of it; ``tile.seg_start(x)`` = the prefix count at x)."""
    block = Block(arg_types=[INDEX])
    v = block.args[0]
    out: dict[SSAValue, SSAValue] = {}

    def emit(op):
        block.add_op(op)
        return op.results[0] if op.results else None

    loops = []
    p = add.parent_op()
    while p is not None and not isinstance(p, t.KernelOp):
        if isinstance(p, t.ForOp):
            loops.append(p)
        p = p.parent_op()
    # innermost first: p (positions), r (rows of the tile), t (row tiles), b (blocks over cores)
    if len(loops) != 4:
        raise TtUnsupported(low.name, "a scatter-add walk of another shape")
    _, r_loop, t_loop, b_loop = loops
    c32 = emit(ir.ConstantOp(TILE, "i64"))
    tv = emit(ir.DivOp(v, c32))
    out[r_loop.iv] = emit(ir.SubOp(v, emit(ir.MulOp(tv, c32))))
    out[t_loop.iv] = tv
    out[b_loop.iv] = emit(ir.ConstantOp(0, "i64"))

    def leaf(x: SSAValue) -> SSAValue:
        op = x.owner
        if isinstance(op, Block):
            raise TtUnsupported(low.name, "a per-row factor that depends on the position")
        if isinstance(op, t.ParamOp):
            name = op.param.data
            if name == "rows":
                return c32
            if name == "seg_rows":  # one block of every row
                return emit(ir.DimOp(_rows_dim(low)))
            raise TtUnsupported(low.name, f"a per-row factor reading the tiling parameter {name}")
        if isinstance(op, t.SegStartOp):
            return emit(k.SegPrefixOp(val(op.row)))
        raise TtUnsupported(low.name, f"a per-row factor computed with {op.name}")

    val = host_region_val(block, out, low.arg_of, leaf)

    k_ = emit(ir.ConstantOp(1, "bool"))
    for cnd in keep:
        k_ = emit(ir.AndOp(k_, val(cnd)))
    f_ = emit(ir.ConstantOp(1.0, "f32"))
    for fac in factors:
        fv = val(fac)
        if ir.tensor_type(fv).dtype != "f32":
            fv = emit(ir.CastOp(fv, "f32"))
        f_ = emit(ir.MulOp(f_, fv))
    block.add_op(k.RowYieldOp(k_, f_))
    changed = True
    while changed:  # drop what neither keep nor factor uses
        changed = False
        for o in reversed(list(block.ops)):
            if o.results and all(not r.uses for r in o.results):
                o.detach()
                o.erase()
                changed = True
    return Region(block)


def _rows_dim(low: Lowering) -> str:
    segs = next(o for o in low.k.walk() if isinstance(o, t.SegmentsOp))
    return low.k.attributes["indices"].data[low.arg_of[segs.idx]].data[0].data


def lower_scatter(low: Lowering) -> k.LaunchOp:
    """The launch of a plain scatter-add (see the module docstring)."""
    idx, grad, out, n_dim, v_dim, keep, factors, add, initial = _pattern(low)
    gm_grad, gm_out = low.args[grad], low.args[out]
    fmt_in, fmt_out = low.gm_format(gm_grad), low.gm_format(gm_out)
    w_dim = t.gm_type(gm_grad).shape[-1]  # (the rows' length: the table's columns)
    units = {}

    def host_units() -> SSAValue:  # (the strips of units: what the cores share)
        vt, wt = low.host_tiles(v_dim), low.host_tiles(w_dim)
        n = low.host_op(ir.MulOp(vt, wt))
        # strips of up to STRIP units, shorter when there are fewer than STRIP units per core
        per_core = low.host_op(ir.DivOp(n, low.host_op(k.GridCoresOp())))
        units["strip"] = strip = low.host_op(ir.MaxOp(low.host_op(ir.MinOp(per_core, low.hconst(STRIP))),
                                                      low.hconst(1)))
        return low.host_op(ir.DivOp(low.host_op(ir.AddOp(n, low.host_op(ir.SubOp(strip, low.hconst(1))))), strip))

    launch = low.begin_launch(low.launch_base, host_units)
    plan_sym = f"plan{low.part or ''}"
    low.host_op(k.ScatterPlanOp(idx, plan_sym, low.host_op(ir.DimOp(n_dim)), low.host_op(ir.DimOp(v_dim)),
                                _row_fn(low, add, keep, factors)))
    r, c, w = low.r, low.c, low.w
    mb = low.cb("UInt32", 1, "plan header of the unit's table tile (batch count for compute)", "in")
    cache = reader_scratch(low, PLAN_CACHE_PAGES, "the plan page cache")  # (pushed, popped at the end)
    with r.prologue():  # (after the cache's reservation)
        r.call("opgen_tt_plan_cache_init", cache)
    batch = low.cb(fmt_in, 2, "gathered grad rows (one batch)", "in")
    fac = low.cb("Float32", 1, "the table tile's row factors (column 0)", "in")
    low.copied.add(fac)
    init = None
    if initial is not None:
        fmt_init = low.gm_format(low.args[initial[0]])
        init = low.cb(fmt_init, 2, f"{initial[0]} (initial table tile)", "in")
        low.copied.add(init)
    res = low.cb(fmt_out, 2, f"{out} (out)", "out")
    low.copied.add(batch)
    mbn, bn, on, fn = (f"tt::CBIndex::c_{i}" for i in (mb, batch, res, fac))

    def dim(b, d: str) -> SSAValue:
        return b.val(low._dim(d))

    def wt_of(b) -> SSAValue:
        return b.val(low.tiles(w_dim))

    def unit_loop(b) -> tuple[SSAValue, SSAValue, SSAValue]:
        """for s in (core, strips, cores): for u in [s * STRIP, min(units, s * STRIP + STRIP)):
        T = u / Wt, j = u % Wt (two loops to close)."""
        vt = b.arith(ir.DivOp, b.arith(ir.AddOp, dim(b, v_dim), b.const(TILE - 1)), b.const(TILE))
        wt = wt_of(b)
        n = b.arith(ir.MulOp, vt, wt)
        strip = b.rt_arg("strip", units["strip"])
        strips = b.arith(ir.DivOp, b.arith(ir.AddOp, n, b.arith(ir.SubOp, strip, b.const(1))), strip)
        st = b.open_loop(b.rt_arg("core", low.host_op(k.CoreIndexOp())), strips, b.rt_arg("cores", low.cores), "s")
        u0 = b.arith(ir.MulOp, st, strip)
        u = b.open_loop(u0, b.arith(ir.MinOp, n, b.arith(ir.AddOp, u0, strip)), b.const(1), "u")
        tt_ = b.arith(ir.DivOp, u, wt)
        return tt_, b.arith(ir.SubOp, u, b.arith(ir.MulOp, tt_, wt)), wt

    # reader
    plan = r.accessor_named(plan_sym, PLAN_PAGE)
    g = r.accessor(gm_grad, grad)
    tt_, j, wt = unit_loop(r)
    r.call("cb_reserve_back", mbn, "1")
    hdr = r.call("get_write_ptr", mbn, result=True)
    hp = r.call("opgen_tt_plan_header", plan, r.arith(ir.DivOp, tt_, r.const(16)), cache, result=True)
    r.call("opgen_tt_copy_words", hdr, hp, "32")
    word = r.arith(ir.MulOp, r.arith(ir.SubOp, tt_, r.arith(ir.MulOp, r.arith(ir.DivOp, tt_, r.const(16)),
                                                                r.const(16))), r.const(2))
    first = r.call("opgen_tt_l1_word", hp, word, result=True)
    nb = r.call("opgen_tt_l1_word", hp, r.arith(ir.AddOp, word, r.const(1)), result=True)
    r.call("cb_push_back", mbn, "1")
    fp = r.call("opgen_tt_plan_page", plan, first, cache, result=True)  # the row factors: column 0 of a tile
    r.call("cb_reserve_back", fn, "1")
    r.call("opgen_tt_col_tile", r.call("get_write_ptr", fn, result=True), fp)
    r.call("cb_push_back", fn, "1")
    if init is not None:  # the table's tile (T, j), or zeros when the flag is off
        tab = r.accessor(low.args[initial[0]], initial[0])
        inn = f"tt::CBIndex::c_{init}"
        flag = r.val(initial[1]) if initial[1] is not None else "1"
        r.call("cb_reserve_back", inn, "1")
        r.call("opgen_tt_read_tile_or_zero", tab, r.arith(ir.AddOp, r.arith(ir.MulOp, tt_, wt), j),
               r.call("get_write_ptr", inn, result=True), str(TILE_BYTES[low.gm_format(low.args[initial[0]])]), flag)
        r.call("cb_push_back", inn, "1")
    b = r.open_loop(r.const(1), r.arith(ir.AddOp, nb, r.const(1)), r.const(1), "b")
    bp = r.call("opgen_tt_plan_page", plan, r.arith(ir.AddOp, first, b), cache, result=True)
    r.call("cb_reserve_back", bn, "1")
    r.call("opgen_tt_gather_rows", g, r.call("get_write_ptr", bn, result=True), str(TILE_BYTES[fmt_in]),
           r.call("opgen_tt_l1_words", bp, result=True, rtype="volatile tt_l1_ptr uint32_t*"), j, wt)
    r.call("cb_push_back", bn, "1")
    for _ in range(3):
        r.close_loop()

    # compute
    tt_, j, _ = unit_loop(c)
    c.call("cb_wait_front", mbn, "1")
    word = c.arith(ir.MulOp, c.arith(ir.SubOp, tt_, c.arith(ir.MulOp, c.arith(ir.DivOp, tt_, c.const(16)),
                                                                c.const(16))), c.const(2))
    nb = c.call("read_tile_value", mbn, "0", c.arith(ir.AddOp, word, c.const(1)), result=True)
    c.call("tile_regs_acquire")
    c.call("fill_tile_init")
    c.call("fill_tile_bitcast", "0", "0")
    c.open_loop(c.const(0), nb, c.const(1), "b")
    for call in (("cb_wait_front", bn, "1"), ("reconfig_data_format_srca", bn), ("copy_init", bn),
                 ("copy_tile", bn, "0", "1"), ("add_binary_tile_init",), ("add_binary_tile", "0", "1", "0"),
                 ("cb_pop_front", bn, "1")):
        c.call(*call)
    c.close_loop()
    for call in (("cb_wait_front", fn, "1"), ("reconfig_data_format_srca", fn), ("unary_bcast_init", fn),
                 ("unary_bcast", fn, "0", "1"), ("mul_binary_tile_init",), ("mul_binary_tile", "0", "1", "0"),
                 ("cb_pop_front", fn, "1")):
        c.call(*call, template=("BroadcastType::COL",) if call[0].startswith("unary_bcast") else ())
    if init is not None:  # the initial table's tile plus the sums
        inn = f"tt::CBIndex::c_{init}"
        for call in (("cb_wait_front", inn, "1"), ("reconfig_data_format_srca", inn), ("copy_init", inn),
                     ("copy_tile", inn, "0", "1"), ("add_binary_tile_init",), ("add_binary_tile", "1", "0", "0"),
                     ("cb_pop_front", inn, "1")):
            c.call(*call)
    c.call("tile_regs_commit")
    c.call("cb_pop_front", mbn, "1")
    low.pack(res)
    c.close_loop()
    c.close_loop()

    # writer
    o = w.accessor(gm_out, out)
    tt_, j, wt = unit_loop(w)
    w.call("cb_wait_front", on, "1")
    w.call("noc_async_write_page", w.arith(ir.AddOp, w.arith(ir.MulOp, tt_, wt), j), o,
           w.call("get_read_ptr", on, result=True))
    w.call("noc_async_writes_flushed")
    w.call("cb_pop_front", on, "1")
    w.close_loop()
    w.close_loop()
    w.call("noc_async_write_barrier")
    return low.end_launch(launch, low.launch_base)
