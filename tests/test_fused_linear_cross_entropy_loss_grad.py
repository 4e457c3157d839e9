"""aclnnFusedLinearCrossEntropyLossGrad (SPEC §4): the oracle against the SPEC formula evaluated
by torch in float64, and against real autograd of ``cross_entropy`` for a single shard."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import oracle
from opgen.binding import OpError
from tests.reference import NP, TORCH, assert_close_policy, assert_f64_close, f64, rounded, t64, tt

T_ALL = ("f16", "bf16")


@pytest.fixture
def op(ops):
    return ops["fused_linear_cross_entropy_loss_grad"]


class Case:
    """Inputs of one call, all already in their storage dtypes."""

    def __init__(self, rng, T, TI="i32", BT=6, H=8, V=130, mask_p=0.4):
        self.T = T
        X = rounded(rng.standard_normal((BT, H)), T)
        W = rounded(rng.standard_normal((V, H)) * 0.5, T)
        logits = f64(X) @ f64(W).T
        lmax = logits.max(axis=1)
        self.input, self.weight = X, W
        self.grad = rounded(rng.standard_normal(BT), "f32")
        self.softmax = rounded(np.exp(logits - lmax[:, None]) /
                               np.exp(logits - lmax[:, None]).sum(1, keepdims=True), "f32")
        self.logits_max = rounded(lmax, "f32")
        self.sum_exp_logits = rounded(np.exp(logits - f64(self.logits_max)[:, None]).sum(1), "f32")
        self.target = rng.integers(0, V, BT).astype(NP[TI])
        self.mask = rng.random(BT) < mask_p  # True: target outside this shard

    def args(self, mode, mask="packed"):
        m = {"packed": np.packbits(self.mask, bitorder="little"),
             "packed_long": np.concatenate([np.packbits(self.mask, bitorder="little"),
                                            np.array([0xFF, 0xA5], np.uint8)]),
             "bool": self.mask.copy()}[mask]
        a = {"grad": self.grad, "input": self.input, "weight": self.weight, "target_mask": m,
             "masked_target": self.target}
        if mode == "softmax":
            a["softmax"] = self.softmax
        else:
            a["logits_max"], a["sum_exp_logits"] = self.logits_max, self.sum_exp_logits
        return a

    def probs(self, mode, dtype):
        """G before the target correction, computed by torch in ``dtype`` ("f64": reference;
        else PyTorch's own: logits in T, then f32 exponentials)."""
        if mode == "softmax":
            return t64(self.softmax) if dtype == "f64" else tt(self.softmax, "f32")
        if dtype == "f64":
            logits = t64(self.input) @ t64(self.weight).T
            lmax, sumexp = t64(self.logits_max), t64(self.sum_exp_logits)
        else:
            logits = (tt(self.input, dtype) @ tt(self.weight, dtype).T).float()
            lmax, sumexp = tt(self.logits_max, "f32"), tt(self.sum_exp_logits, "f32")
        return torch.exp(logits - lmax[:, None]) / sumexp[:, None]

    def grads(self, mode, dtype):
        """(dX, dW) by the SPEC formula: G[i, t[i]] -= 1 - m[i]; G *= grad; dX = G W; dW = G^T X."""
        G = self.probs(mode, dtype).clone()
        rows = torch.arange(G.shape[0])
        G[rows, torch.tensor(self.target.astype(np.int64))] -= torch.tensor(1.0 - self.mask, dtype=G.dtype)
        wd = torch.float64 if dtype == "f64" else torch.float32
        G = G.to(wd) * torch.tensor(f64(self.grad), dtype=wd)[:, None]
        if dtype == "f64":
            return G @ t64(self.weight), G.T @ t64(self.input)
        Gt = G.to(TORCH[dtype])
        return Gt @ tt(self.weight, dtype), Gt.T @ tt(self.input, dtype)


@pytest.mark.parametrize("mask", ["packed", "packed_long", "bool"])
@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("TI", ["i32", "i64"])
@pytest.mark.parametrize("T", T_ALL)
def test_matches_formula(op, rng, T, TI, mode, mask):
    c = Case(rng, T, TI)
    a = c.args(mode, mask)
    softmax_before = c.softmax.copy()
    out = oracle.run(op, **a)
    assert np.array_equal(c.softmax, softmax_before), "the softmax input was modified"
    rx, rw = c.grads(mode, "f64")
    sx, sw = c.grads(mode, T)
    assert_close_policy(out["input_grad"], rx, sx, T, "input_grad")
    assert_close_policy(out["weight_grad"], rw, sw, T, "weight_grad")
    exact = oracle.run(op, precision="f64", **a)
    assert_f64_close(exact["input_grad"], rx, "input_grad (f64)")
    assert_f64_close(exact["weight_grad"], rw, "weight_grad (f64)")


@pytest.mark.parametrize("mask_p", [0.0, 1.0])
def test_mask_all_inside_or_all_outside(op, rng, mask_p):
    c = Case(rng, "bf16", mask_p=mask_p)
    exact = oracle.run(op, precision="f64", **c.args("softmax"))
    rx, rw = c.grads("softmax", "f64")
    assert_f64_close(exact["input_grad"], rx, "input_grad")
    assert_f64_close(exact["weight_grad"], rw, "weight_grad")


def test_mask_bit_order_is_lsb_first(op, rng):
    """Only row 1 is outside the shard: byte 0b00000010. Reading MSB first would mark row 6."""
    c = Case(rng, "f16", BT=8)
    c.mask = np.zeros(8, bool)
    c.mask[1] = True
    a = c.args("softmax")
    assert a["target_mask"].tolist() == [2]
    exact = oracle.run(op, precision="f64", **a)
    assert_f64_close(exact["input_grad"], c.grads("softmax", "f64")[0], "input_grad")


def test_softmax_mode_ignores_logits_max_and_sum_exp(op, rng):
    c = Case(rng, "f16")
    a = c.args("softmax")
    nan = np.full_like(c.logits_max, np.nan)
    out = oracle.run(op, precision="f64", logits_max=nan, sum_exp_logits=nan, **a)
    rx, rw = c.grads("softmax", "f64")
    assert_f64_close(out["input_grad"], rx, "input_grad")
    assert_f64_close(out["weight_grad"], rw, "weight_grad")


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("T", T_ALL)
def test_single_shard_matches_cross_entropy_autograd(op, rng, T, mode):
    """m = 0 and one shard: dX, dW are the gradients of sum_i grad_i * CE(X_i W^T, t_i)."""
    c = Case(rng, T, "i64", BT=7, H=6, V=128, mask_p=0.0)
    X, W = t64(c.input, requires_grad=True), t64(c.weight, requires_grad=True)
    ce = torch.nn.functional.cross_entropy(X @ W.T, torch.tensor(c.target), reduction="none")
    (ce * t64(c.grad)).sum().backward()
    a = c.args(mode)
    exact = oracle.run(op, precision="f64", **a)
    # softmax / logits_max / sum_exp arrive rounded to f32: a few f32 ulps of G
    assert_f64_close(exact["input_grad"], X.grad, "input_grad vs autograd", rtol=1e-6)
    assert_f64_close(exact["weight_grad"], W.grad, "weight_grad vs autograd", rtol=1e-6)
    # and the stored result against torch's own autograd in dtype T (f32 loss math)
    Xt, Wt = tt(c.input, T, requires_grad=True), tt(c.weight, T, requires_grad=True)
    logits = (Xt @ Wt.T).float()
    ce_t = torch.nn.functional.cross_entropy(logits, torch.tensor(c.target), reduction="none")
    (ce_t * tt(c.grad, "f32")).sum().backward()
    out = oracle.run(op, **a)
    assert_close_policy(out["input_grad"], X.grad, Xt.grad, T, "input_grad")
    assert_close_policy(out["weight_grad"], W.grad, Wt.grad, T, "weight_grad")


def test_empty_batch(op, rng):
    c = Case(rng, "bf16", BT=0)
    out = oracle.run(op, **c.args("memory_saving"))
    assert out["input_grad"].shape == (0, 8)
    assert np.array_equal(out["weight_grad"].astype(np.float64), np.zeros((130, 8)))


# ------------------------------------------------------------------------------ bad input


def _status(op, **a):
    with pytest.raises(OpError) as e:
        oracle.run(op, **a)
    return e.value.status


@pytest.mark.parametrize("ls", [0.1, -1e-3, 1.0])
def test_label_smoothing_is_bad_param(op, rng, ls):
    c = Case(rng, "f16")
    assert _status(op, label_smoothing=ls, **c.args("softmax")) == "param"


@pytest.mark.parametrize("V", [127, 64, 1])
def test_small_vocab_is_bad_param(op, rng, V):
    c = Case(rng, "f16", V=V)
    assert _status(op, **c.args("softmax")) == "param"
    assert _status(op, **c.args("memory_saving")) == "param"


@pytest.mark.parametrize("drop", [("softmax", "logits_max", "sum_exp_logits"),
                                  ("softmax", "logits_max"), ("softmax", "sum_exp_logits")])
def test_memory_saving_without_stats_is_null(op, rng, drop):
    c = Case(rng, "bf16")
    a = {**c.args("softmax"), "logits_max": c.logits_max, "sum_exp_logits": c.sum_exp_logits}
    for k in drop:
        a[k] = None
    assert _status(op, **a) == "null"


@pytest.mark.parametrize(("mask", "BT"), [(np.zeros(1, np.uint8), 9), (np.zeros(0, np.uint8), 1),
                                          (np.zeros(5, bool), 6)])
def test_mask_too_short(op, rng, mask, BT):
    c = Case(rng, "f16", BT=BT)
    a = c.args("softmax")
    a["target_mask"] = mask
    assert _status(op, **a) == "shape"


@pytest.mark.parametrize(("change", "status"), [
    ({"input": np.zeros((6, 8), np.float32)}, "dtype"),
    ({"weight": np.zeros((130, 8), np.float32)}, "dtype"),  # T is f16 from input
    ({"grad": np.zeros(6, np.float16)}, "dtype"),
    ({"masked_target": np.zeros(6, np.int16)}, "dtype"),
    ({"target_mask": np.zeros(1, np.int8)}, "dtype"),
    ({"target_mask": np.zeros((1, 1), np.uint8)}, "shape"),
    ({"softmax": np.zeros((6, 129), np.float32)}, "shape"),
    ({"softmax": np.zeros((6, 130), np.float16)}, "dtype"),
    ({"masked_target": np.zeros(5, np.int32)}, "shape"),
    ({"weight": np.zeros((130, 7), np.float16)}, "shape"),
    ({"input_grad": np.zeros((6, 8), np.float32)}, "dtype"),
    ({"weight_grad": np.zeros((8, 130), np.float16)}, "shape"),
])
def test_bad_arguments(op, rng, change, status):
    c = Case(rng, "f16")
    a = c.args("softmax")
    a.update(change)
    assert _status(op, **a) == status
