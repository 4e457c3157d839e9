"""The ``ttk`` dialect: TT-Metal programs as the passes decided them (after opgen/ttmetal/lower.py).

A ``ttk.program`` is one dtype instance of an op on TT-Metal: ``ttk.launch``es enqueued one after
the other on the mesh command queue (a ``tile.sync_all`` of the tile level is a launch boundary:
TT-Metal has no barrier across the cores of one program). A launch holds the host's scalar code
(dims, tile counts, CB sizes: ``opgen`` scalar ops), its circular buffers (``ttk.cb``) and its three
kernels (``ttk.kernel``, role reader/compute/writer) whose operands are their runtime arguments.

Inside a kernel every op is one statement of the printed C++ (as tt-mlir's TTKernel after its
conversion to EmitC): ``ttk.arg`` reads a runtime argument, ``ttk.accessor`` declares a
``TensorAccessor``, ``ttk.call`` calls a tt-metal kernel API function (arguments are operands or
literal attributes, as ``emitc.call_opaque``), ``tile.for`` loops, and ``opgen`` scalar ops do the
index arithmetic (printed as ``uint32_t``). The printer (opgen/emit/ttmetal.py) prints, nothing
else: CB indices, DST slots, init calls and loop bounds are all in the IR.
"""

from __future__ import annotations

from collections.abc import Sequence

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr
from xdsl.ir import Attribute, Block, Dialect, Region, SSAValue
from xdsl.irdl import (
    IRDLOperation,
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

from opgen.ir.dialect import TensorType, converted_params, verify_converted

INDEX = TensorType.make([], "i64")
F32 = TensorType.make([], "f32")
ROLES = ("reader", "compute", "writer")
#: tt::DataFormat spellings a CB may have
FORMATS = ("Float16_b", "Float32", "UInt32", "Int32")


@irdl_op_definition
class ProgramOp(IRDLOperation):
    """One dtype instance of an op: its ``ttk.launch``es in order. ``arg_names``/``arg_kinds``/
    ``arg_types`` name the host function's parameters (``tensor`` buffers of the tile level's
    ``!tile.gm`` types; ``scalar`` floats); the ``layouts`` attribute (set by the lowering) gives
    each tensor's DRAM layout: ``tile`` (32x32 tiles of four 16x16 faces, one per page) or ``row``
    (a row vector per row, in pages of 32 elements). ``boundary_casts`` (the tile kernel's,
    ``{parameter: dtype}``) names the tensors the host converts before the launches: read only
    cast to that dtype (opgen/lower/boundary.py), the caller's tensor may have any ``IndexType``."""

    name = "ttk.program"
    sym_name = prop_def(StringAttr)
    arg_names = prop_def(ArrayAttr[StringAttr])
    arg_kinds = prop_def(ArrayAttr[StringAttr])
    arg_types = prop_def(ArrayAttr)
    dtype_vars = prop_def(DictionaryAttr)
    boundary_casts = opt_prop_def(DictionaryAttr)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(self, sym_name: str, arg_names: Sequence[str], arg_kinds: Sequence[str],
                 arg_types: Sequence[Attribute], dtype_vars: DictionaryAttr):
        super().__init__(properties={"sym_name": StringAttr(sym_name),
                                     "arg_names": ArrayAttr([StringAttr(a) for a in arg_names]),
                                     "arg_kinds": ArrayAttr([StringAttr(a) for a in arg_kinds]),
                                     "arg_types": ArrayAttr(list(arg_types)),
                                     "dtype_vars": dtype_vars}, regions=[Region(Block())])

    @property
    def converted(self) -> dict[str, str]:
        """``boundary_casts`` as ``{parameter: dtype}``."""
        return converted_params(self)

    def verify_(self) -> None:
        verify_converted(self, self.arg_types.data)


@irdl_op_definition
class LaunchOp(IRDLOperation):
    """One program enqueued on the mesh command queue: host scalar code, ``ttk.cb``s and three
    ``ttk.kernel``s on cores ``0 .. cores-1`` of the grid (``cores`` is an operand: the host's
    ``min(grid, units)``)."""

    name = "ttk.launch"
    index = prop_def(IntAttr)
    body = region_def("single_block")
    traits = traits_def(NoTerminator())

    def __init__(self, index: int):
        super().__init__(properties={"index": IntAttr(index)}, regions=[Region(Block())])


@irdl_op_definition
class GridCoresOp(IRDLOperation):
    """Host: the number of worker cores of the grid the program is given."""

    name = "ttk.grid_cores"
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self):
        super().__init__(result_types=[INDEX])


