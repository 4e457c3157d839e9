"""The "new ops" rows of benchmarks/cpu.py: ops written only in DSL files, as a user would.

The DSL files are the tests' (tests/test_new_op_backends.py: the exact and the tanh GELU backward,
a linear layer with bias and ReLU, LayerNorm backward from saved f32 statistics, BatchNorm backward
from saved per-channel statistics, dropout backward with a bool mask, a transpose, a sum over the
middle axis;
tests/test_gemm_operands.py: a linear layer over batched rows, in f16 here;
tests/test_ascendc.py: SiLU, softmax and LayerNorm backward; tests/test_shapes_dsl.py:
rotary-embedding backward; tests/test_flat_chunks.py: an Adam step over a flat parameter vector;
tests/test_fuse_siblings.py: softmax backward over attention scores (B, H, S, S);
tests/test_column_sums.py: a sum over the leading axis of (B, N, D); tests/test_new_op_backends.py
RANK0: mean cross-entropy backward).
They are written into build/bench-ops/ and built there with ``opgen build --out`` (incremental),
and each row runs against the faster of PyTorch autograd and the explicit aten kernel a user
would call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from timing import best_of, given_ms  # benchmarks/timing.py, beside

from opgen import registry, runtime
from opgen.binding import aligned_zeros

ROOT = registry.REPO_ROOT / "build" / "bench-ops"
OPS = ROOT / "opgen_bench_ops"


def library() -> Any:
    """The CPU library of the new ops (built on first use)."""
    if str(registry.REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(registry.REPO_ROOT))  # (the DSL files live in the tests)
    from tests.test_ascendc import NEW_OPS
    from tests.test_column_sums import SUM_OPS
    from tests.test_flat_chunks import FLAT_OPS
    from tests.test_fuse_siblings import ATTN
    from tests.test_gemm_operands import OPS as GEMM_OPS
    from tests.test_new_op_backends import (
        BATCH_NORM,
        DROPOUT,
        GELU,
        GELU_TANH,
        LINEAR,
        LN_CAST,
        NARROW,
        RANK0,
        TRANSPOSED,
    )
    from tests.test_shapes_dsl import ROPE

    OPS.mkdir(parents=True, exist_ok=True)
    for name, text in (("newops.py", NEW_OPS), ("gelu.py", GELU), ("gelu_tanh.py", GELU_TANH), ("linear.py", LINEAR),
                       ("ln_cast.py", LN_CAST), ("rope.py", ROPE), ("narrow.py", NARROW), ("gemm_ops.py", GEMM_OPS),
                       ("batch_norm.py", BATCH_NORM), ("dropout.py", DROPOUT), ("transposed.py", TRANSPOSED),
                       ("flat.py", FLAT_OPS), ("attn.py", ATTN), ("sums.py", SUM_OPS), ("rank0.py", RANK0)):
        p = OPS / name
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
    env = dict(os.environ, OPGEN_OPS_DIR=str(OPS))
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--out", str(ROOT / "generated"), "-q"],
                       env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"building the new ops failed:\n{r.stdout}\n{r.stderr}")
    os.environ["OPGEN_OPS_DIR"] = str(OPS)  # (runtime.call looks the ops up by name)
    registry.load_all.cache_clear()
    return runtime.load(str(ROOT / "generated.build" / "cpu" / "libopgen.so"))


def _fastest(fns: list[Callable[[], object]]) -> Callable[[], object]:
    """The fastest of several PyTorch formulations (timed once each, after a warm-up)."""
    return min(fns, key=lambda f: best_of(f, 1))


def _in_cache_ms(lib: Any, op: str, make: Callable[[int], dict], full_rows: int) -> float | None:
    """The ms a call on ``full_rows`` rows would take with its data in cache: the time per row of
    calls on 2 and 18 rows (their difference: the call's fixed cost cancels; both sizes fit the
    L2 cache) on ONE thread, times ``full_rows``, over the threads of a full call (as if they
    scaled perfectly). One thread, because a kernel parallel over groups of rows (LayerNorm's
    column partials: 32 rows a group) runs 2 or 18 rows on one thread whatever the team: timed on
    the team, such a row read twice its per-thread cost. Above the copy time, a row is
    compute-bound on this machine. None where the 18-row calls did not time slower than the 2-row
    ones (short rows: the difference drowned in the calls' own noise; rotary embeddings once gave
    "0.0 ms")."""
    import ctypes
    import time

    gomp = ctypes.CDLL("libgomp.so.1")  # (the library's OpenMP runtime: its team is omp_get_max_threads())
    threads = gomp.omp_get_max_threads()
    per = []
    gomp.omp_set_num_threads(1)
    try:
        for n in (2, 18):
            kw = make(n)
            for _ in range(30):
                runtime.call(op, lib=lib, **kw)
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(100):
                    runtime.call(op, lib=lib, **kw)
                best = min(best, (time.perf_counter() - t0) / 100)
            per.append(best)
    finally:
        gomp.omp_set_num_threads(threads)
    if per[1] <= per[0]:
        return None
    return (per[1] - per[0]) / 16 * full_rows / threads * 1e3


def _row(lib: Any, alternate: Callable[..., tuple[float, float]], row: str, op: str,
         make: Callable[[int], dict], outs: tuple[str, ...], full_rows: int, theirs: Callable[[], object],
         nbytes: int, in_cache: bool = True) -> dict:
    """One memory-bound row: opgen allocating its outputs (as PyTorch does) against ``theirs``,
    then opgen with its outputs given, and (``in_cache``) the in-cache estimate."""
    kw = make(full_rows)
    inputs = {k: v for k, v in kw.items() if k not in outs}
    t_o, t_t = alternate(lambda: runtime.call(op, lib=lib, **inputs), theirs, 11)
    out = {"row": row, "ours_ms": t_o * 1e3, "torch_ms": t_t * 1e3, "bytes": nbytes,
           **given_ms(lambda: runtime.call(op, lib=lib, **kw), nbytes)}
    if in_cache and (cache := _in_cache_ms(lib, op, make, full_rows)) is not None:
        out["cache_ms"] = cache
    return out


def _memory_bound_rows(lib: Any, alternate: Callable[..., tuple[float, float]],
                       np_of: Callable[[torch.Tensor], np.ndarray], dt: torch.dtype, shape: tuple[int, int],
                       g: torch.Generator) -> list[dict]:
    """GELU (erf and tanh), SiLU, softmax and LayerNorm backward in ``dt``: memory-bound rows."""
    N, D = shape
    out: list[dict] = []
    name = str(dt)[6:]
    es = torch.tensor([], dtype=dt).element_size()
    gy = torch.randn(N, D, generator=g).to(dt)
    x = torch.randn(N, D, generator=g).to(dt)
    w = torch.randn(D, generator=g).to(dt)
    npdt = np_of(gy).dtype

    def elementwise(**named: torch.Tensor) -> Callable[[int], dict]:
        return lambda n: {**{k: np_of(v[:n]) for k, v in named.items()}, "dx": aligned_zeros((n, D), npdt)}

    ew = elementwise(grad=gy, x=x)
    for op, approx, label in (("gelu_backward", "none", "gelu_backward (erf)"),
                              ("gelu_tanh_backward", "tanh", "gelu_tanh_backward")):
        xr = x.clone().requires_grad_()
        y = torch.nn.functional.gelu(xr, approximate=approx)
        theirs = _fastest([lambda a=approx: torch.ops.aten.gelu_backward(gy, x, approximate=a),
                           lambda y=y, xr=xr: torch.autograd.grad(y, xr, gy, retain_graph=True)])
        out.append(_row(lib, alternate, f"new: {label} {N}x{D} {name}", op, ew, ("dx",), N, theirs, 3 * N * D * es))
    # SiLU backward
    xr = x.clone().requires_grad_()
    y = torch.nn.functional.silu(xr)
    theirs = _fastest([lambda: torch.ops.aten.silu_backward(gy, x),
                       lambda: torch.autograd.grad(y, xr, gy, retain_graph=True)])
    out.append(_row(lib, alternate, f"new: silu_backward {N}x{D} {name}", "silu_backward", ew, ("dx",), N, theirs,
                    3 * N * D * es))
    # softmax backward
    sm = torch.softmax(x.float(), -1).to(dt)
    theirs = _fastest([lambda: torch.ops.aten._softmax_backward_data(gy, sm, -1, dt)])
    out.append(_row(lib, alternate, f"new: softmax_backward {N}x{D} {name}", "softmax_backward",
                    elementwise(grad=gy, y=sm), ("dx",), N, theirs, 3 * N * D * es))
    # LayerNorm backward from PyTorch's saved statistics
    bias = torch.zeros(D, dtype=dt)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [D], w, bias, 1e-5)  # (what autograd saves)
    mean_f, rstd_f = mean.float().reshape(N), rstd.float().reshape(N)

    def ln(n: int) -> dict:
        return {"grad_y": np_of(gy[:n]), "x": np_of(x[:n]), "w": np_of(w), "mean_": mean_f[:n].numpy(),
                "rstd": rstd_f[:n].numpy(), "grad_x": aligned_zeros((n, D), npdt),
                "grad_w": aligned_zeros((D,), npdt), "grad_b": aligned_zeros((D,), npdt)}

    xr, wr, br = x.clone().requires_grad_(), w.clone().requires_grad_(), bias.clone().requires_grad_()
    y = torch.nn.functional.layer_norm(xr, (D,), wr, br, 1e-5)
    theirs = _fastest([lambda: torch.ops.aten.native_layer_norm_backward(
        gy, x, [D], mean, rstd, w, bias, [True, True, True]),
        lambda: torch.autograd.grad(y, (xr, wr, br), gy, retain_graph=True)])
    out.append(_row(lib, alternate, f"new: layer_norm_backward (saved f32 stats) {N}x{D} {name}", "ln_cast_backward",
                    ln, ("grad_x", "grad_w", "grad_b"), N, theirs, 3 * N * D * es))
    # BatchNorm backward (training) from saved per-channel statistics: the column means need every
    # row before any output, so the rows are read twice (5 tensors' bytes at least)
    cm, cv = x.float().mean(0), x.float().var(0, unbiased=False)
    invstd = 1 / torch.sqrt(cv + 1e-5)

    def bn(n: int) -> dict:
        return {"grad_y": np_of(gy[:n]), "x": np_of(x[:n]), "mean_": cm.numpy(), "invstd": invstd.numpy(),
                "grad_x": aligned_zeros((n, D), npdt)}

    xr = x.clone().requires_grad_()
    y = torch.nn.functional.batch_norm(xr, None, None, training=True)
    theirs = _fastest([lambda: torch.ops.aten.native_batch_norm_backward(
        gy, x, None, None, None, cm, invstd, True, 1e-5, [True, False, False]),
        lambda: torch.autograd.grad(y, xr, gy, retain_graph=True)])
    out.append(_row(lib, alternate, f"new: batch_norm_backward (saved stats) {N}x{D} {name}", "batch_norm_backward",
                    bn, ("grad_x",), N, theirs, 5 * N * D * es))
    # dropout backward: a bool mask
    mask = torch.rand(N, D, generator=g) > 0.1
    theirs = _fastest([lambda: torch.ops.aten.native_dropout_backward(gy, mask, 1 / 0.9),
                       lambda: gy * mask * (1 / 0.9)])

    def dropout(n: int) -> dict:
        return {"grad_y": np_of(gy[:n]), "mask": mask[:n].numpy(), "grad_x": aligned_zeros((n, D), npdt)}

    out.append(_row(lib, alternate, f"new: dropout_backward (bool mask) {N}x{D} {name}", "dropout_backward",
                    dropout, ("grad_x",), N, theirs, N * D * (2 * es + 1)))
    return out


def _layout_rows(lib: Any, alternate: Callable[..., tuple[float, float]], np_of: Callable[[torch.Tensor], np.ndarray],
                 dt: torch.dtype, shape: tuple[int, int], g: torch.Generator) -> list[dict]:
    """A transposed input (y = 2 x^T, tiles: tile-transposes) and sums over the middle axis of
    (B, N, D) (walked along rows): memory-bound, no in-cache estimate (their rows do not fit)."""
    N, D = shape
    name = str(dt)[6:]
    es = torch.tensor([], dtype=dt).element_size()
    npdt = np_of(torch.zeros(1, dtype=dt)).dtype
    x = torch.randn(N, D, generator=g).to(dt)
    theirs = _fastest([lambda: (x.T * 2.0).contiguous(), lambda: x.T.contiguous().mul_(2.0)])
    out = [_row(lib, alternate, f"new: transpose (y = 2 x^T) {N}x{D} {name}", "transpose_scale",
                lambda n: {"x": np_of(x[:n]), "y": aligned_zeros((D, n), npdt)}, ("y",), N, theirs,
                2 * N * D * es, in_cache=False)]
    x3 = x.reshape(N // 64, 64, D)
    theirs = _fastest([lambda: x3.float().sum(1).to(dt), lambda: torch.sum(x3, 1, dtype=torch.float32).to(dt)])
    out.append(_row(lib, alternate, f"new: sum over the middle axis {N // 64}x64x{D} {name}", "token_sum",
                    lambda n: {"x": np_of(x3[:n]), "y": aligned_zeros((n, D), npdt)}, ("y",), N // 64, theirs,
                    N * D * es, in_cache=False))
    # the leading axis of (B, N, D): a positional embedding's gradient summed over the batch
    xb = x.reshape(8, N // 8, D)
    theirs = _fastest([lambda: xb.sum(0), lambda: torch.sum(xb, 0, dtype=torch.float32).to(dt)])
    out.append(_row(lib, alternate, f"new: sum over the leading axis 8x{N // 8}x{D} {name}", "sum_lead",
                    lambda n: {"x": np_of(xb), "y": aligned_zeros((N // 8, D), npdt)}, ("y",), N, theirs,
                    N * D * es * 9 // 8, in_cache=False))
    return out


def _cross_entropy_row(lib: Any, alternate: Callable[..., tuple[float, float]], shape: tuple[int, int],
                       g: torch.Generator) -> dict:
    """Mean cross-entropy backward over (N, V) f32 logits and integer targets: each row's max,
    exp and sum, then the softmax less the one-hot, scaled; memory-bound."""
    N, V = shape
    x = torch.randn(N, V, generator=g)
    t = torch.randint(0, V, (N,), generator=g)
    xr = x.clone().requires_grad_()
    loss = torch.nn.functional.cross_entropy(xr, t)
    one, neg = torch.ones(()), torch.full((N, 1), -1.0)
    theirs = _fastest([lambda: torch.autograd.grad(loss, xr, retain_graph=True)[0],
                       lambda: torch.softmax(x, -1).scatter_add_(1, t[:, None], neg).div_(N),
                       lambda: torch.ops.aten._log_softmax_backward_data(
                           torch.zeros(N, V).scatter_(1, t[:, None], -1.0 / N), torch.log_softmax(x, -1), -1,
                           torch.float32)])

    def ce(n: int) -> dict:
        return {"grad_loss": one.numpy(), "logits": x[:n].numpy(), "target": t[:n].numpy(),
                "dlogits": aligned_zeros((n, V), np.float32)}

    return _row(lib, alternate, f"new: cross_entropy_backward (mean) {N}x{V} float32", "ce_backward", ce,
                ("dlogits",), N, theirs, 2 * N * V * 4)


def _rope_row(lib: Any, alternate: Callable[..., tuple[float, float]], np_of: Callable[[torch.Tensor], np.ndarray],
              dt: torch.dtype, shape: tuple[int, int, int], g: torch.Generator) -> dict:
    """Rotary-embedding backward (Llama's rotate-half form) on (N, H, D): memory-bound."""
    N, H, D = shape
    gy = torch.randn(N, H, D, generator=g).to(dt)
    ang = torch.rand(N, D, generator=g) * 6.3
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    c4, s4 = cos[:, None, :], sin[:, None, :]
    k = D - D // 2

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((-t[..., D // 2:], t[..., : D // 2]), dim=-1)

    xr = torch.zeros(N, H, D, dtype=dt, requires_grad=True)
    y = xr * c4 + rotate_half(xr) * s4

    def explicit() -> torch.Tensor:
        u = gy * s4
        return gy * c4 + torch.cat((u[..., k:], -u[..., :k]), dim=-1)

    theirs = _fastest([explicit, lambda: torch.autograd.grad(y, xr, gy, retain_graph=True)])

    def make(n: int) -> dict:
        return {"grad": np_of(gy[:n]), "cos": np_of(cos[:n]), "sin": np_of(sin[:n]),
                "dx": aligned_zeros((n, H, D), np_of(gy).dtype)}

    es = gy.element_size()
    return _row(lib, alternate, f"new: rope_backward {N}x{H}x{D} {str(dt)[6:]}", "rope_backward", make, ("dx",),
                N, theirs, (2 * N * H * D + 2 * N * D) * es)


def _attention_row(lib: Any, alternate: Callable[..., tuple[float, float]],
                   np_of: Callable[[torch.Tensor], np.ndarray], dt: torch.dtype, shape: tuple[int, int, int],
                   g: torch.Generator) -> dict:
    """Softmax backward over the last axis of attention scores (B, H, S, S): memory-bound, no
    in-cache estimate (a head's rows do not fit)."""
    B, H, S = shape
    gy = torch.randn(B, H, S, S, generator=g).to(dt)
    y = torch.softmax(torch.randn(B, H, S, S, generator=g), -1).to(dt)
    xr = torch.zeros(B, H, S, S, dtype=dt, requires_grad=True)
    out = torch.softmax(xr, -1)
    theirs = _fastest([lambda: torch.ops.aten._softmax_backward_data(gy, y, -1, dt),
                       lambda: torch.autograd.grad(out, xr, gy, retain_graph=True)])

    def make(n: int) -> dict:
        return {"grad": np_of(gy[:n]), "y": np_of(y[:n]), "dx": aligned_zeros((n, H, S, S), np_of(gy).dtype)}

    return _row(lib, alternate, f"new: softmax_backward, attention {B}x{H}x{S}x{S} {str(dt)[6:]}",
                "attn_softmax_backward", make, ("dx",), B, theirs, 3 * B * H * S * S * gy.element_size(),
                in_cache=False)


def _adam_row(lib: Any, alternate: Callable[..., tuple[float, float]], n: int, g: torch.Generator) -> dict:
    """An Adam step over a flat f32 parameter vector of ``n`` (1-D: chunk-flat-loops), in place
    on both sides (the op's outputs are its inputs: may_alias), against the faster of PyTorch's
    fused Adam kernel and its foreach ops: memory-bound, 4 vectors read and 3 written."""
    D = 4096  # (the in-cache estimate's "rows": runs of D elements)
    p, gr, m = (torch.randn(n, generator=g) for _ in range(3))
    v = torch.rand(n, generator=g)
    sc = {"lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8, "bc1": 0.1, "bc2": 0.002}
    ours = {"p": p.clone(), "g": gr, "m": m.clone(), "v": v.clone()}

    def make(rows: int) -> dict:
        a = {k: t[:rows * D].numpy() for k, t in ours.items()}
        return {**a, **sc, "p_out": a["p"], "m_out": a["m"], "v_out": a["v"]}

    step = torch.tensor(1.0)

    def fused() -> None:
        torch._fused_adam_([p], [gr], [m], [v], [], [step], lr=sc["lr"], beta1=sc["b1"], beta2=sc["b2"],
                           weight_decay=0.0, eps=sc["eps"], amsgrad=False, maximize=False)

    def foreach() -> None:
        torch._foreach_lerp_([m], [gr], 1 - sc["b1"])
        torch._foreach_mul_([v], sc["b2"])
        torch._foreach_addcmul_([v], [gr], [gr], 1 - sc["b2"])
        denom = torch._foreach_add(torch._foreach_sqrt(torch._foreach_div([v], sc["bc2"])), sc["eps"])
        torch._foreach_addcdiv_([p], [m], denom, -sc["lr"] / sc["bc1"])

    kw = make(n // D)
    t_o, t_t = alternate(lambda: runtime.call("adam_step", lib=lib, **kw), _fastest([fused, foreach]), 11)
    out = {"row": f"new: adam_step (1-D, in place) n={n} f32", "ours_ms": t_o * 1e3, "torch_ms": t_t * 1e3,
           "bytes": 7 * n * 4, **given_ms(lambda: runtime.call("adam_step", lib=lib, **kw), 7 * n * 4)}
    if (cache := _in_cache_ms(lib, "adam_step", make, n // D)) is not None:
        out["cache_ms"] = cache
    return out


def rows(alternate: Callable[..., tuple[float, float]], np_of: Callable[[torch.Tensor], np.ndarray],
         quick: bool) -> list[dict]:
    """The rows (benchmarks/cpu.py's ``alternate`` timing and ``np_of`` tensor view)."""
    lib = library()
    N, D = (1024, 512) if quick else (8192, 4096)
    out: list[dict] = []
    g = torch.Generator().manual_seed(0)
    for dt in (torch.float32, torch.bfloat16):
        out += _memory_bound_rows(lib, alternate, np_of, dt, (N, D), g)
        out.append(_rope_row(lib, alternate, np_of, dt, (1024, 8, 64) if quick else (4096, 32, 128), g))
        out += _layout_rows(lib, alternate, np_of, dt, (N, D), g)
        out.append(_attention_row(lib, alternate, np_of, dt, (2, 4, 256) if quick else (4, 16, 1024), g))
    out.append(_adam_row(lib, alternate, N * D, g))
    out.append(_cross_entropy_row(lib, alternate, (256, 4000) if quick else (4096, 32000), g))
    # a linear layer with bias and ReLU (f32): compute-bound
    M, K, F = (512, 256, 256) if quick else (4096, 2048, 2048)
    xl, wl, bl = torch.randn(M, K, generator=g), torch.randn(F, K, generator=g), torch.randn(F, generator=g)
    d = {"x": xl.numpy(), "w": wl.numpy(), "b": bl.numpy()}
    theirs = _fastest([lambda: torch.relu(torch.addmm(bl, xl, wl.T)),
                       lambda: torch.relu(torch.nn.functional.linear(xl, wl, bl))])
    t_o, t_t = alternate(lambda: runtime.call("linear_relu", lib=lib, **d), theirs, 9)
    out.append({"row": f"new: linear+bias+relu {M}x{K} @ {K}x{F} f32", "ours_ms": t_o * 1e3, "torch_ms": t_t * 1e3,
                "flops": 2 * M * K * F, "f32_products": True})
    # the same product in bf16 (bf16 result): both on the bf16 units where the CPU has them; where
    # it has none, a user's best path is an f32 upcast and sgemm (the weights' copy made per call)
    xb, wb = xl.to(torch.bfloat16), wl.to(torch.bfloat16)
    d = {"x": np_of(xb), "w": np_of(wb)}
    theirs = _fastest([lambda: xb @ wb.T, lambda: torch.nn.functional.linear(xb, wb),
                       lambda: (xb.float() @ wb.float().T).bfloat16()])
    t_o, t_t = alternate(lambda: runtime.call("linear_t", lib=lib, **d), theirs, 9)
    out.append({"row": f"new: linear {M}x{K} @ {K}x{F} bf16", "ours_ms": t_o * 1e3, "torch_ms": t_t * 1e3,
                "flops": 2 * M * K * F, "bf16_products": True})
    # an f16 linear layer over batched rows (B, T, K): the f32 GEMM on f16 storage; PyTorch's f16
    # matmul, or the f32 upcast and sgemm a user would take where that is slower
    xh, wh = xl.reshape(4, M // 4, K).to(torch.float16), wl.to(torch.float16)
    d = {"x": np_of(xh), "w": np_of(wh)}
    theirs = _fastest([lambda: torch.nn.functional.linear(xh, wh),
                       lambda: torch.nn.functional.linear(xh.float(), wh.float()).half()])
    t_o, t_t = alternate(lambda: runtime.call("lin_rows", lib=lib, **d), theirs, 9)
    out.append({"row": f"new: linear, batched rows 4x{M // 4}x{K} @ {K}x{F} f16", "ours_ms": t_o * 1e3,
                "torch_ms": t_t * 1e3, "flops": 2 * M * K * F, "f32_products": True})
    return out


if __name__ == "__main__":  # (run through benchmarks/cpu.py --rows newops)
    raise SystemExit("run: python benchmarks/cpu.py --rows newops")
