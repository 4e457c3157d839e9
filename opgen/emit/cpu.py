"""The CPU target: C11 + OpenMP. A thin subclass of the C-family printer plus the per-op
translation unit (kernels for every variant x dtype binding, the op's signature table, and its
plain C entry points)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from xdsl.dialects.builtin import IntAttr

from opgen import dtypes
from opgen.dsl.opdef import OpDef
from opgen.dsl.spec import AttrSpec, Batch, DTypeVar, SizeSpec, TensorSpec
from opgen.emit import cnames, render
from opgen.emit.c_family import SCALAR_FIELD, BufInfo, CPrinter, c_widen
from opgen.emit.render import STATUS_C
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import COLLAPSE, MapCpu, cpu_mapping
from opgen.lower.sched import CpuMapping, bindings
from opgen.lower.to_loops import LowerToLoops
from opgen.passes import pipeline


class CpuPrinter(CPrinter):
    """OpenMP where map-cpu put it (opgen/lower/cpu_map.py); everything else is plain C."""

    OMP_FOR = "#pragma omp parallel for{collapse} schedule(static) num_threads(opgen_team())"
    #: an omp_for loop with streaming stores: a region, the loop without its barrier, a fence
    OMP_REGION = "#pragma omp parallel num_threads(opgen_team())"
    OMP_FOR_NOWAIT = "#pragma omp for{collapse} schedule(static) nowait"
    #: an omp_for loop sharing the team with the loops nested in it (map-cpu's ``collapse``: how many)
    COLLAPSE = " collapse({n})"
    SIMD = "#pragma omp simd"
    #: print map-cpu's vector loops' pragma (off in the O1 general-stride flavour, which is not
    #: vectorised: the pragma would force it)
    simd = True
    #: the runtime's vectorisable exp, erf and tanh (opgen_rt.h: branch-free; 0.94, 1.61 and 1.59 ulp at most)
    MATH_F32: ClassVar[dict[str, str]] = {"expf": "opgen_expf", "erff": "opgen_erff", "tanhf": "opgen_tanhf",
                                          "logf": "opgen_logf"}
    #: a ``sched.load_fn`` of these is a lookup in a table of 65536 values (opgen/lower/tabulate.py)
    TABULATED = frozenset({"bf16", "f16"})

    def __init__(self, *args: object, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        #: the C name shared by the instance's stride flavours (its tables are named after it)
        self.instance = self.fn_name
        #: the definitions of the tables this function reads, by name (printed before it, once a file)
        self.tables: dict[str, str] = {}

    def table(self, op: s.LoadFnOp) -> str:
        """``op``'s table (``<instance>_tab<n>``, n its place among the kernel's ``sched.load_fn``
        ops): its definition, with a builder that evaluates the region for each of the 65536 bit
        patterns, and a ``pthread_once`` of the builder where the function starts."""
        n = [o for o in self.k.walk() if isinstance(o, s.LoadFnOp)].index(op)
        name = f"{self.instance}_tab{n}"
        if name not in self.tables:
            d = self.dtype(s.buf_type(op.buf).dtype)
            saved, depth = self.lines, self.depth
            self.lines, self.depth = [], 2
            value = self.name(self.apply_fn(op, c_widen(f"({d.c_type})b", d)))
            body = self.lines
            self.lines, self.depth = saved, depth
            self.tables[name] = render.render("cpu/table.c.j2", table=name, dtype=d.name, body=body, value=value,
                                              ctype=self.ctype(ir.tensor_type(op.result).dtype)).rstrip("\n")
            self.first.append(f"pthread_once(&{name}_once, {name}_build);")
        return name

    def loop_header_hook(self, op: s.ForOp, iv: str, lo: str, hi: str) -> None:
        n = op.attributes.get(COLLAPSE)
        collapse = self.COLLAPSE.format(n=n.data) if isinstance(n, IntAttr) else ""
        if cpu_mapping(op) == CpuMapping.OMP_FOR and self.streams(op):  # (a region that fences its streams)
            self.line(self.OMP_REGION)
            self.line("{")
            self.line(self.OMP_FOR_NOWAIT.format(collapse=collapse))
        elif cpu_mapping(op) == CpuMapping.OMP_FOR:
            self.line(self.OMP_FOR.format(collapse=collapse))
        super().loop_header_hook(op, iv, lo, hi)

    def streams(self, op: s.ForOp) -> bool:
        """Whether ``op`` holds ``nontemporal`` stores this instance prints as strips that may
        stream (its region then fences them)."""
        return any(isinstance(o, s.StoreOp) and cpu_mapping(o) == CpuMapping.NONTEMPORAL and self.staged_store(o)
                   for o in op.walk())

    def loop_footer_hook(self, op: s.ForOp) -> None:
        if cpu_mapping(op) == CpuMapping.OMP_FOR and self.streams(op):
            self.line("opgen_stream_fence();")
            self.line("}")

    def simd_hook(self) -> None:
        if self.simd:
            self.line(self.SIMD)

    def matmul_pragma_hook(self, op: s.BufferMatmulOp) -> None:
        if cpu_mapping(op) == CpuMapping.OMP_FOR:
            self.line(self.OMP_FOR.format(collapse=""))


@dataclass
class Instance:
    variant: tuple[str, ...]
    binding: dict[str, dtypes.DType]
    fn: str


def instance_name(o: OpDef, present: tuple[str, ...], b: dict[str, dtypes.DType]) -> str:
    """The C name of one kernel instance: ``k_<variant>_<dtype>...``."""
    return "k_" + o.variant_name(present) + "".join(f"_{d.name}" for d in b.values())


def stride_flavours(k: s.KernelOp, unit_check: str) -> str:
    """Which stride flavours an instance of ``k`` gets (``unit_check``: its printer's
    :meth:`~CPrinter.unit_last_check`): ``general`` for a compute-bound kernel (a matmul: the
    packed GEMM reads any strides) unless a matmul writes a caller's buffer (the GEMM writes
    rows of unit stride only: matmul-into-output), ``unit`` when no read parameter can have a
    non-unit last stride, else ``both``, chosen per call."""
    args = set(k.body.block.args)
    mms = [x for x in k.walk() if isinstance(x, s.BufferMatmulOp)]
    if mms and not any(x.c in args for x in mms):
        return "general"
    return "unit" if unit_check == "1" else "both"


def kernel_buf_info(k: s.KernelOp, info: dict[str, BufInfo]) -> dict[str, BufInfo]:
    """``info`` as a kernel sees it: a parameter converted at the boundary is a dense copy."""
    return {n: replace(i, last_contig=True) if n in k.converted else i for n, i in info.items()}


def kernels(o: OpDef, target: str = "cpu", fuse: bool = True) -> dict[tuple[str, ...], s.KernelOp]:
    """Each valid variant lowered through ``target``'s pipeline to an L2 kernel (``fuse=False``:
    the unfused fallback lowering, which tests use to exercise printers on other loop shapes)."""
    m = o.module()
    if fuse:
        pipeline.run(m, target)
    else:
        ctx = pipeline.context()
        mapping = pipeline.GPU_MAPPING if target == "cuda" else [MapCpu()]  # (the printers follow)
        for p in [*pipeline.L0, LowerToLoops(fuse=False), *mapping]:
            p.apply(ctx, m)
            m.verify()
    out = {}
    names = {o.variant_name(p): p for p in o.variants}
    for k in m.body.block.ops:
        assert isinstance(k, s.KernelOp)
        out[names[k.sym_name.data]] = k
    return out


def c_param(p_name: str, spec: object) -> str:
    """The C declaration of a parameter in public prototypes (named by :func:`cnames.public`)."""
    name = cnames.public(p_name)
    if isinstance(spec, TensorSpec):
        return f"const opgen_tensor_t *{name}"
    if isinstance(spec, AttrSpec):
        return {"f32": "float", "i64": "int64_t", "bool": "bool"}[spec.dtype.name] + " " + name
    return f"int64_t {name}"


def param_doc(spec: object) -> str:
    return spec.describe()  # type: ignore[attr-defined]


def op_layout(o: OpDef) -> tuple[list[str], dict[str, int], list[str], dict[str, int], dict[str, BufInfo]]:
    """How kernels see an op's arguments: dim names and their ids, dtype variables, parameter
    indices, and each tensor's addressing (batch rows, unit-stride last dim)."""
    sig = o.signature
    dims = sig.dims()
    pidx = {p.name: i for i, p in enumerate(sig.params)}
    info = {p.name: BufInfo(pidx[p.name], isinstance(p.spec.batch, Batch), p.spec.last_contiguous)
            for p in sig.params if isinstance(p.spec, TensorSpec)}
    return dims, {d: i for i, d in enumerate(dims)}, list(sig.dtype_vars()), pidx, info


