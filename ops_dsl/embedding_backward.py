"""InfiniCore EmbeddingBackward (SPEC §1): one or two embedding tables' gradients."""

from opgen.abi import Arg, Infiniop, args
from opgen.dsl import INTS, Output, Tensor, bf16, check, dims, dtype_var, f16, f32, f64, op, where
from ops_dsl._embedding import table_grad

N, D, N1, N2 = dims("N D N1 N2")
T = dtype_var("T", f16, bf16, f32, f64)
I = dtype_var("I", INTS)


def _accumulate(table, acc, dy, idx, alpha, rows):
    """``table = (acc ? table : 0) + alpha * scatter_add(dy, idx)``."""
    return where(acc, table, 0.0) + table_grad(dy, idx, rows, scale=alpha)


@op(abi=[Infiniop(
    "EmbeddingBackward",
    descriptors=args("dtable1_desc=dtable1", "dtable2_desc=dtable2", "dy_desc=dy", "i1_desc=i1",
                     "i2_desc=i2"),
    scalars=(Arg("alpha1", "alpha1", "float"), Arg("alpha2", "alpha2", "float"),
             Arg("dtable1_acc", "dtable1_acc", "char"), Arg("dtable2_acc", "dtable2_acc", "char")),
    data=args("dtable1", "dtable2", "dy", "i1", "i2"),
)])
def embedding_backward(
    dy: Tensor[T, N, D].contiguous_last(),
    i1: Tensor[I, N],
    i2: Tensor[I, N] | None = None,
    alpha1: float = 1.0,
    alpha2: float = 0.0,
    dtable1_acc: bool = False,
    dtable2_acc: bool = False,
    *,
    dtable1: Output[T, N1, D].contiguous_last(),
    dtable2: Output[T, N2, D].contiguous_last() | None = None,
):
    """``dtable_k[i_k[n]] += alpha_k * dy[n]`` (duplicates summed); a table whose ``acc`` flag is
    0 is zeroed first. Table 2 is used iff both ``i2`` and ``dtable2`` are given; without ``i2``,
    ``alpha2`` must be 0."""
    out = {"dtable1": _accumulate(dtable1, dtable1_acc, dy, i1, alpha1, N1)}
    if i2 is None:
        check(alpha2 == 0.0, "alpha2 must be 0 when i2 is absent")
    elif dtable2 is not None:
        out["dtable2"] = _accumulate(dtable2, dtable2_acc, dy, i2, alpha2, N2)
    return out
