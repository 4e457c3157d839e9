"""Compare two builds of the CPU library (or of the CUDA emulator) call by call, bitwise.

    .venv/bin/python -m tests.compare_libraries OLD.so NEW.so [--seeds N] [--cuda-emu]

Every seed op is called with every dtype of its signature (each index and mask dtype included),
in contiguous, strided and (for indices) reversed layouts, with duplicated and out-of-range
indices, on random inputs; both libraries must return the same status and write the same
bytes. Used to check a refactoring of the code generator that must not change one result bit
(docs/ir.md, "De-monomorphised kernels"). Exit status 1 on the first difference.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tests.cpu_cases import (
    FLCE,
    NP,
    eb_args,
    ebw_args,
    edb_args,
    flce_args,
    reversed_rows,
    rms_args,
    row_strided,
)


def strided(a: np.ndarray) -> np.ndarray:
    """Same values at every other element (a 1-D or last-dim stride of 2)."""
    wide = np.zeros((*a.shape[:-1], a.shape[-1] * 2), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def cases(seed: int) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(op, label, arguments) of every case for one seed."""
    from opgen import registry

    def members(op: str, var: str) -> list[str]:
        return [d.name for d in registry.get(op).signature.dtype_vars()[var].members]

    rng = np.random.default_rng(seed)
    eb = "embedding_backward"
    for T, IT in itertools.product(members(eb, "T"), members(eb, "I")):
        for table2 in (False, True):
            a = eb_args(rng, T, IT, table2=table2)
            yield eb, f"T={T} I={IT} table2={table2}", a
            yield eb, f"T={T} I={IT} table2={table2} strided i1", {**a, "i1": strided(a["i1"])}
        bad = eb_args(rng, T, IT, table2=False)
        bad["i1"][3] = 7 if IT.startswith("u") else -1  # out of range [0, N1)
        yield eb, f"T={T} I={IT} bad index", bad
    edb = "embedding_dense_backward"
    for T, IDX in itertools.product(members(edb, "T"), members(edb, "IDX")):
        a = edb_args(rng, T, IDX)
        yield edb, f"T={T} IDX={IDX}", a
        yield edb, f"T={T} IDX={IDX} reversed", {**a, "indices": reversed_rows(a["indices"])}
        if NP[IDX].kind == "f":
            b = edb_args(rng, T, IDX)
            b["indices"].reshape(-1)[1] = np.nan
            yield edb, f"T={T} IDX={IDX} NaN index", b
    ebw = "embedding_bw"
    for IT, W, T in itertools.product(members(ebw, "I"), members(ebw, "W"), members(ebw, "T")):
        yield ebw, f"I={IT} W={W} T={T}", ebw_args(rng, IT, W, T)
    for T in members("rms_norm_backward", "T"):
        yield "rms_norm_backward", f"T={T}", rms_args(rng, T)
    for T, M, TI, mode in itertools.product(members(FLCE, "T"), members(FLCE, "M"), members(FLCE, "TI"),
                                            ("softmax", "memory_saving")):
        a = flce_args(rng, T, M, TI, mode, BT=40, H=16, V=160)
        yield FLCE, f"T={T} M={M} TI={TI} {mode}", a
        yield FLCE, f"T={T} M={M} TI={TI} {mode} strided target", {**a, "masked_target": strided(a["masked_target"])}
        yield FLCE, f"T={T} M={M} TI={TI} {mode} transposed weight, strided input rows", \
            {**a, "weight": np.ascontiguousarray(a["weight"].T).T, "input": row_strided(a["input"])}


def run(lib: Any, call: Callable[..., dict[str, np.ndarray]], op: str,
        args: dict[str, Any]) -> tuple[str, dict[str, bytes]]:
    """(status, output bytes) of one call on copies of ``args``."""
    from opgen import runtime

    mine = {k: (v.copy() if isinstance(v, np.ndarray) and k in _outputs(op) else v) for k, v in args.items()}
    try:
        outs = call(op, lib=lib, **mine)
    except runtime.OpError as e:
        return f"{e.status}: {e}", {k: np.asarray(mine[k]).tobytes() for k in _outputs(op) if k in mine}
    device = getattr(lib, "lib", None)  # the CUDA model: checks on device data are asynchronous
    if device is not None:
        status = device.opgen_cuda_device_status
        status.argtypes = [ctypes.c_void_p, ctypes.c_int]
        code = status(None, 1)
        if code:
            return f"device status {code}", {k: np.asarray(v).tobytes() for k, v in outs.items()}
    return "ok", {k: np.asarray(v).tobytes() for k, v in outs.items()}


def _outputs(op: str) -> set[str]:
    from opgen import registry

    return {p.name for p in registry.get(op).signature.outputs}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--cuda-emu", action="store_true", help="the libraries are CUDA emulator builds")
    a = ap.parse_args(argv)
    from opgen import runtime

    if a.cuda_emu:
        from tests.cuda_emu import emu_worker

        old, new = emu_worker.load(a.old), emu_worker.load(a.new)
    else:
        old, new = ctypes.CDLL(a.old), ctypes.CDLL(a.new)
        for lib in (old, new):
            lib.opgen_last_error.restype = ctypes.c_char_p
    call: Callable[..., dict[str, np.ndarray]] = runtime.call
    n = refused = 0
    for seed in range(a.seeds):
        for op, label, args in cases(seed):
            s0, b0 = run(old, call, op, args)
            s1, b1 = run(new, call, op, args)
            n += 1
            refused += s1 != "ok"
            if s0.split(":")[0] != s1.split(":")[0] or b0 != b1:
                print(f"DIFFERENT: {op} [{label}] seed {seed}: {s0} vs {s1}")
                return 1
    print(f"{n} calls ({refused} refused by both with the same status): identical statuses and output bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
