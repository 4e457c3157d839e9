"""Drop-in functions whose forward is PyTorch's and whose backward runs opgen's kernels.

* :func:`embedding` — ``torch.nn.functional.embedding``; backward: ``embedding_dense_backward``.
* :func:`rms_norm` — ``torch.nn.functional.rms_norm`` over the last dim; backward:
  ``rms_norm_backward`` (with epsilon).
* :func:`fused_linear_cross_entropy` — ``cross_entropy(hidden @ weight.T, target)`` without
  materialising the ``BT x V`` logits: the forward computes each row's max and sum of exponentials
  over row chunks (keeping them), the backward recomputes the logits tile by tile in opgen's
  memory-saving cross-entropy gradient (``fused_linear_cross_entropy_loss_grad`` for f16/bf16,
  ``linear_cross_entropy_grad`` for f32).
* :func:`vocab_parallel_fused_linear_cross_entropy` — the same with ``weight`` split over the
  ranks of a ``torch.distributed`` group by vocabulary rows (each rank holds ``V / world`` rows):
  the row statistics are all-reduced and targets outside a rank's shard are masked, the setting
  CANN's FusedLinearCrossEntropyLossGrad was designed for.

Each is an ``autograd.Function``; ``torch.compile`` traces them (the opgen ops have fake
implementations).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

#: logits bytes one forward chunk may hold (rows per chunk = this / (4 * V))
CHUNK_BYTES = 64 << 20


class _Embedding(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, indices: torch.Tensor, weight: torch.Tensor, padding_idx: int, scale: bool) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.num_weights, ctx.padding_idx, ctx.scale = weight.shape[0], padding_idx, scale
        return torch.nn.functional.embedding(indices, weight, padding_idx if padding_idx >= 0 else None)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (indices,) = ctx.saved_tensors
        gw = torch.ops.opgen.embedding_dense_backward(grad.contiguous(), indices, ctx.num_weights, ctx.padding_idx,
                                                      ctx.scale)
        return None, gw, None, None


def embedding(input: torch.Tensor, weight: torch.Tensor, padding_idx: int | None = None,  # noqa: A002 - torch's name
              scale_grad_by_freq: bool = False) -> torch.Tensor:
    """``torch.nn.functional.embedding(input, weight, padding_idx, scale_grad_by_freq=...)``;
    the weight gradient is opgen's ``embedding_dense_backward`` (deterministic)."""
    v = weight.shape[0]
    if padding_idx is None:
        p = -1
    elif -v <= padding_idx < v:
        p = padding_idx + v if padding_idx < 0 else padding_idx
    else:
        raise ValueError(f"padding_idx {padding_idx} must be within num_embeddings ({v})")
    return _Embedding.apply(input, weight, p, bool(scale_grad_by_freq))


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, weight = ctx.saved_tensors
        gx, gw = torch.ops.opgen.rms_norm_backward(grad.contiguous(), x.contiguous(), weight, ctx.eps)
        return gx, gw, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``torch.nn.functional.rms_norm(x, (D,), weight, eps)`` over the last dim ``D``; the
    backward is opgen's ``rms_norm_backward`` (``grad_x`` and ``grad_w``)."""
    return _RMSNorm.apply(x, weight, float(eps))


