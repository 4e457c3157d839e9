"""Vendor C ABI facades (InfiniCore ``infiniop``, CANN ``aclnn``) over the plain C entry points.

Everything here is driven by the declarations an op lists in ``@op(abi=[...])``
(:mod:`opgen.abi`); no op is named. :func:`generate` returns the vendor-style public headers
(``include/infinicore.h``, ``include/infiniop.h``, ``include/infiniop/...``, ``include/acl/...``,
``include/aclnn/...``, ``include/aclnnop/...``) and the C sources of the facades
(``cpu/facade_*.c``), which the CPU build compiles into ``libopgen.so`` beside the plain ABI;
``generate(ops, "ascendc")`` renders the same templates for the Ascend library
(``ascendc/facade_*.cpp`` over ``opgen_ascendc_<op>``, the call's stream forwarded; there aclTensor
is CANN's and is read only through nnopbase's accessors). :data:`LIBRARIES` holds what differs.

A facade call converts the vendor's tensor descriptions (``infiniopTensorDescriptor_t``,
``aclTensor``) into ``opgen_tensor_t`` (dtype enums through :mod:`opgen.dtypes`), its scalars
into the plain parameter types, validates at descriptor / executor creation time through the
plain ``opgen_<op>_workspace_size`` entry point and runs through ``opgen_<op>``; plain statuses
are mapped with the declaration's ``status`` dict (abstract names) plus :data:`EXTRA_STATUS`.
"""

from __future__ import annotations

import hashlib
import math
import re
import textwrap
import zlib
from dataclasses import dataclass, field
from typing import Any

from opgen import dtypes
from opgen.abi import Aclnn, Arg, Infiniop
from opgen.dsl.opdef import OpDef
from opgen.dsl.spec import AttrSpec, DSLError, SizeSpec, TensorSpec
from opgen.emit import render

# ---------------------------------------------------------------------------------- vendor enums
#: ``infiniStatus_t`` (InfiniCore include/infinicore.h; 9 is unused).
INFINI_STATUS = {
    "INFINI_STATUS_SUCCESS": 0, "INFINI_STATUS_INTERNAL_ERROR": 1, "INFINI_STATUS_NOT_IMPLEMENTED": 2,
    "INFINI_STATUS_BAD_PARAM": 3, "INFINI_STATUS_NULL_POINTER": 4,
    "INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED": 5, "INFINI_STATUS_DEVICE_NOT_FOUND": 6,
    "INFINI_STATUS_DEVICE_NOT_INITIALIZED": 7, "INFINI_STATUS_DEVICE_ARCHITECTURE_NOT_SUPPORTED": 8,
    "INFINI_STATUS_BAD_TENSOR_DTYPE": 10, "INFINI_STATUS_BAD_TENSOR_SHAPE": 11,
    "INFINI_STATUS_BAD_TENSOR_STRIDES": 12, "INFINI_STATUS_INSUFFICIENT_WORKSPACE": 13,
}
#: Status names the operator documents (the seeds) use that InfiniCore's header lacks: aliases.
INFINI_STATUS_ALIASES = {"INFINI_STATUS_BAD_DEVICE": "INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED",
                         "INFINI_STATUS_EXECUTION_FAILED": "INFINI_STATUS_INTERNAL_ERROR"}
#: ``infiniDevice_t`` (then ``INFINI_DEVICE_TYPE_COUNT``).
INFINI_DEVICES = ["CPU", "NVIDIA", "CAMBRICON", "ASCEND", "METAX", "MOORE", "ILUVATAR", "KUNLUN",
                  "HYGON", "QY", "ALI"]
#: ``infiniDtype_t`` (prefix ``INFINI_DTYPE_``), values 0..19 in this order.
INFINI_DTYPES = ["INVALID", "BYTE", "BOOL", "I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64",
                 "F8", "F16", "F32", "F64", "C16", "C32", "C64", "C128", "BF16"]

