"""Run an op's generated TT-Metal program (generated/ttmetal/<op>/) on the CPU model of TT-Metal
(tests/ttmetal_model) — a test harness, not a product.

``build(op)`` writes the op's generated files plus a small ``main.cpp`` (from its manifest) and
compiles them with the model's host shim (tests/ttmetal_model/build.py); the kernels are compiled
by the model's ``CreateKernel`` at run time. ``run(exe, variant, args, grid)`` converts the numpy
arguments to tile layout (32x32 tiles of four 16x16 faces, padding filled with NaN so that a
kernel that reads padding as data is caught), runs the program in a subprocess (a rule violation
of the model aborts it) and returns every tensor argument back in its logical shape.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from opgen import registry
from opgen.emit import ttmetal
from opgen.ttmetal.lower import op_ident
from tests.ttmetal_model import build as model_build

REPO = Path(__file__).resolve().parent.parent


def _checker() -> Path:
    """shared/tools/tt-kernel-check: ``$OPGEN_TT_KERNEL_CHECK``, else beside the repository
    (``../shared``), else the workplace's ``/work/shared`` (a clone made elsewhere)."""
    env = os.environ.get("OPGEN_TT_KERNEL_CHECK")
    for p in ([Path(env)] if env else []) + [REPO.parent / "shared" / "tools" / "tt-kernel-check",
                                              Path("/work/shared/tools/tt-kernel-check")]:
        if p.is_file():
            return p
    return REPO.parent / "shared" / "tools" / "tt-kernel-check"


#: tt-kernel-check (the real tt-metal 0.81.1 kernel headers); the tests that need it skip without it
CHECKER = _checker()
NP = {"bf16": ml_dtypes.bfloat16, "f32": np.float32, "u8": np.uint8, "bool": np.bool_, "i32": np.int32,
      "i64": np.int64}
#: opgen_tt::IndexType of a numpy index dtype
INDEX_TYPES = {"uint32": 0, "int32": 1, "int64": 2, "int16": 3, "int8": 4, "uint8": 5, "float32": 6, "float16": 7,
               "bfloat16": 8, "float64": 9, "bool": 10}

MAIN = r"""// runner: argv = kernel_dir variant in_dir out_dir grid_x grid_y dims... scalars...
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>
#include "host.hpp"

using namespace tt::tt_metal;

static std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) { std::fprintf(stderr, "runner: cannot read %s\n", path.c_str()); std::exit(2); }
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

int main(int argc, char** argv) {
    if (argc < 7) { std::fprintf(stderr, "runner: usage\n"); return 2; }
    const std::string dir = argv[1], variant = argv[2], in = argv[3], out = argv[4];
    const CoreCoord grid{(std::size_t)std::atoi(argv[5]), (std::size_t)std::atoi(argv[6])};
    auto mesh = distributed::MeshDevice::create_unit_mesh(0);
    auto& cq = mesh->mesh_command_queue();
    std::map<std::string, std::shared_ptr<distributed::MeshBuffer>> bufs;
    auto make = [&](const std::string& name, uint32_t page) {  // (PAGE_<name>: the test's element size)
        const char* alias = std::getenv(("ALIAS_" + name).c_str());  // in place: the same buffer
        if (alias && bufs.count(alias)) return bufs[name] = bufs[alias];
        if (const char* p = std::getenv(("PAGE_" + name).c_str())) page = (uint32_t)std::atoi(p);
        std::vector<uint8_t> data = slurp(in + "/" + name + ".bin");
        if (data.empty()) data.assign(page, 0xff);  // an empty tensor: one page nobody may touch (NaN)
        auto buf = distributed::MeshBuffer::create(
            distributed::ReplicatedBufferConfig{.size = (uint64_t)data.size()},
            distributed::DeviceLocalBufferConfig{.page_size = page, .buffer_type = BufferType::DRAM}, mesh.get());
        distributed::EnqueueWriteMeshBuffer(cq, buf, data, false);
        return bufs[name] = buf;
    };
    int rc = -1;
    int a = 7;
    (void)a;
{cases}
    if (rc < 0) { std::fprintf(stderr, "runner: unknown variant %s\n", variant.c_str()); return 2; }
    distributed::Finish(cq);  // (a refused call: the buffers are read back to show nothing was written)
    std::fprintf(stderr, "model DRAM traffic: read %llu written %llu\n",
                 (unsigned long long)ttmodel::dram().read_bytes, (unsigned long long)ttmodel::dram().written_bytes);
    for (auto& [name, buf] : bufs) {
        std::vector<uint8_t> data;
        distributed::EnqueueReadMeshBuffer(cq, data, buf, true);
        std::ofstream(out + "/" + name + ".bin", std::ios::binary).write((const char*)data.data(), data.size());
    }
    return rc == 0 ? 0 : 3;
}
"""