def _row_stats(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
               valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row: the logits' max, the sum of ``exp(logit - max)`` and the target's logit (0 where
    ``valid`` is false), computed over row chunks of at most :data:`CHUNK_BYTES` of logits."""
    n, v = hidden.shape[0], weight.shape[0]
    rows = max(1, CHUNK_BYTES // (4 * max(v, 1)))
    m = torch.empty(n, dtype=torch.float32, device=hidden.device)
    se = torch.empty_like(m)
    tl = torch.empty_like(m)
    t = torch.where(valid, target, 0).to(torch.int64)
    for s in range(0, n, rows):
        logits = (hidden[s:s + rows] @ weight.T).float()
        m[s:s + rows] = logits.max(dim=1).values
        se[s:s + rows] = (logits - m[s:s + rows, None]).exp().sum(dim=1)
        tl[s:s + rows] = torch.where(valid[s:s + rows], logits.gather(1, t[s:s + rows, None]).squeeze(1), 0.0)
    return m, se, tl


def _grad_op(dtype: torch.dtype) -> Any:
    if dtype in (torch.float16, torch.bfloat16):
        return lambda g, x, w, outside, t, m, se: torch.ops.opgen.fused_linear_cross_entropy_loss_grad(
            g, x, w, outside, t, 0.0, m, se)
    return lambda g, x, w, outside, t, m, se: torch.ops.opgen.linear_cross_entropy_grad(g, x, w, outside, t, m, se)


def _reduce(loss: torch.Tensor, n_valid: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "mean":
        return loss.sum() / n_valid
    if reduction == "sum":
        return loss.sum()
    return loss


def _row_grads(grad: torch.Tensor, valid: torch.Tensor, n_valid: torch.Tensor, reduction: str) -> torch.Tensor:
    g = grad.float()
    if reduction == "mean":
        g = (g / n_valid).expand(valid.shape)
    elif reduction == "sum":
        g = g.expand(valid.shape)
    return torch.where(valid, g, 0.0).contiguous()


class _FusedLinearCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, ignore_index: int,
                reduction: str, group: Any) -> torch.Tensor:
        v0 = 0
        if group is not None:  # this rank's rows of the vocabulary
            v0 = dist.get_rank(group) * weight.shape[0]
        local = target - v0
        valid = target != ignore_index
        inside = valid & (local >= 0) & (local < weight.shape[0])
        m, se, tl = _row_stats(hidden, weight, local, inside)
        if group is not None:  # global row max, then the sums rescaled to it
            gm = m.clone()
            dist.all_reduce(gm, dist.ReduceOp.MAX, group=group)
            se = se * torch.exp(m - gm)
            m = gm
            dist.all_reduce(se, dist.ReduceOp.SUM, group=group)
            dist.all_reduce(tl, dist.ReduceOp.SUM, group=group)
        loss = torch.where(valid, torch.log(se) + m - tl, 0.0)
        n_valid = valid.sum().float()
        ctx.save_for_backward(hidden, weight, local, valid, inside, m, se, n_valid)
        ctx.reduction, ctx.group = reduction, group
        return _reduce(loss, n_valid, reduction)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        hidden, weight, local, valid, inside, m, se, n_valid = ctx.saved_tensors
        g = _row_grads(grad, valid, n_valid, ctx.reduction)
        t = torch.where(inside, local, 0)
        gx, gw = _grad_op(hidden.dtype)(g, hidden.contiguous(), weight.contiguous(), ~inside, t, m, se)
        if ctx.group is not None:  # every shard's share of the input gradient
            dist.all_reduce(gx, dist.ReduceOp.SUM, group=ctx.group)
        return gx, gw, None, None, None, None


def _check(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, reduction: str) -> None:
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
    if hidden.dim() != 2 or weight.dim() != 2 or target.dim() != 1:
        raise ValueError(f"hidden (BT, H), weight (V, H) and target (BT,) expected, got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(target.shape)}")


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               ignore_index: int = -100, reduction: str = "mean") -> torch.Tensor:
    """``cross_entropy(hidden @ weight.T, target, ignore_index=..., reduction=...)`` for hidden
    ``(BT, H)``, weight ``(V, H)`` (V >= 128), target ``(BT,)`` integer class indices, without
    materialising the ``BT x V`` logits in either pass."""
    _check(hidden, weight, target, reduction)
    return _FusedLinearCE.apply(hidden, weight, target, int(ignore_index), reduction, None)


def vocab_parallel_fused_linear_cross_entropy(hidden: torch.Tensor, weight_shard: torch.Tensor,
                                              target: torch.Tensor, ignore_index: int = -100,
                                              reduction: str = "mean", group: Any = None) -> torch.Tensor:
    """:func:`fused_linear_cross_entropy` with the vocabulary split over the ranks of ``group``
    (default: the world): rank ``r`` holds rows ``[r * Vs, (r + 1) * Vs)`` of the weight as
    ``weight_shard`` (``Vs`` rows on every rank); ``hidden`` and ``target`` are the same on every
    rank. Every rank gets the same loss and the full input gradient; each its shard's weight
    gradient."""
    _check(hidden, weight_shard, target, reduction)
    return _FusedLinearCE.apply(hidden, weight_shard, target, int(ignore_index), reduction,
                                group if group is not None else dist.group.WORLD)