@irdl_op_definition
class CoresOp(IRDLOperation):
    """Host: the number of cores the launch uses (``min(grid cores, units)``, at least 1)."""

    name = "ttk.cores"
    units = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, units: SSAValue):
        super().__init__(operands=[units], result_types=[INDEX])


@irdl_op_definition
class CoreIndexOp(IRDLOperation):
    """Host: the index of the core whose runtime arguments are being set (0 .. cores-1)."""

    name = "ttk.core_index"
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self) -> None:
        super().__init__(result_types=[INDEX])


@irdl_op_definition
class BufferAddrOp(IRDLOperation):
    """Host: the DRAM address of a tensor argument's (or the workspace's) buffer."""

    name = "ttk.buffer_addr"
    arg = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, arg: str):
        super().__init__(properties={"arg": StringAttr(arg)}, result_types=[INDEX])


@irdl_op_definition
class ScalarArgOp(IRDLOperation):
    """Host: a scalar argument of the op (``eps``, ``padding_idx``), of its own type."""

    name = "ttk.scalar_arg"
    arg = prop_def(StringAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, arg: str, type_: Attribute = F32):
        super().__init__(properties={"arg": StringAttr(arg)}, result_types=[type_])


@irdl_op_definition
class BitsOp(IRDLOperation):
    """Host: the bits of an f32 value as uint32 (the SFPU's scalar parameter format)."""

    name = "ttk.bits"
    value = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, value: SSAValue):
        super().__init__(operands=[value], result_types=[INDEX])


@irdl_op_definition
class WorkspaceOp(IRDLOperation):
    """Host: a DRAM workspace buffer ``sym`` of the program (``bytes``, pages of ``page`` bytes),
    allocated before its first launch; ``ttk.buffer_addr sym`` is its address."""

    name = "ttk.workspace"
    sym = prop_def(StringAttr)
    page = prop_def(IntAttr)
    bytes = operand_def(TensorType)

    def __init__(self, sym: str, nbytes: SSAValue, page: int):
        super().__init__(operands=[nbytes], properties={"sym": StringAttr(sym), "page": IntAttr(page)})


@irdl_op_definition
class ScatterPlanOp(IRDLOperation):
    """Host: the owner-computes plan of a scatter-add over index tensor ``indices`` (``n``
    indices into ``rows`` table rows). It reads the indices (one blocking read), returns an index
    error before any launch if one is out of range, and uploads DRAM buffer ``sym``: pages of 32
    uint32 — first, per 32-row table tile T, at page T/16 words 2(T%16) and 2(T%16)+1, its first
    page and its batch count; at the first page, the tile's 32 row factors (f32); then the
    batches: for each table row of the tile, the source row of its k-th contribution in
    ascending order (or 0xFFFFFFFF). ``row_fn`` (block argument: the table row) says which rows
    keep their contributions and their factors (``ttk.row_yield``)."""

    name = "ttk.scatter_plan"
    indices = prop_def(StringAttr)
    sym = prop_def(StringAttr)
    n = operand_def(TensorType)
    rows = operand_def(TensorType)
    row_fn = region_def("single_block")

    def __init__(self, indices: str, sym: str, n: SSAValue, rows: SSAValue, row_fn: Region):
        super().__init__(operands=[n, rows], properties={"indices": StringAttr(indices), "sym": StringAttr(sym)},
                         regions=[row_fn])


@irdl_op_definition
class SegPrefixOp(IRDLOperation):
    """Host, in a scatter plan's row function: how many indices are below table row ``row``
    (so ``prefix(v + 1) - prefix(v)`` is row v's count)."""

    name = "ttk.seg_prefix"
    row = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, row: SSAValue):
        super().__init__(operands=[row], result_types=[INDEX])


@irdl_op_definition
class RowYieldOp(IRDLOperation):
    """Terminator of a scatter plan's row function: whether table row v keeps its contributions
    (``keep``, bool) and the factor its sum is multiplied by (``factor``, f32)."""

    name = "ttk.row_yield"
    keep = operand_def(TensorType)
    factor = operand_def(TensorType)
    traits = traits_def(IsTerminator())

    def __init__(self, keep: SSAValue, factor: SSAValue):
        super().__init__(operands=[keep, factor])


