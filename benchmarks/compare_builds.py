"""Two builds of the CPU library side by side on the benchmark's own calls (benchmarks/cpu.py).

    OMP_NUM_THREADS=2 python benchmarks/compare_builds.py OLD.so NEW.so [--quick] [--reps N]

For a change of the code generator that must not change speed (docs/performance.md, "Before and
after"): each row alternates (old, new, old, new, ...) in one process and reports the medians
and new/old. The inputs are benchmarks/cpu.py's, so the rows are those of its table.
"""

from __future__ import annotations

import argparse
import ctypes
import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch
from cpu import alternate, embedding_inputs, flce_inputs, flce_ours_args, rms_inputs  # benchmarks/cpu.py, beside

from opgen import runtime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--quick", action="store_true", help="the benchmark's smaller sizes")
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    libs = [ctypes.CDLL(a.old), ctypes.CDLL(a.new)]
    for lib in libs:
        lib.opgen_last_error.restype = ctypes.c_char_p
    rows: list[tuple[str, str, dict, int]] = []
    for dtype in (torch.float32, torch.bfloat16):
        for scale in (False, True):
            args = embedding_inputs(dtype, scale, a.quick)[0]
            rows.append((f"embedding_dense_backward {str(dtype)[6:]} scale={scale}", "embedding_dense_backward",
                         args, a.reps))
    for dtype in (torch.float32, torch.bfloat16):
        rows.append((f"rms_norm_backward {str(dtype)[6:]}", "rms_norm_backward", rms_inputs(dtype, a.quick)[0],
                     a.reps))
    rows.append(("FLCE memory-saving bf16", "fused_linear_cross_entropy_loss_grad",
                 flce_ours_args(flce_inputs(a.quick)), max(3, a.reps // 2)))
    print(f"{'row':<46} {'old ms':>9} {'new ms':>9} {'new/old':>8}")
    for label, op, args, reps in rows:
        old, new = (lambda lib=lib, op=op, args=args: runtime.call(op, lib=lib, **args) for lib in libs)
        t_old, t_new = alternate(old, new, reps)
        print(f"{label:<46} {t_old * 1e3:9.2f} {t_new * 1e3:9.2f} {t_new / t_old:8.3f}", flush=True)


if __name__ == "__main__":
    main()
