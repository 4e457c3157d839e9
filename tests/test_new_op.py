"""A new op written in a fresh ops directory runs in the oracle (and the CLI) with no change to
opgen/: SiLU backward against torch autograd of ``silu``."""

from __future__ import annotations

import sys
import uuid

import numpy as np
import pytest
import torch

from opgen import cli, oracle, registry
from opgen.binding import OpError
from tests.reference import NP, assert_close_policy, assert_f64_close, rounded, t64, tt

SILU = '''\
"""SiLU backward: d/dx of x * sigmoid(x), times the incoming gradient."""

from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f16, bf16, f32)


@op
def silu_backward(grad: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], *,
                  dx: Output[T, Batch(N), D]):
    """``dx = grad * s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``."""
    s = sigmoid(x)
    return {"dx": grad * s * (1 + x * (1 - s))}
'''


def torch_silu_grad(grad, x, T):
    xt = t64(x, requires_grad=True) if T == "f64" else tt(x, T, requires_grad=True)
    g = t64(grad) if T == "f64" else tt(grad, T)
    torch.nn.functional.silu(xt).backward(g)
    return xt.grad


@pytest.fixture
def silu(op_files):
    return op_files({"silu_backward.py": SILU})["silu_backward"]


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 4)])
@pytest.mark.parametrize("T", ["f16", "bf16", "f32"])
def test_silu_backward_matches_torch_autograd(silu, rng, T, shape):
    x = rounded(rng.standard_normal(shape) * 4, T)
    grad = rounded(rng.standard_normal(shape), T)
    x.reshape(-1)[:3] = [0.0, 30.0, -30.0]  # saturated sigmoid at both ends
    out = oracle.run(silu, grad=grad, x=x)["dx"]
    assert out.dtype == NP[T] and out.shape == shape
    assert_close_policy(out, torch_silu_grad(grad, x, "f64"), torch_silu_grad(grad, x, T), T, "dx")
    exact = oracle.run(silu, precision="f64", grad=grad, x=x)["dx"]
    assert_f64_close(exact, torch_silu_grad(grad, x, "f64"), "dx (f64)")


def test_silu_backward_validates_like_any_op(silu):
    with pytest.raises(OpError) as e:
        oracle.run(silu, grad=np.zeros((2, 3), np.float32), x=np.zeros((2, 3), np.float16))
    assert e.value.status == "dtype"
    with pytest.raises(OpError) as e:
        oracle.run(silu, grad=np.zeros((2, 3), np.float32), x=np.zeros((3, 2), np.float32))
    assert e.value.status == "shape"


def test_opgen_ops_dir_env_selects_the_new_ops(tmp_path, monkeypatch, capsys, rng):
    d = tmp_path / f"opgen_test_ops_{uuid.uuid4().hex[:10]}"
    d.mkdir()
    (d / "silu_backward.py").write_text(SILU)
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    monkeypatch.setenv("OPGEN_OPS_DIR", str(d))
    registry.load_all.cache_clear()
    try:
        o = registry.get("silu_backward")
        assert list(registry.load_all()) == ["silu_backward"]
        x = rounded(rng.standard_normal((3, 4)), "f32")
        g = rounded(rng.standard_normal((3, 4)), "f32")
        assert_f64_close(oracle.run(o, precision="f64", grad=g, x=x)["dx"],
                         torch_silu_grad(g, x, "f64"))
        assert cli.main(["list"]) == 0
        assert "silu_backward" in capsys.readouterr().out
        assert cli.main(["eval", "silu_backward", "--dims", "N=3,D=2", "--dtype", "T=bf16"]) == 0
        assert "output dx: shape (3, 2) bfloat16" in capsys.readouterr().out
    finally:
        registry.load_all.cache_clear()
        sys.path[:] = saved_path
        for m in set(sys.modules) - saved_modules:
            if m.startswith("opgen_test_ops_"):
                del sys.modules[m]