def manifest(op: str) -> dict:
    return json.loads(sources(op)[f"ttmetal/{op}/manifest.json"])


_SOURCES: dict[str, dict[str, str]] = {}
_OPS: dict[str, Any] = {}


def register(opdef: Any) -> None:
    """Use ``opdef`` (e.g. an op loaded from a test's own ops directory) for its name."""
    _OPS[opdef.name] = opdef
    _SOURCES.pop(opdef.name, None)


def sources(op: str) -> dict[str, str]:
    if op not in _SOURCES:
        _SOURCES[op] = ttmetal.op_sources(_OPS.get(op) or registry.get(op))
    return _SOURCES[op]


def check_headers(ops: Iterable[str], out_dir: Path) -> None:
    """Every kernel of ``ops`` (written under ``out_dir/<op>``) through ``tt-kernel-check
    --werror`` with its manifest's CT args, CB formats and compute config; the same kernel text
    with the same configuration is checked once. Fails naming each kernel and its diagnostics."""
    items = []
    for op in ops:
        src = out_dir / op
        for path, text in sources(op).items():
            f = src / path.removeprefix(f"ttmetal/{op}/")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        for v in manifest(op)["variants"]:
            for ln in v["launches"]:
                fmts = {cb["index"]: cb["format"] for cb in ln["cbs"]}
                items.extend((kern, fmts, src / kern["file"]) for kern in ln["kernels"])
    assert items, f"no kernels in {', '.join(ops)}"
    inst = subprocess.run([str(CHECKER), "--install"], capture_output=True, text=True, timeout=900)
    assert inst.returncode == 0, inst.stdout + inst.stderr

    # one tt-kernel-check run per configuration (role, CT args, CB formats, fp32 DEST) checks up to
    # 8 kernels (each on its own, as the tool does): the tool's start-up and installation check are
    # paid per run, not per kernel
    groups: dict[tuple, dict[str, Path]] = {}  # configuration -> kernel text -> its first file
    for kern, fmts, path in items:
        config = (kern["role"], tuple(kern["ct_args"]), kern["fp32_dest_acc"],
                  tuple(sorted(fmts.items())) if kern["role"] == "compute" else ())
        groups.setdefault(config, {}).setdefault(path.read_text(), path)
    runs = [(config, list(files.values())[i:i + 8]) for config, files in groups.items()
            for i in range(0, len(files), 8)]

    def check(run: tuple[tuple, list[Path]]) -> tuple[list[Path], subprocess.CompletedProcess]:
        (role, ct_args, fp32_dest_acc, fmts), paths = run
        cmd = [str(CHECKER), "--role", role, "--werror"]
        if ct_args:
            cmd += ["--ct-args", ",".join(map(str, ct_args))]
        if role == "compute":
            cmd += ["--cb-format", ",".join(f"{i}={f}" for i, f in fmts)]
            if fp32_dest_acc:
                cmd.append("--fp32-dest-acc")
        return paths, subprocess.run([*cmd, *map(str, paths)], capture_output=True, text=True, timeout=900)

    with ThreadPoolExecutor(max_workers=4) as ex:
        bad = [f"{', '.join(map(str, ps))}:\n{r.stdout}{r.stderr}" for ps, r in ex.map(check, runs)
               if r.returncode != 0 or r.stdout.strip()]
    assert not bad, "\n".join(bad)


