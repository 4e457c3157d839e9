"""Scalar data types known to opgen, with their numpy, C and vendor-ABI spellings.

One table serves every layer: the DSL names dtypes (``f16``, ``bf16``, ...), the IR prints
the same names, the oracle maps them to numpy, and the ABI templates read the C type and the
InfiniCore / CANN enum values from here (values as in ``infinicore.h`` and ``acl_base.h``).
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np


@dataclass(frozen=True)
class DType:
    """A concrete element type."""

    name: str
    kind: str  # "float", "int", "uint", "bool"
    bits: int
    np_dtype: np.dtype
    c_type: str
    infini: int | None  # infiniDtype_t value
    acl: int | None  # aclDataType value

    @property
    def is_float(self) -> bool:
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        return self.kind == "bool"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    @property
    def int_range(self) -> tuple[int, int]:
        """The smallest and largest value of an integer dtype (bool: 0 and 1)."""
        if self.is_bool:
            return 0, 1
        if self.kind == "uint":
            return 0, 2**self.bits - 1
        return -(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1

    @property
    def compute(self) -> DType:
        """The type arithmetic on this dtype is carried out in (f16/bf16 widen to f32)."""
        if self.is_float:
            return F64 if self.bits == 64 else F32
        return self

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


def _dt(name: str, kind: str, bits: int, np_dtype: object, c_type: str, infini: int | None,
        acl: int | None) -> DType:
    return DType(name, kind, bits, np.dtype(np_dtype), c_type, infini, acl)


BOOL = _dt("bool", "bool", 8, np.bool_, "bool", 2, 12)
I8 = _dt("i8", "int", 8, np.int8, "int8_t", 3, 2)
I16 = _dt("i16", "int", 16, np.int16, "int16_t", 4, 6)
I32 = _dt("i32", "int", 32, np.int32, "int32_t", 5, 3)
I64 = _dt("i64", "int", 64, np.int64, "int64_t", 6, 9)
U8 = _dt("u8", "uint", 8, np.uint8, "uint8_t", 7, 4)
U16 = _dt("u16", "uint", 16, np.uint16, "uint16_t", 8, 7)
U32 = _dt("u32", "uint", 32, np.uint32, "uint32_t", 9, 8)
U64 = _dt("u64", "uint", 64, np.uint64, "uint64_t", 10, 10)
F16 = _dt("f16", "float", 16, np.float16, "uint16_t", 12, 1)
BF16 = _dt("bf16", "float", 16, ml_dtypes.bfloat16, "uint16_t", 19, 27)
F32 = _dt("f32", "float", 32, np.float32, "float", 13, 0)
F64 = _dt("f64", "float", 64, np.float64, "double", 14, 11)

ALL: tuple[DType, ...] = (BOOL, I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}
_CODE: dict[str, int] = {d.name: i for i, d in enumerate(ALL)}
_BY_NUMPY: dict[np.dtype, DType] = {d.np_dtype: d for d in ALL}
FLOATS = (F16, BF16, F32, F64)
INTS = (I8, I16, I32, I64, U8, U16, U32, U64)


def by_name(name: str) -> DType:
    """Look a dtype up by its opgen name (``"bf16"``)."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown dtype {name!r}; known: {', '.join(BY_NAME)}") from None


def from_numpy(dt: np.dtype | type) -> DType:
    """The opgen dtype of a numpy dtype (ml_dtypes.bfloat16 included)."""
    npd = np.dtype(dt)
    d = _BY_NUMPY.get(npd)
    if d is None:
        raise KeyError(f"numpy dtype {npd} has no opgen equivalent")
    return d


def code(d: DType) -> int:
    """``d``'s value in the C ABI's opgen_dtype_t: its position in :data:`ALL` (a dict lookup: the
    binding asks once per tensor per call)."""
    return _CODE[d.name]


_RANK = {"bool": 0, "uint": 1, "int": 1, "float": 2}


def promote(a: DType, b: DType) -> DType:
    """Binary promotion: bool < ints < floats; within a kind the wider type wins.

    f16 with bf16 promotes to f32 (neither holds the other). Mixed signed/unsigned ints
    promote to the signed type one size up (capped at i64).
    """
    if a == b:
        return a
    ra, rb = _RANK[a.kind], _RANK[b.kind]
    if ra != rb:
        return a if ra > rb else b
    if a.is_float:
        if {a, b} == {F16, BF16}:
            return F32
        return a if a.bits > b.bits else b
    if a.kind == b.kind:
        return a if a.bits > b.bits else b
    s, u = (a, b) if a.kind == "int" else (b, a)
    if s.bits > u.bits:
        return s
    return {8: I16, 16: I32, 32: I64, 64: I64}[u.bits]
