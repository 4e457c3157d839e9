"""The ``sched`` dialect: destination-passing loop IR (L1), annotated per target into L2.

A ``sched.kernel`` takes buffers (``!sched.buf``) and scalars (rank-0 ``!opgen.tensor``) and
computes into its output buffers with explicit loops. Scalar arithmetic inside loops reuses the
``opgen`` elementwise ops on rank-0 values, so one printer serves L0 math and L2 bodies.

Loop kinds: ``parallel`` (iterations independent; a target may map them to threads/blocks),
``serial`` (in order), ``reduce`` (a fixed-order sum into a local accumulator that a target may
split into fixed lanes — never into a thread-count-dependent order).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr, UnitAttr
from xdsl.dialects.utils import EnumAttribute
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
    AttrSizedOperandSegments,
    EqAttrConstraint,
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
)
from xdsl.parser import AttrParser
from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern
from xdsl.printer import Printer
from xdsl.traits import (
    HasCanonicalizationPatternsTrait,
    IsolatedFromAbove,
    IsTerminator,
    MemoryAllocEffect,
    MemoryReadEffect,
    MemoryWriteEffect,
    NoTerminator,
    Pure,
    RecursiveMemoryEffect,
    is_side_effect_free,
)
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from opgen import dtypes
from opgen.ir.dialect import (
    SIZE_OPS,
    CeilDivOp,
    ConstantOp,
    DimOp,
    FuncOp,
    ReduceKind,
    ReduceKindAttr,
    Status,
    StatusAttr,
    SymbolicShape,
    TensorType,
    converted_params,
    parse_shape_and_dtype,
    tensor_type,
    verify_converted,
)

INDEX = TensorType.make([], "i64")


class LoopKind(StrEnum):
    """How a ``sched.for``'s iterations relate: independent (``parallel``), in order
    (``serial``), or combined into accumulators in a fixed order (``reduce``)."""

    PARALLEL = "parallel"
    SERIAL = "serial"
    REDUCE = "reduce"


@irdl_attr_definition
class LoopKindAttr(EnumAttribute[LoopKind], SpacedOpaqueSyntaxAttribute):
    name = "sched.loop_kind"


class CpuMapping(StrEnum):
    """How the CPU target runs a loop, a matmul or a store (set by map-cpu: opgen/lower/cpu_map.py)."""

    OMP_FOR = "omp_for"
    LANES = "lanes"
    STREAM = "stream"
    SIMD = "simd"
    #: (a ``sched.store`` in a ``stream`` loop) kept in f32 for the strip, then rounded to the
    #: buffer's narrow dtype a strip at a time by the runtime's block conversion
    STAGED = "staged"
    #: a staged store (any dtype with a strip store) whose strips of whole lines go around the
    #: caches when the output is large: every store into an output the kernel never reads
    NONTEMPORAL = "nontemporal"


@irdl_attr_definition
class CpuMappingAttr(EnumAttribute[CpuMapping], SpacedOpaqueSyntaxAttribute):
    """``#sched<cpu_mapping omp_for>``."""

    name = "sched.cpu_mapping"


class GpuMapping(StrEnum):
    """Where a statement of a CUDA kernel instance runs (set by map-gpu: opgen/lower/gpu_map.py)."""

    HOST = "host"
    SINGLE = "single"
    BLOCK = "block"
    FLAT = "flat"
    MATMUL = "matmul"
    THREADS = "threads"  # (a loop inside a kernel's uniform code) strided over the block's threads
    BLOCK_REDUCE = "block_reduce"  # (a reduce loop inside uniform code) a fixed-tree block reduction
    COLUMNS = "columns"  # a parallel loop summing a long loop per iteration: 32 iterations per block
    SLICES = "slices"  # (the long loop of a columns kernel) each warp sums every 8th iteration


@irdl_attr_definition
class GpuMappingAttr(EnumAttribute[GpuMapping], SpacedOpaqueSyntaxAttribute):
    """``#sched<gpu_mapping block>``."""

    name = "sched.gpu_mapping"


def _scalar(op: IRDLOperation, v: SSAValue, dtype: str, what: str) -> None:
    t = v.type
    if not isinstance(t, TensorType) or t.rank != 0 or t.dtype != dtype:
        raise VerifyException(f"{op.name}: {what} must be a rank-0 {dtype} value, got {t}")

BUF_ROLES = ("in", "out", "temp", "local", "stage")
#: the roles of a kernel's own buffers (allocated by ``sched.alloc``; the others are the caller's)
SCRATCH_ROLES = ("temp", "local", "stage")
#: the dtypes a ``stage`` buffer holds in their storage format (their bits as the caller's tensor
#: holds them: bf16, whose widening is exact and one shift); a ``stage`` buffer of any other dtype
#: holds its elements in their compute type, as ``local`` does
STAGE_HELD = frozenset({"bf16"})


