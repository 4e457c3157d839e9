"""GPU check and benchmark of the CUDA library — run on a machine with an NVIDIA GPU.

    python benchmarks/gpu.py [--quick] [--skip-build] [--rows check,edges,paths,oob,torch,embedding,rms,flce]
                             [--llm] [--sanitizer] [--out results.json]

1. builds build/cuda/libopgen_cuda.so (``opgen build --cuda``; needs nvcc; --skip-build reuses it),
2. checks every op x dtype binding x variant against the numpy oracle on small random inputs
   (same tolerance rule as the CPU library's tests), and against PyTorch CUDA where PyTorch has
   the op (embedding_dense_backward, RMSNorm backward through autograd),
3. checks bitwise determinism: every output identical over repeated runs and with every grid
   capped at 1 and 7 blocks ($OPGEN_CUDA_MAX_GRID),
4. checks an index out of range: the call writes nothing and the device status says INDEX,
5. times ours vs PyTorch CUDA (CUDA events, median of alternating runs): embedding_dense_backward,
   RMSNorm backward (autograd, and torch.ops.aten._fused_rms_norm_backward when it exists), and the
   FLCE gradient (vs PyTorch's materialised-logits composite, and Liger-Kernel's fused linear
   cross entropy when importable; with each one's peak device memory) at the CPU benchmark's
   sizes and, with --llm, at LLM sizes (V=128256, H=4096, BT=8192, bf16),
6. with --sanitizer, runs compute-sanitizer memcheck, racecheck, synccheck and initcheck on small
   cases of every op,
and prints a ratio table. Without a usable GPU it stops with a clear message (exit status 2).
"""

# ruff: noqa: N803, B023  (math names like V, BT; lambdas are timed inside their own iteration)
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opgen import dtypes, oracle, registry
from opgen.binding import OpError

EXIT_NO_GPU = 2
EPS = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 0.0, "f64": 0.0}
TINY = {"f16": 2.0**-24, "bf16": 2.0**-133, "f32": 2.0**-149, "f64": 0.0}
REORDER = {"f16": 1e-5, "bf16": 1e-5, "f32": 1e-5, "f64": 1e-12}
SPEC_TOL = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3, "f64": 1e-12}  # vs PyTorch, relative to max|ref|
FLCE = "fused_linear_cross_entropy_loss_grad"


def die(msg: str) -> None:
    print(f"benchmarks/gpu.py: {msg}", file=sys.stderr)
    sys.exit(EXIT_NO_GPU)


def need_gpu() -> Any:
    """torch, with a CUDA device, or a clear exit."""
    try:
        import torch
    except ImportError:
        die("PyTorch is not installed: this script needs torch with CUDA (pip install torch)")
    if not torch.cuda.is_available():
        die(f"no CUDA GPU visible to PyTorch {torch.__version__} (torch.version.cuda={torch.version.cuda}); "
            "run this on the GPU machine")
    return torch


# ----------------------------------------------------------------------------- building
def build_library(skip: bool) -> None:
    from opgen import runtime_cuda

    if skip and runtime_cuda.library_path().exists():
        return
    from opgen import build
    from opgen import compile as cc

    if cc.nvcc() is None:
        die("nvcc not found (set NVCC or put the CUDA toolkit on PATH): cannot build libopgen_cuda.so")
    t0 = time.perf_counter()
    if build.main(verbose=True, cuda=True) != 0:
        die("opgen build --cuda failed")
    print(f"built {runtime_cuda.library_path()} in {time.perf_counter() - t0:.0f}s", flush=True)


