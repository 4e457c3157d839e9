"""The ``opgen`` dialect: the tensor-level IR (L0) every op is traced into.

Values are tensors with symbolic shapes (dimension names such as ``N`` or literal ``1``) and an
element type that is either a concrete dtype (``f32``) or a dtype variable of the enclosing
function (``T``). A rank-0 tensor is a scalar. Arithmetic is *logical*: an op typed ``bf16`` is
computed in its compute type (f32) and rounded only where a value is stored (an output) or
explicitly cast. Each op verifies its own typing rules, beside its definition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

from xdsl.dialect_interfaces.constant_materialization import ConstantMaterializationInterface
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FloatAttr,
    IntAttr,
    IntegerAttr,
    StringAttr,
    f64,
    i64,
)
from xdsl.dialects.utils import EnumAttribute
from xdsl.interfaces import HasFolderInterface
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    Operation,
    ParametrizedAttribute,
    Region,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser
from xdsl.pattern_rewriter import RewritePattern
from xdsl.printer import Printer
from xdsl.traits import ConstantLike, HasCanonicalizationPatternsTrait, IsolatedFromAbove, IsTerminator, Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from opgen import dtypes

# --------------------------------------------------------------------------------------- types


class SymbolicShape:
    """Accessors of opgen's shaped types, whose parameters are ``dims`` (names or digits) and
    ``elem`` (a dtype or dtype-variable name)."""

    dims: ArrayAttr[StringAttr]
    elem: StringAttr

    @property
    def shape(self) -> tuple[str, ...]:
        return tuple(d.data for d in self.dims.data)

    @property
    def dtype(self) -> str:
        return self.elem.data

    @property
    def rank(self) -> int:
        return len(self.dims.data)


class ShapedType(SymbolicShape):
    """A type of exactly the two parameters ``dims`` and ``elem``, written ``<[N, D], T>``."""

    @classmethod
    def make(cls, shape: Sequence[str | int], dtype: str):
        """An instance of this type with ``shape`` (names or sizes) and ``dtype``."""
        return cls(ArrayAttr([StringAttr(str(d)) for d in shape]), StringAttr(dtype))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        parser.parse_punctuation("<")
        dims, elem = parse_shape_and_dtype(parser)
        parser.parse_punctuation(">")
        return [dims, elem]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<[{', '.join(self.shape)}], {self.dtype}>")


@irdl_attr_definition
class TensorType(ShapedType, ParametrizedAttribute, TypeAttribute):
    """``!opgen.tensor<[N, D], T>``: a tensor of symbolic shape and (possibly variable) dtype."""

    name = "opgen.tensor"

    dims: ArrayAttr[StringAttr]
    elem: StringAttr


def _i64s(values: Sequence[int]) -> DenseArrayBase:
    return DenseArrayBase.from_list(i64, [int(v) for v in values])


#: dim functions of symbolic sizes: ``cdiv(N,32)`` (ceil(N / 32)) and ``segs(V,N)`` (the words
#: of a segment table, sched.segments) of the lowered levels; ``div``, ``sub``, ``add``, ``mul``
#: of derived dims (opgen.ir.dims)
DIM_FUNCTIONS = ("cdiv", "segs", "div", "sub", "add", "mul")


def parse_dim(parser: AttrParser) -> str:
    """One dim of a shape: an integer, an identifier, ``f(a,b)`` of :data:`DIM_FUNCTIONS`, or any
    of those ``+ k``; returned in the printed spelling (``cdiv(N,32)``, ``N+1``)."""
    num = parser.parse_optional_integer(allow_boolean=False)
    if num is not None:
        return str(num)
    d = parser.parse_identifier()
    if d in DIM_FUNCTIONS and parser.parse_optional_punctuation("(") is not None:
        a = parse_dim(parser)
        parser.parse_punctuation(",")
        b = parse_dim(parser)
        parser.parse_punctuation(")")
        d = f"{d}({a},{b})"
    if parser.parse_optional_punctuation("+") is not None:
        d += f"+{parser.parse_integer(allow_boolean=False)}"
    return d


def split_dim(d: str) -> tuple[str, list[str], int]:
    """A spelled dim (:func:`parse_dim`'s) as ``(name or function, arguments, + k)``:
    ``"N"`` -> ``("N", [], 0)``, ``"cdiv(N,32)"`` -> ``("cdiv", ["N", "32"], 0)``, ``"N+1"`` ->
    ``("N", [], 1)``. The loop lowering builds a size's value from it (no printer reads it)."""
    plus = 0
    head, depth = d, 0
    for i, ch in enumerate(d):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "+" and depth == 0:
            head, plus = d[:i], int(d[i + 1:])
            break
    if "(" not in head:
        return head, [], plus
    fn, _, inner = head.partition("(")
    args, depth, cur = [], 0, ""
    for ch in inner[:-1]:
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur += ch
    return fn, [*args, cur], plus


def parse_shape_and_dtype(parser: AttrParser) -> tuple[ArrayAttr[StringAttr], StringAttr]:
    """Parse ``[N, D, 1], T`` (dims as :func:`parse_dim` reads them) as used by opgen's types."""
    parser.parse_punctuation("[")
    dims: list[StringAttr] = []
    if parser.parse_optional_punctuation("]") is None:
        while True:
            dims.append(StringAttr(parse_dim(parser)))
            if parser.parse_optional_punctuation(",") is None:
                break
        parser.parse_punctuation("]")
    parser.parse_punctuation(",")
    return ArrayAttr(dims), StringAttr(parser.parse_identifier())


def tensor_type(value: SSAValue | Operation) -> TensorType:
    """The TensorType of a value (raises VerifyException for foreign types)."""
    t = SSAValue.get(value).type
    if not isinstance(t, TensorType):
        raise VerifyException(f"expected an !opgen.tensor value, got {t}")
    return t


# ------------------------------------------------------------------------- dtype helpers

def enclosing_func(op: Operation) -> Operation | None:
    """The nearest enclosing op that declares dtype variables (opgen.func, sched.kernel)."""
    p = op.parent_op()
    while p is not None and not hasattr(p, "dtype_var_map"):
        p = p.parent_op()
    return p


def dtype_members(op: Operation, name: str) -> tuple[dtypes.DType, ...]:
    """The concrete dtypes an element type name may stand for inside ``op``'s function."""
    if name in dtypes.BY_NAME:
        return (dtypes.BY_NAME[name],)
    f = enclosing_func(op)
    vars_ = f.dtype_var_map() if f is not None else {}  # type: ignore[attr-defined]
    if name not in vars_:
        raise VerifyException(f"{op.name}: unknown element type {name!r}")
    return vars_[name]


def _kinds(op: Operation, name: str) -> set[str]:
    return {d.kind for d in dtype_members(op, name)}


def _require_float(op: Operation, name: str, what: str) -> None:
    if _kinds(op, name) != {"float"}:
        raise VerifyException(f"{op.name}: {what} must be a floating type, got {name}")


def _same_shape(op: Operation, values: Sequence[SSAValue]) -> None:
    shapes = {tensor_type(v).shape for v in values}
    if len(shapes) > 1:
        raise VerifyException(
            f"{op.name}: operand/result shapes differ: {sorted(shapes)} (broadcast explicitly)"
        )


class _Patterns(HasCanonicalizationPatternsTrait):
    """Canonicalization patterns of an op, looked up by op class in opgen.ir.canonicalize."""

    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return ()

    def get_patterns(self, op: type[Operation]) -> tuple[RewritePattern, ...]:
        from opgen.ir import canonicalize as c

        table: dict[type[Operation], tuple[RewritePattern, ...]] = {
            BroadcastOp: (c.IdentityBroadcast(), c.ComposeBroadcasts()),
            CastOp: (c.IdentityCast(),),
            TransposeOp: (c.ComposeTransposes(),),
            CheckOp: (c.RedundantCheck(),),
        }
        return table.get(op, ())


# --------------------------------------------------------------------------- structure


def converted_params(op: Operation) -> dict[str, str]:
    """An ``opgen.func``'s or a kernel's ``boundary_casts`` as ``{parameter: dtype}``."""
    bc = op.properties.get("boundary_casts")
    return {k: v.data for k, v in bc.data.items()} if isinstance(bc, DictionaryAttr) else {}  # type: ignore[union-attr]


def verify_converted(op: Operation, types: Sequence[Attribute] | None = None) -> None:
    """``boundary_casts`` names parameters of the op (``arg_names``) whose type has that dtype:
    ``types`` (default: the types of the op's block arguments)."""
    names = [a.data for a in op.arg_names.data]  # type: ignore[attr-defined]
    if types is None:
        types = [a.type for a in op.regions[0].block.args]
    for n, d in converted_params(op).items():
        if n not in names:
            raise VerifyException(f"{op.name}: boundary_casts names '{n}', not a parameter")
        t = types[names.index(n)]
        if getattr(t, "dtype", None) != d:
            raise VerifyException(f"{op.name}: boundary_casts gives '{n}' dtype {d}, its type is {t}")


@irdl_op_definition
class FuncOp(IRDLOperation):
    """One traced variant of an op: block arguments are its parameters, in signature order.

    ``dtype_vars`` maps each dtype variable to the concrete dtypes it may take.
    """

    name = "opgen.func"

    sym_name = prop_def(StringAttr)
    arg_names = prop_def(ArrayAttr[StringAttr])
    dtype_vars = prop_def(DictionaryAttr)
    #: ``{output: input}``: pairs of parameters the caller may pass as the same buffer
    may_alias = opt_prop_def(DictionaryAttr)
    #: parameters whose leading dim is a batch dim (rows addressed through a row table)
    batched = opt_prop_def(ArrayAttr[StringAttr])
    #: rank-0 parameters that are tensors in memory (the others of rank 0 — attributes and
    #: sizes — are passed by value)
    rank0_tensors = opt_prop_def(ArrayAttr[StringAttr])
    #: parameters the caller's tensor is converted to another dtype for, once, by the binder
    #: (``{name: dtype}``; opgen/lower/boundary.py)
    boundary_casts = opt_prop_def(DictionaryAttr)
    #: size parameters (``{name: dim}``): a by-value ``i64`` giving the size of ``dim``
    sizes = opt_prop_def(DictionaryAttr)
    body = region_def("single_block")

    traits = traits_def(IsolatedFromAbove())

    def __init__(self, sym_name: str, arg_names: Sequence[str], arg_types: Sequence[TensorType],
                 dtype_vars: dict[str, Sequence[str]]):
        block = Block(arg_types=arg_types)
        for a, n in zip(block.args, arg_names, strict=True):
            a.name_hint = n
        super().__init__(
            properties={
                "sym_name": StringAttr(sym_name),
                "arg_names": ArrayAttr([StringAttr(n) for n in arg_names]),
                "dtype_vars": DictionaryAttr(
                    {k: ArrayAttr([StringAttr(x) for x in v]) for k, v in dtype_vars.items()}),
            },
            regions=[Region(block)],
        )

    @property
    def aliased_outputs(self) -> tuple[str, ...]:
        """Outputs the caller may pass as the same buffer as an input."""
        return tuple(self.may_alias.data) if self.may_alias else ()

    @property
    def in_memory_scalars(self) -> tuple[str, ...]:
        """Rank-0 parameters that are tensors (read from memory), not by-value scalars."""
        return tuple(a.data for a in self.rank0_tensors.data) if self.rank0_tensors else ()

    def dtype_var_map(self) -> dict[str, tuple[dtypes.DType, ...]]:
        return {k: tuple(dtypes.by_name(x.data) for x in v.data)  # type: ignore[union-attr]
                for k, v in self.dtype_vars.data.items()}

    @property
    def converted(self) -> dict[str, str]:
        """``boundary_casts`` as ``{parameter: dtype}``."""
        return converted_params(self)

    def verify_(self) -> None:
        if len(self.arg_names.data) != len(self.body.block.args):
            raise VerifyException("opgen.func: arg_names and block arguments differ in number")
        verify_converted(self)
        for k, v in self.dtype_var_map().items():
            if k in dtypes.BY_NAME or not v:
                raise VerifyException(f"opgen.func: bad dtype variable {k!r}")
        ret = self.body.block.last_op
        if not isinstance(ret, ReturnOp):
            raise VerifyException("opgen.func: body must end in opgen.return")
        args = dict(zip((a.data for a in self.arg_names.data), self.body.block.args, strict=True))
        for name in self.in_memory_scalars:
            if name not in args or tensor_type(args[name]).rank != 0:
                raise VerifyException(f"opgen.func: rank0_tensors names '{name}', not a rank-0 parameter")
        for name, v in zip((n.data for n in ret.names.data), ret.values, strict=True):
            if name not in args:
                raise VerifyException(f"opgen.func: returns '{name}', which is not a parameter")
            if v.type != args[name].type:
                raise VerifyException(f"opgen.func: output '{name}' is {args[name].type}, returned {v.type}")


@irdl_op_definition
class ReturnOp(IRDLOperation):
    """Terminator: the function's named outputs."""

    name = "opgen.return"
    values = var_operand_def(TensorType)
    names = prop_def(ArrayAttr[StringAttr])
    traits = traits_def(IsTerminator())

    def __init__(self, values: Sequence[SSAValue], names: Sequence[str]):
        super().__init__(operands=[values],
                         properties={"names": ArrayAttr([StringAttr(n) for n in names])})

    def output(self, name: str) -> SSAValue:
        """The value returned as output ``name``."""
        return self.values[[n.data for n in self.names.data].index(name)]

    def verify_(self) -> None:
        if len(self.names.data) != len(self.values):
            raise VerifyException("opgen.return: one name per returned value")


class Status(StrEnum):
    """The status a failed run-time check returns (``OPGEN_ERR_<STATUS>`` in the C ABI)."""

    PARAM = "param"
    SHAPE = "shape"
    INDEX = "index"


@irdl_attr_definition
class StatusAttr(EnumAttribute[Status], SpacedOpaqueSyntaxAttribute):
    """``#opgen<status index>`` (also used by the lowered levels' checks)."""

    name = "opgen.status"


CHECK_STATUSES = tuple(x.value for x in Status)


@irdl_op_definition
class CheckOp(IRDLOperation):
    """Run-time precondition: unless every element of the bool tensor ``cond`` is true (a scalar
    for conditions on attributes and sizes) the op fails with ``status`` (``param``, ``shape`` or
    ``index``) and writes nothing. Backends evaluate it before any output is touched.
    """

    name = "opgen.check"
    cond = operand_def(TensorType)
    message = prop_def(StringAttr)
    status = prop_def(StatusAttr)
    traits = traits_def(_Patterns())

    def __init__(self, cond: SSAValue, message: str, status: str = "param"):
        if status not in CHECK_STATUSES:
            raise ValueError(f"opgen.check: status must be one of {CHECK_STATUSES}, got {status!r}")
        super().__init__(operands=[cond], properties={
            "message": StringAttr(message), "status": StatusAttr(Status(status))})

    def verify_(self) -> None:
        if tensor_type(self.cond).dtype != "bool":
            raise VerifyException("opgen.check: condition must be a bool tensor")


# ------------------------------------------------------------------------- leaf values


@irdl_op_definition
class ConstantOp(IRDLOperation, HasFolderInterface):
    """A scalar literal (``IntegerAttr`` for integer and bool dtypes, ``FloatAttr`` otherwise)."""

    name = "opgen.constant"
    value = prop_def(FloatAttr | IntegerAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure(), ConstantLike())

    def fold(self) -> Sequence[SSAValue | Attribute]:
        return (self.value,)

    def __init__(self, value: float | int | bool, dtype: str):
        if dtype in ("bool",) or (dtype in dtypes.BY_NAME and dtypes.BY_NAME[dtype].is_int):
            attr: Attribute = IntegerAttr(int(value), i64)
        else:
            attr = FloatAttr(float(value), f64)
        super().__init__(properties={"value": attr}, result_types=[TensorType.make([], dtype)])

    @property
    def number(self) -> float | int:
        v = self.value.value.data
        return v

    def verify_(self) -> None:
        if tensor_type(self.result).rank != 0:
            raise VerifyException("opgen.constant: result must be rank 0")


@irdl_op_definition
class DimOp(IRDLOperation):
    """The run-time size of a symbolic dimension, as an i64 scalar."""

    name = "opgen.dim"
    dim = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())
    assembly_format = "$dim attr-dict `:` type($result)"

    def __init__(self, dim: str):
        super().__init__(properties={"dim": StringAttr(dim)}, result_types=[TensorType.make([], "i64")])

    def verify_(self) -> None:
        if not self.dim.data.isidentifier():
            raise VerifyException(f"opgen.dim: '{self.dim.data}' is not a dim name (derived sizes are ops: "
                                  "opgen.ceil_div, sched.seg_words, opgen.add)")


