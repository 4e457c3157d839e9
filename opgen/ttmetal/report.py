"""Static report of a ``ttk.program`` at concrete sizes: per launch, the cores used of the grid,
the L1 its CBs take per core (and the pages of each), and the DRAM bytes its readers and writers
move against the minimum (every input read once, every output written once, in whole tiles).

The report interprets the IR the printer prints (host scalars, then each core's reader and writer
with its own runtime arguments), so it measures the generated program, not a model of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from xdsl.dialects.builtin import FloatAttr, IntAttr
from xdsl.ir import Block, Operation, SSAValue

from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.ttmetal import dialect as k
from opgen.ttmetal.lower import L1_BUDGET
from opgen.ttmetal.scatter import PLAN_PAGE, PLAN_SLOTS

TILE = 32


@dataclass
class LaunchReport:
    index: int
    cores: int
    units: int
    l1: int
    cbs: list[tuple[int, str, int, str]] = field(default_factory=list)  # (index, format, pages, what)
    read: int = 0
    written: int = 0
    refused: str = ""


@dataclass
class ProgramReport:
    program: str
    grid: tuple[int, int]
    launches: list[LaunchReport]
    minimum: int
    refused: str = ""
    host: int = 0  # bytes the host reads and writes (a scatter plan's indices and pages)

    @property
    def moved(self) -> int:
        return self.host + sum(ln.read + ln.written for ln in self.launches)


class _Eval:
    """Values of scalar ops (Python ints/floats) for one launch and one core."""

    BIN: ClassVar[dict] = {ir.AddOp: lambda a, b: a + b, ir.SubOp: lambda a, b: a - b, ir.MulOp: lambda a, b: a * b,
           ir.MinOp: min, ir.MaxOp: max, ir.AndOp: lambda a, b: a and b, ir.OrOp: lambda a, b: a or b}
    CMP: ClassVar[dict] = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
           "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}

    def __init__(self, dims: dict[str, int], grid: int, scalars: dict[str, float | int] | None = None):
        self.dims, self.grid, self.scalars = dims, grid, scalars or {}
        self.v: dict[SSAValue, float | int] = {}

    def op(self, op: Operation, core: int = 0) -> None:
        if not op.results:
            return
        a = [self.v[o] for o in op.operands]
        if isinstance(op, ir.ConstantOp):
            x = op.value
            r: float | int = float(x.value.data) if isinstance(x, FloatAttr) else int(x.value.data)
        elif isinstance(op, ir.DimOp):
            r = self.dims[op.dim.data]
        elif type(op) in self.BIN:
            r = self.BIN[type(op)](*a)
        elif isinstance(op, ir.DivOp):
            r = (a[0] // a[1] if a[1] else 0) if isinstance(a[0], int) and isinstance(a[1], int) else a[0] / a[1]
        elif isinstance(op, ir.CmpOp):
            r = self.CMP[op.predicate.data](*a)
        elif isinstance(op, ir.SelectOp):
            r = a[1] if a[0] else a[2]
        elif isinstance(op, ir.NotOp):
            r = not a[0]
        elif isinstance(op, ir.CastOp):
            r = float(a[0]) if ir.tensor_type(op.result).dtype in ("f32", "f64") else int(a[0])
        elif isinstance(op, k.GridCoresOp):
            r = self.grid
        elif isinstance(op, k.CoresOp):
            r = min(self.grid, max(int(a[0]), 1))
        elif isinstance(op, k.CoreIndexOp):
            r = core
        elif isinstance(op, k.ScalarArgOp):  # (only flags choosing what to read matter)
            r = self.scalars.get(op.arg.data, 0)
        else:  # addresses, bits: irrelevant to sizes
            r = 0
        self.v[op.results[0]] = r


def _pages(cb: k.CbOp, e: _Eval) -> int:
    return int(e.v[cb.pages])


@dataclass
class _Walk:
    """What a reader/writer walk needs beyond scalars: page sizes by accessor, the scatter plans
    (their words, by buffer), the plan pages read into L1 (by address), and the bytes counted."""

    pages: dict[str, int]
    plans: dict[str, np.ndarray]
    l1: dict[int, np.ndarray] = field(default_factory=dict)
    counts: list[int] = field(default_factory=lambda: [0, 0])
    tags: dict[int, int] = field(default_factory=dict)  # the plan page cache: L1 slot address -> page

    def cached_page(self, plan: str, page: int, tags_l1: int, slots: int) -> int:
        """``opgen_tt_cached_page``: the slot's address; a miss reads the page from DRAM."""
        at = tags_l1 + PLAN_PAGE * (1 + page % slots)
        if self.tags.get(at) != page:
            self.counts[0] += self.pages[plan]
            self.l1[at] = self.plans[plan][page * 32:(page + 1) * 32]
            self.tags[at] = page
        return at


