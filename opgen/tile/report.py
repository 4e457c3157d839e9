"""Static report of a tile-level kernel at given sizes (there is no NPU to time): the tiling the
host would compute, on-chip bytes used of the capacity, global-memory bytes moved against the
fewest the op must move (each input read once, each output written once), and cores used.

It interprets the ``tile.tiling`` region and walks the kernel's loops with the concrete sizes
(a loop of more than three iterations: its first, second and last, the interior counted as the
second — every walk's blocks are equal but the last),
summing the bytes of every ``tile.copy_in`` / ``tile.copy_out`` over all cores, and for a
``tile.matmul`` its operands read once and its f32 product written once (the cube's own re-reads
when an operand exceeds its L1 are not counted). A scatter-add's
segments assume indices spread evenly over the table rows, and count each scan of the (int32)
indices: one to count, one per window of positions (opgen/tile/scatter.py). The index
conversion before the kernels (reading each index once, writing it as int32) is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.ir import Block, Operation, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.tile import dialect as t


class _Eval:
    """Scalar values of a kernel's host and control code at concrete sizes."""

    def __init__(self, dims: dict[str, int], platform: dict[str, int], params: dict[str, int] | None = None):
        self.dims = dims
        self.platform = platform
        self.params: dict[str, int] = dict(params or {})
        self.env: dict[SSAValue, int | float | bool] = {}
        self.failed: str | None = None

    def val(self, v: SSAValue) -> int | float | bool:
        if v not in self.env:
            op = v.owner
            assert isinstance(op, Operation), f"unbound {v}"
            self.env[v] = self.scalar(op)
        return self.env[v]

    def scalar(self, op: Operation) -> int | float | bool:
        if isinstance(op, ir.ConstantOp):
            return op.number
        if isinstance(op, ir.DimOp):
            d = op.dim.data
            return int(d) if d.isdigit() else self.dims[d]
        if isinstance(op, t.PlatformOp):
            return self.platform.get(op.what.data, PLATFORM_DEFAULTS.get(op.what.data, 0))
        if isinstance(op, t.ParamOp):
            return self.params[op.param.data]
        if isinstance(op, t.BlockIdxOp):
            return self.core
        if isinstance(op, t.BlockNumOp):
            return self.params["block_dim"] * self.ratio
        if isinstance(op, t.SegStartOp):
            b0, _, n, rows = self.env[op.segs]  # type: ignore[misc]
            r = int(self.val(op.row))
            return n * (b0 + r) // max(rows, 1) - n * b0 // max(rows, 1)
        if isinstance(op, t.SegAtOp):
            return int(self.val(op.pos))
        a = [self.val(o) for o in op.operands]
        if isinstance(op, ir.AddOp):
            return a[0] + a[1]
        if isinstance(op, ir.SubOp):
            return a[0] - a[1]
        if isinstance(op, ir.MulOp):
            return a[0] * a[1]
        if isinstance(op, ir.DivOp):
            if isinstance(a[0], float) or isinstance(a[1], float):
                return a[0] / a[1]
            return 0 if a[1] == 0 else int(a[0] / a[1])
        if isinstance(op, ir.MinOp):
            return min(a)
        if isinstance(op, ir.MaxOp):
            return max(a)
        if isinstance(op, ir.CmpOp):
            return {"eq": a[0] == a[1], "ne": a[0] != a[1], "lt": a[0] < a[1], "le": a[0] <= a[1],
                    "gt": a[0] > a[1], "ge": a[0] >= a[1]}[op.predicate.data]
        if isinstance(op, ir.SelectOp):
            return a[1] if a[0] else a[2]
        if isinstance(op, ir.AndOp):
            return bool(a[0]) and bool(a[1])
        if isinstance(op, ir.OrOp):
            return bool(a[0]) or bool(a[1])
        if isinstance(op, ir.CastOp):
            dt = ir.tensor_type(op.result).dtype
            return float(a[0]) if dtypes.by_name(dt).is_float else int(a[0])
        raise NotImplementedError(op.name)

    core = 0
    ratio = 1  # vector cores per launched block (2 in a MIX kernel of the matrix unit)


#: platform values a report assumes unless given (the Matmul API's system workspace on 910B)
PLATFORM_DEFAULTS = {"sys_ws_bytes": 16 << 20}


