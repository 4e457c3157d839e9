"""Cross-entropy gradient through a linear layer, recomputing the logits tile by tile: the
memory-saving mode of fused_linear_cross_entropy_loss_grad for f16, bf16 and f32, with the rows
that have no target (ignored, or outside a vocabulary shard) as a bool mask. The backward of
``opgen.torch.fused_linear_cross_entropy`` for f32 models."""

from opgen.dsl import Output, Tensor, bf16, boolean, dims, dtype_var, f16, f32, i32, i64, op
from ops_dsl._cross_entropy import linear_ce_grad

BT, H, V = dims("BT H V")
T = dtype_var("T", f16, bf16, f32)
TI = dtype_var("TI", i32, i64)


@op
def linear_cross_entropy_grad(
    grad: Tensor[f32, BT],
    input: Tensor[T, BT, H],
    weight: Tensor[T, V, H],
    no_target: Tensor[boolean, BT],
    target: Tensor[TI, BT],
    logits_max: Tensor[f32, BT],
    sum_exp_logits: Tensor[f32, BT],
    *,
    input_grad: Output[T, BT, H],
    weight_grad: Output[T, V, H],
):
    """``G = exp(X W^T - logits_max) / sum_exp``, minus 1 at ``target[i]`` on rows where
    ``no_target`` is false (``target[i]`` must then be in ``[0, V)``, else status ``index``),
    times ``grad``; ``input_grad = G W``, ``weight_grad = G^T X``."""
    return linear_ce_grad(grad, input, weight, no_target, target, BT, V, logits_max=logits_max,
                          sum_exp=sum_exp_logits)
