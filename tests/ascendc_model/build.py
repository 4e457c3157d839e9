"""Build Ascend C kernel and host sources against opgen's CPU model (g++, C++17) into a shared library.

``build(sources, out_dir)`` writes ``sources`` (file name -> text; ``.cpp``/``.cc`` files are compiled,
``.h``/``.hpp`` files are only made includable) under ``out_dir/src``, finds every
``extern "C" __global__ ... void k(params)`` kernel in them and generates what CANN's toolchain would:

* ``out_dir/gen/include/aclrtlaunch_k.h`` declaring
  ``extern "C" uint32_t aclrtlaunch_k(uint32_t numBlocks, aclrtStream stream, void *gm_arg, ..., scalars...)``
  (``ACLRT_LAUNCH_KERNEL(k)(numBlocks, stream, args...)`` expands to that call), and
* ``out_dir/gen/src/aclrtlaunch_<source>.cpp`` defining it: the launch runs ``k`` on ``numBlocks``
  block-threads of the model — or, for a kernel whose body declares
  ``KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)``, on ``2 * numBlocks`` AIV blocks (MIX launch:
  ``numBlocks`` counts groups of 1 AIC + 2 AIV).

Then it compiles every source, the stubs and the model's runtime (each object cached by content, flags
and headers, as tests/cuda_emu/emu_build.py does) and links ``out_dir/<lib_name>``. Kernel and host
code see ``tests/ascendc_model`` (``kernel_operator.h``, ``tiling/platform/platform_ascendc.h``,
``ascendc_model_host.h``), the generated headers, ``out_dir/src`` and ``include_dirs``.

The library's ``aclrtlaunch_<k>`` functions can also be called directly (ctypes): GM arguments are
pointers, the stream is ignored (NULL is fine), the result is 0. A rule violation aborts the process,
so run kernels in a subprocess.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from opgen.compile import CompileError, compile_cached, scratch_name

HERE = Path(__file__).resolve().parent
RUNTIME = HERE / "ascendc_model_runtime.cpp"
# -Werror=narrowing: bisheng (clang) rejects narrowing in list-initialisation, e.g.
# DataCopyExtParams{rows, n * sizeof(T), 0, 0, 0} with a runtime size_t; g++ would only warn.
FLAGS = ["-std=c++17", "-O1", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall",
         "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Werror=narrowing"]
COMPILED = (".cpp", ".cc", ".cxx")


class ModelBuildError(RuntimeError):
    pass


def cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


@dataclass(frozen=True)
class Param:
    type: str  # as written in the kernel
    name: str

    @property
    def is_gm(self) -> bool:
        return any(q in self.type for q in ("GM_ADDR", "__gm__", "__opgen_gm__"))

    @property
    def launch_type(self) -> str:
        """The type in ``aclrtlaunch_k``: GM pointers become ``void *`` (as CANN's stubs do)."""
        return "void *" if self.is_gm else self.type


@dataclass(frozen=True)
class Kernel:
    name: str
    params: tuple[Param, ...]
    mix: bool = False  # KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2) in its body: 1 AIC + 2 AIV per block


_KERNEL = re.compile(r'extern\s+"C"\s+__(?:opgen_)?global__\s+((?:__\w+__(?:\s*\([^)]*\))?\s+)*)void\s+(\w+)'
                     r'\s*\(([^)]*)\)\s*\{')


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


# the macro as written, or as kernel_operator.h expands it when build.py scans (OPGEN_ASCENDC_MODEL_SCAN)
_MIX = re.compile(r"\b(?:KERNEL_TASK_TYPE_DEFAULT|__opgen_task_type__)\s*\(\s*(?:\w+\s*::\s*)*"
                  r"KERNEL_TYPE_MIX_AIC_1_2\s*\)")


def _body(text: str, open_brace: int) -> str:
    """The text from ``text[open_brace] == '{'`` to its matching ``}`` (string literals skipped)."""
    depth, i, n = 0, open_brace, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace:i + 1]
        i += 1
    return text[open_brace:]