def main_cpp(man: dict) -> str:
    cases = []
    for v in man["variants"]:
        args, lines = [], []
        ndims = len(v["dims"])
        for i, d in enumerate(v["dims"]):
            lines.append(f"        const uint32_t d_{d} = (uint32_t)std::strtoul(argv[{7 + i}], nullptr, 10);")
        s = 0
        if v["index_dtype_param"]:
            lines.append('        const auto index_dtype = '
                         '(opgen_tt::IndexType)std::atoi(std::getenv("OPGEN_TT_INDEX_TYPE"));')
            lines.append('        const uint32_t index_page = 32 * opgen_tt::index_size(index_dtype);')
        for a in v["args"]:
            if a["kind"] == "tensor":
                page = a["page_size"] if isinstance(a["page_size"], int) else \
                    "32" if "converted_to" in a else "index_page"  # (PAGE_<name>: the element size)
                lines.append(f'        auto {op_ident("tensor", a["name"])} = make("{a["name"]}", {page});')
                if "converted_to" in a:
                    lines.append(f'        const auto dtype_{a["name"]} = (opgen_tt::IndexType)std::atoi('
                                 f'std::getenv("OPGEN_TT_TYPE_{a["name"]}"));')
            else:
                parse = {"f32": "std::strtof(argv[{i}], nullptr)", "bool": "std::atoi(argv[{i}]) != 0"}.get(
                    a["dtype"], "std::strtoll(argv[{i}], nullptr, 10)")
                ctype = {"f32": "float", "bool": "bool"}.get(a["dtype"], "int64_t")
                name = op_ident("scalar", a["name"])
                lines.append(f'        const {ctype} {name} = {parse.format(i=7 + ndims + s)};')
                s += 1
            args.append(op_ident(a["kind"], a["name"]))
        if v["index_dtype_param"]:
            args.append("index_dtype")
        args += [f'dtype_{a["name"]}' for a in v["args"] if "converted_to" in a]
        call = f'opgen_tt::{v["function"]}(*mesh, dir, grid, {", ".join(args + [f"d_{d}" for d in v["dims"]])})'
        body = "\n".join(lines)
        cases.append(f'    if (variant == "{v["variant"]}") {{\n{body}\n        rc = {call};\n    }}')
    return MAIN.replace("{cases}", "\n".join(cases))


def build(op: str, out_dir: Path) -> Path:
    """The op's runner executable (cached by the model's build)."""
    files = {p.removeprefix(f"ttmetal/{op}/"): t for p, t in sources(op).items()}
    files["main.cpp"] = main_cpp(manifest(op))
    return model_build.build_host(files, out_dir, exe_name=f"run_{op}")