def op_source(o: OpDef) -> str:
    """The CPU translation unit of one op."""
    _, dim_ids, _, pidx, info = op_layout(o)
    parts = [f"/* {o.name}: CPU kernels generated by opgen from {o.where}. Do not edit. */",
             '#include "opgen.h"', '#include "opgen_rt.h"', '#include "opgen_seg.h"', "#include <omp.h>", "",
             "static inline int opgen_thread(void) { return omp_get_thread_num(); }",
             "static inline int opgen_threads(void) { return opgen_team_cap(); }", ""]
    ks = kernels(o)
    inst: dict[tuple[str, ...], list[Instance]] = {}
    tables = False  # (whether a kernel reads a table)
    for present, k in ks.items():
        kinfo = kernel_buf_info(k, info)
        for b in bindings(k):
            fn = instance_name(o, present, b)
            fast = CpuPrinter(k, b, fn, kinfo, dim_ids, pidx)
            flavours = stride_flavours(k, fast.unit_last_check())
            fast.unit_last = flavours != "general"
            if flavours != "both":
                fast.pre_name = fn + "_pre"
                text = fast.print()
                tables |= bool(fast.tables)
                parts += [*fast.tables.values(), text]
                inst.setdefault(present, []).append(Instance(present, b, fn))
                continue
            fast.fn_name, fast.with_ws = fn + "_u", False
            generic = CpuPrinter(k, b, fn + "_g", kinfo, dim_ids, pidx)
            generic.instance = fn
            generic.ws_name = fn + "_ws"
            generic.fn_attr = '__attribute__((optimize("O1"))) '
            generic.simd = False
            generic.pre_name = fn + "_pre"
            texts = [generic.print(), fast.print()]
            tables |= bool(fast.tables)
            parts += [*{**generic.tables, **fast.tables}.values(), *texts]
            parts.append(render.render("cpu/flavour_dispatch.c.j2", fn=fn, check=fast.unit_last_check(),
                                       why="every caller buffer's last dim contiguous: the vectorisable flavour",
                                       extra_params="", extra_args=""))
            inst.setdefault(present, []).append(Instance(present, b, fn))
    if tables:  # (their pthread_once: cpu/table.c.j2)
        parts.insert(3, "#include <pthread.h>")
    parts += op_tables(o, inst, {p: k.converted for p, k in ks.items()})
    parts += entry_points(o)
    return "\n".join(parts) + "\n"


