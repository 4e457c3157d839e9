"""ttnn.embedding_bw (SPEC §5): ``out[idx] += grad``, no padding, no scaling."""

from opgen.abi import Ttnn, args
from opgen.dsl import FLOATS, Output, Tensor, bf16, dims, dtype_var, f32, i32, i64, op, u32
from ops_dsl._embedding import table_grad

N, D, V = dims("N D V")
T = dtype_var("T", bf16, f32)
I = dtype_var("I", u32, i32, i64)
W = dtype_var("W", FLOATS)


@op(abi=[Ttnn("embedding_bw", positional=args("input_tensor=indices", "weight", "output_gradient=grad"),
              output="out", output_lead=(1, 1))])
def embedding_bw(
    indices: Tensor[I, N],
    weight: Tensor[W, V, D],
    grad: Tensor[T, N, D],
    *,
    out: Output[T, V, D],
):
    """``out = 0; out[indices[n]] += grad[n]``; ``weight`` only supplies V (the ttnn facade
    flattens (B, S) / (B, 1, 1, S) indices and (1, 1, B*S, D) / (B, S, D) gradients)."""
    return {"out": table_grad(grad, indices, V)}