#: ``aclDataType`` (acl/acl_base_rt.h).
ACL_DTYPES = {
    "ACL_DT_UNDEFINED": -1, "ACL_FLOAT": 0, "ACL_FLOAT16": 1, "ACL_INT8": 2, "ACL_INT32": 3,
    "ACL_UINT8": 4, "ACL_INT16": 6, "ACL_UINT16": 7, "ACL_UINT32": 8, "ACL_INT64": 9,
    "ACL_UINT64": 10, "ACL_DOUBLE": 11, "ACL_BOOL": 12, "ACL_STRING": 13, "ACL_COMPLEX64": 16,
    "ACL_COMPLEX128": 17, "ACL_BF16": 27, "ACL_INT4": 29, "ACL_UINT1": 30, "ACL_COMPLEX32": 33,
    "ACL_HIFLOAT8": 34, "ACL_FLOAT8_E5M2": 35, "ACL_FLOAT8_E4M3FN": 36, "ACL_FLOAT8_E8M0": 37,
    "ACL_FLOAT6_E3M2": 38, "ACL_FLOAT6_E2M3": 39, "ACL_FLOAT4_E2M1": 40, "ACL_FLOAT4_E1M2": 41,
}
#: ``aclFormat``; the ``plain`` ones describe an ordinary strided layout the facade accepts.
ACL_FORMATS = {
    "ACL_FORMAT_UNDEFINED": -1, "ACL_FORMAT_NCHW": 0, "ACL_FORMAT_NHWC": 1, "ACL_FORMAT_ND": 2,
    "ACL_FORMAT_NC1HWC0": 3, "ACL_FORMAT_FRACTAL_Z": 4, "ACL_FORMAT_NC1HWC0_C04": 12,
    "ACL_FORMAT_HWCN": 16, "ACL_FORMAT_NDHWC": 27, "ACL_FORMAT_FRACTAL_NZ": 29, "ACL_FORMAT_NCDHW": 30,
    "ACL_FORMAT_NDC1HWC0": 32, "ACL_FRACTAL_Z_3D": 33, "ACL_FORMAT_NC": 35, "ACL_FORMAT_NCL": 47,
    "ACL_FORMAT_FRACTAL_NZ_C0_16": 50, "ACL_FORMAT_FRACTAL_NZ_C0_32": 51,
    "ACL_FORMAT_FRACTAL_NZ_C0_2": 52, "ACL_FORMAT_FRACTAL_NZ_C0_4": 53,
    "ACL_FORMAT_FRACTAL_NZ_C0_8": 54,
}
ACL_PLAIN_FORMATS = ("ACL_FORMAT_UNDEFINED", "ACL_FORMAT_NCHW", "ACL_FORMAT_NHWC", "ACL_FORMAT_ND",
                     "ACL_FORMAT_HWCN", "ACL_FORMAT_NDHWC", "ACL_FORMAT_NCDHW", "ACL_FORMAT_NC",
                     "ACL_FORMAT_NCL")
#: ``aclError`` codes (acl_base.h: ``static const int`` there, an enum here so C can use them in
#: constant expressions).
ACL_ERRORS = {"ACL_ERROR_NONE": 0, "ACL_SUCCESS": 0, "ACL_ERROR_INVALID_PARAM": 100000,
              "ACL_ERROR_UNINITIALIZE": 100001, "ACL_ERROR_REPEAT_INITIALIZE": 100002,
              "ACL_ERROR_BAD_ALLOC": 200000, "ACL_ERROR_INTERNAL_ERROR": 500000}
#: ``aclnnStatus`` codes (aclnn/opdev/op_errno.h).
ACLNN_STATUS = {
    "ACLNN_SUCCESS": 0, "ACLNN_ERR_PARAM_NULLPTR": 161001, "ACLNN_ERR_PARAM_INVALID": 161002,
    "ACLNN_ERR_RUNTIME_ERROR": 361001, "ACLNN_ERR_INNER": 561000,
    "ACLNN_ERR_INNER_INFERSHAPE_ERROR": 561001, "ACLNN_ERR_INNER_TILING_ERROR": 561002,
    "ACLNN_ERR_INNER_FIND_KERNEL_ERROR": 561003, "ACLNN_ERR_INNER_CREATE_EXECUTOR": 561101,
    "ACLNN_ERR_INNER_NOT_TRANS_EXECUTOR": 561102, "ACLNN_ERR_INNER_NULLPTR": 561103,
    "ACLNN_ERR_INNER_WRONG_ATTR_INFO_SIZE": 561104, "ACLNN_ERR_INNER_KEY_CONFLICT": 561105,
    "ACLNN_ERR_INNER_KEY_CONFILICT": 561105, "ACLNN_ERR_INNER_INVALID_IMPL_MODE": 561106,
    "ACLNN_ERR_INNER_OPP_PATH_NOT_FOUND": 561107, "ACLNN_ERR_INNER_LOAD_JSON_FAILED": 561108,
    "ACLNN_ERR_INNER_JSON_VALUE_NOT_FOUND": 561109, "ACLNN_ERR_INNER_JSON_FORMAT_INVALID": 561110,
    "ACLNN_ERR_INNER_JSON_DTYPE_INVALID": 561111, "ACLNN_ERR_INNER_OPP_KERNEL_PKG_NOT_FOUND": 561112,
    "ACLNN_ERR_INNER_OP_FILE_INVALID": 561113, "ACLNN_ERR_INNER_ATTR_NUM_OUT_OF_BOUND": 561114,
    "ACLNN_ERR_INNER_ATTR_LEN_NOT_ENOUGH": 561115, "ACLNN_ERR_INNER_INPUT_NUM_IN_JSON_TOO_LARGE": 561116,
    "ACLNN_ERR_INNER_INPUT_JSON_IS_NULL": 561117, "ACLNN_ERR_INNER_STATIC_WORKSPACE_INVALID": 561118,
    "ACLNN_ERR_INNER_STATIC_BLOCK_DIM_INVALID": 561119,
}