def op_tables(o: OpDef, inst: dict[tuple[str, ...], list[Instance]],
              converted: dict[tuple[str, ...], dict[str, str]]) -> list[str]:
    """The op's signature table ``OP_<op>`` (parameters, dims, variants, kernels by dtype binding)
    that the runtime binder reads (templates/cpu/op_table.c.j2); ``inst`` gives each variant's
    kernel entry points (a dtype variable a kernel is not instantiated over matches any dtype),
    ``converted`` the parameters each variant's kernels read converted to another dtype
    (``{name: dtype}``)."""
    sig = o.signature
    dims = sig.dims()
    dim_ids = {d: i for i, d in enumerate(dims)}
    dvars = list(sig.dtype_vars())
    pidx = {p.name: i for i, p in enumerate(sig.params)}
    scalar = {"is_output": 0, "optional": 0, "last_contig": 0, "batch": 0, "var": -1, "mask": "0", "rank": 0,
              "dims": "0", "lits": "0", "batch_min": 0, "batch_max": 0, "size_dim": -1}
    params: list[dict[str, object]] = []
    for p in sig.params:
        spec = p.spec
        if isinstance(spec, TensorSpec):
            members = spec.dtype.members if isinstance(spec.dtype, DTypeVar) else (spec.dtype,)
            bt = spec.batch
            params.append({
                "name": p.name, "kind": "OPGEN_P_TENSOR", "is_output": int(p.is_output), "optional": int(p.optional),
                "last_contig": int(spec.last_contiguous), "batch": int(bt is not None),
                "var": dvars.index(spec.dtype.name) if isinstance(spec.dtype, DTypeVar) else -1,
                "mask": f"0x{sum(1 << dtypes.ALL.index(m) for m in members):x}u", "rank": len(spec.shape),
                "dims": ", ".join(str(-1 if isinstance(d, int) else dim_ids[d.name]) for d in spec.shape) or "0",
                "lits": ", ".join(f"{d if isinstance(d, int) else 0}ll" for d in spec.shape) or "0",
                "batch_min": bt.min_rank if bt else 1, "batch_max": bt.max_rank if bt else 1, "size_dim": -1})
        elif isinstance(spec, AttrSpec):
            kind = {"f32": "OPGEN_P_F32", "i64": "OPGEN_P_I64", "bool": "OPGEN_P_BOOL"}[spec.dtype.name]
            params.append({**scalar, "name": p.name, "kind": kind})
        else:
            assert isinstance(spec, SizeSpec)
            params.append({**scalar, "name": p.name, "kind": "OPGEN_P_SIZE", "size_dim": dim_ids[spec.dim.name]})
    opts = [p.name for p in sig.optionals]
    variants: list[dict[str, object]] = []
    for present in o.presence_sets():
        v: dict[str, object] = {"mask": f"0x{sum(1 << opts.index(x) for x in present):x}u"}
        if present in inst:
            conv = converted.get(present, {})
            v.update(table=f"K_{o.variant_name(present)}", kernels=[
                {"fn": i.fn, "dtypes": ", ".join(cnames.dtype_enum(i.binding[d].name) if d in i.binding
                                                 else "OPGEN_ANY_DTYPE" for d in dvars) or "0"}
                for i in inst[present]],
                converted=f"C_{o.variant_name(present)}" if conv else "",
                codes=", ".join(cnames.dtype_enum(conv[p.name]) if p.name in conv else "-1" for p in sig.params))
        else:
            r = o.rejected[present]
            v.update(kernels=[], status=STATUS_C[r.status],
                     message=r.message.replace('"', "'"))
        variants.append(v)
    alias = [f"{{{pidx[a]}, {pidx[b]}}}" for a, b in o.may_alias]
    text = render.render("cpu/op_table.c.j2", op=o.name, params=params, dims=dims, variants=variants,
                         alias=alias, n_vars=len(dvars))
    return [text.rstrip("\n")]


