"""The ``tile`` dialect: the tile level (L2) the NPU targets (Ascend C, TT-Metal) share.

A ``tile.kernel`` is the work of one core (an Ascend vector core, a Tensix core): it walks tiles
of global tensors (``!tile.gm``), copies each into on-chip memory (``tile.copy_in``), computes on
whole tiles and copies results out (``tile.copy_out``). Compute stays at the tensor level: tiles
are ``!opgen.tensor`` values whose shapes name tile sizes (``R`` rows, ``C`` columns), and the
elementwise math is the L0 ops themselves on those tile-shaped tensors; broadcasts stay
``opgen.broadcast``; reductions over a tile are ``tile.reduce`` (with the number of valid
elements, since edge tiles are partial). Tile sizes are ``tile.param`` values computed by the
host tiling function, which the kernel's ``tile.tiling`` region describes (it reads the core
count and the on-chip capacity with ``tile.platform`` — never constants in the kernel).

Every decision is a pass (see opgen/tile/): which values a tile walk produces (lower-to-tiles),
the tile sizes under the capacity budget and alignment (size-tiles), the split across cores
(split-cores), and the on-chip buffers — memory space, queue depth, reuse — (plan-buffers). The
printers print what the passes decided.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import auto

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import (
    Attribute,
    Block,
    Dialect,
    ParametrizedAttribute,
    Region,
    SpacedOpaqueSyntaxAttribute,
    SSAValue,
    TypeAttribute,
)
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    region_def,
    result_def,
    traits_def,
    var_operand_def,
    var_result_def,
)
from xdsl.traits import IsolatedFromAbove, IsTerminator, NoTerminator, Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from opgen.ir.dialect import (
    ReduceKind,
    ReduceKindAttr,
    ShapedType,
    TensorType,
    converted_params,
    tensor_type,
    verify_converted,
)
from opgen.lower.sched import kernel_parts

INDEX = TensorType.make([], "i64")
#: A dim of a tile or view shape that stands for a tiling parameter is spelled ``tile.<param>``
#: (:func:`param_dim`): the dot, which no DSL dim (a Python identifier) can have, keeps the op's
#: own dims apart from the tile level's whatever their names (``R``, ``C``, ``rows``, ``groups``).
PARAM_DIM_PREFIX = "tile."


def param_dim(param: str) -> str:
    """The shape dim standing for tiling parameter ``param`` (``groups`` -> ``tile.groups``)."""
    return PARAM_DIM_PREFIX + param


def dim_param(dim: str) -> str | None:
    """The tiling parameter a shape dim stands for, or None for an op's dim or a number."""
    return dim.removeprefix(PARAM_DIM_PREFIX) if dim.startswith(PARAM_DIM_PREFIX) else None


#: the rows of a row tile
ROWS = param_dim("rows")
#: the columns of a column tile of a streamed walk
CHUNK = param_dim("chunk")
#: the columns of a chunk of the column-sum phase
COL_CHUNK = param_dim("col_chunk")
#: the bytes of the workspace argument
WS_BYTES = param_dim("ws_bytes")
#: what ``tile.platform`` may ask: vector cores, unified-buffer bytes per vector core, and the bytes
#: of system workspace the matrix unit's library needs before a kernel's own
PLATFORM_QUERIES = ("cores", "ub_bytes", "sys_ws_bytes")


class MemSpace(StrEnum):
    """Where a buffer lives: global memory, or one of the cores' on-chip memories."""

    GM = auto()  # global (device) memory
    UB = auto()  # Ascend unified buffer (vector core)
    L1 = auto()  # Ascend L1 / Tensix L1 SRAM
    L0A = auto()  # Ascend cube operand buffers
    L0B = auto()
    L0C = auto()  # Ascend cube accumulator
    CB = auto()  # Tenstorrent circular buffer (in L1)
    DST = auto()  # Tenstorrent destination registers
    SHARED = auto()  # GPU shared memory


@irdl_attr_definition
class MemSpaceAttr(EnumAttribute[MemSpace], SpacedOpaqueSyntaxAttribute):
    """``#tile<space ub>``."""

    name = "tile.space"


class BufferKind(StrEnum):
    """How an on-chip buffer is synchronised: a copy-in or copy-out queue (the copy engine and the
    compute unit hand tiles over through it), or a plain compute buffer."""

    IN = auto()
    OUT = auto()
    CALC = auto()


