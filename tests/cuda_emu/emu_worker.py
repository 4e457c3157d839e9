"""Run generated CUDA kernels on the CPU model (cuda_emu.h) against the numpy oracle.

Used in-process by tests/test_cuda_emulated.py and as a subprocess under ThreadSanitizer:

    LD_PRELOAD=libtsan.so python tests/cuda_emu/emu_worker.py LIB OP[,OP...] [--all | --limit N]

The inputs are benchmarks/gpu.py's (every dtype binding x variant of each op); the tolerance is
its ``close`` (the CPU tests' rule). Each case runs twice: results must be bitwise identical
(thread timing differs between runs, so this also checks timing independence).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from opgen import oracle, registry, runtime  # noqa: E402


def bench() -> Any:
    """benchmarks/gpu.py as a module (its case builders and tolerance; it imports no torch)."""
    if "opgen_bench_gpu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("opgen_bench_gpu", REPO / "benchmarks" / "gpu.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["opgen_bench_gpu"] = mod
        spec.loader.exec_module(mod)
    return sys.modules["opgen_bench_gpu"]


class _AsPlainAbi:
    """Presents libopgen_cuda_emu.so's ``opgen_cuda_<op>(..., stream)`` as the plain ABI's
    ``opgen_<op>(...)`` so that ``opgen.runtime.call`` can drive it (host memory is device
    memory in the model; the stream is NULL)."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        lib.opgen_cuda_last_error.restype = ctypes.c_char_p

    def __getattr__(self, name: str) -> Any:
        if name == "opgen_last_error":
            return self.lib.opgen_cuda_last_error
        fn = getattr(self.lib, "opgen_cuda_" + name.removeprefix("opgen_"))
        return lambda *a: fn(*a, None)


def load(path: str | Path) -> _AsPlainAbi:
    return _AsPlainAbi(ctypes.CDLL(str(path)))


def _copy(args: dict[str, Any]) -> dict[str, Any]:
    return {k: (np.array(v) if isinstance(v, np.ndarray) else v) for k, v in args.items()}


def sample(cases: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """A few cases covering every dtype-variable member and every variant at least once."""
    seen: set[str] = set()
    out = []
    for name, args in cases:
        inner = name[name.index("[") + 1:-1]
        tags, _, variant = inner.partition(" +")
        keys = set(tags.split(",")) | {"variant:" + variant}
        if keys - seen:
            seen |= keys
            out.append((name, args))
    return out


def check(lib: _AsPlainAbi, op: str, limit: int | None = None, full: bool = False) -> list[str]:
    """Failures (empty when every case matches the oracle and is deterministic)."""
    b = bench()
    o = registry.get(op)
    cases = b.cases(o, np.random.default_rng(0))
    cases = cases if full else sample(cases)
    failures = []
    for case, args in cases[:limit]:
        ref = oracle.run(o, **_copy(args))
        try:
            r1 = runtime.call(op, lib=lib, **_copy(args))
            r2 = runtime.call(op, lib=lib, **_copy(args))
        except Exception as e:  # report and go on
            failures.append(f"{case}: {type(e).__name__}: {e}")
            continue
        for k, v in ref.items():
            why = b.close(r1[k], v)
            if why:
                failures.append(f"{case}.{k} vs oracle: {why}")
            if r1[k].tobytes() != r2[k].tobytes():
                failures.append(f"{case}.{k}: two runs differ")
    return failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("ops")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--all", action="store_true")
    a = ap.parse_args()
    lib = load(a.lib)
    bad = []
    for op in a.ops.split(","):
        bad += check(lib, op, a.limit, a.all)
    for f in bad:
        print("FAIL", f)
    print(f"{len(bad)} failure(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
