"""Compiling ``generated/cpu`` into ``build/cpu/libopgen.so`` and ``generated/cuda`` into
``build/cuda/libopgen_cuda.so`` (both incremental, parallel)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WARN = ["-Wall", "-Wextra", "-Werror"]
#: -ffp-contract=off: every product is rounded before it is added, as in the oracle (a contracted
#: a*b+c keeps an overflowing product finite: inf where the oracle has NaN); the GEMM micro-kernel
#: asks for its fused multiply-adds explicitly (fmaf). -mprefer-vector-width=512: GCC keeps to
#: 256-bit vectors on AVX-512 machines by default; 512 bits make the bf16 elementwise kernels
#: 1.2-1.4x faster (docs/performance.md) and change no result (no reassociation either way).
#: -fno-trapping-math: the branch-free vector math (opgen_expf, opgen_erff, ...) ends in a select
#: (NaN in, NaN out) whose other side is arithmetic; with trapping math GCC may not compute that
#: side for every lane, so without AVX-512's masked operations (AVX2 machines) none of those loops
#: vectorised (GELU backward 0.15x PyTorch on a Zen 3). The code never reads the FP exception
#: flags, and no value changes: no reassociation, contraction or finite-math assumption
CFLAGS = ["-std=c11", "-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-trapping-math",
          "-fopenmp", "-fPIC", "-fno-math-errno", *WARN]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1", "-g"]


class CompileError(RuntimeError):
    """The C compiler rejected a generated file."""


@functools.cache
def tool_version(tool: str) -> str:
    """``tool --version`` (part of an object's cache key where the compiler's path is not enough)."""
    r = subprocess.run([tool, "--version"], capture_output=True, text=True)
    return r.stdout.strip() or tool


@functools.cache
def native_target(tool: str) -> str:
    """What ``-march=native`` means to ``tool`` on this machine (its resolved target options): part
    of a shared object's key, so that a cache on a file system two machines share never hands an
    object with one CPU's instructions to another CPU."""
    r = subprocess.run([tool, "-march=native", "-Q", "--help=target"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else "unknown native target"


def object_cache() -> Path | None:
    """``$OPGEN_OBJECT_CACHE``: a directory of compiled objects shared by every build that sets
    it (unset or empty: none). Objects there are keyed by the preprocessed source, so libraries of
    different ops still share their runtime's objects (and any op file they have in common). The
    directory is never pruned: delete it at will."""
    d = os.environ.get("OPGEN_OBJECT_CACHE", "").strip()
    return Path(d) if d else None


def _shared_object(tool: str, key_tool: str, flags: list[str], includes: list[str], src: Path) -> Path | None:
    """Where ``src`` compiled with ``flags`` lives in :func:`object_cache`: keyed by its name, the
    compiler's identity, the flags (with what ``-march=native`` means here) and its preprocessed
    text (``-E -P``: every header it includes, no file paths), which is all the object depends on.
    None without a cache, for debug builds (``-g`` objects name their source's path) and where
    preprocessing fails (the compile reports it)."""
    cache = object_cache()
    if cache is None or "-g" in flags:
        return None
    r = subprocess.run([tool, *flags, *includes, "-E", "-P", str(src)], capture_output=True)
    if r.returncode != 0:
        return None
    native = native_target(tool) if "-march=native" in flags else ""
    key = hashlib.sha256(r.stdout + "\0".join([src.name, key_tool, tool_version(tool), native, *flags]).encode())
    return cache / f"{src.stem}.{key.hexdigest()[:24]}.o"


def _place(src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` through a scratch name (readers never see half a file)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = scratch_name(dst)
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def compile_cached(tool: str, key_tool: str, flags: list[str], includes: list[str], src: Path, obj_dir: Path,
                   headers: bytes, share: bool = False) -> tuple[Path, bool]:
    """Compile ``src`` to ``obj_dir/<stem>.<key>.o`` unless that object exists; the key hashes the
    source, ``headers``, ``key_tool`` (the compiler's identity) and ``flags``. With ``share`` (a
    compiler that takes gcc's ``-E -P``), an object of the same preprocessed source in
    :func:`object_cache` is copied instead of compiling, and a compiled one is stored there.
    Returns (object, freshly built or copied); older objects of the same source are removed."""
    key = hashlib.sha256(src.read_bytes() + headers + " ".join([key_tool, *flags]).encode()).hexdigest()[:16]
    obj = obj_dir / f"{src.stem}.{key}.o"
    if obj.exists():
        return obj, False
    shared = _shared_object(tool, key_tool, flags, includes, src) if share else None
    tmp = scratch_name(obj)
    if shared is not None and shared.is_file():
        shutil.copyfile(shared, tmp)
    else:
        cmd = [tool, *flags, *includes, "-c", str(src), "-o", tmp]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-6000:]}")
        if shared is not None:
            _place(Path(tmp), shared)
    for old in obj_dir.glob(f"{src.stem}.*.o"):
        old.unlink(missing_ok=True)  # (another build of this directory may have removed it first)
    os.replace(tmp, obj)
    return obj, True


def scratch_name(out: Path) -> str:
    """Where a compiler writes ``out`` before it is renamed into place: a name of this process and
    thread, so that two builds of one directory at once (test workers, two ``opgen build`` runs)
    never write, or rename away, each other's half-written file."""
    return f"{out}.{os.getpid()}-{threading.get_ident()}.tmp"


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise CompileError("no C compiler found (set CC or install gcc)")
    return cc


def _flags(sanitize: bool) -> list[str]:
    if not sanitize:
        return CFLAGS
    return [f for f in CFLAGS if f not in ("-O3", "-march=native")] + SANITIZE


@contextlib.contextmanager
def dir_lock(out_dir: Path) -> Iterator[None]:
    """An exclusive lock on ``out_dir`` (a ``.lock`` file in it): builds into one directory from
    several processes (two ``opgen build`` runs, parallel test workers) take turns."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_library(src_dir: Path, include_dir: Path, out_dir: Path, sanitize: bool = False,
                  verbose: bool = True) -> Path:
    """Compile every ``*.c`` in ``src_dir`` (skipping unchanged ones) and link the library (under
    ``out_dir``'s lock)."""
    with dir_lock(out_dir):
        return _build_library(src_dir, include_dir, out_dir, sanitize, verbose)


def _build_library(src_dir: Path, include_dir: Path, out_dir: Path, sanitize: bool, verbose: bool) -> Path:
    cc = compiler()
    flags = _flags(sanitize)
    obj_dir = out_dir / ("obj-asan" if sanitize else "obj")
    obj_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / ("libopgen_asan.so" if sanitize else "libopgen.so")
    sources = sorted(src_dir.glob("*.c"))
    headers = b"".join(p.read_bytes() for p in sorted([*src_dir.glob("*.h"), *include_dir.rglob("*.h")]))

    def one(src: Path) -> tuple[Path, bool]:
        return compile_cached(cc, cc, flags, [f"-I{include_dir}", f"-I{src_dir}"], src, obj_dir, headers, share=True)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        results = list(ex.map(one, sources))
    objs = [o for o, _ in results]
    rebuilt = [o for o, fresh in results if fresh]
    if verbose:
        for o in rebuilt:
            print(f"  [    cc] {o.name.split('.')[0]}.c", flush=True)
    if rebuilt or not lib.exists():
        tmp = scratch_name(lib)
        cmd = [cc, "-shared", "-fopenmp", *(SANITIZE if sanitize else []), "-o", tmp, *map(str, objs), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")
        os.replace(tmp, lib)
        if verbose:
            print(f"  [  link] {lib}", flush=True)
    return lib


# ---------------------------------------------------------------------- CUDA (nvcc)
#: every generated .cu must compile with these flags (all nvcc warnings are errors)
GENCODE = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]
#: --fmad=false: no contraction of a*b+c (as -ffp-contract=off on the CPU: the oracle's NaN/Inf on
#: overflow); tensor-core GEMMs are unaffected
NVCC_FLAGS = ["-O3", "-std=c++17", "--fmad=false", "-Xcompiler", "-fPIC", "-Werror", "all-warnings", *GENCODE]
#: library-only: export nothing but the OPGEN_API entry points (the static CUDA runtime stays
#: inside), and bind the library's own calls to its own definitions
NVCC_LIB_FLAGS = ["-Xcompiler", "-fvisibility=hidden"]
NVCC_LINK = ["-shared", "-Xlinker", "--exclude-libs,ALL", "-Xlinker", "-Bsymbolic"]


def nvcc() -> str | None:
    """The nvcc to use ($NVCC — empty means none —, then PATH, then /usr/local/cuda/bin), or None."""
    if "NVCC" in os.environ:
        return os.environ["NVCC"] or None
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def nvcc_jobs() -> int:
    return int(os.environ.get("OPGEN_NVCC_JOBS", "0")) or (os.cpu_count() or 2)


def compile_cuda_objects(src_dir: Path, include_dir: Path, obj_dir: Path, sources: list[Path] | None = None,
                         verbose: bool = True) -> list[tuple[Path, bool]]:
    """Compile ``*.cu`` files of ``src_dir`` to objects in ``obj_dir`` (in parallel, skipping
    those whose source, headers and flags are unchanged). Returns (object, freshly built)."""
    tool = nvcc()
    if not tool:
        raise CompileError("nvcc not found (set NVCC or put nvcc on PATH)")
    flags = [*NVCC_FLAGS, *NVCC_LIB_FLAGS]
    obj_dir.mkdir(parents=True, exist_ok=True)
    srcs = sorted(src_dir.glob("*.cu")) if sources is None else sources
    headers = b"".join(p.read_bytes() for p in sorted([*src_dir.glob("*.cuh"), *src_dir.glob("*.h"),
                                                       *include_dir.glob("*.h")]))

    def one(src: Path) -> tuple[Path, bool]:
        t0 = time.perf_counter()
        obj, fresh = compile_cached(tool, tool_version(tool), flags, [f"-I{src_dir}", f"-I{include_dir}"], src,
                                    obj_dir, headers)
        if fresh and verbose:
            print(f"  [  nvcc] {src.name} ({time.perf_counter() - t0:.0f}s)", flush=True)
        return obj, fresh

    with ThreadPoolExecutor(max_workers=nvcc_jobs()) as ex:
        return list(ex.map(one, srcs))


def build_cuda_library(src_dir: Path, include_dir: Path, out_dir: Path, verbose: bool = True) -> Path:
    """Compile every ``*.cu`` in ``src_dir`` with nvcc (sm_80 + sm_90, warnings are errors) and
    link ``out_dir/libopgen_cuda.so``."""
    results = compile_cuda_objects(src_dir, include_dir, out_dir / "obj", verbose=verbose)
    lib = out_dir / "libopgen_cuda.so"
    # an object newer than the library: compiled just now, or by another build sharing obj/ (the tests')
    if not lib.exists() or any(o.stat().st_mtime > lib.stat().st_mtime for o, _ in results):
        link_cuda_library([o for o, _ in results], lib)
        if verbose:
            print(f"  [  link] {lib}", flush=True)
    return lib


def link_cuda_library(objs: list[Path], lib: Path) -> None:
    """Link nvcc objects into the shared library ``lib`` (exporting only the plain ABI)."""
    tmp = scratch_name(lib)
    cmd = [str(nvcc()), *NVCC_LINK, *GENCODE, "-o", tmp, *map(str, objs)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise CompileError(f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-4000:]}")
    os.replace(tmp, lib)
