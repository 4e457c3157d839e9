"""TT-Metal printer: each ``ttk.program`` (opgen/ttmetal/dialect.py) -> kernel sources, a host
function against the tt-metal host API, and the entries of ``manifest.json``.

A printer only: one IR op -> one statement (a pattern table for the scalar ops, ``ttk.call`` ->
``callee<template>(args);``, ``tile.for`` -> ``for``). CB indices, DST slots, inits, loop bounds,
runtime-argument order and the core split were decided by opgen/ttmetal/lower.py.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import FloatAttr, IntAttr, ModuleOp
from xdsl.ir import Operation, SSAValue

from opgen import dtypes
from opgen.emit.render import render
from opgen.ir import dialect as ir
from opgen.tile import dialect as t
from opgen.tile.lower import TileUnsupported
from opgen.ttmetal import dialect as k
from opgen.ttmetal.lower import op_ident
from opgen.ttmetal.scatter import PLAN_SLOTS

KERNEL_HEADERS = {
    "reader": ["api/dataflow/dataflow_api.h", "../opgen_tt_dataflow.h"],
    "writer": ["api/dataflow/dataflow_api.h"],
    "compute": ["api/compute/compute_kernel_hw_startup.h", "api/compute/tile_move_copy.h", "api/compute/bcast.h",
                "api/compute/eltwise_binary_sfpu.h", "api/compute/eltwise_unary/eltwise_unary.h",
                "api/compute/eltwise_unary/binop_with_scalar.h", "api/compute/eltwise_unary/rsqrt.h",
                "api/compute/eltwise_unary/recip.h", "api/compute/eltwise_unary/exp.h",
                "api/compute/eltwise_unary/sqrt.h", "api/compute/eltwise_unary/negative.h",
                "api/compute/eltwise_unary/erf_erfc.h", "api/compute/eltwise_unary/comp.h",
                "api/compute/eltwise_unary/where.h",
                "api/compute/compute_kernel_api.h",
                "api/compute/eltwise_unary/fill.h", "api/compute/eltwise_unary/bitwise.h",
                "api/compute/copy_dest_values.h", "api/compute/mask.h", "api/compute/reduce.h",
                "api/compute/reconfig_data_format.h", "api/compute/pack.h", "api/compute/reg_api.h",
                "api/compute/cb_api.h", "api/compute/matmul.h"],
}


class Scalars:
    """Scalar ``opgen`` ops as C expressions (``uint32_t`` in kernels, ``int64_t`` on the host)."""

    BINARY: ClassVar[dict[type, str]] = {ir.AddOp: "+", ir.SubOp: "-", ir.MulOp: "*", ir.DivOp: "/",
                                         ir.AndOp: "&&", ir.OrOp: "||"}
    CMP: ClassVar[dict[str, str]] = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

    def __init__(self, ctype: str):
        self.ctype = ctype
        self.names: dict[SSAValue, str] = {}
        self.lines: list[str] = []
        self.indent = 1
        self.n = 0

    def line(self, s: str) -> None:
        self.lines.append("    " * self.indent + s)

    def name(self, v: SSAValue) -> str:
        op = v.owner
        if isinstance(op, ir.ConstantOp) and v not in self.names:
            a = op.value
            return f"{float(a.value.data)!r}f" if isinstance(a, FloatAttr) else f"{a.value.data}"
        return self.names[v]

    def fresh(self, hint: str = "v") -> str:
        self.n += 1
        return f"{hint}{self.n}"

    def expr(self, op: Operation) -> str | None:
        a = [self.name(o) for o in op.operands]
        if isinstance(op, ir.ConstantOp):
            return None
        if type(op) in self.BINARY:
            return f"{a[0]} {self.BINARY[type(op)]} {a[1]}"
        if isinstance(op, ir.MinOp):
            return f"({a[0]} < {a[1]} ? {a[0]} : {a[1]})"
        if isinstance(op, ir.MaxOp):
            return f"({a[0]} > {a[1]} ? {a[0]} : {a[1]})"
        if isinstance(op, ir.CmpOp):
            return f"{a[0]} {self.CMP[op.predicate.data]} {a[1]}"
        if isinstance(op, ir.SelectOp):
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if isinstance(op, ir.NotOp):
            return f"!{a[0]}"
        if isinstance(op, ir.CastOp):
            to_float = ir.tensor_type(op.result).dtype in ("f32", "f64")
            return f"(float)({a[0]})" if to_float else f"({self.ctype})({a[0]})"
        return self.special(op, a)

    def special(self, op: Operation, a: list[str]) -> str:
        raise NotImplementedError(op.name)

    def define(self, op: Operation) -> None:
        e = self.expr(op)
        if e is None:
            return
        v = op.results[0]
        dt = ir.tensor_type(v).dtype
        ct = "bool" if dt == "bool" else "float" if dt in ("f32", "f64") else self.ctype
        n = self.fresh()
        self.names[v] = n
        self.line(f"const {ct} {n} = {e};")


class KernelPrinter(Scalars):
    """One ``ttk.kernel`` -> its C++ source."""

    def __init__(self, kern: k.KernelOp, program: str, launch: int):
        super().__init__("uint32_t")
        self.k, self.program, self.launch = kern, program, launch

    def special(self, op: Operation, a: list[str]) -> str:
        if isinstance(op, k.ArgOp):
            return f"get_arg_val<uint32_t>({op.index.data})"
        raise NotImplementedError(op.name)

    def print(self) -> str:
        role = self.k.role.data
        for op in self.k.body.block.ops:
            self.op(op)
        head = [f"// {self.program}: launch {self.launch}, {role} kernel — generated by opgen (do not edit)",
                "#include <cstdint>", *(f'#include "{h}"' for h in KERNEL_HEADERS[role]), "", "void kernel_main() {"]
        return "\n".join([*head, *self.lines, "}", ""])

    def op(self, op: Operation) -> None:
        if isinstance(op, k.ArgOp):
            n = self.k.arg_names.data[op.index.data].data
            self.names[op.result] = n
            self.line(f"const uint32_t {n} = get_arg_val<uint32_t>({op.index.data});")
        elif isinstance(op, k.AccessorOp):
            s, after = op.sym.data, op.after.data
            base = f"args_{after}.next_compile_time_args_offset()" if after else "0"
            self.line(f"constexpr auto args_{s} = TensorAccessorArgs<{base}>();")
            self.line(f"const auto {s} = TensorAccessor(args_{s}, {self.name(op.addr)}, {op.page.data});")
        elif isinstance(op, k.CallOp):
            args = [self.name(op.operands_[a.data]) if isinstance(a, IntAttr) else a.data for a in op.args.data]
            tmpl = f"<{', '.join(x.data for x in op.template.data)}>" if op.template else ""
            call = f"{op.callee.data}{tmpl}({', '.join(args)})"
            if op.res:
                n = self.fresh()
                self.names[op.res[0]] = n
                self.line(f"const {op.rtype.data if op.rtype else 'uint32_t'} {n} = {call};")
            else:
                self.line(f"{call};")
        elif isinstance(op, t.ForOp):
            iv = op.body.block.args[0]
            n = self.fresh(iv.name_hint or "i")
            self.names[iv] = n
            lo, hi, step = (self.name(x) for x in (op.lo, op.hi, op.step))
            self.line(f"for (uint32_t {n} = {lo}; {n} < {hi}; {n} += {step}) {{")
            self.indent += 1
            for o in op.body.block.ops:
                self.op(o)
            self.indent -= 1
            self.line("}")
        elif isinstance(op, t.YieldOp):
            return
        else:
            self.define(op)


def arg_ident(prog: k.ProgramOp, name: str) -> str:
    """The C++ name of the op's argument ``name`` in host code and kernels (:func:`op_ident`:
    ``t_<name>`` for a tensor, ``a_<name>`` for a scalar; and ``d_<dim>`` for a dim,
    ``conv_``/``dtype_``/``data_`` for a tensor's converted copy, index type and bytes read
    back): none of the host's own names
    (``mesh``, ``program``, ``cores``, workspace regions, plans) nor a C++ keyword starts so, so an
    op may name its tensors ``cores`` or ``int``. A name that is not an argument (a workspace
    region, a plan) is the compiler's and stays as it is."""
    names = [a.data for a in prog.arg_names.data]
    return op_ident(prog.arg_kinds.data[names.index(name)].data, name) if name in names else name