@irdl_op_definition
class FullOp(IRDLOperation):
    """A tensor of the result type filled with a scalar operand."""

    name = "opgen.full"
    value = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue, result_type: TensorType):
        super().__init__(operands=[value], result_types=[result_type])

    def verify_(self) -> None:
        if tensor_type(self.value).rank != 0:
            raise VerifyException("opgen.full: fill value must be a scalar")
        if tensor_type(self.value).dtype != tensor_type(self.result).dtype:
            raise VerifyException("opgen.full: fill value and result dtypes differ")


@irdl_op_definition
class IotaOp(IRDLOperation):
    """``result[..., i_axis, ...] = i_axis`` (an integer tensor)."""

    name = "opgen.iota"
    axis = prop_def(IntAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, axis: int, result_type: TensorType):
        super().__init__(properties={"axis": IntAttr(axis)}, result_types=[result_type])

    def verify_(self) -> None:
        t = tensor_type(self.result)
        if not 0 <= self.axis.data < t.rank:
            raise VerifyException(f"opgen.iota: axis {self.axis.data} out of range for rank {t.rank}")
        if _kinds(self, t.dtype) - {"int", "uint"}:
            raise VerifyException("opgen.iota: result must be an integer tensor")


# ---------------------------------------------------------------------- elementwise ops


