"""Ops written only in an ops directory — the way a user authors them — compiled by ``opgen build``
into a CPU library (and CUDA: nvcc and the CPU model of CUDA) and run against the oracle, which
is itself checked against PyTorch. Covers what outside testing found broken:

* rank-0 tensor inputs (``Tensor[f32]``, ``Tensor[T]`` of every dtype; before: read as 0, or
  ``opgen: error: T``), rank-0 outputs, and full reductions used later (``x / sum(x)``,
  ``cast(sum(valid), f32)``; before: the CUDA generator crashed and stopped the whole build);
* DSL names that are C/C++ keywords, macros or the printers' own locals (``a``, ``l``, ``dims``,
  ``sc``, ``ws``, ``int``, ``new``, ``NULL``, ``exp``, ``size``, ``workspace``...);
* checks on tensor data (``check(t >= 0, ..., status="index")``, and on a reduction).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from xdsl.ir import Operation, SSAValue

from opgen import compile as cc
from opgen import oracle, runtime
from opgen.binding import OpError
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from tests.cpu_cases import copied
from tests.cuda_emu import emu_build, emu_worker
from tests.ops_dirs import built_ops
from tests.reference import NP, assert_close_policy, assert_f64_close, f64, rounded, t64, tt

RANK0 = '''
"""Rank-0 tensors in and out."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f16, bf16, f32, f64)
I = dtype_var("I", i8, i16, i32, i64, u8, u16, u32, u64)