class HostPrinter(Scalars):
    """One ``ttk.program`` -> its host function (tt-metal host API, distributed mesh queue)."""

    #: unary math on a float scalar (lower.HOST_MATH), in float
    MATH: ClassVar[dict[type, str]] = {
        ir.SqrtOp: "std::sqrt({})", ir.RsqrtOp: "1.0f / std::sqrt({})", ir.RecipOp: "1.0f / ({})",
        ir.ExpOp: "std::exp({})", ir.LogOp: "std::log({})", ir.TanhOp: "std::tanh({})", ir.ErfOp: "std::erf({})",
        ir.SigmoidOp: "1.0f / (1.0f + std::exp(-({})))", ir.NegOp: "-({})", ir.AbsOp: "std::fabs({})"}

    def __init__(self, prog: k.ProgramOp, fn: str, sizes: dict[str, str] | None = None):
        super().__init__("int64_t")
        self.p, self.fn = prog, fn
        self.sizes = sizes or {}  # size parameters (num_weights) and the dim each must equal
        self.core_dep: set[SSAValue] = set()

    def special(self, op: Operation, a: list[str]) -> str:
        if isinstance(op, ir.DimOp):
            return f"(int64_t)d_{op.dim.data}"
        if isinstance(op, k.GridCoresOp):
            return "(int64_t)(grid.x * grid.y)"
        if isinstance(op, k.CoresOp):
            return f"std::min<int64_t>((int64_t)(grid.x * grid.y), {a[0]} > 1 ? {a[0]} : 1)"
        if isinstance(op, k.CoreIndexOp):
            return "(int64_t)core_i"
        if isinstance(op, k.BufferAddrOp):
            return f"(int64_t){arg_ident(self.p, op.arg.data)}->address()"
        if isinstance(op, k.ScalarArgOp):
            return arg_ident(self.p, op.arg.data)
        if isinstance(op, k.SegPrefixOp):
            return f"(int64_t)prefix[(size_t)({a[0]})]"
        if isinstance(op, k.BitsOp):
            return f"(int64_t)opgen_tt_bits({a[0]})"
        if type(op) in self.MATH:
            return self.MATH[type(op)].format(*a)
        if isinstance(op, k.HostLoadOp):
            src = f"data_{op.arg.data}"
            if op.bit.data:
                packed = "true" if self.arg_dtype(op.arg.data) == "u8" else "false"
                return f"opgen_tt_host_flag({src}, {a[0]}, {packed})"
            return f"opgen_tt_host_load<{dtypes.by_name(self.arg_dtype(op.arg.data)).c_type}>({src}, {a[0]})"
        raise NotImplementedError(op.name)

    def arg_dtype(self, name: str) -> str:
        return self.p.arg_types.data[[a.data for a in self.p.arg_names.data].index(name)].dtype

    def dims(self) -> list[str]:
        return sorted({o.dim.data for o in self.p.walk() if isinstance(o, ir.DimOp)})

    def params(self, public: bool = False) -> list[str]:
        """The parameters of a schedule's function; ``public``: of the op's function, which also
        takes the IndexType of each tensor it converts."""
        out = []
        for n, kd in zip(self.p.arg_names.data, self.p.arg_kinds.data, strict=True):
            if n.data == "workspace":
                continue
            ty = self.p.arg_types.data[[a.data for a in self.p.arg_names.data].index(n.data)]
            ctype = {"bool": "bool", "f32": "float", "f64": "double"}.get(getattr(ty, "dtype", "f32"), "int64_t")
            out.append(f"const std::shared_ptr<distributed::MeshBuffer>& {arg_ident(self.p, n.data)}"
                       if kd.data == "tensor" else f"{ctype} {arg_ident(self.p, n.data)}")
        if any(isinstance(o, k.ScatterPlanOp) for o in self.p.walk()):
            out.append("IndexType index_dtype")
        if public:
            out += [f"IndexType dtype_{n}" for n in self.p.converted]
        return out + [f"uint32_t d_{d}" for d in self.dims()]

    def print(self) -> str:
        launches = [o for o in self.p.body.block.ops if isinstance(o, k.LaunchOp)]
        for param, dim in sorted(self.sizes.items()):
            if dim in self.dims():
                self.line(f"if ((int64_t){arg_ident(self.p, param)} != (int64_t)d_{dim}) "
                          f"return opgen_tt_error(\"{self.p.sym_name.data}: "
                          f"{param} differs from the tensors' {dim}\");")
        # every launch's scalars and checks first: nothing is enqueued unless all launches can run
        for ln in launches:
            for op in ln.body.block.ops:
                if isinstance(op, (k.CbOp, k.KernelOp)):
                    continue
                if isinstance(op, k.CoreIndexOp) or any(o in self.core_dep for o in op.operands):
                    self.core_dep.update(op.results)
                    continue
                self.host_op(op)
        for ln in launches:
            self.launch(ln)
        self.line("return 0;")
        head = f"static int {self.fn}(distributed::MeshDevice& mesh, const std::string& kernel_dir, CoreCoord grid,"
        sig = head + "\n    " + ",\n    ".join([*self.params(), "bool quiet"]) + ")"
        return "\n".join([f"/* {self.p.sym_name.data}: {len(launches)} launch(es) on the mesh command queue; 2 (quiet) "
                          "or 1 (a message) when it cannot run. */",
                          sig + " {", "    auto& cq = mesh.mesh_command_queue();", *self.lines, "}", ""])

    def signature(self, fn: str) -> str:
        """The C++ signature of the op's function ``fn`` for this dtype instance."""
        return (f"int {fn}(distributed::MeshDevice& mesh, const std::string& kernel_dir, CoreCoord grid,\n    "
                + ",\n    ".join(self.params(public=True)) + ")")

    def public(self, fn: str, schedules: list[str]) -> str:
        """The op's function for this dtype instance: the first schedule that can run."""
        conv = self.p.converted
        conv_of = {arg_ident(self.p, n): f"conv_{n}" for n in conv}
        names = [conv_of.get(n, n) for n in (a.split(" ")[-1] for a in self.params())]
        args = ", ".join(["mesh", "kernel_dir", "grid", *names])
        lines = [f"/* {self.p.sym_name.data}: schedules tried in order: {', '.join(schedules)}. */",
                 self.signature(fn) + " {"]
        for n, d in conv.items():  # read only cast to d: converted once (opgen/lower/boundary.py)
            lines += [f"    std::shared_ptr<distributed::MeshBuffer> conv_{n} = {arg_ident(self.p, n)};",
                      f"    if (int rc = opgen_tt_convert(mesh, conv_{n}, dtype_{n}, {INDEX_TYPE[d]})) return rc;"]
        for i, sch in enumerate(schedules):
            last = i == len(schedules) - 1
            lines.append(f"    {'return' if last else 'if (int rc ='} {sch}({args}, {'false' if last else 'true'})"
                         f"{';' if last else '; rc != 2) return rc;'}")
        return "\n".join([*lines, "}", ""])

    def host_op(self, op: Operation) -> None:
        if isinstance(op, k.ScatterPlanOp):
            v = op.row_fn.block.args[0]
            self.names[v] = "v"
            fn = f"row_fn_{op.sym.data}"
            self.line(f"const auto {fn} = [&](int64_t v, const std::vector<uint32_t>& prefix) {{")
            self.indent += 1
            for o in op.row_fn.block.ops:
                if isinstance(o, k.RowYieldOp):
                    self.line(f"return std::pair<bool, float>{{{self.name(o.keep)}, {self.name(o.factor)}}};")
                else:
                    self.define(o)
            self.indent -= 1
            self.line("};")
            self.line(f"std::shared_ptr<distributed::MeshBuffer> {op.sym.data};")
            call = (f"opgen_tt_scatter_plan(mesh, {arg_ident(self.p, op.indices.data)}, index_dtype, "
                    f"(uint32_t){self.name(op.n)}, "
                    f'(uint32_t){self.name(op.rows)}, {op.sym.data}, "{self.p.sym_name.data}", {fn})')
            self.line(f"if (int rc = {call}) return rc;")
        elif isinstance(op, k.RowCheckOp):
            msg = op.message.data.replace('"', '\\"')
            self.line(f"{{  // checks on tensor data: {msg}")
            self.indent += 1
            for name in (a.data for a in op.reads.data):
                self.line(f"std::vector<uint8_t> data_{name};")
                self.line(f"{{ auto buf = {arg_ident(self.p, name)}; "
                          f"distributed::EnqueueReadMeshBuffer(cq, data_{name}, buf, true); }}")
            v = op.row_fn.block.args[0]
            self.names[v] = self.fresh("row")
            self.line(f"for (int64_t {self.names[v]} = 0; {self.names[v]} < {self.name(op.rows)}; "
                      f"++{self.names[v]}) {{")
            self.indent += 1
            for o in op.row_fn.block.ops:
                if isinstance(o, k.RowOkOp):
                    self.line(f'if (!({self.name(o.ok)})) return opgen_tt_error("{self.p.sym_name.data}: {msg}");')
                else:
                    self.define(o)
            self.indent -= 1
            self.line("}")
            self.indent -= 1
            self.line("}")
        elif isinstance(op, k.ReturnIfOp):
            self.line(f"if ({self.name(op.cond)}) return 0;  // every output is empty")
        elif isinstance(op, k.CheckOp):
            msg = op.message.data.replace('"', '\\"')
            err = f'opgen_tt_error("{self.p.sym_name.data}: {msg}")'
            self.line(f"if (!({self.name(op.cond)})) return {err if op.arg.data else 'quiet ? 2 : ' + err};")
        elif isinstance(op, k.WorkspaceOp):
            self.line(f"auto {op.sym.data} = distributed::MeshBuffer::create(")
            self.line(f"    distributed::ReplicatedBufferConfig{{.size = (uint64_t){self.name(op.bytes)}}},")
            self.line(f"    distributed::DeviceLocalBufferConfig{{.page_size = {op.page.data}, "
                      ".buffer_type = BufferType::DRAM}, &mesh);")
        else:
            self.define(op)

    def launch(self, ln: k.LaunchOp) -> None:
        i = ln.index.data
        cores_op = next(o for o in ln.body.block.ops if isinstance(o, k.CoresOp))
        cores = cores_op.result
        self.line(f"if ({self.name(cores_op.units)} > 0) {{  // launch {i} (none when it has no units)")
        self.indent += 1
        self.line("Program program = CreateProgram();")
        self.line(f"const CoreRangeSet cores = opgen_tt_cores(grid, (uint32_t){self.name(cores)});")
        utd = []
        for cb in ln.body.block.ops:
            if isinstance(cb, k.CbOp):
                c, page = cb.index.data, cb.page.data
                cfg = (f"CircularBufferConfig((uint32_t)({self.name(cb.pages)}) * {page}, "
                       f"{{{{{c}, tt::DataFormat::{cb.format.data}}}}}).set_page_size({c}, {page})")
                self.line(f"CreateCircularBuffer(program, cores, {cfg});  // {cb.what.data}")
                if "unpack_to_dest_fp32" in cb.attributes:
                    utd.append(c)
        kernels = [o for o in ln.body.block.ops if isinstance(o, k.KernelOp)]
        for kern in kernels:
            role = kern.role.data
            ct = f"ct_{role}"
            self.line(f"std::vector<uint32_t> {ct};")
            for a in kern.accessors.data:
                self.line(f"TensorAccessorArgs(*{a.data}).append_to({ct});")
            path = f'kernel_dir + "/{kernel_path(self.p, kern)}"'
            if role == "compute":
                self.line(f"std::vector<UnpackToDestMode> utd_{i}(NUM_CIRCULAR_BUFFERS, UnpackToDestMode::Default);")
                for c in utd:
                    self.line(f"utd_{i}[{c}] = UnpackToDestMode::UnpackToDestFp32;")
                self.line(f"const KernelHandle k_{role} = CreateKernel(program, {path}, cores, ComputeConfig{{"
                          f".math_fidelity = MathFidelity::HiFi4, "
                          f".fp32_dest_acc_en = {'true' if kern.fp32_dest_acc.data else 'false'}, "
                          f".unpack_to_dest_mode = utd_{i}, .compile_args = {ct}}});")
            else:
                cfg = "ReaderDataMovementConfig" if role == "reader" else "WriterDataMovementConfig"
                self.line(f"const KernelHandle k_{role} = CreateKernel(program, {path}, cores, {cfg}({ct}));")
        self.line(f"for (uint32_t core_i = 0; core_i < (uint32_t){self.name(cores)}; ++core_i) {{")
        self.indent += 1
        self.line("const CoreCoord core{core_i % grid.x, core_i / grid.x};")
        for op in ln.body.block.ops:
            if not isinstance(op, (k.CbOp, k.KernelOp)) and op.results and op.results[0] in self.core_dep:
                self.define(op)
        for kern in kernels:
            args = ", ".join(f"(uint32_t){self.name(v)}" for v in kern.rt_args)
            self.line(f"SetRuntimeArgs(program, k_{kern.role.data}, core, {{{args}}});")
        self.indent -= 1
        self.line("}")
        self.line("distributed::MeshWorkload workload;")
        self.line("workload.add_program(distributed::MeshCoordinateRange(mesh.shape()), std::move(program));")
        self.line("distributed::EnqueueMeshWorkload(cq, workload, false);")
        self.indent -= 1
        self.line("}")


