"""Static report of a ``ttk.program`` at concrete sizes: per launch, the cores used of the grid,
the L1 its CBs take per core (and the pages of each), and the DRAM bytes its readers and writers
move against the minimum (every input read once, every output written once, in whole tiles).

The report interprets the IR the printer prints (host scalars, then each core's reader and writer
with its own runtime arguments), so it measures the generated program, not a model of it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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
        self.v: dict[int, float | int] = {}  # by id(SSAValue): hashing an xDSL value costs more

    def __getitem__(self, x: SSAValue) -> float | int:
        return self.v[id(x)]

    def op(self, op: Operation, core: int = 0) -> None:
        res, ins, fn = _scalar(op)
        if res is not None:
            self.v[res] = fn([self.v[o] for o in ins], self, core)


def _div(a: list) -> float | int:
    if isinstance(a[0], int) and isinstance(a[1], int):
        return a[0] // a[1] if a[1] else 0
    return a[0] / a[1]


#: an op's evaluation, decoded once per op: (id of its result or None, ids of its operands,
#: fn(values, eval, core))
_Scalar = tuple[int | None, tuple[int, ...], Callable[[list, _Eval, int], float | int]]
_DECODED: dict[Operation, _Scalar] = {}


def _scalar(op: Operation) -> _Scalar:
    """``op``'s evaluation (see ``_DECODED``): reading an op's attributes in xDSL costs more than
    evaluating it, and a report evaluates the ops of a loop body millions of times."""
    got = _DECODED.get(op)
    if got is not None:
        return got
    fn: Callable[[list, _Eval, int], float | int]
    if isinstance(op, ir.ConstantOp):
        x = op.value
        c: float | int = float(x.value.data) if isinstance(x, FloatAttr) else int(x.value.data)
        fn = lambda a, e, core: c
    elif isinstance(op, ir.DimOp):
        d = op.dim.data
        fn = lambda a, e, core: e.dims[d]
    elif type(op) in _Eval.BIN:
        f2 = _Eval.BIN[type(op)]
        fn = lambda a, e, core: f2(a[0], a[1])
    elif isinstance(op, ir.DivOp):
        fn = lambda a, e, core: _div(a)
    elif isinstance(op, ir.CmpOp):
        f2 = _Eval.CMP[op.predicate.data]
        fn = lambda a, e, core: f2(a[0], a[1])
    elif isinstance(op, ir.SelectOp):
        fn = lambda a, e, core: a[1] if a[0] else a[2]
    elif isinstance(op, ir.NotOp):
        fn = lambda a, e, core: not a[0]
    elif isinstance(op, ir.CastOp):
        to = float if ir.tensor_type(op.result).dtype in ("f32", "f64") else int
        fn = lambda a, e, core: to(a[0])
    elif isinstance(op, k.GridCoresOp):
        fn = lambda a, e, core: e.grid
    elif isinstance(op, k.CoresOp):
        fn = lambda a, e, core: min(e.grid, max(int(a[0]), 1))
    elif isinstance(op, k.CoreIndexOp):
        fn = lambda a, e, core: core
    elif isinstance(op, k.ScalarArgOp):  # (only flags choosing what to read matter)
        name = op.arg.data
        fn = lambda a, e, core: e.scalars.get(name, 0)
    else:  # addresses, bits: irrelevant to sizes
        fn = lambda a, e, core: 0
    got = (id(op.results[0]) if op.results else None, tuple(id(o) for o in op.operands), fn)
    _DECODED[op] = got
    return got


def _pages(cb: k.CbOp, e: _Eval) -> int:
    return int(e[cb.pages])


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


def _chunks(elem: int, row0: int, n: int) -> int:
    """The aligned 32-byte chunks of a row-layout tensor (pages of 32 elements) that elements
    ``[row0, row0 + n)`` lie in (``opgen_tt_col_from_row`` reads each once)."""
    return len({(pos // 32, (pos % 32) * elem // 32) for pos in range(row0, row0 + n)})


def _decode(block: Block) -> list[tuple]:
    """A reader/writer body as tuples walked by ``_dram``, decoded once: ``("for", lo, hi, step,
    iv, body)``, ``("call", name, args, result)`` (args: ``(True, value)`` or ``(False, literal)``)
    and ``("op", result, operands, fn)``."""
    out: list[tuple] = []
    for op in block.ops:
        if isinstance(op, t.ForOp):
            out.append(("for", id(op.lo), id(op.hi), id(op.step), id(op.iv), _decode(op.body.block)))
        elif isinstance(op, k.CallOp):
            args = [(True, id(op.operands_[a.data])) if isinstance(a, IntAttr)
                    else (False, int(a.data) if a.data.isdigit() else a.data) for a in op.args.data]
            out.append(("call", op.callee.data, args, id(op.res[0]) if op.res else None))
        elif not isinstance(op, k.ArgOp):  # (arguments: set by the caller)
            res, ins, fn = _scalar(op)
            if res is not None:
                out.append(("op", res, ins, fn))
    return out


def _dram(body: list[tuple], e: _Eval, w: _Walk) -> None:
    """Walk a decoded reader/writer body: w.counts[0] += bytes read, w.counts[1] += bytes
    written. The data-movement helpers of templates/ttmetal/opgen_tt_dataflow.h.j2 count the NOC
    transfers they make; a scatter plan's pages are read as data (batch counts, source rows)."""
    v = e.v
    for step in body:
        kind = step[0]
        if kind == "op":
            _, res, ins, fn = step
            v[res] = fn([v[o] for o in ins], e, 0)
        elif kind == "for":
            _, lo, hi, st, iv, inner = step
            for i in range(int(v[lo]), int(v[hi]), int(v[st])):
                v[iv] = i
                _dram(inner, e, w)
        else:
            _, name, spec, res = step
            r = _call(name, [v[x] if is_val else x for is_val, x in spec], w)
            if res is not None:
                v[res] = r


def _call(name: str, a: list, w: _Walk) -> int:
    """A data-movement call: count its DRAM bytes; its result (an L1 address or word)."""
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
    return r


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
    _DECODED.clear()  # (decoded for this program only)
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
    bodies: dict[k.KernelOp, list[tuple]] = {}
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
                n, rows = int(e[op.n]), int(e[op.rows])
                given = (indices or {}).get(op.indices.data)
                idx = np.random.default_rng(0).integers(0, max(rows, 1), n) if given is None else given
                words[op.sym.data] = plan_words(idx, rows)
                host += n * 8 + len(words[op.sym.data]) * 4
            else:
                e.op(op)
                if isinstance(op, k.ReturnIfOp) and e[op.cond]:
                    return ProgramReport(prog.sym_name.data, grid, [], minimum, "every output is empty")
                if isinstance(op, k.CheckOp) and not e[op.cond]:
                    refused = refused or op.message.data
        cores_op = next(o for o in ln.body.block.ops if isinstance(o, k.CoresOp))
        units = int(e[cores_op.units])  # (the host skips a launch without units)
        r = LaunchReport(ln.index.data, int(e[cores_op.result]) if units > 0 else 0, units,
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
                    args = [ce[a] for a in kern.rt_args]
                    pages = {a.sym.data: a.page.data for a in kern.body.block.ops if isinstance(a, k.AccessorOp)}
                    for op in kern.body.block.ops:
                        if isinstance(op, k.ArgOp):
                            ke.v[id(op.result)] = args[op.index.data]
                    w = _Walk(pages, words)
                    _dram(bodies.setdefault(kern, _decode(kern.body.block)), ke, w)
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
