"""The CUDA target without a GPU: the generator's structure for every op, and (where nvcc is
installed) every generated .cu compiled with nvcc for sm_80 and sm_90 with all warnings as errors
(``opgen.compile.NVCC_FLAGS``), linked into libopgen_cuda.so exporting exactly the plain ABI.

The sources are generated fresh from ops_dsl/ (so a stale generated/ cannot hide a failure) into
build/cuda/test-src/ and compiled in parallel into the object cache that ``opgen build --cuda``
uses: unchanged sources are not recompiled. Running them on a GPU is benchmarks/gpu.py's job.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opgen import build, registry
from opgen import compile as cc
from opgen.emit import cuda

NVCC = cc.nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (set NVCC or install the CUDA "
                                                      "toolkit): the CUDA compile checks are skipped")
OUT = registry.REPO_ROOT / "build" / "cuda"


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    """Every generated file as the compiler makes it now, by path relative to generated/."""
    return build.generated_files()


def _cu(sources: dict[str, str]) -> dict[str, str]:
    return {p: t for p, t in sources.items() if p.startswith("cuda/")}


def test_every_op_has_a_cuda_source(sources: dict[str, str]) -> None:
    names = set(registry.load_all())
    got = {Path(p).stem for p in _cu(sources) if p.endswith(".cu")}
    assert names <= got, f"ops without a CUDA source: {sorted(names - got)}"
    header = sources["include/opgen_cuda.h"]
    for n in names:
        for fn in (f"opgen_cuda_{n}(", f"opgen_cuda_{n}_workspace_size("):
            assert fn in header, f"opgen_cuda.h does not declare {fn}"
            assert fn in sources[f"cuda/{n}.cu"], f"cuda/{n}.cu does not define {fn}"


def test_no_float_atomics_and_every_kernel_stops_after_a_failed_check(sources: dict[str, str]) -> None:
    """Determinism by construction: only integer atomics (counts), and every kernel of a call
    returns at once when an earlier device-side check failed (so nothing is written)."""
    for path, text in _cu(sources).items():
        for m in re.finditer(r"atomicAdd\(\(([^*]+) \*\)", text):
            assert m.group(1) in ("int", "unsigned int", "unsigned long long"), f"{path}: {m.group(0)}"
        assert "atomicAdd((float" not in text and "atomicAdd((double" not in text, path
        if path.endswith("opgen_cuda_rt.cu"):
            continue
        head = r"__global__ void __launch_bounds__\(OPGEN_CUDA_THREADS\) (\w+)\(const opgen_cuda_args_t a\) \{\n(.*)\n"
        for m in re.finditer(head, text):
            assert m.group(2).strip().startswith("if (*a.err) return;"), f"{path}: {m.group(1)}"


def test_threads_per_block_is_the_runtime_constant(sources: dict[str, str]) -> None:
    assert f"#define OPGEN_CUDA_THREADS {cuda.THREADS}\n" in sources["cuda/opgen_cuda_rt.cuh"]
    assert f"#define OPGEN_CUDA_MAX_WS {cuda.MAX_WS}\n" in sources["cuda/opgen_cuda_rt.cuh"]


F32_CHAIN = '''\
from opgen.dsl import *

BT, H, V = dims("BT H V")


@op
def f32_linear_grad(x: Tensor[f32, BT, H], w: Tensor[f32, V, H], *, gx: Output[f32, BT, H],
                    gw: Output[f32, V, H]):
    """A linear-loss-shaped chain on f32 data."""
    g = exp(x @ w.T)
    return {"gx": g @ w, "gw": g.T @ x}
'''


def _tc_calls(text: str) -> dict[str, list[tuple[str, str]]]:
    """The tensor-core GEMM calls (split A?, split B?) of each kernel in a source."""
    out = {}
    for part in re.split(r"(?=static __global__)", text)[1:]:
        name = re.search(r"\) (\w+)\(const opgen_cuda_args_t", part).group(1)  # type: ignore[union-attr]
        out[name] = re.findall(r"opgen_block_gemm_tc<(true|false), (true|false)>", part)
    return out


def test_tensor_core_operands_are_split_unless_exact_in_tf32(sources: dict[str, str], op_files) -> None:
    """Tiles loaded from bf16/f16 memory are exact in TF32 and multiplied once; computed f32
    tiles (the FLCE gradient G) and f32 data are split into hi + lo (f32-level accuracy)."""
    calls = _tc_calls(sources["cuda/fused_linear_cross_entropy_loss_grad.cu"])
    calls = {name: got for name, got in calls.items() if got}  # (the masked_target check has no GEMM)
    assert len(calls) >= 2 * 8, sorted(calls)  # the row and column pass of each instance
    for name, got in calls.items():
        # memory-saving kernels: logits X_i W_j^T (exact x exact), then G W_j or G^T X_i
        want = [("false", "false"), ("true", "false")] if "softmax" not in name else [("true", "false")]
        assert got == want, name
    f32 = op_files({"f32_linear_grad.py": F32_CHAIN})["f32_linear_grad"]
    calls = _tc_calls(cuda.op_source(f32))
    assert calls and all(got == [("true", "true")] * 2 for got in calls.values()), calls


def test_exact_operands_pass_decides_the_splits(op_files) -> None:
    """The split is decided by a pass (exact-operands), not by the printer: every tensor-core
    matmul of the CUDA pipeline carries ``exact`` per operand, the FLCE logits' X and W (copies
    of the T inputs) as ``T`` and the gradient G as unknown, the f32 chain's copies of f32 data
    as ``f32`` (not exact in TF32: split), and the printer's calls follow those properties."""
    from opgen import registry
    from opgen.lower import sched as s
    from opgen.passes import pipeline

    for name, files in (("fused_linear_cross_entropy_loss_grad", None), ("f32_linear_grad", F32_CHAIN)):
        o = registry.load_all(str(registry.REPO_ROOT / "ops_dsl"))[name] if files is None \
            else op_files({"f32_linear_grad.py": files})[name]
        m = o.module()
        pipeline.run(m, "cuda")
        mms = [x for x in m.walk() if isinstance(x, s.BufferMatmulOp)]
        assert mms and all(x.exact is not None for x in mms)
        got = sorted({tuple(e.data for e in x.exact.data) for x in mms})
        if files is None:
            assert ("T", "T") in got and ("", "T") in got, got
        else:
            assert all(e in ("f32", "") for pair in got for e in pair), got