#: opgen_tt::IndexType of the dtypes convert-at-boundary converts to
INDEX_TYPE = {"i64": "IndexType::Int64", "bool": "IndexType::Bool"}


def kernel_path(prog: k.ProgramOp, kern: k.KernelOp) -> str:
    """``<program>/<file>`` of a kernel's source (another program's when share-kernels found an
    identical one there)."""
    return kern.shared.data if kern.shared is not None else f"{prog.sym_name.data}/{kern.file.data}"


def prog_args(prog: k.ProgramOp) -> list[dict]:
    """The host function's tensor and scalar parameters (name, kind, dtype, shape dims)."""
    out = []
    plans = {o.indices.data for o in prog.walk() if isinstance(o, k.ScatterPlanOp)}
    read = {o.arg.data for o in prog.walk() if isinstance(o, k.BufferAddrOp | k.HostLoadOp)} | plans
    conv = prog.converted
    for n, kd, ty, lay in zip(prog.arg_names.data, prog.arg_kinds.data, prog.arg_types.data,
                              prog.attributes["layouts"].data, strict=True):
        if n.data != "workspace":
            a = {"name": n.data, "kind": kd.data, "dtype": ty.dtype, "shape": list(ty.shape)}
            if kd.data == "tensor":
                elem = dtypes.by_name(ty.dtype).itemsize
                a["layout"] = lay.data
                a["page_size"] = 1024 * elem if lay.data == "tile" else 32 * elem
                if n.data in plans:  # indices of any IndexType: pages of 32 of them
                    a["dtype"] = "index (the index_dtype parameter: any integer, float or bool index dtype)"
                    a["page_size"] = "32 x the index size"
                elif n.data in conv:  # any IndexType, read back and converted by the host
                    a["dtype"] = (f"any (the {n.data}_dtype parameter: any integer, float or bool IndexType, "
                                  f"converted to {conv[n.data]} by the host)")
                    a["converted_to"] = conv[n.data]
                    a["page_size"] = "32 x the element size"
                elif n.data not in read:
                    a["dtype"] = "any (not read: it only supplies dims)"
            out.append(a)
    return out


