"""``share-kernels``: identical TT-Metal kernels of different dtype instances share one file.

Programs of one op often hold the same reader or writer: FLCE's ``u8`` and ``bool`` mask
instances differ only where the mask is read, so their other kernels are identical. A kernel
whose IR is structurally the same as an earlier program's (same role, runtime-argument names,
accessors, compute config, body, variant and launch) gets ``shared = "<program>/<file>"``: the
host function creates it from that file, ``manifest.json`` lists it there, and it is printed
once (one JIT build on the device, too).
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, Region, SSAValue
from xdsl.passes import ModulePass

from opgen.ttmetal import dialect as k


def _key(prog: k.ProgramOp, launch: k.LaunchOp, kern: k.KernelOp) -> tuple:
    """What a kernel's printed file depends on besides its body (which :func:`same_body` compares)."""
    props = (kern.role.data, kern.arg_names, kern.accessors, kern.fp32_dest_acc.data)
    return prog.sym_name.data.split(".")[0], launch.index.data, props, len(kern.body.block.ops)


def same_body(a: Region, b: Region) -> bool:
    """Whether two kernel bodies (isolated from above) print the same: op by op the same name,
    attributes, properties, result types and names, operands defined at the same places, and
    regions alike, recursively (what the generic printer writes, compared without printing)."""
    seen: dict[SSAValue, SSAValue] = {}

    def same_values(xs: tuple[SSAValue, ...], ys: tuple[SSAValue, ...]) -> bool:
        if len(xs) != len(ys) or any(x.type != y.type or x.name_hint != y.name_hint
                                     for x, y in zip(xs, ys, strict=True)):
            return False
        seen.update(zip(xs, ys, strict=True))
        return True

    def same_block(x: Block, y: Block) -> bool:
        if len(x.ops) != len(y.ops) or not same_values(x.args, y.args):
            return False
        for p, q in zip(x.ops, y.ops, strict=True):
            if (p.name != q.name or p.attributes != q.attributes or p.properties != q.properties
                    or p.successors or q.successors or len(p.operands) != len(q.operands)
                    or any(seen.get(u) is not v for u, v in zip(p.operands, q.operands, strict=True))
                    or len(p.regions) != len(q.regions)
                    or not all(same_region(r, t) for r, t in zip(p.regions, q.regions, strict=True))
                    or not same_values(p.results, q.results)):
                return False
        return True

    def same_region(x: Region, y: Region) -> bool:
        return len(x.blocks) == len(y.blocks) and all(same_block(u, v) for u, v in zip(x.blocks, y.blocks, strict=True))

    return same_region(a, b)


class ShareKernels(ModulePass):
    """Point each kernel identical to an earlier one at that one's file (module docstring)."""

    name = "share-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        first: dict[tuple, list[tuple[k.KernelOp, str]]] = {}
        for prog in op.body.block.ops:
            if not isinstance(prog, k.ProgramOp):
                continue
            for ln in prog.body.block.ops:
                if not isinstance(ln, k.LaunchOp):
                    continue
                for kern in ln.body.block.ops:
                    if not isinstance(kern, k.KernelOp):
                        continue
                    earlier = first.setdefault(_key(prog, ln, kern), [])
                    path = next((p for e, p in earlier if same_body(e.body, kern.body)), None)
                    if path is None:
                        earlier.append((kern, f"{prog.sym_name.data}/{kern.file.data}"))
                    else:
                        kern.shared = StringAttr(path)