@irdl_attr_definition
class BufType(SymbolicShape, ParametrizedAttribute, TypeAttribute):
    """``!sched.buf<[N, D], bf16, in>``: a strided view of memory.

    Roles: ``in``/``out`` come from the caller (strides from the ABI descriptor), ``temp`` is a
    contiguous workspace buffer, ``local`` a per-iteration scratch (registers or stack), ``stage``
    a per-iteration scratch copy of a caller's elements (tile-transposes' tiles) held as the
    caller holds them where the dtype is one of :data:`STAGE_HELD` (loads widen, as from the
    caller's tensor), else in the compute type.
    """

    name = "sched.buf"

    dims: ArrayAttr[StringAttr]
    elem: StringAttr
    role: StringAttr

    @staticmethod
    def make(shape: Sequence[str | int], dtype: str, role: str) -> BufType:
        return BufType(ArrayAttr([StringAttr(str(d)) for d in shape]), StringAttr(dtype),
                       StringAttr(role))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        parser.parse_punctuation("<")
        dims, elem = parse_shape_and_dtype(parser)
        parser.parse_punctuation(",")
        role = parser.parse_identifier()
        parser.parse_punctuation(">")
        return [dims, elem, StringAttr(role)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<[{', '.join(self.shape)}], {self.dtype}, {self.role.data}>")

    def verify(self) -> None:
        if self.role.data not in BUF_ROLES:
            raise VerifyException(f"sched.buf: role must be one of {BUF_ROLES}")


def buf_type(v: SSAValue) -> BufType:
    t = v.type
    if not isinstance(t, BufType):
        raise VerifyException(f"expected a !sched.buf, got {t}")
    return t


def _check_mask(op: IRDLOperation, buf: SSAValue) -> None:
    b = buf_type(buf)
    if b.rank != 1:
        raise VerifyException(f"{op.name}: the mask must be a 1-D buffer, got {b}")


def _check_value(op: StoreOp | AccumOp) -> None:
    """The stored value is a scalar (held in any compute type; the store rounds it)."""
    t = op.value.type
    if not isinstance(t, TensorType) or t.rank != 0:
        raise VerifyException(f"{op.name}: the value must be a rank-0 scalar, got {t}")


def _check_indices(op: IRDLOperation, buf: SSAValue, idx: Sequence[SSAValue]) -> None:
    b = buf_type(buf)
    if len(idx) != b.rank:
        raise VerifyException(f"{op.name}: {len(idx)} indices for a rank-{b.rank} buffer")
    for i in idx:
        if tensor_type(i) != INDEX:
            raise VerifyException(f"{op.name}: indices must be i64 scalars")


def kernel_parts(sym_name: str, arg_names: Sequence[str], arg_types: Sequence[Attribute],
                 dtype_vars: DictionaryAttr) -> dict[str, object]:
    """The properties and region of a kernel op (``sched.kernel``, ``tile.kernel``): its symbol,
    parameter names, dtype variables, and one block whose arguments are the parameters."""
    block = Block(arg_types=arg_types)
    for a, n in zip(block.args, arg_names, strict=True):
        a.name_hint = n
    return {"properties": {"sym_name": StringAttr(sym_name), "arg_names": ArrayAttr([StringAttr(n) for n in arg_names]),
                           "dtype_vars": dtype_vars},
            "regions": [Region(block)]}


def unread(arg: SSAValue) -> bool:
    """A kernel parameter nothing reads or writes (a tensor that only gives sizes): it has no
    storage type in the kernel (its dtype variable may not be instantiated)."""
    return not arg.uses and not (isinstance(arg.type, BufType) and arg.type.role.data == "out")


@irdl_op_definition
class KernelOp(IRDLOperation):
    """A kernel: block arguments are the op's parameters as buffers or scalars, in order."""

    name = "sched.kernel"
    sym_name = prop_def(StringAttr)
    arg_names = prop_def(ArrayAttr[StringAttr])
    dtype_vars = prop_def(DictionaryAttr)
    #: parameters the binder converts to another dtype first (``opgen.func``'s, kept)
    boundary_casts = opt_prop_def(DictionaryAttr)
    #: ``{output: input}`` pairs the caller may pass as one buffer (``opgen.func``'s, kept)
    may_alias = opt_prop_def(DictionaryAttr)
    #: parameters whose rows are addressed through a row table (``opgen.func``'s, kept)
    batched = opt_prop_def(ArrayAttr[StringAttr])
    #: size parameters as ``{name: dim}`` (``opgen.func``'s, kept)
    sizes = opt_prop_def(DictionaryAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(self, sym_name: str, arg_names: Sequence[str], arg_types: Sequence[Attribute],
                 dtype_vars: DictionaryAttr):
        super().__init__(**kernel_parts(sym_name, arg_names, arg_types, dtype_vars))

    def dtype_var_map(self) -> dict[str, tuple[dtypes.DType, ...]]:
        return {k: tuple(dtypes.by_name(x.data) for x in v.data)  # type: ignore[union-attr]
                for k, v in self.dtype_vars.data.items()}

    def dtype_options(self, name: str) -> tuple[dtypes.DType, ...]:
        """The dtypes ``name`` (a dtype variable of this kernel, or a dtype) takes over its instances."""
        return self.dtype_var_map().get(name) or (dtypes.by_name(name),)

    @property
    def converted(self) -> dict[str, str]:
        """``boundary_casts`` as ``{parameter: dtype}``."""
        return converted_params(self)

    @property
    def aliased(self) -> frozenset[str]:
        """Every parameter of a ``may_alias`` pair (neither side may assume it is not the other)."""
        pairs = self.may_alias.data.items() if self.may_alias else ()
        return frozenset(n for o, i in pairs for n in (o, i.data))  # type: ignore[attr-defined]

    @property
    def aliased_args(self) -> set[SSAValue]:
        """The block arguments of the parameters in :attr:`aliased`."""
        names = self.aliased
        return {a for a, n in self.param_names.items() if n in names}

    @property
    def param_names(self) -> dict[SSAValue, str]:
        """Each block argument's parameter name."""
        return {a: n.data for a, n in zip(self.body.block.args, self.arg_names.data, strict=True)}

    @property
    def batched_params(self) -> frozenset[str]:
        return frozenset(a.data for a in self.batched.data) if self.batched else frozenset()

    def verify_(self) -> None:
        verify_converted(self)
        names = {a.data for a in self.arg_names.data}
        for n in self.batched_params - names:
            raise VerifyException(f"sched.kernel: batched names '{n}', not a parameter")


#: an optional attribute of a ``local`` buffer's ``sched.alloc`` (an array of dtype names): the
#: caller dtypes of the elements the row it holds was computed from (a row group's kept row:
#: opgen.lower.row_groups). A ``lanes`` reduction reading it takes the lanes of those elements
#: (map-cpu's ``lanes``), so its sums add in the order, and to the bits, of the same reduction
#: computed where it is read.
LANE_DTYPES = "lane_dtypes"


@irdl_op_definition
class AllocOp(IRDLOperation):
    """A ``temp`` (workspace), ``local`` or ``stage`` (scratch) buffer; ``init`` zero-fills it."""

    name = "sched.alloc"
    #: the size of each dim, as values (the type spells them for the reader)
    sizes = var_operand_def(EqAttrConstraint(INDEX))
    result = result_def(BufType)
    zero = opt_prop_def(IntAttr)
    traits = traits_def(MemoryAllocEffect())

    def __init__(self, t: BufType, sizes: Sequence[SSAValue], zero: bool = False):
        super().__init__(operands=[list(sizes)], result_types=[t], properties={"zero": IntAttr(int(zero))})

    def verify_(self) -> None:
        if buf_type(self.result).role.data not in SCRATCH_ROLES:
            raise VerifyException("sched.alloc: only temp/local/stage buffers are allocated")
        if len(self.sizes) != buf_type(self.result).rank:
            raise VerifyException(f"sched.alloc: {len(self.sizes)} sizes for a rank-{buf_type(self.result).rank} "
                                  "buffer")


def bindings(k: KernelOp | FuncOp) -> Iterator[dict[str, dtypes.DType]]:
    """Every binding of the dtype variables a kernel (or an ``opgen.func``) is instantiated over
    (its compute types; index and mask dtypes converted at the boundary are not among them)."""
    dvars = k.dtype_var_map()
    for combo in itertools.product(*dvars.values()):
        yield dict(zip(dvars, combo, strict=True))


def bound_dtype(name: str, binding: dict[str, dtypes.DType]) -> dtypes.DType:
    """The dtype ``name`` (a dtype variable or a dtype) stands for under ``binding``."""
    return binding.get(name) or dtypes.by_name(name)


def held_as_stored(b: BufType, d: dtypes.DType) -> bool:
    """Whether buffer ``b``, its dtype bound to ``d``, holds its elements in their storage format
    (a caller's tensor; a ``stage`` buffer of a :data:`STAGE_HELD` dtype), not their compute type."""
    return b.role.data in ("in", "out") or (b.role.data == "stage" and d.name in STAGE_HELD)


def binding_bytes(binding: dict[str, dtypes.DType]) -> Callable[[BufType], int]:
    """Element size of a buffer under ``binding`` (the caller's dtype where it holds elements as
    stored, :func:`held_as_stored`; its compute type otherwise)."""
    def size(b: BufType) -> int:
        d = bound_dtype(b.dtype, binding)
        return (d if held_as_stored(b, d) else d.compute).bits // 8
    return size


def sizes_of(buf: SSAValue) -> list[SSAValue]:
    """The sizes of an allocated (``temp``/``local``) buffer's dims, as values."""
    op = buf.owner
    if not isinstance(op, AllocOp):
        raise VerifyException(f"{buf} is not an allocated buffer (its sizes are the caller's dims)")
    return list(op.sizes)


def extent_of(buf: SSAValue, axis: int) -> tuple[list[Operation], SSAValue] | None:
    """``buf``'s size along ``axis`` as a value: (the ops that compute it, for the caller to
    insert where it is needed, and the value) — an allocated buffer's size operand, or a caller's
    dim by name (``opgen.dim``) or number; None for a size spelled as an expression."""
    if isinstance(buf.owner, AllocOp):
        return [], sizes_of(buf)[axis]
    name = buf_type(buf).shape[axis]
    if name.isidentifier():
        d = DimOp(name)
        return [d], d.result
    if name.isdigit():
        c = ConstantOp(int(name), "i64")
        return [c], c.result
    return None


def sizes_in_place(op: Operation) -> bool:
    """An op whose operands the printers write out as expressions of the caller's dims, never by
    name: an allocation (its sizes) and the :data:`SIZE_EXPR_OPS`."""
    return isinstance(op, (AllocOp, *SIZE_EXPR_OPS))


@irdl_op_definition
class SegWordsOp(IRDLOperation):
    """The words of the segment table ``sched.segments`` builds for ``n`` indices sorted into
    ``rows`` segments: the target runtime's layout (``opgen_seg_words``)."""

    name = "sched.seg_words"
    rows = operand_def(EqAttrConstraint(INDEX))
    n = operand_def(EqAttrConstraint(INDEX))
    result = result_def(EqAttrConstraint(INDEX))
    traits = traits_def(Pure())
    assembly_format = "$rows `,` $n attr-dict"

    def __init__(self, rows: SSAValue, n: SSAValue):
        super().__init__(operands=[rows, n], result_types=[INDEX])


#: the size ops: a size expression prints each in place, its operands never by name
#: (``opgen.ceil_div``, ``sched.seg_words``, the derived dims' ``opgen.size_*``)
SIZE_EXPR_OPS: tuple[type[Operation], ...] = (CeilDivOp, SegWordsOp, *SIZE_OPS.values())


@irdl_op_definition
class ForOp(IRDLOperation):
    """``for i in [lo, hi)``: the region's block argument is ``i``."""

    name = "sched.for"
    lo = operand_def(EqAttrConstraint(INDEX))
    hi = operand_def(EqAttrConstraint(INDEX))
    kind = prop_def(LoopKindAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator(), RecursiveMemoryEffect())
    assembly_format = "$kind $lo `to` $hi attr-dict-with-keyword $body"

    def __init__(self, lo: SSAValue, hi: SSAValue, kind: str, hint: str = "i"):
        block = Block(arg_types=[INDEX])
        block.args[0].name_hint = hint
        super().__init__(operands=[lo, hi], properties={"kind": LoopKindAttr(LoopKind(kind))},
                         regions=[Region(block)])

    @property
    def iv(self) -> SSAValue:
        return self.body.block.args[0]

    def verify_(self) -> None:
        if self.iv.type != INDEX:
            raise VerifyException("sched.for: the induction variable must be an i64 scalar")


@irdl_op_definition
class IfOp(IRDLOperation):
    """``if (cond) then else otherwise``: two single-block regions, either may be empty."""

    name = "sched.if"
    cond = operand_def(TensorType)
    then = region_def("single_block")
    otherwise = region_def("single_block")
    traits = traits_def(NoTerminator(), RecursiveMemoryEffect())
    assembly_format = "$cond attr-dict-with-keyword `:` type($cond) $then `else` $otherwise"

    def __init__(self, cond: SSAValue, then: Sequence[Operation] = (), otherwise: Sequence[Operation] = ()):
        super().__init__(operands=[cond], regions=[Region(Block(then)), Region(Block(otherwise))])

    def verify_(self) -> None:
        _scalar(self, self.cond, "bool", "the condition")


@irdl_op_definition
class LoadOp(IRDLOperation):
    """``buf[idx...]`` widened to the compute type of the buffer's dtype."""

    name = "sched.load"
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    result = result_def(TensorType)
    traits = traits_def(MemoryReadEffect())
    assembly_format = "$buf `[` $idx `]` attr-dict `:` type($buf) `->` type($result)"

    def __init__(self, buf: SSAValue, idx: Sequence[SSAValue]):
        super().__init__(operands=[buf, idx], result_types=[TensorType.make([], buf_type(buf).dtype)])

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        _scalar(self, self.result, buf_type(self.buf).dtype, "the result")


@irdl_op_definition
class LoadFnOp(IRDLOperation):
    """``f(buf[idx...])``: a function of one element, applied to the element read as
    ``sched.load`` reads it. ``f`` is the region: one block whose argument is the widened element,
    ending in ``sched.yield`` of the result; it is isolated (only its argument and its own
    constants), so it is the same function wherever it is evaluated. A target may evaluate it
    once for every value an element of 16 bits can hold and index that table with the element's
    bits (the CPU target, in its bf16 and f16 instances: opgen/lower/tabulate.py); otherwise
    the region runs in place."""

    name = "sched.load_fn"
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    result = result_def(TensorType)
    body = region_def("single_block")
    traits = traits_def(MemoryReadEffect(), IsolatedFromAbove())
    assembly_format = "$buf `[` $idx `]` attr-dict `:` type($buf) `->` type($result) $body"

    def __init__(self, buf: SSAValue, idx: Sequence[SSAValue], body: Region, result: Attribute):
        super().__init__(operands=[buf, idx], result_types=[result], regions=[body])

    @property
    def arg(self) -> SSAValue:
        """The element, widened (the region's block argument)."""
        return self.body.block.args[0]

    @property
    def value(self) -> SSAValue:
        """What the region yields for ``arg``."""
        last = self.body.block.last_op
        assert isinstance(last, YieldOp)
        return last.value

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        args = self.body.block.args
        if len(args) != 1 or args[0].type != TensorType.make([], buf_type(self.buf).dtype):
            raise VerifyException("sched.load_fn: the region takes one argument, a scalar of the buffer's dtype")
        last = self.body.block.last_op
        if not isinstance(last, YieldOp):
            raise VerifyException("sched.load_fn: the region must end in sched.yield")
        if last.value.type != self.result.type:
            raise VerifyException(f"sched.load_fn: yields {last.value.type}, the result is {self.result.type}")


@irdl_op_definition
class YieldOp(IRDLOperation):
    """The value of the enclosing ``sched.load_fn``'s function."""

    name = "sched.yield"
    value = operand_def(TensorType)
    traits = traits_def(IsTerminator())
    assembly_format = "$value attr-dict `:` type($value)"

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])


