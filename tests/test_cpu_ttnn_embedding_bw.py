"""``opgen.runtime.ttnn.embedding_bw`` (SPEC §5) on the CPU library: (B, S) and (B, 1, 1, S)
uint32 / int32 indices, (1, 1, B*S, D) and (B, S, D) gradients, bf16 and f32, with and without
``output_tensor``; returns (1, 1, V, D) equal to torch float64 ``index_add_`` within the SPEC §0
policy; bad dtypes raise."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import runtime
from opgen.binding import OpError
from tests.reference import NP, TORCH, assert_close_policy, rounded, t64, tlong, tt

B, S, D, V = 3, 7, 10, 9


def make(rng, T, IT, idx_layout, grad_layout):
    idx = rng.integers(0, V, (B, S))
    idx[0, :4] = 5  # duplicates
    idx[2, -2:] = V - 1
    grad = rounded(rng.standard_normal((B * S, D)), T)
    indices = idx.astype(NP[IT]).reshape((B, S) if idx_layout == "BS" else (B, 1, 1, S))
    g = grad.reshape((1, 1, B * S, D) if grad_layout == "11ND" else (B, S, D))
    return indices, g, idx.reshape(-1), grad


def expected(flat_idx, grad, T):
    ref = torch.zeros((V, D), dtype=torch.float64).index_add_(0, tlong(flat_idx), t64(grad))
    same = torch.zeros((V, D), dtype=TORCH[T]).index_add_(0, tlong(flat_idx), tt(grad, T))
    return ref, same


@pytest.mark.parametrize("given", [False, True], ids=["new_output", "output_tensor"])
@pytest.mark.parametrize("grad_layout", ["11ND", "BSD"])
@pytest.mark.parametrize("idx_layout", ["BS", "B11S"])
@pytest.mark.parametrize("IT", ["u32", "i32"])
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_numpy_inputs(rng, T, IT, idx_layout, grad_layout, given):
    indices, g, flat_idx, grad = make(rng, T, IT, idx_layout, grad_layout)
    weight = np.full((V, D), np.nan, NP[T])  # only its shape is used
    kw = {}
    if given:
        kw["output_tensor"] = np.full((1, 1, V, D), 7.0, NP[T])  # overwritten, not accumulated
    out = runtime.ttnn.embedding_bw(indices, weight, g, **kw)
    assert out.shape == (1, 1, V, D) and out.dtype == NP[T]
    if given:
        assert out is kw["output_tensor"]
    ref, same = expected(flat_idx, grad, T)
    assert_close_policy(out.reshape(V, D), ref, same, T, "out")


@pytest.mark.parametrize("given", [False, True], ids=["new_output", "output_tensor"])
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_torch_inputs(rng, T, given):
    """torch tensors in, torch tensor out (bf16 included); a given torch output is written."""
    indices, g, flat_idx, grad = make(rng, T, "i32", "B11S", "BSD")
    ti = torch.from_numpy(indices)
    tg = tt(g, T)
    tw = torch.zeros((V, D), dtype=TORCH[T])
    kw = {"dtype": "bfloat16" if T == "bf16" else torch.float32}
    if given:
        kw["output_tensor"] = torch.full((1, 1, V, D), 7.0, dtype=TORCH[T])
    out = runtime.ttnn.embedding_bw(ti, tw, tg, **kw)
    assert isinstance(out, torch.Tensor) and out.dtype == TORCH[T] and tuple(out.shape) == (1, 1, V, D)
    if given:
        assert out is kw["output_tensor"]
    ref, same = expected(flat_idx, grad, T)
    assert_close_policy(out.reshape(V, D), ref, same, T, "out")


def test_empty_batch_gives_zeros():
    out = runtime.ttnn.embedding_bw(np.zeros((0, 4), np.uint32), np.zeros((V, D), np.float32),
                                    np.zeros((1, 1, 0, D), np.float32),
                                    output_tensor=np.full((1, 1, V, D), 7.0, np.float32))
    assert out.shape == (1, 1, V, D) and not out.any()


def test_noncontiguous_grad(rng):
    indices, g, flat_idx, grad = make(rng, "f32", "u32", "BS", "BSD")
    wide = np.zeros((B, S, 2 * D), np.float32)
    wide[:, :, ::2] = g
    out = runtime.ttnn.embedding_bw(indices, np.zeros((V, D), np.float32), wide[:, :, ::2])
    ref, same = expected(flat_idx, grad, "f32")
    assert_close_policy(out.reshape(V, D), ref, same, "f32", "out")


@pytest.mark.parametrize(("what", "status"), [
    ("dtype=float32 for bf16 grad", "dtype"),
    ("dtype=bfloat8_b", "dtype"),
    ("output_tensor f32 for bf16 grad", "dtype"),
    ("output_tensor wrong shape", "shape"),
    ("grad f16", "dtype"),
    ("indices u16", "dtype"),
    ("indices out of range", "index"),
])
def test_bad_arguments_raise(rng, what, status):
    indices, g, _, _ = make(rng, "bf16", "u32", "BS", "11ND")
    weight = np.zeros((V, D), NP["bf16"])
    kw = {}
    if what == "dtype=float32 for bf16 grad":
        kw["dtype"] = "float32"
    elif what == "dtype=bfloat8_b":
        kw["dtype"] = "bfloat8_b"
    elif what == "output_tensor f32 for bf16 grad":
        kw["output_tensor"] = np.zeros((1, 1, V, D), np.float32)
    elif what == "output_tensor wrong shape":
        kw["output_tensor"] = np.zeros((1, 1, V + 1, D), NP["bf16"])
    elif what == "grad f16":
        g = g.astype(np.float16)
    elif what == "indices u16":
        indices = indices.astype(np.uint16)
    else:
        indices[1, 1] = V
        kw["output_tensor"] = np.full((1, 1, V, D), 7.0, NP["bf16"])
    before = {k: v.copy() for k, v in kw.items() if isinstance(v, np.ndarray)}
    with pytest.raises(OpError) as e:
        runtime.ttnn.embedding_bw(indices, weight, g, **kw)
    assert e.value.status == status, e.value
    for k, v in before.items():
        assert np.array_equal(kw[k], v), f"{k} was written by a failing call"
