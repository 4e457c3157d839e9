"""CANN aclnnEmbeddingDenseBackward (SPEC §2): PyTorch's ``embedding_dense_backward``."""

from opgen.abi import Aclnn, Arg, args
from opgen.dsl import (
    Batch,
    Output,
    Tensor,
    bf16,
    bincount,
    boolean,
    cast,
    dims,
    dtype_var,
    f16,
    f32,
    f64,
    gather,
    i8,
    i16,
    i32,
    i64,
    op,
    u8,
    where,
)
from ops_dsl._embedding import table_grad

N, D, V = dims("N D V")
T = dtype_var("T", f32, f16, bf16)
IDX = dtype_var("IDX", f32, f16, f64, i32, i64, i16, i8, u8, boolean)


@op(abi=[Aclnn(
    "EmbeddingDenseBackward",
    header="aclnnop/aclnn_embedding_dense_backward.h",
    args=args("grad", "indices", Arg("numWeights", "num_weights", "uint64_t"),
              Arg("paddingIdx", "padding_idx", "uint64_t"),
              Arg("scaleGradByFreq", "scale_grad_by_freq", "bool"), "out"),
    const_stream=True,
    const_outputs=True,
)])
def embedding_dense_backward(
    grad: Tensor[T, Batch(N), D],
    indices: Tensor[IDX, Batch(N)],
    num_weights: V,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    *,
    out: Output[T, V, D],
):
    """``out = 0; out[idx[n]] += grad[n] * s(n)`` skipping rows equal to ``padding_idx`` (a
    negative or out-of-range padding_idx means none); with ``scale_grad_by_freq`` ``s(n)`` is
    ``1 / count(idx[n])`` over all indices of the call. Float indices truncate toward zero."""
    idx = cast(indices, i64)
    scale = where(scale_grad_by_freq, 1.0 / gather(bincount(idx, V), idx), 1.0)
    return {"out": table_grad(grad, idx, V, scale=scale, keep=idx != padding_idx)}
