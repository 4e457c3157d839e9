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

from xdsl.dialects.builtin import FloatAttr, IntAttr
from xdsl.ir import Block, Operation, SSAValue

from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.ttmetal import dialect as k
from opgen.ttmetal.lower import L1_BUDGET

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

    @property
    def moved(self) -> int:
        return sum(ln.read + ln.written for ln in self.launches)


class _Eval:
    """Values of scalar ops (Python ints/floats) for one launch and one core."""

    BIN: ClassVar[dict] = {ir.AddOp: lambda a, b: a + b, ir.SubOp: lambda a, b: a - b, ir.MulOp: lambda a, b: a * b,
           ir.MinOp: min, ir.MaxOp: max, ir.AndOp: lambda a, b: a and b, ir.OrOp: lambda a, b: a or b}
    CMP: ClassVar[dict] = {"eq": lambda a, b: a == b, "ne": lambda a, b: a != b, "lt": lambda a, b: a < b,
           "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b}

    def __init__(self, dims: dict[str, int], grid: int):
        self.dims, self.grid = dims, grid
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
        elif isinstance(op, k.CoresOp):
            r = min(self.grid, max(int(a[0]), 1))
        elif isinstance(op, k.CoreIndexOp):
            r = core
        else:  # addresses, scalar arguments, bits: irrelevant to sizes
            r = 0
        self.v[op.results[0]] = r


def _pages(cb: k.CbOp, e: _Eval) -> int:
    return int(e.v[cb.pages])


def _dram(block: Block, e: _Eval, pages: dict[str, int], counts: list[int]) -> None:
    """Walk a reader/writer body: counts[0] += bytes read, counts[1] += bytes written."""
    for op in block.ops:
        if isinstance(op, t.ForOp):
            lo, hi, step = (int(e.v[x]) for x in (op.lo, op.hi, op.step))
            for i in range(lo, hi, step):
                e.v[op.iv] = i
                _dram(op.body.block, e, pages, counts)
        elif isinstance(op, k.CallOp):
            name = op.callee.data
            if name in ("noc_async_read_page", "noc_async_write_page"):
                acc = next(a.data for a in op.args.data if not isinstance(a, IntAttr))
                counts[name == "noc_async_write_page"] += pages[acc]
            elif name in ("noc_async_read", "noc_async_write"):  # (size: the last argument)
                counts[name == "noc_async_write"] += int(op.args.data[-1].data)
            if op.res:
                e.v[op.res[0]] = 0
        elif isinstance(op, k.ArgOp):
            pass  # set by the caller
        else:
            e.op(op)


def report(prog: k.ProgramOp, dims: dict[str, int], grid: tuple[int, int] = (8, 8)) -> ProgramReport:
    """The static report of ``prog`` at ``dims`` on a ``grid`` of cores (see the module docstring)."""
    ncores = grid[0] * grid[1]
    launches: list[LaunchReport] = []
    minimum = 0
    for name, ty, kind, lay in zip(prog.arg_names.data, prog.arg_types.data, prog.arg_kinds.data,
                                   prog.attributes["layouts"].data, strict=True):
        read = {o.arg.data for o in prog.walk() if isinstance(o, k.BufferAddrOp)} | \
            {o.indices.data for o in prog.walk() if isinstance(o, k.ScatterPlanOp)}
        if kind.data != "tensor" or name.data == "workspace" or name.data not in read:
            continue
        shape = [dims[d] if not d.isdigit() else int(d) for d in ty.shape]
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        cols = shape[-1] if shape else 1
        elem = 2 if ty.dtype == "bf16" else 4
        if lay.data == "tile":  # whole tiles
            minimum += math.ceil(rows / TILE) * math.ceil(cols / TILE) * TILE * TILE * elem
        else:  # whole 32-element pages
            minimum += rows * math.ceil(cols / TILE) * TILE * elem
    refused = ""
    if any(isinstance(o, k.ScatterPlanOp) for o in prog.walk()):  # reads depend on the index values
        refused = "DRAM traffic depends on the index values (scatter-add): not in the static report"
    for ln in (o for o in prog.body.block.ops if isinstance(o, k.LaunchOp)):
        e = _Eval(dims, ncores)
        cbs, kernels, core_dep = [], [], set()
        for op in ln.body.block.ops:
            if isinstance(op, k.CbOp):
                cbs.append(op)
            elif isinstance(op, k.KernelOp):
                kernels.append(op)
            elif isinstance(op, k.CoreIndexOp) or any(o in core_dep for o in op.operands):
                core_dep.update(op.results)
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
                ce = _Eval(dims, ncores)
                ce.v = dict(e.v)
                for op in ln.body.block.ops:
                    if op.results and op.results[0] in core_dep:
                        ce.op(op, core)
                for kern in kernels:
                    if kern.role.data == "compute":
                        continue
                    ke = _Eval(dims, ncores)
                    args = [ce.v[a] for a in kern.rt_args]
                    pages = {a.sym.data: a.page.data for a in kern.body.block.ops if isinstance(a, k.AccessorOp)}
                    for op in kern.body.block.ops:
                        if isinstance(op, k.ArgOp):
                            ke.v[op.result] = args[op.index.data]
                    counts = [0, 0]
                    _dram(kern.body.block, ke, pages, counts)
                    r.read += counts[0]
                    r.written += counts[1]
        launches.append(r)
    return ProgramReport(prog.sym_name.data, grid, launches, minimum, refused)


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
        total = (r.refused if r.refused.startswith("DRAM traffic depends") else "refused: " + r.refused) \
            if r.refused else (
            f"{r.moved} / minimum {r.minimum} ({r.moved / r.minimum:.3f}x)" if r.minimum else "nothing moved")
        lines.append(f"| {r.program} | all | | | | {total} |")
    return "\n".join(lines)
