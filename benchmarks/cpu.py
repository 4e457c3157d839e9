"""CPU benchmark: opgen's generated kernels vs PyTorch CPU, side by side in one process.

    OMP_NUM_THREADS=2 python benchmarks/cpu.py [--quick] [--rows NAME,...] [--out docs/bench.json]

Runs alternate (ours, torch, ours, torch, ...) and report medians; both sides allocate their
outputs, as a caller of either would. Memory-bound rows also show opgen's time with its outputs
given (the kernel alone, without the zeroing of fresh pages) and its bandwidth as a percentage of
this machine's copy bandwidth (bytes read + written by the fastest of a numpy copy, PyTorch's
``copy_`` and a copy with streaming stores (benchmarks/stream_copy.c) on the same threads, of as
many bytes as the row moves, timed alternately with the row's calls: a VM's memory bandwidth
drifts, within seconds on the Zen 5 machine; the median over the repetitions of each call against
the copy timed right after it; each timed call and each timed copy right after an untimed one of
itself, so neither pays for the other's dirty cache lines; the bandwidth of a 256 MiB copy at the
start is printed too, and that of a 256 MiB read, the fastest of PyTorch's ``sum`` and a read of
8 streams a thread (benchmarks/stream_copy.c): the ceiling of a row that only reads, 70-75% of
the copy's on the Zen 5 VM); the new ops' rows add their time with the data in cache, which
shows the rows that are compute-bound here. Products in f32 show the fraction of the f32 FMA peak, products
in bf16 that of the bf16 units opgen's library uses here (AMX tiles, or AVX512-BF16 dot products),
both sides (benchmarks/fma_peak.c, measured in the same run). FLCE peak memory is measured in a
fresh subprocess per contender (resident-set growth over the call, sampled every millisecond).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
# PyTorch's CPU allocator gets transparent huge pages for large blocks, as numpy's arrays do
# (else its page faults would flatter opgen)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import torch
from timing import COPY_BYTES, alternate, best_of, copier, given_ms, reader  # benchmarks/timing.py, beside

from opgen import runtime

THREADS = int(os.environ["OMP_NUM_THREADS"])
torch.set_num_threads(THREADS)


def bf16(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.int16).numpy().view(runtime.dtypes.BF16.np_dtype)


def np_of(t: torch.Tensor) -> np.ndarray:
    return bf16(t) if t.dtype == torch.bfloat16 else t.contiguous().numpy()


def copy_bandwidth() -> float:
    """GB/s of a copy of COPY_BYTES (bytes read + bytes written), best of 5 (timing.copier)."""
    copy = copier(COPY_BYTES)
    return 2 * COPY_BYTES / min(copy() for _ in range(5)) / 1e9


def read_bandwidth() -> float:
    """GB/s of a read of COPY_BYTES, best of 5 (timing.reader): the ceiling of a row that only reads."""
    read = reader(COPY_BYTES)
    return COPY_BYTES / min(read() for _ in range(5)) / 1e9


def fma_peak() -> tuple[float | None, float | None, str]:
    """GFLOP/s on THREADS threads of f32 multiply-adds and of the bf16 products opgen's library
    uses here (benchmarks/fma_peak.c, compiled here), and the name of those: AMX tile products
    (TDPBF16PS) where the library runs its bf16 GEMMs on AMX, else AVX512-BF16 dot products
    (VDPBF16PS; None without them); None, None without a C compiler."""
    import math
    import tempfile

    from opgen import compile as cc

    exe = os.path.join(tempfile.mkdtemp(), "fma_peak")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fma_peak.c")
    r = subprocess.run([cc.compiler(), "-O2", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=fast",
                        "-fopenmp", src, "-o", exe], capture_output=True, text=True)
    if r.returncode != 0:
        return None, None, ""
    amx = runtime.load().opgen_bf16_units() == 2  # (0 none, 1 AVX512-BF16, 2 AMX: the runtime's choice)
    f32 = float(subprocess.run([exe], capture_output=True, text=True, check=True).stdout)
    bf16 = float(subprocess.run([exe, "amx" if amx else "bf16"], capture_output=True, text=True, check=True).stdout)
    return f32, None if math.isnan(bf16) else bf16, "AMX bf16 tile-product" if amx else "bf16 dot-product"


def embedding_inputs(dtype: torch.dtype, scale: bool, quick: bool) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """(opgen's arguments, grad, indices) of the embedding row."""
    V, N, D = (8000, 2048, 1024) if quick else (32000, 8192, 1024)
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(N, D, generator=g).to(dtype)
    idx = torch.randint(0, V, (N,), generator=g)
    out = np.empty((V, D), np_of(grad).dtype)
    args = dict(grad=np_of(grad), indices=idx.numpy(), num_weights=V, padding_idx=-1,
                scale_grad_by_freq=scale, out=out)
    return args, grad, idx


def row_embedding(dtype: torch.dtype, scale: bool, quick: bool) -> dict:
    args, grad, idx = embedding_inputs(dtype, scale, quick)
    N, D = grad.shape
    V = args["num_weights"]
    fresh = {k: v for k, v in args.items() if k != "out"}  # (allocating its output, as PyTorch does)
    t_ours, t_torch = alternate(lambda: runtime.call("embedding_dense_backward", **fresh),
                                lambda: torch.ops.aten.embedding_dense_backward(grad, idx, V, -1, scale), 11)
    nbytes = grad.numel() * grad.element_size() + idx.numel() * 8 + V * D * grad.element_size()
    return {"row": f"embedding_dense_backward V={V} N={N} D={D} {str(dtype)[6:]} scale={scale}",
            "ours_ms": t_ours * 1e3, "torch_ms": t_torch * 1e3, "bytes": nbytes,
            **given_ms(lambda: runtime.call("embedding_dense_backward", **args), nbytes)}


def rms_inputs(dtype: torch.dtype, quick: bool) -> tuple[dict, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(opgen's arguments, x, w, grad_y) of the RMSNorm row (x and w require grad)."""
    N, D = (2048, 4096) if quick else (8192, 4096)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, D, generator=g).to(dtype).requires_grad_()
    w = torch.randn(D, generator=g).to(dtype).requires_grad_()
    gy = torch.randn(N, D, generator=g).to(dtype)
    gx = np.empty((N, D), np_of(gy).dtype)
    gw = np.empty((D,), np_of(gy).dtype)
    args = dict(grad_y=np_of(gy), x=np_of(x.detach()), w=np_of(w.detach()), eps=1e-6, grad_x=gx, grad_w=gw)
    return args, x, w, gy


def row_rms(dtype: torch.dtype, quick: bool) -> dict:
    args, x, w, gy = rms_inputs(dtype, quick)
    N, D = x.shape
    y = torch.nn.functional.rms_norm(x, (D,), w, eps=1e-6)
    fresh = {k: v for k, v in args.items() if k not in ("grad_x", "grad_w")}
    t_ours, t_torch = alternate(lambda: runtime.call("rms_norm_backward", **fresh),
                                lambda: torch.autograd.grad(y, (x, w), gy, retain_graph=True), 11)
    nbytes = 3 * N * D * x.element_size() + 2 * D * x.element_size()
    return {"row": f"rms_norm_backward {N}x{D} {str(dtype)[6:]}", "ours_ms": t_ours * 1e3,
            "torch_ms": t_torch * 1e3, "bytes": nbytes,
            **given_ms(lambda: runtime.call("rms_norm_backward", **args), nbytes)}


def flce_inputs(quick: bool) -> dict:
    BT, H, V = (256, 512, 8000) if quick else (1024, 1024, 32000)
    g = torch.Generator().manual_seed(2)
    X = (torch.randn(BT, H, generator=g) * 0.05).bfloat16()
    W = (torch.randn(V, H, generator=g) * 0.05).bfloat16()
    lmax, se = torch.empty(BT), torch.empty(BT)
    for i in range(0, BT, 64):  # in row blocks: keep the pre-call memory high-water mark low
        logits = torch.cat([X[i:i + 64].float() @ W[j:j + 4096].float().T for j in range(0, V, 4096)], 1)
        lmax[i:i + 64] = logits.max(1).values
        se[i:i + 64] = torch.exp(logits - lmax[i:i + 64, None]).sum(1)
        del logits
    t = torch.randint(0, V, (BT,), generator=g)
    m = torch.rand(BT, generator=g) < 0.2
    return dict(X=X, W=W, lmax=lmax, se=se, t=t, m=m, grad=torch.rand(BT, generator=g))


def flce_torch(d: dict, upcast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch's materialised-logits composite (what Megatron's unfused path does): in bf16, or
    (``upcast``) with X and W upcast to f32 and the three products in sgemm, the best path on a
    CPU without native bf16 products (docs/performance.md)."""
    X, W = d["X"], d["W"]
    if upcast:
        X, W = X.float(), W.float()
    logits = (X @ W.T).float()
    G = torch.exp(logits - d["lmax"][:, None]) / d["se"][:, None]
    G[torch.arange(X.shape[0]), d["t"]] -= (~d["m"]).float()
    G *= d["grad"][:, None]
    if upcast:
        return (G @ W).bfloat16(), (G.T @ X).bfloat16()
    Gb = G.to(X.dtype)
    return Gb @ W, Gb.T @ X


def flce_upcast_is_faster(d: dict) -> bool:
    """Whether PyTorch's composite on ``d`` runs faster with an f32 upcast and sgemm than in
    bf16. A 256 x 1024 x 4096 probe first (best of three each): a CPU without bf16 units runs the
    bf16 products several times slower there, and the full-size bf16 composite would take
    minutes, so it is not timed. Otherwise both full-size composites are timed (best of two), as
    the probe alone misjudged: on the AVX512-BF16 machine it found bf16 faster while the bf16
    composite took 561 ms against the upcast one's 293 (its transposed product and conversions)."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(256, 1024, generator=g).bfloat16(), torch.randn(4096, 1024, generator=g).bfloat16()
    if best_of(lambda: (a.float() @ b.float().T).bfloat16(), 3) * 2 < best_of(lambda: a @ b.T, 3):
        return True
    return best_of(lambda: flce_torch(d, True), 2) <= best_of(lambda: flce_torch(d, False), 2)


def flce_ours_args(d: dict) -> dict:
    packed = np.packbits(d["m"].numpy(), bitorder="little")
    return dict(grad=d["grad"].numpy(), input=np_of(d["X"]), weight=np_of(d["W"]), target_mask=packed,
                masked_target=d["t"].to(torch.int32).numpy(), logits_max=d["lmax"].numpy(),
                sum_exp_logits=d["se"].numpy())


def row_flce(quick: bool) -> dict:
    d = flce_inputs(quick)
    args = flce_ours_args(d)
    upcast = flce_upcast_is_faster(d)
    t_ours, t_torch = alternate(lambda: runtime.call("fused_linear_cross_entropy_loss_grad", **args),
                                lambda: flce_torch(d, upcast), 3)
    BT, H = d["X"].shape
    V = d["W"].shape[0]
    mem = {who: _peak_child(who, quick) for who in ("ours", "torch-upcast" if upcast else "torch")}
    return {"row": f"FLCE grad memory-saving BT={BT} H={H} V={V} bf16", "ours_ms": t_ours * 1e3,
            "torch_ms": t_torch * 1e3, "flops": 6 * BT * H * V, "torch_path": "f32 upcast" if upcast else "bf16",
            "peak_ours_mb": mem["ours"], "peak_torch_mb": mem["torch-upcast" if upcast else "torch"]}


def _peak_child(who: str, quick: bool) -> float:
    r = subprocess.run([sys.executable, __file__, "--peak", who] + (["--quick"] if quick else []),
                       capture_output=True, text=True, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def peak_main(who: str, quick: bool) -> None:
    """Prints the resident-set growth (MB) over one FLCE call by ``who``: ours, torch (the bf16
    composite) or torch-upcast."""
    d = flce_inputs(quick)
    args = flce_ours_args(d)
    runtime.load()
    fn = (lambda: runtime.call("fused_linear_cross_entropy_loss_grad", **args)) if who == "ours" \
        else (lambda: flce_torch(d, who == "torch-upcast"))
    import threading

    def rss_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    before, peak, done = rss_mb(), [0.0], threading.Event()

    def sample() -> None:  # resident-set size sampled every millisecond during the call
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.001)

    t = threading.Thread(target=sample)
    t.start()
    fn()
    done.set()
    t.join()
    print(max(0.0, max(peak[0], rss_mb()) - before))


#: a row's copy bandwidth this far from the run's first measurement (a fraction) is noted beside it:
#: the Zen 5 VM's copy ran at 83-106 GB/s for stretches of seconds where it ran 48-61 otherwise, and
#: a kernel whose compute holds it at the usual rate then reads half its usual percentage
WINDOW = 0.25


def table(rows: list[dict], bw: float, peak: float | None, bf16_peak: float | None = None,
          bf16_units: str = "bf16 dot-product") -> str:
    """The markdown table: speed-up with both sides allocating their outputs; % copy BW from the
    time with the outputs given (the kernel alone: fresh pages cost both sides their zeroing,
    which no kernel avoids), each call against the copy timed right after it (timing.given_ms's
    ``pct_copy``; where that copy's bandwidth was more than WINDOW from the run's first, ``bw``,
    a note of it), and for a row whose in-cache time alone exceeds 80% of that, a
    note that it is compute-bound on this machine; % FMA peak for f32 products, % of the peak of
    the bf16 units (``bf16_units``: AMX or AVX512-BF16, where the machine has them) for bf16 ones."""
    lines = ["| case | opgen ms | PyTorch ms | speed-up | opgen ms, outputs given | % copy BW | notes |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        sp = r["torch_ms"] / r["ours_ms"]
        t = r.get("given_ms", r["ours_ms"])
        row_bw = r.get("copy_gbs", bw)  # (timed beside the row: timing.given_ms)
        pct = r.get("pct_copy", 100 * r["bytes"] / (t / 1e3) / 1e9 / row_bw if "bytes" in r else None)
        bwp = f"{pct:.0f}%" if pct is not None else "-"
        notes = []
        if "copy_gbs" in r and abs(row_bw / bw - 1) > WINDOW:
            notes.append(f"copy beside it {row_bw:.0f} GB/s, {row_bw / bw:.2f}x the run's first")
        if "cache_ms" in r:
            copy_ms = r["bytes"] / row_bw / 1e6
            bound = " (compute-bound here)" if r["cache_ms"] > 0.8 * copy_ms else ""
            notes.append(f"in cache {r['cache_ms']:.1f} ms{bound}")
        if "flops" in r:
            gf = r["flops"] / (r["ours_ms"] / 1e3) / 1e9
            note = f"{gf:.0f} GFLOP/s (PyTorch {r['flops'] / (r['torch_ms'] / 1e3) / 1e9:.0f})"
            if peak and r.get("f32_products"):
                note += f", {100 * gf / peak:.0f}% of the f32 FMA peak"
            if bf16_peak and r.get("bf16_products"):
                note += f", {100 * gf / bf16_peak:.0f}% of the {bf16_units} peak (PyTorch " \
                        f"{100 * r['flops'] / (r['torch_ms'] / 1e3) / 1e9 / bf16_peak:.0f}%)"
            notes.append(note)
        if "torch_path" in r:
            notes.append(f"PyTorch path: {r['torch_path']}")
        if "peak_ours_mb" in r:
            notes.append(f"peak +{r['peak_ours_mb']:.0f} MB vs +{r['peak_torch_mb']:.0f} MB")
        given = f"{r['given_ms']:.1f}" if "given_ms" in r else "-"
        lines.append(f"| {r['row']} | {r['ours_ms']:.1f} | {r['torch_ms']:.1f} | {sp:.2f}x | {given} | {bwp} "
                     f"| {'; '.join(notes)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    ap.add_argument("--rows", default="embedding,rms,flce,newops",
                    help="which rows: embedding,rms,flce,newops (ops written only in DSL files)")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--peak", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peak:
        peak_main(a.peak, a.quick)
        return
    rows_wanted = a.rows.split(",")
    bw, read_bw, (peak, bf16_peak, bf16_units) = copy_bandwidth(), read_bandwidth(), fma_peak()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"threads={THREADS}, torch {torch.__version__}, copy bandwidth {bw:.1f} GB/s, read-only bandwidth "
          f"{read_bw:.1f} GB/s ({100 * read_bw / bw:.0f}% of the copy's), "
          f"f32 FMA peak {peak or float('nan'):.0f} GFLOP/s, {bf16_units or 'bf16'} peak "
          f"{bf16_peak or float('nan'):.0f} GFLOP/s", flush=True)
    rows = []
    if "embedding" in rows_wanted:
        for dt in (torch.float32, torch.bfloat16):
            for sc in (False, True):
                rows.append(row_embedding(dt, sc, a.quick))
                print(rows[-1], flush=True)
    if "rms" in rows_wanted:
        for dt in (torch.float32, torch.bfloat16):
            rows.append(row_rms(dt, a.quick))
            print(rows[-1], flush=True)
    if "flce" in rows_wanted:
        rows.append(row_flce(a.quick))
        print(rows[-1], flush=True)
    if "newops" in rows_wanted:
        import newops

        for r in newops.rows(alternate, np_of, a.quick):
            rows.append(r)
            print(r, flush=True)
    print()
    print(table(rows, bw, peak, bf16_peak, bf16_units))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"copy_bw_gbs": bw, "read_bw_gbs": read_bw,
                       "fma_peak_gflops": peak, "bf16_peak_gflops": bf16_peak, "bf16_units": bf16_units,
                       "threads": THREADS,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
