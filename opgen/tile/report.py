"""Static report of a tile-level kernel at given sizes (there is no NPU to time): the tiling the
host would compute, on-chip bytes used of the capacity, global-memory bytes moved against the
fewest the op must move (each input read once, each output written once), and cores used.

It interprets the ``tile.tiling`` region and walks the kernel's loops with the concrete sizes,
summing the bytes of every ``tile.copy_in`` / ``tile.copy_out`` over all cores.
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
            return self.platform[op.what.data]
        if isinstance(op, t.ParamOp):
            return self.params[op.param.data]
        if isinstance(op, t.BlockIdxOp):
            return self.core
        if isinstance(op, t.BlockNumOp):
            return self.params["block_dim"]
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


def report(k: t.KernelOp, dims: dict[str, int], platform: dict[str, int]) -> Report:
    """The static report of kernel ``k`` at ``dims`` on a device with ``platform`` values."""
    params, failed = tiling(k, dims, platform)
    r = Report(k.sym_name.data, params, failed, ub_capacity=platform["ub_bytes"])
    if failed:
        return r
    for op in k.body.block.ops:
        if isinstance(op, t.BufferOp):
            nb = op.depth.data if op.kind.data == t.BufferKind.CALC else min(op.depth.data, params["nbuf"])
            r.buffers[op.sym.data] = nb * params[op.bytes.data]
    r.ub_used = sum(r.buffers.values())
    r.cores = params["block_dim"]
    names = [a.data for a in k.arg_names.data]
    outs = set()
    for op in k.body.block.walk():
        if isinstance(op, t.CopyOutOp) and isinstance(op.dst.owner, Block):
            outs.add(op.dst)
    for n, a in zip(names, k.body.block.args, strict=True):
        if isinstance(a.type, t.GmType) and n != "workspace":
            r.gm_min += _gm_bytes(a, dims)  # each tensor read or written once
    moved = 0
    for core in range(r.cores):
        e = _Eval(dims, platform, params)
        e.core = core
        moved += _walk(k.body.block, e)
    r.gm_moved = moved
    return r


def _walk(block: Block, e: _Eval) -> int:
    moved = 0
    for op in block.ops:
        if isinstance(op, t.ForOp):
            lo, hi, step = (int(e.val(x)) for x in (op.lo, op.hi, op.step))
            for i in range(lo, hi, max(step, 1)):
                e.env[op.iv] = i
                moved += _walk(op.body.block, e)
                for sub in op.body.block.walk():  # values of the body are per iteration
                    for res in sub.results:
                        e.env.pop(res, None)
        elif isinstance(op, t.CopyInOp | t.CopyOutOp):
            gm = t.gm_type(op.src if isinstance(op, t.CopyInOp) else op.dst)
            tt = ir.tensor_type(op.result if isinstance(op, t.CopyInOp) else op.value)
            moved += int(e.val(op.nrows)) * int(e.val(op.ncols)) * dtypes.by_name(tt.dtype).itemsize
            del gm
    return moved


def chosen(kernels: list[t.KernelOp], dims: dict[str, int], platform: dict[str, int]) -> list[Report]:
    """For each variant x dtype binding, the report of the schedule the host runs at these sizes
    (the first, in the lowering's order, whose tiling succeeds; else the last one's refusal)."""
    groups: dict[str, list[t.KernelOp]] = {}
    for k in kernels:
        n = len(k.dtype_vars.data)
        groups.setdefault(".".join(k.sym_name.data.split(".")[:1 + n]), []).append(k)
    out = []
    for ks in groups.values():
        for i, k in enumerate(ks):
            _, failed = tiling(k, dims, platform)
            if failed is None or i == len(ks) - 1:
                out.append(report(k, dims, platform))
                break
    return out


def format_report(rs: list[Report]) -> str:
    lines = ["| kernel | tiling | UB used / capacity | GM bytes moved / minimum | cores |",
             "|---|---|---:|---:|---:|"]
    for r in rs:
        if r.failed:
            lines.append(f"| {r.kernel} | refused: {r.failed} | - | - | - |")
            continue
        til = f"rows={r.params['rows']} pitch={r.params['pitch']} nbuf={r.params['nbuf']} tiles={r.params['tiles']}"
        lines.append(f"| {r.kernel} | {til} | {r.ub_used} / {r.ub_capacity} ({100 * r.ub_used / r.ub_capacity:.0f}%) | "
                     f"{r.gm_moved} / {r.gm_min} ({r.traffic_ratio:.2f}x) | {r.cores} |")
    return "\n".join(lines)
