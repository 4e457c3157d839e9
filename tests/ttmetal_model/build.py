"""Build a TT-Metal host program against opgen's CPU model of TT-Metal (g++, C++20) into an executable.

``build_host(sources, out_dir)`` writes ``sources`` (file name -> text; ``.cpp`` files without
``kernel_main`` are compiled and linked, the rest — kernels, headers — are only written) under ``out_dir/src`` and links
``out_dir/<exe_name>``. The host code includes ``tt-metalium/host_api.hpp`` (the model's
``tt::tt_metal`` subset plus ``ttmodel::dram_alloc/dram_ptr/run``). Its ``CreateKernel(program, path,
...)`` compiles each kernel source at run time, as tt-metal's JIT does: one shared object per (source,
role, CT args, defines, fp32_dest_acc_en), cached under ``out_dir/kernels`` (override with
``OPGEN_TT_KERNEL_CACHE``) by a key over the source, the flags and the model's headers. Kernels see the
model's ``api/dataflow/dataflow_api.h`` and ``api/compute/*.h`` at the vendor include paths.

Kernels and host programs are compiled with ``-include`` of the model's standard headers
precompiled (``model_std.h``, ``host_std.h``; :func:`precompiled`): parsing them was about half of
a kernel's compile time.

A rule violation aborts the process (``ttmetal-model: rule N (name): ...``), so run programs in a
subprocess. The executable itself is cached by a hash of its sources, the flags and the model headers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAGS = ["-std=c++20", "-O1", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall",
         "-Wno-unused-variable", "-Wno-unused-but-set-variable"]
#: how CreateKernel compiles a kernel (passed to the host program; the kernels' precompiled header is
#: built with the same flags, as g++ requires), and links it
KERNEL_FLAGS = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-fvisibility=hidden", "-ffp-contract=off",
                "-fno-strict-aliasing", "-Wall", "-Wno-unused-variable", "-Wno-unused-but-set-variable",
                "-DOPGEN_TT_KERNEL"]
KERNEL_LINK = ["-shared", "-Wl,-Bsymbolic"]
#: where the precompiled standard headers live (one directory per compiler, flags and model headers)
PCH_ROOT = HERE.parents[1] / "build" / "ttmetal-model-pch"


class ModelBuildError(RuntimeError):
    pass


def cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def model_hash() -> str:
    """A hash of every model header: kernels compiled against older headers are rebuilt."""
    h = hashlib.sha256()
    for p in sorted([*HERE.rglob("*.h"), *HERE.rglob("*.hpp")]):
        h.update(p.relative_to(HERE).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def precompiled(header: str, flags: Iterable[str]) -> str:
    """``HERE/header`` (model_std.h or host_std.h: the standard headers the model includes)
    precompiled by g++ with ``flags``: the path of its copy beside the ``.gch``, to compile with
    ``-include``; "" when g++ cannot precompile it (the headers are then parsed as text, as before).
    Built once under :data:`PCH_ROOT` (a directory per compiler, flags and model headers) and
    renamed into place, so test workers building it at once never read a half-written file."""
    tool = cxx()
    flags = list(flags)
    key = hashlib.sha256("\0".join([str(tool), *flags, model_hash()]).encode()).hexdigest()[:16]
    d = PCH_ROOT / key
    copy, gch = d / header, d / f"{header}.gch"
    if not gch.is_file():
        d.mkdir(parents=True, exist_ok=True)
        for name in ("model_std.h", "host_std.h"):  # (host_std.h includes model_std.h beside it)
            if not (d / name).is_file():  # (renamed into place: another worker may be compiling it)
                part = d / f"{name}.tmp{os.getpid()}"
                part.write_text((HERE / name).read_text())
                os.replace(part, d / name)
        tmp = d / f"{header}.gch.tmp{os.getpid()}"
        r = subprocess.run([str(tool), *flags, "-x", "c++-header", str(copy), "-o", str(tmp)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            tmp.unlink(missing_ok=True)
            return ""
        os.replace(tmp, gch)
    return str(copy)


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def build_host(sources: Mapping[str, str], out_dir: Path, *, exe_name: str = "host",
               extra_flags: Iterable[str] = ()) -> Path:
    """Write ``sources`` under ``out_dir/src``, compile the ``.cpp`` ones with the model and return the executable."""
    tool = cxx()
    if tool is None:
        raise ModelBuildError("no C++ compiler (g++) found")
    out_dir = Path(out_dir).resolve()
    src_dir = out_dir / "src"
    cpps = []
    for name, text in sources.items():
        dst = src_dir / name
        _write(dst, text)
        if dst.suffix in (".cpp", ".cc") and "kernel_main" not in text:
            cpps.append(dst)
    mh = model_hash()
    kernel_flags = " ".join([*KERNEL_FLAGS, *KERNEL_LINK])
    defines = [f'-DOPGEN_TT_MODEL_DIR="{HERE}"', f'-DOPGEN_TT_CXX="{tool}"',
               f'-DOPGEN_TT_KERNEL_CACHE="{out_dir / "kernels"}"', f'-DOPGEN_TT_MODEL_HASH="{mh}"',
               f'-DOPGEN_TT_KERNEL_FLAGS="{kernel_flags}"',
               f'-DOPGEN_TT_KERNEL_PCH="{precompiled("model_std.h", KERNEL_FLAGS)}"']
    host_flags = [*FLAGS, *extra_flags]
    pch = precompiled("host_std.h", host_flags)
    cmd = [tool, *host_flags, *defines, *(["-include", pch] if pch else []), f"-I{HERE}", f"-I{src_dir}",
           *map(str, cpps), "-ldl", "-o"]
    key = hashlib.sha256("\0".join([*cmd, *(p.read_text() for p in cpps)]).encode()).hexdigest()[:16]
    exe = out_dir / exe_name
    stamp = exe.with_suffix(".stamp")
    if exe.is_file() and stamp.is_file() and stamp.read_text() == key:
        return exe
    tmp = exe.with_name(exe.name + f".tmp{os.getpid()}")
    r = subprocess.run([*cmd, str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        raise ModelBuildError(f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-6000:]}")
    os.replace(tmp, exe)
    stamp.write_text(key)
    return exe