def _write(sources: dict[str, str]) -> tuple[Path, Path]:
    """The CUDA sources and headers under build/cuda/test-src/ (only changed files rewritten)."""
    root = OUT / "test-src"
    for p, text in sources.items():
        if not (p.startswith("cuda/") or p.startswith("include/")):
            continue
        dst = root / p
        if not dst.is_file() or dst.read_text() != text:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
    return root / "cuda", root / "include"


@pytest.fixture(scope="module")
def compiled(sources: dict[str, str]) -> dict[str, str | Path]:
    """Compile every .cu (in parallel): object path, or the compiler's error text."""
    if NVCC is None:
        pytest.skip("nvcc not found (set NVCC or install the CUDA toolkit): the CUDA compile checks are skipped")
    src, inc = _write(sources)
    files = sorted(src.glob("*.cu"))

    def one(f: Path) -> tuple[str, str | Path]:
        try:
            ((obj, _),) = cc.compile_cuda_objects(src, inc, OUT / "obj", sources=[f], verbose=False)
            return f.name, obj
        except cc.CompileError as e:
            return f.name, str(e)

    with ThreadPoolExecutor(max_workers=cc.nvcc_jobs()) as ex:
        return dict(ex.map(one, files))


CU_FILES = ["opgen_cuda_rt.cu", *[f"{n}.cu" for n in registry.load_all()]]


@needs_nvcc
@pytest.mark.parametrize("name", CU_FILES)
def test_nvcc_compiles_for_sm80_and_sm90_without_warnings(compiled: dict[str, str | Path], name: str) -> None:
    assert name in compiled, f"{name} was not generated"
    res = compiled[name]
    assert isinstance(res, Path), f"nvcc rejected {name}:\n{res}"