def find_kernels(text: str) -> list[Kernel]:
    """The ``extern "C" __global__`` kernel definitions in a source (or in its preprocessed text,
    see ``scan``), in order. A kernel whose own body contains
    ``KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)`` is a MIX kernel (``Kernel.mix``)."""
    out = []
    text = _strip_comments(text)
    for m in _KERNEL.finditer(text):
        params = []
        for i, p in enumerate(x.strip() for x in m.group(3).split(",")):
            if not p or p == "void":
                continue
            pm = re.fullmatch(r"(.*?)\s*\b(\w+)", p, flags=re.S)
            if not pm or not pm.group(1).strip():
                raise ModelBuildError(f"kernel {m.group(2)}: cannot parse parameter {i}: {p!r}")
            params.append(Param(" ".join(pm.group(1).replace("__opgen_gm__", "__gm__").split()), pm.group(2)))
        out.append(Kernel(m.group(2), tuple(params), bool(_MIX.search(_body(text, m.end() - 1)))))
    return out


def _launch_params(k: Kernel) -> tuple[str, str, str]:
    """(numBlocks name, stream name, the parameter list of aclrtlaunch_k); CANN renames its two
    leading parameters to _numBlocks/_stream when the kernel has parameters of those names."""
    names = {p.name for p in k.params}
    nb = "_numBlocks" if "numBlocks" in names else "numBlocks"
    st = "_stream" if "stream" in names else "stream"
    return nb, st, ", ".join([f"uint32_t {nb}", f"aclrtStream {st}", *(f"{p.launch_type} {p.name}" for p in k.params)])


def _launch_header(k: Kernel) -> str:
    params = _launch_params(k)[2]
    guard = f"HEADER_ACLRTLAUNCH_{k.name.upper()}_H"
    return (f"/* generated by tests/ascendc_model/build.py (what CANN generates for kernel {k.name}) */\n"
            f"#ifndef {guard}\n#define {guard}\n"
            f"#if defined(__has_include)\n#if __has_include(\"acl/acl_base.h\")\n"
            f"#include \"acl/acl_base.h\" /* as CANN's generated header does, when available */\n#endif\n#endif\n"
            f"#include \"ascendc_model_host.h\"\n\n"
            f"#ifdef __cplusplus\nextern \"C\" {{\n#endif\n"
            f"uint32_t aclrtlaunch_{k.name}({params});\n"
            f"#ifdef __cplusplus\n}}\n#endif\n#endif\n")


def _launch_stub(kernels: list[Kernel]) -> str:
    out = ["/* generated by tests/ascendc_model/build.py: launch stubs of the model */",
           '#include "kernel_operator.h"', '#include "ascendc_model_host.h"', ""]
    for k in kernels:
        decl = ", ".join(f"{p.type} {p.name}" for p in k.params)
        fields = "".join(f"    {p.launch_type} {p.name};\n" for p in k.params)
        call = ", ".join(f"({p.type})a->{p.name}" if p.is_gm else f"a->{p.name}" for p in k.params)
        nb, st, launch_params = _launch_params(k)
        init = ", ".join(p.name for p in k.params)
        out += [f'extern "C" __global__ __aicore__ void {k.name}({decl});',
                f"namespace {{\nstruct opgen_args_{k.name} {{\n{fields}    char unused_;\n}};",
                f"void opgen_run_{k.name}(void *p) {{\n    auto *a = static_cast<opgen_args_{k.name} *>(p);\n"
                f"    (void)a;\n    {k.name}({call});\n}}\n}}  // namespace",
                f'extern "C" uint32_t aclrtlaunch_{k.name}({launch_params}) {{',
                f"    opgen_args_{k.name} opgen_launch_args_{{{init + ', ' if init else ''}0}};",
                f"    return ascend_model::launch({nb}, {st}, opgen_run_{k.name}, &opgen_launch_args_, "
                f'"{k.name}"{", true" if k.mix else ""});\n}}', ""]
    return "\n".join(out)


