"""opgen.torch.fused_linear_cross_entropy against ``cross_entropy(hidden @ weight.T, target)``:
peak memory and time of forward + backward, each contender in a fresh subprocess.

Peak memory is the resident-set growth over the process's size once the inputs exist, sampled
every millisecond (as benchmarks/cpu.py's FLCE row); PyTorch's large allocations use
transparent huge pages (``THP_MEM_ALLOC_ENABLE=1``) as numpy's do.

    OMP_NUM_THREADS=2 python benchmarks/torch_loss.py [--bt 4096 --h 1024 --v 32000 --dtype f32]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(who: str, bt: int, h: int, v: int, dtype: str) -> None:
    """Run one contender once (after a small warm-up) and print ``peak_mb seconds``."""
    import torch

    import opgen.torch as otorch

    dt = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(bt, h, generator=g) * 0.5).to(dt).requires_grad_()
    w = (torch.randn(v, h, generator=g) * 0.05).to(dt).requires_grad_()
    t = torch.randint(0, v, (bt,), generator=g)
    t[::17] = -100

    def ours() -> None:
        otorch.fused_linear_cross_entropy(x, w, t).backward()

    def theirs() -> None:
        torch.nn.functional.cross_entropy((x @ w.T).float(), t).backward()

    fn = ours if who == "ours" else theirs
    xs, ws = x[:8].detach().clone().requires_grad_(), w.detach()[:256].clone().requires_grad_()
    otorch.fused_linear_cross_entropy(xs, ws, t[:8] % 256).backward()  # (loads the library)
    x.grad = w.grad = None
    before, peak, done = _rss_mb(), [0.0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss_mb())
            time.sleep(0.001)

    th = threading.Thread(target=sample)
    th.start()
    t0 = time.perf_counter()
    fn()
    secs = time.perf_counter() - t0
    done.set()
    th.join()
    print(max(0.0, max(peak[0], _rss_mb()) - before), secs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bt", type=int, default=4096)
    ap.add_argument("--h", type=int, default=1024)
    ap.add_argument("--v", type=int, default=32000)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.bt, a.h, a.v, a.dtype)
        return
    res = {}
    for who in ("ours", "torch"):
        r = subprocess.run([sys.executable, __file__, "--child", who, "--bt", str(a.bt), "--h", str(a.h),
                            "--v", str(a.v), "--dtype", a.dtype], capture_output=True, text=True, check=True)
        mb, secs = map(float, r.stdout.split()[-2:])
        res[who] = (mb, secs)
    (mo, so), (mt, st) = res["ours"], res["torch"]
    print(f"fused linear cross entropy fwd+bwd BT={a.bt} H={a.h} V={a.v} {a.dtype}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(unset)')}")
    print("| contender | peak MB | s |\n|---|---:|---:|")
    print(f"| opgen.torch.fused_linear_cross_entropy | {mo:.0f} | {so:.2f} |")
    print(f"| cross_entropy(hidden @ weight.T, target) | {mt:.0f} | {st:.2f} |")
    print(f"peak ratio {mo / mt:.3f} (goal <= 0.25), speed-up {st / so:.2f}x")


if __name__ == "__main__":
    main()