class ElementwiseOp(IRDLOperation):
    """Base of elementwise ops: operands and result share one shape."""

    def verify_(self) -> None:
        _same_shape(self, [*self.operands, *self.results])


class UnaryOp(ElementwiseOp):
    """``result = f(x)``; float ops require a floating operand, same dtype out."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    x = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    FLOAT_ONLY: ClassVar[bool] = True
    assembly_format = "$x attr-dict `:` type($result)"

    def __init__(self, x: SSAValue):
        super().__init__(operands=[x], result_types=[tensor_type(x)])

    def verify_(self) -> None:
        super().verify_()
        if self.FLOAT_ONLY:
            _require_float(self, tensor_type(self.x).dtype, "operand")


class SignedOp(UnaryOp):
    """Numeric (not bool) unary op."""

    FLOAT_ONLY: ClassVar[bool] = False

    def verify_(self) -> None:
        super().verify_()
        if "bool" in _kinds(self, tensor_type(self.x).dtype):
            raise VerifyException(f"{self.name}: operand must be numeric, not bool")


@irdl_op_definition
class NegOp(SignedOp):
    name = "opgen.neg"


@irdl_op_definition
class AbsOp(SignedOp):
    name = "opgen.abs"


@irdl_op_definition
class ExpOp(UnaryOp):
    name = "opgen.exp"


@irdl_op_definition
class LogOp(UnaryOp):
    name = "opgen.log"


@irdl_op_definition
class SqrtOp(UnaryOp):
    name = "opgen.sqrt"


@irdl_op_definition
class RsqrtOp(UnaryOp):
    name = "opgen.rsqrt"


@irdl_op_definition
class RecipOp(UnaryOp):
    name = "opgen.recip"


@irdl_op_definition
class TanhOp(UnaryOp):
    name = "opgen.tanh"


@irdl_op_definition
class SigmoidOp(UnaryOp):
    name = "opgen.sigmoid"


@irdl_op_definition
class ErfOp(UnaryOp):
    """The error function, ``2/sqrt(pi) * integral_0^x exp(-t^2) dt`` (exact GELU and its
    gradient: ``Phi(x) = (1 + erf(x / sqrt 2)) / 2``)."""

    name = "opgen.erf"


@irdl_op_definition
class NotOp(UnaryOp, HasFolderInterface):
    name = "opgen.not"
    FLOAT_ONLY: ClassVar[bool] = False

    def verify_(self) -> None:
        super().verify_()
        if tensor_type(self.x).dtype != "bool":
            raise VerifyException("opgen.not: operand must be bool")

    def fold(self) -> Sequence[SSAValue | Attribute] | None:
        x = constant_int(self.x)
        return None if x is None else (IntegerAttr(int(not x), i64),)


def constant_int(v: SSAValue) -> int | None:
    """The value of a scalar integer or bool constant (None for anything else: floats never
    fold, their rounding is the targets')."""
    c = ConstantLike.get_constant_value(v)
    t = v.type
    if isinstance(c, IntegerAttr) and isinstance(t, TensorType) and t.rank == 0 and t.dtype in dtypes.BY_NAME:
        return c.value.data
    return None


def fits(x: int, dtype: str) -> bool:
    """``x`` is a value of the integer or bool ``dtype`` (no wrap-around to fold)."""
    lo, hi = dtypes.by_name(dtype).int_range
    return lo <= x <= hi


class BinaryOp(ElementwiseOp, HasFolderInterface):
    """``result = lhs (op) rhs`` on equal shapes and equal dtypes (the tracer inserts casts).

    Folds integer and bool scalar constants with ``EVAL`` when the result is a value of the
    result dtype (no wrap-around), and ``x (op) x`` to ``x`` for ``IDEMPOTENT`` ops."""

    T: ClassVar = VarConstraint("T", base(TensorType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    result = result_def(T)
    traits = traits_def(Pure())
    OPERAND_KINDS: ClassVar[set[str]] = {"float", "int", "uint"}
    assembly_format = "$lhs `,` $rhs attr-dict `:` type($result)"
    EVAL: ClassVar[Callable[[int, int], int] | None] = None
    IDEMPOTENT: ClassVar[bool] = False

    def evaluate(self, a: int, b: int) -> int | None:
        """The folded value of ``a (op) b`` (None: do not fold)."""
        return None if self.EVAL is None else self.EVAL(a, b)

    def fold(self) -> Sequence[SSAValue | Attribute] | None:
        if self.IDEMPOTENT and self.lhs is self.rhs:
            return (self.lhs,)
        a, b = constant_int(self.lhs), constant_int(self.rhs)
        if a is None or b is None:
            return None
        r = self.evaluate(a, b)
        if r is None or not fits(r, tensor_type(self.result).dtype):
            return None
        return (IntegerAttr(r, i64),)

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[self.result_type_for(lhs, rhs)])

    @classmethod
    def result_type_for(cls, lhs: SSAValue, rhs: SSAValue) -> TensorType:
        return tensor_type(lhs)

    def verify_(self) -> None:
        super().verify_()
        a = tensor_type(self.lhs).dtype  # (the rhs has its type: the T constraint)
        bad = _kinds(self, a) - self.OPERAND_KINDS
        if bad:
            raise VerifyException(f"{self.name}: operands of type {a} not allowed")
        if tensor_type(self.result) != self.result_type_for(self.lhs, self.rhs):
            raise VerifyException(f"{self.name}: wrong result type {tensor_type(self.result)}")


@irdl_op_definition
class AddOp(BinaryOp):
    name = "opgen.add"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a + b)


@irdl_op_definition
class SubOp(BinaryOp):
    name = "opgen.sub"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a - b)