@irdl_op_definition
class RowCheckOp(IRDLOperation):
    """Host: a check on tensor data (the tile level's kernel of checks), before any launch. It
    reads tensors ``reads`` (one blocking read each) and runs ``row_fn`` (block argument: the row)
    for every row in ``[0, rows)``; the first row it yields false for makes the host function
    return an error with ``message``, before anything is enqueued."""

    name = "ttk.row_check"
    reads = prop_def(ArrayAttr[StringAttr])
    message = prop_def(StringAttr)
    rows = operand_def(TensorType)
    row_fn = region_def("single_block")

    def __init__(self, reads: Sequence[str], message: str, rows: SSAValue, row_fn: Region):
        super().__init__(operands=[rows], regions=[row_fn], properties={
            "reads": ArrayAttr([StringAttr(r) for r in reads]), "message": StringAttr(message)})


@irdl_op_definition
class RowOkOp(IRDLOperation):
    """Terminator of a row check's row function: whether the row passes (bool)."""

    name = "ttk.row_ok"
    ok = operand_def(TensorType)
    traits = traits_def(IsTerminator())

    def __init__(self, ok: SSAValue):
        super().__init__(operands=[ok])


@irdl_op_definition
class HostLoadOp(IRDLOperation):
    """Host, in a row check: element ``pos`` of tensor argument ``arg`` as read by the check
    (``bit``: flag ``pos`` of a mask — bit ``pos % 8`` of byte ``pos / 8`` of a u8 tensor, LSB
    first, or element ``pos`` of a bool one)."""

    name = "ttk.host_load"
    arg = prop_def(StringAttr)
    bit = prop_def(IntAttr)
    pos = operand_def(TensorType)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, arg: str, pos: SSAValue, result_type: Attribute, bit: bool = False):
        super().__init__(operands=[pos], result_types=[result_type],
                         properties={"arg": StringAttr(arg), "bit": IntAttr(int(bit))})


@irdl_op_definition
class ReturnIfOp(IRDLOperation):
    """Host: the program has nothing to do when ``cond`` holds (every output is empty): the host
    function returns success before any launch."""

    name = "ttk.return_if"
    cond = operand_def(TensorType)

    def __init__(self, cond: SSAValue):
        super().__init__(operands=[cond])


@irdl_op_definition
class CheckOp(IRDLOperation):
    """Host: the launch cannot run unless ``cond`` holds (``message`` says why; the host function
    returns an error before enqueueing anything). ``arg``: a check of the op's arguments (an
    error whatever the schedule), else of the schedule's fit (the next schedule is tried)."""

    name = "ttk.check"
    cond = operand_def(TensorType)
    message = prop_def(StringAttr)
    arg = prop_def(IntAttr)

    def __init__(self, cond: SSAValue, message: str, arg: bool = False):
        super().__init__(operands=[cond], properties={"message": StringAttr(message), "arg": IntAttr(int(arg))})


@irdl_op_definition
class CbOp(IRDLOperation):
    """A circular buffer on every core of the launch: ``index`` (c_0..c_31), data ``format``,
    ``page`` bytes and ``pages`` (an operand: it may depend on dims). ``what`` says what it holds."""

    name = "ttk.cb"
    index = prop_def(IntAttr)
    format = prop_def(StringAttr)
    page = prop_def(IntAttr)
    what = prop_def(StringAttr)
    pages = operand_def(TensorType)

    def __init__(self, index: int, fmt: str, page: int, pages: SSAValue, what: str):
        super().__init__(operands=[pages], properties={"index": IntAttr(index), "format": StringAttr(fmt),
                                                       "page": IntAttr(page), "what": StringAttr(what)})

    def verify_(self) -> None:
        if not 0 <= self.index.data < 32:
            raise VerifyException(f"ttk.cb: index {self.index.data} is not one of c_0..c_31")
        if self.format.data not in FORMATS:
            raise VerifyException(f"ttk.cb: unknown data format {self.format.data}")
        if self.page.data <= 0 or self.page.data % 16:
            raise VerifyException(f"ttk.cb: page size {self.page.data} is not a positive multiple of 16 B")