@irdl_attr_definition
class BufferKindAttr(EnumAttribute[BufferKind], SpacedOpaqueSyntaxAttribute):
    name = "tile.kind"


@irdl_attr_definition
class GmType(ShapedType, ParametrizedAttribute, TypeAttribute):
    """``!tile.gm<[N, D], T>``: a dense row-major view of global memory (a kernel argument or a
    region of the workspace). The host hands kernels dense tensors, so the row pitch is the last
    dim."""

    name = "tile.gm"

    dims: ArrayAttr[StringAttr]
    elem: StringAttr


def gm_type(v: SSAValue) -> GmType:
    if not isinstance(v.type, GmType):
        raise VerifyException(f"expected a !tile.gm view, got {v.type}")
    return v.type


def _index(op: IRDLOperation, *vals: SSAValue) -> None:
    for v in vals:
        if tensor_type(v) != INDEX:
            raise VerifyException(f"{op.name}: offsets and counts must be i64 scalars")


# ------------------------------------------------------------------------------ structure


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One core's program for one dtype binding (``dtype_vars`` maps each dtype variable to the
    dtype of this instance). Block arguments: the op's parameters (``!tile.gm`` for tensors,
    rank-0 ``!opgen.tensor`` for attributes and sizes), then the workspace (``!tile.gm<[tile.ws_bytes], u8>``)."""

    name = "tile.kernel"
    sym_name = prop_def(StringAttr)
    arg_names = prop_def(ArrayAttr[StringAttr])
    dtype_vars = prop_def(DictionaryAttr)
    #: parameters the host converts to another dtype first (``opgen.func``'s, kept)
    boundary_casts = opt_prop_def(DictionaryAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(self, sym_name: str, arg_names: Sequence[str], arg_types: Sequence[Attribute],
                 dtype_vars: DictionaryAttr):
        super().__init__(**kernel_parts(sym_name, arg_names, arg_types, dtype_vars))

    @property
    def converted(self) -> dict[str, str]:
        """``boundary_casts`` as ``{parameter: dtype}``."""
        return converted_params(self)

    def verify_(self) -> None:
        if len(self.arg_names.data) != len(self.body.block.args):
            raise VerifyException("tile.kernel: arg_names and block arguments differ in number")
        verify_converted(self)


@irdl_op_definition
class TilingOp(IRDLOperation):
    """The host's tiling function of the enclosing kernel: scalar code over dims and
    ``tile.platform`` values ending in ``tile.set_param``s. It runs on the host before the launch;
    the kernel reads the results with ``tile.param``."""

    name = "tile.tiling"
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def __init__(self) -> None:
        super().__init__(regions=[Region(Block())])


@irdl_op_definition
class PlatformOp(IRDLOperation):
    """A property of the device the host queries (``cores``: vector cores; ``ub_bytes``: on-chip
    buffer capacity per core): an input of the tiling, never a kernel constant."""

    name = "tile.platform"
    what = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, what: str):
        super().__init__(properties={"what": StringAttr(what)}, result_types=[INDEX])

    def verify_(self) -> None:
        if self.what.data not in PLATFORM_QUERIES:
            raise VerifyException(f"tile.platform: one of {', '.join(PLATFORM_QUERIES)}")


@irdl_op_definition
class SetParamOp(IRDLOperation):
    """Inside ``tile.tiling``: the value of a tiling parameter (a field of the tiling struct)."""

    name = "tile.set_param"
    param = prop_def(StringAttr)
    value = operand_def(TensorType)

    def __init__(self, param: str, value: SSAValue):
        super().__init__(operands=[value], properties={"param": StringAttr(param)})


@irdl_op_definition
class ParamOp(IRDLOperation):
    """A tiling parameter in the kernel (read from the tiling struct the host filled)."""

    name = "tile.param"
    param = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, param: str):
        super().__init__(properties={"param": StringAttr(param)}, result_types=[INDEX])


@irdl_op_definition
class BlockIdxOp(IRDLOperation):
    """This core's index among the cores of the launch."""

    name = "tile.block_idx"
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self) -> None:
        super().__init__(result_types=[INDEX])


@irdl_op_definition
class BlockNumOp(IRDLOperation):
    """The number of cores of the launch."""

    name = "tile.block_num"
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self) -> None:
        super().__init__(result_types=[INDEX])