def programs(module: ModuleOp) -> list[k.ProgramOp]:
    return [o for o in module.body.block.ops if isinstance(o, k.ProgramOp)]


def function_name(prog: k.ProgramOp) -> str:
    """The public host function of the program's dtype instance (every schedule of it)."""
    return "opgen_tt_" + base_name(prog).replace(".", "_")


def base_name(prog: k.ProgramOp) -> str:
    """``<op>.<dtypes>``: the program's name without its schedule."""
    return prog.sym_name.data.removesuffix(".streamed").removesuffix(".cached")


def schedule_name(prog: k.ProgramOp) -> str:
    last = prog.sym_name.data.rsplit(".", 1)[-1]
    return last if last in ("streamed", "cached") else "resident"


def emit(module: ModuleOp, op_name: str, sizes: dict[str, str] | None = None) -> dict[str, str]:
    """Files of one op's folder ``generated/ttmetal/<op>/``: per variant its kernels
    (``<variant>/<role>_<launch>.cpp``), the support header, ``host.cpp`` / ``host.hpp``
    and ``manifest.json``."""
    import json

    files: dict[str, str] = {}
    fns, manifest = [], {"op": op_name, "layouts": {
        "tile": "32x32 tiles of four 16x16 faces (row-major faces, tiles row-major), one tile per page",
        "row": "row vectors: each row in pages of 32 elements (padded to a multiple of 32)"}, "variants": []}
    groups: dict[str, list[k.ProgramOp]] = {}
    for prog in programs(module):
        groups.setdefault(base_name(prog), []).append(prog)
    decls = []
    for progs in groups.values():
        impls = []
        for prog in progs:
            var = prog.sym_name.data
            impl = f"{function_name(prog)}_{schedule_name(prog)}"
            hp = HostPrinter(prog, impl, sizes)
            entry = {"variant": var, "schedule": schedule_name(prog),
                     "index_dtype_param": any(isinstance(o, k.ScatterPlanOp) for o in prog.walk()),
                     "dtypes": {n: a.data for n, a in prog.dtype_vars.data.items()},
                     "function": function_name(prog), "args": prog_args(prog), "dims": hp.dims(), "launches": []}
            for ln in (o for o in prog.body.block.ops if isinstance(o, k.LaunchOp)):
                entry["launches"].append(launch_entry(prog, ln, var, files))
            manifest["variants"].append(entry)
            fns.append(hp.print())
            impls.append(impl)
        hp = HostPrinter(progs[0], function_name(progs[0]))
        fns.append(hp.public(function_name(progs[0]), impls))
        decls.append(hp.signature(function_name(progs[0])) + ";")
    files["opgen_tt_dataflow.h"] = render("ttmetal/opgen_tt_dataflow.h.j2", plan_slots=PLAN_SLOTS)
    files["host.hpp"] = render("ttmetal/host.hpp.j2", op=op_name, decls=decls)
    files["host.cpp"] = render("ttmetal/host.cpp.j2", op=op_name, functions=fns)
    files["manifest.json"] = json.dumps(manifest, indent=2) + "\n"
    return files