@irdl_op_definition
class PrefetchOp(IRDLOperation):
    """A hint that the bytes ``ahead`` (0 or more) past element ``buf[idx...]`` will be read
    soon (a target's software prefetch; it reads nothing, never faults, and may be dropped).

    ``write`` (optional): the bytes will be written soon, not read (a prefetch for ownership).

    ``span`` (optional, an i64 count): the hint covers ``span`` elements along the last axis
    from ``buf[idx...]``, every cache line of them (a whole gathered row:
    opgen/lower/gather_prefetch.py); without it, the one line ``ahead`` bytes past the element.

    ``shift`` (optional, an i64 count): the element is ``shift`` further along the last axis,
    ``buf[..., idx[-1] + shift]`` (a row read at a column offset: map-cpu's ``stream`` loops).

    ``l2`` (optional): the line is brought into the core's second-level cache only (a pass that
    reads rows and writes none: more lines in flight, its own loads then find them a level
    below the first).

    ``wrap`` and ``cols`` (optional, i64, together): where the ``ahead`` bytes pass the end of
    the element's row (``cols`` elements along the last axis), the line is that many bytes into
    row ``wrap`` instead (along the second-to-last axis; the other indices as given): the row
    the loop reading this one will read next where that is not the row after it in memory
    (map-cpu: a group of rows read side by side, whose next rows come a group later)."""

    name = "sched.prefetch"
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    span = opt_operand_def(EqAttrConstraint(INDEX))
    shift = opt_operand_def(EqAttrConstraint(INDEX))
    wrap = opt_operand_def(EqAttrConstraint(INDEX))
    cols = opt_operand_def(EqAttrConstraint(INDEX))
    ahead = prop_def(IntAttr)
    write = opt_prop_def(UnitAttr)
    l2 = opt_prop_def(UnitAttr)
    irdl_options = (AttrSizedOperandSegments(as_property=True),)
    traits = traits_def(MemoryReadEffect())
    assembly_format = ("$buf `[` $idx `]` (`span` $span^)? (`shift` $shift^)? `ahead` $ahead (`write` $write^)? "
                       "(`l2` $l2^)? (`wrap` $wrap^)? (`cols` $cols^)? attr-dict `:` type($buf)")

    def __init__(self, buf: SSAValue, idx: Sequence[SSAValue], ahead: int, write: bool = False,
                 span: SSAValue | None = None, shift: SSAValue | None = None, l2: bool = False,
                 wrap: tuple[SSAValue, SSAValue] | None = None):
        props: dict[str, Attribute] = {"ahead": IntAttr(ahead)}
        if write:
            props["write"] = UnitAttr()
        if l2:
            props["l2"] = UnitAttr()

        def opt(v: SSAValue | None) -> list[SSAValue]:
            return [v] if v is not None else []

        row, cols = wrap if wrap is not None else (None, None)
        super().__init__(operands=[buf, idx, opt(span), opt(shift), opt(row), opt(cols)], properties=props)

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        if self.ahead.data < 0:
            raise VerifyException("sched.prefetch: ahead must be a number of bytes, 0 or more")
        if self.span is not None and self.shift is not None:
            raise VerifyException("sched.prefetch: a span starts at its element (no shift)")
        if self.l2 is not None and self.write is not None:
            raise VerifyException("sched.prefetch: a prefetch for writing fetches into the first-level cache (no l2)")
        if (self.wrap is None) != (self.cols is None):
            raise VerifyException("sched.prefetch: wrap names a row and cols its length: both or neither")
        if self.wrap is not None and (buf_type(self.buf).rank < 2 or self.span is not None or self.shift is not None):
            raise VerifyException("sched.prefetch: wrap moves to another row along the second-to-last axis "
                                  "(a buffer of rank 2 or more; no span or shift)")


