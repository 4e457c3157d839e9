"""opgen from PyTorch (``opgen.torch``): every op as ``torch.ops.opgen.<op>`` (checked by
``torch.library.opcheck`` and against the oracle), the drop-in functions against PyTorch's own
(forward and gradients), ``torch.compile`` without graph breaks, a tiny decoder LM trained 30
AdamW steps with opgen's functions against pure PyTorch, and the vocab-parallel loss on two gloo
ranks against one rank."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

import opgen.torch as otorch
from opgen import oracle, registry
from opgen.binding import OpError
from tests.cpu_cases import assert_c_close, bf16_products

torch.manual_seed(0)


def _np(t: torch.Tensor) -> np.ndarray:
    from opgen.binding import to_numpy

    return np.array(to_numpy(t))


# ------------------------------------------------------------------ custom ops


def test_every_op_is_a_torch_custom_op():
    for name, o in registry.load_all().items():
        packet = getattr(torch.ops.opgen, name)
        args = [a.name for a in packet.default._schema.arguments]
        assert args == [p.name for p in o.signature.params if not p.is_output], name


def test_cpu_and_cuda_kernels_are_registered():
    for name in registry.load_all():
        for key in ("CPU", "CUDA"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(f"opgen::{name}", key), (name, key)


def _rms_args(dt: torch.dtype) -> tuple:
    return (torch.randn(3, 4, 33, dtype=dt), torch.randn(3, 4, 33, dtype=dt), torch.randn(33, dtype=dt), 1e-5)


def _flce_args(dt: torch.dtype, seed_op: bool) -> tuple:
    bt, h, v = 9, 16, 130
    x, w = torch.randn(bt, h, dtype=dt), torch.randn(v, h, dtype=dt) * 0.3
    t = torch.randint(0, v, (bt,))
    outside = torch.zeros(bt, dtype=torch.bool)
    outside[2] = True
    logits = (x.float() @ w.float().T)
    m = logits.max(1).values
    se = (logits - m[:, None]).exp().sum(1)
    g = torch.rand(bt)
    if seed_op:
        return (g, x, w, outside, t, 0.0, m, se)
    return (g, x, w, outside, t, m, se)


OPCHECK = [
    ("rms_norm_backward", lambda: _rms_args(torch.float32)),
    ("rms_norm_backward", lambda: _rms_args(torch.bfloat16)),
    ("embedding_dense_backward", lambda: (torch.randn(2, 5, 8), torch.randint(0, 11, (2, 5)), 11, 3, True)),
    ("fused_linear_cross_entropy_loss_grad", lambda: _flce_args(torch.bfloat16, True)),
    ("linear_cross_entropy_grad", lambda: _flce_args(torch.float32, False)),
]


@pytest.mark.parametrize(("name", "make"), OPCHECK, ids=[f"{n}-{i}" for i, (n, _) in enumerate(OPCHECK)])
def test_custom_ops_pass_opcheck_and_match_the_oracle(name, make):
    """Schema, fake (meta) implementation and dispatch checked by torch.library.opcheck; values
    against the oracle run on the same inputs."""
    args = make()
    op = getattr(torch.ops.opgen, name).default
    torch.library.opcheck(op, args)
    got = op(*args)
    got = got if isinstance(got, tuple) else (got,)
    o = registry.get(name)
    names = [p.name for p in o.signature.params if not p.is_output]
    kw = {k: (_np(v) if isinstance(v, torch.Tensor) else v) for k, v in zip(names, args, strict=False)}
    want = oracle.run(o, **kw)
    for out, g in zip((p.name for p in o.signature.outputs if not p.optional), got, strict=True):
        assert_c_close(_np(g), want[out], f"{name}.{out}", bf16_products(name))


def test_fake_implementation_gives_shapes_without_running():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        g = torch.empty(4096, 8, 1024, dtype=torch.bfloat16)
        gx, gw = torch.ops.opgen.rms_norm_backward(g, g, torch.empty(1024, dtype=torch.bfloat16), 1e-6)
        assert gx.shape == g.shape and gw.shape == (1024,) and gx.dtype == torch.bfloat16
        out = torch.ops.opgen.embedding_dense_backward(torch.empty(2, 7, 64), torch.empty(2, 7, dtype=torch.int64),
                                                       32000)
        assert out.shape == (32000, 64)


def test_bad_input_raises_the_op_status():
    with pytest.raises(OpError) as e:
        torch.ops.opgen.rms_norm_backward(torch.randn(3, 5), torch.randn(3, 6), torch.randn(5))
    assert e.value.status == "shape"


def test_repeated_calls_bind_once_and_write_every_output_element(monkeypatch):
    """Calls on tensors of one layout are bound in Python once (runtime.output_plan, keyed on
    each tensor's dtype, shape, strides, device and layout); a large output is allocated
    uninitialised (torch.empty: no promise of zeros to the library) and every element written;
    a call of another layout is bound, and refused, as a first call."""
    import opgen.runtime as rt

    counted = {"n": 0}
    real = rt.bind

    def bind(*a, **kw):
        counted["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(rt, "bind", bind)
    rt._PLANS.clear()
    V, D = 8200, 1024  # (32.8 MB of f32: above binding.ZERO_FREE_MIN)
    g, idx = torch.randn(64, D), torch.randint(0, V, (64,))
    want = torch.ops.aten.embedding_dense_backward(g, idx, V, -1, False)
    for _ in range(3):
        torch.full((V, D), float("nan")).sum()  # (a freed block of NaNs the allocator may hand back)
        assert torch.equal(torch.ops.opgen.embedding_dense_backward(g, idx, V, -1, False), want)
    assert counted["n"] == 1
    with pytest.raises(OpError) as e:
        torch.ops.opgen.embedding_dense_backward(g, idx[:-1], V, -1, False)
    assert e.value.status == "shape" and counted["n"] == 2


# ------------------------------------------------------------------ drop-in functions


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_rms_norm_matches_torch(dt):
    x = torch.randn(2, 5, 48, dtype=dt, requires_grad=True)
    w = torch.randn(48, dtype=dt, requires_grad=True)
    g = torch.randn(2, 5, 48, dtype=dt)
    y = otorch.rms_norm(x, w, 1e-5)
    y.backward(g)
    x2, w2 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    torch.nn.functional.rms_norm(x2, (48,), w2, 1e-5).backward(g.double())
    tol = 1e-5 if dt == torch.float32 else 2e-2
    assert torch.allclose(x.grad.double(), x2.grad, rtol=tol, atol=tol)
    assert torch.allclose(w.grad.double(), w2.grad, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize(("padding_idx", "scale"), [(None, False), (3, False), (-2, True)])
def test_embedding_matches_torch(padding_idx, scale):
    idx = torch.randint(0, 12, (4, 9))
    idx[0, :3] = 3
    w = torch.randn(12, 16, requires_grad=True)
    w2 = w.detach().clone().requires_grad_()
    g = torch.randn(4, 9, 16)
    otorch.embedding(idx, w, padding_idx, scale).backward(g)
    torch.nn.functional.embedding(idx, w2, padding_idx, scale_grad_by_freq=scale).backward(g)
    assert torch.allclose(w.grad, w2.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_linear_cross_entropy_matches_torch(dt, reduction):
    bt, h, v = 37, 24, 300
    x = (torch.randn(bt, h) * 0.5).to(dt).requires_grad_()
    w = (torch.randn(v, h) * 0.2).to(dt).requires_grad_()
    t = torch.randint(0, v, (bt,))
    t[[1, 5, 6]] = -100
    loss = otorch.fused_linear_cross_entropy(x, w, t, reduction=reduction)
    gl = torch.rand(bt) if reduction == "none" else torch.tensor(1.5)
    loss.backward(gl)
    x2, w2 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.nn.functional.cross_entropy(x2 @ w2.T, t, reduction=reduction)
    ref.backward(gl.double())
    tol = 1e-5 if dt == torch.float32 else 2e-2
    assert torch.allclose(loss.double(), ref, rtol=tol, atol=tol)
    assert torch.allclose(x.grad.double(), x2.grad, rtol=tol, atol=tol)
    assert torch.allclose(w.grad.double(), w2.grad, rtol=tol, atol=tol)


def test_torch_compile_traces_without_graph_breaks():
    emb = torch.randn(64, 32, requires_grad=True)
    nw = torch.ones(32, requires_grad=True)
    head = (torch.randn(160, 32) * 0.1).requires_grad_()
    idx = torch.randint(0, 64, (6,))
    t = torch.randint(0, 160, (6,))

    def f(idx: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        h = otorch.rms_norm(otorch.embedding(idx, emb), nw)
        return otorch.fused_linear_cross_entropy(h, head, t)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    loss = compiled(idx, t)
    loss.backward()
    grads = [p.grad.clone() for p in (emb, nw, head)]
    for p in (emb, nw, head):
        p.grad = None
    ref = f(idx, t)
    ref.backward()
    assert torch.allclose(loss, ref, rtol=1e-6)
    for a, p in zip(grads, (emb, nw, head), strict=True):
        assert torch.allclose(a, p.grad, rtol=1e-5, atol=1e-7)


def test_torch_compile_of_a_model_with_inductor():
    """``torch.compile(model, fullgraph=True)`` with the default (inductor) backend: the
    model's loss and gradients match eager mode."""
    model = TinyLM(120, 16, use_opgen=True)
    idx = torch.randint(1, 120, (2, 7))
    t = torch.randint(0, 120, (2, 7))
    t[:, -1] = -100
    loss = torch.compile(model, fullgraph=True)(idx, t)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    ref = model(idx, t)
    ref.backward()
    assert torch.allclose(loss, ref, rtol=1e-5)
    for k, p in model.named_parameters():
        assert torch.allclose(grads[k], p.grad, rtol=1e-4, atol=1e-6), k


# ------------------------------------------------------------------ training parity


class TinyLM(torch.nn.Module):
    """embedding -> RMSNorm -> MLP (residual) -> RMSNorm -> LM head with the loss."""

    def __init__(self, vocab: int, dim: int, use_opgen: bool):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.emb = torch.nn.Parameter(torch.randn(vocab, dim, generator=g) * 0.5)
        self.n1 = torch.nn.Parameter(torch.ones(dim))
        self.up = torch.nn.Parameter(torch.randn(4 * dim, dim, generator=g) / dim ** 0.5)
        self.down = torch.nn.Parameter(torch.randn(dim, 4 * dim, generator=g) / (4 * dim) ** 0.5)
        self.n2 = torch.nn.Parameter(torch.ones(dim))
        self.head = torch.nn.Parameter(torch.randn(vocab, dim, generator=g) * 0.1)
        self.use_opgen = use_opgen

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        F = torch.nn.functional
        if self.use_opgen:
            h = otorch.rms_norm(otorch.embedding(idx, self.emb, padding_idx=0), self.n1)
        else:
            h = F.rms_norm(F.embedding(idx, self.emb, padding_idx=0), (h_dim := self.emb.shape[1],), self.n1, 1e-6)
        h = h + F.linear(F.silu(F.linear(h, self.up)), self.down)
        flat = h.reshape(-1, h.shape[-1])
        if self.use_opgen:
            return otorch.fused_linear_cross_entropy(otorch.rms_norm(flat, self.n2), self.head, target.reshape(-1))
        n = F.rms_norm(flat, (h_dim,), self.n2, 1e-6)
        return F.cross_entropy(n @ self.head.T, target.reshape(-1))


def test_training_parity_30_adamw_steps():
    """Loss at every step within 1e-5 (relative) and final weights within 1e-4 of pure PyTorch
    (f32; the kernels sum in other orders than PyTorch's, so bitwise equality is not expected)."""
    vocab, dim, steps = 200, 32, 30
    g = torch.Generator().manual_seed(2)
    batches = []
    for _ in range(steps):  # sequences x_{k+1} = f(x_k): learnable from the current token
        idx = torch.empty(4, 12, dtype=torch.int64)
        idx[:, 0] = torch.randint(1, vocab, (4,), generator=g)
        for k in range(1, 12):
            idx[:, k] = (idx[:, k - 1] * 7 + 3) % (vocab - 1) + 1
        tgt = torch.roll(idx, -1, 1)
        idx[:, -2:] = 0  # padding
        tgt[:, -3:] = -100  # ignored targets
        batches.append((idx, tgt))
    runs = []
    for use in (True, False):
        model = TinyLM(vocab, dim, use)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
        losses = []
        for idx, tgt in batches:
            opt.zero_grad()
            loss = model(idx, tgt)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        runs.append((losses, {k: v.detach().clone() for k, v in model.state_dict().items()}))
    (ours, w_ours), (ref, w_ref) = runs
    assert ref[-1] < ref[0] * 0.7, f"the reference model did not learn: {ref}"
    assert np.allclose(ours, ref, rtol=1e-5, atol=1e-6), list(zip(ours, ref, strict=True))
    for k in w_ref:
        assert torch.allclose(w_ours[k], w_ref[k], rtol=1e-4, atol=1e-5), k


# ------------------------------------------------------------------ vocab-parallel (gloo)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _vocab_parallel_worker(rank: int, world: int, port: int, data: dict, out: dict) -> None:
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        vs = data["w"].shape[0] // world
        x = data["x"].clone().requires_grad_()
        w = data["w"][rank * vs:(rank + 1) * vs].clone().requires_grad_()
        loss = otorch.vocab_parallel_fused_linear_cross_entropy(x, w, data["t"])
        loss.backward()
        out[rank] = (loss.detach(), x.grad, w.grad)
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_on_two_gloo_ranks_matches_one_rank():
    bt, h, v = 23, 16, 512
    data = {"x": torch.randn(bt, h) * 0.5, "w": torch.randn(v, h) * 0.2, "t": torch.randint(0, v, (bt,))}
    data["t"][[0, 7]] = -100
    x = data["x"].clone().requires_grad_()
    w = data["w"].clone().requires_grad_()
    ref = otorch.fused_linear_cross_entropy(x, w, data["t"])
    ref.backward()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_vocab_parallel_worker, args=(2, _free_port(), data, out), nprocs=2, join=True)
        results = dict(out)
    for rank in (0, 1):
        loss, gx, gw = results[rank]
        assert torch.allclose(loss, ref.detach(), rtol=1e-5)
        assert torch.allclose(gx, x.grad, rtol=1e-4, atol=1e-6)
        assert torch.allclose(gw, w.grad[rank * 256:(rank + 1) * 256], rtol=1e-5, atol=1e-7)