@irdl_op_definition
class ForOp(IRDLOperation):
    """``for iv = lo; iv < hi; iv += step`` with loop-carried values: the body's block arguments
    are ``iv`` and the carried values; ``tile.yield`` gives the next carried values; the results
    are the last ones (the initial ones when the loop runs no iteration)."""

    name = "tile.for"
    lo = operand_def(TensorType)
    hi = operand_def(TensorType)
    step = operand_def(TensorType)
    inits = var_operand_def(TensorType)
    res = var_result_def(TensorType)
    body = region_def("single_block")

    def __init__(self, lo: SSAValue, hi: SSAValue, step: SSAValue, inits: Sequence[SSAValue] = (), hint: str = "t"):
        block = Block(arg_types=[INDEX, *(v.type for v in inits)])
        block.args[0].name_hint = hint
        super().__init__(operands=[lo, hi, step, inits], result_types=[[v.type for v in inits]],
                         regions=[Region(block)])

    @property
    def iv(self) -> SSAValue:
        return self.body.block.args[0]

    def verify_(self) -> None:
        _index(self, self.lo, self.hi, self.step)
        if len(self.res) != len(self.inits) or len(self.body.block.args) != 1 + len(self.inits):
            raise VerifyException("tile.for: carried values, results and block arguments differ in number")
        last = self.body.block.last_op
        if not isinstance(last, YieldOp) or len(last.values) != len(self.inits):
            raise VerifyException("tile.for: the body must end in a tile.yield of every carried value")


@irdl_op_definition
class YieldOp(IRDLOperation):
    """The carried values of the next iteration of the enclosing ``tile.for``."""

    name = "tile.yield"
    values = var_operand_def(TensorType)
    traits = traits_def(IsTerminator())

    def __init__(self, values: Sequence[SSAValue] = ()):
        super().__init__(operands=[values])


@irdl_op_definition
class SyncAllOp(IRDLOperation):
    """A barrier across every core of the launch (what one core wrote to global memory before it,
    every core reads after it)."""

    name = "tile.sync_all"

    def __init__(self) -> None:
        super().__init__()


@irdl_op_definition
class FenceOp(IRDLOperation):
    """The core's copies to global memory are complete before its later reads of it (by its copy
    engine or its matrix unit): a barrier across the core's own pipes."""

    name = "tile.fence"

    def __init__(self) -> None:
        super().__init__()


@irdl_op_definition
class WorkspaceOp(IRDLOperation):
    """A region of the call's workspace, ``offset`` bytes from its start (a tiling parameter
    decided by plan-workspace), seen as a dense global tensor."""

    name = "tile.workspace"
    offset = prop_def(StringAttr)
    result = result_def(GmType)
    traits = traits_def(Pure())

    def __init__(self, offset: str, t: GmType):
        super().__init__(properties={"offset": StringAttr(offset)}, result_types=[t])


# ------------------------------------------------------------------------------ data movement


@irdl_op_definition
class CopyInOp(IRDLOperation):
    """Rows ``[row0, row0 + nrows)`` and columns ``[col0, col0 + ncols)`` of ``src`` into an
    on-chip tile (``!opgen.tensor<[tile.rows, C], T>``, ``C`` the view's columns or
    ``tile.chunk``: the tile's full size; rows and columns past the
    valid ones hold unspecified values that no later op reads). A rank-1 view is one row."""

    name = "tile.copy_in"
    src = operand_def(GmType)
    row0 = operand_def(TensorType)
    nrows = operand_def(TensorType)
    col0 = operand_def(TensorType)
    ncols = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, src: SSAValue, row0: SSAValue, nrows: SSAValue, col0: SSAValue, ncols: SSAValue,
                 shape: Sequence[str]):
        super().__init__(operands=[src, row0, nrows, col0, ncols],
                         result_types=[TensorType.make(shape, gm_type(src).dtype)])

    def verify_(self) -> None:
        _index(self, self.row0, self.nrows, self.col0, self.ncols)
        if tensor_type(self.result).dtype != gm_type(self.src).dtype:
            raise VerifyException("tile.copy_in: the tile has the view's dtype")
        if tensor_type(self.result).rank != 2:
            raise VerifyException("tile.copy_in: tiles are 2-D")


