"""Subprocess worker for the CPU-library tests (run as ``python -m tests.cpu_worker MODE ...`` from
the repository root; the library is $OPGEN_LIB or build/cpu/libopgen.so).

``det OUTDIR``  runs the determinism cases (tests/cpu_cases.py sizes large enough for several
                threads, many duplicate indices) and saves every output's raw bytes to
                OUTDIR/<case>.<output>.npy, plus OUTDIR/threads.txt (OpenMP's max threads).
``asan``        calls every op (several dtype bindings, empty tensors, batch views, in-place,
                failing calls) and checks the results against the oracle; meant to run with the
                sanitized library preloaded. Prints ``asan-worker: N calls OK``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from opgen import runtime
from tests.cpu_cases import (
    CODE,
    FLCE,
    c_call,
    check_against_oracle,
    eb_args,
    ebw_args,
    edb_args,
    filled,
    flce_args,
    permuted_leading,
    rms_args,
    root,
)


def _seeded(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _edb_det(T: str) -> dict[str, Any]:
    a = edb_args(_seeded(11), T, "i64", lead=(40, 100), D=64, V=50, padding_idx=7, scale=True)
    a["indices"][:, ::3] = 13  # a hot row
    a["grad"] = permuted_leading(a["grad"])  # non-coalescable batch axes: row-offset table
    return a


def _eb_det(T: str) -> dict[str, Any]:
    a = eb_args(_seeded(10), T, "i64", N=4000, D=64, N1=50, N2=37)
    a["i1"][::2] = 7
    return a


def _rms_inplace(T: str) -> dict[str, Any]:
    a = rms_args(_seeded(13), T, (512, 1024), 1e-6)
    a["grad_x"] = a["grad_y"]
    return a


#: name -> (op, builder); every builder is seeded, so each process sees the same inputs
DET_CASES: dict[str, tuple[str, Callable[[], dict[str, Any]]]] = {
    "eb-bf16": ("embedding_backward", lambda: _eb_det("bf16")),
    "eb-f32": ("embedding_backward", lambda: _eb_det("f32")),
    "edb-bf16": ("embedding_dense_backward", lambda: _edb_det("bf16")),
    "edb-f32": ("embedding_dense_backward", lambda: _edb_det("f32")),
    "ebw-bf16": ("embedding_bw", lambda: ebw_args(_seeded(12), "u32", "bf16", "bf16", N=4000, D=64, V=50)),
    "ebw-f32": ("embedding_bw", lambda: ebw_args(_seeded(12), "i64", "f32", "f32", N=4000, D=64, V=50)),
    "rms-bf16": ("rms_norm_backward", lambda: rms_args(_seeded(13), "bf16", (512, 1024), 1e-6)),
    "rms-f32": ("rms_norm_backward", lambda: rms_args(_seeded(13), "f32", (512, 1024), 1e-6)),
    "rms-bf16-inplace": ("rms_norm_backward", lambda: _rms_inplace("bf16")),
    "flce-bf16-softmax": (FLCE, lambda: flce_args(_seeded(14), "bf16", "u8", "i64", "softmax",
                                                  BT=200, H=64, V=600)),
    "flce-bf16-memory_saving": (FLCE, lambda: flce_args(_seeded(14), "bf16", "u8", "i32", "memory_saving",
                                                        BT=200, H=64, V=600)),
    "flce-f16-memory_saving": (FLCE, lambda: flce_args(_seeded(15), "f16", "bool", "i64", "memory_saving",
                                                       BT=200, H=64, V=600)),
    # the one-pass chain: 6 column blocks in 3 groups of 2, 2 row blocks (the second partial)
    "flce-bf16-groups": (FLCE, lambda: flce_args(_seeded(16), "bf16", "u8", "i64", "memory_saving",
                                                 BT=300, H=40, V=5 * 256 + 7)),
}


def omp_max_threads() -> int:
    gomp = ctypes.CDLL(ctypes.util.find_library("gomp") or "libgomp.so.1")
    return int(gomp.omp_get_max_threads())


def run_det(outdir: Path) -> None:
    outdir.mkdir(parents=True, exist_ok=True)
    for case, (op, build) in DET_CASES.items():
        out = runtime.call(op, **build())
        for k, v in out.items():
            np.save(outdir / f"{case}.{k}.npy", np.ascontiguousarray(v).view(np.uint8).reshape(-1))
    (outdir / "threads.txt").write_text(str(omp_max_threads()))


# ------------------------------------------------------------------------------ asan


def _bad_index_calls() -> list[tuple[str, dict[str, Any]]]:
    r = _seeded(21)
    a = eb_args(r, "bf16", "u64", acc=(False, True))
    a["i2"][5] = 2**64 - 1
    b = edb_args(r, "f16", "f32", lead=(3, 4))
    b["indices"][2, 3] = 11.0
    c = ebw_args(r, "i32", "f32", "bf16")
    c["indices"][-1] = -1
    d = flce_args(r, "bf16", "u8", "i32", "memory_saving", mask_p=0.0)
    d["masked_target"][7] = 300  # V: out of range on a row inside the shard
    return [("embedding_backward", a), ("embedding_dense_backward", b), ("embedding_bw", c), (FLCE, d)]


def asan_cases() -> list[tuple[str, dict[str, Any], tuple[str, ...]]]:
    r = _seeded(20)
    cases: list[tuple[str, dict[str, Any], tuple[str, ...]]] = []

    def add(op: str, a: dict[str, Any], aliased: tuple[str, ...] = ()) -> None:
        cases.append((op, a, aliased))

    for T, IT in (("f16", "i8"), ("bf16", "u64"), ("f32", "i32"), ("f64", "u16")):
        add("embedding_backward", eb_args(r, T, IT, N=300, D=33))
    add("embedding_backward", eb_args(r, "f32", "i64", table2=False))
    add("embedding_backward", eb_args(r, "bf16", "i64", i2=False, dtable2=True, acc=(True, True)))
    add("embedding_backward", eb_args(r, "f32", "i64", N=0))
    add("embedding_backward", eb_args(r, "f32", "i64", D=0))
    for T, IDX in (("f32", "f16"), ("bf16", "i64"), ("f16", "bool"), ("bf16", "u8")):
        add("embedding_dense_backward", edb_args(r, T, IDX, lead=(4, 7), D=17))
    a = edb_args(r, "bf16", "i32", lead=(5, 3), D=6)
    a["grad"], a["indices"] = permuted_leading(a["grad"]), permuted_leading(a["indices"])
    add("embedding_dense_backward", a)
    a = edb_args(r, "f32", "i64", lead=(4, 3), D=6)
    a["grad"], a["indices"] = a["grad"][::-1, ::-1], a["indices"][::-1, ::-1]
    a["out"] = filled((6, 11), "f32").T
    add("embedding_dense_backward", a)
    add("embedding_dense_backward", edb_args(r, "f32", "i32", lead=(3, 0)))
    add("embedding_dense_backward", edb_args(r, "f16", "i32", D=0))
    for IT, W, T in (("u32", "f64", "bf16"), ("i64", "f16", "f32")):
        add("embedding_bw", ebw_args(r, IT, W, T, N=200, D=33))
    add("embedding_bw", ebw_args(r, "u32", "f32", "f32", N=0))
    for T in ("f16", "bf16", "f32"):
        add("rms_norm_backward", rms_args(r, T, (3, 5, 72), 1e-6))
    a = rms_args(r, "bf16", (4, 6, 40), 0.0)
    a["x"] = permuted_leading(a["x"])
    a["grad_y"] = permuted_leading(a["grad_y"])
    a["grad_x"] = a["grad_y"]
    add("rms_norm_backward", a, ("grad_y",))
    add("rms_norm_backward", rms_args(r, "f32", (0, 3, 8)))
    add("rms_norm_backward", rms_args(r, "f32", (3, 0)))
    for T, M, TI, mode in (("bf16", "u8", "i32", "softmax"), ("f16", "bool", "i64", "memory_saving"),
                           ("bf16", "u8", "i64", "memory_saving")):
        add(FLCE, flce_args(r, T, M, TI, mode, BT=70, H=24, V=300, mask_extra=1))
    a = flce_args(r, "bf16", "bool", "i32", "memory_saving", mask_p=0.0)
    a["masked_target"][:4] = [300, -1, 2**31 - 1, -(2**31)]  # any value on rows outside the shard
    a["target_mask"][:4] = True
    add(FLCE, a)
    a = flce_args(r, "f16", "u8", "i32", "softmax")
    a["input"] = np.ascontiguousarray(a["input"].T).T
    a["softmax"] = np.ascontiguousarray(a["softmax"].T).T
    a["input_grad"] = filled((20, 70), "f16").T
    add(FLCE, a)
    add(FLCE, flce_args(r, "bf16", "u8", "i32", "memory_saving", BT=0))
    return cases


def run_asan() -> None:
    n = 0
    for op, a, aliased in asan_cases():
        check_against_oracle(op, a, aliased=aliased)
        n += 1
    for op, a in _bad_index_calls():
        roots = [root(v) for v in a.values() if isinstance(v, np.ndarray)]
        before = [x.tobytes() for x in roots]
        st, msg = c_call(op, a)
        assert st == CODE["index"], (op, st, msg)
        assert all(x.tobytes() == b for x, b in zip(roots, before, strict=True)), op
        n += 1
    # a descriptor the validator must refuse without reading past it: rank 9, and data NULL
    st, _ = c_call("embedding_dense_backward",
                   {"grad": np.zeros((1,) * 8 + (4,), np.float32), "indices": np.zeros((1,) * 8, np.int64),
                    "num_weights": 3, "out": np.zeros((3, 4), np.float32)})
    assert st == CODE["shape"], st
    n += 1
    print(f"asan-worker: {n} calls OK")


def main(argv: list[str]) -> int:
    if argv[:1] == ["det"] and len(argv) == 2:
        run_det(Path(argv[1]))
        return 0
    if argv == ["asan"]:
        run_asan()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
