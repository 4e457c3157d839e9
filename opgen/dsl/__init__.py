"""The opgen DSL: write an operator once, as a Python function over symbolic tensors.

>>> from opgen.dsl import *
>>> N, D = dims("N D")
>>> T = dtype_var("T", f16, bf16, f32)
>>> @op
... def silu_backward(grad: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
...     s = sigmoid(x)
...     return {"dx": grad * s * (1 + x * (1 - s))}

See docs/dsl.md for every primitive.
"""

from opgen.dsl.opdef import OpDef, Rejected, op
from opgen.dsl.primitives import (
    absolute,
    bincount,
    cast,
    check,
    concat,
    erf,
    exp,
    full,
    gather,
    iota,
    log,
    matmul,
    max,
    maximum,
    mean,
    min,
    minimum,
    reciprocal,
    reject,
    rsqrt,
    scatter_add,
    sigmoid,
    size,
    sqrt,
    sum,
    tanh,
    unpack_bits,
    where,
    zeros,
)
from opgen.dsl.spec import Batch, Dim, DimExpr, DSLError, DTypeVar, Output, Tensor, dims, dtype_var
from opgen.dsl.trace import Value
from opgen.dtypes import BF16, BOOL, F16, F32, F64, I8, I16, I32, I64, U8, U16, U32, U64

f16, bf16, f32, f64 = F16, BF16, F32, F64
i8, i16, i32, i64 = I8, I16, I32, I64
u8, u16, u32, u64 = U8, U16, U32, U64
boolean = BOOL
INTS = (i8, i16, i32, i64, u8, u16, u32, u64)
FLOATS = (f16, bf16, f32, f64)

__all__ = [
    "FLOATS",
    "INTS",
    "Batch",
    "DSLError",
    "DTypeVar",
    "Dim",
    "DimExpr",
    "OpDef",
    "Output",
    "Rejected",
    "Tensor",
    "Value",
    "absolute",
    "bf16",
    "bincount",
    "boolean",
    "cast",
    "check",
    "concat",
    "dims",
    "dtype_var",
    "erf",
    "exp",
    "f16",
    "f32",
    "f64",
    "full",
    "gather",
    "i8",
    "i16",
    "i32",
    "i64",
    "iota",
    "log",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "op",
    "reciprocal",
    "reject",
    "rsqrt",
    "scatter_add",
    "sigmoid",
    "size",
    "sqrt",
    "sum",
    "tanh",
    "u8",
    "u16",
    "u32",
    "u64",
    "unpack_bits",
    "where",
    "zeros",
]
