"""Build the generated CUDA sources against the CPU model in cuda_emu.h (g++, C++20).

``build(sources, out_dir, tsan=False)`` rewrites every ``kernel<<<grid, block, shmem, stream>>>(args)``
into ``opgen_emu_launch(grid, block, shmem, [&] { kernel(args); })``, compiles each file (cached by
content) and links ``libopgen_cuda_emu.so`` (or ``libopgen_cuda_emu_tsan.so``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from opgen.compile import CompileError, compile_cached, scratch_name

HERE = Path(__file__).resolve().parent
FLAGS = ["-std=c++20", "-O1", "-fPIC", "-pthread", "-w", "-fno-strict-aliasing"]
TSAN = ["-fsanitize=thread", "-g"]


class EmuBuildError(RuntimeError):
    pass


def cxx() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def rewrite_launches(src: str) -> str:
    """``k<<<g, b, s, st>>>(args)`` -> ``opgen_emu_launch(g, b, s, [&] { k(args); })``."""
    out: list[str] = []
    i = 0
    while True:
        j = src.find("<<<", i)
        if j < 0:
            out.append(src[i:])
            return "".join(out)
        k = j
        while k > 0 and (src[k - 1].isalnum() or src[k - 1] == "_"):
            k -= 1
        name = src[k:j]
        e = src.index(">>>", j)
        cfg = _split_top(src[j + 3:e])
        if src[e + 3] != "(":
            raise EmuBuildError(f"unexpected launch syntax near {src[k:e + 20]!r}")
        depth, p = 0, e + 3
        while True:
            if src[p] == "(":
                depth += 1
            elif src[p] == ")":
                depth -= 1
                if depth == 0:
                    break
            p += 1
        args = src[e + 4:p]
        out.append(src[i:k])
        shmem = cfg[2] if len(cfg) > 2 else "0"
        out.append(f"opgen_emu_launch((unsigned)({cfg[0]}), (unsigned)({cfg[1]}), (size_t)({shmem}), "
                   f"[&] {{ {name}({args}); }})")
        i = p + 1


def build(sources: dict[str, str], out_dir: Path, tsan: bool = False) -> Path:
    """``sources``: generated files by path relative to generated/ (cuda/*, include/*)."""
    tool = cxx()
    if tool is None:
        raise EmuBuildError("no C++ compiler (g++) found")
    src_dir = out_dir / "src"
    inc_dir = out_dir / "include"
    for p, text in sources.items():
        if p.startswith("include/") and p.endswith(".h"):
            dst = inc_dir / Path(p).name
        elif p.startswith("cuda/"):
            name = Path(p).name
            dst = src_dir / (name[:-3] + ".cpp" if name.endswith(".cu") else name)
            text = rewrite_launches(text) if name.endswith(".cu") else text
        else:
            continue
        if not dst.is_file() or dst.read_text() != text:
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(text)
    flags = [*FLAGS, *(TSAN if tsan else [])]
    obj_dir = out_dir / ("obj-tsan" if tsan else "obj")
    obj_dir.mkdir(parents=True, exist_ok=True)
    headers = b"".join(f.read_bytes() for f in sorted([*src_dir.glob("*.cuh"), *inc_dir.glob("*.h"),
                                                       *HERE.rglob("*.h"), *HERE.rglob("*.cuh")]))

    def one(f: Path) -> Path:
        try:
            return compile_cached(tool, tool, flags, [f"-I{HERE}", f"-I{src_dir}", f"-I{inc_dir}"], f, obj_dir,
                                  headers)[0]
        except CompileError as e:
            raise EmuBuildError(str(e)) from e

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
        objs = list(ex.map(one, sorted(src_dir.glob("*.cpp"))))
    lib = out_dir / ("libopgen_cuda_emu_tsan.so" if tsan else "libopgen_cuda_emu.so")
    stamp = hashlib.sha256(b"".join(o.name.encode() for o in objs)).hexdigest()
    stamp_file = lib.with_suffix(".stamp")
    if not lib.exists() or not stamp_file.exists() or stamp_file.read_text() != stamp:
        tmp = scratch_name(lib)
        cmd = [tool, "-shared", "-pthread", *(TSAN if tsan else []), "-o", tmp, *map(str, objs)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise EmuBuildError(f"{' '.join(cmd)}\n{(r.stdout + r.stderr)[-4000:]}")
        os.replace(tmp, lib)
        stamp_file.write_text(stamp)
    return lib