@irdl_op_definition
class MulOp(BinaryOp):
    name = "opgen.mul"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a * b)


@irdl_op_definition
class DivOp(BinaryOp):
    """Division; integer operands divide with truncation toward zero (folded only by a
    non-zero constant)."""

    name = "opgen.div"

    def evaluate(self, a: int, b: int) -> int | None:
        if b == 0:
            return None
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q


@irdl_op_definition
class CeilDivOp(BinaryOp):
    """``ceil(lhs / rhs)`` of integers with ``lhs >= 0`` and ``rhs > 0``: the blocks of ``rhs``
    covering ``lhs`` (a size of the loop level; computed without overflow). Folded for constants."""

    name = "opgen.ceil_div"
    OPERAND_KINDS: ClassVar[set[str]] = {"int", "uint"}

    def evaluate(self, a: int, b: int) -> int | None:
        return None if a < 0 or b <= 0 else -(-a // b)


class _SizeOp(BinaryOp):
    """Arithmetic on sizes (non-negative i64 scalars) that never wraps: the derived dims of
    slices, concatenations and reshapes (opgen.ir.dims)."""

    OPERAND_KINDS: ClassVar[set[str]] = {"int"}


@irdl_op_definition
class SizeAddOp(_SizeOp):
    """``min(lhs + rhs, 2**63 - 1)`` of sizes."""

    name = "opgen.size_add"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: min(a + b, 2**63 - 1))


