"""``share-kernels``: identical TT-Metal kernels of different dtype instances share one file.

Programs of one op often hold the same reader or writer: FLCE's ``u8`` and ``bool`` mask
instances differ only where the mask is read, so their other kernels are identical. A kernel
whose IR is structurally the same as an earlier program's (same role, runtime-argument names,
accessors, compute config, body, variant and launch) gets ``shared = "<program>/<file>"``: the
host function creates it from that file, ``manifest.json`` lists it there, and it is printed
once (one JIT build on the device, too).
"""

from __future__ import annotations

from io import StringIO

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.passes import ModulePass
from xdsl.printer import Printer

from opgen.ttmetal import dialect as k


def _key(prog: k.ProgramOp, launch: k.LaunchOp, kern: k.KernelOp) -> str:
    """The kernel's structure (everything its printed file depends on), as text."""
    out = StringIO()
    Printer(stream=out, print_generic_format=True).print_region(kern.body)
    props = [kern.role.data, kern.arg_names, kern.accessors, kern.fp32_dest_acc.data]
    return f"{prog.sym_name.data.split('.')[0]}\0{launch.index.data}\0{props}\0{out.getvalue()}"


class ShareKernels(ModulePass):
    """Point each kernel identical to an earlier one at that one's file (module docstring)."""

    name = "share-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        first: dict[str, str] = {}
        for prog in op.body.block.ops:
            if not isinstance(prog, k.ProgramOp):
                continue
            for ln in prog.body.block.ops:
                if not isinstance(ln, k.LaunchOp):
                    continue
                for kern in ln.body.block.ops:
                    if isinstance(kern, k.KernelOp):
                        path = first.setdefault(_key(prog, ln, kern), f"{prog.sym_name.data}/{kern.file.data}")
                        if path != f"{prog.sym_name.data}/{kern.file.data}":
                            kern.shared = StringAttr(path)
