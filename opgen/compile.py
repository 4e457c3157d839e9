"""Compiling ``generated/cpu`` into ``build/cpu/libopgen.so`` (incremental, parallel)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

WARN = ["-Wall", "-Wextra", "-Werror"]
CFLAGS = ["-std=c11", "-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-fPIC", "-fno-math-errno", *WARN]
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", "-O1", "-g"]


class CompileError(RuntimeError):
    """The C compiler rejected a generated file."""


def compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise CompileError("no C compiler found (set CC or install gcc)")
    return cc


def _flags(sanitize: bool) -> list[str]:
    if not sanitize:
        return CFLAGS
    return [f for f in CFLAGS if f not in ("-O3", "-march=native")] + SANITIZE


def build_library(src_dir: Path, include_dir: Path, out_dir: Path, sanitize: bool = False,
                  verbose: bool = True) -> Path:
    """Compile every ``*.c`` in ``src_dir`` (skipping unchanged ones) and link the library."""
    cc = compiler()
    flags = _flags(sanitize)
    obj_dir = out_dir / ("obj-asan" if sanitize else "obj")
    obj_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / ("libopgen_asan.so" if sanitize else "libopgen.so")
    sources = sorted(src_dir.glob("*.c"))
    headers = b"".join(p.read_bytes() for p in sorted([*src_dir.glob("*.h"), *include_dir.glob("*.h")]))

    def one(src: Path) -> tuple[Path, bool]:
        key = hashlib.sha256(src.read_bytes() + headers + " ".join([cc, *flags]).encode()).hexdigest()[:16]
        obj = obj_dir / f"{src.stem}.{key}.o"
        if obj.exists():
            return obj, False
        for old in obj_dir.glob(f"{src.stem}.*.o"):
            old.unlink()
        cmd = [cc, *flags, f"-I{include_dir}", f"-I{src_dir}", "-c", str(src), "-o", str(obj) + ".tmp"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")
        os.replace(str(obj) + ".tmp", obj)
        return obj, True

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        results = list(ex.map(one, sources))
    objs = [o for o, _ in results]
    rebuilt = [o for o, fresh in results if fresh]
    if verbose:
        for o in rebuilt:
            print(f"  [    cc] {o.name.split('.')[0]}.c", flush=True)
    if rebuilt or not lib.exists():
        cmd = [cc, "-shared", "-fopenmp", *(SANITIZE if sanitize else []), "-o", str(lib) + ".tmp",
               *map(str, objs), "-lm"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise CompileError(f"{' '.join(cmd)}\n{r.stderr[-4000:]}")
        os.replace(str(lib) + ".tmp", lib)
        if verbose:
            print(f"  [  link] {lib}", flush=True)
    return lib