@irdl_op_definition
class SizeSubOp(_SizeOp):
    """``max(lhs - rhs, 0)`` of sizes."""

    name = "opgen.size_sub"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: max(a - b, 0))


@irdl_op_definition
class SizeMulOp(_SizeOp):
    """``min(lhs * rhs, 2**63 - 1)`` of sizes."""

    name = "opgen.size_mul"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: min(a * b, 2**63 - 1))


@irdl_op_definition
class SizeDivOp(_SizeOp):
    """``floor(lhs / rhs)`` of a size by a positive constant (0 for ``rhs <= 0``)."""

    name = "opgen.size_div"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a // b if b > 0 else 0)


#: the size op of each arithmetic dim function (opgen.ir.dims)
SIZE_OPS: dict[str, type[BinaryOp]] = {"add": SizeAddOp, "sub": SizeSubOp, "mul": SizeMulOp, "div": SizeDivOp}


@irdl_op_definition
class MaxOp(BinaryOp):
    name = "opgen.max"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(max)
    IDEMPOTENT: ClassVar[bool] = True


@irdl_op_definition
class MinOp(BinaryOp):
    name = "opgen.min"
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(min)
    IDEMPOTENT: ClassVar[bool] = True


@irdl_op_definition
class PowOp(BinaryOp):
    name = "opgen.pow"
    OPERAND_KINDS: ClassVar[set[str]] = {"float"}


@irdl_op_definition
class AndOp(BinaryOp):
    name = "opgen.and"
    OPERAND_KINDS: ClassVar[set[str]] = {"bool"}
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a & b)
    IDEMPOTENT: ClassVar[bool] = True


@irdl_op_definition
class OrOp(BinaryOp):
    name = "opgen.or"
    OPERAND_KINDS: ClassVar[set[str]] = {"bool"}
    EVAL: ClassVar[Callable[[int, int], int]] = staticmethod(lambda a, b: a | b)
    IDEMPOTENT: ClassVar[bool] = True


class CmpPredicate(StrEnum):
    """What ``opgen.cmp`` compares."""

    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"


@irdl_attr_definition
class CmpPredicateAttr(EnumAttribute[CmpPredicate], SpacedOpaqueSyntaxAttribute):
    """``#opgen<predicate lt>``."""

    name = "opgen.predicate"


CMP_PREDICATES = tuple(x.value for x in CmpPredicate)


