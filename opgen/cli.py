"""The ``opgen`` command line: list, show, build, eval."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence

import numpy as np

from opgen import dtypes, registry
from opgen.dsl.opdef import OpDef
from opgen.dsl.spec import AttrSpec, DSLError, SizeSpec, TensorSpec

EPILOG = """examples:
  opgen list                              the ops, their signatures and C ABIs
  opgen show OP --ir                      the op's L0 IR after the clean-up passes
  opgen show OP --stage traced            the IR as traced from ops_dsl/
  opgen show OP --target cpu --stage lower-to-loops   the CPU loop IR
  opgen build                             regenerate generated/ (incremental)
  opgen build --check                     exit 1 if generated/ is stale
  opgen build --cuda                      also build build/cuda/libopgen_cuda.so (needs nvcc)
  opgen eval OP --dims N=6,D=4 --dtype T=bf16 --set eps=1e-6
"""


def _signature_lines(o: OpDef) -> list[str]:
    lines = []
    for p in o.signature.params:
        spec = p.spec
        if isinstance(spec, TensorSpec | AttrSpec | SizeSpec):
            lines.append(f"    {p.name}: {spec.describe()}")
    return lines


def _abi_line(f: object) -> str:
    kind = getattr(f, "kind", type(f).__name__)
    name = getattr(f, "name", "?")
    if kind == "infiniop":
        return f"infiniop{name}"
    if kind == "aclnn":
        return f"aclnn{name}"
    return f"ttnn.{name}"


def cmd_list(args: argparse.Namespace) -> int:
    ops = registry.load_all()
    for name, o in ops.items():
        dvars = ", ".join(f"{k} in {{{', '.join(map(str, v.members))}}}"
                          for k, v in o.signature.dtype_vars().items())
        abis = ", ".join(_abi_line(f) for f in o.abis) or "(plain C only)"
        print(f"{name}  [{o.where}]")
        if args.verbose:
            print(*_signature_lines(o), sep="\n")
        else:
            print("    (" + ", ".join(p.name for p in o.signature.params) + ")")
        print(f"    dtypes: {dvars or '-'}")
        print(f"    ABIs:   opgen_{name} (plain C), {abis}")
        print(f"    targets: {_targets_line(o)}")
    return 0


def _targets_line(o: OpDef) -> str:
    """Per target: the dtypes it has kernels for (cpu and cuda: every binding; ascendc and
    ttmetal: see their helpers), or why the target cannot take the op."""
    from opgen.emit import ascendc

    why = ascendc.unsupported_reason(o)
    parts = ["cpu: all", "cuda: all", f"ascendc: not supported ({why})" if why else "ascendc: " + _ascendc_support(o),
             "ttmetal: " + _ttmetal_support(o)]
    return " | ".join(parts)


def _ascendc_support(o: OpDef) -> str:
    """The dtypes ascendc has kernels for, from its kernels' bindings; a dtype variable of index
    tensors is served by converting them at the boundary (opgen/tile/indices.py), one of tensors
    never read by any member."""
    from opgen.emit import ascendc
    from opgen.tile.indices import INDEX_DTYPES, free_dtype_vars, index_params

    func = next(iter(o.variants.values()))
    free = free_dtype_vars(func)
    params = {p.name: p for p in o.signature.params}
    index_vars = {params[n].spec.dtype.name for n in index_params(func)}  # type: ignore[attr-defined]
    built: dict[str, set[str]] = {}
    converted_vars: set[str] = set()  # read only through a cast: the host entries convert them on the NPU
    for ks in ascendc.kernels(o).values():
        for k in ks:
            for v, d in k.dtype_vars.data.items():
                built.setdefault(v, set()).add(d.data)  # type: ignore[attr-defined]
            converted_vars |= {params[n].spec.dtype.name for n in k.converted  # type: ignore[attr-defined]
                               if hasattr(params[n].spec.dtype, "members")}
    missing, notes = [], []
    for v in o.signature.dtype_vars().values():
        if v.name in index_vars:
            ok: tuple[str, ...] | set[str] = INDEX_DTYPES
            notes.append(f"{v.name} converted to int32 indices")
        elif v.name in converted_vars and v.name not in built:
            ok = tuple(m.name for m in v.members)
            notes.append(f"{v.name} converted on the NPU")
        elif v.name in free:
            ok = tuple(m.name for m in v.members)
        else:
            ok = built.get(v.name, set())
        missing += [f"{v.name}={m.name}" for m in v.members if m.name not in ok]
    text = "all" if not missing else f"all but {', '.join(missing)} (no 64-bit arithmetic on the NPU)"
    return text + (f"; {'; '.join(notes)}" if notes else "")


def _ttmetal_support(o: OpDef) -> str:
    """The dtype instances TT-Metal has programs for, or why none."""
    from opgen.emit import ttmetal
    from opgen.passes import pipeline
    from opgen.tile.lower import TileUnsupported

    m = o.module()
    try:
        pipeline.run(m, "ttmetal")
    except pipeline.StageFailed as e:
        if isinstance(e.__cause__, TileUnsupported):
            return f"not supported ({e.__cause__.what})"
        raise
    from opgen.ttmetal import dialect as ttk

    progs = ttmetal.programs(m)
    inst = sorted({", ".join(f"{v}={d.data}" for v, d in p.dtype_vars.data.items()) for p in progs})
    if not inst:
        return "not supported (TT-Metal computes bf16 and f32)"
    scatter = any(isinstance(o, ttk.ScatterPlanOp) for p in progs for o in p.walk())
    params = {p.name: p for p in o.signature.params}
    built = {v for p in progs for v in p.dtype_vars.data}
    converted = sorted({params[n].spec.dtype.name for p in progs for n in p.converted  # type: ignore[attr-defined]
                        if hasattr(params[n].spec.dtype, "members")} - built)
    return "; ".join(inst) + ("; every index dtype (converted on the host)" if scatter else "") + \
        "".join(f"; every {v} (converted on the host)" for v in converted)


def cmd_show(args: argparse.Namespace) -> int:
    from opgen.passes import pipeline

    o = registry.get(args.op)
    if args.report:
        return _show_report(o, args)
    target = args.target or "l0"
    if not (args.ir or args.stage or args.target):
        print(f"{o.name}  [{o.where}]\n")
        print(o.doc + "\n" if o.doc else "", end="")
        print("\nparameters:")
        print(*_signature_lines(o), sep="\n")
        print("\nvariants (by present optional tensors):")
        for present in o.variants:
            print(f"    {o.variant_name(present)}")
        for present, r in o.rejected.items():
            print(f"    {o.variant_name(present)}: rejected ({r.status}): {r.message}")
        if o.may_alias:
            print("\nmay alias: " + ", ".join(f"{a} = {b}" for a, b in o.may_alias))
        print("\nABIs: " + (", ".join(_abi_line(f) for f in o.abis) or "(plain C only)"))
        return 0
    stage = args.stage or pipeline.stages(target)[-1]
    m = o.module()
    pipeline.run(m, target, until=stage)
    print(f"// {o.name}: stage '{stage}' of pipeline '{target}'")
    print(m)
    return 0


#: the sizes a report uses when --dims does not name a dim
REPORT_DEFAULT_DIM = 1024


def _show_report(o: OpDef, args: argparse.Namespace) -> int:
    """``opgen show OP --target T --report``: the static report of each kernel instance."""
    from opgen.passes import pipeline
    from opgen.tile import dialect as tdl
    from opgen.tile import report

    if args.target not in ("ascendc", "ttmetal"):
        raise ValueError(f"--report is for the tile-level targets: --target ascendc or --target ttmetal (got "
                         f"{args.target or 'no --target'})")
    dims = {d: int(v) for d, v in _parse_kv(args.dims).items()}
    for d in o.signature.dims():
        dims.setdefault(d, REPORT_DEFAULT_DIM)
    if args.target == "ttmetal":
        return _show_tt_report(o, args, dims)
    plat = {"cores": 48, "ub_bytes": 196608}
    plat.update({k: int(v) for k, v in _parse_kv(args.platform).items()})
    m = o.module()
    pipeline.run(m, args.target)
    rs = report.chosen([k for k in m.body.block.ops if isinstance(k, tdl.KernelOp)
                        and _wanted(k.sym_name.data, args)], dims, plat)
    print(f"// {o.name} on {args.target} at {', '.join(f'{k}={v}' for k, v in dims.items())}; "
          f"platform {', '.join(f'{k}={v}' for k, v in plat.items())}")
    print(report.format_report(rs))
    return 0


def _wanted(name: str, args: argparse.Namespace) -> bool:
    """Whether ``--variant`` (a substring of the kernel or program name) selects ``name``."""
    return not args.variant or args.variant in name


def _show_tt_report(o: OpDef, args: argparse.Namespace, dims: dict[str, int]) -> int:
    """The TT-Metal report: per program and launch, cores, L1 and CB pages, DRAM bytes moved."""
    from opgen.emit import ttmetal
    from opgen.passes import pipeline
    from opgen.ttmetal import dialect as ttk
    from opgen.ttmetal import report

    plat = {k: int(v) for k, v in _parse_kv(args.platform).items()}
    bad = set(plat) - {"grid_x", "grid_y"}
    if bad:
        raise SystemExit(f"opgen: --platform for ttmetal takes grid_x, grid_y (not {', '.join(sorted(bad))})")
    grid = (plat.get("grid_x", 8), plat.get("grid_y", 8))
    m = o.module()
    pipeline.run(m, "ttmetal")
    progs = [p for p in ttmetal.programs(m) if _wanted(p.sym_name.data, args)]
    if not progs:
        raise ValueError(f"--variant {args.variant!r} selects none of {o.name}'s TT-Metal programs "
                         f"({', '.join(p.sym_name.data for p in ttmetal.programs(m))})")
    rs = []
    for i, p in enumerate(progs):  # (interpreting every core's walk: seconds to minutes per program)
        t0 = time.monotonic()
        rs.append(report.report(p, dims, grid))
        print(f"opgen: report {i + 1}/{len(progs)} {p.sym_name.data} ({time.monotonic() - t0:.1f} s)",
              file=sys.stderr)
    print(f"// {o.name} on ttmetal at {', '.join(f'{k}={v}' for k, v in dims.items())}; "
          f"grid {grid[0]}x{grid[1]} (Wormhole: 8x8)")
    if any(isinstance(x, ttk.ScatterPlanOp) for p in progs for x in p.walk()):
        print("// scatter-add traffic for uniform random indices (seed 0), every table row kept")
    print(report.format_report(rs))
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from opgen import build
    from opgen.compile import CompileError

    try:
        return build.main(check=args.check, out=args.out, verbose=not args.quiet,
                          compile_lib=not args.no_compile, cuda=args.cuda, build_dir=args.build_dir,
                          tracebacks=args.traceback, only=args.target)
    except CompileError as e:
        print(f"opgen build: compilation failed:\n{e}\n    what to do: generated code that does not compile is a "
              "compiler bug; please report it with this output (the source named above is kept)", file=sys.stderr)
        return 1


def _parse_kv(text: str | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (text or "").split(","):
        if item.strip():
            k, sep, v = item.partition("=")
            if not sep:
                raise SystemExit(f"opgen: expected NAME=VALUE, got {item!r}")
            out[k.strip()] = v.strip()
    return out


def random_inputs(o: OpDef, dims: dict[str, int], dvars: dict[str, str], seed: int,
                  present: Sequence[str] = ()) -> dict[str, object]:
    """Random arguments for ``o``: floats ~ N(0, 1); integers — and tensors whose dtype variable
    also admits integers (indices given as floats) — in [0, smallest dim)."""
    rng = np.random.default_rng(seed)
    sig = o.signature
    default = 16
    sizes = {d: dims.get(d, default) for d in sig.dims()}
    types = {k: dtypes.by_name(dvars[k]) if k in dvars else v.members[0]
             for k, v in sig.dtype_vars().items()}
    hi = min(sizes.values()) if sizes else default
    args: dict[str, object] = {}
    for p in sig.params:
        if isinstance(p.spec, SizeSpec):
            args[p.name] = sizes[p.spec.dim.name]
            continue
        if not isinstance(p.spec, TensorSpec) or (p.optional and p.name not in present):
            continue
        dt = p.spec.dtype if isinstance(p.spec.dtype, dtypes.DType) else types[p.spec.dtype.name]
        shape = [d if isinstance(d, int) else sizes[d.name] for d in p.spec.shape]
        index_like = any(m.is_int for m in getattr(p.spec.dtype, "members", (dt,)))
        if dt.is_float and not index_like:
            arr = rng.standard_normal(shape).astype(dt.np_dtype)
        elif dt.is_bool:
            arr = rng.random(shape) < 0.3
        else:
            arr = rng.integers(0, max(hi, 1), shape).astype(dt.np_dtype)
        args[p.name] = arr
    return args


def cmd_eval(args: argparse.Namespace) -> int:
    from opgen import oracle
    from opgen.binding import OpError

    o = registry.get(args.op)
    dims = {k: int(v) for k, v in _parse_kv(args.dims).items()}
    present = [x for x in (args.with_ or "").split(",") if x]
    if args.inputs:
        with np.load(args.inputs) as z:
            call: dict[str, object] = {k: z[k] for k in z.files}
    else:
        call = random_inputs(o, dims, _parse_kv(args.dtype), args.seed, present)
    for k, v in _parse_kv(args.set).items():
        call[k] = v.lower() == "true" if v.lower() in ("true", "false") else \
            (float(v) if any(c in v for c in ".e") else int(v))
    try:
        outs = oracle.run(o, **call)
    except OpError as e:
        print(f"opgen eval: {o.name} rejected the call: {e}", file=sys.stderr)
        return 2
    np.set_printoptions(precision=4, suppress=True, threshold=40, edgeitems=3)
    for name, val in call.items():
        if isinstance(val, np.ndarray):
            print(f"input  {name}: shape {val.shape} {val.dtype}")
        else:
            print(f"attr   {name} = {val}")
    for name, val in outs.items():
        print(f"output {name}: shape {val.shape} {val.dtype}")
        print("   ", str(np.asarray(val, np.float64)).replace("\n", "\n    "))
    if args.save:
        np.savez(args.save, **{k: v for k, v in outs.items()})
        print(f"saved outputs to {args.save}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="opgen", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG,
        description="Compile deep-learning operators written once in the opgen DSL (ops_dsl/) "
                    "into kernels and vendor C ABIs.")
    ap.add_argument("--traceback", action="store_true",
                    help="on an error, also print the Python traceback (for bug reports)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    p = sub.add_parser("list", help="list the ops with signatures and ABIs",
                       description="List every op found in ops_dsl/ with its parameters, dtype "
                                   "variables and the C ABIs it exposes.")
    p.add_argument("-v", "--verbose", action="store_true", help="full typed signatures")
    p.set_defaults(fn=cmd_list)

    p = sub.add_parser("show", help="show one op: signature, variants, or its IR at any stage",
                       description="Without flags: the op's signature, doc, variants and ABIs. "
                                   "With --ir: its IR after the target's pipeline; with --stage "
                                   "NAME: after that stage ('traced' = before any pass).")
    p.add_argument("op", help="op name (see 'opgen list')")
    p.add_argument("--ir", action="store_true", help="print the IR after the whole pipeline")
    p.add_argument("--stage", help="print the IR after this stage of the pipeline")
    p.add_argument("--target", default=None,
                   help="pipeline to run: l0, cpu, cuda, ascendc, ttmetal or mlir (upstream MLIR's func/scf/memref/"
                        "arith/math, which mlir-opt parses); alone, prints the IR after the whole pipeline "
                        "(default: l0)")
    p.add_argument("--report", action="store_true",
                   help="tile-level targets: the static report of each kernel (tiling, on-chip bytes, global "
                        "bytes moved vs the minimum, cores) at --dims")
    p.add_argument("--dims", help=f"sizes for --report, e.g. N=8192,D=4096 (default {REPORT_DEFAULT_DIM} each)")
    p.add_argument("--platform", help="device for --report, e.g. cores=48,ub_bytes=196608 (Atlas A2 / 910B)")
    p.add_argument("--variant", help="--report only for the kernels (ascendc) or programs (ttmetal) whose "
                                     "name contains this, e.g. 'bf16' or 'softmax.bf16.u8'")
    p.set_defaults(fn=cmd_show)

    p = sub.add_parser("build", help="regenerate generated/ from ops_dsl/",
                       description="Write every op's outputs under generated/ (IR, C headers, "
                                   "CPU kernels; byte-for-byte reproducible, unchanged files are "
                                   "not rewritten) and compile build/cpu/libopgen.so with the "
                                   "system C compiler (incremental).")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if generated/ differs from a fresh build")
    p.add_argument("--out", default=None, help="output directory (default: <repo>/generated)")
    p.add_argument("--build-dir", default=None,
                   help="where the libraries are compiled (default: <repo>/build for the default --out, "
                        "else OUT.build beside OUT)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.add_argument("--target", default=None, choices=["mlir"],
                   help="regenerate only this target's folder and compile nothing: 'mlir' writes OUT/mlir/OP.mlir "
                        "(upstream MLIR's func/scf/memref/arith/math; a plain build writes it too)")
    p.add_argument("--no-compile", action="store_true",
                   help="only write generated/, do not compile build/cpu/libopgen.so")
    p.add_argument("--cuda", action=argparse.BooleanOptionalAction, default=None,
                   help="also compile build/cuda/libopgen_cuda.so with nvcc (default: $OPGEN_CUDA, "
                        "else no; the first build takes minutes)")
    p.set_defaults(fn=cmd_build)

    p = sub.add_parser("eval", help="run an op with the numpy oracle on random or given inputs",
                       description="Evaluate an op with the numpy oracle (the reference "
                                   "interpreter of its IR). Inputs are random unless --inputs "
                                   "gives an .npz file of arrays named after the parameters.")
    p.add_argument("op")
    p.add_argument("--dims", help="dim sizes, e.g. N=6,D=4 (default 16 each)")
    p.add_argument("--dtype", help="dtype variables, e.g. T=bf16,I=i32 (default: first member)")
    p.add_argument("--set", help="attributes, e.g. eps=1e-6,scale_grad_by_freq=true")
    p.add_argument("--with", dest="with_", help="optional tensors to pass (comma-separated parameter names)")
    p.add_argument("--inputs", help=".npz file with the input arrays")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--save", help="write the outputs to this .npz file")
    p.set_defaults(fn=cmd_eval)
    for sp in sub.choices.values():  # also accepted after the command: opgen build --traceback
        sp.add_argument("--traceback", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, also print the Python traceback")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from opgen.binding import OpError
    from opgen.passes.pipeline import StageFailed

    args = make_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except BrokenPipeError:  # (the reader went away, as `opgen show OP --target mlir | head` does)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (DSLError, KeyError, OpError, StageFailed, ValueError) as e:
        if args.traceback:
            traceback.print_exc()
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        op = f"op '{args.op}': " if getattr(args, "op", None) else ""
        print(f"opgen: error: {op}{msg}", file=sys.stderr)
        return 2
    except Exception as e:
        if args.traceback:
            traceback.print_exc()
        print(f"opgen: internal error in '{args.cmd}': {type(e).__name__}: {e}\n"
              f"    please report it with the output of 'opgen {args.cmd} ... --traceback'", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