@irdl_op_definition
class PrefetchShareOp(IRDLOperation):
    """A hint that a block of ``buf`` will be read soon: share ``part`` of ``parts`` (equal
    shares, in order) of the cache lines of the ``rows`` x ``cols`` block whose first element is
    ``buf[idx...]`` (its rows along the second-to-last axis, its columns along the last), into
    the core's second-level cache. A loop of ``parts`` iterations issuing share ``i`` in its
    iteration ``i`` brings the whole block in while it works (tile-transposes: the next tile's
    rows of ``x`` while the current tile's rows of ``y`` are written). Like ``sched.prefetch`` it
    reads nothing, never faults, and may be dropped (the CPU printer drops it in a call whose
    ``buf`` fits the last-level cache)."""

    name = "sched.prefetch_share"
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    rows = operand_def(EqAttrConstraint(INDEX))
    cols = operand_def(EqAttrConstraint(INDEX))
    part = operand_def(EqAttrConstraint(INDEX))
    parts = operand_def(EqAttrConstraint(INDEX))
    traits = traits_def(MemoryReadEffect())
    assembly_format = ("$buf `[` $idx `]` `,` $rows `x` $cols `share` $part `of` $parts attr-dict `:` type($buf)")

    def __init__(self, buf: SSAValue, idx: Sequence[SSAValue], rows: SSAValue, cols: SSAValue, part: SSAValue,
                 parts: SSAValue):
        super().__init__(operands=[buf, idx, rows, cols, part, parts])

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        if buf_type(self.buf).rank < 2:
            raise VerifyException("sched.prefetch_share: a block of a rank >= 2 buffer")