def _call_args(op: k.CallOp, e: _Eval) -> list:
    """The call's arguments: operand values, and literals (ints where they are numbers)."""
    out: list = []
    for a in op.args.data:
        if isinstance(a, IntAttr):
            out.append(e.v[op.operands_[a.data]])
        else:
            out.append(int(a.data) if a.data.isdigit() else a.data)
    return out


def _chunks(elem: int, row0: int, n: int) -> int:
    """The aligned 32-byte chunks of a row-layout tensor (pages of 32 elements) that elements
    ``[row0, row0 + n)`` lie in (``opgen_tt_col_from_row`` reads each once)."""
    return len({(pos // 32, (pos % 32) * elem // 32) for pos in range(row0, row0 + n)})


def _dram(block: Block, e: _Eval, w: _Walk) -> None:
    """Walk a reader/writer body: w.counts[0] += bytes read, w.counts[1] += bytes written. The
    data-movement helpers of templates/ttmetal/opgen_tt_dataflow.h.j2 count the NOC transfers
    they make; a scatter plan's pages are read as data (batch counts, source rows)."""
    for op in block.ops:
        if isinstance(op, t.ForOp):
            lo, hi, step = (int(e.v[x]) for x in (op.lo, op.hi, op.step))
            for i in range(lo, hi, step):
                e.v[op.iv] = i
                _dram(op.body.block, e, w)
        elif isinstance(op, k.CallOp):
            name, a = op.callee.data, _call_args(op, e)
            r = 0
            if name in ("noc_async_read_page", "noc_async_write_page"):
                w.counts[name == "noc_async_write_page"] += w.pages[a[1]]
                if a[1] in w.plans:
                    w.l1[a[2]] = w.plans[a[1]][a[0] * 32:(a[0] + 1) * 32]
            elif name in ("noc_async_read", "noc_async_write"):  # (size: the last argument)
                w.counts[name == "noc_async_write"] += a[-1]
            elif name in ("get_write_ptr", "get_read_ptr"):  # one L1 address per CB
                r = (int(a[0].rsplit("_", 1)[-1]) + 1) << 20
            elif name == "opgen_tt_l1_word":
                r = int(w.l1[a[0]][a[1]]) if a[0] in w.l1 else 0
            elif name == "opgen_tt_l1_words":
                r = a[0]
            elif name == "opgen_tt_plan_cache_init":
                w.tags.clear()
            elif name == "opgen_tt_plan_header":
                r = w.cached_page(a[0], a[1], a[2], 1)
            elif name == "opgen_tt_plan_page":  # (after the header cache's two pages)
                r = w.cached_page(a[0], a[1], a[2] + 2 * PLAN_PAGE, PLAN_SLOTS)
            elif name == "opgen_tt_copy_words":
                if a[1] in w.l1:
                    w.l1[a[0]] = w.l1[a[1]]
            elif name == "opgen_tt_gather_rows":  # 32 elements per source row named in the batch
                rows = int(np.count_nonzero(w.l1[a[3]] != NO_ROW)) if a[3] in w.l1 else 0
                w.counts[0] += rows * 32 * (a[2] // 1024)
            elif name == "opgen_tt_read_tile_or_zero":
                w.counts[0] += a[3] if a[4] else 0
            elif name in ("opgen_tt_load_elem", "opgen_tt_load_bit"):
                w.counts[0] += 32
            elif name == "opgen_tt_col_from_row":
                w.counts[0] += 32 * _chunks(a[1], a[2], a[3])
            if op.res:
                e.v[op.res[0]] = r
        elif isinstance(op, k.ArgOp):
            pass  # set by the caller
        else:
            e.op(op)


#: a batch entry naming no source row
NO_ROW = 0xFFFFFFFF


def plan_words(idx: np.ndarray, rows: int) -> np.ndarray:
    """The words of a scatter plan (``ttk.scatter_plan``, built by templates/ttmetal/host.cpp.j2)
    over in-range indices ``idx`` into ``rows`` table rows, every row kept: the layout only
    (factors 1.0), enough to count what the kernels read."""
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    tiles = -(-rows // TILE)
    heads = -(-tiles // 16)
    count = np.bincount(idx, minlength=rows) if rows else np.zeros(0, np.int64)
    padded = np.zeros(tiles * TILE, np.int64)
    padded[:rows] = count
    batches = padded.reshape(tiles, TILE).max(axis=1) if tiles else np.zeros(0, np.int64)
    first = heads + np.concatenate([[0], np.cumsum(1 + batches)[:-1]]).astype(np.int64) if tiles else batches
    pages = heads + int(np.sum(1 + batches))
    plan = np.full(max(pages, 1) * 32, NO_ROW, np.uint32)
    for tt in range(tiles):
        plan[(tt // 16) * 32 + (tt % 16) * 2] = first[tt]
        plan[(tt // 16) * 32 + (tt % 16) * 2 + 1] = batches[tt]
        plan[first[tt] * 32:first[tt] * 32 + 32] = np.float32(1.0).view(np.uint32)
    order = np.argsort(idx, kind="stable")  # ascending n within each row
    sorted_rows = idx[order]
    starts = np.searchsorted(sorted_rows, sorted_rows, side="left")
    k_th = np.arange(len(order)) - starts
    plan[(first[sorted_rows // TILE] + 1 + k_th) * 32 + sorted_rows % TILE] = order
    return plan


def report(prog: k.ProgramOp, dims: dict[str, int], grid: tuple[int, int] = (8, 8),
           indices: dict[str, np.ndarray] | None = None,
           scalars: dict[str, float | int] | None = None) -> ProgramReport:
    """The static report of ``prog`` at ``dims`` on a ``grid`` of cores (see the module docstring).
    A scatter-add's traffic depends on its index values: ``indices`` gives them by tensor name
    (default: uniform random over the table rows, seed 0; read as int64). The host's index read
    and plan upload count as DRAM traffic; the minimum counts the indices once. ``scalars``: the
    op's scalar arguments by name (default 0: e.g. embedding_backward's tables not accumulated)."""
    ncores = grid[0] * grid[1]
    launches: list[LaunchReport] = []
    plans = {o.indices.data for o in prog.walk() if isinstance(o, k.ScatterPlanOp)}
    read = {o.arg.data for o in prog.walk() if isinstance(o, k.BufferAddrOp)} | plans
    minimum = 0
    for name, ty, kind, lay in zip(prog.arg_names.data, prog.arg_types.data, prog.arg_kinds.data,
                                   prog.attributes["layouts"].data, strict=True):
        if kind.data != "tensor" or name.data == "workspace" or name.data not in read:
            continue
        shape = [dims[d] if not d.isdigit() else int(d) for d in ty.shape]
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        cols = shape[-1] if shape else 1
        elem = 8 if name.data in plans else 2 if ty.dtype == "bf16" else 4
        if name.data in plans:  # indices: read by the host, as they are
            minimum += rows * cols * elem
        elif lay.data == "tile":  # whole tiles
            minimum += math.ceil(rows / TILE) * math.ceil(cols / TILE) * TILE * TILE * elem
        else:  # whole 32-element pages
            minimum += rows * math.ceil(cols / TILE) * TILE * elem
    refused = ""
    words: dict[str, np.ndarray] = {}
    host = 0  # the host's index reads and plan uploads
    for ln in (o for o in prog.body.block.ops if isinstance(o, k.LaunchOp)):
        e = _Eval(dims, ncores, scalars)
        cbs, kernels, core_dep = [], [], set()
        for op in ln.body.block.ops:
            if isinstance(op, k.CbOp):
                cbs.append(op)
            elif isinstance(op, k.KernelOp):
                kernels.append(op)
            elif isinstance(op, k.CoreIndexOp) or any(o in core_dep for o in op.operands):
                core_dep.update(op.results)
            elif isinstance(op, k.ScatterPlanOp):
                n, rows = int(e.v[op.n]), int(e.v[op.rows])
                given = (indices or {}).get(op.indices.data)
                idx = np.random.default_rng(0).integers(0, max(rows, 1), n) if given is None else given
                words[op.sym.data] = plan_words(idx, rows)
                host += n * 8 + len(words[op.sym.data]) * 4
            else:
                e.op(op)
                if isinstance(op, k.ReturnIfOp) and e.v[op.cond]:
                    return ProgramReport(prog.sym_name.data, grid, [], minimum, "every output is empty")
                if isinstance(op, k.CheckOp) and not e.v[op.cond]:
                    refused = refused or op.message.data
        cores_op = next(o for o in ln.body.block.ops if isinstance(o, k.CoresOp))
        r = LaunchReport(ln.index.data, int(e.v[cores_op.result]), int(e.v[cores_op.units]),
                         sum(_pages(c, e) * c.page.data for c in cbs),
                         [(c.index.data, c.format.data, _pages(c, e), c.what.data) for c in cbs])
        if r.l1 > L1_BUDGET:
            r.refused = f"CBs need {r.l1} B of L1 per core"
        else:
            for core in range(r.cores):
                ce = _Eval(dims, ncores, scalars)
                ce.v = dict(e.v)
                for op in ln.body.block.ops:
                    if op.results and op.results[0] in core_dep:
                        ce.op(op, core)
                for kern in kernels:
                    if kern.role.data == "compute":
                        continue
                    ke = _Eval(dims, ncores, scalars)
                    args = [ce.v[a] for a in kern.rt_args]
                    pages = {a.sym.data: a.page.data for a in kern.body.block.ops if isinstance(a, k.AccessorOp)}
                    for op in kern.body.block.ops:
                        if isinstance(op, k.ArgOp):
                            ke.v[op.result] = args[op.index.data]
                    w = _Walk(pages, words)
                    _dram(kern.body.block, ke, w)
                    r.read += w.counts[0]
                    r.written += w.counts[1]
        launches.append(r)
    return ProgramReport(prog.sym_name.data, grid, launches, minimum, refused, host)


def format_report(rs: list[ProgramReport]) -> str:
    lines = ["| program | launch | cores used / grid (units) | L1 per core / budget | CB pages | "
             "DRAM read + written |", "|---|---|---:|---:|---|---:|"]
    for r in rs:
        n = r.grid[0] * r.grid[1]
        for ln in r.launches:
            pages = " ".join(f"c{i}:{p}" for i, _, p, _ in ln.cbs)
            l1 = f"{ln.l1} / {L1_BUDGET} ({100 * ln.l1 / L1_BUDGET:.0f}%)"
            moved = "refused: " + ln.refused if ln.refused else f"{ln.read} + {ln.written}"
            lines.append(f"| {r.program} | {ln.index} | {ln.cores} / {n} ({ln.units}) | {l1} | {pages} | {moved} |")
        if r.host:
            lines.append(f"| {r.program} | host | | | | {r.host} (indices read, plan uploaded) |")
        total = "refused: " + r.refused if r.refused else (
            f"{r.moved} / minimum {r.minimum} ({r.moved / r.minimum:.3f}x)" if r.minimum else "nothing moved")
        lines.append(f"| {r.program} | all | | | | {total} |")
    return "\n".join(lines)