def launch_entry(prog: k.ProgramOp, ln: k.LaunchOp, var: str, files: dict[str, str]) -> dict:
    """A launch's kernels (printed into ``files``) and CBs, for manifest.json."""
    le: dict = {"kernels": [], "cbs": []}
    for o in ln.body.block.ops:
        if isinstance(o, k.CbOp):
            le["cbs"].append({"index": o.index.data, "format": o.format.data, "page_size": o.page.data,
                              "holds": o.what.data})
        if isinstance(o, k.KernelOp):
            # (named without its dtypes: the same kernel of two instances is the same text, one JIT
            # build; share-kernels pointed a kernel identical to an earlier one at its file)
            if o.shared is None:
                files[f"{var}/{o.file.data}"] = KernelPrinter(o, var.split(".")[0], ln.index.data).print()
            pages = {a.sym.data: a.page.data for a in o.body.block.ops if isinstance(a, k.AccessorOp)}
            le["kernels"].append({
                "file": kernel_path(prog, o), "role": o.role.data,
                # interleaved DRAM TensorAccessorArgs: {IsDram, aligned page size} each
                "ct_args": [x for a in o.accessors.data for x in (2, pages[a.data])],
                "ct_args_from": [f"TensorAccessorArgs(*{a.data})" for a in o.accessors.data],
                "rt_args": [a.data for a in o.arg_names.data], "defines": {},
                "fp32_dest_acc": bool(o.fp32_dest_acc.data)})
    return le


def op_sources(o) -> dict[str, str]:
    """``ttmetal/<op>/...``: the op's TT-Metal kernels, host functions and manifest (raises
    TtUnsupported, naming the primitive, when the backend cannot lower the op)."""
    from opgen.passes import pipeline

    m = o.module()
    try:
        pipeline.run(m, "ttmetal")
    except pipeline.StageFailed as e:
        if isinstance(e.__cause__, TileUnsupported):
            raise e.__cause__ from None
        raise
    if not programs(m):
        raise TileUnsupported(o.name, "any of its dtype instances (TT-Metal computes bf16 and f32)")
    from opgen.dsl.spec import SizeSpec

    sizes = {p.name: p.spec.dim.name for p in o.signature.params if isinstance(p.spec, SizeSpec)}
    return {f"ttmetal/{o.name}/{p}": text for p, text in emit(m, o.name, sizes).items()}