def scan(tool: str, flags: list[str], includes: list[str], src: Path, cache_dir: Path,
         headers: bytes) -> list[Kernel]:
    """The kernels of ``src`` after preprocessing (so that kernels written by macros count too),
    cached by content like the objects."""
    text = src.read_text()
    if "__global__" not in text:
        return []
    key = hashlib.sha256(text.encode() + headers + " ".join([tool, *flags, *includes]).encode()).hexdigest()[:16]
    cached = cache_dir / f"{src.stem}.{key}.json"
    if cached.is_file():
        return [Kernel(k["name"], tuple(Param(**p) for p in k["params"]), k.get("mix", False))
                for k in json.loads(cached.read_text())]
    cmd = [tool, *flags, *includes, "-DOPGEN_ASCENDC_MODEL_SCAN", "-E", "-P", str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ModelBuildError(f"{' '.join(cmd)}\n{r.stderr[-6000:]}")
    kernels = find_kernels(r.stdout)
    for old in cache_dir.glob(f"{src.stem}.*.json"):
        old.unlink()
    cached.write_text(json.dumps([{"name": k.name, "params": [{"type": p.type, "name": p.name} for p in k.params],
                                   "mix": k.mix} for k in kernels]))
    return kernels


def _write(path: Path, text: str) -> None:
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def build(sources: Mapping[str, str], out_dir: Path, *, include_dirs: Iterable[Path] = (),
          extra_flags: Iterable[str] = (), lib_name: str = "libopgen_ascendc_model.so") -> Path:
    """Compile ``sources`` (name -> text) against the model and link ``out_dir/lib_name``; returns its
    path. Under ``out_dir``'s lock (parallel test workers share build/)."""
    from opgen.compile import dir_lock

    with dir_lock(Path(out_dir)):
        return _build(sources, Path(out_dir), include_dirs, extra_flags, lib_name)


def _build(sources: Mapping[str, str], out_dir: Path, include_dirs: Iterable[Path], extra_flags: Iterable[str],
           lib_name: str) -> Path:
    tool = cxx()
    if tool is None:
        raise ModelBuildError("no C++ compiler (g++) found")
    out_dir = Path(out_dir)
    src_dir, gen_inc, gen_src = out_dir / "src", out_dir / "gen" / "include", out_dir / "gen" / "src"
    sources_in: list[Path] = []
    seen: dict[str, str] = {}
    for name, text in sources.items():
        dst = src_dir / Path(name).name
        if dst.name in seen:
            raise ModelBuildError(f"two sources named {dst.name}: {seen[dst.name]} and {name}")
        seen[dst.name] = name
        _write(dst, text)
        if dst.suffix in COMPILED:
            sources_in.append(dst)
    gen_inc.mkdir(parents=True, exist_ok=True)
    (out_dir / "scan").mkdir(parents=True, exist_ok=True)
    flags = [*FLAGS, *extra_flags]
    includes = [f"-I{HERE}", f"-I{gen_inc}", f"-I{src_dir}", *(f"-I{Path(d)}" for d in include_dirs)]

    def header_bytes(with_generated: bool) -> bytes:
        files = [*HERE.rglob("*.h"), *(p for p in src_dir.glob("*") if p.suffix in (".h", ".hpp")),
                 *(p for d in include_dirs for p in Path(d).rglob("*.h"))]
        return b"".join(p.read_bytes() for p in sorted([*files, *(gen_inc.glob("*.h") if with_generated else [])]))

    # kernels first (preprocessed without the generated headers, which only host code includes)
    base = header_bytes(False)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        found = list(ex.map(lambda s: scan(tool, flags, includes, s, out_dir / "scan", base), sources_in))
    compiled: list[Path] = [RUNTIME, *sources_in]
    for src, kernels in zip(sources_in, found, strict=True):
        for k in kernels:
            _write(gen_inc / f"aclrtlaunch_{k.name}.h", _launch_header(k))
        if kernels:
            stub = gen_src / f"aclrtlaunch_{src.stem}.cpp"
            _write(stub, _launch_stub(kernels))
            compiled.append(stub)
    headers = header_bytes(True)
    obj_dir = out_dir / "obj"
    obj_dir.mkdir(parents=True, exist_ok=True)

    def one(src: Path) -> Path:
        try:
            return compile_cached(tool, tool, flags, includes, src, obj_dir, headers)[0]
        except CompileError as e:
            raise ModelBuildError(str(e)) from e

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        objs = list(ex.map(one, compiled))
    lib = out_dir / lib_name
    stamp = hashlib.sha256(b"".join(o.name.encode() for o in objs)).hexdigest()
    stamp_file = lib.with_suffix(".stamp")
    if not lib.exists() or not stamp_file.exists() or stamp_file.read_text() != stamp:
        tmp = scratch_name(lib)
        cmd = [tool, "-shared", "-pthread", "-o", tmp, *map(str, objs)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise ModelBuildError(f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-4000:]}")
        os.replace(tmp, lib)
        stamp_file.write_text(stamp)
    return lib