#: Plain statuses that carry no abstract name: what each facade kind maps them to (a
#: declaration's ``status`` dict may override them under the keys ``workspace``, ``alloc``,
#: ``internal``).
EXTRA_STATUS = {
    "infiniop": {"workspace": "INFINI_STATUS_INSUFFICIENT_WORKSPACE", "alloc": "INFINI_STATUS_INTERNAL_ERROR",
                 "internal": "INFINI_STATUS_INTERNAL_ERROR"},
    "aclnn": {"workspace": "ACLNN_ERR_PARAM_INVALID", "alloc": "ACLNN_ERR_INNER",
              "internal": "ACLNN_ERR_INNER"},
}
_VENDOR_CODES = {"infiniop": INFINI_STATUS, "aclnn": ACLNN_STATUS}
_SUCCESS = {"infiniop": "INFINI_STATUS_SUCCESS", "aclnn": "ACLNN_SUCCESS"}

#: C types a declared scalar may have, and whether they are unsigned 64-bit (reinterpreted as
#: int64 for an i64 attribute or a size, so UINT64_MAX reads as -1).
_SCALAR_C_TYPES = {"float": False, "double": False, "char": False, "signed char": False,
                   "unsigned char": False, "bool": False, "int": False, "unsigned": False,
                   "int8_t": False, "uint8_t": False, "int16_t": False, "uint16_t": False,
                   "int32_t": False, "uint32_t": False, "int64_t": False, "long": False,
                   "long long": False, "uint64_t": True, "size_t": True, "unsigned long long": True}
_PLAIN_C = {"f32": "float", "i64": "int64_t", "bool": "bool"}


