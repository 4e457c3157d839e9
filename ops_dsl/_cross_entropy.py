"""Math shared by the cross-entropy gradient ops: softmax minus the one-hot target, through a
linear layer."""

from opgen.dsl import cast, check, exp, i64, iota, size, where


def linear_ce_grad(grad, input, weight, outside, target, rows, cols, probs=None, logits_max=None, sum_exp=None):
    """``input_grad = G W`` and ``weight_grad = G^T X`` for ``G = (P - onehot(target)) * grad``,
    ``P = probs`` or, recomputed from the row statistics (memory-saving: backends recompute tiles
    of ``X W^T``, never materialising it), ``exp(X W^T - logits_max) / sum_exp``. Rows where
    ``outside`` holds have no target here (no one-hot); any other row needs its target in
    ``[0, cols)`` (else status ``index``, nothing written). ``rows``/``cols``: the BT and V dims."""
    if probs is None:
        probs = exp(input @ weight.T - logits_max[:, None]) / sum_exp[:, None]
    t = cast(target, i64)  # compared with V in 64 bits: no wrap for any V
    check(outside | ((t >= 0) & (t < size(cols))),
          "maskedTarget out of [0, V) on a row whose target is in this shard", status="index")
    is_target = (iota((rows, cols), axis=1) == target[:, None]) & ~outside[:, None]
    g = (probs - where(is_target, 1.0, 0.0)) * grad[:, None]
    return {"input_grad": g @ weight, "weight_grad": g.T @ input}
