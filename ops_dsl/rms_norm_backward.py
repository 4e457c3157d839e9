"""InfiniCore RMSNormBackward (SPEC §3)."""

from opgen.abi import Arg, Infiniop, args
from opgen.dsl import Batch, Output, Tensor, bf16, dims, dtype_var, f16, f32, mean, op, rsqrt, sum

N, D = dims("N D")
T = dtype_var("T", f16, f32, bf16)


@op(abi=[Infiniop(
    "RMSNormBackward",
    descriptors=args("grad_x_desc=grad_x", "grad_w_desc=grad_w", "grad_y_desc=grad_y", "x_desc=x",
                     "w_desc=w"),
    data=args("grad_x", "grad_w", "grad_y", "x", "w"),
    workspace=True,
    extensions={"WithEpsilon": (Arg("epsilon", "eps", "float"),)},
)], may_alias=[("grad_x", "grad_y")])
def rms_norm_backward(
    grad_y: Tensor[T, Batch(N), D].contiguous_last(),
    x: Tensor[T, Batch(N), D].contiguous_last(),
    w: Tensor[T, D],
    eps: float = 0.0,
    *,
    grad_x: Output[T, Batch(N), D].contiguous_last(),
    grad_w: Output[T, D],
):
    """Backward of ``y = x / r * w`` with ``r = sqrt(mean(x^2) + eps)`` over the last dim:
    ``grad_x = w*gy/r - x * mean(w*gy*x) / r^3``, ``grad_w = sum over rows of gy * x / r``."""
    rinv = rsqrt(mean(x * x, axis=-1, keepdims=True) + eps)
    gw = grad_y * w
    grad_x_val = gw * rinv - x * (mean(gw * x, axis=-1, keepdims=True) * rinv * rinv * rinv)
    return {"grad_x": grad_x_val, "grad_w": sum(grad_y * x * rinv, axis=0)}