@irdl_op_definition
class CopyOutOp(IRDLOperation):
    """The valid part of a tile into rows/columns of ``dst`` (the inverse of ``tile.copy_in``)."""

    name = "tile.copy_out"
    value = operand_def(TensorType)
    dst = operand_def(GmType)
    row0 = operand_def(TensorType)
    nrows = operand_def(TensorType)
    col0 = operand_def(TensorType)
    ncols = operand_def(TensorType)

    def __init__(self, value: SSAValue, dst: SSAValue, row0: SSAValue, nrows: SSAValue, col0: SSAValue,
                 ncols: SSAValue):
        super().__init__(operands=[value, dst, row0, nrows, col0, ncols])

    def verify_(self) -> None:
        _index(self, self.row0, self.nrows, self.col0, self.ncols)
        if tensor_type(self.value).dtype != gm_type(self.dst).dtype:
            raise VerifyException("tile.copy_out: cast to the view's dtype first")


# ------------------------------------------------------------------------------ compute


@irdl_op_definition
class ReduceOp(IRDLOperation):
    """A reduction of a 2-D tile along ``axis`` over its first ``count`` valid elements (rows for
    axis 0, columns for axis 1) in a fixed order; the reduced dim becomes 1."""

    name = "tile.reduce"
    x = operand_def(TensorType)
    count = operand_def(TensorType)
    kind = prop_def(ReduceKindAttr)
    axis = prop_def(IntAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, kind: str, x: SSAValue, axis: int, count: SSAValue):
        t = tensor_type(x)
        shape = list(t.shape)
        shape[axis] = "1"
        super().__init__(operands=[x, count],
                         properties={"kind": ReduceKindAttr(ReduceKind(kind)), "axis": IntAttr(axis)},
                         result_types=[TensorType.make(shape, t.dtype)])

    def verify_(self) -> None:
        _index(self, self.count)
        if tensor_type(self.x).rank != 2 or self.axis.data not in (0, 1):
            raise VerifyException("tile.reduce: a 2-D tile along axis 0 or 1")


# ------------------------------------------------------------------------------ owner-computes scatter


@irdl_attr_definition
class SegmentsType(ParametrizedAttribute, TypeAttribute):
    """``!tile.segs``: the segments of one index tensor over a block of rows, held on chip."""

    name = "tile.segs"


@irdl_op_definition
class SegmentsOp(IRDLOperation):
    """The positions ``n`` of a (range-checked, int32) index tensor ``idx`` whose value lies in
    the block of rows ``[row0, row0 + nrows)``, sorted by (value, n): each row's *segment*. The
    core scans every index (its segment table and a window of the sorted positions live on chip),
    so the segments of a block never depend on other cores — an owner-computes scatter-add sums
    each row's segment in increasing ``n`` on whatever number of cores."""

    name = "tile.segments"
    idx = operand_def(GmType)
    row0 = operand_def(TensorType)
    nrows = operand_def(TensorType)
    result = result_def(SegmentsType)

    def __init__(self, idx: SSAValue, row0: SSAValue, nrows: SSAValue):
        super().__init__(operands=[idx, row0, nrows], result_types=[SegmentsType()])

    def verify_(self) -> None:
        _index(self, self.row0, self.nrows)
        gm = gm_type(self.idx)
        if gm.dtype != "i32" or gm.rank != 1:
            raise VerifyException("tile.segments: the indices are a rank-1 int32 view")


@irdl_op_definition
class SegStartOp(IRDLOperation):
    """Where the segment of the block's row ``r`` starts among the block's sorted positions
    (``r = nrows`` gives their number)."""

    name = "tile.seg_start"
    segs = operand_def(SegmentsType)
    row = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, segs: SSAValue, row: SSAValue):
        super().__init__(operands=[segs, row], result_types=[INDEX])

    def verify_(self) -> None:
        _index(self, self.row)


@irdl_op_definition
class SegAtOp(IRDLOperation):
    """The position ``n`` at place ``p`` of the block's sorted positions."""

    name = "tile.seg_at"
    segs = operand_def(SegmentsType)
    pos = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, segs: SSAValue, pos: SSAValue):
        super().__init__(operands=[segs, pos], result_types=[INDEX])

    def verify_(self) -> None:
        _index(self, self.pos)


@irdl_op_definition
class AddRowOp(IRDLOperation):
    """``acc`` with ``value`` (a one-row tile) added to its row ``row``: the accumulation step of
    an owner-computes scatter-add (the result lives in ``acc``'s buffer)."""

    name = "tile.add_row"
    acc = operand_def(TensorType)
    row = operand_def(TensorType)
    value = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, acc: SSAValue, row: SSAValue, value: SSAValue):
        super().__init__(operands=[acc, row, value], result_types=[acc.type])

    def verify_(self) -> None:
        _index(self, self.row)
        a, v = tensor_type(self.acc), tensor_type(self.value)
        if a.rank != 2 or v.shape != ("1", a.shape[1]) or a.dtype != v.dtype:
            raise VerifyException("tile.add_row: a [1, c] row of the accumulator's dtype")