@irdl_op_definition
class LoadBitOp(IRDLOperation):
    """Flag ``i`` of a mask buffer: bit ``i % 8`` of byte ``i / 8`` (u8) or element ``i`` (bool)."""

    name = "sched.load_bit"
    buf = operand_def(BufType)
    i = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(MemoryReadEffect())

    def __init__(self, buf: SSAValue, i: SSAValue):
        super().__init__(operands=[buf, i], result_types=[TensorType.make([], "bool")])

    def verify_(self) -> None:
        _check_mask(self, self.buf)
        _scalar(self, self.i, "i64", "the flag number")
        _scalar(self, self.result, "bool", "the result")


@irdl_op_definition
class FlagsPerElemOp(IRDLOperation):
    """Flags held per element of a mask buffer: 8 for u8 (bit-packed), 1 for bool."""

    name = "sched.flags_per_elem"
    buf = operand_def(BufType)
    result = result_def(TensorType)
    traits = traits_def(Pure())  # (a property of the buffer's dtype, bound per instance)

    def __init__(self, buf: SSAValue):
        super().__init__(operands=[buf], result_types=[INDEX])

    def verify_(self) -> None:
        _check_mask(self, self.buf)
        _scalar(self, self.result, "i64", "the result")


@irdl_op_definition
class LinePhaseOp(IRDLOperation):
    """Where ``buf[idx...]`` falls in its 64-byte cache line, in elements of the instance's dtype:
    its address modulo 64, over the element's size (0 for an element that starts a line). A
    caller's buffer sits where the caller put it (numpy's large arrays 16 bytes past a page), so
    a pass that cuts a row of it into segments written at different times (tile-transposes)
    shifts the cuts onto line boundaries with it: a line that two segments share is read for
    ownership and written twice. Only a schedule depends on it, never a value."""

    name = "sched.line_phase"
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    result = result_def(TensorType)
    traits = traits_def(Pure())  # (the buffer's address is fixed for a call)
    assembly_format = "$buf `[` $idx `]` attr-dict `:` type($buf) `->` type($result)"

    def __init__(self, buf: SSAValue, idx: Sequence[SSAValue]):
        super().__init__(operands=[buf, idx], result_types=[INDEX])

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        if buf_type(self.buf).role.data not in ("in", "out"):
            raise VerifyException("sched.line_phase: the element of a caller's buffer")
        _scalar(self, self.result, "i64", "the result")