def snake(name: str) -> str:
    """``FooBarBackward`` -> ``foo_bar_backward``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _tag(text: str) -> str:
    """A per-op 32-bit tag stored in descriptors / executors (rejects one op's handle in another)."""
    return f"0x{zlib.crc32(text.encode()) | 1:08x}u"


# ---------------------------------------------------------------------------------- op model
@dataclass
class PlainParam:
    """One parameter of the plain C entry point, in signature order."""

    name: str
    kind: str  # "tensor", "attr", "size"
    c_type: str  # plain C type of a scalar ("" for tensors)
    optional: bool = False
    is_output: bool = False
    slot: int = -1  # tensors: index among the signature's tensors
    default: str | None = None  # scalars: C literal of the DSL default, if any


@dataclass
class Scalar:
    c_name: str
    c_type: str
    param: str
    expr: str  # the vendor value converted to the plain parameter's type


@dataclass
class TensorArg:
    c_name: str
    param: str
    slot: int
    is_output: bool
    optional: bool


@dataclass
class FacadeOp:
    """What the templates need about one (op, facade) pair."""

    op: str
    where: str
    summary: list[str]
    name: str
    snake: str
    tag: str
    n_tensors: int
    params: list[PlainParam]
    status_cases: list[tuple[str, str]]
    tensors: list[TensorArg] = field(default_factory=list)  # infiniop descriptors / aclnn tensors
    data: list[TensorArg] = field(default_factory=list)  # infiniop run-call data pointers
    scalars: list[Scalar] = field(default_factory=list)
    extensions: list[dict[str, Any]] = field(default_factory=list)
    workspace: bool = False
    header: str = ""
    guard: str = ""
    args: list[dict[str, Any]] = field(default_factory=list)  # aclnn: declared args, in order
    const_stream: bool = False
    const_outputs: bool = False
    param_docs: list[str] = field(default_factory=list)

    def fields(self, obj: str) -> dict[str, str]:
        """Each scalar parameter as the field ``<obj>->sc_<name>`` that stores it."""
        return {p.name: f"{obj}->sc_{p.name}" for p in self.params if p.kind != "tensor"}

    def plain_call(self, tensors: str, values: dict[str, str]) -> str:
        """The plain entry point's argument list: ``tensors`` formats a slot into an
        ``const opgen_tensor_t *`` expression, ``values`` gives each scalar's C expression."""
        out = []
        for p in self.params:
            out.append(tensors.format(slot=p.slot) if p.kind == "tensor" else values[p.name])
        return ", ".join(out)


def _c_literal(spec: AttrSpec) -> str | None:
    if not spec.has_default:
        return None
    v = spec.default
    if spec.dtype == dtypes.BOOL:
        return "true" if v else "false"
    if spec.dtype == dtypes.I64:
        return f"INT64_C({int(v)})"  # type: ignore[arg-type]
    f = float(v)  # type: ignore[arg-type]
    if math.isnan(f):
        return "NAN"
    if math.isinf(f):
        return "INFINITY" if f > 0 else "(-INFINITY)"
    return f"{f!r}f"


def _plain_params(o: OpDef) -> list[PlainParam]:
    out, slot = [], 0
    for p in o.signature.params:
        spec = p.spec
        if isinstance(spec, TensorSpec):
            out.append(PlainParam(p.name, "tensor", "", spec.optional, spec.is_output, slot))
            slot += 1
        elif isinstance(spec, AttrSpec):
            out.append(PlainParam(p.name, "attr", _PLAIN_C[spec.dtype.name], default=_c_literal(spec)))
        else:
            assert isinstance(spec, SizeSpec)
            out.append(PlainParam(p.name, "size", "int64_t"))
    return out


def _convert(expr: str, c_type: str, p: PlainParam) -> str:
    """C expression turning vendor scalar ``expr`` of type ``c_type`` into plain param ``p``."""
    if p.c_type == "bool":
        return f"(({expr}) != 0)"
    if p.c_type == "float":
        return f"(float)({expr})"
    if _SCALAR_C_TYPES[c_type]:
        return f"opgen_facade_u64_as_i64((uint64_t)({expr}))"
    return f"(int64_t)({expr})"


class _Checker:
    def __init__(self, o: OpDef, f: Infiniop | Aclnn):
        self.o, self.f = o, f
        self.params = {p.name: p for p in _plain_params(o)}

    def error(self, msg: str) -> DSLError:
        return DSLError(f"{self.o.where}: op '{self.o.name}': {self.f.kind} facade "
                        f"'{self.f.name}': {msg}")

    def param(self, a: Arg, kinds: tuple[str, ...]) -> PlainParam:
        p = self.params.get(a.param)
        if p is None:
            raise self.error(f"argument '{a.c_name}' names unknown parameter '{a.param}' (the op's "
                             f"parameters: {', '.join(self.params)})")
        if p.kind not in kinds:
            raise self.error(f"argument '{a.c_name}' maps to {p.kind} parameter '{a.param}'; "
                             f"expected a {' or '.join(kinds)}")
        if not re.fullmatch(r"[A-Za-z_]\w*", a.c_name):
            raise self.error(f"argument name {a.c_name!r} is not a C identifier")
        return p

    def scalar(self, a: Arg) -> Scalar:
        p = self.param(a, ("attr", "size"))
        c_type = a.c_type or p.c_type
        if c_type not in _SCALAR_C_TYPES:
            raise self.error(f"scalar '{a.c_name}' has C type {c_type!r}; supported: "
                             f"{', '.join(_SCALAR_C_TYPES)}")
        return Scalar(a.c_name, c_type, p.name, _convert(a.c_name, c_type, p))

    def status_cases(self) -> list[tuple[str, str]]:
        kind = self.f.kind
        known = _VENDOR_CODES[kind]
        table = {**EXTRA_STATUS[kind], **self.f.status}
        for k, v in self.f.status.items():
            if v not in known:
                raise self.error(f"status {k!r} maps to unknown code {v!r}")
        cases = [("OPGEN_SUCCESS", _SUCCESS[kind])]
        for s in render.STATUSES[1:]:
            key = s.get("abstract") or s["c"].removeprefix("OPGEN_ERR_").lower()
            if key not in table:
                raise self.error(f"no status mapping for abstract status {key!r}")
            cases.append((s["c"], table[key]))
        return cases

    def unique(self, names: list[str]) -> None:
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise self.error(f"C argument name(s) {dup} used twice")

    def entry(self, suffix: str, scalars: list[Scalar], extra: list[Scalar], what: str) -> dict[str, Any]:
        """One vendor entry point: its extra args, the C value of every plain scalar parameter
        (from the vendor args, else the DSL default) and the list of defaulted ones."""
        values = {s.param: s.expr for s in [*scalars, *extra]}
        defaulted = []
        for p in self.params.values():
            if p.kind == "tensor" or p.name in values:
                continue
            if p.default is None:
                raise self.error(f"{what} does not pass parameter '{p.name}', which has no default")
            values[p.name] = p.default
            defaulted.append(f"{p.name} = {p.default}")
        return {"suffix": suffix, "args": extra, "values": values, "defaulted": defaulted}


def _docs(o: OpDef, f: Infiniop | Aclnn) -> tuple[list[str], list[str]]:
    """The op's first doc paragraph (wrapped) and a line per parameter / dtype variable / renamed
    vendor argument, for the generated header's comment."""
    para = " ".join(o.doc.split("\n\n")[0].split())
    summary = textwrap.wrap(para, 96) or [o.name]
    lines = [f"{p.name}: {p.spec.describe()}" for p in o.signature.params]  # type: ignore[attr-defined]
    lines += [f"{k} in {{{', '.join(map(str, v.members))}}}" for k, v in o.signature.dtype_vars().items()]
    args = [*f.descriptors, *f.scalars, *(a for ext in f.extensions.values() for a in ext)] \
        if isinstance(f, Infiniop) else list(f.args)
    renamed = [f"{a.c_name} -> {a.param}" for a in args if a.c_name != a.param]
    if renamed:
        lines += textwrap.wrap("vendor argument -> op parameter: " + ", ".join(renamed), 96)
    return [x.replace("*/", "* /") for x in summary], [x.replace("*/", "* /") for x in lines]


def _base(o: OpDef, f: Infiniop | Aclnn, ck: _Checker) -> FacadeOp:
    params = list(ck.params.values())
    summary, docs = _docs(o, f)
    return FacadeOp(
        op=o.name, where=o.where, summary=summary, name=f.name,
        snake=snake(f.name), tag=_tag(f"{f.kind}:{f.name}"),
        n_tensors=sum(p.kind == "tensor" for p in params), params=params,
        status_cases=ck.status_cases(), param_docs=docs)


def infiniop_model(o: OpDef, f: Infiniop) -> FacadeOp:
    ck = _Checker(o, f)
    m = _base(o, f, ck)
    m.workspace = f.workspace
    for a in f.descriptors:
        p = ck.param(a, ("tensor",))
        m.tensors.append(TensorArg(a.c_name, p.name, p.slot, p.is_output, p.optional))
    for a in f.data:
        p = ck.param(a, ("tensor",))
        m.data.append(TensorArg(a.c_name, p.name, p.slot, p.is_output, p.optional))
    described = {t.param for t in m.tensors}
    given = {t.param for t in m.data}
    for p in ck.params.values():
        if p.kind != "tensor":
            continue
        if not p.optional and p.name not in described:
            raise ck.error(f"required tensor '{p.name}' has no descriptor argument")
        if (p.name in described) != (p.name in given):
            raise ck.error(f"tensor '{p.name}' needs both a descriptor and a data argument")
    m.scalars = [ck.scalar(a) for a in f.scalars]
    ck.unique(["handle", "desc_ptr", *(t.c_name for t in m.tensors), *(s.c_name for s in m.scalars)])
    ck.unique(["desc", "workspace", "workspace_size", "stream", *(t.c_name for t in m.data)])
    m.extensions.append(ck.entry("", m.scalars, [], "Create"))
    for suffix, ext in f.extensions.items():
        if not re.fullmatch(r"\w+", suffix):
            raise ck.error(f"extension suffix {suffix!r} is not an identifier part")
        extra = [ck.scalar(a) for a in ext]
        ck.unique(["handle", "desc_ptr", *(t.c_name for t in m.tensors),
                   *(s.c_name for s in m.scalars), *(s.c_name for s in extra)])
        m.extensions.append(ck.entry(suffix, m.scalars, extra, f"Create{suffix}"))
    m.guard = f"__INFINIOP_{m.snake.upper()}_API_H__"
    m.header = f"infiniop/ops/{m.snake}.h"
    return m


def aclnn_model(o: OpDef, f: Aclnn) -> FacadeOp:
    ck = _Checker(o, f)
    m = _base(o, f, ck)
    m.const_stream, m.const_outputs = f.const_stream, f.const_outputs
    for a in f.args:
        p = ck.param(a, ("tensor", "attr", "size"))
        if p.kind == "tensor":
            t = TensorArg(a.c_name, p.name, p.slot, p.is_output, p.optional)
            m.tensors.append(t)
            const = "" if p.is_output and not f.const_outputs else "const "
            m.args.append({"decl": f"{const}aclTensor *{a.c_name}", "tensor": t})
        else:
            s = ck.scalar(a)
            m.scalars.append(s)
            m.args.append({"decl": f"{s.c_type} {s.c_name}", "scalar": s})
    ck.unique([*(x["decl"].split()[-1].lstrip("*") for x in m.args), "workspaceSize", "executor"])
    for p in ck.params.values():
        if p.kind == "tensor" and not p.optional and p.name not in {t.param for t in m.tensors}:
            raise ck.error(f"required tensor '{p.name}' is not an argument")
    m.extensions.append(ck.entry("", m.scalars, [], "GetWorkspaceSize"))
    if not re.fullmatch(r"[\w/.]+\.h", f.header) or f.header.startswith("/") or ".." in f.header:
        raise ck.error(f"header {f.header!r} must be a relative path ending in .h")
    m.header = f.header
    m.guard = f"OP_API_INC_{m.snake.upper()}_H_"
    return m


# ---------------------------------------------------------------------------------- generation
def _c_dtype_tables() -> dict[str, Any]:
    """infiniDtype_t / aclDataType value -> opgen_dtype_t index (-1: no opgen equivalent)."""
    infini = [-1] * len(INFINI_DTYPES)
    acl_max = max(ACL_DTYPES.values())
    acl = [-1] * (acl_max + 1)
    for i, d in enumerate(dtypes.ALL):
        if d.infini is not None:
            infini[d.infini] = i
        if d.acl is not None:
            acl[d.acl] = i
    return {"infini_to_opgen": infini, "acl_to_opgen": acl}


def _digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for p in sorted(files):
        h.update(p.encode() + b"\0" + files[p].encode())
    return h.hexdigest()[:16]


#: per library: where its facade sources go (``dir``, ``ext``), the plain entry points they call
#: (``plain``), the infiniop device its handles are, how a call's stream reaches the plain entry,
#: its runtime header (``rt``: no op in it) and the header declaring the plain entries (``api``: the
#: per-op facades include it); for the aclnn facade: whether the library itself provides CANN's host side
#: (``acl_host``: aclTensor, aclCreateTensor and the accessors, aclOpExecutor, the aclrt* shims,
#: aclnnInit; the CPU library) or links against CANN's (the Ascend library, which reads aclTensors
#: only through nnopbase's accessors), the prefix of its internal aclnn helpers (``aclnn``: distinct
#: per library, so that one library's helpers never interpose on another's when both are loaded)
#: and the struct its executors start with (``executor``)
LIBRARIES = {
    "cpu": {"dir": "cpu", "ext": "c", "plain": "opgen_", "device": "CPU", "stream": "", "rt": "opgen_rt.h",
            "api": "opgen.h", "name": "opgen's CPU library", "acl_host": True, "aclnn": "opgen_aclnn_",
            "executor": "aclOpExecutor"},
    "ascendc": {"dir": "ascendc", "ext": "cpp", "plain": "opgen_ascendc_", "device": "ASCEND", "stream": ", stream",
                "rt": "opgen_ascendc_rt.h", "api": "opgen_ascendc.h", "name": "opgen's Ascend library",
                "acl_host": False, "aclnn": "opgen_ascendc_aclnn_", "executor": "opgen_ascendc_aclnn_executor"},
}


def generate(ops: list[OpDef], library: str = "cpu") -> dict[str, str]:
    """Every facade file of ``library``, ``{path relative to generated/: text}``: ``cpu``, the
    public headers too; ``ascendc``, the Ascend library's facades from the same templates (infiniop
    handles of device ``INFINI_DEVICE_ASCEND``, aclnn two-phase entries over CANN's aclTensor),
    over ``opgen_ascendc_<op>`` with the call's stream."""
    inf_ops: list[FacadeOp] = []
    acl_ops: list[FacadeOp] = []
    for o in ops:
        for f in o.abis:
            if isinstance(f, Infiniop):
                inf_ops.append(infiniop_model(o, f))
            elif isinstance(f, Aclnn):
                acl_ops.append(aclnn_model(o, f))
    for group in (inf_ops, acl_ops):
        seen: dict[str, str] = {}
        tags: set[str] = set()
        for m in group:
            key = m.header
            if key in seen:
                raise DSLError(f"{m.where}: facade '{m.name}' of op '{m.op}' clashes with one of "
                               f"op '{seen[key]}' ({key})")
            seen[key] = m.op
            salt = 0
            while m.tag in tags:  # a CRC collision: tags only need to differ within one library
                salt += 1
                m.tag = _tag(f"{m.header}:{salt}")
            tags.add(m.tag)
    ctx: dict[str, Any] = {
        "infini_status": INFINI_STATUS, "infini_status_aliases": INFINI_STATUS_ALIASES,
        "infini_devices": INFINI_DEVICES, "infini_dtypes": INFINI_DTYPES,
        "acl_dtypes": ACL_DTYPES, "acl_formats": ACL_FORMATS, "acl_plain_formats": ACL_PLAIN_FORMATS,
        "acl_errors": ACL_ERRORS, "aclnn_status": ACLNN_STATUS, **_c_dtype_tables(),
    }
    r = render.render
    headers = {
        "include/infinicore.h": r("infiniop/infinicore.h.j2", **ctx),
        "include/infiniop/handle.h": r("infiniop/handle.h.j2", **ctx),
        "include/infiniop/tensor_descriptor.h": r("infiniop/tensor_descriptor.h.j2", **ctx),
        "include/infiniop/operator_descriptor.h": r("infiniop/operator_descriptor.h.j2", **ctx),
        "include/infiniop.h": r("infiniop/infiniop.h.j2", ops=inf_ops, **ctx),
        "include/acl/acl_base.h": r("aclnn/acl_base.h.j2", **ctx),
        "include/acl/acl_rt.h": r("aclnn/acl_rt.h.j2", **ctx),
        "include/acl/acl.h": r("aclnn/acl.h.j2", **ctx),
        "include/aclnn/opdev/op_errno.h": r("aclnn/op_errno.h.j2", **ctx),
        "include/aclnn/acl_meta.h": r("aclnn/acl_meta.h.j2", **ctx),
        "include/aclnn/aclnn_base.h": r("aclnn/aclnn_base.h.j2", **ctx),
    }
    for m in inf_ops:
        headers[f"include/{m.header}"] = r("infiniop/op.h.j2", op=m, **ctx)
    for m in acl_ops:
        headers[f"include/{m.header}"] = r("aclnn/op.h.j2", op=m, **ctx)
    # compile.py hashes only the top-level include/*.h into its object keys: name the headers'
    # digest in every facade source so that any header change recompiles them
    ctx["headers_digest"] = _digest(headers)
    lib = LIBRARIES[library]
    ctx.update(lib=lib)
    d, ext = lib["dir"], lib["ext"]
    files = dict(headers) if library == "cpu" else {}
    files[f"{d}/facade_infiniop.h"] = r("infiniop/facade.h.j2", **ctx)
    files[f"{d}/facade_aclnn.h"] = r("aclnn/facade.h.j2", **ctx)
    files[f"{d}/facade_infiniop.{ext}"] = r("infiniop/facade.c.j2", **ctx)
    files[f"{d}/facade_aclnn.{ext}"] = r("aclnn/facade.c.j2", **ctx)
    for m in inf_ops:
        files[f"{d}/facade_infiniop_{m.snake}.{ext}"] = r("infiniop/op.c.j2", op=m, **ctx)
    for m in acl_ops:
        files[f"{d}/facade_aclnn_{m.snake}.{ext}"] = r("aclnn/op.c.j2", op=m, **ctx)
    return files