@irdl_op_definition
class CmpOp(BinaryOp):
    """Comparison producing bool; ``predicate`` is one of eq, ne, lt, le, gt, ge."""

    name = "opgen.cmp"
    predicate = prop_def(CmpPredicateAttr)
    result = result_def(TensorType)  # bool (result_type_for)
    assembly_format = "$predicate $lhs `,` $rhs attr-dict `:` type($lhs) `->` type($result)"
    OPERAND_KINDS: ClassVar[set[str]] = {"float", "int", "uint", "bool"}

    def __init__(self, predicate: str, lhs: SSAValue, rhs: SSAValue):
        if predicate not in CMP_PREDICATES:
            raise ValueError(f"opgen.cmp: unknown predicate {predicate!r}")
        IRDLOperation.__init__(self, operands=[lhs, rhs],
                               properties={"predicate": CmpPredicateAttr(CmpPredicate(predicate))},
                               result_types=[self.result_type_for(lhs, rhs)])

    @classmethod
    def result_type_for(cls, lhs: SSAValue, rhs: SSAValue) -> TensorType:
        return TensorType.make(tensor_type(lhs).shape, "bool")

    def evaluate(self, a: int, b: int) -> int:
        p = self.predicate.data
        return int({"eq": a == b, "ne": a != b, "lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[p])

    def verify_(self) -> None:
        super().verify_()


@irdl_op_definition
class SelectOp(ElementwiseOp, HasFolderInterface):
    """``cond ? a : b`` elementwise (folds to a branch when ``cond`` is a scalar constant or
    both branches are the same value)."""

    name = "opgen.select"
    T: ClassVar = VarConstraint("T", base(TensorType))
    cond = operand_def(TensorType)
    a = operand_def(T)
    b = operand_def(T)
    result = result_def(T)
    assembly_format = "$cond `,` $a `,` $b attr-dict `:` type($cond) `,` type($result)"
    traits = traits_def(Pure())

    def __init__(self, cond: SSAValue, a: SSAValue, b: SSAValue):
        super().__init__(operands=[cond, a, b], result_types=[tensor_type(a)])

    def fold(self) -> Sequence[SSAValue | Attribute] | None:
        if self.a is self.b:
            return (self.a,)
        c = constant_int(self.cond)
        if c is None or self.a.type != self.result.type or self.b.type != self.result.type:
            return None
        return (self.a if c else self.b,)

    def verify_(self) -> None:
        super().verify_()
        if tensor_type(self.cond).dtype != "bool":
            raise VerifyException("opgen.select: condition must be bool")


@irdl_op_definition
class CastOp(ElementwiseOp, HasFolderInterface):
    """Convert to the result dtype: floats round to nearest even, float->int truncates toward
    zero (NaN or out of range gives the type's minimum; unsigned: maximum), anything->bool is
    ``!= 0``. Float casts are logical: a value cast to bf16 is still held in f32 and rounds only
    when it is stored to an output. Folds an integer or bool constant cast to an integer or bool
    dtype that holds its value (or to bool)."""

    name = "opgen.cast"
    x = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure(), _Patterns())
    assembly_format = "$x attr-dict `:` type($x) `->` type($result)"

    def __init__(self, x: SSAValue, dtype: str):
        super().__init__(operands=[x], result_types=[TensorType.make(tensor_type(x).shape, dtype)])

    def fold(self) -> Sequence[SSAValue | Attribute] | None:
        x = constant_int(self.x)
        dt = tensor_type(self.result).dtype
        if x is None or dtypes.by_name(dt).kind not in ("int", "uint", "bool"):
            return None
        r = int(x != 0) if dt == "bool" else x
        return (IntegerAttr(r, i64),) if fits(r, dt) else None


# --------------------------------------------------------------------- shape-changing ops


@irdl_op_definition
class BroadcastOp(IRDLOperation):
    """Broadcast (and expand) ``x`` to the result shape: operand dim ``i`` becomes result dim
    ``dims[i]`` and must equal it or be ``1``; result dims not named are new."""

    name = "opgen.broadcast"
    x = operand_def(TensorType)
    dims = prop_def(DenseArrayBase)
    result = result_def(TensorType)
    traits = traits_def(Pure(), _Patterns())

    def __init__(self, x: SSAValue, dims: Sequence[int], result_type: TensorType):
        super().__init__(operands=[x], properties={"dims": _i64s(dims)},
                         result_types=[result_type])

    @property
    def dim_map(self) -> tuple[int, ...]:
        return tuple(self.dims.get_values())

    def verify_(self) -> None:
        src, dst = tensor_type(self.x), tensor_type(self.result)
        if src.dtype != dst.dtype:
            raise VerifyException("opgen.broadcast: dtype must not change")
        m = self.dim_map
        if len(m) != src.rank or list(m) != sorted(set(m)) or any(not 0 <= d < dst.rank for d in m):
            raise VerifyException(f"opgen.broadcast: dims {list(m)} must be increasing result axes")
        for i, d in enumerate(m):
            if src.shape[i] not in ("1", dst.shape[d]):
                raise VerifyException(
                    f"opgen.broadcast: operand dim {src.shape[i]} cannot broadcast to {dst.shape[d]}")


@irdl_op_definition
class TransposeOp(IRDLOperation):
    """``result.shape[i] = x.shape[perm[i]]``."""

    name = "opgen.transpose"
    x = operand_def(TensorType)
    perm = prop_def(DenseArrayBase)
    result = result_def(TensorType)
    traits = traits_def(Pure(), _Patterns())

    def __init__(self, x: SSAValue, perm: Sequence[int]):
        t = tensor_type(x)
        super().__init__(operands=[x], properties={"perm": _i64s(perm)},
                         result_types=[TensorType.make([t.shape[p] for p in perm], t.dtype)])

    @property
    def permutation(self) -> tuple[int, ...]:
        return tuple(self.perm.get_values())

    def verify_(self) -> None:
        t, r = tensor_type(self.x), tensor_type(self.result)
        p = self.permutation
        if sorted(p) != list(range(t.rank)):
            raise VerifyException(f"opgen.transpose: {list(p)} is not a permutation of rank {t.rank}")
        if r != TensorType.make([t.shape[i] for i in p], t.dtype):
            raise VerifyException("opgen.transpose: wrong result type")


@irdl_op_definition
class SliceOp(IRDLOperation):
    """``x[..., start : start + length, ...]`` along ``axis``: the result's dim at ``axis`` is
    the length; ``start`` is a spelled dim (opgen.ir.dims). The DSL checks the bounds at run time."""

    name = "opgen.slice"
    x = operand_def(TensorType)
    axis = prop_def(IntAttr)
    start = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, x: SSAValue, axis: int, start: str, length: str):
        t = tensor_type(x)
        shape = list(t.shape)
        shape[axis] = length
        super().__init__(operands=[x], properties={"axis": IntAttr(axis), "start": StringAttr(start)},
                         result_types=[TensorType.make(shape, t.dtype)])

    def verify_(self) -> None:
        t, r = tensor_type(self.x), tensor_type(self.result)
        a = self.axis.data
        if not 0 <= a < t.rank or r.rank != t.rank or r.dtype != t.dtype:
            raise VerifyException(f"opgen.slice: axis {a} of a rank-{t.rank} tensor, same rank and dtype")
        if any(x != y for i, (x, y) in enumerate(zip(t.shape, r.shape, strict=True)) if i != a):
            raise VerifyException("opgen.slice: only the sliced dim may change")