def entry_points(o: OpDef, prefix: str = "opgen_", run: str = "opgen_run", extra_params: str = "",
                 extra_args: str = "", decl: str = "") -> list[str]:
    """The plain entry points ``<prefix><op>(...)`` and ``<prefix><op>_workspace_size(...)``,
    both calling the runtime's ``run`` function on ``OP_<op>`` (templates/cpu/entry_points.c.j2)."""
    sig = o.signature
    sets = [{"index": i, "name": cnames.public(p.name),
             "field": SCALAR_FIELD[p.spec.dtype.name] if isinstance(p.spec, AttrSpec) else "i"}
            for i, p in enumerate(sig.params) if isinstance(p.spec, AttrSpec | SizeSpec)]
    text = render.render(
        "cpu/entry_points.c.j2", op=o.name, prefix=prefix, run=run, decl=decl, extra_params=extra_params,
        extra_args=extra_args, n=len(sig.params), cparams=", ".join(c_param(p.name, p.spec) for p in sig.params),
        tensors=[cnames.public(p.name) if isinstance(p.spec, TensorSpec) else "NULL" for p in sig.params],
        sets=sets)
    return [text.rstrip("\n")]


def header_info(o: OpDef) -> dict[str, object]:
    sig = o.signature
    return {
        "name": o.name,
        "summary": (o.doc.splitlines() or [""])[0],
        "params": [{"name": p.name, "doc": param_doc(p.spec)} for p in sig.params],
        "c_params": ", ".join(c_param(p.name, p.spec) for p in sig.params),
    }
