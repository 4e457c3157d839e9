"""CANN aclnnFusedLinearCrossEntropyLossGrad (SPEC §4): vocab-parallel CE gradient."""

from opgen.abi import Aclnn, Arg, args
from opgen.dsl import (
    Output,
    Tensor,
    bf16,
    boolean,
    check,
    dims,
    dtype_var,
    f16,
    f32,
    i32,
    i64,
    op,
    reject,
    size,
    u8,
    unpack_bits,
)
from ops_dsl._cross_entropy import linear_ce_grad

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
    if softmax is None and (logits_max is None or sum_exp_logits is None):
        reject("memory-saving mode (no softmax) needs logitsMax and sumExpLogits", status="null")
    return linear_ce_grad(grad, input, weight, unpack_bits(target_mask, BT), masked_target, BT, V, probs=softmax,
                          logits_max=logits_max, sum_exp=sum_exp_logits)