@irdl_op_definition
class ConcatOp(IRDLOperation):
    """The operands joined along ``axis`` (all other dims equal; the result's dim is their sum,
    spelled canonically)."""

    name = "opgen.concat"
    parts = var_operand_def(TensorType)
    axis = prop_def(IntAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, parts: Sequence[SSAValue], axis: int):
        super().__init__(operands=[list(parts)], properties={"axis": IntAttr(axis)},
                         result_types=[self.type_for(parts, axis)])

    @staticmethod
    def type_for(parts: Sequence[SSAValue], axis: int) -> TensorType:
        from opgen.ir import dims

        ts = [tensor_type(p) for p in parts]
        shape = list(ts[0].shape)
        for t in ts[1:]:
            shape[axis] = dims.add(shape[axis], t.shape[axis])
        return TensorType.make(shape, ts[0].dtype)

    def verify_(self) -> None:
        ts = [tensor_type(p) for p in self.parts]
        a = self.axis.data
        if len(ts) < 2 or not 0 <= a < ts[0].rank:
            raise VerifyException("opgen.concat: at least two operands and an axis of theirs")
        for t in ts[1:]:
            if t.rank != ts[0].rank or t.dtype != ts[0].dtype or any(
                    x != y for i, (x, y) in enumerate(zip(t.shape, ts[0].shape, strict=True)) if i != a):
                raise VerifyException("opgen.concat: operands differ in rank, dtype or a dim other than the axis")
        if tensor_type(self.result) != self.type_for(list(self.parts), a):
            raise VerifyException("opgen.concat: wrong result type")


@irdl_op_definition
class ReshapeOp(IRDLOperation):
    """A row-major reshape: consecutive axes regroup (opgen.ir.dims.reshape_groups); the DSL
    checks each group's element count at run time."""

    name = "opgen.reshape"
    x = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, x: SSAValue, shape: Sequence[str]):
        super().__init__(operands=[x], result_types=[TensorType.make(list(shape), tensor_type(x).dtype)])

    def verify_(self) -> None:
        if tensor_type(self.x).dtype != tensor_type(self.result).dtype:
            raise VerifyException("opgen.reshape: dtype must not change")


class ReduceKind(StrEnum):
    """How ``opgen.reduce`` (and the lowered levels' accumulations) combine values."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"


@irdl_attr_definition
class ReduceKindAttr(EnumAttribute[ReduceKind], SpacedOpaqueSyntaxAttribute):
    """``#opgen<reduce_kind sum>``."""

    name = "opgen.reduce_kind"


REDUCE_KINDS = tuple(x.value for x in ReduceKind)


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """Reduce ``x`` over ``axes`` (removed from the shape) with ``kind`` in sum/max/min.
    Float sums accumulate in the compute type; backends fix the order (deterministic)."""

    name = "opgen.reduce"
    x = operand_def(TensorType)
    kind = prop_def(ReduceKindAttr)
    axes = prop_def(DenseArrayBase)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, x: SSAValue, kind: str, axes: Sequence[int]):
        t = tensor_type(x)
        keep = [d for i, d in enumerate(t.shape) if i not in axes]
        if kind not in REDUCE_KINDS:
            raise ValueError(f"opgen.reduce: unknown kind {kind!r}")
        super().__init__(operands=[x], properties={"kind": ReduceKindAttr(ReduceKind(kind)),
                                                   "axes": _i64s(sorted(axes))},
                         result_types=[TensorType.make(keep, t.dtype)])

    @property
    def axis_list(self) -> tuple[int, ...]:
        return tuple(self.axes.get_values())

    def verify_(self) -> None:
        t = tensor_type(self.x)
        ax = self.axis_list
        if not ax or len(set(ax)) != len(ax) or any(not 0 <= a < t.rank for a in ax):
            raise VerifyException(f"opgen.reduce: bad axes {list(ax)} for rank {t.rank}")
        keep = [d for i, d in enumerate(t.shape) if i not in ax]
        if tensor_type(self.result) != TensorType.make(keep, t.dtype):
            raise VerifyException("opgen.reduce: wrong result type")
        if self.kind.data == "sum" and _kinds(self, t.dtype) == {"bool"}:
            raise VerifyException("opgen.reduce: cannot sum bool (cast first)")


def _require_index(op: Operation, v: SSAValue) -> None:
    t = tensor_type(v)
    if t.rank != 1:
        raise VerifyException(f"{op.name}: indices must be 1-D, got rank {t.rank}")
    if _kinds(op, t.dtype) - {"int", "uint"}:
        raise VerifyException(f"{op.name}: indices must be integers, got {t.dtype} (cast first)")


@irdl_op_definition
class GatherOp(IRDLOperation):
    """``result[n, ...] = table[idx[n], ...]``. An index outside ``[0, rows)`` is an error."""

    name = "opgen.gather"
    table = operand_def(TensorType)
    idx = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, table: SSAValue, idx: SSAValue):
        t, i = tensor_type(table), tensor_type(idx)
        super().__init__(operands=[table, idx],
                         result_types=[TensorType.make([*i.shape, *t.shape[1:]], t.dtype)])

    def verify_(self) -> None:
        _require_index(self, self.idx)
        t, i = tensor_type(self.table), tensor_type(self.idx)
        if t.rank < 1 or tensor_type(self.result) != TensorType.make([*i.shape, *t.shape[1:]], t.dtype):
            raise VerifyException("opgen.gather: wrong result type")


