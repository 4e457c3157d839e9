"""Property tests (hypothesis) over shapes, dtypes and attributes, against torch in float64."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opgen import oracle, registry
from tests.reference import (
    NP,
    TORCH,
    assert_close_policy,
    assert_f64_close,
    f32_scalar,
    rounded,
    t64,
    tlong,
    tt,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])

IDX_DTYPES = ("f32", "f16", "f64", "i32", "i64", "i16", "i8", "u8", "bool")


@st.composite
def dense_case(draw):
    T = draw(st.sampled_from(["f32", "f16", "bf16"]))
    IT = draw(st.sampled_from(IDX_DTYPES))
    lead = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
    D = draw(st.integers(1, 6))
    V = draw(st.integers(2 if IT == "bool" else 1, 9))
    pad = draw(st.one_of(st.integers(-3, V + 2), st.sampled_from([2**64 - 1, 2**64 - 2, 2**63])))
    scale = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return T, IT, lead, D, V, pad, scale, seed


@SETTINGS
@given(dense_case())
def test_embedding_dense_backward_property(case):
    T, IT, lead, D, V, pad, scale, seed = case
    rng = np.random.default_rng(seed)
    o = registry.get("embedding_dense_backward")
    grad = rounded(rng.standard_normal((*lead, D)), T)
    hi = 2 if IT == "bool" else V
    ints = rng.integers(0, hi, lead)
    if IT == "bool":
        indices = ints.astype(bool)
    elif NP[IT].kind == "f":
        indices = (ints + rng.uniform(0, 0.9, lead)).astype(NP[IT])
    else:
        indices = ints.astype(NP[IT])
    long_idx = torch.tensor(np.trunc(indices.astype(np.float64)).astype(np.int64))
    p = pad - 2**64 if pad >= 2**63 else pad
    ref = torch.ops.aten.embedding_dense_backward(t64(grad), long_idx, V, p, scale)
    same = torch.ops.aten.embedding_dense_backward(tt(grad, T), long_idx, V, p, scale)
    args = {"grad": grad, "indices": indices, "num_weights": V, "padding_idx": pad,
            "scale_grad_by_freq": scale}
    assert_close_policy(oracle.run(o, **args)["out"], ref, same, T, "out")
    assert_f64_close(oracle.run(o, precision="f64", **args)["out"], ref, "out (f64)")


@st.composite
def rms_case(draw):
    T = draw(st.sampled_from(["f32", "f16", "bf16"]))
    lead = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    D = draw(st.integers(4, 24))
    eps = draw(st.sampled_from([0.0, 1e-6, 1e-5, 1e-3]))
    x_scale = draw(st.sampled_from([1e-1, 1.0, 10.0]))
    strided = draw(st.booleans())
    seed = draw(st.integers(0, 2**32 - 1))
    return T, lead, D, eps, x_scale, strided, seed


@SETTINGS
@given(rms_case())
def test_rms_norm_backward_property(case):
    T, lead, D, eps, x_scale, strided, seed = case
    rng = np.random.default_rng(seed)
    o = registry.get("rms_norm_backward")
    shape = (*lead, D)
    gy = rounded(rng.standard_normal(shape), T)
    x = rounded(rng.standard_normal(shape) * x_scale, T)
    w = rounded(rng.standard_normal(D), T)
    if strided:  # the same values through views with free leading strides
        big = np.zeros((*lead[:-1], 2 * lead[-1], D), NP[T])
        big[..., ::2, :] = x
        x = big[..., ::2, :]
    e = f32_scalar(eps)

    def grads(dtype):
        xt = t64(x, True) if dtype == "f64" else tt(x, dtype, True)
        wt = t64(w, True) if dtype == "f64" else tt(w, dtype, True)
        torch.nn.functional.rms_norm(xt, (D,), wt, eps=e).backward(
            t64(gy) if dtype == "f64" else tt(gy, dtype))
        return xt.grad, wt.grad

    rx, rw = grads("f64")
    sx, sw = grads(T)
    out = oracle.run(o, grad_y=gy, x=x, w=w, eps=eps)
    assert_close_policy(out["grad_x"], rx, sx, T, "grad_x")
    assert_close_policy(out["grad_w"], rw, sw, T, "grad_w")
    exact = oracle.run(o, precision="f64", grad_y=gy, x=x, w=w, eps=eps)
    assert_f64_close(exact["grad_x"], rx, "grad_x (f64)")
    assert_f64_close(exact["grad_w"], rw, "grad_w (f64)")


@st.composite
def eb_case(draw):
    T = draw(st.sampled_from(["f16", "bf16", "f32", "f64"]))
    IT = draw(st.sampled_from(["i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64"]))
    N = draw(st.integers(0, 12))
    D = draw(st.integers(1, 5))
    N1, N2 = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    two = draw(st.booleans())
    acc1, acc2 = draw(st.booleans()), draw(st.booleans())
    a1 = draw(st.sampled_from([1.0, -1.0, 0.5, 0.1, 3.0, 0.0]))
    a2 = draw(st.sampled_from([1.0, -2.5, 0.3]))
    seed = draw(st.integers(0, 2**32 - 1))
    return T, IT, N, D, N1, N2, two, acc1, acc2, a1, a2, seed


@SETTINGS
@given(eb_case())
def test_embedding_backward_property(case):
    T, IT, N, D, N1, N2, two, acc1, acc2, a1, a2, seed = case
    rng = np.random.default_rng(seed)
    o = registry.get("embedding_backward")
    dy = rounded(rng.standard_normal((N, D)), T)
    i1, i2 = rng.integers(0, N1, N).astype(NP[IT]), rng.integers(0, N2, N).astype(NP[IT])
    t1 = rounded(rng.standard_normal((N1, D)), T)
    t2 = rounded(rng.standard_normal((N2, D)), T)
    args = {"dy": dy, "i1": i1, "alpha1": a1, "dtable1_acc": acc1, "dtable1": t1}
    if two:
        args.update(i2=i2, alpha2=a2, dtable2_acc=acc2, dtable2=t2)

    def table(t, acc, idx, alpha, dtype):
        if dtype == "f64":
            base = t64(t) if acc else torch.zeros(t.shape, dtype=torch.float64)
            return base.index_add_(0, tlong(idx), t64(dy), alpha=f32_scalar(alpha))
        base = tt(t, dtype) if acc else torch.zeros(t.shape, dtype=TORCH[dtype])
        return base.index_add_(0, tlong(idx), tt(dy, dtype), alpha=f32_scalar(alpha))

    out = oracle.run(o, **args)
    exact = oracle.run(o, precision="f64", **args)
    tables = [("dtable1", t1, acc1, i1, a1)] + ([("dtable2", t2, acc2, i2, a2)] if two else [])
    assert set(out) == {name for name, *_ in tables}
    for name, t, acc, idx, alpha in tables:
        ref = table(t, acc, idx, alpha, "f64")
        assert_close_policy(out[name], ref, table(t, acc, idx, alpha, T), T, name)
        assert_f64_close(exact[name], ref, name + " (f64)")
