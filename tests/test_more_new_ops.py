"""Eight more ops a new user might write, none of them known to the compiler: log-softmax, SwiGLU,
L2-normalize, softplus, hardswish, MSE and smooth-L1 backward and a bias gradient. Each is built
by ``opgen build`` from its DSL file alone and run from the CPU library (and its CUDA kernels on
the CPU model of CUDA, tests/cuda_emu) against the oracle, which it must match closely (the same
math, only the vector kernels' rounding apart), and the oracle against PyTorch CPU (SPEC §0's
policy: no worse than PyTorch's own same-dtype result against float64, plus the dtype's
margin). Row lengths around the vector strips, one-element rows and a batch of two leading
axes; the patterns they exercise: nested ``where`` on constants, ``abs``, ``maximum`` with a
scalar attribute, ``size()`` products, a rank-0 tensor scale, row sums divided into the row, a
column sum over ``Batch`` rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from opgen import oracle, runtime
from tests.cuda_emu import emu_build, emu_worker
from tests.ops_dirs import built_ops
from tests.reference import assert_close_policy, f64, rounded, t64, tt

SOURCE = '''\
"""Backward ops a new user writes (tests/test_more_new_ops.py)."""

from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16, f16)


@op
def log_softmax_backward(grad: Tensor[T, Batch(N), D], y: Tensor[T, Batch(N), D], *,
                         dx: Output[T, Batch(N), D]):
    """dx = grad - exp(y) * sum(grad) along the row (y = log_softmax(x))."""
    g = cast(grad, f32)
    return {"dx": g - exp(cast(y, f32)) * sum(g, axis=-1, keepdims=True)}


@op
def swiglu_backward(a: Tensor[T, Batch(N), D], b: Tensor[T, Batch(N), D], dy: Tensor[T, Batch(N), D], *,
                    da: Output[T, Batch(N), D], db: Output[T, Batch(N), D]):
    """y = silu(a) * b."""
    af, bf, g = cast(a, f32), cast(b, f32), cast(dy, f32)
    s = sigmoid(af)
    return {"da": g * bf * s * (1.0 + af * (1.0 - s)), "db": g * af * s}


@op
def l2norm_backward(dy: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], eps: float = 1e-12, *,
                    dx: Output[T, Batch(N), D]):
    """y = x / max(|x|, eps) along the row."""
    xf, g = cast(x, f32), cast(dy, f32)
    nrm = maximum(sqrt(sum(xf * xf, axis=-1, keepdims=True)), eps)
    y = xf / nrm
    return {"dx": (g - y * sum(g * y, axis=-1, keepdims=True)) / nrm}


@op
def softplus_backward(dy: Tensor[T, N, D], x: Tensor[T, N, D], beta: float = 1.0, threshold: float = 20.0, *,
                      dx: Output[T, N, D]):
    """softplus(x) = log(1 + exp(beta x)) / beta, x itself where beta x > threshold."""
    bx, g = cast(x, f32) * beta, cast(dy, f32)
    return {"dx": where(bx > threshold, g, g * sigmoid(bx))}


@op
def hardswish_backward(dy: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
    """hardswish(x) = x relu6(x + 3) / 6 (PyTorch's derivative: 0 to -3, 1 from 3)."""
    xf = cast(x, f32)
    return {"dx": cast(dy, f32) * where(xf <= -3.0, 0.0, where(xf < 3.0, xf / 3.0 + 0.5, 1.0))}


@op
def mse_backward(x: Tensor[T, N, D], t: Tensor[T, N, D], g: Tensor[f32], *, dx: Output[T, N, D]):
    """The mean squared error's gradient times the loss's g."""
    return {"dx": 2.0 * (cast(x, f32) - cast(t, f32)) * g / (size(N) * size(D))}


@op
def smooth_l1_backward(x: Tensor[T, N, D], t: Tensor[T, N, D], g: Tensor[f32], beta: float = 1.0, *,
                       dx: Output[T, N, D]):
    """The mean smooth-L1 loss's gradient times g."""
    d = cast(x, f32) - cast(t, f32)
    return {"dx": where(abs(d) < beta, d / beta, where(d > 0.0, 1.0, -1.0)) * g / (size(N) * size(D))}


@op
def bias_grad(dy: Tensor[T, Batch(N), D], *, db: Output[T, D]):
    """A linear layer's bias gradient: the rows summed."""
    return {"db": sum(cast(dy, f32), axis=0)}
'''

SHAPES = [(1, 1), (3, 17), (7, 1023), (64, 300), (2, 5, 96)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The ops above, built by ``opgen build`` from their own ops directory."""
    with built_ops(tmp_path_factory.mktemp("moreops"), "opgen_test_moreops", {"more.py": SOURCE}) as b:
        yield b


def _torch(dtype: str) -> Callable[[np.ndarray], torch.Tensor]:
    """Numpy values as a torch tensor of ``dtype`` ("f64": the float64 reference)."""
    return (lambda a: t64(a)) if dtype == "f64" else (lambda a: tt(a, dtype))


def _grad(fn: Callable[..., torch.Tensor], wrt: list[torch.Tensor], dy: torch.Tensor | None = None,
          scale: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The gradients of ``fn(*wrt)`` (times ``dy``, or times a loss scale)."""
    for w in wrt:
        w.requires_grad_(True)
    y = fn(*wrt)
    if dy is not None:
        y.backward(dy)
    else:
        (y * scale).backward()
    return [w.grad for w in wrt]


def _reference(name: str, args: dict[str, np.ndarray], dtype: str) -> dict[str, torch.Tensor]:
    """PyTorch's result for op ``name`` computed in ``dtype`` on the same values."""
    T = _torch(dtype)
    if name == "log_softmax_backward":
        g, y = T(args["grad"]), T(args["y"])
        return {"dx": torch._log_softmax_backward_data(g, y, -1, g.dtype)}
    if name == "swiglu_backward":
        da, db = _grad(lambda a, b: torch.nn.functional.silu(a) * b, [T(args["a"]), T(args["b"])], T(args["dy"]))
        return {"da": da, "db": db}
    if name == "l2norm_backward":
        (dx,) = _grad(lambda x: torch.nn.functional.normalize(x, dim=-1, eps=1e-12), [T(args["x"])], T(args["dy"]))
        return {"dx": dx}
    if name == "softplus_backward":
        return {"dx": torch.ops.aten.softplus_backward(T(args["dy"]), T(args["x"]), 1.0, 20.0)}
    if name == "hardswish_backward":
        return {"dx": torch.ops.aten.hardswish_backward(T(args["dy"]), T(args["x"]))}
    if name == "bias_grad":
        dy = T(args["dy"])
        return {"db": dy.reshape(-1, dy.shape[-1]).sum(0)}
    scale = torch.tensor(float(args["g"]), dtype=torch.float64 if dtype == "f64" else torch.float32)
    if name == "mse_backward":
        (dx,) = _grad(lambda x: torch.nn.functional.mse_loss(x, T(args["t"])), [T(args["x"])], scale=scale)
        return {"dx": dx}
    assert name == "smooth_l1_backward"
    (dx,) = _grad(lambda x: torch.nn.functional.smooth_l1_loss(x, T(args["t"]), beta=1.0), [T(args["x"])], scale=scale)
    return {"dx": dx}


def _inputs(name: str, shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Inputs rounded to ``dtype``: wide enough to reach every branch (|x| > 3, beta x > 20)."""
    def r(s: float = 1.0) -> np.ndarray:
        return rounded(rng.standard_normal(shape) * s, dtype)

    g = np.array(0.7, np.float32)
    if name == "log_softmax_backward":
        y = torch.log_softmax(torch.tensor(rng.standard_normal(shape) * 2), -1).numpy()
        return {"grad": r(), "y": rounded(y, dtype)}
    if name == "swiglu_backward":
        return {"a": r(3.0), "b": r(), "dy": r()}
    if name == "l2norm_backward":
        return {"dy": r(), "x": r()}
    if name in ("softplus_backward", "hardswish_backward"):
        x = r(8.0)
        flat, k = x.reshape(-1), min(4, x.size)
        flat[:k] = rounded([3.0, -3.0, 20.0, 25.0][:k], dtype)  # (the branches' ends)
        return {"dy": r(), "x": x}
    if name in ("mse_backward", "smooth_l1_backward"):
        return {"x": r(2.0), "t": r(), "g": g}
    return {"dy": r()}


NAMES = ["log_softmax_backward", "swiglu_backward", "l2norm_backward", "softplus_backward", "hardswish_backward",
         "mse_backward", "smooth_l1_backward", "bias_grad"]
ROWS_ONLY = {"softplus_backward", "hardswish_backward", "mse_backward", "smooth_l1_backward"}  # ((N, D) only)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", NAMES)
def test_a_new_users_op_matches_the_oracle_and_pytorch(built, rng, name, dtype):
    op = built["ops"][name]
    for shape in SHAPES:
        if len(shape) > 2 and name in ROWS_ONLY:
            continue
        args = _inputs(name, shape, dtype, rng)
        ref = oracle.run(op, **{k: v.copy() for k, v in args.items()})
        got = runtime.call(name, lib=built["lib"], **args)
        ref64, same = _reference(name, args, "f64"), _reference(name, args, dtype)
        for out, want in ref.items():
            what = f"{name}{shape} {out}"
            _close(got[out], want, dtype, what)
            shape_out = np.shape(want)
            assert_close_policy(want, ref64[out].reshape(shape_out), same[out].reshape(shape_out), dtype, what)


def _close(got: np.ndarray, want: np.ndarray, dtype: str, what: str) -> None:
    """Within a rounding of the storage dtype of the oracle, relative to the result's largest."""
    o, w = f64(got), f64(want)
    scale = max(float(np.max(np.abs(w), initial=0.0)), 1e-30)
    tol = {"f32": 2e-6, "bf16": 8e-3, "f16": 1e-3}[dtype]
    assert o.shape == w.shape and np.max(np.abs(o - w), initial=0.0) <= tol * scale, what


@pytest.mark.skipif(emu_build.cxx() is None, reason="no g++ for the CPU model of CUDA")
def test_their_cuda_kernels_on_the_cpu_model(built, rng):
    """The same ops' generated CUDA kernels, executed on tests/cuda_emu, against the oracle (f32
    and bf16; rows around a block's threads, a batch of two leading axes)."""
    out = built["out"]
    sources = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    assert {f"cuda/{n}.cu" for n in NAMES} <= set(sources)
    lib = emu_worker.load(emu_build.build(sources, built["root"] / "emu"))
    for dtype in ("f32", "bf16"):
        for name in NAMES:
            for shape in ((3, 17), (5, 300), (2, 3, 40)):
                if len(shape) > 2 and name in ROWS_ONLY:
                    continue
                args = _inputs(name, shape, dtype, rng)
                ref = oracle.run(built["ops"][name], **{k: v.copy() for k, v in args.items()})
                got = runtime.call(name, lib=lib, **args)
                for k in ref:
                    _close(got[k], ref[k], dtype, f"cuda model: {name}{shape} {k} [{dtype}]")