@irdl_op_definition
class StoreOp(IRDLOperation):
    """``buf[idx...] = value`` (rounded to the buffer's dtype)."""

    name = "sched.store"
    value = operand_def(TensorType)
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    traits = traits_def(MemoryWriteEffect())
    assembly_format = "$value `,` $buf `[` $idx `]` attr-dict `:` type($value) `,` type($buf)"

    def __init__(self, value: SSAValue, buf: SSAValue, idx: Sequence[SSAValue]):
        super().__init__(operands=[value, buf, idx])

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        _check_value(self)


@irdl_op_definition
class AccumOp(IRDLOperation):
    """``buf[idx...] = buf[idx...] (kind) value`` with kind sum/max/min."""

    name = "sched.accum"
    value = operand_def(TensorType)
    buf = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    kind = prop_def(ReduceKindAttr)
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = "$kind $value `,` $buf `[` $idx `]` attr-dict `:` type($value) `,` type($buf)"

    def __init__(self, kind: str, value: SSAValue, buf: SSAValue, idx: Sequence[SSAValue]):
        super().__init__(operands=[value, buf, idx], properties={"kind": ReduceKindAttr(ReduceKind(kind))})

    def verify_(self) -> None:
        _check_indices(self, self.buf, self.idx)
        _check_value(self)


@irdl_op_definition
class SegmentsOp(IRDLOperation):
    """Stable sort of an index buffer (``n`` values, range-checked beforehand) into ``rows``
    segments: ``order`` (n positions sorted by index, ties in increasing position) and ``seg``,
    the segment table read by ``sched.segment_start``. ``seg`` has the symbolic size
    ``segs(rows, n)`` words: the target's runtime picks the layout from the two sizes (a dense
    start table when ``rows`` is not much larger than ``n``, else the n sorted indices searched
    by bisection), so the workspace grows with the number of indices, not with ``rows``."""

    name = "sched.segments"
    idx = operand_def(BufType)
    seg = operand_def(BufType)
    order = operand_def(BufType)
    rows = operand_def(TensorType)
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())

    def __init__(self, idx: SSAValue, seg: SSAValue, order: SSAValue, rows: SSAValue):
        super().__init__(operands=[idx, seg, order, rows])

    def verify_(self) -> None:
        shape = buf_type(self.seg).shape
        if len(shape) != 1 or not shape[0].startswith("segs("):
            raise VerifyException("sched.segments: seg must be a 1-D buffer of segs(rows, n) words")
        for name, v in (("idx", self.idx), ("seg", self.seg), ("order", self.order)):
            b = buf_type(v)
            if b.rank != 1 or b.dtype != "i64":
                raise VerifyException(f"sched.segments: {name} must be a 1-D i64 buffer, got {b}")
        _scalar(self, self.rows, "i64", "rows")


@irdl_op_definition
class SegmentStartOp(IRDLOperation):
    """The first position (in ``order``) of segment ``v`` of a ``sched.segments`` table, for
    ``v`` in ``[0, rows]`` (``v = rows`` gives ``n``): segment ``v`` is ``[start(v), start(v+1))``.
    ``rows`` and ``n`` are the sizes the table was built with."""

    name = "sched.segment_start"
    seg = operand_def(BufType)
    v = operand_def(TensorType)
    rows = operand_def(TensorType)
    n = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(MemoryReadEffect())

    def __init__(self, seg: SSAValue, v: SSAValue, rows: SSAValue, n: SSAValue):
        super().__init__(operands=[seg, v, rows, n], result_types=[INDEX])

    def verify_(self) -> None:
        for what, x in (("v", self.v), ("rows", self.rows), ("n", self.n), ("the result", self.result)):
            _scalar(self, x, "i64", what)


@irdl_op_definition
class RequireOp(IRDLOperation):
    """Return ``status`` from the kernel when ``cond`` is false (before any output is written)."""

    name = "sched.require"
    cond = operand_def(TensorType)
    status = prop_def(StatusAttr)
    message = prop_def(StringAttr)
    #: it may end the kernel: nothing moves across it, as across a write
    traits = traits_def(MemoryWriteEffect())

    def __init__(self, cond: SSAValue, status: str, message: str):
        super().__init__(operands=[cond], properties={"status": StatusAttr(Status(status)),
                                                      "message": StringAttr(message)})

    def verify_(self) -> None:
        _scalar(self, self.cond, "bool", "the condition")


class _BarrierPatterns(HasCanonicalizationPatternsTrait):
    @classmethod
    def get_canonicalization_patterns(cls) -> tuple[RewritePattern, ...]:
        return (AdjacentBarrier(),)


@irdl_op_definition
class BarrierOp(IRDLOperation):
    """Every thread of a block waits until all have arrived, and then sees their earlier memory
    writes (CUDA's ``__syncthreads()``). Only in code the whole block runs with the same values;
    placed by ``place-gpu-barriers`` (opgen/lower/gpu_sync.py)."""

    name = "sched.barrier"
    assembly_format = "attr-dict"
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect(), _BarrierPatterns())