# ----------------------------------------------------------------------------- inputs
def _f(rng: np.random.Generator, shape: Any, T: str, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(dtypes.BY_NAME[T].np_dtype)


def cases(o: Any, rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
    """Small inputs for every dtype binding x valid variant of ``o`` (seed ops by hand, any
    other op through the CLI's random inputs)."""
    from opgen.cli import random_inputs

    sig = o.signature
    dvars = sig.dtype_vars()
    out: list[tuple[str, dict[str, Any]]] = []
    for combo in itertools.product(*(v.members for v in dvars.values())):
        b = {k: d.name for k, d in zip(dvars, combo, strict=True)}
        tag = ",".join(f"{k}={v}" for k, v in b.items())
        for present in o.variants:
            name = f"{o.name}[{tag}{' +' + '+'.join(present) if present else ''}]"
            args = _seed_case(o.name, b, set(present), rng)
            if args is None:
                args = random_inputs(o, {}, b, int(rng.integers(1 << 30)), present)
            out.append((name, args))
    return out


def _seed_case(op: str, b: dict[str, str], present: set[str], rng: np.random.Generator) -> dict | None:
    if op == "embedding_backward":
        T, IT = b["T"], b["I"]
        N, D, N1, N2 = 37, 13, 7, 11
        a: dict[str, Any] = {"dy": _f(rng, (N, D), T), "i1": rng.integers(0, N1, N).astype(IT_NP(IT)),
                             "alpha1": 2.0, "dtable1_acc": True, "dtable1": _f(rng, (N1, D), T)}
        if "i2" in present:
            a["i2"] = rng.integers(0, N2, N).astype(IT_NP(IT))
            a["alpha2"] = -0.75
        if "dtable2" in present:
            a["dtable2"] = np.full((N2, D), np.nan, dtypes.BY_NAME[T].np_dtype)
            a["dtable2_acc"] = False
        return a
    if op == "embedding_dense_backward":
        T, IDX = b["T"], b["IDX"]
        V = 2 if IDX == "bool" else 11
        idx = rng.random((3, 5)) < 0.5 if IDX == "bool" else rng.integers(0, V, (3, 5)).astype(IT_NP(IDX))
        return {"grad": _f(rng, (3, 5, 9), T), "indices": idx, "num_weights": V,
                "padding_idx": 1 if IDX == "bool" else 3, "scale_grad_by_freq": True}
    if op == "embedding_bw":
        N, D, V = 29, 10, 9
        return {"indices": rng.integers(0, V, N).astype(IT_NP(b["I"])),
                "weight": np.zeros((V, D), dtypes.BY_NAME[b["W"]].np_dtype), "grad": _f(rng, (N, D), b["T"])}
    if op == "rms_norm_backward":
        T = b["T"]
        return {"grad_y": _f(rng, (6, 300), T), "x": _f(rng, (6, 300), T, 1.5), "w": _f(rng, 300, T), "eps": 1e-6}
    if op == FLCE:
        T, M, TI = b["T"], b["M"], b["TI"]
        BT, H, V = 70, 20, 300
        X, W = _f(rng, (BT, H), T), _f(rng, (V, H), T, 0.5)
        logits = X.astype(np.float64) @ W.astype(np.float64).T
        lmax = logits.max(1).astype(np.float32)
        e = np.exp(logits - lmax.astype(np.float64)[:, None])
        outside = rng.random(BT) < 0.4
        mask = np.packbits(outside, bitorder="little") if M == "u8" else outside
        a = {"grad": _f(rng, BT, "f32"), "input": X, "weight": W, "target_mask": mask,
             "masked_target": rng.integers(0, V, BT).astype(IT_NP(TI))}
        if "softmax" in present:
            a["softmax"] = (e / e.sum(1)[:, None]).astype(np.float32)
        if "logits_max" in present:
            a["logits_max"] = lmax
        if "sum_exp_logits" in present:
            a["sum_exp_logits"] = e.sum(1).astype(np.float32)
        return a
    return None


def IT_NP(name: str) -> np.dtype:  # noqa: N802 - reads like a dtype
    return dtypes.BY_NAME[name].np_dtype


# ----------------------------------------------------------------------------- checks
def close(ours: np.ndarray, ref: np.ndarray) -> str | None:
    """None when ``ours`` matches the oracle's ``ref`` (the CPU tests' rule), else why not."""
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return f"shape/dtype {ours.shape} {ours.dtype} vs {ref.shape} {ref.dtype}"
    T = dtypes.from_numpy(ours.dtype).name
    o, r = ours.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(o), np.isnan(r)):
        return "NaN positions differ"
    for s in (np.inf, -np.inf):
        if not np.array_equal(o == s, r == s):
            return f"{s} positions differ"
    fin = np.isfinite(r)
    if not fin.any() or T not in EPS:
        return None if np.array_equal(o[fin], r[fin]) else "integer results differ"
    scale = float(np.abs(r[fin]).max())
    err = np.abs(o[fin] - r[fin])
    bound = EPS[T] * np.maximum(np.abs(o[fin]), np.abs(r[fin])) + TINY[T] + REORDER[T] * scale
    if (err > bound).any():
        k = int(np.argmax(err - bound))
        return f"{int((err > bound).sum())} elements beyond tolerance; worst {o[fin][k]!r} vs {r[fin][k]!r}"
    return None


def run_ours(torch: Any, name: str, args: dict[str, Any]) -> dict[str, np.ndarray]:
    from opgen import runtime_cuda

    outs = runtime_cuda.call(name, **args)
    torch.cuda.synchronize()
    return {k: runtime_cuda.to_host(v) for k, v in outs.items()}


GRID_CAPS = (None, None, 1, 7)  # $OPGEN_CUDA_MAX_GRID per run: two default launches, then 1 and 7 blocks


def run_under_grid_cap(torch: Any, name: str, args: dict[str, Any], cap: int | None) -> dict[str, np.ndarray]:
    """``run_ours`` with every grid capped at ``cap`` blocks (None: the library's own grids)."""
    if cap is None:
        os.environ.pop("OPGEN_CUDA_MAX_GRID", None)
    else:
        os.environ["OPGEN_CUDA_MAX_GRID"] = str(cap)
    try:
        return run_ours(torch, name, args)
    finally:
        os.environ.pop("OPGEN_CUDA_MAX_GRID", None)


def check_all(torch: Any, report: dict, limit: int | None = None) -> int:
    """Every op x binding x variant vs the oracle, and bitwise determinism across runs and launch
    configurations (GRID_CAPS); ``limit`` cases per op and one run (under compute-sanitizer)."""
    failures = 0
    rng = np.random.default_rng(0)
    for o in registry.load_all().values():
        n_ok = 0
        for case, args in cases(o, rng)[:limit]:
            try:
                ref = oracle.run(o, **{k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in args.items()})
            except OpError as e:
                print(f"  skip {case}: the oracle rejects it ({e})")
                continue
            try:
                caps = GRID_CAPS[:1] if limit else GRID_CAPS
                runs = [run_under_grid_cap(torch, o.name, args, cap) for cap in caps]
            except Exception as e:  # report every failure, keep going
                print(f"  FAIL {case}: {type(e).__name__}: {e}")
                failures += 1
                continue
            for k, v in ref.items():
                why = close(runs[0][k], v)
                if why:
                    print(f"  FAIL {case}.{k} vs oracle: {why}")
                    failures += 1
                for cap, r in zip(caps[1:], runs[1:], strict=True):
                    if r[k].tobytes() != runs[0][k].tobytes():
                        print(f"  FAIL {case}.{k}: not bitwise identical across runs (grid cap {cap})")
                        failures += 1
            n_ok += 1
        print(f"{o.name}: {n_ok} cases run", flush=True)
        report.setdefault("checked", {})[o.name] = n_ok
    return failures


def check_torch(torch: Any) -> int:
    """Ours vs PyTorch CUDA (same dtype) within the spec's tolerance, relative to max|ref|."""
    from opgen import runtime_cuda

    failures = 0
    g = torch.Generator(device="cuda").manual_seed(0)
    for dt, T in ((torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")):
        V, D = 500, 64
        grad = torch.randn(4, 50, D, device="cuda", generator=g).to(dt)
        idx = torch.randint(0, V, (4, 50), device="cuda", generator=g)
        for scale in (False, True):
            ref = torch.ops.aten.embedding_dense_backward(grad, idx, V, 3, scale).float()
            ours = runtime_cuda.call("embedding_dense_backward", grad=grad, indices=idx, num_weights=V,
                                     padding_idx=3, scale_grad_by_freq=scale,
                                     out=torch.zeros(V, D, device="cuda", dtype=dt))["out"].float()
            err = (ours - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
            ok = err <= SPEC_TOL[T]
            failures += not ok
            print(f"  embedding_dense_backward {T} scale={scale} vs torch: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
        x = torch.randn(33, 1000, device="cuda", generator=g).to(dt).requires_grad_()
        w = torch.randn(1000, device="cuda", generator=g).to(dt).requires_grad_()
        gy = torch.randn(33, 1000, device="cuda", generator=g).to(dt)
        y = torch.nn.functional.rms_norm(x, (1000,), w, eps=1e-6)
        gx, gw = torch.autograd.grad(y, (x, w), gy)
        outs = runtime_cuda.call("rms_norm_backward", grad_y=gy, x=x.detach(), w=w.detach(), eps=1e-6,
                                 grad_x=torch.zeros_like(gy), grad_w=torch.zeros_like(w))
        for k, r in (("grad_x", gx), ("grad_w", gw)):
            err = (outs[k].float() - r.float()).abs().max().item() / max(r.float().abs().max().item(), 1e-30)
            tol = SPEC_TOL[T] * (4 if k == "grad_w" else 1)  # torch's own same-dtype error is of that order
            ok = err <= tol
            failures += not ok
            print(f"  rms_norm_backward.{k} {T} vs torch autograd: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return failures + check_torch_ops(torch, g)


def check_torch_ops(torch: Any, g: Any) -> int:
    """opgen.torch on CUDA tensors (torch.ops.opgen.* dispatching to the CUDA library on the
    current stream): the drop-ins' gradients against PyTorch's own, f32 and bf16."""
    import opgen.torch as otorch

    failures = 0
    F = torch.nn.functional
    for dt, T in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        x = torch.randn(6, 40, 128, device="cuda", generator=g).to(dt).requires_grad_()
        w = torch.randn(128, device="cuda", generator=g).to(dt).requires_grad_()
        h = (torch.randn(64, 128, device="cuda", generator=g) * 0.5).to(dt).requires_grad_()
        W = (torch.randn(512, 128, device="cuda", generator=g) * 0.1).to(dt).requires_grad_()
        t = torch.randint(0, 512, (64,), device="cuda", generator=g)
        t[::7] = -100
        got = torch.autograd.grad(otorch.rms_norm(x, w, 1e-6).sum() + otorch.fused_linear_cross_entropy(h, W, t),
                                  (x, w, h, W))
        want = torch.autograd.grad(F.rms_norm(x.float(), (128,), w.float(), 1e-6).sum()
                                   + F.cross_entropy(h.float() @ W.float().T, t), (x, w, h, W))
        for name, a, b in zip(("rms x", "rms w", "flce hidden", "flce weight"), got, want, strict=True):
            err = (a.float() - b.float()).abs().max().item() / max(b.float().abs().max().item(), 1e-30)
            ok = err <= SPEC_TOL[T] * 4
            failures += not ok
            print(f"  opgen.torch {name} grad {T} on CUDA vs torch: rel err {err:.2e} {'ok' if ok else 'FAIL'}")
    return failures


def check_paths(torch: Any) -> int:
    """Aligned (16-byte vectors), odd-offset (element by element) and strided (general-stride
    flavour) inputs give bitwise identical results (tests/test_cuda_emulated.py does the same on
    the CPU model)."""
    from opgen import runtime_cuda

    def odd(t: Any) -> Any:
        buf = torch.zeros(t.numel() + 1, device="cuda", dtype=t.dtype)
        v = buf[1:].view(t.shape)
        v.copy_(t)
        return v

    def every_other(t: Any) -> Any:
        buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], device="cuda", dtype=t.dtype)
        buf[..., ::2] = t
        return buf[..., ::2]

    failures = 0
    g = torch.Generator(device="cuda").manual_seed(1)
    for dt in (torch.float32, torch.bfloat16):
        N, D = 37, 1000
        rms = {"grad_y": torch.randn(N, D, device="cuda", generator=g).to(dt),
               "x": torch.randn(N, D, device="cuda", generator=g).to(dt),
               "w": torch.randn(D, device="cuda", generator=g).to(dt), "eps": 1e-6}
        emb = {"grad": torch.randn(8, 50, D, device="cuda", generator=g).to(dt),
               "indices": torch.randint(0, 40, (8, 50), device="cuda", generator=g), "num_weights": 40,
               "padding_idx": 3, "scale_grad_by_freq": True}
        for op, args, moved, strided in (("rms_norm_backward", rms, ("grad_y", "x", "w"), ("w",)),
                                         ("embedding_dense_backward", emb, ("grad",), ("grad",))):
            runs = [runtime_cuda.call(op, **args),
                    runtime_cuda.call(op, **{**args, **{k: odd(args[k]) for k in moved}}),
                    runtime_cuda.call(op, **{**args, **{k: every_other(args[k]) for k in strided}})]
            for k in runs[0]:
                same = all(torch.equal(r[k].contiguous().view(torch.uint8), runs[0][k].contiguous().view(torch.uint8))
                           for r in runs[1:])
                failures += not same
                print(f"  {op}.{k} {dt}: aligned / odd offset / strided bitwise identical: "
                      f"{'ok' if same else 'FAIL'}")
    return failures


def edge_cases(rng: np.random.Generator) -> list[tuple[str, str, dict[str, Any]]]:
    """The CPU suite's edge cases (tests/cpu_cases.py builders): empty dims, heavy duplicates,
    the sparse segment layout (rows > 64 N + 4096 on the GPU), rows wider than the shared-memory scratch
    limit, minimum vocabulary, both FLCE modes."""
    from tests import cpu_cases as cc

    eb, edb, ebw, rms = "embedding_backward", "embedding_dense_backward", "embedding_bw", "rms_norm_backward"
    out: list[tuple[str, str, dict[str, Any]]] = [
        ("eb N=0", eb, cc.eb_args(rng, "f32", "i32", N=0)),
        ("eb D=0", eb, cc.eb_args(rng, "bf16", "u8", D=0)),
        ("eb duplicates", eb, cc.eb_args(rng, "f32", "i64", N=4000, D=64, N1=50, N2=3)),
        ("eb D=9000", eb, cc.eb_args(rng, "f32", "i32", N=50, D=9000)),
        ("edb N=0", edb, cc.edb_args(rng, "f16", "i64", lead=(0,))),
        ("edb B*0", edb, cc.edb_args(rng, "f32", "i8", lead=(3, 0))),
        ("edb D=0", edb, cc.edb_args(rng, "bf16", "i64", D=0)),
        ("edb V=0 N=0", edb, cc.edb_args(rng, "f32", "i32", lead=(0,), V=0)),
        ("edb duplicates", edb, cc.edb_args(rng, "bf16", "i64", lead=(40, 100), D=64, V=50, padding_idx=7)),
        ("edb sparse rows", edb, cc.edb_args(rng, "f32", "i64", lead=(2, 5), D=16, V=100000, padding_idx=-1)),
        ("edb D=9000", edb, cc.edb_args(rng, "f32", "i32", lead=(4, 5), D=9000, V=7)),
        ("edb rank 4", edb, cc.edb_args(rng, "f32", "i64", lead=(1, 6, 1, 2), D=5)),
        ("ebw N=0", ebw, cc.ebw_args(rng, "u32", "f32", "f32", N=0)),
        ("ebw D=0", ebw, cc.ebw_args(rng, "i32", "bf16", "bf16", D=0)),
        ("ebw duplicates", ebw, cc.ebw_args(rng, "u32", "f32", "bf16", N=4000, D=64, V=50)),
        ("rms N=0", rms, cc.rms_args(rng, "f32", (0, 40))),
        ("rms 1x1", rms, cc.rms_args(rng, "bf16", (1, 1))),
        ("rms D=10000 f32", rms, cc.rms_args(rng, "f32", (3, 10000))),
        ("rms D=10000 bf16", rms, cc.rms_args(rng, "bf16", (3, 10000))),
        ("rms rank 3", rms, cc.rms_args(rng, "f16", (2, 3, 257))),
    ]
    for mode in ("softmax", "memory_saving"):
        out += [(f"flce BT=0 {mode}", FLCE, cc.flce_args(rng, "bf16", "u8", "i32", mode, BT=0)),
                (f"flce H=0 {mode}", FLCE, cc.flce_args(rng, "bf16", "u8", "i32", mode, H=0)),
                (f"flce BT=1 V=128 {mode}", FLCE, cc.flce_args(rng, "f16", "bool", "i64", mode, BT=1, V=128)),
                (f"flce 200x64x600 {mode}", FLCE, cc.flce_args(rng, "bf16", "u8", "i64", mode, BT=200, H=64, V=600))]
    return out


def check_edges(torch: Any) -> int:
    """Edge cases vs the oracle (tests/cpu_cases.py's tolerance), bitwise equal under a grid cap."""
    from tests import cpu_cases as cc

    failures = 0
    known = registry.load_all()
    for label, name, args in edge_cases(np.random.default_rng(2)):
        if name not in known:  # (another ops directory: $OPGEN_OPS_DIR)
            continue
        try:
            ref = cc.oracle_outputs(name, args)
            runs = [run_under_grid_cap(torch, name, args, cap) for cap in (None, 3)]
            for k, v in ref.items():
                cc.assert_c_close(runs[0][k], v, f"{name}.{k}")
                assert runs[1][k].tobytes() == runs[0][k].tobytes(), f"{k}: differs under a grid cap of 3"
            print(f"  edge {label}: ok")
        except Exception as e:  # report every failure, keep going
            failures += 1
            print(f"  FAIL edge {label}: {type(e).__name__}: {str(e)[:300]}")
    return failures


def check_oob(torch: Any) -> int:
    """An index out of range: nothing written, status recorded on the device."""
    from opgen import runtime_cuda

    runtime_cuda.device_status(clear=True)
    out = torch.full((11, 9), 7.0, device="cuda")
    idx = torch.tensor([[1, 2, 3], [4, 11, 0]], device="cuda")
    runtime_cuda.call("embedding_dense_backward", grad=torch.randn(2, 3, 9, device="cuda"), indices=idx,
                      num_weights=11, padding_idx=-1, scale_grad_by_freq=False, out=out)
    st = runtime_cuda.device_status(clear=True)
    untouched = bool((out == 7.0).all().item())
    ok = st == 6 and untouched
    print(f"  index out of range: device status {st} (want 6), output untouched: {untouched} -> "
          f"{'ok' if ok else 'FAIL'}")
    return int(not ok)


# ----------------------------------------------------------------------------- timing
def timed(torch: Any, fns: dict[str, Callable[[], object]], reps: int, inner: int = 1) -> dict[str, float]:
    """Median ms per call of each function, alternating between them: CUDA events around
    ``inner`` back-to-back calls (so a short kernel is not timed with its launch gap)."""
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, f in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                f()
            b.record()
            b.synchronize()
            times[k].append(a.elapsed_time(b) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


PROFILE = False  # --profile: each timed row also prints its kernels' device times


def ours(name: str, **args: Any) -> Callable[[], object]:
    """Our call with its arguments bound once (runtime_cuda.prepare): the timing sees the C
    entry point (binder, launches), not the Python binding."""
    from opgen import runtime_cuda

    launch, _ = runtime_cuda.prepare(name, **args)
    return launch


def profile(torch: Any, label: str, fn: Callable[[], object]) -> None:
    """Print the device time of each kernel one call of ``fn`` launches (torch.profiler, CUPTI)."""
    if not PROFILE:
        return
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(f"  profile of {label}:")
    for line in prof.key_averages().table(sort_by="cuda_time_total", row_limit=12).splitlines():
        print("    " + line[:200])


def copy_bandwidth(torch: Any) -> float:
    """Device-to-device copy bandwidth (GB/s, bytes read + written) of a 1 GiB buffer, measured
    in this run: the memory-bound rows' ceiling."""
    src = torch.randn(2**28, device="cuda")
    dst = torch.empty_like(src)
    t = timed(torch, {"copy": lambda: dst.copy_(src)}, 20)["copy"]
    return 2 * 2**30 / (t / 1e3) / 1e9


def peak_mb(torch: Any, fn: Callable[[], object], held: int = 0) -> float:
    """Peak device memory (MiB) one call needs: the growth of PyTorch's allocator peak over what
    was allocated before it (outputs it allocates included), plus ``held`` bytes of buffers it
    uses that were allocated up front."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    r = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del r
    return (peak + held) / 2**20


EMBEDDING_SIZES = [(V, N, D) for V in (32000, 128256) for N in (8192, 16384) for D in (1024, 4096)]


def bench_embedding(torch: Any, llm: bool, quick: bool) -> list[dict]:
    rows = []
    sizes = [(8000, 2048, 1024)] if quick else EMBEDDING_SIZES if llm else [(32000, 8192, 1024)]
    for V, N, D in sizes:
        for dt in (torch.float32, torch.bfloat16):
            grad = torch.randn(N, D, device="cuda", dtype=dt)
            idx = torch.randint(0, V, (N,), device="cuda")
            out = torch.empty(V, D, device="cuda", dtype=dt)
            for scale in (False, True):
                args = dict(grad=grad, indices=idx, num_weights=V, padding_idx=-1, scale_grad_by_freq=scale, out=out)
                ws = _workspace(torch, "embedding_dense_backward", **args)
                mine = ours("embedding_dense_backward", workspace=ws, **args)
                profile(torch, f"embedding V={V} N={N} D={D} {dt} scale={scale}", mine)
                t = timed(torch, {
                    "ours": mine,
                    "torch": lambda: torch.ops.aten.embedding_dense_backward(grad, idx, V, -1, scale)}, 10, 3)
                nbytes = grad.numel() * grad.element_size() + N * 8 + V * D * grad.element_size()
                rows.append({"row": f"embedding_dense_backward V={V} N={N} D={D} {str(dt)[6:]} scale={scale}",
                             "ours_ms": t["ours"], "theirs": {"torch": t["torch"]}, "bytes": nbytes})
                print(rows[-1], flush=True)
    return rows


RMS_SIZES = [(8192, 4096), (16384, 4096), (4096, 8192), (32768, 4096), (8192, 5120)]


def bench_rms(torch: Any, llm: bool, quick: bool) -> list[dict]:
    rows = []
    sizes = [(2048, 4096)] if quick else RMS_SIZES if llm else RMS_SIZES[:1]
    fused = getattr(torch.ops.aten, "_fused_rms_norm_backward", None)
    for N, D in sizes:
        for dt in (torch.float32, torch.bfloat16):
            x = torch.randn(N, D, device="cuda", dtype=dt).requires_grad_()
            w = torch.randn(D, device="cuda", dtype=dt).requires_grad_()
            gy = torch.randn(N, D, device="cuda", dtype=dt)
            y = torch.nn.functional.rms_norm(x, (D,), w, eps=1e-6)
            gx, gw = torch.empty_like(gy), torch.empty_like(w)
            xd, wd = x.detach(), w.detach()
            args = dict(grad_y=gy, x=xd, w=wd, eps=1e-6, grad_x=gx, grad_w=gw)
            ws = _workspace(torch, "rms_norm_backward", **args)
            fns = {"ours": ours("rms_norm_backward", workspace=ws, **args),
                   "autograd": lambda: torch.autograd.grad(y, (x, w), gy, retain_graph=True)}
            profile(torch, f"rms {N}x{D} {dt}", fns["ours"])
            if fused is not None:
                try:
                    _, rstd = torch.ops.aten._fused_rms_norm(xd, [D], wd, 1e-6)
                    fns["fused"] = lambda: fused(gy, xd, [D], rstd, wd, [True, True])
                    fns["fused"]()
                except Exception as e:  # its signature varies across versions
                    print(f"  (torch.ops.aten._fused_rms_norm_backward not usable: {e})")
                    fns.pop("fused", None)
            t = timed(torch, fns, 10, 3)
            nbytes = 3 * N * D * x.element_size() + 2 * D * x.element_size()
            rows.append({"row": f"rms_norm_backward {N}x{D} {str(dt)[6:]}", "ours_ms": t.pop("ours"),
                         "theirs": t, "bytes": nbytes})
            print(rows[-1], flush=True)
    return rows


def bench_flce(torch: Any, llm: bool, quick: bool) -> list[dict]:
    rows = []
    sizes = [(256, 512, 8000)] if quick else [(1024, 1024, 32000)]
    if llm:
        sizes.append((8192, 4096, 128256))
    for BT, H, V in sizes:
        X = (torch.randn(BT, H, device="cuda") * 0.05).bfloat16()
        W = (torch.randn(V, H, device="cuda") * 0.05).bfloat16()
        lmax, se = torch.empty(BT, device="cuda"), torch.empty(BT, device="cuda")
        for i in range(0, BT, 1024):
            logits = (X[i:i + 1024] @ W.T).float()
            lmax[i:i + 1024] = logits.max(1).values
            se[i:i + 1024] = torch.exp(logits - lmax[i:i + 1024, None]).sum(1)
            del logits
        t = torch.randint(0, V, (BT,), device="cuda")
        m = torch.rand(BT, device="cuda") < 0.2
        grad = torch.rand(BT, device="cuda")
        mask = _packbits(torch, m)
        dX, dW = torch.empty_like(X), torch.empty_like(W)
        args = dict(grad=grad, input=X, weight=W, target_mask=mask, masked_target=t.int(), logits_max=lmax,
                    sum_exp_logits=se, input_grad=dX, weight_grad=dW)
        ws = _workspace(torch, FLCE, **args)

        def composite() -> object:
            G = torch.exp((X @ W.T).float() - lmax[:, None]) / se[:, None]
            G[torch.arange(BT, device="cuda"), t] -= (~m).float()
            G *= grad[:, None]
            Gb = G.to(X.dtype)
            return Gb @ W, Gb.T @ X

        fns: dict[str, Callable[[], object]] = {"ours": ours(FLCE, workspace=ws, **args)}
        profile(torch, f"FLCE BT={BT} H={H} V={V}", fns["ours"])
        if BT * V <= 2**28:  # the composite materialises BT x V f32 logits several times
            fns["composite"] = composite
        try:
            from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

            # both leaves require grad, so Liger computes grad_weight too (it skips it otherwise)
            Xl, Wl = X.clone().requires_grad_(), W.clone().requires_grad_()

            def liger() -> object:
                return LigerFusedLinearCrossEntropyFunction.apply(Xl, Wl, t)

            fns["liger(fwd+grads)"] = liger
        except Exception as e:  # optional contender
            print(f"  (Liger-Kernel not usable: {type(e).__name__}: {e})")
        reps = 3 if BT * V > 10**8 else 5
        tm = timed(torch, fns, reps)
        # ours works in buffers allocated up front (workspace, both gradients): counted as held
        held = sum(x.numel() * x.element_size() for x in (ws, dX, dW) if x is not None)
        mem = {k: peak_mb(torch, f, held if k == "ours" else 0) for k, f in fns.items()}
        rows.append({"row": f"FLCE grad memory-saving BT={BT} H={H} V={V} bf16", "ours_ms": tm.pop("ours"),
                     "theirs": tm, "flops": 8 * BT * H * V, "ours_mb": mem.pop("ours"), "theirs_mb": mem})
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def _packbits(torch: Any, m: Any) -> Any:
    pad = (-m.numel()) % 8
    bits = torch.cat([m, torch.zeros(pad, dtype=torch.bool, device=m.device)]).view(-1, 8).to(torch.uint8)
    return (bits << torch.arange(8, device=m.device, dtype=torch.uint8)).sum(1).to(torch.uint8)


def _workspace(torch: Any, name: str, **args: Any) -> Any:
    """A device workspace of the size the library asks for (so timings exclude cudaMallocAsync)."""
    from opgen import runtime_cuda

    return torch.empty(max(runtime_cuda.workspace_size(name, **args), 1), dtype=torch.uint8, device="cuda")


# ----------------------------------------------------------------------------- sanitizer
def sanitizer(report: dict) -> int:
    tool = shutil.which("compute-sanitizer")
    if not tool:
        print("compute-sanitizer not found: skipped")
        return 0
    failures = 0
    for check in ("memcheck", "racecheck", "synccheck", "initcheck"):
        cmd = [tool, "--tool", check, "--error-exitcode", "99", sys.executable, __file__, "--skip-build",
               "--rows", "check,edges", "--small"]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        ok = r.returncode == 0
        failures += not ok
        print(f"compute-sanitizer {check}: {'ok' if ok else 'FAIL'} ({time.perf_counter() - t0:.0f}s)")
        if not ok:
            print((r.stdout + r.stderr)[-4000:])
        report.setdefault("sanitizer", {})[check] = ok
    return failures


# ----------------------------------------------------------------------------- main
def table(rows: list[dict], copy_gbps: float | None) -> None:
    print()
    if copy_gbps:
        print(f"device-to-device copy: {copy_gbps:.0f} GB/s (bytes read + written)")
    print("| case | opgen ms | contender ms | ratio (contender / opgen) | notes |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        for who, ms in r["theirs"].items():
            note = ""
            if "bytes" in r:
                gbps = r["bytes"] / (r["ours_ms"] / 1e3) / 1e9
                note = f"{gbps:.0f} GB/s" + (f" ({100 * gbps / copy_gbps:.0f}% of copy)" if copy_gbps else "")
            if "flops" in r:
                note = f"{r['flops'] / (r['ours_ms'] / 1e3) / 1e12:.1f} TFLOP/s"
            if "ours_mb" in r and who in r["theirs_mb"]:
                note += f"; peak {r['ours_mb']:.0f} MiB vs {r['theirs_mb'][who]:.0f} MiB"
            print(f"| {r['row']} | {r['ours_ms']:.3f} | {who} {ms:.3f} | {ms / r['ours_ms']:.2f}x | {note} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller benchmark sizes")
    ap.add_argument("--llm", action="store_true", help="also the LLM sizes (V=128256, H=4096, BT=8192)")
    ap.add_argument("--skip-build", action="store_true", help="reuse build/cuda/libopgen_cuda.so")
    ap.add_argument("--rows", default="check,edges,paths,oob,torch,embedding,rms,flce",
                    help="what to run (check includes determinism)")
    ap.add_argument("--sanitizer", action="store_true", help="compute-sanitizer memcheck + racecheck")
    ap.add_argument("--small", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true", help="print each timed row's kernels (torch.profiler)")
    ap.add_argument("--out", help="write the results as JSON here")
    a = ap.parse_args()
    torch = need_gpu()
    global PROFILE
    PROFILE = a.profile
    build_library(a.skip_build)
    wanted = a.rows.split(",")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__} (CUDA {torch.version.cuda})", flush=True)
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    failures = 0
    if "check" in wanted:
        failures += check_all(torch, report, 2 if a.small else None)
    if "edges" in wanted:
        failures += check_edges(torch)
    if "paths" in wanted:
        failures += check_paths(torch)
    if "oob" in wanted:
        failures += check_oob(torch)
    if "torch" in wanted and not a.small:
        failures += check_torch(torch)
    if a.small:
        sys.exit(1 if failures else 0)
    rows: list[dict] = []
    copy_gbps = copy_bandwidth(torch) if {"embedding", "rms"} & set(wanted) else None
    report["copy_gbps"] = copy_gbps
    if "embedding" in wanted:
        rows += bench_embedding(torch, a.llm, a.quick)
    if "rms" in wanted:
        rows += bench_rms(torch, a.llm, a.quick)
    if "flce" in wanted:
        rows += bench_flce(torch, a.llm, a.quick)
    if a.sanitizer:
        failures += sanitizer(report)
    table(rows, copy_gbps)
    report["rows"] = rows
    report["failures"] = failures
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))
    print(f"\n{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
