"""RMSNormBackward (SPEC §3): the oracle against autograd of
``torch.nn.functional.rms_norm`` in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import oracle
from opgen.binding import OpError
from tests.reference import NP, assert_close_policy, assert_f64_close, f32_scalar, rounded, tt

T_ALL = ("f16", "f32", "bf16")


@pytest.fixture
def op(ops):
    return ops["rms_norm_backward"]


def torch_grads(gy, x, w, eps, T):
    """(grad_x, grad_w) by autograd of rms_norm computed in torch dtype T ("f64" = reference);
    eps is the C float the ABI carries."""
    xt = tt(np.ascontiguousarray(x), T, requires_grad=True)
    wt = tt(np.ascontiguousarray(w), T, requires_grad=True)
    y = torch.nn.functional.rms_norm(xt, (x.shape[-1],), wt, eps=f32_scalar(eps))
    y.backward(tt(np.ascontiguousarray(gy), T))
    return xt.grad, wt.grad


def check(op, gy, x, w, eps, T, **kw):
    out = oracle.run(op, grad_y=gy, x=x, w=w, eps=eps, **kw)
    assert out["grad_x"].shape == x.shape and out["grad_w"].shape == w.shape
    rx, rw = torch_grads(gy, x, w, eps, "f64")
    sx, sw = torch_grads(gy, x, w, eps, T)
    assert_close_policy(out["grad_x"], rx, sx, T, "grad_x")
    assert_close_policy(out["grad_w"], rw, sw, T, "grad_w")
    exact = oracle.run(op, precision="f64", grad_y=gy, x=x, w=w, eps=eps)
    assert_f64_close(exact["grad_x"], rx, "grad_x (f64)")
    assert_f64_close(exact["grad_w"], rw, "grad_w (f64)")
    return out


def make(rng, shape, T):
    D = shape[-1]
    gy = rounded(rng.standard_normal(shape), T)
    x = rounded(rng.standard_normal(shape) * 1.5, T)
    w = rounded(rng.standard_normal(D), T)
    return gy, x, w


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("shape", [(4, 16), (2, 3, 16), (1, 1, 7), (5, 33)])
@pytest.mark.parametrize("T", T_ALL)
def test_matches_torch_autograd(op, rng, T, shape, eps):
    check(op, *make(rng, shape, T), eps, T)


@pytest.mark.parametrize("T", T_ALL)
def test_large_eps_and_small_inputs(op, rng, T):
    """eps comparable to mean(x^2) matters: compare with a large eps and tiny activations."""
    gy, x, w = make(rng, (3, 8), T)
    x = rounded(x.astype(np.float64) * 1e-2, T)
    check(op, gy, x, w, 1e-3, T)


@pytest.mark.parametrize("T", ("f32", "bf16"))
def test_noncontiguous_leading_dims(op, rng, T):
    """Last dim contiguous, other strides free: strided and transposed leading dims."""
    D = 8
    base_x = rounded(rng.standard_normal((4, 6, D)), T)
    base_g = rounded(rng.standard_normal((6, 4, D)), T)
    w_store = rounded(rng.standard_normal(3 * D), T)
    x = base_x[:, ::2, :]  # (4, 3, D), row stride 2*D
    gy = base_g[::2].transpose(1, 0, 2)  # (4, 3, D), leading dims transposed
    w = w_store[::3]  # w: any stride
    assert not (x.flags.c_contiguous or gy.flags.c_contiguous or w.flags.c_contiguous)
    check(op, gy, x, w, 1e-6, T)
    x2 = rounded(rng.standard_normal((10, D)), T)[1::3]  # (N, D) with row stride 3*D
    check(op, rounded(rng.standard_normal((3, D)), T), x2, w, 0.0, T)


@pytest.mark.parametrize("shape", [(5, 8), (2, 3, 8)])
@pytest.mark.parametrize("T", T_ALL)
def test_grad_x_aliases_grad_y(op, rng, T, shape):
    """In-place: the same array passed as grad_y and as the grad_x output."""
    gy, x, w = make(rng, shape, T)
    buf = gy.copy()
    out = oracle.run(op, grad_y=buf, x=x, w=w, eps=1e-6, grad_x=buf)
    rx, rw = torch_grads(gy, x, w, 1e-6, "f64")
    sx, sw = torch_grads(gy, x, w, 1e-6, T)
    assert_close_policy(out["grad_x"], rx, sx, T, "grad_x")
    assert_close_policy(out["grad_w"], rw, sw, T, "grad_w")


@pytest.mark.parametrize("which", ["grad_y", "x", "grad_x"])
def test_noncontiguous_last_dim_is_strides_error(op, rng, which):
    D = 6
    args = {"grad_y": np.ones((3, D), np.float32), "x": np.ones((3, D), np.float32),
            "w": np.ones(D, np.float32), "grad_x": np.zeros((3, D), np.float32)}
    args[which] = np.zeros((3, 2 * D), np.float32)[:, ::2]
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == "strides"
    assert which in e.value.message


def test_strided_grad_w_output_is_fine(op, rng):
    gy, x, w = make(rng, (3, 4), "f32")
    out = oracle.run(op, grad_y=gy, x=x, w=w, grad_w=np.zeros(8, np.float32)[::2])
    _, rw = torch_grads(gy, x, w, 0.0, "f64")
    assert_close_policy(out["grad_w"], rw, torch_grads(gy, x, w, 0.0, "f32")[1], "f32")


@pytest.mark.parametrize("T", ("f32", "f16"))
def test_zero_row_with_eps_zero_gives_nan_like_torch(op, rng, T):
    """r = 0 for an all-zero row when eps = 0: the NaNs must match torch exactly."""
    gy, x, w = make(rng, (3, 4), T)
    x[1] = 0
    out = check(op, gy, x, w, 0.0, T)
    assert np.isnan(out["grad_x"][1].astype(np.float64)).all()
    assert np.isfinite(out["grad_x"][[0, 2]].astype(np.float64)).all()


@pytest.mark.parametrize("T", ("bf16", "f32"))
def test_nonfinite_inputs(op, rng, T):
    gy, x, w = make(rng, (4, 5), T)
    gy[0, 2] = np.inf
    x[2, 1] = np.nan
    check(op, gy, x, w, 1e-6, T)


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8), (0, 3, 8)])
def test_empty_rows(op, rng, shape):
    """No rows: grad_x is empty and grad_w is the empty sum, zeros."""
    w = rounded(rng.standard_normal(8), "f32")
    z = np.zeros(shape, np.float32)
    out = oracle.run(op, grad_y=z, x=z, w=w, grad_w=np.full(8, np.nan, np.float32))
    assert out["grad_x"].shape == shape
    assert np.array_equal(out["grad_w"], np.zeros(8, np.float32))
    _, rw = torch_grads(z, z, w, 0.0, "f64")
    assert np.array_equal(out["grad_w"], rw.numpy())


@pytest.mark.parametrize(("change", "status"), [
    ({"x": np.zeros((3, 8), np.float16)}, "dtype"),
    ({"w": np.zeros(8, np.float64)}, "dtype"),
    ({"grad_y": np.zeros((3, 8), np.int32)}, "dtype"),
    ({"x": np.zeros((3, 7), np.float32)}, "shape"),
    ({"w": np.zeros(7, np.float32)}, "shape"),
    ({"x": np.zeros((1, 3, 8), np.float32)}, "shape"),  # leading shape differs from (3,)
    ({"grad_w": np.zeros((1, 8), np.float32)}, "shape"),
    ({"x": np.zeros(8, np.float32)}, "shape"),  # rank 1: no row dim
])
def test_bad_arguments(op, change, status):
    args = {"grad_y": np.zeros((3, 8), np.float32), "x": np.zeros((3, 8), np.float32),
            "w": np.zeros(8, np.float32)}
    args.update(change)
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == status


def test_output_dtypes(op, rng):
    for T in T_ALL:
        gy, x, w = make(rng, (2, 4), T)
        out = oracle.run(op, grad_y=gy, x=x, w=w)
        assert out["grad_x"].dtype == NP[T] and out["grad_w"].dtype == NP[T]