class AdjacentBarrier(RewritePattern):
    """A barrier after another one with only side-effect-free ops between orders nothing more."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: BarrierOp, rewriter: PatternRewriter) -> None:
        prev = op.prev_op
        while prev is not None and not isinstance(prev, BarrierOp) and is_side_effect_free(prev):
            prev = prev.prev_op
        if isinstance(prev, BarrierOp):
            rewriter.erase(op)



#: the k order of ``sched.matmul``: every element sums its k terms in blocks of GEMM_KC, each block
#: by fused multiply-adds starting from 0, and adds the blocks to C in increasing k (the first one
#: replaces C unless ``accumulate``); the CPU runtime's GEMM blocks k by the same constant
GEMM_KC = 256


@irdl_op_definition
class BufferMatmulOp(IRDLOperation):
    """``C[:m, :n] (= | +=) op(A)[:m, :k] @ op(B)[:k, :n]`` on 2-D buffers (``trans`` per operand;
    ``accumulate`` adds to C). Accumulation is in the compute type, in the fixed k order of
    :data:`GEMM_KC` whatever the tiling, the thread count or the target's instruction set.

    ``c_row`` (optional): C's rows start at that row of the buffer (a group's rows of a buffer of
    partial sums: opgen/lower/matmul_chain.py).

    ``products`` (set by narrow-products: opgen/lower/narrow_products.py) names a storage dtype
    (or dtype variable) the operands may be rounded to for the products, where the target has
    units for it (bf16 units: the CPU runtime's opgen_bgemm on AMX or AVX512-BF16); the k blocks stay, but
    the bits within a block are then the units' own, fixed per machine and thread-independent.

    ``exact`` (set by exact-operands: opgen/lower/narrow_products.py) gives, for A and B, the
    dtype (or dtype variable) whose values the operand holds exactly, "" where none is known: a
    target whose products round f32 operands (CUDA's TF32 tensor cores) splits only the operands
    not exact in a dtype those products keep.

    ``b_packed`` (optional; placed by hoist-packing: opgen/lower/hoist_packing.py): a buffer that
    ``sched.pack`` filled from B for these products before the loops around this matmul, which do
    not write B; a target reads B from it, or from B where it packs nothing."""

    name = "sched.matmul"
    a = operand_def(BufType)
    b = operand_def(BufType)
    c = operand_def(BufType)
    m = operand_def(TensorType)
    n = operand_def(TensorType)
    k = operand_def(TensorType)
    c_row = opt_operand_def(TensorType)
    b_packed = opt_operand_def(BufType)
    trans = prop_def(ArrayAttr[IntAttr])
    accumulate = prop_def(IntAttr)
    products = opt_prop_def(StringAttr)
    exact = opt_prop_def(ArrayAttr[StringAttr])
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    def __init__(self, a: SSAValue, b: SSAValue, c: SSAValue, m: SSAValue, n: SSAValue, k: SSAValue,
                 trans_a: bool, trans_b: bool, accumulate: bool = False, products: str | None = None,
                 c_row: SSAValue | None = None, b_packed: SSAValue | None = None):
        props: dict[str, Attribute] = {"trans": ArrayAttr([IntAttr(int(trans_a)), IntAttr(int(trans_b))]),
                                       "accumulate": IntAttr(int(accumulate))}
        if products is not None:
            props["products"] = StringAttr(products)
        super().__init__(operands=[a, b, c, m, n, k, [c_row] if c_row is not None else [],
                                   [b_packed] if b_packed is not None else []], properties=props)

    def verify_(self) -> None:
        for v in (self.a, self.b, self.c):
            if buf_type(v).rank != 2:
                raise VerifyException("sched.matmul: operands must be 2-D buffers")
        for what, x in (("m", self.m), ("n", self.n), ("k", self.k), ("c_row", self.c_row)):
            if x is not None:
                _scalar(self, x, "i64", what)
        if len(self.trans.data) != 2:
            raise VerifyException("sched.matmul: trans must give one flag per operand (A, B)")
        if self.exact is not None and len(self.exact.data) != 2:
            raise VerifyException("sched.matmul: exact must give one dtype per operand (A, B)")


@irdl_op_definition
class PackOp(IRDLOperation):
    """``dst`` = op(``src``) (``k`` x ``n``; ``trans``: src is its transpose) laid out as the right-hand
    operand of a matmul whose ``products`` are ``products`` (sched.matmul's ``b_packed``): the target's
    packed layout (the CPU runtime's opgen_bpack for bf16 products, groups of 16 columns of bf16 pairs in
    round32(k) x round32(n) words; opgen_spack for f32 ones, 32-column panels in k x round32(n)
    floats), or nothing where that target packs nothing."""

    name = "sched.pack"
    src = operand_def(BufType)
    dst = operand_def(BufType)
    k = operand_def(TensorType)
    n = operand_def(TensorType)
    trans = prop_def(IntAttr)
    products = prop_def(StringAttr)
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = ("$src `->` $dst `,` $k `x` $n `trans` $trans `products` $products attr-dict "
                       "`:` type($src) `,` type($dst) `,` type($k) `,` type($n)")

    def __init__(self, src: SSAValue, dst: SSAValue, k: SSAValue, n: SSAValue, trans: bool, products: str):
        super().__init__(operands=[src, dst, k, n], properties={"trans": IntAttr(int(trans)),
                                                               "products": StringAttr(products)})

    def verify_(self) -> None:
        for v in (self.src, self.dst):
            if buf_type(v).rank != 2:
                raise VerifyException("sched.pack: src and dst must be 2-D buffers")
        for what, x in (("k", self.k), ("n", self.n)):
            _scalar(self, x, "i64", what)


@irdl_op_definition
class TransposeTileOp(IRDLOperation):
    """``dst[c, r] = src[..., row + r, col + c]`` for ``r < rows``, ``c < cols``, where ``idx``
    names the tile's first element ``src[..., row, col]``: a tile of a caller's tensor staged
    transposed in a ``stage`` buffer (at least ``cols`` x ``rows``; widened to the compute type
    unless the buffer holds its dtype as stored, :data:`STAGE_HELD`), so that a loop reading the
    tensor's columns reads the buffer's rows instead (tile-transposes; the CPU runtime's
    ``opgen_<dtype>_transpose_tile``, 16-row blocks in registers)."""

    name = "sched.transpose_tile"
    src = operand_def(BufType)
    idx = var_operand_def(EqAttrConstraint(INDEX))
    dst = operand_def(BufType)
    rows = operand_def(EqAttrConstraint(INDEX))
    cols = operand_def(EqAttrConstraint(INDEX))
    traits = traits_def(MemoryReadEffect(), MemoryWriteEffect())
    assembly_format = "$src `[` $idx `]` `->` $dst `,` $rows `x` $cols attr-dict `:` type($src) `,` type($dst)"

    def __init__(self, src: SSAValue, idx: Sequence[SSAValue], dst: SSAValue, rows: SSAValue, cols: SSAValue):
        super().__init__(operands=[src, idx, dst, rows, cols])

    def verify_(self) -> None:
        _check_indices(self, self.src, self.idx)
        s, d = buf_type(self.src), buf_type(self.dst)
        if s.rank < 2 or d.rank != 2 or d.role.data != "stage":
            raise VerifyException("sched.transpose_tile: a tile of a rank >= 2 buffer into a 2-D stage buffer")
        if s.dtype != d.dtype:
            raise VerifyException(f"sched.transpose_tile: dtype {d.dtype} holds a tile of {s.dtype}")


#: ops that stop a kernel or act on whole buffers (or segments): the passes that restructure a
#: loop's elementwise body (fuse-siblings, column-strips, tile-transposes, jam-rows, map-cpu's
#: vector loops) leave a loop holding one as it is
OPAQUE: tuple[type[IRDLOperation], ...] = (RequireOp, SegmentsOp, SegmentStartOp, BufferMatmulOp, PackOp,
                                           TransposeTileOp, PrefetchShareOp)
#: ops a straight-line elementwise body holds none of (tile-transposes' and chunk-flat-loops'
#: shapes): a loop, a branch, an allocation, an accumulation, or an :data:`OPAQUE` op
NOT_STRAIGHT: tuple[type[IRDLOperation], ...] = (ForOp, IfOp, AllocOp, AccumOp, *OPAQUE)


def scalar_accums(loop: ForOp) -> list[AccumOp]:
    """The accumulations of ``loop``'s body into rank-0 buffers: what a reduction loop carries
    from one iteration to the next (the values map-cpu's lanes and map-gpu's block reductions
    split; the printers of a marked loop take them from here, deciding nothing)."""
    return [o for o in loop.body.block.ops if isinstance(o, AccumOp) and buf_type(o.buf).rank == 0]


def effects(op: Operation) -> tuple[set[SSAValue], set[SSAValue]]:
    """Buffers read and updated by ``op`` and everything nested in it."""
    reads: set[SSAValue] = set()
    writes: set[SSAValue] = set()
    for o in op.walk():
        if isinstance(o, LoadOp | LoadBitOp | LoadFnOp):
            reads.add(o.buf)
        elif isinstance(o, SegmentStartOp):
            reads.add(o.seg)
        elif isinstance(o, StoreOp | AccumOp):
            writes.add(o.buf)
        elif isinstance(o, BufferMatmulOp):
            reads |= {o.a, o.b, o.c} | ({o.b_packed} if o.b_packed is not None else set())
            writes.add(o.c)
        elif isinstance(o, PackOp | TransposeTileOp):
            reads.add(o.src)
            writes.add(o.dst)
        elif isinstance(o, SegmentsOp):
            reads.add(o.idx)
            writes |= {o.seg, o.order}
    return reads, writes


def defined_outside(loop: Operation, v: SSAValue) -> bool:
    """``v`` is defined outside ``loop`` (not in its body, not one of its counters)."""
    owner = v.owner
    if isinstance(owner, Block):
        parent = owner.parent_op()
        return parent is None or not loop.is_ancestor(parent)
    return not loop.is_ancestor(owner)


def counter_axes(loop: ForOp, bufs: set[SSAValue], counter: SSAValue | None = None) -> set[int]:
    """The axes at which the accesses inside ``loop`` to ``bufs`` (loads, stores, accumulations,
    prefetches) name ``counter`` (``loop``'s own by default) itself, with -1 for an access that
    names it at none: one axis and no -1 means iteration ``i`` touches only slice ``i`` of each
    buffer (the legality of jam-rows and fuse-siblings)."""
    counter = loop.iv if counter is None else counter
    axes: set[int] = set()
    for o in loop.walk():
        if isinstance(o, LoadOp | LoadBitOp | LoadFnOp | PrefetchOp | StoreOp | AccumOp) and o.buf in bufs:
            idx = [o.i] if isinstance(o, LoadBitOp) else list(o.idx)
            axes |= {a for a, v in enumerate(idx) if v is counter} or {-1}
    return axes


Sched = Dialect("sched", [KernelOp, AllocOp, ForOp, IfOp, LoadOp, LoadFnOp, YieldOp, PrefetchOp, PrefetchShareOp,
                          LoadBitOp, FlagsPerElemOp, StoreOp, AccumOp, SegmentsOp, SegmentStartOp, RequireOp,
                          BufferMatmulOp, PackOp, TransposeTileOp, BarrierOp, SegWordsOp, LinePhaseOp],
                [BufType, LoopKindAttr, CpuMappingAttr, GpuMappingAttr])
