"""aclnnEmbeddingDenseBackward (SPEC §2): the oracle against
``torch.ops.aten.embedding_dense_backward`` in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import oracle
from opgen.binding import OpError
from tests.reference import NP, assert_close_policy, assert_f64_close, rounded, t64, tt

T_ALL = ("f32", "f16", "bf16")
IDX_ALL = ("f32", "f16", "f64", "i32", "i64", "i16", "i8", "u8", "bool")
FLOAT_IDX = ("f32", "f16", "f64")


@pytest.fixture
def op(ops):
    return ops["embedding_dense_backward"]


def as_int64(padding_idx: int) -> int:
    """paddingIdx is a uint64 at the ABI, read as int64 (SPEC §2)."""
    return padding_idx - 2**64 if padding_idx >= 2**63 else padding_idx


def long_indices(indices: np.ndarray) -> torch.Tensor:
    """The indices as the op must read them: floats truncated toward zero, bool as 0/1."""
    return torch.tensor(np.trunc(indices.astype(np.float64)).astype(np.int64))


def ref(grad, indices, V, padding_idx=-1, scale=False):
    return torch.ops.aten.embedding_dense_backward(t64(grad), long_indices(indices), V,
                                                   as_int64(padding_idx), scale)


def torch_same(grad, indices, V, T, padding_idx=-1, scale=False):
    return torch.ops.aten.embedding_dense_backward(tt(grad, T), long_indices(indices), V,
                                                   as_int64(padding_idx), scale)


def make_indices(rng, shape, V, IT):
    """Indices in [0, V) of dtype IT, with duplicates; float indices get a fractional part that
    truncation must drop; bool indices can only be 0/1."""
    if IT == "bool":
        return rng.random(shape) < 0.5
    i = rng.integers(0, V, shape)
    i.reshape(-1)[:3] = V - 1  # duplicates
    if IT in FLOAT_IDX:
        return (i + rng.choice([0.0, 0.25, 0.7], shape)).astype(NP[IT])
    return i.astype(NP[IT])


def run_and_check(op, grad, indices, V, T, padding_idx=-1, scale=False, **kw):
    out = oracle.run(op, grad=grad, indices=indices, num_weights=V, padding_idx=padding_idx,
                     scale_grad_by_freq=scale, **kw)["out"]
    assert out.shape == (V, grad.shape[-1])
    assert_close_policy(out, ref(grad, indices, V, padding_idx, scale),
                        torch_same(grad, indices, V, T, padding_idx, scale), T, "out")
    exact = oracle.run(op, precision="f64", grad=grad, indices=indices, num_weights=V,
                       padding_idx=padding_idx, scale_grad_by_freq=scale)["out"]
    assert_f64_close(exact, ref(grad, indices, V, padding_idx, scale), "out (f64)")
    return out


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("IT", IDX_ALL)
@pytest.mark.parametrize("T", T_ALL)
def test_dtypes_match_torch(op, rng, T, IT, scale):
    V, D = 6, 5
    indices = make_indices(rng, (3, 4), V, IT)
    grad = rounded(rng.standard_normal((3, 4, D)), T)
    run_and_check(op, grad, indices, V, T, padding_idx=1, scale=scale)


@pytest.mark.parametrize("padding_idx", [-1, -3, 0, 3, 6, 7, 100, 2**63 - 1, 2**64 - 1, 2**64 - 3,
                                         2**63])
@pytest.mark.parametrize("scale", [False, True])
def test_padding_idx(op, rng, padding_idx, scale):
    """In range: that row is skipped (stays 0). Negative (also as the uint64 ABI's 2**64-k)
    or >= num_weights: no padding row."""
    V, D = 7, 3
    indices = rng.integers(0, V, 20)
    indices[:V] = np.arange(V)  # every row used, so a skipped row is visible
    grad = rounded(rng.standard_normal((20, D)), "f32")
    out = run_and_check(op, grad, indices, V, "f32", padding_idx, scale)
    p = as_int64(padding_idx)
    for row in range(V):
        assert (not np.any(out[row])) == (row == p), row


def test_padding_idx_u64_reads_as_negative(op, rng):
    """The uint64 ABI value 2**64 - 1 means -1 (no padding): the last row is not skipped."""
    V = 4
    indices = np.array([3, 3, 0, 2])
    grad = rounded(rng.standard_normal((4, 2)), "f32")
    out = oracle.run(op, grad=grad, indices=indices, num_weights=V, padding_idx=2**64 - 1)["out"]
    assert np.all(out[3] != 0)
    expected = ref(grad, indices, V, -1)
    assert_close_policy(out, expected, torch_same(grad, indices, V, "f32", -1), "f32")


@pytest.mark.parametrize("scale", [False, True])
def test_duplicates_and_frequency_scaling(op, rng, scale):
    V, D = 4, 3
    indices = np.array([2, 2, 2, 0, 1, 1, 2])
    grad = rounded(rng.standard_normal((7, D)), "f32")
    out = run_and_check(op, grad, indices, V, "f32", padding_idx=-1, scale=scale)
    assert not np.any(out[3])


@pytest.mark.parametrize("rank", [2, 3, 4])
@pytest.mark.parametrize("T", T_ALL)
def test_grad_ranks(op, rng, T, rank):
    lead = (2, 3, 2)[: rank - 1]
    V, D = 5, 4
    indices = rng.integers(0, V, lead).astype(np.int64)
    grad = rounded(rng.standard_normal((*lead, D)), T)
    run_and_check(op, grad, indices, V, T, padding_idx=2, scale=True)


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3, 2)])
def test_empty_gives_zeros(op, lead):
    V, D = 3, 4
    grad = np.zeros((*lead, D), np.float32)
    out = oracle.run(op, grad=grad, indices=np.zeros(lead, np.int64), num_weights=V,
                     scale_grad_by_freq=True, out=np.full((V, D), 5.0, np.float32))["out"]
    assert np.array_equal(out, np.zeros((V, D), np.float32))
    assert np.array_equal(out, ref(grad, np.zeros(lead, np.int64), V, -1, True).numpy())


def test_num_weights_zero_with_no_indices(op):
    out = oracle.run(op, grad=np.zeros((0, 2), np.float32), indices=np.zeros(0, np.int32),
                     num_weights=0)["out"]
    assert out.shape == (0, 2)


@pytest.mark.parametrize("T", ("f32", "bf16"))
def test_noncontiguous_grad(op, rng, T):
    """Transposed leading dims, strided rows, a non-contiguous last dim and strided indices:
    grad has no layout rule, so every view must give the right answer."""
    V, D = 6, 4
    base = rounded(rng.standard_normal((3, 5, 2 * D)), T)
    for grad in (
        base[:, :, :D].transpose(1, 0, 2),  # (5, 3, D): leading dims transposed
        base[::2, :, ::2],  # (2, 5, D): strided rows and last dim
        base[1, ::-1, 1::2],  # (5, D): reversed rows, last-dim stride 2
    ):
        assert not grad.flags.c_contiguous
        lead = grad.shape[:-1]
        indices = rng.integers(0, V, (*lead, 2))[..., 1]  # a strided view too
        run_and_check(op, grad, indices, V, T, padding_idx=2, scale=True)


@pytest.mark.parametrize("IT", FLOAT_IDX)
def test_float_indices_truncate_toward_zero(op, rng, IT):
    V = 4
    indices = np.array([2.7, 0.2, 1.999, -0.5, 3.5, 0.0], NP[IT])
    want = np.array([2, 0, 1, 0, 3, 0])
    grad = rounded(rng.standard_normal((6, 3)), "f32")
    out = oracle.run(op, grad=grad, indices=indices, num_weights=V)["out"]
    expected = torch.ops.aten.embedding_dense_backward(t64(grad), torch.tensor(want), V, -1, False)
    assert_close_policy(out, expected, torch.ops.aten.embedding_dense_backward(
        tt(grad, "f32"), torch.tensor(want), V, -1, False), "f32")


def test_bool_indices(op, rng):
    indices = np.array([True, False, True, True])
    grad = rounded(rng.standard_normal((4, 3)), "f16")
    out = run_and_check(op, grad, indices, 3, "f16", padding_idx=0)
    assert not np.any(out[0]) and not np.any(out[2])


@pytest.mark.parametrize(("IT", "bad"), [("i64", 5), ("i32", -1), ("i8", -100), ("f32", 5.5),
                                        ("f16", -1.5), ("u8", 200), ("f64", 1e10)])
def test_out_of_range_index_leaves_out_untouched(op, rng, IT, bad):
    V, D = 5, 3
    indices = rng.integers(0, V, 6).astype(NP[IT])
    indices[3] = bad
    grad = rounded(rng.standard_normal((6, D)), "f32")
    out = np.full((V, D), 7.0, np.float32)
    with pytest.raises(OpError) as e:
        oracle.run(op, grad=grad, indices=indices, num_weights=V, out=out)
    assert e.value.status == "index"
    assert np.array_equal(out, np.full((V, D), 7.0, np.float32))


def test_out_of_range_on_padding_value_still_fails(op):
    """An index equal to an out-of-range padding_idx is still out of range."""
    with pytest.raises(OpError) as e:
        oracle.run(op, grad=np.ones((2, 2), np.float32), indices=np.array([0, 4]), num_weights=4,
                   padding_idx=4)
    assert e.value.status == "index"


@pytest.mark.parametrize("T", ("f32", "f16"))
def test_nonfinite_grad(op, rng, T):
    """NaN/Inf propagate exactly as in torch, except in padding rows, which are never read."""
    V = 4
    indices = np.array([0, 1, 2, 2, 3, 1])
    grad = rounded(rng.standard_normal((6, 3)), T)
    grad[1, 0] = np.nan  # row 1 (padding) -> dropped
    grad[2, 1] = np.inf
    grad[3, 1] = 1.0
    grad[4, 2] = -np.inf
    grad[0, 2] = np.nan
    out = run_and_check(op, grad, indices, V, T, padding_idx=1)
    assert np.isnan(out[0, 2]) and not np.any(out[1]) and out[2, 1] == np.inf


def test_given_out_array_is_not_accumulated(op, rng):
    """out = zeros first: prior contents of the caller's array do not leak in."""
    grad = rounded(rng.standard_normal((4, 2)), "f32")
    indices = np.array([0, 1, 1, 2])
    out = oracle.run(op, grad=grad, indices=indices, num_weights=3,
                     out=np.full((3, 2), np.nan, np.float32))["out"]
    assert_close_policy(out, ref(grad, indices, 3), torch_same(grad, indices, 3, "f32"), "f32")


@pytest.mark.parametrize(("change", "status"), [
    ({"grad": np.zeros((2, 3, 4), np.float64)}, "dtype"),
    ({"indices": np.zeros((2, 3), np.int64).astype(np.uint32)}, "dtype"),
    ({"indices": np.zeros((3, 2), np.int64)}, "shape"),
    ({"indices": np.zeros(6, np.int64)}, "shape"),
    ({"out": np.zeros((5, 4), np.float16)}, "dtype"),
    ({"out": np.zeros((4, 4), np.float32)}, "shape"),
    ({"out": np.zeros((1, 5, 4), np.float32)}, "shape"),
    ({"grad": np.zeros((4,), np.float32), "indices": np.zeros((), np.int64)}, "shape"),
    ({"num_weights": -1}, "param"),
    ({"num_weights": None}, "null"),
])
def test_bad_arguments(op, change, status):
    args = {"grad": np.zeros((2, 3, 4), np.float32), "indices": np.zeros((2, 3), np.int64),
            "num_weights": 5}
    args.update(change)
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == status