@op
def scale_by(g: Tensor[T], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
    """dx = g * x (a rank-0 tensor of a dtype variable)."""
    return {"dx": g * x}


@op
def shift_by(off: Tensor[I], idx: Tensor[I, N], flag: Tensor[boolean], *, out: Output[I, N]):
    """out = idx + off where flag, else idx (rank-0 integer and bool tensors)."""
    return {"out": where(flag, idx + off, idx)}


@op
def ce_backward(grad_loss: Tensor[f32], logits: Tensor[f32, N, D], target: Tensor[i64, N], *,
                dlogits: Output[f32, N, D]):
    """Mean cross-entropy backward: grad_loss * (softmax(logits) - onehot(target)) / N."""
    m = max(logits, axis=1, keepdims=True)
    e = exp(logits - m)
    p = e / sum(e, axis=1, keepdims=True)
    onehot = where(iota((N, D), axis=1) == target[:, None], 1.0, 0.0)
    return {"dlogits": grad_loss * (p - onehot) / cast(size(N), f32)}


@op
def total(x: Tensor[f32, N, D], *, s: Output[f32]):
    """s = sum(x): a rank-0 output."""
    return {"s": sum(x)}


@op
def normalize(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    """y = x / sum(x): a full reduction used by a later loop."""
    return {"y": x / sum(x)}


@op
def masked_mean_backward(g: Tensor[f32], valid: Tensor[boolean, N], *, dx: Output[f32, N]):
    """d/dx of mean(x[valid]) * g: g / count(valid) on valid elements, 0 elsewhere."""
    return {"dx": where(valid, g / cast(sum(valid), f32), 0.0)}
'''

NAMES = '''
"""Parameter and dim names that are C/C++ keywords, macros, library functions or the printers'
own identifiers."""
from opgen.dsl import *

N, klass = dims("N class")


@op
def new(a: Tensor[f32, N, klass], l: Tensor[f32, N, klass], dims: Tensor[f32, N, klass],
        int: Tensor[f32, N, klass], NULL: Tensor[f32, klass], exp: float = 2.0, size: int = 1,
        ws: bool = True, *, sc: Output[f32, N, klass], workspace: Output[f32, klass]):
    """Sums of everything, named as badly as possible."""
    bufs = a * l + dims * int + NULL[None, :] * exp
    off = where(ws, bufs, a) * cast(size, f32)
    return {"sc": off, "workspace": sum(off, axis=0)}


@op
def collide(x: Tensor[f32, N], d_N: Tensor[f32, N], st_x_0: float = 1.0, errno: float = 0.5,
            expf: Tensor[f32, N] | None = None, *, out: Output[f32, N]):
    """Names equal to the printers' dim, stride and helper-function spellings."""
    y = x * st_x_0 + d_N * errno
    return {"out": y if expf is None else y + expf}
'''

CHECKS = '''
"""Checks on tensor data."""
from opgen.dsl import *

N, V = dims("N V")


@op
def take_rows(table: Tensor[f32, V], t: Tensor[i32, N], skip: Tensor[boolean, N], *, out: Output[f32, N]):
    """out = table[t] where not skip; t must be in [0, V) where not skip (index status)."""
    ti = cast(t, i64)
    check(skip | ((ti >= 0) & (ti < size(V))), "t out of [0, V)", status="index")
    safe = where(skip, 0, ti)
    return {"out": where(skip, 0.0, gather(table, safe))}


@op
def normalize_positive(x: Tensor[f32, N], *, y: Output[f32, N]):
    """y = x / sum(x); the sum must be positive (a check on a reduction)."""
    s = sum(x)
    check(s > 0.0, "sum(x) must be positive")
    return {"y": x / s}
'''

BOUNDARY = '''
"""Parameters read only through a cast or as indices: converted once by the binder."""
from opgen.dsl import *

N, D, V = dims("N D V")
M = dtype_var("M", boolean, u8, i32, f32, bf16)
J = dtype_var("J", i8, u16, i32, i64, u64, f16, f64)
S = dtype_var("S", f32, f64)


@op
def keep_rows(x: Tensor[S, Batch(N), D], keep: Tensor[M, Batch(N)], *, y: Output[S, Batch(N), D]):
    """y = x on rows whose keep flag is non-zero (NaN counts as non-zero), else 0."""
    return {"y": where(cast(keep[:, None], boolean), x, 0.0)}


@op
def pick(table: Tensor[S, V, D], at: Tensor[J, N], *, out: Output[S, N, D]):
    """out[n] = table[at[n]], ``at`` truncated toward zero; it must lie in [0, V)."""
    return {"out": gather(table, cast(at, i64))}
'''

GELU = '''
"""Exact (erf) GELU backward, as a user writes it."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16)


@op
def gelu_backward(grad: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], *, dx: Output[T, Batch(N), D]):
    """dx = grad * (Phi(x) + x * phi(x)): Phi(x) = (1 + erf(x / sqrt(2))) / 2, phi the normal density."""
    cdf = 0.5 * (1.0 + erf(x * 0.7071067811865476))
    pdf = exp(-0.5 * x * x) * 0.3989422804014327
    return {"dx": grad * (cdf + x * pdf)}
'''

GELU_TANH = '''
"""GELU (tanh approximation) backward, as a user writes it."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16)


@op
def gelu_tanh_backward(grad: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
    """dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    th = tanh(u)
    du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x)
    return {"dx": grad * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du)}
'''

LINEAR = '''
"""A linear layer with bias and ReLU: a standalone matmul."""
from opgen.dsl import *

N, K, M = dims("N K M")


@op
def linear_relu(x: Tensor[f32, N, K], w: Tensor[f32, M, K], b: Tensor[f32, M], *, y: Output[f32, N, M]):
    """y = relu(x @ w.T + b)."""
    z = x @ w.T + b[None, :]
    return {"y": where(z > 0.0, z, 0.0)}
'''

LN_CAST = '''
"""LayerNorm backward from PyTorch's saved f32 statistics, computed in f32 (casts at the inputs
and at the weight/bias gradients, which are column sums over the rows)."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16)


@op
def ln_cast_backward(grad_y: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], w: Tensor[T, D],
                     mean_: Tensor[f32, Batch(N)], rstd: Tensor[f32, Batch(N)], *,
                     grad_x: Output[T, Batch(N), D], grad_w: Output[T, D], grad_b: Output[T, D]):
    """grad_x, and grad_w = sum(grad_y * xhat), grad_b = sum(grad_y) over the rows, in f32."""
    xf = cast(x, f32)
    gy = cast(grad_y, f32)
    xhat = (xf - mean_[:, None]) * rstd[:, None]
    g = gy * cast(w, f32)[None, :]
    gx = rstd[:, None] * (g - mean(g, axis=-1, keepdims=True) - xhat * mean(g * xhat, axis=-1, keepdims=True))
    return {"grad_x": gx, "grad_w": sum(gy * xhat, axis=0), "grad_b": sum(gy, axis=0)}
'''


def ln_cast_args(rng: np.random.Generator, T: str, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """ln_cast_backward's inputs, with the statistics PyTorch saves (f32 mean and 1/std)."""
    x = rounded(rng.standard_normal(shape) * 2 + 0.5, T)
    xf = f64(x)
    mu = xf.mean(axis=-1) if shape[-1] else np.zeros(shape[:-1])
    var = ((xf - mu[..., None]) ** 2).mean(axis=-1) if shape[-1] else np.zeros(shape[:-1])
    return {"grad_y": rounded(rng.standard_normal(shape), T), "x": x, "w": rounded(rng.standard_normal(shape[-1]), T),
            "mean_": mu.astype(np.float32), "rstd": (1 / np.sqrt(var + 1e-5)).astype(np.float32)}


MATMUL_TWICE = '''
"""A matmul whose result is read by two loops (a row sum, then an elementwise output)."""
from opgen.dsl import *

N, K, M = dims("N K M")


@op
def matmul_twice(x: Tensor[f32, N, K], w: Tensor[f32, M, K], *, y: Output[f32, N, M], s: Output[f32, N]):
    """y = 2 (x @ w.T) - rowsum(x @ w.T); s = rowsum(x @ w.T)."""
    z = x @ w.T
    t = sum(z, axis=-1)
    return {"y": z * 2.0 - t[:, None], "s": t}
'''

NARROW = '''
"""Matmuls of narrow floats (narrow-products): a linear layer of T inputs (both operands exact:
bf16 products in the bf16 instance), one with an f32 weight (f32 products), and a chain whose
second product is kept in f32 (its computed operand would not be rounded: f32 products)."""
from opgen.dsl import *

N, K, M = dims("N K M")
T = dtype_var("T", f32, bf16)


@op
def linear_t(x: Tensor[T, N, K], w: Tensor[T, M, K], *, y: Output[T, N, M]):
    """y = x @ w.T."""
    return {"y": x @ w.T}


@op
def linear_mixed(x: Tensor[bf16, N, K], w: Tensor[f32, M, K], *, y: Output[f32, N, M]):
    """y = x @ w.T with an f32 weight."""
    return {"y": cast(x, f32) @ w.T}


@op
def exp_chain(x: Tensor[T, N, K], w: Tensor[T, M, K], v: Tensor[T, M, K], *, y: Output[f32, N, K]):
    """y = exp(x @ w.T) @ v, an f32 result."""
    return {"y": exp(x @ w.T) @ v}
'''

BATCH_NORM = '''
"""BatchNorm backward (training) from saved per-channel statistics: two column means over the
rows, read back by every row (column sums that are not outputs)."""
from opgen.dsl import *

B, N, C = dims("B N C")
T = dtype_var("T", f32, bf16)


@op
def batch_norm_backward(grad_y: Tensor[T, N, C], x: Tensor[T, N, C], mean_: Tensor[f32, C],
                        invstd: Tensor[f32, C], *, grad_x: Output[T, N, C]):
    """grad_x = invstd (g - mean(g) - xhat mean(g xhat)), the means over the rows."""
    g = cast(grad_y, f32)
    xhat = (cast(x, f32) - mean_[None, :]) * invstd[None, :]
    return {"grad_x": invstd[None, :] * (g - mean(g, axis=0, keepdims=True)
                                         - xhat * mean(g * xhat, axis=0, keepdims=True))}


@op
def centre_tokens(x: Tensor[T, B, N, C], *, y: Output[T, B, N, C]):
    """y = x - its mean over the batch and the tokens (a column sum over two leading axes)."""
    xf = cast(x, f32)
    return {"y": xf - mean(xf, axis=(0, 1), keepdims=True)}


@op
def token_sum(x: Tensor[T, B, N, C], *, y: Output[T, B, C]):
    """y = the sum over the tokens, a row of y per batch row."""
    return {"y": sum(cast(x, f32), axis=1)}


@op
def token_sums(x: Tensor[T, B, N, C], *, y: Output[T, B, C], yt: Output[T, C, B]):
    """The sums over the tokens, per batch row (y) and transposed (yt: not a row of y's group)."""
    xf = cast(x, f32)
    return {"y": sum(xf, axis=1), "yt": sum(xf * 2.0, axis=1).T}
'''

DROPOUT = '''
"""Dropout backward: a bool mask selects the gradient (a mask tensor read in every strip)."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16)


@op
def dropout_backward(grad_y: Tensor[T, N, D], mask: Tensor[boolean, N, D], *, grad_x: Output[T, N, D]):
    """grad_x = grad_y / (1 - p) where the mask keeps the element, else 0 (p = 0.1)."""
    return {"grad_x": where(mask, grad_y * (1.0 / 0.9), 0.0)}
'''

TRANSPOSED = '''
"""Outputs computed from transposed inputs (rows written, columns read)."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16, f16)


@op
def transpose_scale(x: Tensor[T, N, D], *, y: Output[T, D, N]):
    """y = 2 x^T."""
    return {"y": x.T * 2.0}


@op
def add_transposed(a: Tensor[T, D, N], b: Tensor[T, N, D], *, y: Output[T, D, N]):
    """y = a + b^T."""
    return {"y": a + b.T}


@op
def transpose_f64(x: Tensor[f64, N, D], *, y: Output[f64, D, N]):
    """y = 2 x^T in f64 (not staged: 16x16 tiles of strided loads)."""
    return {"y": x.T * 2.0}
'''

SOURCES = {"rank0_ops.py": RANK0, "names_ops.py": NAMES, "checks_ops.py": CHECKS, "boundary_ops.py": BOUNDARY,
           "gelu_ops.py": GELU, "gelu_tanh_ops.py": GELU_TANH, "linear_ops.py": LINEAR, "ln_ops.py": LN_CAST,
           "matmul_twice_ops.py": MATMUL_TWICE, "narrow_ops.py": NARROW, "batch_norm_ops.py": BATCH_NORM,
           "dropout_ops.py": DROPOUT, "transposed_ops.py": TRANSPOSED}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The ops above built by ``opgen build`` (CPU library) from their own ops directory."""
    with built_ops(tmp_path_factory.mktemp("newops"), "opgen_test_newops", SOURCES) as b:
        yield b


def run_both(built: dict, name: str, **args: object) -> tuple[dict, dict]:
    """(compiled CPU result, oracle result) of one call."""
    o = built["ops"][name]  # type: ignore[index]
    ref = oracle.run(o, **copied(args))
    got = runtime.call(name, lib=built["lib"], **args)  # type: ignore[arg-type]
    return got, ref


# ---------------------------------------------------------------------- erf


def gelu_inputs(rng: np.random.Generator, T: str) -> tuple[np.ndarray, np.ndarray]:
    """(grad, x): x spans the tails (|x| up to 9, where erf saturates), zeros, and +-inf/NaN."""
    x = rng.standard_normal((7, 33)) * 3
    x[0, :6] = [0.0, -0.0, 9.0, -9.0, 1e-30, -1e-30]
    x[1, :3] = [np.inf, -np.inf, np.nan]
    return rounded(rng.standard_normal((7, 33)), T), rounded(x, T)


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_exact_gelu_backward_with_erf(built, rng, T):
    """``erf`` in the DSL: the exact GELU backward, compiled, against the oracle and against
    PyTorch's ``gelu(approximate='none')`` backward in float64."""
    g, x = gelu_inputs(rng, T)
    got, ref = run_both(built, "gelu_backward", grad=g, x=x)
    xt = t64(x, requires_grad=True)
    torch.nn.functional.gelu(xt, approximate="none").backward(t64(g))
    finite = np.isfinite(f64(x))
    want = np.where(finite, xt.grad.numpy(), np.nan)  # (torch gives 0 at -inf and NaN at +inf)
    exact = oracle.run(built["ops"]["gelu_backward"], precision="f64", grad=g, x=x)
    assert_f64_close(np.where(finite, exact["dx"], np.nan), want, "dx (oracle f64)")
    same = tt(x, T, requires_grad=True)
    torch.nn.functional.gelu(same, approximate="none").backward(tt(g, T))
    keep = finite  # the C library and the oracle agree on the non-finite inputs too
    assert np.array_equal(np.isnan(f64(got["dx"])), np.isnan(f64(ref["dx"])))
    assert_close_policy(np.where(keep, f64(got["dx"]), 0.0).astype(NP[T]), np.where(keep, want, 0.0),
                        np.where(keep, same.grad.to(torch.float64).numpy(), 0.0), T, "dx (compiled)")


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_tanh_gelu_backward(built, rng, T):
    """``tanh`` (the CPU runtime's vectorised opgen_tanhf): the tanh-approximation GELU backward,
    compiled, against the oracle and PyTorch's ``gelu(approximate='tanh')`` backward in float64."""
    g = rounded(rng.standard_normal((9, 65)), T)
    x = rounded(rng.standard_normal((9, 65)) * 3, T)
    got, ref = run_both(built, "gelu_tanh_backward", grad=g, x=x)
    xt = t64(x, requires_grad=True)
    torch.nn.functional.gelu(xt, approximate="tanh").backward(t64(g))
    same = tt(x, T, requires_grad=True)
    torch.nn.functional.gelu(same, approximate="tanh").backward(tt(g, T))
    assert_close_policy(got["dx"], xt.grad.numpy(), same.grad.to(torch.float64).numpy(), T, "dx (compiled)")
    assert np.allclose(f64(got["dx"]), f64(ref["dx"]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-5)


# ---------------------------------------------------------------------- standalone matmul

DET_SCRIPT = """
import sys, numpy as np
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(7)
x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((700, 300), (90, 300), (90,)))
y = runtime.call("linear_relu", lib=lib, x=x, w=w, b=b)["y"]
sys.stdout.write(y.tobytes().hex())
"""


def test_standalone_matmul_runs_on_the_packed_gemm(built, rng):
    """A matmul outside any chain (``relu(x @ w.T + b)``) calls the packed f32 GEMM, its rows in
    parallel tasks (not a naive i-j-k loop); right for contiguous and strided operands against the
    oracle and PyTorch, and bitwise the same on 1 and 3 threads."""
    src = (built["out"] / "cpu" / "linear_relu.c").read_text()
    assert "opgen_sgemm_par(" in src
    for xt in (False, True):
        x = rounded(rng.standard_normal((300, 70)), "f32")
        x = np.ascontiguousarray(x.T).T if xt else x  # (column-major: a strided matrix)
        w, b = rounded(rng.standard_normal((45, 70)), "f32"), rounded(rng.standard_normal(45), "f32")
        got, ref = run_both(built, "linear_relu", x=x, w=w, b=b)
        want = torch.relu(t64(x) @ t64(w).T + t64(b))
        same = torch.relu(torch.tensor(x) @ torch.tensor(w).T + torch.tensor(b))
        assert_close_policy(got["y"], want.numpy(), same.double().numpy(), "f32", f"y (x transposed: {xt})")
        assert np.allclose(got["y"], ref["y"], rtol=1e-5, atol=1e-5)
    lib = str(built["root"] / "generated.build" / "cpu" / "libopgen.so")
    outs = set()
    for threads in ("1", "3"):
        env = {**os.environ, "OMP_NUM_THREADS": threads, "OMP_DYNAMIC": "false",
               "OPGEN_OPS_DIR": os.environ["OPGEN_OPS_DIR"]}
        r = subprocess.run([sys.executable, "-c", DET_SCRIPT, lib], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) == 1, "the result depends on the thread count"


def test_matmul_writes_its_epilogue_output(built, rng):
    """matmul-into-output: ``relu(x @ w.T + b)`` keeps no workspace temporary — the GEMM writes
    ``y`` and the epilogue updates it in place — right for a contiguous ``y`` (the GEMM) and a
    strided one (the general flavour's loop, the columns between untouched), against the oracle.
    A matmul whose result a second loop reads (a row sum before the elementwise output) keeps
    its temporary, and is right too."""
    from opgen.passes import pipeline

    def kernel(name: str) -> s.KernelOp:
        m = built["ops"][name].module()
        pipeline.run(m, "cpu")
        (k,) = m.body.block.ops
        return k

    k = kernel("linear_relu")
    assert not any(isinstance(o, s.AllocOp) for o in k.walk())
    (mm,) = [o for o in k.walk() if isinstance(o, s.BufferMatmulOp)]
    assert k.param_names[mm.c] == "y"
    src = (built["out"] / "cpu" / "linear_relu.c").read_text()
    assert "opgen_sgemm_par(" in src and "p_y, " in src[src.index("opgen_sgemm_par("):]
    x, w = rounded(rng.standard_normal((37, 70)), "f32"), rounded(rng.standard_normal((45, 70)), "f32")
    b = rounded(rng.standard_normal(45), "f32")
    ref = oracle.run(built["ops"]["linear_relu"], x=x, w=w, b=b)["y"]
    full = np.full((37, 90), 7.0, dtype=np.float32)
    for y in (np.zeros((37, 45), np.float32), full[:, ::2]):
        got = runtime.call("linear_relu", lib=built["lib"], x=x, w=w, b=b, y=y)["y"]
        assert np.allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert np.all(full[:, 1::2] == 7.0)
    k2 = kernel("matmul_twice")
    assert any(isinstance(o, s.AllocOp) and any(isinstance(u.operation, s.BufferMatmulOp) for u in o.result.uses)
               for o in k2.walk())
    got, ref2 = run_both(built, "matmul_twice", x=x, w=w)
    z = t64(x) @ t64(w).T
    for name, want in (("y", 2 * z - z.sum(-1, keepdim=True)), ("s", z.sum(-1))):
        assert np.allclose(got[name], ref2[name], rtol=1e-4, atol=1e-3), name
        assert np.allclose(f64(got[name]), want.numpy(), rtol=1e-4, atol=1e-3), name


# ---------------------------------------------------------------------- streams (software prefetch)


def _after(op: s.ForOp) -> list[object]:
    """The ops after ``op`` in its block."""
    ops = list(op.parent_block().ops)
    return ops[ops.index(op) + 1:]


def test_stream_loops_prefetch_rows_read_first(built):
    """map-cpu's ``stream`` loops: an inner elementwise loop over rows prefetches exactly the
    caller rows it reads first (not its output, not a row a sibling loop has just read), in strips
    of one 64-byte line per instance (16 f32, 32 bf16 elements), then a tail."""
    from opgen.emit import cpu
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    def stream_loops(name: str) -> list[s.ForOp]:
        m = built["ops"][name].module()
        pipeline.run(m, "cpu")
        loops = [o for o in m.walk() if isinstance(o, s.ForOp)]
        for o in loops:  # prefetches sit in stream loops only, before the body's work
            hints = [x for x in o.body.block.ops if isinstance(x, s.PrefetchOp)]
            assert bool(hints) == (cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM)
            assert all(x.ahead.data in (0, cpu_map.PREFETCH_AHEAD) and x.idx[-1] is o.iv for x in hints)
        return [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM]

    (loop,) = stream_loops("gelu_backward")
    k = loop.parent_op()
    while not isinstance(k, s.KernelOp):
        k = k.parent_op()
    names = k.param_names
    hints = [x for x in loop.body.block.ops if isinstance(x, s.PrefetchOp)]
    assert sorted(names[x.buf] for x in hints) == ["grad", "x"]  # read rows, once each; never dx
    assert all(x.ahead.data == cpu_map.PREFETCH_AHEAD for x in hints)  # (ahead in the row they read)
    text = cpu.op_source(built["ops"]["gelu_backward"])
    f32 = text[text.index("k_gelu_backward_f32_u("):]
    bf16 = text[text.index("k_gelu_backward_bf16_u("):]
    assert "+ 64 <= d_D; " in f32[:f32.index("return OPGEN_SUCCESS")]  # (four strips of 16 a step: copies)
    assert "+ 64 <= d_D; " in bf16[:bf16.index("return OPGEN_SUCCESS")]  # (two strips of 32)
    assert text.count("OPGEN_PREFETCH(p_grad, ") == text.count("OPGEN_PREFETCH(p_x, ") > 0
    assert "OPGEN_PREFETCH(p_dx" not in text and "OPGEN_PREFETCH_W(" not in text  # (one pass: no write hint)


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("n", [1, 31, 32, 33, 95, 129])
def test_staged_stores(built, rng, T, n):
    """map-cpu's staged stores: the stream loop's store into a caller row (GELU backward's dx, an
    output it never reads: ``nontemporal``) is marked; both instances keep a strip's values (in
    f32) and store them a strip at a time (``opgen_bf16_store_strip`` rounding them,
    ``opgen_f32_store_strip``; in both stride flavours), streaming when dx is large (``nt_p_dx``).
    Against the oracle over row lengths around the strip of 32, contiguous and with strided rows
    (the general flavour), with no element written outside dx's view."""
    from opgen.emit import cpu
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    m = built["ops"]["gelu_backward"].module()
    pipeline.run(m, "cpu")
    (loop,) = [o for o in m.walk() if isinstance(o, s.ForOp) and cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM]
    (st,) = [o for o in loop.body.block.ops if isinstance(o, s.StoreOp)]
    assert cpu_map.cpu_mapping(st) == s.CpuMapping.NONTEMPORAL
    assert not [o for o in m.walk() if isinstance(o, s.StoreOp) and o is not st
                and cpu_map.cpu_mapping(o) in (s.CpuMapping.STAGED, s.CpuMapping.NONTEMPORAL)]
    text = cpu.op_source(built["ops"]["gelu_backward"])
    body = {f: text[text.index(f"k_gelu_backward_{f}("):] for f in ("f32_u", "f32_g", "bf16_u", "bf16_g")}
    body = {f: b[:b.index("return OPGEN_SUCCESS")] for f, b in body.items()}
    assert "opgen_bf16_store_strip(&p_dx[" in body["bf16_u"] and ", 1, stg" in body["bf16_u"]
    assert "opgen_f32_store_strip(&p_dx[" in body["f32_u"] and ", 1, stg" in body["f32_u"]
    assert "st_dx_1, stg" in body["bf16_g"] and "st_dx_1, stg" in body["f32_g"]
    assert all(", nt_p_dx);" in b for b in body.values())
    x = rounded(rng.standard_normal((2, n)) * 3, T)
    g = rng.standard_normal((2, n))
    g[1] *= 1e-39  # (row 1's results are denormal: the instruction alone would flush them to zero)
    g = rounded(g, T)
    ref = oracle.run(built["ops"]["gelu_backward"], grad=g, x=x)["dx"]
    assert np.count_nonzero(f64(ref)[1]) > n // 2
    for strided in (False, True):
        big = np.full((2, 2 * n + 3), 7.0, dtype=ref.dtype)
        dx = big[:, 1:2 * n + 1:2] if strided else big[:, 1:n + 1]
        got = f64(runtime.call("gelu_backward", lib=built["lib"], grad=g, x=x, dx=dx)["dx"])
        for r in (0, 1):
            scale = np.abs(f64(ref)[r]).max()
            tol = 1e-2 if T == "bf16" else 1e-4  # (relative to the row's largest: GELU' cancels near -0.75)
            assert np.allclose(got[r], f64(ref)[r], rtol=tol, atol=tol * scale), (r, strided)
        assert np.array_equal(got[1] != 0, f64(ref)[1] != 0)
        untouched = np.ones(big.shape, bool)
        untouched[:, 1:2 * n + 1:2 if strided else 1][:, :n] = False
        assert np.all(f64(big)[untouched] == 7.0)


def test_nontemporal_stores_only_into_outputs_never_read(built):
    """map-cpu's ``nontemporal`` stores: every store into an output the kernel only writes, row by
    row (GELU's dx, LayerNorm's grad_x; embedding backward's rows, zeros and sums, from two loops,
    whose ``simd`` loops become streams), and nothing else: not a rank-1 output (LayerNorm's
    grad_w), not an output a matmul writes and its epilogue reads back (the linear layer's). The
    parallel loop around streaming stores is a region that fences them on each thread; the
    write prefetch of a second pass runs only when grad_x does not stream."""
    from opgen import registry
    from opgen.emit import cpu
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    def marked(o: object) -> dict[str, list[str]]:
        m = o.module()
        pipeline.run(m, "cpu")
        out: dict[str, list[str]] = {}
        for k in (x for x in m.walk() if isinstance(x, s.KernelOp)):
            for st in (x for x in k.walk() if isinstance(x, s.StoreOp) and x.buf in k.param_names):
                out.setdefault(k.param_names[st.buf], []).append(cpu_map.cpu_mapping(st) or "")
                if cpu_map.cpu_mapping(st) == s.CpuMapping.NONTEMPORAL:
                    assert cpu_map.cpu_mapping(st.parent_op()) == s.CpuMapping.STREAM
        return out

    assert marked(built["ops"]["gelu_backward"]) == {"dx": ["nontemporal"]}
    ln = marked(built["ops"]["ln_cast_backward"])
    assert set(ln["grad_x"]) == {"nontemporal"} and "nontemporal" not in ln["grad_w"] + ln["grad_b"]
    saved = os.environ.pop("OPGEN_OPS_DIR")  # (the seeds' registry, for a moment)
    registry.load_all.cache_clear()
    try:
        seed = registry.get("embedding_dense_backward")
    finally:
        os.environ["OPGEN_OPS_DIR"] = saved
        registry.load_all.cache_clear()
    assert set(marked(seed)["out"]) == {"nontemporal"}
    assert not any("nontemporal" in v for v in marked(built["ops"]["linear_relu"]).values())
    text = cpu.op_source(built["ops"]["ln_cast_backward"])
    body = text[text.index("k_ln_cast_backward_f32_u("):]
    body = body[:body.index("return OPGEN_SUCCESS")]
    assert "if (!nt_p_grad_x) OPGEN_PREFETCH_W(p_grad_x, " in body
    assert body.count("#pragma omp parallel num_threads(opgen_team())") == body.count("opgen_stream_fence();") == 1
    assert "#pragma omp for schedule(static) nowait" in body


def test_streaming_only_into_large_resident_outputs():
    """opgen_nt: an output streams from opgen_nt_bytes() on (the last-level cache, at most 32 MiB;
    OPGEN_NT_BYTES unset here) and only when its pages are resident: a fresh 64 MiB allocation
    (untouched) does not, the same memory once written does, 64 KiB written does not."""
    import ctypes

    lib = runtime.load()
    lib.opgen_nt.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.opgen_nt_bytes.restype = ctypes.c_size_t
    if "OPGEN_NT_BYTES" in os.environ:
        pytest.skip("OPGEN_NT_BYTES set by the caller")
    assert 0 < lib.opgen_nt_bytes() <= 32 << 20
    fresh = np.empty(64 << 20, np.uint8)
    assert lib.opgen_nt(fresh.ctypes.data, fresh.nbytes) == 0
    fresh.fill(1)
    assert lib.opgen_nt(fresh.ctypes.data, fresh.nbytes) == 1
    assert lib.opgen_nt(fresh.ctypes.data, 64 << 10) == 0  # (below any last-level cache)
    assert lib.opgen_nt(None, fresh.nbytes) == 0


NT_WORKER = """
import pickle, sys
import numpy as np
from opgen import runtime
src, dst = sys.argv[1:3]
with open(src, "rb") as f:
    cases = pickle.load(f)
results = []
for lib, op, args, outs in cases:
    got = {}
    for offset in (0, 1):  # (an output 64-byte aligned, and one element past: no line is whole)
        a = dict(args)
        for name, (shape, dtype) in outs.items():
            flat = np.full(int(np.prod(shape)) + 32, 7, dtype=dtype)
            base = (-flat.ctypes.data // flat.itemsize) % (64 // flat.itemsize)
            a[name] = flat[base + offset:base + offset + int(np.prod(shape))].reshape(shape)
        r = runtime.call(op, lib=runtime.load(lib), **a)
        got[offset] = {k: np.asarray(v).copy() for k, v in r.items()}
    results.append(got)
with open(dst, "wb") as f:
    pickle.dump(results, f)
"""


def nt_worker_runs(cases: list[tuple[str, str, dict, dict]], env: dict[str, str], tmp: Path) -> list[dict]:
    """Each case's (library path, op, arguments, outputs' shapes and dtypes) results — per output
    offset, 64-byte aligned (0) and one element past (1) — from one fresh worker process under
    ``env`` (:data:`NT_WORKER`; the streaming threshold is read once a process)."""
    import pickle

    src, dst = tmp / "nt_cases.pkl", tmp / "nt_results.pkl"
    src.write_bytes(pickle.dumps(cases))
    r = subprocess.run([sys.executable, "-c", NT_WORKER, str(src), str(dst)], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return pickle.loads(dst.read_bytes())


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
def test_streaming_stores_give_the_same_bits(built, rng, tmp_path, T):
    """With every output streaming (OPGEN_NT_BYTES=0, in a fresh process: the threshold is read
    once) the results are bitwise those of the cached stores (small outputs: never streaming), on
    2 threads, for outputs 64-byte aligned and not (whose rows run one element at a time up to a
    line, and whose strips that are no whole line fall back to plain stores), rows
    around the strip of 16 and 32: GELU backward, LayerNorm backward, the seeds embedding and
    RMSNorm backward, and a transpose (every input counts as larger than the cache too: its tiles
    prefetch the next one, sched.prefetch_share)."""

    from opgen import registry

    seeds = str(registry.REPO_ROOT / "build" / "cpu" / "libopgen.so")
    newops = str(built["root"] / "generated.build" / "cpu" / "libopgen.so")
    cases = []
    for n in (1, 16, 33, 64):
        x = rounded(rng.standard_normal((5, n)), T)
        g = rounded(rng.standard_normal((5, n)), T)
        if T != "f16":
            cases.append((newops, "gelu_backward", {"grad": g, "x": x}, {"dx": ((5, n), x.dtype)}))
            outs = {"grad_x": ((5, n), x.dtype), "grad_w": ((n,), x.dtype), "grad_b": ((n,), x.dtype)}
            cases.append((newops, "ln_cast_backward", ln_cast_args(rng, T, (5, n)), outs))
        w = rounded(rng.standard_normal(n), T)
        cases.append((seeds, "rms_norm_backward", {"grad_y": g, "x": x, "w": w, "eps": 1e-6},
                      {"grad_x": ((5, n), x.dtype), "grad_w": ((n,), x.dtype)}))
        idx = np.array([3, 0, 3, 6, 1], np.int64)
        cases.append((seeds, "embedding_dense_backward",
                      {"grad": g, "indices": idx, "num_weights": 7, "scale_grad_by_freq": n % 2 == 1},
                      {"out": ((7, n), x.dtype)}))
    for shape in ((5, 33), (300, 1030)):  # (every input "large": the next tiles prefetched too, several tiles)
        x = rounded(rng.standard_normal(shape), T)
        cases.append((newops, "transpose_scale", {"x": x}, {"y": (shape[::-1], x.dtype)}))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OMP_DYNAMIC": "false",
           "PYTHONPATH": str(registry.REPO_ROOT)}
    runs: dict[str, list[dict]] = {"0": [], str(1 << 40): []}
    for lib in (seeds, newops):  # (one worker per library and threshold; the seeds' ops in no ops dir)
        some = [c for c in cases if c[0] == lib]
        for nt in runs:
            penv = {**env, "OPGEN_NT_BYTES": nt}
            if lib == seeds:
                penv.pop("OPGEN_OPS_DIR", None)
            runs[nt] += nt_worker_runs(some, penv, tmp_path)
    cases = [c for lib in (seeds, newops) for c in cases if c[0] == lib]  # (the runs' order)
    for i, (_, op, args, _) in enumerate(cases):
        for offset in (0, 1):
            for k, v in runs["0"][i][offset].items():
                want = runs[str(1 << 40)][i][offset][k]
                assert np.array_equal(v.view(np.uint8), want.view(np.uint8)), (op, k, offset, args["grad" if "grad" in
                                                                                            args else "grad_y"].shape)


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_column_sums_run_in_strips_of_columns(built, rng, T):
    """column-strips: LayerNorm backward's grad_w and grad_b (sums of the 32-row partials down
    each column) run over strips of 64 columns, each column's rows summed in a lane of a local
    row (a ``simd`` loop) instead of one column at a time down a strided serial loop; the old
    shape is gone. Against the oracle for widths around the strip (1, 63, 64, 65, 130) and row
    counts across several partials, and the same bits on 1 and 2 threads."""
    from opgen.lower import column_strips, cpu_map
    from opgen.passes import pipeline

    m = built["ops"]["ln_cast_backward"].module()
    pipeline.run(m, "cpu")
    (k,) = m.body.block.ops
    sums = [o for o in k.body.block.ops if isinstance(o, s.ForOp) and cpu_map.cpu_mapping(o) == s.CpuMapping.OMP_FOR
            and any(isinstance(x, s.AllocOp) and tuple(s.buf_type(x.result).shape) == (str(column_strips.WIDTH),)
                    for x in x_ops(o))]
    assert sums, "no column sum in strips"
    for o in sums:
        rows = [x for x in o.body.block.ops if isinstance(x, s.ForOp) and x.kind.data == "serial"]
        assert rows and all(cpu_map.cpu_mapping(y) == s.CpuMapping.SIMD for r in rows for y in r.body.block.ops
                            if isinstance(y, s.ForOp))
    assert not any(column_strips._shape(o) for o in m.walk() if isinstance(o, s.ForOp))
    lib = built["lib"]
    gomp = ctypes.CDLL("libgomp.so.1")
    for n, d in ((70, 1), (33, 63), (64, 64), (100, 65), (5, 130)):
        a = ln_cast_args(rng, T, (n, d))
        got, ref = run_both(built, "ln_cast_backward", **a)
        for k_ in ("grad_x", "grad_w", "grad_b"):
            assert np.allclose(f64(got[k_]), f64(ref[k_]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4), (k_, n, d)
        gomp.omp_set_num_threads(1)
        try:
            one = runtime.call("ln_cast_backward", lib=lib, **a)
        finally:
            gomp.omp_set_num_threads(2)
        for k_ in ("grad_w", "grad_b"):
            assert np.array_equal(f64(one[k_]), f64(got[k_])), (k_, n, d)


def x_ops(o: s.ForOp) -> list[object]:
    """The ops directly in ``o``'s body."""
    return list(o.body.block.ops)


def test_second_pass_over_a_row_prefetches_the_next_row(built):
    """LayerNorm backward: the row sums (a lanes loop) read grad_y and x first; the sibling loop
    computing grad_x re-reads them from cache, so instead of its own row it prefetches the same
    columns of the row the next iteration reads (clamped to the tensor's rows: a group's last row
    names the next group's first, the tensor's last row itself), which the row sums read next —
    in every instance, bf16 as f32; the row sums prefetch nothing. w (one row for all) is never
    prefetched, and the output only for writing, 2 KiB ahead in its own row (a second pass); the
    row sums' loop itself is not a stream."""
    from opgen.emit import cpu
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    m = built["ops"]["ln_cast_backward"].module()
    pipeline.run(m, "cpu")
    (k,) = m.body.block.ops
    names = k.param_names
    loops = [o for o in m.walk() if isinstance(o, s.ForOp)]
    streams = [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM]
    rows = [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.LANES]
    # (jam-rows: a loop over pairs of rows, both rows' sums (one loop: fuse-reductions-2) then
    # one second pass; the original loop for the row left over: tests/test_jam_rows.py)
    assert len(streams) == 2 and rows
    for loop, jammed in zip(streams, (2, 1), strict=True):
        outer = loop.parent_op()
        sums = [o for o in rows if o.parent_op() is outer]
        assert len(sums) == 1 and loop in _after(sums[0])
        before = list(outer.body.block.ops)[:list(outer.body.block.ops).index(loop)]
        writes = [x for x in loop.body.block.ops if isinstance(x, s.PrefetchOp) and x.write is not None]
        stores = [x for x in loop.body.block.ops if isinstance(x, s.StoreOp) and s.buf_type(x.buf).role.data == "out"]
        assert len(writes) == len(stores) == jammed  # (the column sums' stores: combine-accums)
        for st in stores:  # (its output, owned ahead in the row it writes)
            (write,) = [w for w in writes if list(w.idx) == list(st.idx)]
            assert names[write.buf] == "grad_x" and write.ahead.data == cpu_map.PREFETCH_AHEAD
        hints = [x for x in loop.body.block.ops if isinstance(x, s.PrefetchOp) and x.write is None]
        assert sorted(names[x.buf] for x in hints) == sorted(["grad_y", "x"] * jammed)
        for h in hints:
            assert h.ahead.data == 0 and h.idx[-1] is loop.iv and h.span is None
            # the row the next iteration reads (its expression at r + 1), clamped to the tensor's
            # rows, max(min(row, rows - 1), 0), computed before the loop
            clamp = h.idx[-2].owner
            assert isinstance(clamp, ir.MaxOp) and clamp in before and ir.constant_int(clamp.rhs) == 0
            below = clamp.lhs.owner
            top = below.rhs.owner
            assert isinstance(below, ir.MinOp) and isinstance(top, ir.SubOp) and ir.constant_int(top.rhs) == 1
            assert isinstance(top.lhs.owner, ir.DimOp) and top.lhs.owner.dim.data == s.buf_type(h.buf).shape[-2]
            (nxt,) = {o for o in _operand_ops(below.lhs) if isinstance(o, ir.AddOp) and o.lhs is outer.iv}
            assert ir.constant_int(nxt.rhs) == 1
    text = cpu.op_source(built["ops"]["ln_cast_backward"])
    assert "OPGEN_PREFETCH(p_w" not in text and "OPGEN_PREFETCH(p_grad_x" not in text
    assert text.count("OPGEN_PREFETCH_W(p_grad_x, ") == text.count("OPGEN_PREFETCH_W(") > 0
    for T in ("f32", "bf16"):
        body = text[text.index(f"k_ln_cast_backward_{T}_u("):]
        body = body[:body.index("return OPGEN_SUCCESS")]
        sums = body[:body.index("[l + 8];")]  # (the row sums' strips, up to their lanes' combination)
        assert "OPGEN_PREFETCH(p_grad_y, " not in sums
        assert body.count("OPGEN_PREFETCH(p_grad_y, ") == body.count("OPGEN_PREFETCH(p_x, ") == 3  # (2 + 1 rows)


def _operand_ops(v: SSAValue) -> list[Operation]:
    """The ops computing ``v``, transitively."""
    out, todo = [], [v]
    while todo:
        op = todo.pop().owner
        if isinstance(op, Operation):
            out.append(op)
            todo.extend(op.operands)
    return out


def test_every_output_element_is_written(built):
    """The ops of this file (odd names, checks, rank 0, boundary conversions, GELU, linear,
    LayerNorm, two matmuls, narrow) write every element of every output they do not read: the
    Python API allocates those uninitialised (tests/outputs_written.py). ``new`` has an output
    named ``workspace``: runtime.call once took that keyword for itself and left the given
    buffer unwritten. normalize_positive needs a positive sum."""
    from tests.outputs_written import assert_every_output_written

    x = np.abs(np.random.default_rng(0).standard_normal(37)).astype(np.float32) + 0.1
    assert_every_output_written(built["ops"], built["lib"], {"normalize_positive": [{"x": x}]})


def test_lane_reductions_run_in_full_width_vectors(built, tmp_path):
    """A row sum split into lanes (map-cpu's ``lanes``) has 16 lanes in f32 and 32 where it reads
    bf16, and the C compiler runs each such loop in 64-byte vectors: with 16 lanes of bf16 it
    chose 32-byte vectors for the f32 arithmetic too (half the width). LayerNorm backward, the
    kernels that run vectorised (not the O1 fallbacks for any strides); bf16's 32 lanes run as
    16 pairs (cpu_map.paired), a vector of firsts and one of seconds."""
    import re

    from opgen.compile import CFLAGS
    from opgen.emit import cpu

    text = cpu.op_source(built["ops"]["ln_cast_backward"])
    src = tmp_path / "ln.c"
    src.write_text(text)
    lines = text.splitlines()
    loops: dict[int, tuple[str, int]] = {}  # line -> (instance, lanes)
    inst, o1 = "", False
    for n, line in enumerate(lines, 1):
        if m := re.match(r'(__attribute__\(\(optimize\("O1"\)\)\) )?static opgen_status_t k_ln_cast_backward_(\w+?)_',
                         line):
            o1, inst = bool(m.group(1)), m.group(2)
        m = re.fullmatch(r"\s*for \(int l = 0; l < (\d+); l\+\+\) \{", line)
        if not m or o1:
            continue
        if re.fullmatch(r"\s*const int64_t i\d+ = r\d+ \+ l;", lines[n]):  # (a lanes loop)
            loops[n] = (inst, int(m.group(1)))
        elif re.fullmatch(r"\s*const int64_t i\d+ = r\d+ \+ 2 \* l; \(void\)i\d+;", lines[n]):
            end = lines.index(line[:len(line) - len(line.lstrip())] + "}", n)
            if any(re.search(r"lane\d+\[l \+ 16\] \+= ", x) for x in lines[n:end]):  # (a bf16 one in pairs)
                loops[n] = (inst, 2 * int(m.group(1)))
    assert sorted(set(loops.values())) == [("bf16", 32), ("f32", 16)]
    inc = [f"-I{built['out'] / 'include'}", f"-I{built['out'] / 'cpu'}"]
    r = subprocess.run([cc.compiler(), *[f for f in CFLAGS if f != "-fPIC"], *inc, "-c", str(src), "-o", os.devnull,
                        "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    for n, (inst, lanes) in loops.items():  # (under `omp simd` GCC reports the loop at its body's first line)
        assert any((f"ln.c:{n}:" in x or f"ln.c:{n + 1}:" in x) and "loop vectorized using 64 byte vectors" in x
                   for x in r.stderr.splitlines()), \
            f"{inst} lanes loop at line {n} ({lanes} lanes) is not in 64-byte vectors:\n{r.stderr[-3000:]}"


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("n", [1, 2, 31, 33, 64])
def test_next_row_prefetch_at_the_last_row(built, rng, T, n):
    """Every row count around the row groups of 32 (a group's last row prefetches the next
    group's first, the tensor's last row itself): LayerNorm backward against the oracle,
    contiguous and with a Batch dim over strided rows."""
    for strided in (False, True):
        a = ln_cast_args(rng, T, (2 * n if strided else n, 40))
        if strided:
            a = {k: (v[::2] if k in ("grad_y", "x", "mean_", "rstd") else v) for k, v in a.items()}
        got, ref = run_both(built, "ln_cast_backward", **a)
        for k_ in ("grad_x", "grad_w", "grad_b"):
            assert np.allclose(f64(got[k_]), f64(ref[k_]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4), (k_, n)


def test_independent_inner_loops_are_vector_loops(built):
    """map-cpu's ``simd`` loops: LayerNorm backward's grad_x loop (each iteration stores grad_x and
    adds to the column partials at its own index) runs under ``#pragma omp simd`` in the
    vectorisable flavour, so that GCC vectorises it in f32 too (inside an OpenMP region it loses
    ``restrict`` and gave up on its alias checks); loops carrying a scalar, or holding a loop, are
    never marked (but a ``lanes`` loop's whole strips: each lane its own accumulator); the O1
    general-stride flavour prints no pragma."""
    from opgen.emit import cpu
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    m = built["ops"]["ln_cast_backward"].module()
    pipeline.run(m, "cpu")
    loops = [o for o in m.walk() if isinstance(o, s.ForOp)]
    simd = [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.SIMD]
    streams = [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM]
    stores = {x.buf for o in simd + streams for x in o.body.block.ops if isinstance(x, s.StoreOp)}
    k = next(o for o in m.walk() if isinstance(o, s.KernelOp))
    names = k.param_names
    assert "grad_x" in {names.get(b) for b in stores}
    for o in loops:
        marked = cpu_map.cpu_mapping(o) in (s.CpuMapping.SIMD, s.CpuMapping.STREAM)
        p, in_parallel = o.parent_op(), False
        while p is not None:
            in_parallel |= isinstance(p, s.ForOp) and p.kind.data == "parallel"
            p = p.parent_op()
        assert marked == (in_parallel and cpu_map.independent(o)), o
        if marked:
            assert not any(isinstance(x, s.ForOp) for x in o.body.block.ops)
            assert all(any(i is o.iv for i in x.idx) for x in o.body.block.ops if isinstance(x, s.StoreOp | s.AccumOp))
    text = cpu.op_source(built["ops"]["ln_cast_backward"])
    fast, general = text[text.index("k_ln_cast_backward_f32_u("):], text[text.index("k_ln_cast_backward_f32_g("):]
    fast, general = fast[:fast.index("return OPGEN_SUCCESS")], general[:general.index("return OPGEN_SUCCESS")]
    # (a stream loop runs its strips and its tail each under the pragma, and one whose output streams
    # also the elements before its row's first line)
    peeled = sum(any(isinstance(x, s.StoreOp) and cpu_map.cpu_mapping(x) == s.CpuMapping.NONTEMPORAL
                     for x in o.body.block.ops) for o in streams)
    assert peeled == 2  # (grad_x: jam-rows' loop over two rows, and the original loop's for the row left over)
    lanes = [o for o in loops if cpu_map.cpu_mapping(o) == s.CpuMapping.LANES]  # (their whole strips)
    assert fast.count("#pragma omp simd") == len(simd) + 2 * len(streams) + peeled + len(lanes)
    assert "#pragma omp simd" not in general


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_stream_loops_at_every_strip_boundary(built, rng, T):
    """Rows of every length around the strips (16 f32, 32 bf16 elements: whole strips, a tail, a
    tail alone), contiguous and strided (the general flavour), against the oracle."""
    for d in (1, 15, 16, 17, 31, 32, 33, 47, 64, 65, 100):
        g = rounded(rng.standard_normal((3, d)), T)
        x = rounded(rng.standard_normal((3, 2 * d)) * 3, T)
        for xs in (np.ascontiguousarray(x[:, :d]), x[:, ::2]):
            got, ref = run_both(built, "gelu_tanh_backward", grad=g, x=xs)
            assert got["dx"].shape == (3, d)
            assert np.allclose(f64(got["dx"]), f64(ref["dx"]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-5), d


# ---------------------------------------------------------------------- fusion through casts


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_column_sums_behind_a_cast_stay_in_the_row_loop(built, rng, T):
    """``cast(sum(gy * xhat, axis=0), T)`` is still a column sum of the row group: summed as
    partials inside the one row loop (not a second, column-strided pass over the rows), and
    right against the oracle and PyTorch's layer_norm backward."""
    from opgen.passes import pipeline

    m = built["ops"]["ln_cast_backward"].module()
    pipeline.run(m, "cpu")
    (k,) = m.body.block.ops
    top = [o for o in k.body.block.ops if isinstance(o, s.ForOp)]
    parts = [o for o in k.body.block.ops if isinstance(o, s.AllocOp) and s.buf_type(o.result).shape[0] == "cdiv(N,32)"]
    assert len(parts) == 2 and len(top) == 3  # the row loop, then one combine per column sum
    a = ln_cast_args(rng, T, (37, 70))
    got, ref = run_both(built, "ln_cast_backward", **a)
    xt, wt, gt = t64(a["x"], True), t64(a["w"], True), t64(a["grad_y"])
    bt = torch.zeros(70, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.layer_norm(xt, (70,), wt, bt, eps=1e-5).backward(gt)
    for k_, want in (("grad_x", xt.grad), ("grad_w", wt.grad), ("grad_b", bt.grad)):
        assert np.allclose(f64(got[k_]), f64(ref[k_]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4), k_
        assert np.allclose(f64(got[k_]), want.numpy(), rtol=1e-3 if T == "f32" else 3e-2,
                           atol=1e-3 if T == "f32" else 5e-2), k_


# ---------------------------------------------------------------------- rank-0 tensors

@pytest.mark.parametrize("T", ["f16", "bf16", "f32", "f64"])
def test_rank0_tensor_of_a_dtype_variable(built, rng, T):
    x = rounded(rng.standard_normal((5, 7)), T)
    g = rounded(-2.75, T)
    got, ref = run_both(built, "scale_by", g=g, x=x)
    assert np.array_equal(got["dx"], ref["dx"]), "the rank-0 input must be read, not taken as 0"
    assert np.array_equal(ref["dx"].astype(np.float64), (t64(g) * t64(x)).to(torch.float64).numpy()
                          .astype(NP[T]).astype(np.float64))


@pytest.mark.parametrize("I", ["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"])
@pytest.mark.parametrize("flag", [True, False])
def test_rank0_integer_and_bool_tensors(built, rng, I, flag):  # noqa: E741
    idx = rng.integers(0, 100, 9).astype(NP[I])
    off = np.asarray(3, NP[I])
    got, ref = run_both(built, "shift_by", off=off, idx=idx, flag=np.asarray(flag))
    assert np.array_equal(got["out"], ref["out"])
    assert np.array_equal(ref["out"], idx + off if flag else idx)


def test_cross_entropy_backward_with_a_rank0_grad(built, rng):
    """The outside report: grad_loss read as 0 gave all-zero gradients."""
    logits = rounded(rng.standard_normal((6, 11)) * 3, "f32")
    target = rng.integers(0, 11, 6)
    g = np.asarray(1.75, np.float32)
    got, ref = run_both(built, "ce_backward", grad_loss=g, logits=logits, target=target)
    lt = t64(logits, requires_grad=True)
    (torch.nn.functional.cross_entropy(lt, torch.tensor(target)) * 1.75).backward()
    assert np.abs(got["dlogits"]).max() > 0.01
    assert_close_policy(got["dlogits"], lt.grad, ref["dlogits"], "f32", "dlogits (compiled)")
    exact = oracle.run(built["ops"]["ce_backward"], precision="f64", grad_loss=g, logits=logits, target=target)
    assert_f64_close(exact["dlogits"], lt.grad, "dlogits (oracle f64)")


def test_rank0_output_and_reductions_used_later(built, rng):
    x = rounded(rng.random((9, 13)) + 0.5, "f32")
    got, ref = run_both(built, "total", x=x)
    assert got["s"].shape == () and abs(float(got["s"]) - float(t64(x).sum())) < 1e-4
    got, ref = run_both(built, "normalize", x=x)
    assert_close_policy(got["y"], (t64(x) / t64(x).sum()).numpy(), ref["y"], "f32", "x / sum(x)")
    valid = rng.random(10) < 0.5
    valid[0] = True
    got, ref = run_both(built, "masked_mean_backward", g=np.asarray(3.0, np.float32), valid=valid)
    want = np.where(valid, 3.0 / valid.sum(), 0.0)
    assert_close_policy(got["dx"], want, ref["dx"], "f32", "masked mean backward")


# ---------------------------------------------------------------------- names

def test_names_that_collide_with_c(built, rng):
    a, el, dm, it = (rounded(rng.standard_normal((4, 6)), "f32") for _ in range(4))
    null = rounded(rng.standard_normal(6), "f32")
    got, ref = run_both(built, "new", a=a, l=el, dims=dm, int=it, NULL=null, exp=1.5, size=3, ws=False)
    want = a * 3.0
    assert np.array_equal(ref["sc"], want)
    assert np.allclose(got["sc"], ref["sc"]) and np.allclose(got["workspace"], ref["workspace"], atol=1e-5)
    got, ref = run_both(built, "new", a=a, l=el, dims=dm, int=it, NULL=null)
    assert np.allclose(got["sc"], ref["sc"], atol=1e-6)
    x, dn, e = (rounded(rng.standard_normal(5), "f32") for _ in range(3))
    for extra in ({}, {"expf": e}):
        got, ref = run_both(built, "collide", x=x, d_N=dn, st_x_0=2.0, errno=0.25, **extra)
        assert np.allclose(got["out"], ref["out"], atol=1e-6)


def test_public_header_renames_reserved_parameter_names(built):
    header = (built["out"] / "include" / "opgen.h").read_text()
    assert "const opgen_tensor_t *int_," in header and "const opgen_tensor_t *NULL_," in header
    assert "int64_t size_," in header and "const opgen_tensor_t *workspace_," in header
    assert "const opgen_tensor_t *a," in header  # ordinary names stay as written


def test_headers_compile_as_c_and_cxx(built, tmp_path):
    inc = built["out"] / "include"
    src = tmp_path / "use.c"
    src.write_text('#include "opgen.h"\nint main(void) { return (int)sizeof(&opgen_new); }\n')
    for tool, std in ((cc.compiler(), "-std=c11"), ("g++", "-std=c++17")):
        lang = ["-x", "c++"] if tool == "g++" else []
        r = subprocess.run([tool, std, *lang, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{inc}", str(src)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------- checks on data

def test_check_on_tensor_data(built, rng):
    table = rounded(rng.standard_normal(8), "f32")
    t = np.array([0, 7, 3, 99, -5], np.int32)
    skip = np.array([False, False, False, True, True])
    got, ref = run_both(built, "take_rows", table=table, t=t, skip=skip)
    assert np.array_equal(got["out"], ref["out"])
    assert np.array_equal(ref["out"], np.where(skip, 0.0, table[np.where(skip, 0, t)]).astype(np.float32))
    skip[3] = False
    out = np.full(5, 9.0, np.float32)
    for run in (lambda: oracle.run(built["ops"]["take_rows"], table=table, t=t, skip=skip),
                lambda: runtime.call("take_rows", lib=built["lib"], table=table, t=t, skip=skip, out=out)):
        with pytest.raises(OpError) as e:
            run()
        assert e.value.status == "index" and "t out of [0, V)" in e.value.message
    assert (out == 9.0).all(), "a failed check must write nothing"


def test_check_on_a_reduction(built, rng):
    x = rounded(rng.random(6) + 0.1, "f32")
    got, ref = run_both(built, "normalize_positive", x=x)
    assert np.allclose(got["y"], x / x.sum(dtype=np.float64), rtol=1e-6)
    assert np.allclose(ref["y"], x / x.sum(dtype=np.float64), rtol=1e-6)
    y = np.full(6, 5.0, np.float32)
    for run in (lambda: oracle.run(built["ops"]["normalize_positive"], x=-x),
                lambda: runtime.call("normalize_positive", lib=built["lib"], x=-x, y=y)):
        with pytest.raises(OpError) as e:
            run()
        assert e.value.status == "param" and "must be positive" in e.value.message
    assert (y == 5.0).all()


# ---------------------------------------------------------------------- boundary conversion

def test_casts_move_to_the_boundary(built):
    """``keep`` is read only as bool (through a broadcast), ``at`` only as i64: their kernels are
    instantiated per compute type (S) alone. ``shift_by`` reads its integers as data: one kernel
    per integer dtype, as before."""
    from opgen.emit import cpu

    for name, want, dvars in (("keep_rows", {"keep": "bool"}, ["S"]), ("pick", {"at": "i64"}, ["S"]),
                              ("shift_by", {}, ["I"])):
        for k in cpu.kernels(built["ops"][name]).values():
            assert k.converted == want and list(k.dtype_var_map()) == dvars, name
    src = (built["out"] / "cpu" / "pick.c").read_text()
    assert src.count("static size_t k_pick_") == 2  # f32 and f64, whatever the index dtype


def _layouts(a: np.ndarray) -> list[np.ndarray]:
    """``a`` contiguous, transposed in memory (leading axes that cannot be coalesced, last
    stride > 1), and every element reversed (negative strides)."""
    t = np.ascontiguousarray(a.T).T
    r = np.ascontiguousarray(a[(slice(None, None, -1),) * a.ndim])[(slice(None, None, -1),) * a.ndim]
    return [a, t, r]


@pytest.mark.parametrize("M", ["bool", "u8", "i32", "f32", "bf16"])
def test_mask_of_any_dtype_converted_at_the_boundary(built, rng, M):
    x = rounded(rng.standard_normal((3, 4, 5)), "f32")
    vals = rng.choice([0.0, 1.0, 2.0, -0.25], (3, 4))
    vals[0, :2] = [0.0, 3.0]
    keep = (vals != 0) if M == "bool" else np.trunc(vals).astype(NP[M]) if M in ("u8", "i32") \
        else vals.astype(NP[M])
    if M in ("f32", "bf16"):
        keep[2, 3] = np.nan  # NaN != 0: kept, as the cast to bool says
    want = np.where((keep.astype(np.float64) != 0)[..., None], x, 0)  # (NaN != 0 holds)
    for k in _layouts(keep):
        got, ref = run_both(built, "keep_rows", x=x, keep=k)
        assert np.array_equal(ref["y"], want.astype(np.float32))
        assert np.array_equal(got["y"], ref["y"]), (M, k.strides)


@pytest.mark.parametrize("J", ["i8", "u16", "i32", "i64", "u64", "f16", "f64"])
def test_indices_of_any_dtype_converted_at_the_boundary(built, rng, J):
    table = rounded(rng.standard_normal((6, 3)), "f64")
    at = rng.integers(0, 6, 9)
    at[:2] = [5, 0]
    vals = at + 0.75 if J in ("f16", "f64") else at  # truncated toward zero
    arr = vals.astype(NP[J])
    wide = np.zeros(18, NP[J])
    wide[::2] = arr
    for a in (*_layouts(arr), wide[::2]):
        got, ref = run_both(built, "pick", table=table, at=a)
        assert np.array_equal(ref["out"], table[at]) and np.array_equal(got["out"], table[at]), (J, a.strides)
    bad = {"i8": -1, "u16": 6, "i32": 6, "i64": -7, "u64": 2**63 + 5, "f16": np.nan, "f64": -1.0}[J]
    arr[4] = bad
    out = np.full((9, 3), 4.0)
    for run in (lambda: oracle.run(built["ops"]["pick"], table=table, at=arr),
                lambda: runtime.call("pick", lib=built["lib"], table=table, at=arr, out=out)):
        with pytest.raises(OpError) as e:
            run()
        assert e.value.status == "index"
    assert (out == 4.0).all(), "a refused call writes nothing"


def test_converted_copy_is_in_the_workspace_size(built, rng):
    """The dense converted copy is part of the queried workspace: that size is enough, one byte
    less is refused, and no copy (nor space) is needed for contiguous i64 indices."""
    from tests.cpu_cases import CODE, c_call

    lib = built["lib"]
    table = rounded(rng.standard_normal((6, 3)), "f32")
    at = rng.integers(0, 6, 1000)
    sizes = {}
    for J in ("i64", "i32"):
        args = {"table": table, "at": at.astype(NP[J]), "out": np.zeros((1000, 3), np.float32)}
        st, sizes[J] = c_call("pick", args, lib=lib, size_query=True)
        assert st == 0
        ws = np.zeros(sizes[J] + 64, np.uint8)
        assert c_call("pick", args, lib=lib, workspace=ws, workspace_size=sizes[J])[0] == 0
        assert np.array_equal(args["out"], table[at])
        if sizes[J]:
            args["out"][:] = 7.0
            assert c_call("pick", args, lib=lib, workspace=ws, workspace_size=sizes[J] - 1)[0] == CODE["workspace"]
            assert (args["out"] == 7.0).all()
    assert sizes["i32"] >= sizes["i64"] + 1000 * 8


# ---------------------------------------------------------------------- column sums read back


def batch_norm_args(rng: np.random.Generator, T: str, shape: tuple[int, int]) -> dict[str, np.ndarray]:
    """batch_norm_backward's inputs, with the statistics PyTorch saves (f32 mean and 1/std per channel)."""
    x = rounded(rng.standard_normal(shape) * 2 + 0.5, T)
    mu = f64(x).mean(axis=0) if shape[0] else np.zeros(shape[1])
    var = ((f64(x) - mu) ** 2).mean(axis=0) if shape[0] else np.zeros(shape[1])
    return {"grad_y": rounded(rng.standard_normal(shape), T), "x": x, "mean_": mu.astype(np.float32),
            "invstd": (1 / np.sqrt(var + 1e-5)).astype(np.float32)}


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(70, 45), (1, 5), (33, 1), (64, 3)])
def test_batch_norm_backward_column_means(built, rng, T, shape):
    """Column means read back by every row (not outputs): against the oracle and PyTorch's
    ``native_batch_norm_backward`` (float64 and same dtype), rows not a multiple of a chunk's 32."""
    a = batch_norm_args(rng, T, shape)
    got, ref = run_both(built, "batch_norm_backward", **a)
    m, inv = torch.from_numpy(a["mean_"]), torch.from_numpy(a["invstd"])

    def theirs(dt: torch.dtype) -> np.ndarray:
        gy, x = tt(a["grad_y"], T).to(dt), tt(a["x"], T).to(dt)
        r = torch.ops.aten.native_batch_norm_backward(gy, x, None, None, None, m.to(dt if dt == torch.float64 else
                                                      torch.float32), inv.to(dt if dt == torch.float64 else
                                                      torch.float32), True, 1e-5, [True, False, False])[0]
        return r.to(torch.float64).numpy()

    want = theirs(torch.float64)
    assert_f64_close(oracle.run(built["ops"]["batch_norm_backward"], precision="f64", **a)["grad_x"], want,
                     "grad_x (oracle f64)")
    same = theirs(tt(a["x"], T).dtype)
    assert_close_policy(got["grad_x"], want, same, T, "grad_x (compiled)")
    assert_close_policy(ref["grad_x"], want, same, T, "grad_x (oracle)")


def test_column_sums_share_one_walk_over_the_rows(built):
    """lower-to-loops: both of BatchNorm's column sums in one loop over chunks of 32 rows, the
    rows serial inside it and each row read along its columns (the last axis innermost), into
    per-chunk partials: the sums are not walked column by column."""
    from opgen.passes import pipeline

    m = built["ops"]["batch_norm_backward"].module()
    pipeline.run(m, "cpu", until="lower-to-loops")
    sums = [o for o in m.walk() if isinstance(o, s.AccumOp) and s.buf_type(o.buf).rank == 1
            and s.buf_type(o.buf).role.data == "local"]
    assert len(sums) == 2 and sums[0].parent_op() is sums[1].parent_op()
    cols = sums[0].parent_op()
    rows = cols.parent_op()
    chunks = rows.parent_op()
    assert [x.kind.data for x in (cols, rows, chunks)] == ["parallel", "serial", "parallel"]
    assert list(sums[0].idx) == [cols.iv]
    loads = [o for o in cols.walk() if isinstance(o, s.LoadOp) and s.buf_type(o.buf).role.data == "in"]
    assert loads and all(ld.idx[-1] is cols.iv for ld in loads if s.buf_type(ld.buf).rank == 2)


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_column_sum_over_two_leading_axes(built, rng, T):
    """A mean over the batch and token axes of (B, N, C), read back by every element."""
    x = rounded(rng.standard_normal((3, 37, 20)) * 3 + 1, T)
    got, ref = run_both(built, "centre_tokens", x=x)
    want = f64(x) - f64(x).mean(axis=(0, 1), keepdims=True)
    same = tt(x, T).float()
    same = (same - same.mean(dim=(0, 1), keepdim=True)).to(tt(x, T).dtype).to(torch.float64).numpy()
    assert_close_policy(got["y"], want, same, T, "y (compiled)")
    assert_close_policy(ref["y"], want, same, T, "y (oracle)")


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 37, 20), (1, 70, 33), (2, 0, 5), (4, 1, 1)])
def test_sums_over_a_middle_axis(built, rng, T, shape):
    """Sums over the tokens of (B, N, C), the last axis kept: within a batch row (y) and as a
    value lowered on its own (yt, its transpose, is not a row of y's group), against the oracle,
    float64 and PyTorch."""
    x = rounded(rng.standard_normal(shape) * 3 + 1, T)
    got, ref = run_both(built, "token_sums", x=x)
    want = f64(x).sum(axis=1)
    xs = tt(x, T).float()
    for k, w, same in (("y", want, xs.sum(1)), ("yt", (2 * want).T, (xs * 2.0).sum(1).T)):
        same = same.to(tt(x, T).dtype).to(torch.float64).numpy()
        assert_close_policy(got[k], w, same, T, f"{k} (compiled)")
        assert_close_policy(ref[k], w, same, T, f"{k} (oracle)")
    one = runtime.call("token_sum", lib=built["lib"], x=x)["y"]
    assert np.array_equal(f64(one), f64(got["y"]))  # (the same walk, alone in its op)


def test_a_sum_over_the_middle_axis_walks_rows(built):
    """Both of token_sums' sums read x's rows along the last axis (the innermost loop indexes
    x's last axis), the tokens in a serial loop around it."""
    from opgen.passes import pipeline

    m = built["ops"]["token_sums"].module()
    pipeline.run(m, "cpu", until="lower-to-loops")
    loads = [o for o in m.walk() if isinstance(o, s.LoadOp) and s.buf_type(o.buf).role.data == "in"]
    assert len(loads) == 2
    for ld in loads:
        inner = ld.parent_op()
        assert isinstance(inner, s.ForOp) and ld.idx[-1] is inner.iv and inner.kind.data == "parallel"
        tokens = inner.parent_op()
        assert isinstance(tokens, s.ForOp) and tokens.kind.data == "serial" and ld.idx[1] is tokens.iv


def test_passes_that_only_read_rows_prefetch_into_l2(built):
    """map-cpu: a stream loop that writes no caller tensor (token_sum's jammed rows, BatchNorm's
    column sums: only accumulators) prefetches its rows into L2 (``l2``), every row of a jam-rows
    group (rows lo + F p + r: counter expressions; F = 8 rows of token_sum's one tensor, 4 of
    BatchNorm's two: jam-rows' READ_STREAMS); a pass writing rows of a caller's output
    (BatchNorm's grad_x) prefetches into L1, except two rows at a time (jam-rows' ROW_FACTOR:
    no hints, measured faster without)."""
    from opgen.lower.cpu_map import cpu_mapping
    from opgen.lower.jam_rows import READ_STREAMS
    from opgen.lower.sched import CpuMapping
    from opgen.passes import pipeline

    for name, want in (("token_sum", {"x"}), ("batch_norm_backward", {"grad_y", "x"})):
        m = built["ops"][name].module()
        pipeline.run(m, "cpu", until="map-cpu")
        (k,) = [o for o in m.walk() if isinstance(o, s.KernelOp)]
        streams = [o for o in m.walk() if isinstance(o, s.ForOp) and cpu_mapping(o) == CpuMapping.STREAM
                   and any(isinstance(ld, s.LoadOp) and s.buf_type(ld.buf).role.data == "in"
                           and s.buf_type(ld.buf).rank >= 2 for ld in o.body.block.ops)]
        rows = READ_STREAMS // len(want)
        pairs = [o for o in streams if len({ld.idx[-2] for ld in o.body.block.ops if isinstance(ld, s.LoadOp)
                                            and s.buf_type(ld.buf).rank >= 2}) == rows]
        assert pairs, name
        for loop in streams:
            hints = [o for o in loop.body.block.ops if isinstance(o, s.PrefetchOp) and o.write is None]
            writes_caller = any(isinstance(o, s.StoreOp) and s.buf_type(o.buf).role.data == "out"
                                for o in loop.walk())
            jammed = len({ld.idx[-2] for ld in loop.body.block.ops if isinstance(ld, s.LoadOp)
                          and s.buf_type(ld.buf).rank >= 2}) > 1
            if writes_caller and jammed:  # (BatchNorm's grad_x two rows at a time: no hints)
                assert not hints, (name, loop)
                continue
            assert hints and all((h.l2 is None) == writes_caller for h in hints), (name, loop)
        for pair in pairs:
            hints = [o for o in pair.body.block.ops if isinstance(o, s.PrefetchOp)]
            assert {k.param_names[h.buf] for h in hints} == want and len(hints) == rows * len(want)
            assert all(h.l2 is not None for h in hints)


def _counter_value(v, env: dict) -> int:
    """A counter expression of map-cpu's (constants, dims, +, -, *, min, max) evaluated with the
    counters and dims in ``env`` (an independent reading of the IR, for the test below)."""
    if v in env:
        return env[v]
    op = v.owner
    if isinstance(op, ir.ConstantOp):
        return int(op.value.value.data)
    if isinstance(op, ir.DimOp):
        return env[op.dim.data]
    fn = {ir.AddOp: lambda a, b: a + b, ir.SubOp: lambda a, b: a - b, ir.MulOp: lambda a, b: a * b,
          ir.MinOp: min, ir.MaxOp: max}[type(op)]
    return fn(_counter_value(op.lhs, env), _counter_value(op.rhs, env))


def test_a_group_of_rows_prefetches_the_next_group_past_its_rows_ends(built):
    """map-cpu: a stream loop reading a group of rows side by side (token_sum's 8 rows of x,
    BatchNorm's column sums' 4 rows of grad_y and x) prefetches, once its ``ahead`` bytes pass a
    row's end, into the row the group loop's next iteration reads in its place (``sched.prefetch
    ... wrap``: row lo + F (p + 1) + r, clamped to the tensor's rows; the row after it in memory
    is the group's own next row, read already); the C printer chooses between the two lines by
    the column (2048 bytes: 1024 bf16 elements, 512 f32). A row loop walking one row a step (GELU
    backward's, tanh form) needs no wrap: its row's end runs into the next row."""
    from opgen.emit import cpu
    from opgen.lower.cpu_map import PREFETCH_AHEAD, cpu_mapping
    from opgen.lower.sched import CpuMapping
    from opgen.passes import pipeline
    from tests.test_sched_dialect import _ancestors

    for name, rows_dim, group in (("token_sum", "N", 8), ("batch_norm_backward", "N", 4)):
        m = built["ops"][name].module()
        pipeline.run(m, "cpu", until="map-cpu")
        jammed = [o for o in m.walk() if isinstance(o, s.ForOp) and cpu_mapping(o) == CpuMapping.STREAM
                  and len({ld.idx[-2] for ld in o.body.block.ops if isinstance(ld, s.LoadOp)
                           and s.buf_type(ld.buf).role.data == "in" and s.buf_type(ld.buf).rank >= 2}) == group]
        assert jammed, name
        for loop in jammed:
            parent = loop.parent_op()
            hints = [o for o in loop.body.block.ops if isinstance(o, s.PrefetchOp) and o.write is None]
            assert hints and all(h.wrap is not None and h.ahead.data == PREFETCH_AHEAD for h in hints), name
            outer = [o.iv for o in _ancestors(parent, None) if isinstance(o, s.ForOp)]  # (their counters at 0)
            for p in (0, 2, 15):  # (15: rows 60-63 of 64 in token_sum's last group, BatchNorm's 16th)
                env = {parent.iv: p, rows_dim: 64, "C": 300, "B": 3, **dict.fromkeys(outer, 0)}
                for h in hints:
                    row, wrap = _counter_value(h.idx[-2], env), _counter_value(h.wrap, env)
                    assert wrap == min(row + group, 63), (name, p, row, wrap)  # (clamped to the last row)
                    assert _counter_value(h.cols, env) == 300
        text = cpu.op_source(built["ops"][name])
        for flavour, elems in (("bf16_u", 1024), ("f32_u", 512)):
            body = text[text.index(f"k_{name}_{flavour}("):]
            body = body[:body.index("return OPGEN_SUCCESS")]
            assert f" + {elems} < d_C ? " in body and "OPGEN_PREFETCH_L2(p_x, (" in body, (name, flavour)
    m = built["ops"]["gelu_tanh_backward"].module()
    pipeline.run(m, "cpu", until="map-cpu")
    hints = [o for o in m.walk() if isinstance(o, s.PrefetchOp)]
    assert hints and not any(h.wrap is not None for h in hints)


# ---------------------------------------------------------------------- transposed inputs


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(37, 70), (1, 5), (33, 1), (64, 96), (0, 3), (40, 530), (16, 16)])
def test_transposed_reads_in_tiles(built, rng, T, shape):
    """A transposed input staged in tiles (tile-transposes, sched.transpose_tile): every element as
    numpy's, edge tiles (sizes not multiples of 16, of 128 rows, of 512 columns: the runtime's
    in-register 16x16 blocks and its scalar edges) included, and through strided views (rows
    further apart than their length; columns apart: the general kernel's scalar path)."""
    x = rounded(rng.standard_normal(shape), T)
    got = runtime.call("transpose_scale", lib=built["lib"], x=x)["y"]
    assert np.array_equal(f64(got), (f64(x) * 2).T)
    wide = rounded(rng.standard_normal((shape[0], shape[1] + 7)), T)[:, 3:shape[1] + 3]
    got = runtime.call("transpose_scale", lib=built["lib"], x=wide)["y"]
    assert np.array_equal(f64(got), (f64(wide) * 2).T)
    a = rounded(rng.standard_normal(shape[::-1]), T)
    got = runtime.call("add_transposed", lib=built["lib"], a=a, b=x)["y"]
    want = oracle.run(built["ops"]["add_transposed"], a=a, b=x)["y"]
    assert np.array_equal(f64(got), f64(want)) and np.allclose(f64(got), f64(a) + f64(x).T, rtol=1e-2)
    got = runtime.call("add_transposed", lib=built["lib"], a=np.ascontiguousarray(a.T).T,
                       b=np.ascontiguousarray(x.T).T)["y"]
    assert np.array_equal(f64(got), f64(want))


def test_transposed_reads_walk_tiles(built):
    """tile-transposes: transpose_scale's nest becomes one parallel loop over the tiles, numbered
    row-major (tj = t / n_i: a tile of the input's rows; ti = t - tj * n_i: of its columns), each
    staged transposed into a local tile -> the output rows of the tile (serial) -> their columns
    (parallel: the vector loop), which read the local tile along its rows (at i - i0, j - j0); the
    store's last index the innermost counter. The tiles of the input's rows start ``shift`` earlier,
    ``min(sched.line_phase y[0, 0], hi_j)``, the first clipped at 0: ``j0 = max(tj * TJ - shift, 0)``,
    ``j1 = min(tj * TJ + TJ - shift, hi_j)``, ``cdiv(hi_j + shift, TJ)`` of them."""
    from opgen.lower.tile_transposes import STAGED_TILE
    from opgen.passes import pipeline

    m = built["ops"]["transpose_scale"].module()
    pipeline.run(m, "cpu", until="tile-transposes")
    (ld,) = [o for o in m.walk() if isinstance(o, s.LoadOp)]
    (st,) = [o for o in m.walk() if isinstance(o, s.StoreOp)]
    (tt,) = [o for o in m.walk() if isinstance(o, s.TransposeTileOp)]
    cols = ld.parent_op()
    rows = cols.parent_op()
    t = rows.parent_op()
    assert isinstance(t.parent_op(), s.KernelOp)
    assert [x.kind.data for x in (t, rows, cols)] == ["parallel", "serial", "parallel"]
    assert list(st.idx) == [rows.iv, cols.iv]
    # the tiles: rows of the output from ti's, its columns (the input's rows) from tj's, shifted
    i0, j0 = rows.lo, cols.lo
    assert isinstance(j0.owner, ir.MaxOp) and ir.constant_int(j0.owner.rhs) == 0
    back = j0.owner.lhs.owner
    assert isinstance(back, ir.SubOp) and isinstance(back.lhs.owner, ir.MulOp)
    shift = back.rhs.owner
    (phase,) = [o for o in m.walk() if isinstance(o, s.LinePhaseOp)]
    assert isinstance(shift, ir.MinOp) and shift.lhs is phase.result and shift.rhs is cols.hi.owner.rhs
    assert phase.buf is st.buf and [ir.constant_int(v) for v in phase.idx] == [0, 0]
    stop = cols.hi.owner  # min(tj * TJ + TJ - shift, hi_j)
    assert isinstance(stop, ir.MinOp) and isinstance(stop.lhs.owner, ir.SubOp) and stop.lhs.owner.rhs is shift.result
    assert stop.lhs.owner.lhs.owner.lhs is back.lhs
    ti, tj = i0.owner.lhs.owner, back.lhs.owner.lhs.owner
    assert isinstance(tj, ir.DivOp) and tj.lhs is t.iv
    n_i = tj.rhs
    assert isinstance(ti, ir.SubOp) and ti.lhs is t.iv and ti.rhs.owner.lhs is tj.result and ti.rhs.owner.rhs is n_i
    n_j = t.hi.owner.lhs
    assert t.hi.owner.rhs is n_i and all(isinstance(n.owner, ir.DivOp) for n in (n_i, n_j))
    covered = n_j.owner.lhs.owner.lhs.owner  # (hi_j + shift) + TJ - 1
    assert isinstance(covered, ir.AddOp) and covered.lhs is stop.rhs and covered.rhs is shift.result
    assert [ir.constant_int(i0.owner.rhs), ir.constant_int(back.lhs.owner.rhs)] == list(STAGED_TILE)
    # staged at the head of each tile: x[j0, i0], (j1 - j0) x (i1 - i0), into a (TI, TJ) local tile
    assert tt.parent_op() is t and tt.src is m.body.block.first_op.body.block.args[0]
    assert list(tt.idx) == [j0, i0] and tt.rows.owner.rhs is j0 and tt.cols.owner.rhs is i0
    assert s.buf_type(tt.dst).role.data == "stage" and list(s.buf_type(tt.dst).shape) == [str(n) for n in STAGED_TILE]
    assert ld.buf is tt.dst and [(v.owner.lhs, v.owner.rhs) for v in ld.idx] == [(rows.iv, i0), (cols.iv, j0)]
    # the next tile (t + 1, the last tile's own) into L2 while the rows are written: share i - i0 of
    # i1 - i0 a row, at the head of the row loop
    (ps,) = [o for o in m.walk() if isinstance(o, s.PrefetchShareOp)]
    assert ps.parent_op() is rows and ps.buf is tt.src
    assert (ps.part.owner.lhs, ps.part.owner.rhs) == (rows.iv, i0) and ps.parts.owner.lhs is rows.hi
    nj0, ni0 = ps.idx
    ntj, nti = nj0.owner.lhs.owner.lhs.owner.lhs.owner, ni0.owner.lhs.owner
    assert nj0.owner.lhs.owner.rhs is shift.result  # (the next tile shifted as this one)
    nxt = ntj.lhs.owner
    assert isinstance(nxt, ir.MinOp) and nxt.lhs.owner.lhs is t.iv and ir.constant_int(nxt.lhs.owner.rhs) == 1
    assert nxt.rhs.owner.lhs is t.hi and ntj.rhs is n_i and nti.lhs is nxt.result
    assert ps.rows.owner.rhs is nj0 and ps.cols.owner.rhs is ni0
    src = (Path(built["out"]) / "cpu" / "transpose_scale.c").read_text()
    for t_ in ("f32", "bf16", "f16"):  # (the unit-stride flavour issues it; the general one does not)
        unit = src[src.index(f"k_transpose_scale_{t_}_u("):]
        general = src[src.index(f"k_transpose_scale_{t_}_g("):]
        unit = unit[:unit.index("return OPGEN_SUCCESS")]  # (in a call whose x is at least the last-level cache)
        assert "const int big_p_x = opgen_sz_mul(" in unit and ">= opgen_nt_bytes();" in unit
        assert "if (big_p_x) opgen_prefetch_share(p_x + " in unit
        assert "opgen_prefetch_share" not in general[:general.index("return OPGEN_SUCCESS")]


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(40, 3000), (130, 1100), (300, 1030)])
def test_transposed_tiles_split_over_threads(built, rng, T, shape):
    """Fewer tiles of the input's rows than threads (40 rows: one), more (300 rows: three, 128
    each, the last short), and edge tiles of its columns: the threads share the tiles of one row
    of tiles; every element as numpy's with a team of 1 and of 2 (the tests' cap)."""
    gomp = ctypes.CDLL("libgomp.so.1")  # (the library's OpenMP runtime, already loaded)
    x = rounded(rng.standard_normal(shape), T)
    want = (f64(x) * 2).T
    before = gomp.omp_get_max_threads()
    try:
        for threads in (1, 2):
            gomp.omp_set_num_threads(threads)
            got = runtime.call("transpose_scale", lib=built["lib"], x=x)["y"]
            assert np.array_equal(f64(got), want), threads
    finally:
        gomp.omp_set_num_threads(before)


def _placed(shape: tuple[int, ...], dtype: np.dtype, offset: int, row_pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An output of ``shape`` placed ``offset`` bytes past a 64-byte line (rows ``row_pad``
    elements longer than they hold) inside a buffer of 0xAB bytes with 256 guard bytes each side:
    (the output view, the whole buffer)."""
    item = np.dtype(dtype).itemsize
    rows, cols = shape
    nbytes = rows * (cols + row_pad) * item
    raw = np.full(nbytes + 512 + 128, 0xAB, np.uint8)
    start = (-raw.ctypes.data) % 64 + 256 + offset
    whole = raw[start - 256:start + nbytes + 256]
    out = raw[start:start + nbytes].view(dtype).reshape(rows, cols + row_pad)[:, :cols]
    assert out.size == 0 or out.ctypes.data % 64 == offset
    return out, whole


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(37, 70), (3, 70), (300, 1030), (130, 1100), (0, 3), (5, 0)])
@pytest.mark.parametrize("offset", [4, 16, 48])
def test_transposed_tiles_cut_output_rows_at_its_lines(built, rng, T, shape, offset):
    """An output that does not start a 64-byte line (``offset`` bytes past one, as numpy's and
    malloc's large arrays are): tile-transposes shifts its tiles of the output's columns by the
    output's place in its line (sched.line_phase; fewer columns than that place: (3, 70)). Every
    element as numpy's with a team of 1 and of 2, rows a multiple of 64 bytes long or not
    (padded by 3 elements), and not one byte written outside the output."""
    gomp = ctypes.CDLL("libgomp.so.1")  # (the library's OpenMP runtime, already loaded)
    x = rounded(rng.standard_normal(shape), T)
    a = rounded(rng.standard_normal(shape[::-1]), T)
    before = gomp.omp_get_max_threads()
    try:
        for threads, pad in ((1, 0), (2, 0), (2, 3)):
            gomp.omp_set_num_threads(threads)
            for name, kw, want in (("transpose_scale", {"x": x}, (f64(x) * 2).T),
                                   ("add_transposed", {"a": a, "b": x},
                                    f64(oracle.run(built["ops"]["add_transposed"], a=a, b=x)["y"]))):
                y, whole = _placed(shape[::-1], x.dtype, offset, pad)
                guard = np.concatenate([whole[:256], whole[-256:]]).copy()
                if pad:
                    gaps = [whole[256 + r * (shape[0] + pad) * y.itemsize + shape[0] * y.itemsize:][:pad * y.itemsize]
                            .copy() for r in range(shape[1])]
                runtime.call(name, lib=built["lib"], y=y, **kw)
                assert np.array_equal(f64(y), want), (name, threads, pad)
                assert np.array_equal(np.concatenate([whole[:256], whole[-256:]]), guard), (name, threads, pad)
                if pad:
                    assert all((whole[256 + r * (shape[0] + pad) * y.itemsize + shape[0] * y.itemsize:]
                                [:pad * y.itemsize] == g).all() for r, g in enumerate(gaps)), (name, threads)
    finally:
        gomp.omp_set_num_threads(before)


@pytest.mark.parametrize("name", ["transpose_scale", "token_sum"])
def test_staged_tiles_and_l2_prefetches_print_and_parse_back(built, name):
    """The CPU pipeline's IR with ``sched.transpose_tile`` and ``sched.prefetch_share``
    (transpose_scale) and ``sched.prefetch ... l2`` (token_sum) prints in their assembly formats and
    parses back to the same text."""
    from xdsl.parser import Parser

    from opgen.passes import pipeline

    m = built["ops"][name].module()
    pipeline.run(m, "cpu")
    text = str(m)
    assert all(w in text for w in (("sched.transpose_tile ", "sched.prefetch_share ", "sched.line_phase ")
                                   if name == "transpose_scale"
                                   else (" l2 ",)))
    again = Parser(pipeline.context(), text).parse_module()
    again.verify()
    assert str(again) == text


def test_bf16_tiles_are_staged_as_their_16_bits(built):
    """tile-transposes' tiles are ``stage`` buffers (printed as ``!sched.buf<..., stage>``): the bf16
    instances hold the tile's 16-bit words as the caller's tensor holds them
    (``opgen_bits16_transpose_tile``, each load from the tile widened by ``opgen_bf16_to_f32``:
    half the bytes of an f32 tile), the f32 and f16 instances f32 values (``opgen_<dtype>_
    transpose_tile`` widening as it transposes; the tile read as it is)."""
    import re

    from opgen.emit import cpu
    from opgen.passes import pipeline

    m = built["ops"]["transpose_scale"].module()
    pipeline.run(m, "cpu")
    assert re.search(r"!sched.buf<\[512, 128\], T, stage>", str(m))
    text = cpu.op_source(built["ops"]["transpose_scale"])
    for dt, held, fn in (("bf16", "uint16_t", "bits16"), ("f32", "float", "f32"), ("f16", "float", "f16")):
        for flavour in ("u", "g"):
            start = text.index(f"static opgen_status_t k_transpose_scale_{dt}_{flavour}(")
            body = text[start:text.index("\n}\n", start)]
            (tile,) = re.findall(rf"{held} \*restrict (l\d+) = l\d+_base", body)
            assert f"opgen_{fn}_transpose_tile({tile}, 128ll, " in body, (dt, flavour)
            reads = re.findall(rf"= (.*){tile}\[", body)
            assert reads and all(r == ("opgen_bf16_to_f32(" if dt == "bf16" else "") for r in reads), (dt, reads)


@pytest.mark.parametrize("shape", [(37, 70), (16, 16), (0, 3)])
def test_unstaged_transposed_reads_in_square_tiles(built, rng, shape):
    """A transposed input of a dtype the runtime stages no tile of (f64) keeps its strided loads,
    in 16x16 tiles: numpy's values, and no sched.transpose_tile in the pipeline."""
    from opgen.lower.tile_transposes import TILE
    from opgen.passes import pipeline

    x = rng.standard_normal(shape)
    got = runtime.call("transpose_f64", lib=built["lib"], x=x)["y"]
    assert np.array_equal(got, (x * 2).T)
    m = built["ops"]["transpose_f64"].module()
    pipeline.run(m, "cpu", until="tile-transposes")
    assert not [o for o in m.walk() if isinstance(o, s.TransposeTileOp | s.PrefetchShareOp)]
    (ld,) = [o for o in m.walk() if isinstance(o, s.LoadOp)]
    rows, cols = ld.parent_op().parent_op(), ld.parent_op()
    assert list(ld.idx) == [cols.iv, rows.iv]
    tile_j = cols.lo.owner.lhs.owner.lhs.owner.rhs  # (max(tj * TJ - shift, 0): cut at y's lines too)
    assert [ir.constant_int(rows.lo.owner.rhs), ir.constant_int(tile_j)] == list(TILE)


# ---------------------------------------------------------------------- bool masks


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("shape", [(5, 300), (3, 31), (2, 64)])
def test_dropout_backward_bool_mask(built, rng, T, shape):
    """A bool mask read in strips (bytes widened to 4-byte lanes first: the strip's loop then
    vectorises) and in the peel and tail: the oracle's bits, and PyTorch's
    ``native_dropout_backward`` within the policy; a strided (transposed) mask too."""
    g = rounded(rng.standard_normal(shape), T)
    mask = rng.random(shape) > 0.1
    got, ref = run_both(built, "dropout_backward", grad_y=g, mask=mask)
    assert np.array_equal(f64(got["grad_x"]), f64(ref["grad_x"]))
    want = np.where(mask, f64(g) * np.float64(np.float32(1 / 0.9)), 0.0)
    same = torch.ops.aten.native_dropout_backward(tt(g, T), torch.from_numpy(mask), 1 / 0.9)
    assert_close_policy(got["grad_x"], want, same.to(torch.float64).numpy(), T, "grad_x")
    mt = np.ascontiguousarray(mask.T).T  # (the same flags in column-major order: strided loads)
    got_t = runtime.call("dropout_backward", lib=built["lib"], grad_y=g, mask=mt)["grad_x"]
    assert np.array_equal(f64(got_t), f64(ref["grad_x"]))


def test_bool_tensors_are_read_as_bytes_and_strips_widened_first(built):
    """The C reads a caller's bool tensor through a uint8_t pointer as ``!= 0`` (GCC 12
    vectorises no loop loading a _Bool) and the stream loop's strips widen the flags with
    opgen_bool_load_strip before their arithmetic."""
    from opgen.emit import cpu

    text = cpu.op_source(built["ops"]["dropout_backward"])
    assert "const bool *" not in text and "const uint8_t *restrict p_mask" in text
    assert text.count("opgen_bool_load_strip(") == 2  # (f32 and bf16: one strip loop each)
    assert " != 0)" in text


SANITIZED = """
import sys, numpy as np, ml_dtypes
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(0)
for t in (np.float32, ml_dtypes.bfloat16):
    for n, c in ((0, 3), (1, 1), (33, 70), (70, 45)):
        x = rng.standard_normal((n, c)).astype(t)
        stats = dict(mean_=rng.standard_normal(c).astype(np.float32), invstd=np.ones(c, np.float32))
        runtime.call("batch_norm_backward", lib=lib, grad_y=x, x=x, **stats)
        runtime.call("batch_norm_backward", lib=lib, grad_y=np.ascontiguousarray(x.T).T, x=x, **stats)
        mask = rng.random((n, c)) > 0.5
        runtime.call("dropout_backward", lib=lib, grad_y=x, mask=mask)
        runtime.call("dropout_backward", lib=lib, grad_y=x, mask=np.ascontiguousarray(mask.T).T)
    runtime.call("centre_tokens", lib=lib, x=rng.standard_normal((3, 37, 20)).astype(t))
    for shape in ((3, 37, 20), (2, 0, 5), (1, 70, 33)):
        runtime.call("token_sums", lib=lib, x=rng.standard_normal(shape).astype(t))
    for shape in ((37, 70), (1, 5), (64, 96), (3, 70)):
        x = rng.standard_normal(shape).astype(t)
        runtime.call("transpose_scale", lib=lib, x=x)
        runtime.call("add_transposed", lib=lib, a=np.ascontiguousarray(x.T), b=x)
        for off in (4, 16):  # (an output off its lines: tiles cut at them)
            raw = np.zeros(x.nbytes + 64 + off, np.uint8)
            at = (-raw.ctypes.data) % 64 + off
            y = raw[at:at + x.nbytes].view(t).reshape(shape[::-1])
            runtime.call("transpose_scale", lib=lib, x=x, y=y)
print("done")
"""


def test_column_sums_and_masks_clean_under_asan_and_ubsan(tmp_path_factory):
    """BatchNorm's column sums (chunk partials; no rows, one row, rows not a multiple of 32), sums
    over a middle axis, the dropout mask's strips, contiguous and strided, and transposed reads
    in tiles (edge tiles; outputs off their lines) under ASan/UBSan."""
    from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

    with built_ops(tmp_path_factory.mktemp("colsums"), "opgen_test_colsums",
                   {"batch_norm_ops.py": BATCH_NORM, "dropout_ops.py": DROPOUT, "transposed_ops.py": TRANSPOSED}) as b:
        assert_clean_under_sanitizers(b, SANITIZED)


# ---------------------------------------------------------------------- CUDA

NVCC = cc.nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA compile check needs the CUDA toolkit")
def test_cuda_sources_compile_with_nvcc(built):
    """Every new op's .cu compiles for sm_80 and sm_90 with warnings as errors."""
    out = built["out"]
    lib = cc.build_cuda_library(out / "cuda", out / "include", built["root"] / "cuda-build", verbose=False)
    names = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True).stdout
    for op in ("scale_by", "normalize", "masked_mean_backward", "new", "take_rows", "gelu_backward",
               "batch_norm_backward", "dropout_backward"):
        assert f"opgen_cuda_{op}" in names


#: the new ops test_cuda_kernels_on_the_cpu_model runs: the model's library is built of these
#: (every new op's .cu compiles with nvcc in test_cuda_sources_compile_with_nvcc; compiling the
#: others against the model's headers too checked nothing more and took half the test's time)
EMU_OPS = ("scale_by", "ln_cast_backward", "batch_norm_backward", "token_sums", "dropout_backward", "gelu_backward",
           "normalize", "masked_mean_backward", "take_rows", "normalize_positive", "new", "keep_rows", "pick")


@pytest.mark.skipif(emu_build.cxx() is None, reason="no g++ for the CPU model of CUDA")
def test_cuda_kernels_on_the_cpu_model(built, rng):
    """The CUDA kernels of the new ops, executed on tests/cuda_emu, against the oracle."""
    out: Path = built["out"]
    sources = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()
               and (p.parent.name != "cuda" or p.stem in (*EMU_OPS, "opgen_cuda_rt"))}
    assert {f"cuda/{op}.cu" for op in EMU_OPS} <= set(sources)
    lib = emu_worker.load(emu_build.build(sources, built["root"] / "emu"))
    x = rounded(rng.standard_normal((5, 7)), "bf16")
    g = rounded(0.5, "bf16")
    ref = oracle.run(built["ops"]["scale_by"], g=g, x=x)
    assert np.array_equal(runtime.call("scale_by", lib=lib, g=g, x=x)["dx"], ref["dx"])
    for T in ("f32", "bf16"):  # column sums behind casts (block kernels' row partials)
        a = ln_cast_args(rng, T, (70, 45))
        got = runtime.call("ln_cast_backward", lib=lib, **a)
        want = oracle.run(built["ops"]["ln_cast_backward"], **a)
        for k_ in ("grad_x", "grad_w", "grad_b"):
            assert np.allclose(f64(got[k_]), f64(want[k_]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4), k_
    for T in ("f32", "bf16"):  # column sums read back by every row (chunk partials)
        a = batch_norm_args(rng, T, (70, 45))
        got = runtime.call("batch_norm_backward", lib=lib, **a)["grad_x"]
        want = oracle.run(built["ops"]["batch_norm_backward"], **a)["grad_x"]
        assert np.allclose(f64(got), f64(want), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4)
        gm, mk = rounded(rng.standard_normal((6, 70)), T), rng.random((6, 70)) > 0.3
        xt = rounded(rng.standard_normal((3, 37, 20)), T)
        got_s, want_s = runtime.call("token_sums", lib=lib, x=xt), oracle.run(built["ops"]["token_sums"], x=xt)
        for k_ in ("y", "yt"):
            assert np.allclose(f64(got_s[k_]), f64(want_s[k_]), rtol=1e-5 if T == "f32" else 2e-2, atol=1e-4), k_
        got = runtime.call("dropout_backward", lib=lib, grad_y=gm, mask=mk)["grad_x"]
        assert np.array_equal(f64(got), f64(oracle.run(built["ops"]["dropout_backward"], grad_y=gm, mask=mk)["grad_x"]))
    for T in ("f32", "bf16"):  # erf (CUDA's erff)
        gg, xg = gelu_inputs(rng, T)
        got = runtime.call("gelu_backward", lib=lib, grad=gg, x=xg)["dx"]
        want = oracle.run(built["ops"]["gelu_backward"], grad=gg, x=xg)["dx"]
        assert np.allclose(f64(got), f64(want), rtol=1e-5 if T == "f32" else 8e-3, atol=1e-6, equal_nan=True)
    xp = rounded(rng.random((33, 70)) + 0.5, "f32")
    got = runtime.call("normalize", lib=lib, x=xp)["y"]
    assert np.allclose(got, oracle.run(built["ops"]["normalize"], x=xp)["y"], rtol=1e-5)
    valid = rng.random(300) < 0.3
    got = runtime.call("masked_mean_backward", lib=lib, g=np.asarray(2.0, np.float32), valid=valid)["dx"]
    assert np.allclose(got, np.where(valid, 2.0 / valid.sum(), 0.0), rtol=1e-6)
    table = rounded(rng.standard_normal(8), "f32")
    t = np.array([0, 7, 3, 99], np.int32)
    out_arr = np.full(4, 9.0, np.float32)
    status = lib.lib.opgen_cuda_device_status
    status.argtypes = [ctypes.c_void_p, ctypes.c_int]
    assert status(None, 1) == 0
    # checks on device data are asynchronous on CUDA: recorded in the device status, nothing written
    runtime.call("take_rows", lib=lib, table=table, t=t, skip=np.zeros(4, bool), out=out_arr)
    assert status(None, 1) == 6 and (out_arr == 9.0).all()  # OPGEN_ERR_INDEX
    xp = rounded(rng.random(40) + 0.5, "f32")
    y = np.full(40, 5.0, np.float32)
    runtime.call("normalize_positive", lib=lib, x=-xp, y=y)
    assert status(None, 1) == 2 and (y == 5.0).all()  # OPGEN_ERR_PARAM: the check on a reduction
    got = runtime.call("normalize_positive", lib=lib, x=xp)["y"]
    assert status(None, 1) == 0 and np.allclose(got, xp / xp.sum(dtype=np.float64), rtol=1e-5)
    a = [rounded(rng.standard_normal((4, 6)), "f32") for _ in range(4)]
    null = rounded(rng.standard_normal(6), "f32")
    args = {"a": a[0], "l": a[1], "dims": a[2], "int": a[3], "NULL": null}
    got = runtime.call("new", lib=lib, **args)
    ref = oracle.run(built["ops"]["new"], **args)
    assert np.allclose(got["sc"], ref["sc"], atol=1e-6) and np.allclose(got["workspace"], ref["workspace"], atol=1e-5)
    # parameters converted at the boundary by the device binder: a transposed u8 mask, strided f64 indices
    x3 = rounded(rng.standard_normal((3, 4, 5)), "f32")
    keep = (rng.random((3, 4)) < 0.5).astype(np.uint8) * 3
    for k in _layouts(keep):
        got = runtime.call("keep_rows", lib=lib, x=x3, keep=k)["y"]
        assert np.array_equal(got, np.where((keep != 0)[..., None], x3, 0).astype(np.float32))
    tab = rounded(rng.standard_normal((6, 3)), "f32")
    at = rng.integers(0, 6, 9)
    wide = np.zeros(18)
    wide[::2] = at + 0.5
    assert np.array_equal(runtime.call("pick", lib=lib, table=tab, at=wide[::2])["out"], tab[at])


# ---------------------------------------------------------------------- narrow products


def test_narrow_products_marks_only_matmuls_of_narrow_values(built):
    """narrow-products: bf16 products (dtype variable T) where both operands are T inputs, none
    with an f32 operand or where a computed operand's product is kept in f32. The linear layer's
    bf16 instance reads the caller's bf16 tensors and writes its bf16 output with
    opgen_gemm_bf16_out (no naive loop, no temporary, no epilogue loop: matmul-into-output with
    an identity epilogue), its f32 instance with opgen_sgemm; the chain's bf16 instance takes
    the bf16-product GEMM for its first product only."""
    from opgen.passes import pipeline

    def marks(name: str) -> list[str | None]:
        m = built["ops"][name].module()
        pipeline.run(m, "cpu", until="narrow-products")
        return [o.products.data if o.products is not None else None for o in m.walk()
                if isinstance(o, s.BufferMatmulOp)]

    assert marks("linear_t") == ["T"]
    assert marks("linear_mixed") == [None]
    assert marks("exp_chain") == ["T", None]
    src = (built["out"] / "cpu" / "linear_t.c").read_text()
    fns = {f.split("(")[0]: f for f in src.split("static opgen_status_t k_linear_t_")[1:]}
    assert any("opgen_gemm_bf16_out_par(" in f and "p_y, st_y_0, 0);" in f for n, f in fns.items()
               if n.startswith("bf16"))
    m = built["ops"]["linear_t"].module()
    pipeline.run(m, "cpu")
    (k,) = m.body.block.ops
    assert not any(isinstance(o, s.AllocOp | s.ForOp) for o in k.walk())  # (one matmul, into y)
    assert not any("bgemm" in f or "gemm_bf16" in f for n, f in fns.items() if n.startswith("f32"))
    assert any("opgen_sgemm_par(" in f for n, f in fns.items() if n.startswith("f32"))
    src = (built["out"] / "cpu" / "exp_chain.c").read_text()
    bf16 = [f for f in src.split("static opgen_status_t k_exp_chain_")[1:] if f.startswith("bf16")]
    assert sum(f.count("opgen_bgemm(") for f in bf16) >= 1 and sum(f.count("opgen_sgemm(") for f in bf16) >= 1


def test_hoist_packing_packs_a_loop_invariant_right_hand_operand_once():
    """hoist-packing on FLCE's memory-saving chain: W_j (the right-hand operand of the logits
    ``X_i W_j^T`` and of ``G W_j``) is packed once per column block, before the loop over row
    blocks that leaves it alone, into an f32 buffer of round32(k) x round32(n) elements; X_i
    (``G^T X_i``) changes in that loop and is packed at each call. The bf16 instance calls
    opgen_bpack and opgen_bgemm_pb (AMX layout), the f16 one (f32 GEMM) opgen_spack and
    opgen_sgemm_pb. The results are bitwise those of the unhoisted GEMMs: tests/test_gemm.py
    (test_packed_right_hand_operand*) and the FLCE tests against the oracle."""
    from opgen import registry
    from opgen.emit import cpu
    from opgen.passes import pipeline

    o = registry.load_all(str(registry.REPO_ROOT / "ops_dsl"))["fused_linear_cross_entropy_loss_grad"]
    m = o.module()
    pipeline.run(m, "cpu")
    packs = [x for x in m.walk() if isinstance(x, s.PackOp)]
    assert len(packs) == 2
    for pk in packs:
        loop = pk.next_op
        while not isinstance(loop, s.ForOp):
            loop = loop.next_op
        users = [u.operation for u in pk.dst.uses if u.operation is not pk]
        assert users and all(isinstance(u, s.BufferMatmulOp) and u.b_packed is pk.dst and u.b is pk.src
                             and loop.is_ancestor(u) for u in users)
        assert pk.src not in s.effects(loop)[1]  # (the loop does not write W_j)
        t = s.buf_type(pk.dst)
        assert t.dtype == "f32" and t.role.data == "local"
        assert all(int(d) % 32 == 0 if d.isdigit() else d.startswith("mul(cdiv(") and d.endswith(",32),32)")
                   for d in t.shape), t.shape
    kernel = packs[0].parent_op()
    while not isinstance(kernel, s.KernelOp):
        kernel = kernel.parent_op()
    unpacked = [x for x in kernel.walk() if isinstance(x, s.BufferMatmulOp) and x.b_packed is None]
    assert len(unpacked) == 1 and unpacked[0].trans.data[0].data == 1  # G^T X_i
    text = cpu.op_source(o)
    split = text.split("static opgen_status_t k_fused_linear_cross_entropy_loss_grad_")[1:]
    parts = {f.split("(")[0]: f for f in split}
    bf16 = "".join(f for n, f in parts.items() if n.startswith("_logits_max_sum_exp_logits_bf16"))
    f16 = "".join(f for n, f in parts.items() if n.startswith("_logits_max_sum_exp_logits_f16"))
    assert "opgen_bpack(" in bf16 and "opgen_bgemm_pb(" in bf16 and "opgen_spack(" not in bf16
    assert "opgen_spack(" in f16 and "opgen_sgemm_pb(" in f16 and "opgen_bpack(" not in f16


def test_bf16_products_are_right(built, rng):
    """The bf16 linear layer against PyTorch in float64: exact bf16 products summed in f32 and
    rounded once, so within one bf16 ulp (2^-7 relative at most) of the float64 result and of
    the oracle's; the chain's
    f32 result within f32 summation error of float64."""
    x, w = rounded(rng.standard_normal((70, 300)), "bf16"), rounded(rng.standard_normal((45, 300)), "bf16")
    got, ref = run_both(built, "linear_t", x=x, w=w)
    want = (t64(x) @ t64(w).T).numpy()
    ulp = 2.0**-7 * np.abs(want) + 2.0**-133
    assert np.all(np.abs(got["y"].astype(np.float64) - want) <= ulp)
    assert np.all(np.abs(got["y"].astype(np.float64) - ref["y"].astype(np.float64)) <= ulp)
    v = rounded(rng.standard_normal((45, 300)), "bf16")
    xs = rounded(rng.standard_normal((70, 300)) * 0.05, "bf16")
    got, ref = run_both(built, "exp_chain", x=xs, w=w, v=v)
    want = (torch.exp(t64(xs) @ t64(w).T) @ t64(v)).numpy()
    scale = (torch.exp(t64(xs) @ t64(w).T) @ t64(v).abs()).numpy()
    assert np.all(np.abs(got["y"] - want) <= 1e-5 * scale)
