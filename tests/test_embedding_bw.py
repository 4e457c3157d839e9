"""ttnn.embedding_bw (SPEC §5): ``out[idx] += grad`` against torch ``index_add_`` in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import oracle
from opgen.binding import OpError
from tests.reference import NP, TORCH, assert_close_policy, assert_f64_close, rounded, t64, tlong, tt


@pytest.fixture
def op(ops):
    return ops["embedding_bw"]


def ref(indices, grad, V):
    return torch.zeros((V, grad.shape[1]), dtype=torch.float64).index_add_(0, tlong(indices), t64(grad))


def torch_same(indices, grad, V, T):
    return torch.zeros((V, grad.shape[1]), dtype=TORCH[T]).index_add_(0, tlong(indices), tt(grad, T))


@pytest.mark.parametrize("W", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("IT", ["u32", "i32", "i64"])
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_matches_torch(op, rng, T, IT, W):
    N, D, V = 12, 6, 7
    indices = rng.integers(0, V, N).astype(NP[IT])
    indices[:4] = 3  # duplicates
    grad = rounded(rng.standard_normal((N, D)), T)
    weight = np.full((V, D), np.nan, NP[W])  # weight only supplies V: its values are never read
    out = oracle.run(op, indices=indices, weight=weight, grad=grad)["out"]
    assert out.shape == (V, D)
    assert_close_policy(out, ref(indices, grad, V), torch_same(indices, grad, V, T), T, "out")
    exact = oracle.run(op, precision="f64", indices=indices, weight=weight, grad=grad)["out"]
    assert_f64_close(exact, ref(indices, grad, V), "out (f64)")


def test_given_output_is_overwritten_not_accumulated(op, rng):
    grad = rounded(rng.standard_normal((5, 3)), "bf16")
    indices = np.array([4, 0, 4, 1, 1], np.uint32)
    out = oracle.run(op, indices=indices, weight=np.zeros((6, 3), np.float32), grad=grad,
                     out=np.full((6, 3), 9, grad.dtype))["out"]
    assert_close_policy(out, ref(indices, grad, 6), torch_same(indices, grad, 6, "bf16"), "bf16")


def test_many_duplicates_accumulate_once_rounded(op, rng):
    """bf16 gradients summed 64 times into one row: f32 accumulation and one rounding must be
    at least as accurate as torch's own bf16 index_add_."""
    grad = rounded(rng.standard_normal((64, 4)), "bf16")
    indices = np.zeros(64, np.int32)
    out = oracle.run(op, indices=indices, weight=np.zeros((2, 4), np.float32), grad=grad)["out"]
    assert_close_policy(out, ref(indices, grad, 2), torch_same(indices, grad, 2, "bf16"), "bf16")
    assert not np.any(out[1].astype(np.float64))


def test_empty_gives_zeros(op):
    out = oracle.run(op, indices=np.zeros(0, np.uint32), weight=np.zeros((3, 4), np.float32),
                     grad=np.zeros((0, 4), np.float32))["out"]
    assert np.array_equal(out, np.zeros((3, 4), np.float32))


def test_noncontiguous_inputs(op, rng):
    big = rounded(rng.standard_normal((10, 8)), "f32")
    grad = big[::2, 1::2]
    indices = rng.integers(0, 3, 10).astype(np.int64)[1::2]
    out = oracle.run(op, indices=indices, weight=np.zeros((3, 4), np.float32), grad=grad)["out"]
    g = np.ascontiguousarray(grad)
    assert_close_policy(out, ref(indices, g, 3), torch_same(indices, g, 3, "f32"), "f32")


@pytest.mark.parametrize(("IT", "bad"), [("u32", 5), ("u32", 2**32 - 1), ("i32", -1), ("i64", 2**40)])
def test_out_of_range_index(op, IT, bad):
    indices = np.array([0, 1, bad, 2], dtype=NP[IT])
    with pytest.raises(OpError) as e:
        oracle.run(op, indices=indices, weight=np.zeros((5, 2), np.float32),
                   grad=np.ones((4, 2), np.float32))
    assert e.value.status == "index"


@pytest.mark.parametrize(("change", "status"), [
    ({"indices": np.zeros(4, np.uint16)}, "dtype"),
    ({"indices": np.zeros(4, np.float32)}, "dtype"),
    ({"grad": np.zeros((4, 2), np.float16)}, "dtype"),
    ({"out": np.zeros((5, 2), np.float32).astype(np.float64)}, "dtype"),
    ({"weight": np.zeros((5, 3), np.float32)}, "shape"),
    ({"indices": np.zeros(3, np.uint32)}, "shape"),
    ({"weight": np.zeros((5, 2), np.int32)}, "dtype"),
])
def test_bad_arguments(op, change, status):
    args = {"indices": np.zeros(4, np.uint32), "weight": np.zeros((5, 2), np.float32),
            "grad": np.zeros((4, 2), np.float32)}
    args.update(change)
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == status


def test_torch_tensors_are_accepted(op, rng):
    """The binding reads torch CPU tensors directly (bf16 included)."""
    grad = torch.tensor(rng.standard_normal((4, 3)), dtype=torch.bfloat16)
    indices = torch.tensor([1, 0, 1, 2], dtype=torch.int32)
    out = oracle.run(op, indices=indices, weight=torch.zeros(3, 3), grad=grad)["out"]
    expected = torch.zeros(3, 3, dtype=torch.float64).index_add_(0, indices.long(), grad.double())
    same = torch.zeros(3, 3, dtype=torch.bfloat16).index_add_(0, indices.long(), grad)
    assert_close_policy(out, expected, same, "bf16")