@pytest.fixture(scope="module")
def library(compiled: dict[str, str | Path]) -> Path:
    """libopgen_cuda.so linked from the objects (into build/cuda/test-lib/)."""
    bad = {k: v for k, v in compiled.items() if not isinstance(v, Path)}
    if bad:
        pytest.fail(f"not compiled: {sorted(bad)}")
    lib = OUT / "test-lib" / "libopgen_cuda.so"
    lib.parent.mkdir(parents=True, exist_ok=True)
    cc.link_cuda_library([Path(p) for p in compiled.values()], lib)
    return lib


@needs_nvcc
def test_library_links_and_exports_only_the_plain_abi(library: Path) -> None:
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found: exported symbols not checked")
    syms = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    exported = {ln.split()[-1] for ln in syms.stdout.splitlines() if ln.strip()}
    names = registry.load_all()
    want = {f"opgen_cuda_{n}" for n in names} | {f"opgen_cuda_{n}_workspace_size" for n in names}
    want |= {"opgen_cuda_last_error", "opgen_cuda_status_string", "opgen_cuda_device_status"}
    assert want <= exported, f"missing: {sorted(want - exported)}"
    extra = {s for s in exported if not s.startswith("opgen_cuda_") and not s.startswith("_")}
    assert not extra, f"the library exports more than the plain ABI: {sorted(extra)[:20]}"


def _sizing_call(lib: ctypes.CDLL, fn: str, o: object, args: dict) -> tuple[int, int]:
    """(status, bytes) of ``fn`` (a *_workspace_size entry point) on numpy arrays: no data is
    touched, so host memory serves for both libraries."""
    from opgen.runtime import describe, marshal

    cargs, _, _keep = marshal(o.signature, args, lambda _, v: (v, *describe(v)))  # type: ignore[attr-defined]
    size = ctypes.c_size_t(0)
    st = getattr(lib, fn)(*cargs, ctypes.byref(size))
    return int(st), int(size.value)


@needs_nvcc
@pytest.mark.parametrize("name", sorted(registry.load_all()))
def test_host_binder_validates_like_the_cpu_library(library: Path, name: str) -> None:
    """The CUDA library's binder is the CPU runtime's (one template): sizing calls (which run
    the validation and the entry's scalar checks, and launch nothing — no GPU needed) return
    the same status as the CPU library for a valid call and for broken variants of it."""
    import numpy as np

    from opgen import runtime
    from opgen.cli import random_inputs
    from opgen.dsl.spec import TensorSpec

    cpu_path = runtime.library_path()
    if not cpu_path.exists():
        pytest.skip(f"{cpu_path} not built")
    cpu_lib, cuda_lib = ctypes.CDLL(str(cpu_path)), ctypes.CDLL(str(library))
    cuda_lib.opgen_cuda_last_error.restype = ctypes.c_char_p
    o = registry.get(name)
    present = next(iter(o.variants))
    base = random_inputs(o, dict.fromkeys(o.signature.dims(), 130), {}, 0, present)  # 130: V >= 128 rules
    tensors = [p for p in o.signature.params if isinstance(p.spec, TensorSpec) and p.name in base]
    calls = {"valid": base}
    for p in tensors[:3]:
        calls[f"{p.name} as f64 ravel"] = {**base, p.name: np.asarray(base[p.name], np.float64).ravel()}
        calls[f"{p.name} as i8"] = {**base, p.name: np.asarray(base[p.name]).astype(np.int8)}
    for what, args in calls.items():
        st_cpu, _ = _sizing_call(cpu_lib, f"opgen_{name}_workspace_size", o, args)
        st_cuda, size = _sizing_call(cuda_lib, f"opgen_cuda_{name}_workspace_size", o, args)
        assert st_cuda == st_cpu, (f"{name} ({what}): CUDA status {st_cuda} "
                                   f"({cuda_lib.opgen_cuda_last_error().decode()}) vs CPU {st_cpu}")
        if what == "valid":
            assert st_cpu == 0, f"{name}: the valid call was rejected"
            assert size > 0, f"{name}: the CUDA workspace holds at least the status word"