@irdl_op_definition
class ScatterAddOp(IRDLOperation):
    """``result = zeros; result[idx[n], ...] += values[n, ...]`` with duplicates summed.
    The row count comes from the result type. Out-of-range indices are an error."""

    name = "opgen.scatter_add"
    values = operand_def(TensorType)
    idx = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, values: SSAValue, idx: SSAValue, rows: str):
        v = tensor_type(values)
        super().__init__(operands=[values, idx],
                         result_types=[TensorType.make([rows, *v.shape[1:]], v.dtype)])

    def verify_(self) -> None:
        _require_index(self, self.idx)
        v, i, r = tensor_type(self.values), tensor_type(self.idx), tensor_type(self.result)
        if v.rank < 1 or v.shape[0] != i.shape[0]:
            raise VerifyException(f"opgen.scatter_add: values {list(v.shape)} and indices "
                                  f"{list(i.shape)} disagree on the leading dim")
        if r.shape[1:] != v.shape[1:] or r.dtype != v.dtype:
            raise VerifyException("opgen.scatter_add: wrong result type")
        if _kinds(self, v.dtype) == {"bool"}:
            raise VerifyException("opgen.scatter_add: cannot add bool values")


@irdl_op_definition
class BincountOp(IRDLOperation):
    """``result[v] = #{n : idx[n] == v}`` for ``v`` in ``[0, rows)``; out-of-range is an error."""

    name = "opgen.bincount"
    idx = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, idx: SSAValue, rows: str, dtype: str = "i32"):
        super().__init__(operands=[idx], result_types=[TensorType.make([rows], dtype)])

    def verify_(self) -> None:
        _require_index(self, self.idx)
        r = tensor_type(self.result)
        if r.rank != 1 or _kinds(self, r.dtype) - {"int", "uint"}:
            raise VerifyException("opgen.bincount: result must be a 1-D integer tensor")


@irdl_op_definition
class MatmulOp(IRDLOperation):
    """``(M, K) x (K, N) -> (M, N)``, accumulated in the compute type."""

    name = "opgen.matmul"
    lhs = operand_def(TensorType)
    rhs = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        a, b = tensor_type(lhs), tensor_type(rhs)
        rt = TensorType.make([a.shape[0], b.shape[1]], a.dtype)
        super().__init__(operands=[lhs, rhs], result_types=[rt])

    def verify_(self) -> None:
        a, b = tensor_type(self.lhs), tensor_type(self.rhs)
        if a.rank != 2 or b.rank != 2:
            raise VerifyException("opgen.matmul: operands must be 2-D")
        if a.shape[1] != b.shape[0]:
            raise VerifyException(f"opgen.matmul: inner dims differ ({a.shape[1]} vs {b.shape[0]})")
        if a.dtype != b.dtype:
            raise VerifyException(f"opgen.matmul: operand dtypes differ ({a.dtype} vs {b.dtype})")
        _require_float(self, a.dtype, "operands")
        if tensor_type(self.result) != TensorType.make([a.shape[0], b.shape[1]], a.dtype):
            raise VerifyException("opgen.matmul: wrong result type")


@irdl_op_definition
class UnpackBitsOp(IRDLOperation):
    """Bool mask of length ``n`` (the result's dim) from ``packed``: a u8 tensor holds 8 flags per
    byte, LSB first (flag i is bit i % 8 of byte i // 8); a bool tensor holds one flag per element.
    The packed length must cover ``n`` (checked at run time)."""

    name = "opgen.unpack_bits"
    packed = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, packed: SSAValue, n: str):
        super().__init__(operands=[packed], result_types=[TensorType.make([n], "bool")])

    def verify_(self) -> None:
        p, r = tensor_type(self.packed), tensor_type(self.result)
        if p.rank != 1 or r.rank != 1 or r.dtype != "bool":
            raise VerifyException("opgen.unpack_bits: 1-D operand and bool 1-D result required")
        if _kinds(self, p.dtype) - {"uint", "bool"} or any(
                d.kind == "uint" and d.bits != 8 for d in dtype_members(self, p.dtype)):
            raise VerifyException(f"opgen.unpack_bits: packed mask must be u8 or bool, got {p.dtype}")


class _MaterializeConstant(ConstantMaterializationInterface):
    """A folded scalar as an ``opgen.constant`` of the folded op's result type."""

    def materialize_constant(self, value: Attribute, type: Attribute) -> Operation | None:  # noqa: A002 (xDSL's name)
        if not isinstance(value, IntegerAttr | FloatAttr) or not isinstance(type, TensorType) or type.rank:
            return None
        return ConstantOp.create(properties={"value": value}, result_types=[type])


Opgen = Dialect(
    "opgen",
    [FuncOp, ReturnOp, CheckOp, ConstantOp, DimOp, FullOp, IotaOp,
     NegOp, AbsOp, ExpOp, LogOp, SqrtOp, RsqrtOp, RecipOp, TanhOp, SigmoidOp, ErfOp, NotOp,
     AddOp, SubOp, MulOp, DivOp, CeilDivOp, MaxOp, MinOp, PowOp, AndOp, OrOp, CmpOp, SelectOp, CastOp,
     SizeAddOp, SizeSubOp, SizeMulOp, SizeDivOp, BroadcastOp, TransposeOp, SliceOp, ConcatOp, ReshapeOp,
     ReduceOp, GatherOp, ScatterAddOp, BincountOp, MatmulOp, UnpackBitsOp],
    [TensorType, StatusAttr, CmpPredicateAttr, ReduceKindAttr],
    [_MaterializeConstant()],
)


