"""One C-family printer for ``sched`` kernels; targets subclass it with small hooks.

The printer turns a ``sched.kernel`` plus a dtype binding into one C function. Scalars live in
their compute type (float for f16/bf16/f32, double for f64); loads widen and stores round once.
Reduction loops are printed with a fixed number of lanes combined in a fixed order, so results
are bitwise identical for any thread count and any buffer alignment (and gcc vectorises them).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from xdsl.ir import Operation, SSAValue, Use

from opgen import dtypes
from opgen.dtypes import DType
from opgen.emit import cnames, render
from opgen.emit.render import STATUS_C
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import (
    LINE,
    PAIR,
    ZERO_FILL,
    copies,
    cpu_mapping,
    lanes,
    loaded_bytes,
    paired,
    strip,
    zero_fill_loop,
)
from opgen.lower.sched import CpuMapping

#: the opgen_scalar_t member holding a by-value parameter of each dtype
SCALAR_FIELD = {"f32": "f", "i64": "i", "bool": "b"}


@dataclass(frozen=True)
class BufInfo:
    """How a kernel argument buffer is addressed."""

    param_index: int
    batch: bool
    last_contig: bool


@dataclass
class StripCopy:
    """One copy of a loop body that :meth:`CPrinter.interleave` prints: its counter's value
    (C), its place in staging arrays in the pair layout (``lane``) and in the strip's order
    (``elem``), which element of each pair it is in a ``pairs`` loop (``half``), and the lanes
    its accumulators use (a lanes loop's)."""

    at: str
    lane: str
    elem: str
    half: str | None = None
    lanes: dict[SSAValue, str] = field(default_factory=dict)


def _plus(expr: str, k: int) -> str:
    """C for ``expr + k``."""
    return f"{expr} + {k}" if k else expr


def named_use(use: Use) -> bool:
    """A use that refers to the value by its name: not a size printed in place (an allocation's
    size, an operand of a size op: :meth:`CPrinter.size`)."""
    return not s.sizes_in_place(use.operation)


def c_literal(value: float | int | bool, d: DType) -> str:
    if d.is_bool:
        return "true" if value else "false"
    if d.is_int:
        v = int(value)
        if d.kind == "uint":
            return f"{v}u" if d.bits <= 32 else f"{v}ull"
        if d.bits == 64:
            return "INT64_MIN" if v == -(2**63) else f"{v}ll"
        return str(v)
    f = float(value)
    suffix = "f" if d.compute == dtypes.F32 else ""
    if math.isnan(f):
        return "NAN" if suffix else "(double)NAN"
    if math.isinf(f):
        return ("-" if f < 0 else "") + ("INFINITY" if suffix else "(double)INFINITY")
    text = repr(float(dtypes.F32.np_dtype.type(f))) if suffix else repr(f)
    if "e" not in text and "." not in text:
        text += ".0"
    return text + suffix


def c_cast(x: str, src: DType, dst: DType) -> str:
    """C for ``opgen.cast`` of the register value ``x`` (held in ``src``'s compute type)."""
    a, b = src.compute, dst.compute
    if a == b:
        return x
    if b.is_bool:
        return f"({x} != 0)"
    if a.is_float and b.is_int:
        lo, hi = b.int_range
        bad = c_literal(hi if b.kind == "uint" else lo, b)
        return f"OPGEN_F2I({b.c_type}, {x}, {c_literal(lo, b)}, {c_literal(hi, b)}, {bad})"
    return f"({b.c_type})({x})"


def c_widen(raw: str, d: DType) -> str:
    """C reading an element ``raw`` of a caller's tensor of dtype ``d`` into its compute type."""
    if d == dtypes.BF16:
        return f"opgen_bf16_to_f32({raw})"
    if d == dtypes.F16:
        return f"opgen_f16_to_f32({raw})"
    if d == dtypes.BOOL:  # (stored as uint8_t: below)
        return f"({raw} != 0)"
    return raw


def boundary_conversions(targets: tuple[str, ...]) -> list[dict[str, object]]:
    """How the binder converts an element ``s[o]`` of each dtype to each of ``targets`` (the
    dtypes opgen/lower/boundary.py converts parameters to): the kernels' own cast C, so a
    converted tensor gives the same bits as a kernel per dtype would."""
    out: list[dict[str, object]] = []
    for d in dtypes.ALL:
        to = [{"code": cnames.dtype_enum(t), "ctype": dtypes.by_name(t).c_type,
               "expr": c_cast(c_widen("s[o]", d), d, dtypes.by_name(t))} for t in targets]
        out.append({"code": cnames.dtype_enum(d.name), "ctype": d.c_type, "to": to})
    return out


@dataclass(frozen=True)
class GemmOperand:
    """A matrix as the runtime GEMMs read it: its first element, row and column strides (in
    elements), storage (``f32``, ``bf16``, ``f16``) and a run-time condition for those strides to
    hold (None: always)."""

    ptr: str
    rs: str
    cs: str
    held: str
    ok: str | None = None


class CPrinter:
    """Prints one kernel instantiation. Subclasses override the ``*_hook`` methods."""

    restrict = "restrict"
    fn_attr = ""
    #: the runtime GEMM by the storage of A, B and C (f32 in memory; bf16 caller tensors) ...
    GEMM: ClassVar[dict[tuple[str, str, str], str]] = {
        ("f32", "f32", "f32"): "opgen_sgemm", ("bf16", "bf16", "f32"): "opgen_gemm_bf16",
        ("bf16", "bf16", "bf16"): "opgen_gemm_bf16_out", ("f16", "f16", "f32"): "opgen_gemm_f16",
        ("f16", "f16", "f16"): "opgen_gemm_f16_out"}
    #: ... and, for f32 operands, by the dtype of sched.matmul's products
    NARROW_GEMM: ClassVar[dict[str, str]] = {"bf16": "opgen_bgemm"}
    #: sched.pack by the dtype of its products (f16 ones run on the f32 GEMM), and the GEMM reading
    #: a matmul's b_packed (with the cast of the packed buffer)
    PACK: ClassVar[dict[str, tuple[str, str, str]]] = {"bf16": ("opgen_bpack", "opgen_bgemm_pb", "(uint16_t *)"),
                                                         "f32": ("opgen_spack", "opgen_sgemm_pb", ""),
                                                         "f16": ("opgen_spack", "opgen_sgemm_pb", "")}
    #: a staged store's strip store by the buffer's dtype: ``staged`` stores of a narrow dtype (a
    #: block conversion; f32 ones store value by value) and ``nontemporal`` ones (which may stream)
    STRIP_STORE: ClassVar[dict[str, str]] = {"bf16": "opgen_bf16_store_strip", "f32": "opgen_f32_store_strip",
                                             "f16": "opgen_f16_store_strip"}
    #: a staged load's strip load by the buffer's dtype: ``staged`` loads of a dtype whose
    #: block conversion beats converting value by value (f16; bf16's widening is two vector
    #: instructions already), and bool masks: GCC 12 vectorises a strip of 16 lanes mixing
    #: 1-byte flags with 4-byte values in 8-byte vectors (13x slower than the flags widened first)
    STRIP_LOAD: ClassVar[dict[str, str]] = {"f16": "opgen_f16_load_strip", "bool": "opgen_bool_load_strip"}
    #: a staged ``sched.load_fn`` looked up in a table (``TABULATED`` dtypes; the table of f32
    #: values): the strip's lookups by scalar loads (opgen/lower/cpu_map.py :func:`staged_loads`)
    TABLE_STRIP_LOAD = "opgen_table_load_strip"
    #: staged stores of a ``pairs`` strip whose staging array holds its first elements, then its
    #: second ones, by the buffer's dtype (the others stage in the strip's order)
    STRIP_STORE_PAIRS: ClassVar[dict[str, str]] = {"bf16": "opgen_bf16_store_strip_pairs"}
    #: ... and of one whose value is the same all along the loop (a row of zeros): a fill
    FILL_STRIP: ClassVar[dict[str, str]] = {"bf16": "opgen_bf16_fill_strip", "f32": "opgen_f32_fill_strip",
                                            "f16": "opgen_f16_fill_strip"}

    def __init__(self, kernel: s.KernelOp, binding: dict[str, DType], fn_name: str,
                 buf_info: dict[str, BufInfo], dim_ids: dict[str, int], param_index: dict[str, int]):
        self.param_index = param_index
        self.unit_last = False  # assume every caller buffer's last dim has stride 1
        self.with_ws = True  # also print the workspace-size function
        self.pre_name: str | None = None  # also print the checks-only function under this name
        self.ws_name = fn_name + "_ws"  # the workspace-size function's name
        self.k = kernel
        self.binding = binding
        self.fn_name = fn_name
        self.buf_info = buf_info
        self.dim_ids = dim_ids
        self.names: dict[SSAValue, str] = {}
        #: kernel arguments by DSL parameter name (printed as cnames.local(name))
        self.arg_of: dict[SSAValue, str] = kernel.param_names
        self.lines: list[str] = []
        self.mentioned: set[str] = set()  # identifiers the body being printed uses (see mention)
        self.depth = 1
        self.counter = 0
        self.lanes: dict[SSAValue, str] = {}  # local accumulators currently split into lanes
        #: staged stores of the strip being printed, by staging array (None: a fill, nothing staged)
        self.staged: dict[Operation, str | None] = {}
        self.staged_loads: dict[Operation, str] = {}  # staged loads inside their strip -> its f32 array
        self.strip_lane = "l"  # where in its staging array the strip being printed stores (stream_loop)
        #: ... the element of the strip being printed, for arrays in the strip's order (in a
        #: ``pairs`` strip, ``strip_lane`` is its place in the pair layout; else the same)
        self.strip_elem = "l"
        #: in a ``pairs`` strip (cpu_map.paired), which element of each pair is being printed
        #: ("first" or "second"; None elsewhere)
        self.pair_half: str | None = None
        #: the flags (opgen_nt) of the outputs whose ``nontemporal`` stores may stream, by buffer
        self.nt: dict[SSAValue, str] = {}
        self.kz: dict[SSAValue, str] = {}  # outputs with zero_fill stores -> their known-zero flag
        #: the flags of the inputs ``sched.prefetch_share`` fetches: whether the input is at least
        #: the last-level cache in this call (``opgen_nt_bytes``), where the hints pay
        self.big: dict[SSAValue, str] = {}
        self.first: list[str] = []  # statements the function body starts with (a target's one-time set-up)
        # workspace temps and per-thread scratch: (name, ctype, count, saturating count)
        self.scratch: list[tuple[str, str, str, str]] = []
        self.temps: list[tuple[str, str, str, str]] = []

    # ------------------------------------------------------------------ types
    def dtype(self, name: str) -> DType:
        return dtypes.BY_NAME[name] if name in dtypes.BY_NAME else self.binding[name]

    def ctype(self, name: str) -> str:
        """C type of a value held in registers (compute type)."""
        d = self.dtype(name).compute
        return d.c_type

    def storage_ctype(self, b: s.BufType) -> str:
        """C type of a buffer's elements: a caller's tensor in its dtype (bool flags as uint8_t:
        GCC 12 vectorises no loop loading a _Bool; they are read as ``!= 0``), and a ``stage``
        tile of a dtype it holds as stored (``sched.held_as_stored``), scratch in the compute
        type."""
        d = self.dtype(b.dtype)
        if not s.held_as_stored(b, d):
            return d.compute.c_type
        return "uint8_t" if d == dtypes.BOOL else d.c_type

    def dim(self, d: str) -> str:
        """A caller's dim (a parameter's shape: a name or a number)."""
        if d.isdigit():
            return d + "ll"
        if not d.isidentifier():
            raise NotImplementedError(f"C printer: '{d}' is not a dim name (a derived size is a value)")
        return self.mention(f"d_{d}")

    def size(self, v: SSAValue, plain: bool = False) -> str:
        """A size value (an allocated buffer's dim, a size op's operand) as an expression of the
        caller's dims, in place: the same text in every function that needs it (``plain``: a
        constant without its ``ll``)."""
        op = v.owner
        if isinstance(op, ir.DimOp):
            return self.dim(op.dim.data)
        if isinstance(op, ir.ConstantOp):
            return str(int(op.number)) if plain else f"{int(op.number)}ll"
        if isinstance(op, ir.CeilDivOp):  # ceil(a / k) without overflow near INT64_MAX
            a, k = self.size(op.lhs), self.size(op.rhs, plain=True)
            return f"({a} / {k} + ({a} % {k} != 0))"
        if isinstance(op, s.SegWordsOp):  # a segment table's words: the runtime's layout (sched.segments)
            return f"opgen_seg_words({self.size(op.rows)}, {self.size(op.n)})"
        if isinstance(op, ir.AddOp) and ir.constant_int(op.rhs) is not None:
            return f"({self.size(op.lhs)} + {ir.constant_int(op.rhs)})"
        if isinstance(op, ir.SizeDivOp):  # by a positive constant
            return f"({self.size(op.lhs)} / {self.size(op.rhs, plain=True)})"
        if isinstance(op, ir.SizeSubOp | ir.SizeAddOp | ir.SizeMulOp):  # saturating, never overflowing
            a, b = self.size(op.lhs), self.size(op.rhs)
            if isinstance(op, ir.SizeSubOp):
                return f"({a} > {b} ? {a} - {b} : 0ll)"
            if isinstance(op, ir.SizeAddOp):
                return f"({a} > INT64_MAX - {b} ? INT64_MAX : {a} + {b})"
            return f"({b} != 0 && {a} > INT64_MAX / {b} ? INT64_MAX : {a} * {b})"
        raise NotImplementedError(f"C printer: {op} is not a size (dims, constants, ceil_div, seg_words, "
                                  f"size_*, + k)")

    def extents(self, buf: SSAValue) -> list[str]:
        """An allocated buffer's dims (``sched.alloc``'s sizes) as expressions."""
        return [self.size(v) for v in s.sizes_of(buf)]

    def size_count(self, sizes: Sequence[SSAValue]) -> str:
        """Host expression: the element count of a buffer of ``sizes`` as a saturating ``size_t``
        (SIZE_MAX when it does not fit: the binder refuses such a workspace, nothing wraps)."""
        terms = []
        for v in sizes:
            op = v.owner
            if isinstance(op, ir.AddOp) and ir.constant_int(op.rhs) is not None:
                terms.append(f"opgen_sz_add(opgen_sz_dim({self.size(op.lhs)}), {ir.constant_int(op.rhs)})")
            else:
                terms.append(f"opgen_sz_dim({self.size(v)})")
        if not terms:
            return "(size_t)1"
        out = terms[0]
        for t in terms[1:]:
            out = f"opgen_sz_mul({out}, {t})"
        return out

    def unit_axis(self, param: str, axis: int, rank: int) -> bool:
        """Caller buffer ``param`` has stride 1 along ``axis`` in this instance: its last axis when
        it is contiguous there, or in the unit-stride flavour (no stride local is declared)."""
        return axis == rank - 1 and (self.buf_info[param].last_contig or self.unit_last)

    def stride_expr(self, param: str, axis: int, rank: int) -> str:
        """Caller buffer ``param``'s stride along ``axis`` as C: ``1`` where :meth:`unit_axis`
        says so, else its stride local (mentioned)."""
        return "1" if self.unit_axis(param, axis, rank) else self.mention(self.stride_name(param, axis))

    @staticmethod
    def stride_name(param: str, axis: int) -> str:
        """The local holding a caller buffer's stride (elements) along ``axis``."""
        return f"st_{param}_{axis}"

    @staticmethod
    def rows_name(param: str) -> str:
        """The local holding a caller buffer's row-offset table (Batch dims)."""
        return f"ro_{param}"

    # ------------------------------------------------------------------ output
    def line(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def name(self, v: SSAValue) -> str:
        return self.mention(self.names[v])

    def mention(self, ident: str) -> str:
        """``ident``, recorded as used by the body being printed (which declarations it needs)."""
        self.mentioned.add(ident)
        return ident

    def define(self, v: SSAValue, expr: str) -> None:
        n = self.fresh()
        self.names[v] = n
        self.line(f"const {self.ctype(ir.tensor_type(v).dtype)} {n} = {expr};")

    # ------------------------------------------------------------------ addressing
    def offset(self, buf: SSAValue, idx: list[SSAValue]) -> str:
        b = s.buf_type(buf)
        pn = self.arg_of.get(buf, "")
        terms = []
        info = self.buf_info.get(pn)
        for i, v in enumerate(idx):
            iv = self.name(v)
            if b.role.data in ("in", "out"):
                assert info is not None
                if i == 0 and info.batch:
                    terms.append(f"{self.mention(self.rows_name(pn))}[{iv}]")
                elif self.unit_axis(pn, i, b.rank):
                    terms.append(iv)
                else:
                    terms.append(f"{iv} * {self.mention(self.stride_name(pn, i))}")
            else:
                stride = " * ".join(self.extents(buf)[i + 1:])
                terms.append(f"{iv} * {stride}" if stride else iv)
        return " + ".join(terms) or "0"

    def load_expr(self, buf: SSAValue, idx: list[SSAValue]) -> str:
        b = s.buf_type(buf)
        if b.rank == 0 and b.role.data == "local":
            return self.lanes.get(buf, self.name(buf))
        raw, d = self.elem_ref(buf, idx), self.dtype(b.dtype)
        return c_widen(raw, d) if s.held_as_stored(b, d) else raw

    def store_value(self, b: s.BufType, value: str, vdtype: str) -> str:
        d = self.dtype(b.dtype)
        if s.held_as_stored(b, d):
            if d == dtypes.BF16:
                return f"opgen_f32_to_bf16({value})"
            if d == dtypes.F16:
                return f"opgen_f32_to_f16({value})"
        if self.dtype(vdtype).compute != d.compute:
            return f"({self.ctype(b.dtype)})({value})"
        return value

    def lvalue(self, buf: SSAValue, idx: list[SSAValue]) -> str:
        b = s.buf_type(buf)
        if b.rank == 0 and b.role.data == "local":
            return self.lanes.get(buf, self.name(buf))
        return self.elem_ref(buf, idx)

    def elem_ref(self, buf: SSAValue, idx: list[SSAValue]) -> str:
        """The stored element ``buf[idx]`` (storage type) as a C lvalue."""
        return f"{self.name(buf)}[{self.offset(buf, idx)}]"

    # ------------------------------------------------------------------ scalar ops
    UNARY_F: ClassVar[dict[type, str]] = {ir.ExpOp: "exp", ir.LogOp: "log", ir.SqrtOp: "sqrt", ir.TanhOp: "tanh",
                                          ir.ErfOp: "erf"}
    BINARY: ClassVar[dict[type, str]] = {ir.AddOp: "+", ir.SubOp: "-", ir.MulOp: "*", ir.AndOp: "&&", ir.OrOp: "||"}
    CMP: ClassVar[dict[str, str]] = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

    #: element dtypes whose ``sched.load_fn`` is looked up in a table (:meth:`table`); the others
    #: run its region in place
    TABULATED: ClassVar[frozenset[str]] = frozenset()

    #: the target's own f32 versions of math functions (by libm name)
    MATH_F32: ClassVar[dict[str, str]] = {}

    def fmath(self, fn: str, dtype: str) -> str:
        if self.dtype(dtype).compute != dtypes.F32:
            return fn
        return self.MATH_F32.get(fn + "f", fn + "f")

    def scalar_expr(self, op: Operation) -> str:
        if isinstance(op, ir.ConstantOp):
            return c_literal(op.number, self.dtype(ir.tensor_type(op.result).dtype))
        if isinstance(op, ir.DimOp):
            return self.dim(op.dim.data)
        if isinstance(op, s.SIZE_EXPR_OPS):  # printed in place, their operands never named
            return self.size(op.results[0])
        rt = ir.tensor_type(op.results[0]).dtype
        if isinstance(op, s.LoadOp):
            if op in self.staged_loads:  # (inside its stream loop's strip)
                return self.staged_ref(op)
            if self.pair_half and self.pair_word(op):
                return f"opgen_bf16_{self.pair_half}(&{self.elem_ref(op.buf, list(op.idx))})"
            return self.load_expr(op.buf, list(op.idx))
        if isinstance(op, s.LoadBitOp):
            b = s.buf_type(op.buf)
            if self.dtype(b.dtype) == dtypes.BOOL:
                return f"{self.name(op.buf)}[{self.offset(op.buf, [op.i])}]"
            i = self.name(op.i)
            byte = f"{self.name(op.buf)}[{self._raw_offset(op.buf, (f'({i} >> 3)',))}]"
            return f"(bool)(({byte} >> ({i} & 7)) & 1)"
        args = [self.name(o) for o in op.operands]
        if isinstance(op, s.SegmentStartOp):
            return f"opgen_seg_start({', '.join(args)})"
        if isinstance(op, s.FlagsPerElemOp):
            return "8ll" if self.dtype(s.buf_type(op.buf).dtype) == dtypes.U8 else "1ll"
        if isinstance(op, s.LinePhaseOp):
            size = self.dtype(s.buf_type(op.buf).dtype).itemsize
            return f"(int64_t)(((uintptr_t)&{self.elem_ref(op.buf, list(op.idx))} & {LINE - 1}) / {size})"
        if type(op) in self.UNARY_F:
            return f"{self.fmath(self.UNARY_F[type(op)], rt)}({args[0]})"
        if isinstance(op, ir.RsqrtOp):
            one = c_literal(1.0, self.dtype(rt))
            return f"{one} / {self.fmath('sqrt', rt)}({args[0]})"
        if isinstance(op, ir.RecipOp):
            return f"{c_literal(1.0, self.dtype(rt))} / {args[0]}"
        if isinstance(op, ir.SigmoidOp):
            one = c_literal(1.0, self.dtype(rt))
            return f"{one} / ({one} + {self.fmath('exp', rt)}(-{args[0]}))"
        if isinstance(op, ir.NegOp):
            return f"-{args[0]}"
        if isinstance(op, ir.AbsOp):
            return f"({args[0]} < 0 ? -{args[0]} : {args[0]})"
        if isinstance(op, ir.NotOp):
            return f"!{args[0]}"
        if isinstance(op, ir.PowOp):
            return f"{self.fmath('pow', rt)}({args[0]}, {args[1]})"
        if isinstance(op, ir.DivOp):
            d = self.dtype(rt)
            if d.is_float:
                return f"{args[0]} / {args[1]}"
            if d.kind == "uint" or d.is_bool:
                return f"({args[1]} == 0 ? 0 : {args[0]} / {args[1]})"
            # x / 0 is 0, MIN / -1 wraps (as in the oracle): never a trap or undefined behaviour
            ct, ut = d.compute.c_type, d.compute.c_type.replace("int", "uint")
            return (f"({args[1]} == 0 ? ({ct})0 : {args[1]} == -1 ? ({ct})(({ut})0 - ({ut}){args[0]}) : "
                    f"({ct})({args[0]} / {args[1]}))")
        if isinstance(op, ir.MaxOp):
            return f"(({args[0]} > {args[1]} || {args[0]} != {args[0]}) ? {args[0]} : {args[1]})"
        if isinstance(op, ir.MinOp):
            return f"(({args[0]} < {args[1]} || {args[0]} != {args[0]}) ? {args[0]} : {args[1]})"
        if type(op) in self.BINARY:
            return f"{args[0]} {self.BINARY[type(op)]} {args[1]}"
        if isinstance(op, ir.CmpOp):
            return f"{args[0]} {self.CMP[op.predicate.data]} {args[1]}"
        if isinstance(op, ir.SelectOp):
            return f"{args[0]} ? {args[1]} : {args[2]}"
        if isinstance(op, ir.CastOp):
            return self.cast_expr(args[0], ir.tensor_type(op.x).dtype, rt)
        raise NotImplementedError(f"C printer: no rule for {op.name}")

    def cast_expr(self, x: str, src: str, dst: str) -> str:
        return c_cast(x, self.dtype(src), self.dtype(dst))

    # ------------------------------------------------------------------ statements
    def walk(self, ops: Iterator[Operation]) -> None:
        for op in ops:
            self.stmt(op)

    def stmt(self, op: Operation) -> None:
        if op.results and not any(named_use(u) for r in op.results for u in r.uses):
            return  # a dead value, an unused scratch buffer, or a size printed in place: nothing to print
        if isinstance(op, s.ForOp):
            self.loop(op)
        elif isinstance(op, s.AllocOp):
            self.alloc(op)
        elif isinstance(op, s.IfOp):
            self.branch(op)
        elif isinstance(op, s.StoreOp) and op in self.staged:  # (inside its stream loop's strip)
            if self.staged[op] is not None:
                pairs = self.pair_half and self.dtype(s.buf_type(op.buf).dtype).name in self.STRIP_STORE_PAIRS
                at = self.strip_lane if pairs else self.strip_elem
                self.line(f"{self.staged[op]}[{at}] = {self.name(op.value)};")
        elif isinstance(op, s.StoreOp):
            b = s.buf_type(op.buf)
            val = self.store_value(b, self.name(op.value), ir.tensor_type(op.value).dtype)
            self.line(f"{self.lvalue(op.buf, list(op.idx))} = {val};")
        elif isinstance(op, s.AccumOp):
            target = self.lvalue(op.buf, list(op.idx))
            v = self.name(op.value)
            kind = op.kind.data
            if kind == "sum":
                self.line(f"{target} += {v};")
            else:
                # (a select stored whatever the outcome: a conditional store into a lane was
                # vectorised as a masked store each strip, which the next strip's load waited for:
                # a max over rows of 8192x4096 f32 5.2 -> 3.6 ms, bf16 6.1 -> 2.8)
                cmp = ">" if kind == "max" else "<"
                self.line(f"{target} = ({v} {cmp} {target} || {v} != {v}) ? {v} : {target};")
        elif isinstance(op, s.RequireOp):
            st = STATUS_C[op.status.data]
            msg = op.message.data.replace('"', "'")
            self.line(f'if (!({self.name(op.cond)})) return opgen_fail({st}, "{self.k.sym_name.data}: {msg}");')
        elif isinstance(op, s.SegmentsOp):
            n = self.extents(op.idx)[0]
            self.line(f"opgen_seg_build({self.name(op.idx)}, {n}, {self.name(op.rows)}, "
                      f"{self.name(op.seg)}, {self.name(op.order)});")
        elif isinstance(op, s.BufferMatmulOp):
            self.matmul(op)
        elif isinstance(op, s.PackOp):
            self.pack(op)
        elif isinstance(op, s.TransposeTileOp):
            self.transpose_tile(op)
        elif isinstance(op, s.PrefetchShareOp):
            self.prefetch_share(op)
        elif isinstance(op, s.PrefetchOp):
            macro = "OPGEN_PREFETCH_W" if op.write is not None else "OPGEN_PREFETCH_L2" if op.l2 is not None \
                else "OPGEN_PREFETCH"
            guard = f"if (!{self.mention(self.nt[op.buf])}) " if op.write is not None and op.buf in self.nt else ""
            idx = list(op.idx)
            if op.span is not None:
                self.span_prefetch(op, macro, guard)
            elif op.wrap is not None:
                self.wrap_prefetch(op, macro, guard)
            elif op.shift is not None:
                at = self._raw_offset(op.buf, (*(self.name(v) for v in idx[:-1]),
                                               f"({self.name(idx[-1])} + {self.name(op.shift)})"))
                self.line(f"{guard}{macro}({self.name(op.buf)}, {at}, {op.ahead.data});")
            else:
                self.line(f"{guard}{macro}({self.name(op.buf)}, {self.offset(op.buf, idx)}, {op.ahead.data});")
        elif isinstance(op, s.LoadFnOp):
            self.load_fn(op)
        elif isinstance(op, ir.DimOp):  # a caller's dim has its name already
            self.names[op.result] = self.dim(op.dim.data)
        elif op.results:
            self.define(op.results[0], self.scalar_expr(op))
        else:
            raise NotImplementedError(f"C printer: no statement rule for {op.name}")

    def span_prefetch(self, op: s.PrefetchOp, macro: str, guard: str) -> None:
        """A ``sched.prefetch ... span``: one prefetch a cache line over ``span`` elements of the
        last axis where it is unit-stride in this instance; the first element's line otherwise
        (``guard``: the C that precedes a prefetch, as for one line)."""
        assert op.span is not None
        b = s.buf_type(op.buf)
        pn = self.arg_of.get(op.buf, "")
        idx = list(op.idx)
        if b.role.data in ("in", "out") and not self.unit_axis(pn, b.rank - 1, b.rank):
            self.line(f"{guard}{macro}({self.name(op.buf)}, {self.offset(op.buf, idx)}, {op.ahead.data});")
            return
        q = self.fresh("q")
        step = max(1, 64 // self.dtype(b.dtype).itemsize)
        at = self._raw_offset(op.buf, (*(self.name(v) for v in idx[:-1]), f"({self.name(idx[-1])} + {q})"))
        self.line(f"{guard}for (int64_t {q} = 0; {q} < {self.name(op.span)}; {q} += {step}) "
                  f"{macro}({self.name(op.buf)}, {at}, {op.ahead.data});")

    def wrap_prefetch(self, op: s.PrefetchOp, macro: str, guard: str) -> None:
        """A ``sched.prefetch ... wrap``: the line ``ahead`` bytes past element ``j`` of the row
        while ``j`` + ``ahead`` bytes' elements is in the row, else ``ahead`` bytes past element
        ``j - cols`` of row ``wrap`` (as far into it as the row's end was passed)."""
        assert op.wrap is not None and op.cols is not None
        idx = list(op.idx)
        ahead = -(-op.ahead.data // self.dtype(s.buf_type(op.buf).dtype).itemsize)  # (in elements, rounded up)
        j, cols = self.name(idx[-1]), self.name(op.cols)
        here = self.offset(op.buf, idx)
        there = self._raw_offset(op.buf, (*(self.name(v) for v in idx[:-2]), self.name(op.wrap), f"({j} - {cols})"))
        self.line(f"{guard}{macro}({self.name(op.buf)}, ({j} + {ahead} < {cols} ? {here} : {there}), "
                  f"{op.ahead.data});")

    def pair_word(self, op: s.LoadOp) -> bool:
        """Whether ``pair`` load ``op`` (cpu_map.mark_pairs) reads its pair as one word in this
        instance: bf16 along a unit-stride last axis (else element by element)."""
        b = s.buf_type(op.buf)
        return PAIR in op.attributes and self.dtype(b.dtype) == dtypes.BF16 \
            and self.unit_axis(self.arg_of[op.buf], b.rank - 1, b.rank)

    def staged_ref(self, op: Operation) -> str:
        """The staged value of load ``op`` in the strip being printed (staged in the strip's order)."""
        return f"{self.staged_loads[op]}[{self.strip_elem}]"

    def load_fn(self, op: s.LoadFnOp) -> None:
        """``sched.load_fn``: a lookup (:meth:`table`) where the element's dtype is one of
        ``TABULATED``, else its region in place on the element as ``sched.load`` reads it."""
        if op in self.staged_loads:  # (inside its stream loop's strip, looked up already)
            self.define(op.result, self.staged_ref(op))
            return
        if self.dtype(s.buf_type(op.buf).dtype).name in self.TABULATED:
            self.define(op.result, f"{self.table(op)}[{self.elem_ref(op.buf, list(op.idx))}]")
            return
        for print_step, _ in self.steps(op):
            print_step()

    def apply_fn(self, op: s.LoadFnOp, element: str) -> SSAValue:
        """Print ``op``'s region on the widened element ``element`` (C); the value it yields."""
        for print_step, _ in self.fn_steps(op, lambda: element):
            print_step()
        return op.value

    def fn_steps(self, op: s.LoadFnOp, element: Callable[[], str]) -> list[tuple[Callable[[], None], list[SSAValue]]]:
        """The statements of ``op``'s region on the element ``element()`` prints (:meth:`steps`)."""
        inner = [o for o in op.body.block.ops if not isinstance(o, s.YieldOp)]
        return [(lambda: self.define(op.arg, element()), [op.arg]),
                *((lambda o=o: self.stmt(o), list(o.results)) for o in inner)]

    def steps(self, op: Operation) -> list[tuple[Callable[[], None], list[SSAValue]]]:
        """``op``'s statements as :meth:`interleave` takes turns at them, each with the values it
        names: one, or those of a ``sched.load_fn`` printed in place (its region's, then its
        result named as the value the region yields)."""
        if not isinstance(op, s.LoadFnOp) or self.dtype(s.buf_type(op.buf).dtype).name in self.TABULATED:
            return [(lambda: self.stmt(op), list(op.results))]
        return [*self.fn_steps(op, lambda: self.load_expr(op.buf, list(op.idx))),
                (lambda: self.names.__setitem__(op.result, self.names[op.value]), [op.result])]

    def table(self, op: s.LoadFnOp) -> str:
        """The C array holding ``op``'s function of every value of its element (a target with
        ``TABULATED`` dtypes prints it)."""
        raise NotImplementedError(f"C printer: no tables ({self.TABULATED})")

    def alloc(self, op: s.AllocOp) -> None:
        b = s.buf_type(op.result)
        ct = self.storage_ctype(b)
        n = self.fresh("t" if b.role.data == "temp" else "l")
        self.names[op.result] = n
        zero = op.zero is not None and op.zero.data
        if b.rank == 0 and b.role.data == "local":  # a register
            self.line(f"{ct} {n}{' = 0' if zero else ''};")
            return
        count = " * ".join(f"(size_t){d}" for d in self.extents(op.result)) or "(size_t)1"
        if b.role.data == "temp":
            self.temps.append((n, ct, count, self.size_count(op.sizes)))
        else:
            self.scratch.append((n, ct, count, self.size_count(op.sizes)))
            self.line(f"{ct} *{self.restrict} {n} = {n}_base + (size_t)opgen_thread() * ({count});")
        if zero:
            self.line(f"opgen_zero({n}, sizeof({ct}) * {count});")

    def branch(self, op: s.IfOp) -> None:
        self.line(f"if ({self.name(op.cond)}) {{")
        for i, region in enumerate((op.then, op.otherwise)):
            if i:
                self.line("} else {")
            self.depth += 1
            self.walk(iter(region.block.ops))
            self.depth -= 1
        self.line("}")

    def loop(self, op: s.ForOp) -> None:
        iv = self.fresh("i")
        self.names[op.iv] = iv
        lo, hi = self.name(op.lo), self.name(op.hi)
        body = list(op.body.block.ops)
        if cpu_mapping(op) == CpuMapping.LANES:  # (decided by map-cpu)
            self.lane_loop(op, iv, lo, hi, s.scalar_accums(op))
            return
        if cpu_mapping(op) == CpuMapping.STREAM:
            known_zero = self.kz.get(zero_fill_loop(op))  # (its stores: zeros the output may hold already)
            if known_zero:
                self.line(f"if (!{self.mention(known_zero)}) {{")
                self.depth += 1
            self.stream_loop(op, iv, lo, hi)
            if known_zero:
                self.depth -= 1
                self.line("}")
            return
        if cpu_mapping(op) == CpuMapping.SIMD:
            self.simd_hook()
        self.loop_header_hook(op, iv, lo, hi)
        self.depth += 1
        self.walk(iter(body))
        self.depth -= 1
        self.line("}")
        self.loop_footer_hook(op)

    def simd_hook(self) -> None:
        """Emitted before a loop whose iterations vector lanes may run side by side (map-cpu's
        ``simd`` loops and the strips of its ``stream`` loops)."""

    def loop_header_hook(self, op: s.ForOp, iv: str, lo: str, hi: str) -> None:
        self.line(f"for (int64_t {iv} = {lo}; {iv} < {hi}; {iv}++) {{")

    def staged_store(self, op: s.StoreOp) -> bool:
        """Whether a store of a stream loop is printed through a staging strip: map-cpu's
        ``staged`` stores of a narrow dtype and its ``nontemporal`` ones, where the runtime has a
        strip store for the buffer's dtype."""
        name = self.dtype(s.buf_type(op.buf).dtype).name
        if name not in self.STRIP_STORE:
            return False
        return cpu_mapping(op) == CpuMapping.NONTEMPORAL or (cpu_mapping(op) == CpuMapping.STAGED and name == "bf16")

    def staged_load(self, op: s.LoadOp | s.LoadFnOp) -> bool:
        """Whether a load of a stream loop is printed through a staging strip: map-cpu's
        ``staged`` loads of a dtype with a strip load (``STRIP_LOAD``), and its staged
        ``sched.load_fn`` ops looked up in a table of f32 values (``TABULATED``), from a row of
        unit stride in this instance."""
        b = s.buf_type(op.buf)
        name = self.dtype(b.dtype).name
        if isinstance(op, s.LoadFnOp):
            known = name in self.TABULATED and self.ctype(ir.tensor_type(op.result).dtype) == "float"
        else:
            known = name in self.STRIP_LOAD
        return cpu_mapping(op) == CpuMapping.STAGED and known \
            and self.unit_axis(self.arg_of[op.buf], b.rank - 1, b.rank)

    def loop_footer_hook(self, op: s.ForOp) -> None:
        """Emitted after a loop's closing brace."""

    def stream_loop(self, op: s.ForOp, iv: str, lo: str, hi: str) -> None:
        """map-cpu's ``stream`` loop: strips of one line (:func:`~opgen.lower.cpu_map.strip`),
        ``copies`` of them a step (:func:`~opgen.lower.cpu_map.copies`: the body printed once
        per strip, statement by statement in turn), each strip after its prefetches (the loop's
        ``sched.prefetch`` ops, at the strip's first iteration), then the tail. A ``pairs`` loop
        (:func:`~opgen.lower.cpu_map.paired`, a pair read as a word in this flavour) runs each
        strip as its pairs' firsts and seconds, two copies of the body."""
        body = list(op.body.block.ops)
        hints = [o for o in body if isinstance(o, s.PrefetchOp)]
        rest = [o for o in body if not isinstance(o, s.PrefetchOp)]
        staged = [o for o in rest if isinstance(o, s.StoreOp) and self.staged_store(o)]
        lines = hints or [o for o in rest if isinstance(o, s.StoreOp) and cpu_mapping(o) == CpuMapping.NONTEMPORAL]
        sizes = [self.dtype(s.buf_type(b.buf).dtype).itemsize for b in lines]
        n, k = strip(sizes), copies(op, sizes)
        # (a stream loop's order never changes a value: in pairs only where a pair is read as a
        # word in this flavour; the strided FLCE kernels' copies lost 2-3% to the shuffles)
        pairs = n >= 32 and paired(op, self.binding) \
            and any(isinstance(o, s.LoadOp) and self.pair_word(o) for o in rest)
        base = self.fresh("r")
        starts = [base if c == 0 else f"({base} + {c * n})" for c in range(k)]  # (each strip's first iteration)
        self.line("{")
        self.depth += 1
        self.line(f"int64_t {base} = {lo};")
        self.peel_to_line(op, iv, base, hi, [st for st in staged if st.buf in self.nt], rest)
        self.line(f"for (; {base} + {n * k} <= {hi}; {base} += {n * k}) {{")
        self.depth += 1
        for start in starts:
            self.strip_hints(op, hints, start, iv)
        for st in staged:
            if s.defined_outside(op, st.value):  # (a fill: map-cpu hoisted the value: converted once)
                self.staged[st] = None
                continue
            self.staged[st] = self.fresh("stg")
            self.line(f"_Alignas(64) {self.ctype(ir.tensor_type(st.value).dtype)} {self.staged[st]}[{n * k}];")
        for ld in (o for o in rest if isinstance(o, s.LoadOp | s.LoadFnOp) and self.staged_load(o)):
            name = self.fresh("ld")
            self.line(f"_Alignas(64) float {name}[{n * k}];")
            for c, start in enumerate(starts):
                self.names[op.iv] = start
                dst = f"{name} + {c * n}" if c else name
                src = f"&{self.elem_ref(ld.buf, list(ld.idx))}"
                if isinstance(ld, s.LoadFnOp):
                    self.line(f"{self.TABLE_STRIP_LOAD}({dst}, {self.table(ld)}, {src}, {n});")
                else:
                    self.line(f"{self.STRIP_LOAD[self.dtype(s.buf_type(ld.buf).dtype).name]}({dst}, {src}, {n});")
            self.names[op.iv] = iv
            self.staged_loads[ld] = name
        self.simd_hook()
        self.line(f"for (int l = 0; l < {n // 2 if pairs else n}; l++) {{")
        self.depth += 1
        strips: list[StripCopy] = []
        for c, start in enumerate(starts):
            if pairs:
                strips += [StripCopy(f"{start} + 2 * l", _plus("l", c * n), _plus("2 * l", c * n), "first"),
                           StripCopy(f"{start} + 2 * l + 1", _plus("l", c * n + n // 2), _plus("2 * l", c * n + 1),
                                     "second")]
            else:
                strips.append(StripCopy(f"{start} + l", _plus("l", c * n), _plus("l", c * n)))
        self.interleave(op, rest, iv, strips)
        self.staged_loads.clear()
        self.depth -= 1
        self.line("}")
        for st in staged:
            b = s.buf_type(st.buf)
            step = self.stride_expr(self.arg_of[st.buf], b.rank - 1, b.rank)
            nt = self.mention(self.nt[st.buf]) if st.buf in self.nt else "0"
            stg = self.staged.pop(st)
            name = self.dtype(b.dtype).name
            fn = (self.STRIP_STORE if stg else self.FILL_STRIP)[name]
            if stg and pairs and name in self.STRIP_STORE_PAIRS:
                fn = self.STRIP_STORE_PAIRS[name]
            for c, start in enumerate(starts):
                self.names[op.iv] = start
                src = (f"{stg} + {c * n}" if c else stg) if stg else self.name(st.value)
                self.line(f"{fn}(&{self.elem_ref(st.buf, list(st.idx))}, {step}, {src}, {n}, {nt});")
        self.names[op.iv] = iv
        self.depth -= 1
        self.line("}")
        self.simd_hook()
        self.line(f"for (int64_t {iv} = {base}; {iv} < {hi}; {iv}++) {{")
        self.depth += 1
        self.walk(iter(rest))
        self.depth -= 2
        self.line("    }")
        self.line("}")

    def interleave(self, op: s.ForOp, ops: list[Operation], iv: str, strips: list[StripCopy]) -> None:
        """``ops`` (the body of loop ``op``) once for each of ``strips`` (a stream loop's strips
        in a step, a ``pairs`` loop's firsts and seconds), the copies' statements in turn
        (:meth:`steps`): each copy has its own counter (``iv`` for the first), its own names for
        the values the body defines, and its places in staging arrays and lanes."""
        own: list[dict[SSAValue, str]] = [{} for _ in strips]
        ivs = [iv] + [self.fresh("i") for _ in strips[1:]]
        for i, c in zip(ivs, strips, strict=True):
            self.line(f"const int64_t {i} = {c.at}; (void){i};")
        saved = dict(self.lanes)
        for print_step, defines in (step for o in ops for step in self.steps(o)):
            for c, (i, copy) in enumerate(zip(ivs, strips, strict=True)):
                self.names.update(own[c])
                self.names[op.iv] = i
                self.strip_lane, self.strip_elem, self.pair_half = copy.lane, copy.elem, copy.half
                self.lanes.update(copy.lanes)
                print_step()
                own[c].update((v, self.names[v]) for v in defines if v in self.names)
        self.lanes = saved
        self.strip_lane = self.strip_elem = "l"
        self.pair_half = None
        self.names[op.iv] = iv

    def peel_to_line(self, op: s.ForOp, iv: str, base: str, hi: str, streamed: list[s.StoreOp],
                     rest: list[Operation]) -> None:
        """When the first of a stream loop's streaming stores (``streamed``) streams in this call
        and walks a unit-stride row, the iterations before its row reaches a 64-byte line (their
        count computed once), as a loop of their own (the strips after them then store whole
        aligned lines: a numpy array's data is 16-byte aligned). Each element is computed as in a
        strip, so the values are the same."""
        st = next((x for x in streamed if self.unit_axis(self.arg_of[x.buf], s.buf_type(x.buf).rank - 1,
                                                              s.buf_type(x.buf).rank)), None)
        if st is None:
            return
        self.names[op.iv] = base
        at = f"(uintptr_t)&{self.elem_ref(st.buf, list(st.idx))}"
        self.names[op.iv] = iv
        end, ct = self.fresh("e"), self.storage_ctype(s.buf_type(st.buf))
        self.line(f"int64_t {end} = {base} + ({self.mention(self.nt[st.buf])} ? "
                  f"(int64_t)(((64 - ({at} & 63)) & 63) / sizeof({ct})) : 0);")
        self.line(f"if ({end} > {hi}) {end} = {hi} > {base} ? {hi} : {base};")
        self.simd_hook()
        self.line(f"for (int64_t {iv} = {base}; {iv} < {end}; {iv}++) {{")
        self.depth += 1
        self.walk(iter(rest))
        self.depth -= 1
        self.line("}")
        self.line(f"{base} = {end};")

    def strip_hints(self, op: s.ForOp, hints: list[s.PrefetchOp], base: str, iv: str) -> None:
        """A strip's prefetches (``op``'s ``sched.prefetch`` ops), at its first iteration ``base``;
        ``op``'s counter is ``iv`` again after them."""
        self.names[op.iv] = base
        self.walk(iter(hints))
        self.names[op.iv] = iv

    def lane_loop(self, op: s.ForOp, iv: str, lo: str, hi: str, accs: list[s.AccumOp]) -> None:
        """A reduction split into fixed lanes (:func:`~opgen.lower.cpu_map.lanes` of the
        elements it reads), combined pairwise in a fixed order; in a ``pairs`` loop
        (:func:`~opgen.lower.cpu_map.paired`) the whole strips' firsts in the first half of the
        lanes and their seconds in the second."""
        elem_bytes = loaded_bytes(op, self.binding)
        n_lanes = lanes(elem_bytes, [a.kind.data for a in accs])
        per_line = lanes(elem_bytes)  # (a strip of extrema spans several of these: each hinted)
        pairs = paired(op, self.binding)  # (a bf16 load: 32 lanes)
        self.line("{")
        self.depth += 1
        lane_names = {}
        for a in accs:
            ln = self.fresh("lane")
            lane_names[a.buf] = ln
            ct = self.storage_ctype(s.buf_type(a.buf))
            self.line(f"{ct} {ln}[{n_lanes}];")
            init = f"l ? 0 : {self.name(a.buf)}" if a.kind.data == "sum" else self.name(a.buf)
            self.line(f"for (int l = 0; l < {n_lanes}; l++) {ln}[l] = {init};")
        base = self.fresh("r")
        self.line(f"int64_t {base} = {lo};")
        hints = [o for o in op.body.block.ops if isinstance(o, s.PrefetchOp)]  # (once a strip, at its start)
        rest = [o for o in op.body.block.ops if not isinstance(o, s.PrefetchOp)]
        for main in (True, False):
            if main:
                self.line(f"for (; {base} + {n_lanes} <= {hi}; {base} += {n_lanes}) {{")
                self.depth += 1
                for c in range(0, n_lanes, per_line):
                    self.strip_hints(op, hints, f"{base} + {c}" if c else base, iv)
                self.simd_hook()
                self.depth -= 1
                self.line(f"    for (int l = 0; l < {n_lanes // 2 if pairs else n_lanes}; l++) {{")
                if pairs:  # (lane j of each half: the strip's first, then second, elements of pair j)
                    self.depth += 2
                    half = n_lanes // 2
                    self.interleave(op, rest, iv, [
                        StripCopy(f"{base} + 2 * l", "l", "2 * l", "first",
                                  {b: f"{ln}[l]" for b, ln in lane_names.items()}),
                        StripCopy(f"{base} + 2 * l + 1", f"l + {half}", "2 * l + 1", "second",
                                  {b: f"{ln}[l + {half}]" for b, ln in lane_names.items()})])
                    self.depth -= 2
                    self.line("    }")
                    self.line("}")
                    continue
            else:
                self.line(f"for (int l = 0; {base} + l < {hi}; l++) {{")
                self.line("    {")
            self.depth += 2
            self.line(f"const int64_t {iv} = {base} + l;")
            saved = dict(self.lanes)
            for buf, ln in lane_names.items():
                self.lanes[buf] = f"{ln}[l]"
            self.walk(iter(rest))
            self.lanes = saved
            self.depth -= 2
            self.line("    }")
            self.line("}")
        for a in accs:
            ln = lane_names[a.buf]
            kind = a.kind.data
            width = n_lanes // 2
            while width >= 1:
                self.line(f"for (int l = 0; l < {width}; l++) "
                          + (f"{ln}[l] += {ln}[l + {width}];" if kind == "sum" else
                             f"if ({ln}[l + {width}] {'>' if kind == 'max' else '<'} {ln}[l] || "
                             f"{ln}[l + {width}] != {ln}[l + {width}]) {ln}[l] = {ln}[l + {width}];"))
                width //= 2
            self.line(f"{self.name(a.buf)} = {ln}[0];")
        self.depth -= 1
        self.line("}")

    def matmul(self, op: s.BufferMatmulOp) -> None:
        """sched.matmul: the runtime's GEMM for the operands' storage (``GEMM``), where their
        strides fit it — under a run-time test where they may not (a batched parameter's rows
        evenly spaced, C's columns adjacent in the general flavour) — else the plain loop
        (:meth:`matmul_loop`). Both sum each element's k terms in the same order: the same bits."""
        a, b, c = op.a, op.b, op.c
        ta, tb = (t.data for t in op.trans.data)
        m, n, k = self.name(op.m), self.name(op.n), self.name(op.k)
        acc_flag = op.accumulate.data
        sa, sb, sc = self.gemm_operand(a, ta), self.gemm_operand(b, tb), self.gemm_operand(c, 0)
        fn = self.GEMM.get((sa.held, sb.held, sc.held)) if sa and sb and sc else None
        if not (fn and sa and sb and sc) or self.arg_of.get(c) in self.k.aliased:
            self.matmul_loop(op)
            return
        # the products of f32 operands: sched.matmul's, else f32 (the f32 GEMM)
        narrow = (self.dtype(op.products.data).name if op.products is not None else "f32") if sa.held == "f32" \
            else None
        fn = self.NARROW_GEMM.get(narrow, fn) if narrow else fn
        # rows of C in parallel (map-cpu): the runtime spreads row blocks over the threads,
        # each element's k in the same order whatever the split (the bits do not depend on it)
        par = cpu_mapping(op) == CpuMapping.OMP_FOR
        ldc = sc.rs
        cp = sc.ptr if op.c_row is None else f"{sc.ptr} + {self.name(op.c_row)} * {ldc}"
        bp = ""
        if op.b_packed is not None and narrow in self.PACK and sb.held == "f32" and not sb.ok:  # (sched.pack's)
            if par:
                raise NotImplementedError("C printer: a packed right-hand operand in a parallel matmul")
            fn, bp = self.PACK[narrow][1], f"{self.PACK[narrow][2]}{self.name(op.b_packed)}, "
        conds = [g.ok for g in (sa, sb, sc) if g.ok] + ([f"{sc.cs} == 1"] if sc.cs != "1" else [])
        if conds:
            self.line(f"if ({' && '.join(conds)}) {{")
            self.depth += 1
        self.line(f"{fn}{'_par' if par else ''}({m}, {n}, {k}, {sa.ptr}, {sa.rs}, {sa.cs}, {sb.ptr}, "
                  f"{sb.rs}, {sb.cs}, {bp}{cp}, {ldc}, {acc_flag});")
        if conds:
            self.depth -= 1
            self.line("} else {")
            self.depth += 1
            self.matmul_loop(op)
            self.depth -= 1
            self.line("}")

    def matmul_loop(self, op: s.BufferMatmulOp) -> None:
        """sched.matmul as the plain triple loop, in sched.matmul's k order."""
        a, b, c = op.a, op.b, op.c
        ta, tb = (t.data for t in op.trans.data)
        m, n, k = self.name(op.m), self.name(op.n), self.name(op.k)
        acc_flag = op.accumulate.data
        bufs = [s.buf_type(x) for x in (a, b, c)]
        i, j, kk = self.fresh("i"), self.fresh("j"), self.fresh("k")
        acc = self.fresh("acc")
        ct = self.ctype(bufs[2].dtype)
        self.matmul_pragma_hook(op)
        self.line(f"for (int64_t {i} = 0; {i} < {m}; {i}++) {{")
        self.line(f"    for (int64_t {j} = 0; {j} < {n}; {j}++) {{")
        ci = i if op.c_row is None else f"({self.name(op.c_row)} + {i})"  # (C's row)
        init = self.load_expr_named(c, (ci, j)) if acc_flag else "0"
        k0, part = self.fresh("k"), self.fresh("part")
        self.line(f"        {ct} {acc} = {init};")
        # sched.matmul's k order: blocks of GEMM_KC fused multiply-adds from 0, added in order
        self.line(f"        for (int64_t {k0} = 0; {k0} < {k}; {k0} += {s.GEMM_KC}) {{")
        self.line(f"            {ct} {part} = 0;")
        self.line(f"            for (int64_t {kk} = {k0}; {kk} < {k} && {kk} < {k0} + {s.GEMM_KC}; {kk}++)")
        ea = self._elem(a, (kk, i) if ta else (i, kk))
        eb = self._elem(b, (j, kk) if tb else (kk, j))
        fma = {"float": "fmaf", "double": "fma"}.get(ct)
        step = f"{fma}(({ct}){ea}, ({ct}){eb}, {part})" if fma else f"{part} + ({ct}){ea} * ({ct}){eb}"
        self.line(f"                {part} = {step};")
        first = "" if acc_flag else f"{k0} == 0 ? {part} : "
        self.line(f"            {acc} = {first}{acc} + {part};")
        self.line("        }")
        self.line(f"        {self.name(c)}[{self._raw_offset(c, (ci, j))}] = "
                  f"{self.store_value(bufs[2], acc, bufs[2].dtype)};")
        self.line("    }")
        self.line("}")

    def pack(self, op: s.PackOp) -> None:
        """sched.pack: the runtime's packing for this instance's products (PACK), or nothing
        where the runtime packs none (then the matmul reads B itself: :meth:`matmul`)."""
        fns = self.PACK.get(self.dtype(op.products.data).name)
        src = self.gemm_operand(op.src, op.trans.data)
        if fns is None or src is None or src.held != "f32" or src.ok:  # (the matmul then reads B: matmul())
            self.line(f"(void){self.name(op.dst)};")
            return
        self.line(f"{fns[0]}({self.name(op.k)}, {self.name(op.n)}, {src.ptr}, {src.rs}, {src.cs}, "
                  f"{fns[2]}{self.name(op.dst)});")

    def transpose_tile(self, op: s.TransposeTileOp) -> None:
        """sched.transpose_tile: the runtime's ``opgen_<dtype>_transpose_tile`` (widening into a
        tile of the compute type) or, into a tile that holds its dtype as stored,
        ``opgen_bits<n>_transpose_tile`` (the elements' bits as they are), from the tile's first
        element, with the caller's strides along its last two axes."""
        b, pn = s.buf_type(op.src), self.arg_of[op.src]
        d = self.dtype(b.dtype)
        fn = f"bits{d.bits}" if s.held_as_stored(s.buf_type(op.dst), d) else d.name
        strides = [self.stride_expr(pn, a, b.rank) for a in (b.rank - 2, b.rank - 1)]
        self.line(f"opgen_{fn}_transpose_tile({self.name(op.dst)}, {self.extents(op.dst)[1]}, "
                  f"{self.name(op.src)} + {self.offset(op.src, list(op.idx))}, {strides[0]}, {strides[1]}, "
                  f"{self.name(op.rows)}, {self.name(op.cols)});")

    def prefetch_share(self, op: s.PrefetchShareOp) -> None:
        """sched.prefetch_share: the runtime's ``opgen_prefetch_share`` over the block's rows (the
        caller's stride of the second-to-last axis, in bytes) where its last axis is unit-stride in
        this instance, in a call whose input is at least the last-level cache (:meth:`share_flags`);
        elsewhere nothing (a hint)."""
        b, pn = s.buf_type(op.buf), self.arg_of[op.buf]
        if not self.unit_axis(pn, b.rank - 1, b.rank):
            self.line(" ".join(f"(void){self.name(v)};" for v in (*op.idx, op.rows, op.cols, op.part, op.parts)))
            return
        size = f"(int64_t)sizeof({self.storage_ctype(b)})"
        self.line(f"if ({self.mention(self.big[op.buf])}) "
                  f"opgen_prefetch_share({self.name(op.buf)} + {self.offset(op.buf, list(op.idx))}, "
                  f"{self.stride_expr(pn, b.rank - 2, b.rank)} * {size}, {self.name(op.rows)}, "
                  f"{self.name(op.cols)} * {size}, {self.name(op.part)}, {self.name(op.parts)});")

    def gemm_operand(self, x: SSAValue, trans: int) -> GemmOperand | None:
        """2-D buffer ``x`` as the runtime GEMMs read it (``trans``: as its transpose): storage
        ``f32``, or ``bf16`` or ``f16`` for a caller's tensor of that dtype; a batched
        parameter's rows through the stride its row table has when evenly spaced (``ok``: the
        run-time test, :meth:`batch_rows`). None for another storage type."""
        t = s.buf_type(x)
        held = "f32" if self.storage_ctype(t) == "float" else self.dtype(t.dtype).name
        if held not in ("f32", "bf16", "f16") or t.rank != 2:
            return None
        ptr, ok = self.name(x), None
        if t.role.data in s.SCRATCH_ROLES:
            rs, cs = self.extents(x)[1], "1"
        else:
            pn = self.arg_of[x]
            if self.buf_info[pn].batch:
                ok, base, rs = map(self.mention, self.row_table_names(pn))
                ptr = f"{ptr} + {base}"
            else:
                rs = self.mention(self.stride_name(pn, 0))
            cs = self.stride_expr(pn, 1, 2)
        return GemmOperand(ptr, cs, rs, held, ok) if trans else GemmOperand(ptr, rs, cs, held, ok)

    @staticmethod
    def row_table_names(param: str) -> tuple[str, str, str]:
        """The locals :meth:`batch_rows` declares for batched parameter ``param``: whether its
        rows are evenly spaced, the first row's offset, the stride."""
        cn = cnames.local(param)
        return f"af_{cn}", f"rb_{cn}", f"rs_{cn}"

    def batch_rows(self) -> list[str]:
        """For each batched parameter a matmul or pack reads as a matrix, its row table tested
        once a call: ``af_<x>`` whether its rows are evenly spaced (then ``rb_<x>``, the first
        row's offset, and ``rs_<x>``, the stride, let the GEMM read it: :meth:`gemm_operand`)."""
        out = []
        done: set[str] = set()
        for op in self.k.walk():
            bufs = (op.a, op.b, op.c) if isinstance(op, s.BufferMatmulOp) else \
                (op.src,) if isinstance(op, s.PackOp) else ()
            for x in bufs:
                t = s.buf_type(x)
                pn = self.arg_of.get(x)
                if pn is None or pn in done or t.rank != 2 or not self.buf_info[pn].batch:
                    continue
                done.add(pn)
                ok, base, stride = self.row_table_names(pn)
                out.append(f"int64_t {base} = 0, {stride} = 0; const int {ok} = opgen_rows_even("
                           f"{self.rows_name(pn)}, {self.dim(t.shape[0])}, &{base}, &{stride}); "
                           f"(void){ok}; (void){base}; (void){stride};")
        return out

    def load_expr_named(self, buf: SSAValue, idx: tuple[str, ...]) -> str:
        return self._elem(buf, idx)

    def _raw_offset(self, buf: SSAValue, idx: tuple[str, ...]) -> str:
        """``offset`` for printer-made index names (not SSA values)."""
        return self._with_names(idx, lambda vals: self.offset(buf, vals))

    def _elem(self, buf: SSAValue, idx: tuple[str, ...]) -> str:
        """``load_expr`` for printer-made index names."""
        return self._with_names(idx, lambda vals: self.load_expr(buf, vals))

    def _with_names(self, idx: tuple[str, ...], fn: Callable[[list[SSAValue]], str]) -> str:
        tmp = [_Named(n) for n in idx]
        for v in tmp:
            self.names[v] = v.n  # type: ignore[index]
        try:
            return fn(tmp)  # type: ignore[arg-type]
        finally:
            for v in tmp:
                del self.names[v]  # type: ignore[arg-type]

    def matmul_pragma_hook(self, op: s.BufferMatmulOp) -> None:
        """Emitted before a matmul's loop over rows (OpenMP on the CPU, where map-cpu says)."""

    # ------------------------------------------------------------------ function
    def caller_bytes(self, buf: SSAValue) -> str:
        """The bytes of caller's buffer ``buf``'s elements, as C: a saturating count
        (``opgen_sz_mul``) of its dims and its storage type."""
        t = s.buf_type(buf)
        count = "(size_t)1"
        for d in t.shape:
            count = f"opgen_sz_mul({count}, opgen_sz_dim({self.dim(d)}))"
        return f"opgen_sz_mul({count}, sizeof({self.storage_ctype(t)}))"

    def share_flags(self) -> None:
        """For each input a ``sched.prefetch_share`` fetches, whether it is at least the
        last-level cache in this call (``opgen_nt_bytes``, a saturating count of its elements'
        bytes): a smaller one is in cache already, where the hints only cost (transposes of
        1024x1024: a third more time)."""
        names = {a: n.data for n, a in zip(self.k.arg_names.data, self.k.body.block.args, strict=True)}
        for op in self.k.walk():
            if not isinstance(op, s.PrefetchShareOp) or op.buf in self.big:
                continue
            flag = f"big_{cnames.local(names[op.buf])}"
            self.big[op.buf] = flag
            self.line(f"const int {flag} = {self.caller_bytes(op.buf)} >= opgen_nt_bytes(); (void){flag};")

    def stream_flags(self) -> None:
        """For each output with ``nontemporal`` stores, whether they stream in this call
        (``opgen_nt`` of its data and bytes, a saturating count; not when the call passes it as
        the input of its ``may_alias`` pair: in place, the lines just read are written back), and,
        where some of them are ``zero_fill``, whether the caller has said the output holds zeros
        (``opgen_known_zero``)."""
        names = {a: n.data for n, a in zip(self.k.arg_names.data, self.k.body.block.args, strict=True)}
        args = {n: a for a, n in names.items()}
        partners = {o: i.data for o, i in self.k.may_alias.data.items()} if self.k.may_alias else {}
        for op in self.k.walk():
            if not (isinstance(op, s.StoreOp) and cpu_mapping(op) == CpuMapping.NONTEMPORAL
                    and self.staged_store(op)) or op.buf in self.nt:
                continue
            t = s.buf_type(op.buf)
            flag = f"nt_{cnames.local(names[op.buf])}"
            self.nt[op.buf] = flag
            size = self.caller_bytes(op.buf)
            partner = args.get(partners.get(names[op.buf], ""))
            same = f" && (const void *){self.name(op.buf)} != (const void *){self.name(partner)}" if partner else ""
            self.line(f"const int {flag} = opgen_nt({self.name(op.buf)}, {size}){same}; (void){flag};")
            info = self.buf_info[self.arg_of[op.buf]]
            if not info.batch and any(ZERO_FILL in o.attributes for o in self.k.walk()
                                      if isinstance(o, s.StoreOp) and o.buf is op.buf):
                # (only a contiguous output: then its elements are exactly those bytes)
                st = [f"bufs[{info.param_index}].st[{i}]" for i in range(t.rank)]
                dense = [f"{st[-1]} == 1"] + [f"{st[i]} == {st[i + 1]} * {self.dim(t.shape[i + 1])}"
                                             for i in range(t.rank - 1)]
                kz = f"kz_{cnames.local(names[op.buf])}"
                self.kz[op.buf] = kz
                self.line(f"const int {kz} = {' && '.join(dense)} && opgen_known_zero({self.name(op.buf)}, {size}); "
                          f"(void){kz};")

    def unit_last_check(self) -> str:
        """C condition under which the ``unit_last`` flavour is valid."""
        conds = []
        for n, a in zip((x.data for x in self.k.arg_names.data), self.k.body.block.args, strict=True):
            t = a.type
            if isinstance(t, s.BufType) and t.rank >= 1 and not s.unread(a):
                info = self.buf_info[n]
                if info.last_contig or (t.rank == 1 and info.batch):
                    continue
                last = t.shape[-1]
                size = last + "ll" if last.isdigit() else f"dims[{self.dim_ids[last]}]"
                conds.append(f"(bufs[{info.param_index}].st[{t.rank - 1}] == 1 || {size} <= 1)")
        return " && ".join(conds) or "1"

    def print(self) -> str:
        names = [a.data for a in self.k.arg_names.data]
        prologue: list[str] = []
        for n, a in zip(names, self.k.body.block.args, strict=True):
            cn = cnames.local(n)
            self.names[a] = cn
            t = a.type
            if s.unread(a):
                continue
            if isinstance(t, s.BufType):
                ct = self.storage_ctype(t)
                const = "const " if t.role.data == "in" else ""
                info = self.buf_info[n]
                prologue.append(f"{const}{ct} *{self.restrict} {cn} = ({const}{ct} *)bufs[{info.param_index}].data;")
                used = [cn]
                for i in range(t.rank):
                    if not self.unit_axis(n, i, t.rank):
                        st = self.stride_name(n, i)
                        prologue.append(f"const int64_t {st} = bufs[{info.param_index}].st[{i}];")
                        used.append(st)
                if info.batch:
                    prologue.append(f"const int64_t *{self.rows_name(n)} = bufs[{info.param_index}].ro;")
                    used.append(self.rows_name(n))
                prologue.append(" ".join(f"(void){u};" for u in used))
            else:
                field = SCALAR_FIELD[ir.tensor_type(a).dtype]
                prologue.append(f"const {self.ctype(ir.tensor_type(a).dtype)} {cn} = "
                                f"sc[{self.param_index[n]}].{field}; (void){cn};")
        for d, i in self.dim_ids.items():
            prologue.append(f"const int64_t d_{d} = dims[{i}]; (void)d_{d};")
        pre: list[str] = []
        if self.pre_name:  # the leading scalar checks, callable before any buffer exists
            lead = []
            for op in self.k.body.block.ops:
                if isinstance(op, s.ForOp | s.AllocOp | s.SegmentsOp | s.BufferMatmulOp | s.StoreOp | s.AccumOp):
                    break
                lead.append(op)
            needed: set[Operation] = set()
            for check in (op for op in lead if isinstance(op, s.RequireOp)):
                deps: set[Operation] = set()
                todo: list[Operation] = [check]
                while todo:  # the check and what it reads
                    op = todo.pop()
                    if op not in deps:
                        deps.add(op)
                        todo.extend(o.owner for o in op.operands if isinstance(o.owner, Operation))
                if not any(isinstance(op, s.LoadOp | s.LoadBitOp | s.LoadFnOp) for op in deps):
                    needed |= deps  # no tensor data is read: the sizing call may run it
            self.walk(op for op in lead if op in needed)
            pre = self.lines
            self.lines = []
        self.stream_flags()
        self.share_flags()
        self.walk(iter(self.k.body.block.ops))
        body = ["    " + x for x in self.batch_rows() + self.first] + self.lines

        def region(n: str, ct: str, count: str, sat: str) -> dict[str, str]:
            return {"name": n, "ctype": ct, "count": count, "sat": sat}

        return render.render("cpu/instance.c.j2", pre_name=self.pre_name, prologue=prologue, pre=pre,
                             with_ws=self.with_ws, ws_name=self.ws_name, dims=list(self.dim_ids.items()),
                             temps=[region(*r) for r in self.temps], scratch=[region(*r) for r in self.scratch],
                             fn_attr=self.fn_attr, fn=self.fn_name, restrict=self.restrict, body=body)


class _Named:
    """A stand-in SSA value for printer-internal loop variables."""

    def __init__(self, n: str):
        self.n = n