@irdl_op_definition
class KernelOp(IRDLOperation):
    """One of the launch's three kernels (``role``), printed to ``file``. Operands: its runtime
    arguments (host values; ``arg_names`` names them); ``accessors`` the tensor arguments whose
    ``TensorAccessorArgs`` are its compile-time arguments, in order; ``fp32_dest_acc`` the compute
    config. The body is the kernel's ``kernel_main``. ``shared``: the ``<program>/<file>`` of an
    identical kernel of another dtype instance, whose file this one uses (share-kernels)."""

    name = "ttk.kernel"
    role = prop_def(StringAttr)
    file = prop_def(StringAttr)
    shared = opt_prop_def(StringAttr)
    arg_names = prop_def(ArrayAttr[StringAttr])
    accessors = prop_def(ArrayAttr[StringAttr])
    fp32_dest_acc = prop_def(IntAttr)
    rt_args = var_operand_def(TensorType)
    body = region_def("single_block")
    traits = traits_def(IsolatedFromAbove(), NoTerminator())

    def __init__(self, role: str, file: str, arg_names: Sequence[str], rt_args: Sequence[SSAValue],
                 accessors: Sequence[str], fp32_dest_acc: bool, body: Region):
        super().__init__(operands=[rt_args], regions=[body], properties={
            "role": StringAttr(role), "file": StringAttr(file),
            "arg_names": ArrayAttr([StringAttr(a) for a in arg_names]),
            "accessors": ArrayAttr([StringAttr(a) for a in accessors]), "fp32_dest_acc": IntAttr(int(fp32_dest_acc))})

    def verify_(self) -> None:
        if self.role.data not in ROLES:
            raise VerifyException(f"ttk.kernel: role {self.role.data} is not one of {ROLES}")
        if len(self.arg_names.data) != len(self.rt_args):
            raise VerifyException("ttk.kernel: arg_names and runtime arguments differ in number")


@irdl_op_definition
class ArgOp(IRDLOperation):
    """Kernel: runtime argument ``index`` (``get_arg_val<uint32_t>``)."""

    name = "ttk.arg"
    index = prop_def(IntAttr)
    result = result_def(TensorType)
    traits = traits_def(Pure())

    def __init__(self, index: int):
        super().__init__(properties={"index": IntAttr(index)}, result_types=[INDEX])


@irdl_op_definition
class AccessorOp(IRDLOperation):
    """Kernel: ``TensorAccessor`` ``sym`` over the interleaved DRAM buffer at ``addr`` whose
    compile-time arguments follow those of accessor ``after`` (or start at 0), with pages of
    ``page`` bytes."""

    name = "ttk.accessor"
    sym = prop_def(StringAttr)
    after = prop_def(StringAttr)
    page = prop_def(IntAttr)
    addr = operand_def(TensorType)

    def __init__(self, sym: str, after: str, page: int, addr: SSAValue):
        super().__init__(operands=[addr], properties={"sym": StringAttr(sym), "after": StringAttr(after),
                                                      "page": IntAttr(page)})


@irdl_op_definition
class CallOp(IRDLOperation):
    """Kernel: a call of a tt-metal kernel API function. ``args`` lists the call's arguments: an
    ``IntAttr`` k is operand k, a ``StringAttr`` is printed as is (CB indices, enum constants,
    literals); ``template`` the template arguments. At most one result, of C type ``rtype``
    (``uint32_t`` if absent; ``uint64_t`` for NOC addresses)."""

    name = "ttk.call"
    callee = prop_def(StringAttr)
    args = prop_def(ArrayAttr)
    template = opt_prop_def(ArrayAttr[StringAttr])
    rtype = opt_prop_def(StringAttr)
    operands_ = var_operand_def(TensorType)
    res = var_result_def(TensorType)

    def __init__(self, callee: str, args: Sequence[SSAValue | str | int], template: Sequence[str] = (),
                 result: bool = False, rtype: str = ""):
        ops: list[SSAValue] = []
        attrs: list[Attribute] = []
        for a in args:
            if isinstance(a, SSAValue):
                attrs.append(IntAttr(len(ops)))
                ops.append(a)
            else:
                attrs.append(StringAttr(str(a)))
        props: dict[str, Attribute] = {"callee": StringAttr(callee), "args": ArrayAttr(attrs)}
        if template:
            props["template"] = ArrayAttr([StringAttr(t) for t in template])
        if rtype:
            props["rtype"] = StringAttr(rtype)
        super().__init__(operands=[ops], properties=props, result_types=[[INDEX] if result else []])

    def verify_(self) -> None:
        for a in self.args.data:
            if isinstance(a, IntAttr) and not 0 <= a.data < len(self.operands_):
                raise VerifyException(f"ttk.call {self.callee.data}: argument refers to operand {a.data}")


Ttk = Dialect("ttk", [ProgramOp, LaunchOp, GridCoresOp, CoresOp,
                      CoreIndexOp, BufferAddrOp, ScalarArgOp, BitsOp, WorkspaceOp,
                      ScatterPlanOp, SegPrefixOp, RowYieldOp, RowCheckOp, RowOkOp, HostLoadOp, ReturnIfOp, CheckOp,
                      CbOp, KernelOp, ArgOp,
                      AccessorOp, CallOp], [])