@irdl_op_definition
class LoadOp(IRDLOperation):
    """One element of a global view, read by the core's scalar unit (``src[pos]``)."""

    name = "tile.load"
    src = operand_def(GmType)
    pos = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, src: SSAValue, pos: SSAValue):
        super().__init__(operands=[src, pos], result_types=[TensorType.make([], gm_type(src).dtype)])

    def verify_(self) -> None:
        _index(self, self.pos)


@irdl_op_definition
class LoadBitOp(IRDLOperation):
    """Flag ``pos`` of a mask view, read by the scalar unit: bit ``pos % 8`` of byte ``pos / 8``
    of a u8 view (LSB first), or element ``pos`` of a bool view (``opgen.unpack_bits``)."""

    name = "tile.load_bit"
    src = operand_def(GmType)
    pos = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, src: SSAValue, pos: SSAValue):
        super().__init__(operands=[src, pos], result_types=[TensorType.make([], "bool")])

    def verify_(self) -> None:
        _index(self, self.pos)
        if gm_type(self.src).dtype not in ("u8", "bool"):
            raise VerifyException("tile.load_bit: a u8 (bit-packed) or bool view")


@irdl_op_definition
class SetAtOp(IRDLOperation):
    """``acc`` with element ``(row, col)`` set to the scalar ``value`` when ``0 <= col < ncols``
    (else ``acc`` unchanged), by the scalar unit: one element per row of a one-hot tile (the
    result lives in ``acc``'s buffer)."""

    name = "tile.set_at"
    acc = operand_def(TensorType)
    row = operand_def(TensorType)
    col = operand_def(TensorType)
    ncols = operand_def(TensorType)
    value = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, acc: SSAValue, row: SSAValue, col: SSAValue, ncols: SSAValue, value: SSAValue):
        super().__init__(operands=[acc, row, col, ncols, value], result_types=[acc.type])

    def verify_(self) -> None:
        _index(self, self.row, self.col, self.ncols)
        if tensor_type(self.acc).rank != 2 or tensor_type(self.value).shape != () \
                or tensor_type(self.value).dtype != tensor_type(self.acc).dtype:
            raise VerifyException("tile.set_at: a scalar of the tile's dtype")


@irdl_op_definition
class FailUnlessOp(IRDLOperation):
    """A check on tensor data: when ``cond`` is false the core records failed check ``bit`` (the
    host reads the records before any kernel that writes an output runs)."""

    name = "tile.fail_unless"
    cond = operand_def(TensorType)
    bit = prop_def(IntAttr)

    def __init__(self, cond: SSAValue, bit: int):
        super().__init__(operands=[cond], properties={"bit": IntAttr(bit)})

    def verify_(self) -> None:
        if tensor_type(self.cond) != TensorType.make([], "bool"):
            raise VerifyException("tile.fail_unless: a bool scalar")
        if not 0 <= self.bit.data < 31:
            raise VerifyException("tile.fail_unless: at most 31 checks")


@irdl_op_definition
class FlagsOutOp(IRDLOperation):
    """The core's failed checks (a bit per ``tile.fail_unless``) into ``dst[pos]`` (int32)."""

    name = "tile.flags_out"
    dst = operand_def(GmType)
    pos = operand_def(TensorType)

    def __init__(self, dst: SSAValue, pos: SSAValue):
        super().__init__(operands=[dst, pos])

    def verify_(self) -> None:
        _index(self, self.pos)
        if gm_type(self.dst).dtype != "i32":
            raise VerifyException("tile.flags_out: an i32 view")