# ---------------------------------------------------------------------------- tile layout
def tilize(a: np.ndarray) -> np.ndarray:
    """A 2-d array in tile layout (tiles row-major, faces row-major in a tile); padding NaN."""
    r, c = a.shape
    R, C = -(-r // 32) * 32, -(-c // 32) * 32
    p = np.full((R, C), np.nan, dtype=a.dtype)
    p[:r, :c] = a
    t = p.reshape(R // 32, 2, 16, C // 32, 2, 16).transpose(0, 3, 1, 4, 2, 5)
    return np.ascontiguousarray(t).reshape(-1)


def untilize(flat: np.ndarray, r: int, c: int) -> np.ndarray:
    R, C = -(-r // 32) * 32, -(-c // 32) * 32
    t = flat.reshape(R // 32, C // 32, 2, 2, 16, 16).transpose(0, 2, 4, 1, 3, 5).reshape(R, C)
    return t[:r, :c]


def to_layout(a: np.ndarray, layout: str) -> np.ndarray:
    """``tile``: :func:`tilize`; ``row``: rows padded (NaN) to a multiple of 32 elements."""
    if layout == "tile":
        return tilize(a)
    r, c = a.shape
    p = np.full((r, -(-c // 32) * 32), 0 if np.issubdtype(a.dtype, np.integer) else np.nan, dtype=a.dtype)
    p[:, :c] = a
    return p.reshape(-1)


def from_layout(flat: np.ndarray, r: int, c: int, layout: str) -> np.ndarray:
    if layout == "tile":
        return untilize(flat, r, c)
    return flat.reshape(r, -(-c // 32) * 32)[:, :c]


def as_2d(shape: tuple[int, ...], rank: int = 2) -> tuple[int, int]:
    """A tensor of ``rank`` dims in the program (leading batch dims flattened) as 2-d: [..., D]
    as [prod(...), D]; a 1-d one as [1, prod(shape)] (one row)."""
    if rank == 1:
        return 1, int(np.prod(shape))
    return int(np.prod(shape[:-1])), shape[-1]


def _default(op: str, name: str) -> Any:
    """The DSL default of a scalar parameter the test leaves out."""
    o = _OPS.get(op) or registry.get(op)
    return next(p.spec.default for p in o.signature.params if p.name == name)


def _scalar(x: Any, dtype: str) -> str:
    return repr(float(x)) if dtype == "f32" else str(int(bool(x)) if dtype == "bool" else int(x))


def variant(op: str, args: dict[str, Any]) -> dict:
    """The manifest entry of ``op``'s variant whose tensors and dtypes match ``args`` (its first
    schedule; the host function tries the others after it)."""
    given = {k for k, x in args.items() if isinstance(x, np.ndarray)}
    for v in manifest(op)["variants"]:
        names = {a["name"] for a in v["args"] if a["kind"] == "tensor"}
        typed = [a for a in v["args"] if a["kind"] == "tensor" and a["dtype"] in NP]
        if names == given and all(NP[a["dtype"]] == args[a["name"]].dtype for a in typed):
            return v
    raise KeyError(f"no TT-Metal variant of {op} for these dtypes")


def model_traffic(proc: subprocess.CompletedProcess) -> tuple[int, int]:
    """(DRAM bytes read, written) by the kernels of a run, as the model counted them."""
    m = re.search(r"model DRAM traffic: read (\d+) written (\d+)", proc.stderr)
    assert m, proc.stderr[-2000:]
    return int(m.group(1)), int(m.group(2))


def run(exe: Path, op: str, args: dict[str, Any], tmp: Path, grid: tuple[int, int] = (8, 8),
        alias: dict[str, str] | None = None, env: dict[str, str] | None = None,
        ) -> tuple[subprocess.CompletedProcess, dict[str, np.ndarray]]:
    """Run the variant of ``op`` whose dtypes match ``args`` on a ``grid`` of model cores."""
    v = variant(op, args)
    in_dir, out_dir = tmp / "in", tmp / "out"
    in_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    dims: dict[str, int] = {}
    for a in v["args"]:
        if a["kind"] != "tensor":
            continue
        x = args[a["name"]]
        r, c = as_2d(x.shape, len(a["shape"]))
        for sym, n in zip(a["shape"][-2:] if len(a["shape"]) > 1 else a["shape"], (r, c)[-len(a["shape"]):],
                          strict=True):
            dims[sym] = n
        to_layout(x.reshape(r, c), a["layout"]).tofile(in_dir / f"{a['name']}.bin")
    argv = [str(exe), str(exe.parent / "src"), v["variant"], str(in_dir), str(out_dir), str(grid[0]), str(grid[1]),
            *(str(dims[d]) for d in v["dims"]),
            *(_scalar(args[a["name"]] if a["name"] in args else _default(op, a["name"]), a["dtype"])
              for a in v["args"] if a["kind"] == "scalar")]
    e = dict(os.environ, **(env or {}), **{f"ALIAS_{k}": w for k, w in (alias or {}).items()})
    for a in v["args"]:
        if a["kind"] == "tensor" and a["dtype"].startswith("index"):
            e["OPGEN_TT_INDEX_TYPE"] = str(INDEX_TYPES[args[a["name"]].dtype.name])
        if "converted_to" in a:  # any IndexType, converted by the host
            e[f"OPGEN_TT_TYPE_{a['name']}"] = str(INDEX_TYPES[args[a["name"]].dtype.name])
        if a["kind"] == "tensor" and a["dtype"].startswith("any"):  # pages of the data's element size
            e[f"PAGE_{a['name']}"] = str((1024 if a["layout"] == "tile" else 32) * args[a["name"]].dtype.itemsize)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=e)
    outs = {}
    if p.returncode in (0, 3):  # 3: the host function refused (the buffers as they are)
        for a in v["args"]:
            if a["kind"] == "tensor":
                x = args[a["name"]]
                r, c = as_2d(x.shape, len(a["shape"]))
                flat = np.fromfile(out_dir / f"{a['name']}.bin", dtype=x.dtype)
                outs[a["name"]] = from_layout(flat, r, c, a["layout"]).reshape(x.shape) if x.size else \
                    np.empty(x.shape, x.dtype)
    return p, outs