def tiling(k: t.KernelOp, dims: dict[str, int], platform: dict[str, int]) -> tuple[dict[str, int], str | None]:
    """The tiling parameters the host computes (and the message of a failed check, if one fails)."""
    e = _Eval(dims, platform)
    region = next(op for op in k.body.block.ops if isinstance(op, t.TilingOp))
    for op in region.body.block.ops:
        if isinstance(op, t.SetParamOp):
            e.params[op.param.data] = int(e.val(op.value))
        elif isinstance(op, ir.CheckOp) and not e.val(op.cond):
            return e.params, op.message.data
    return e.params, None


@dataclass
class Report:
    """One kernel instance at one set of sizes."""

    kernel: str
    params: dict[str, int]
    failed: str | None = None
    ub_used: int = 0
    ub_capacity: int = 0
    gm_moved: int = 0
    gm_min: int = 0
    cores: int = 0
    buffers: dict[str, int] = field(default_factory=dict)

    @property
    def traffic_ratio(self) -> float:
        return self.gm_moved / self.gm_min if self.gm_min else 1.0


def _gm_bytes(v: SSAValue, dims: dict[str, int]) -> int:
    gm = t.gm_type(v)
    n = dtypes.by_name(gm.dtype).itemsize
    for d in gm.shape:
        n *= int(d) if d.isdigit() else dims[d]
    return n


def report(k: t.KernelOp, dims: dict[str, int], platform: dict[str, int], traffic: bool = True) -> Report:
    """The static report of kernel ``k`` at ``dims`` on a device with ``platform`` values
    (``traffic=False``: the tiling and on-chip bytes only, without walking the loops)."""
    params, failed = tiling(k, dims, platform)
    r = Report(k.sym_name.data, params, failed, ub_capacity=platform["ub_bytes"])
    if failed:
        return r
    for op in k.body.block.ops:
        if isinstance(op, t.BufferOp):
            nb = op.depth.data if op.kind.data == t.BufferKind.CALC else min(op.depth.data, params["nbuf"])
            r.buffers[op.sym.data] = nb * params[op.bytes.data]
    r.ub_used = sum(r.buffers.values())
    ratio = 2 if any(isinstance(op, t.TileMatmulOp) for op in k.body.block.walk()) else 1
    r.cores = params["block_dim"] * ratio  # vector cores
    names = [a.data for a in k.arg_names.data]
    outs = set()
    for op in k.body.block.walk():
        if isinstance(op, t.CopyOutOp) and isinstance(op.dst.owner, Block):
            outs.add(op.dst)
    for n, a in zip(names, k.body.block.args, strict=True):
        if isinstance(a.type, t.GmType) and n != "workspace" and a.uses:
            ways = {type(u.operation) for u in a.uses} & {t.CopyInOp, t.CopyOutOp, t.SegmentsOp, t.TileMatmulOp}
            ways = {t.CopyInOp if w is t.TileMatmulOp else w for w in ways}  # (a product reads it)
            r.gm_min += _gm_bytes(a, dims) * max(len(ways - {t.SegmentsOp}) or 1, 1)  # read once / written once
    moved = 0
    plans: _Plans = {}
    for core in range(r.cores if traffic else 0):
        e = _Eval(dims, platform, params)
        e.core, e.ratio = core, ratio
        moved += _walk(k.body.block, e, plans)
    r.gm_moved = moved
    return r


_Plans = dict[Block, list[tuple[str, Operation, list[SSAValue]]]]


def _plan(block: Block, plans: _Plans) -> list[tuple[str, Operation, list[SSAValue]]]:
    """The ops of ``block`` that move data or loop (scalars are evaluated when read), with each
    loop's per-iteration values (cached in ``plans``)."""
    if block not in plans:
        steps: list[tuple[str, Operation, list[SSAValue]]] = []
        for op in block.ops:
            if isinstance(op, t.ForOp):
                steps.append(("for", op, [r for sub in op.body.block.walk() for r in sub.results]))
            elif isinstance(op, t.SegmentsOp):
                steps.append(("segs", op, []))
            elif isinstance(op, t.CopyInOp | t.CopyOutOp):
                steps.append(("copy", op, []))
            elif isinstance(op, t.TileMatmulOp):
                steps.append(("mm", op, []))
        plans[block] = steps
    return plans[block]


