"""Signature vocabulary of the DSL: dims, dtype variables and parameter specs.

An op's Python signature is read once by :func:`opgen.dsl.op`; these classes are what its
annotations are made of::

    N, D, V = dims("N D V")
    T = dtype_var("T", f16, bf16, f32)

    def rows_backward(grad: Tensor[T, Batch(N), D], indices: Tensor[I, Batch(N)], num_rows: V,
                      skip_row: int = -1, *, out: Output[T, V, D]): ...
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from opgen import dtypes
from opgen.dtypes import DType


class DSLError(Exception):
    """A malformed op definition; the message names the op file and line."""


class DimArith:
    """Integer arithmetic of dims in an op's body: ``D // 2``, ``D - D // 2``, ``H * D``,
    ``A + B``, ``2 * D`` give a :class:`DimExpr` (used in slices, ``reshape``, ``size``,
    ``full``). Derived dims are kept canonical (opgen.ir.dims), so ``D // 2 + (D - D // 2)``
    is ``D``."""

    name: str

    def _other(self, o: object) -> str:
        if isinstance(o, DimArith):
            return o.name
        if isinstance(o, int) and not isinstance(o, bool) and o >= 0:
            return str(o)
        raise DSLError(f"dim arithmetic needs dims or non-negative ints, got {o!r}")

    def _make(self, f, *args) -> DimExpr:
        try:
            return DimExpr(f(*args))
        except ValueError as e:
            raise DSLError(f"dim arithmetic: {e}") from None

    def __add__(self, o: object) -> DimExpr:
        return self._make(_dims().add, self.name, self._other(o))

    __radd__ = __add__

    def __sub__(self, o: object) -> DimExpr:
        return self._make(_dims().sub, self.name, self._other(o))

    def __rsub__(self, o: object) -> DimExpr:
        return self._make(_dims().sub, self._other(o), self.name)

    def __mul__(self, o: object) -> DimExpr:
        return self._make(_dims().mul, self.name, self._other(o))

    __rmul__ = __mul__

    def __floordiv__(self, o: object) -> DimExpr:
        if not isinstance(o, int) or isinstance(o, bool):
            raise DSLError(f"a dim can only be divided by a positive int, got {o!r}")
        return self._make(_dims().floordiv, self.name, o)

    def __repr__(self) -> str:
        return self.name


def _dims():
    from opgen.ir import dims

    return dims


@dataclass(frozen=True, repr=False)
class Dim(DimArith):
    """A symbolic dimension, bound to a size when the op is called. Its name is an identifier
    (the IR, the C ABIs' messages and the generated code spell it so)."""

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise DSLError(f"a dim's name must be an identifier (letters, digits, '_'), got {self.name!r}")


@dataclass(frozen=True, repr=False)
class DimExpr(DimArith):
    """A dim derived from others (``D // 2``); only an op's body uses it (signatures name
    :class:`Dim` s). ``name`` is its canonical spelling."""

    name: str


@dataclass(frozen=True)
class Batch:
    """A dim that the caller may spread over several leading axes (``Batch(N)`` in ``(N, D)``
    accepts ``(B, S, D)`` with N = B*S). Every tensor using the same batch dim must spread it
    over the same shape. ``max_rank`` bounds how many axes it may take (0 allowed with ``min_rank=0``)."""

    dim: Dim
    min_rank: int = 1
    max_rank: int = 7

    @property
    def name(self) -> str:
        return self.dim.name

    def __repr__(self) -> str:
        return f"Batch({self.dim.name})"


def dims(names: str) -> tuple[Dim, ...]:
    """``N, D = dims("N D")``: several symbolic dims at once."""
    return tuple(Dim(n) for n in names.replace(",", " ").split())


@dataclass(frozen=True)
class DTypeVar:
    """A dtype variable: one name standing for any dtype of a fixed set (``T in {f16, bf16, f32}``)."""

    name: str
    members: tuple[DType, ...]

    def __repr__(self) -> str:
        return self.name


def dtype_var(name: str, *members: DType | Iterable[DType]) -> DTypeVar:
    """``T = dtype_var("T", f16, bf16, f32)``."""
    flat: list[DType] = []
    for m in members:
        flat.extend([m] if isinstance(m, DType) else list(m))
    if not flat:
        raise DSLError(f"dtype_var {name!r} needs at least one member")
    if name in dtypes.BY_NAME:
        raise DSLError(f"dtype_var name {name!r} clashes with a dtype name")
    return DTypeVar(name, tuple(dict.fromkeys(flat)))


DTypeLike = DType | DTypeVar
ShapeItem = Dim | Batch | int


def dtype_name(d: DTypeLike) -> str:
    return d.name


def dtype_members(d: DTypeLike) -> tuple[DType, ...]:
    return d.members if isinstance(d, DTypeVar) else (d,)


@dataclass(frozen=True)
class TensorSpec:
    """An input tensor parameter: ``Tensor[T, N, D]``.

    Layout rules: ``.contiguous_last()`` requires stride 1 on the last axis (else the ABI's
    stride status). Optional parameters are written ``Tensor[...] | None = None``.
    """

    dtype: DTypeLike
    shape: tuple[ShapeItem, ...]
    optional: bool = False
    last_contiguous: bool = False
    is_output: bool = False

    def __or__(self, other: object) -> TensorSpec:
        if other is None:
            return replace(self, optional=True)
        return NotImplemented

    __ror__ = __or__

    def contiguous_last(self) -> TensorSpec:
        """Require the last axis to have stride 1."""
        return replace(self, last_contiguous=True)

    @property
    def logical_shape(self) -> tuple[str, ...]:
        return tuple(str(d) if isinstance(d, int) else d.name for d in self.shape)

    @property
    def batch(self) -> Batch | None:
        return next((d for d in self.shape if isinstance(d, Batch)), None)

    def describe(self) -> str:
        kind = "Output" if self.is_output else "Tensor"
        s = f"{kind}[{self.dtype}, {', '.join(map(repr, self.shape))}]"
        if self.last_contiguous:
            s += ".contiguous_last()"
        return s + (" | None" if self.optional else "")


class _SpecFactory:
    def __init__(self, is_output: bool):
        self.is_output = is_output

    def __getitem__(self, item: object) -> TensorSpec:
        items = item if isinstance(item, tuple) else (item,)
        if not items or not isinstance(items[0], DType | DTypeVar):
            raise DSLError("Tensor[...] takes a dtype (or dtype_var) first, then dims: Tensor[T, N, D]")
        shape: list[ShapeItem] = []
        for d in items[1:]:
            if not isinstance(d, Dim | Batch | int) or isinstance(d, bool):
                raise DSLError(f"Tensor[...]: {d!r} is not a dim (use dims('N D') or an int)")
            shape.append(d)
        if sum(isinstance(d, Batch) for d in shape) > 1:
            raise DSLError("Tensor[...]: at most one Batch dim per tensor")
        if any(isinstance(d, Batch) for d in shape[1:]):
            raise DSLError("Tensor[...]: a Batch dim must be the leading dim")
        return TensorSpec(items[0], tuple(shape), is_output=self.is_output)


Tensor = _SpecFactory(False)
"""``Tensor[dtype, *dims]``: an input tensor parameter."""

Output = _SpecFactory(True)
"""``Output[dtype, *dims]``: an output the caller allocates; its prior contents are readable
(for in-place accumulation) and the op's return value for it is written there."""


@dataclass(frozen=True)
class AttrSpec:
    """A scalar attribute parameter (``alpha: float = 1.0``): f32, i64 or bool at the ABI."""

    dtype: DType
    default: float | int | bool | None
    has_default: bool

    def describe(self) -> str:
        py = {"f32": "float", "i64": "int", "bool": "bool"}[self.dtype.name]
        return py + (f" = {self.default!r}" if self.has_default else "")


@dataclass(frozen=True)
class SizeSpec:
    """An integer parameter that gives the size of a dim (``num_weights: V``)."""

    dim: Dim

    def describe(self) -> str:
        return f"size of {self.dim.name}"


ParamKind = TensorSpec | AttrSpec | SizeSpec


@dataclass(frozen=True)
class Param:
    name: str
    spec: ParamKind

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.spec, TensorSpec)

    @property
    def is_output(self) -> bool:
        return isinstance(self.spec, TensorSpec) and self.spec.is_output

    @property
    def optional(self) -> bool:
        return isinstance(self.spec, TensorSpec) and self.spec.optional


@dataclass
class Signature:
    params: list[Param] = field(default_factory=list)

    def __getitem__(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def inputs(self) -> list[Param]:
        return [p for p in self.params if p.is_tensor and not p.is_output]

    @property
    def outputs(self) -> list[Param]:
        return [p for p in self.params if p.is_output]

    @property
    def attrs(self) -> list[Param]:
        return [p for p in self.params if isinstance(p.spec, AttrSpec)]

    @property
    def sizes(self) -> list[Param]:
        return [p for p in self.params if isinstance(p.spec, SizeSpec)]

    @property
    def optionals(self) -> list[Param]:
        return [p for p in self.params if p.optional]

    def dtype_vars(self) -> dict[str, DTypeVar]:
        out: dict[str, DTypeVar] = {}
        for p in self.params:
            if isinstance(p.spec, TensorSpec) and isinstance(p.spec.dtype, DTypeVar):
                out[p.spec.dtype.name] = p.spec.dtype
        return out

    def dims(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.params:
            if isinstance(p.spec, TensorSpec):
                for d in p.spec.shape:
                    if not isinstance(d, int):
                        seen[d.name] = None
            elif isinstance(p.spec, SizeSpec):
                seen[p.spec.dim.name] = None
        return list(seen)
