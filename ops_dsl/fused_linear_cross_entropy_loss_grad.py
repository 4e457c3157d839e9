"""CANN aclnnFusedLinearCrossEntropyLossGrad (SPEC §4): vocab-parallel CE gradient."""

from opgen.abi import Aclnn, Arg, args
from opgen.dsl import (
    Output,
    Tensor,
    bf16,
    boolean,
    cast,
    check,
    dims,
    dtype_var,
    exp,
    f16,
    f32,
    i32,
    i64,
    iota,
    op,
    reject,
    size,
    u8,
    unpack_bits,
    where,
)

BT, H, V, L = dims("BT H V L")
T = dtype_var("T", f16, bf16)
TI = dtype_var("TI", i32, i64)
M = dtype_var("M", u8, boolean)


@op(abi=[Aclnn(
    "FusedLinearCrossEntropyLossGrad",
    header="aclnnop/aclnn_fused_linear_cross_entropy_loss_grad.h",
    args=args("grad", "input", "weight", "targetMask=target_mask", "maskedTarget=masked_target",
              Arg("labelSmoothing", "label_smoothing", "float"), "logitsMaxOptional=logits_max",
              "sumExpLogitsOptional=sum_exp_logits", "softmaxOptional=softmax",
              "inputGradOut=input_grad", "weightGradOut=weight_grad"),
)])
def fused_linear_cross_entropy_loss_grad(
    grad: Tensor[f32, BT],
    input: Tensor[T, BT, H],
    weight: Tensor[T, V, H],
    target_mask: Tensor[M, L],
    masked_target: Tensor[TI, BT],
    label_smoothing: float = 0.0,
    logits_max: Tensor[f32, BT] | None = None,
    sum_exp_logits: Tensor[f32, BT] | None = None,
    softmax: Tensor[f32, BT, V] | None = None,
    *,
    input_grad: Output[T, BT, H],
    weight_grad: Output[T, V, H],
):
    """``G = softmax`` (given) or ``exp(X W^T - logits_max) / sum_exp`` (memory-saving, never
    materialised by backends: tiles of X W^T are recomputed); ``G[i, t[i]] -= 1 - m[i]`` where
    ``m`` (bit-packed u8, LSB first, or bool) marks targets outside this shard (a row inside it
    needs ``t[i]`` in ``[0, V)``, else status ``index``, nothing written); ``G *= grad``;
    ``input_grad = G W`` and ``weight_grad = G^T X``."""
    check(label_smoothing == 0.0, "labelSmoothing must be 0")
    check(size(V) >= 128, "weight must have at least 128 rows (V >= 128)")
    if softmax is not None:
        probs = softmax
    elif logits_max is None or sum_exp_logits is None:
        reject("memory-saving mode (no softmax) needs logitsMax and sumExpLogits", status="null")
    else:
        probs = exp(input @ weight.T - logits_max[:, None]) / sum_exp_logits[:, None]
    outside = unpack_bits(target_mask, BT)
    t = cast(masked_target, i64)  # compared with V in 64 bits: no wrap for any V
    check(outside | ((t >= 0) & (t < size(V))), "maskedTarget out of [0, V) on a row whose target is in this shard",
          status="index")
    is_target = (iota((BT, V), axis=1) == masked_target[:, None]) & ~outside[:, None]
    g = (probs - where(is_target, 1.0, 0.0)) * grad[:, None]
    return {"input_grad": g @ weight, "weight_grad": g.T @ input}