def _walk(block: Block, e: _Eval, plans: _Plans) -> int:
    moved = 0
    for kind, op, inner in _plan(block, plans):
        if kind == "for":
            assert isinstance(op, t.ForOp)
            lo, hi, step = (int(e.val(x)) for x in (op.lo, op.hi, op.step))
            its = range(lo, hi, max(step, 1))

            def once(i: int, op: t.ForOp = op, inner: list[SSAValue] = inner) -> int:
                e.env[op.iv] = i
                n = _walk(op.body.block, e, plans)
                for res in inner:
                    e.env.pop(res, None)
                return n

            if len(its) <= 3:
                moved += sum(once(i) for i in its)
            else:  # the interior iterations move what the second does (only the last is partial)
                moved += once(its[0]) + once(its[1]) * (len(its) - 2) + once(its[-1])
        elif kind == "segs":
            assert isinstance(op, t.SegmentsOp)
            n = int(e.dims[t.gm_type(op.idx).shape[0]])
            rows = _segment_rows(op, e)
            b0, nb = int(e.val(op.row0)), int(e.val(op.nrows))
            e.env[op.result] = (b0, nb, n, rows)  # type: ignore[assignment]
            count = n * (b0 + nb) // max(rows, 1) - n * b0 // max(rows, 1)
            win = e.params["seg_window"]
            fills = -(-count // win) * (e.params.get("chunks", 1) if count > win else 1)
            moved += 4 * n * (1 + fills)
        elif kind == "mm":  # the cube reads each operand once and writes the f32 product
            assert isinstance(op, t.TileMatmulOp)
            m, n, kk = (int(e.val(x)) for x in (op.m, op.n, op.k))
            moved += (m * kk + kk * n) * dtypes.by_name(t.gm_type(op.a).dtype).itemsize + 4 * m * n
        else:
            tt = ir.tensor_type(op.result if isinstance(op, t.CopyInOp) else op.value)  # type: ignore[attr-defined]
            moved += int(e.val(op.nrows)) * int(e.val(op.ncols)) * dtypes.by_name(tt.dtype).itemsize  # type: ignore[attr-defined]
    return moved


def _segment_rows(op: t.SegmentsOp, e: _Eval) -> int:
    """The table rows the segments' index tensor indexes (the rows the kernel walks)."""
    k = op.parent_op()
    while not isinstance(k, t.KernelOp):
        k = k.parent_op()  # type: ignore[union-attr]
    for x in k.body.block.walk():
        if isinstance(x, t.CopyOutOp) and ir.tensor_type(x.value).shape[0] != "1":
            d = t.gm_type(x.dst).shape[0]
            return int(d) if d.isdigit() else e.dims[d]
    return 1


def chosen(kernels: list[t.KernelOp], dims: dict[str, int], platform: dict[str, int],
           traffic: bool = True) -> list[Report]:
    """For each variant x dtype binding, the report of the schedule the host runs at these sizes
    (the first, in the lowering's order, whose tiling succeeds; else the last one's refusal)."""
    groups: dict[str, list[t.KernelOp]] = {}
    for k in kernels:
        n = len(k.dtype_vars.data)
        part = k.attributes["part"].data if "part" in k.attributes else 0  # type: ignore[attr-defined]
        groups.setdefault(".".join(k.sym_name.data.split(".")[:1 + n]) + f"#{part}", []).append(k)
    out = []
    for ks in groups.values():
        for i, k in enumerate(ks):
            _, failed = tiling(k, dims, platform)
            if failed is None or i == len(ks) - 1:
                out.append(report(k, dims, platform, traffic))
                break
    return out


def format_report(rs: list[Report]) -> str:
    lines = ["| kernel | tiling | UB used / capacity | GM bytes moved / minimum | cores |",
             "|---|---|---:|---:|---:|"]
    for r in rs:
        if r.failed:
            lines.append(f"| {r.kernel} | refused: {r.failed} | - | - | - |")
            continue
        if "tiles" in r.params:
            walk = f"tiles={r.params['tiles']}"
        elif "blocks" in r.params:
            walk = f"blocks={r.params['blocks']}x{r.params['xblocks']}"
        else:  # a kernel of checks on tensor data (scalar code)
            walk = f"rows={r.params['groups']}"
        til = f"rows={r.params['rows']} pitch={r.params['pitch']} nbuf={r.params['nbuf']} {walk}"
        lines.append(f"| {r.kernel} | {til} | {r.ub_used} / {r.ub_capacity} ({100 * r.ub_used / r.ub_capacity:.0f}%) | "
                     f"{r.gm_moved} / {r.gm_min} ({r.traffic_ratio:.2f}x) | {r.cores} |")
    return "\n".join(lines)