@irdl_op_definition
class TileMatmulOp(IRDLOperation):
    """``c[c_off + i * ldc + j] = sum_k opA(i, k) * opB(k, j)`` for ``i < m, j < n, k < k``: a
    product on the core's matrix unit (Ascend's cube through its Matmul API), global memory to
    global memory, the sum in f32 in a fixed order. ``opA(i, k)`` is ``a[a_off + i * lda + k]``,
    or ``a[a_off + k * lda + i]`` with ``trans_a``; ``opB(k, j)`` is ``b[b_off + k * ldb + j]``, or
    ``b[b_off + j * ldb + k]`` with ``trans_b``; each leading dim is its view's row length.
    ``bounds`` name the largest ``m, n, k`` (a dim, a tiling parameter or a number): the host sizes
    the unit's buffers for them. ``sym`` names the matrix-unit object and its tiling data."""

    name = "tile.matmul"
    a = operand_def(GmType)
    a_off = operand_def(TensorType)
    b = operand_def(GmType)
    b_off = operand_def(TensorType)
    c = operand_def(GmType)
    c_off = operand_def(TensorType)
    m = operand_def(TensorType)
    n = operand_def(TensorType)
    k = operand_def(TensorType)
    trans_a = prop_def(IntAttr)
    trans_b = prop_def(IntAttr)
    bounds = prop_def(ArrayAttr[StringAttr])
    sym = prop_def(StringAttr)

    def __init__(self, sym: str, a: SSAValue, a_off: SSAValue, trans_a: bool, b: SSAValue, b_off: SSAValue,
                 trans_b: bool, c: SSAValue, c_off: SSAValue, mnk: Sequence[SSAValue], bounds: Sequence[str]):
        super().__init__(operands=[a, a_off, b, b_off, c, c_off, *mnk],
                         properties={"trans_a": IntAttr(int(trans_a)), "trans_b": IntAttr(int(trans_b)),
                                     "bounds": ArrayAttr([StringAttr(x) for x in bounds]), "sym": StringAttr(sym)})

    def verify_(self) -> None:
        _index(self, self.a_off, self.b_off, self.c_off, self.m, self.n, self.k)
        a, b, c = gm_type(self.a), gm_type(self.b), gm_type(self.c)
        if a.dtype != b.dtype or a.dtype not in ("f16", "bf16", "f32"):
            raise VerifyException("tile.matmul: a and b of one float dtype (f16, bf16 or f32)")
        if c.dtype != "f32":
            raise VerifyException("tile.matmul: the product is f32")
        if len(self.bounds.data) != 3:
            raise VerifyException("tile.matmul: bounds of m, n and k")


# ------------------------------------------------------------------------------ buffers (plan-buffers)


@irdl_op_definition
class BufferOp(IRDLOperation):
    """An on-chip buffer the kernel sets up once: ``kind`` in (a copy-in queue), out (a copy-out
    queue) or calc (a compute buffer), ``depth`` tiles of ``bytes`` each (a host expression over
    tiling parameters). Values carry a ``buffer`` attribute naming the buffer they live in."""

    name = "tile.buffer"
    sym = prop_def(StringAttr)
    space = prop_def(MemSpaceAttr)
    kind = prop_def(BufferKindAttr)
    depth = prop_def(IntAttr)
    bytes = prop_def(StringAttr)

    def __init__(self, sym: str, space: MemSpace, kind: BufferKind, depth: int, nbytes: str):
        super().__init__(properties={"sym": StringAttr(sym), "space": MemSpaceAttr(space),
                                     "kind": BufferKindAttr(kind), "depth": IntAttr(depth),
                                     "bytes": StringAttr(nbytes)})

    def verify_(self) -> None:
        if self.depth.data not in (1, 2):
            raise VerifyException("tile.buffer: depth 1 (single) or 2 (double buffering)")


@irdl_op_definition
class MoveOp(IRDLOperation):
    """A copy of a tile into another on-chip buffer (e.g. into a copy-out queue)."""

    name = "tile.move"
    x = operand_def(TensorType)
    result = result_def(TensorType)

    def __init__(self, x: SSAValue):
        super().__init__(operands=[x], result_types=[x.type])


@irdl_op_definition
class ReleaseOp(IRDLOperation):
    """The last use of a tile held in a queue: its slot goes back to the queue."""

    name = "tile.release"
    value = operand_def(TensorType)

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value])


Tile = Dialect("tile", [KernelOp, TilingOp, PlatformOp, SetParamOp, ParamOp, BlockIdxOp, BlockNumOp, ForOp, YieldOp,
                        SyncAllOp, FenceOp, WorkspaceOp, CopyInOp, CopyOutOp, ReduceOp, SegmentsOp, SegStartOp, SegAtOp,
                        AddRowOp, LoadOp, LoadBitOp, SetAtOp, FailUnlessOp, FlagsOutOp, TileMatmulOp,
                        BufferOp, MoveOp, ReleaseOp],
                   [MemSpaceAttr, BufferKindAttr, GmType, SegmentsType])
