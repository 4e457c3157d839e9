"""Binding concrete arguments to an op's signature: dims, dtype variables, variant, validation.

The same rules are generated into the C ABI's validation (issue 3); here they serve the oracle
and the Python runtime. Every failure is an :class:`OpError` carrying an abstract status that
each ABI maps to its own code: ``null``, ``param``, ``shape``, ``dtype``, ``strides``, ``index``.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from opgen import dtypes
from opgen.dsl.opdef import OpDef, Rejected
from opgen.dsl.spec import AttrSpec, Batch, DTypeVar, SizeSpec, TensorSpec
from opgen.ir.dialect import FuncOp

STATUSES = ("null", "param", "shape", "dtype", "strides", "index", "workspace", "alloc", "internal")


class OpError(Exception):
    """An op call rejected with an abstract status (see :data:`STATUSES`)."""

    def __init__(self, status: str, message: str):
        assert status in STATUSES, status
        super().__init__(f"[{status}] {message}")
        self.status = status
        self.message = message


#: the range of an ``int`` attribute (i64 at the ABI; [2**63, 2**64) is an unsigned 64-bit value
#: passed as its int64 bit pattern, e.g. CANN's ``uint64_t paddingIdx``)
INT_ATTR_RANGE = (-2**63, 2**64)
#: the range of a size parameter (a ``Dim``)
SIZE_RANGE = (0, 2**63)
#: what an int64 ABI slot can carry
I64_RANGE = (-2**63, 2**63)


def is_torch(x: Any) -> bool:
    """Whether ``x`` is a torch object (checked without importing torch)."""
    return type(x).__module__.startswith("torch")


def _pow2(v: int) -> str:
    """``-2**63`` / ``2**64`` for powers of two, else the number."""
    m = abs(v)
    if m >= 1024 and m & (m - 1) == 0:
        return f"{'-' if v < 0 else ''}2**{m.bit_length() - 1}"
    return str(v)


def dtype_of(arr: np.ndarray, what: str) -> dtypes.DType:
    """The opgen dtype of ``arr``; :class:`OpError` ``dtype`` for anything the C library cannot
    take (complex, object, strings, structured, non-native byte order)."""
    try:
        return dtypes.from_numpy(arr.dtype)
    except KeyError:
        pass
    hint = ""
    if arr.dtype.byteorder not in ("=", "|") and not arr.dtype.isnative:
        hint = (" (non-native byte order: the library reads native-endian data; convert with "
                "arr.astype(arr.dtype.newbyteorder('=')))")
    raise OpError("dtype", f"{what}: unsupported dtype {arr.dtype.str if hint else arr.dtype}{hint}; "
                           f"supported: {', '.join(d.name for d in dtypes.ALL)} in native byte order")


def to_numpy(x: Any, what: str = "argument") -> np.ndarray:
    """numpy view of an array-like (torch CPU tensors included, bf16 via ml_dtypes).

    A torch tensor is detached (requires_grad is fine for reading); one with the conjugate or
    negative bit set is resolved into a copy. Tensors on another device, sparse tensors and torch
    dtypes numpy has no equivalent for raise :class:`OpError` (``what`` names the argument).
    """
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        import torch

        if not isinstance(x, torch.Tensor):
            raise OpError("param", f"{what}: expected a tensor, got {type(x).__name__}")
        if x.device.type != "cpu":
            raise OpError("param", f"{what}: a torch tensor on {x.device}; the CPU runtime takes CPU "
                                   f"tensors (use .cpu(), or opgen.runtime_cuda for CUDA tensors)")
        if x.layout != torch.strided:
            raise OpError("param", f"{what}: a {x.layout} torch tensor; only dense (strided) tensors "
                                   f"are accepted")
        x = x.detach()
        if x.is_conj() or x.is_neg():
            x = x.resolve_conj().resolve_neg()  # a lazy view: materialise its values
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(dtypes.BF16.np_dtype)
        try:
            return x.numpy()
        except (TypeError, RuntimeError) as e:
            raise OpError("dtype", f"{what}: unsupported torch dtype {x.dtype} ({e})") from None
    try:
        return np.asarray(x)
    except (TypeError, ValueError) as e:
        raise OpError("param", f"{what}: not an array ({type(x).__name__}: {e})") from None


def check_writable_torch(x: Any, what: str) -> None:
    """Refuse a torch tensor the runtime must not write in place, as torch's own in-place and
    ``out=`` rules do: one that requires grad while grad mode is on, an inference tensor outside
    inference mode, a lazy conjugate/negative view."""
    import torch

    if x.requires_grad and torch.is_grad_enabled():
        raise OpError("param", f"{what}: a torch tensor that requires grad cannot be written in place "
                               f"(autograd would not see it); pass a detached tensor or call under "
                               f"torch.no_grad()")
    if x.is_inference() and not torch.is_inference_mode_enabled():
        raise OpError("param", f"{what}: an inference tensor can only be written inside "
                               f"torch.inference_mode(); pass a normal tensor (e.g. .clone())")
    if x.is_conj() or x.is_neg():
        raise OpError("param", f"{what}: a tensor with the conjugate/negative bit set cannot be "
                               f"written in place; resolve it first")


def output_array(x: Any, what: str = "output") -> np.ndarray:
    """The numpy view the library writes an output into, refusing (:class:`OpError` ``param``,
    before anything runs) what cannot be written in place: anything that is not a numpy array or
    torch tensor (``np.asarray`` would write into a copy), a read-only numpy array (e.g.
    ``np.frombuffer`` over ``bytes``, ``np.broadcast_to``, ``writeable=False``), and the torch
    tensors :func:`check_writable_torch` refuses."""
    if is_torch(x):
        import torch

        if isinstance(x, torch.Tensor):
            check_writable_torch(x, what)
    elif not isinstance(x, np.ndarray):
        raise OpError("param", f"{what}: an output must be a numpy array or a torch tensor (it is "
                               f"written in place), got {type(x).__name__}")
    arr = to_numpy(x, what)
    if not arr.flags.writeable:
        raise OpError("param", f"{what}: the output is read-only (writeable=False: e.g. a view of "
                               f"immutable bytes or a broadcast); pass a writeable array")
    return arr


@dataclass
class Binding:
    """A validated call: which variant, dim sizes, dtype variables, logical arrays."""

    op: OpDef
    func: FuncOp
    dims: dict[str, int] = field(default_factory=dict)
    dtypes: dict[str, dtypes.DType] = field(default_factory=dict)
    batch_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)  # logical shape views
    scalars: dict[str, float | int | bool] = field(default_factory=dict)
    outputs: dict[str, np.ndarray] = field(default_factory=dict)  # caller's arrays (full shape)
    #: shape and dtype of each output the call would allocate (bind(..., allocate=False))
    output_meta: dict[str, tuple[tuple[int, ...], dtypes.DType]] = field(default_factory=dict)
    #: the allocated outputs the op does not read that are fresh zero pages (ZERO_FREE_MIN bytes
    #: or more): the runtime tells the library (opgen_zero_hint)
    fresh_zero: list[str] = field(default_factory=list)

    def resolve(self, name: str) -> dtypes.DType:
        return dtypes.BY_NAME[name] if name in dtypes.BY_NAME else self.dtypes[name]


def _bind_dtype(b: Binding, pname: str, spec_dt: dtypes.DType | DTypeVar, got: dtypes.DType) -> None:
    allowed = spec_dt.members if isinstance(spec_dt, DTypeVar) else (spec_dt,)
    if got not in allowed:
        raise OpError("dtype", f"{pname}: dtype {got} not in {{{', '.join(map(str, allowed))}}}")
    if isinstance(spec_dt, DTypeVar):
        prev = b.dtypes.setdefault(spec_dt.name, got)
        if prev != got:
            raise OpError("dtype", f"{pname}: dtype {got} but {spec_dt.name} is already {prev}")


def _bind_dim(b: Binding, pname: str, name: str, size: int) -> None:
    prev = b.dims.setdefault(name, size)
    if prev != size:
        raise OpError("shape", f"{pname}: dim {name} is {size} but was bound to {prev}")


def _bind_tensor(b: Binding, pname: str, spec: TensorSpec, arr: np.ndarray) -> np.ndarray:
    got = dtype_of(arr, pname)
    _bind_dtype(b, pname, spec.dtype, got)
    shape = arr.shape
    lead = spec.shape[0] if spec.shape else None
    n_fixed = len(spec.shape) - (1 if isinstance(lead, Batch) else 0)
    if isinstance(lead, Batch):
        nb = len(shape) - n_fixed
        if not lead.min_rank <= nb <= lead.max_rank:
            raise OpError("shape", f"{pname}: rank {len(shape)} not in "
                                   f"[{lead.min_rank + n_fixed}, {lead.max_rank + n_fixed}]")
        bshape = tuple(shape[:nb])
        prev = b.batch_shapes.setdefault(lead.name, bshape)
        if prev != bshape:
            raise OpError("shape", f"{pname}: leading shape {bshape} differs from {prev}")
        _bind_dim(b, pname, lead.name, math.prod(bshape))
        rest, rest_spec = shape[nb:], spec.shape[1:]
        logical = arr.reshape((b.dims[lead.name], *rest))
    else:
        if len(shape) != len(spec.shape):
            raise OpError("shape", f"{pname}: expected rank {len(spec.shape)} "
                                   f"{spec.logical_shape}, got shape {shape}")
        rest, rest_spec = shape, spec.shape
        logical = arr
    for d, n in zip(rest_spec, rest, strict=True):
        if isinstance(d, int):
            if n != d:
                raise OpError("shape", f"{pname}: dim must be {d}, got {n}")
        else:
            _bind_dim(b, pname, d.name, int(n))
    if (spec.last_contiguous and arr.ndim and arr.size and arr.shape[-1] > 1
            and arr.strides[-1] != arr.itemsize):  # an empty array's strides mean nothing
        raise OpError("strides", f"{pname}: last dim must be contiguous")
    return logical


def bind(op: OpDef, args: dict[str, Any], allocate: bool = True) -> Binding:
    """Validate ``args`` (by parameter name) against ``op``'s signature and pick the variant.
    Outputs not passed are allocated, or with ``allocate=False`` only described
    (:attr:`Binding.output_meta`: what a caller tracing shapes, e.g. a torch fake tensor, needs)."""
    sig = op.signature
    unknown = set(args) - {p.name for p in sig.params}
    if unknown:
        raise OpError("param", f"{op.name}: unknown argument(s) {sorted(unknown)}")
    present = [p.name for p in sig.optionals if args.get(p.name) is not None]
    variant = op.variant_for(present)
    if isinstance(variant, Rejected):
        raise OpError(variant.status, f"{op.name}: {variant.message}")
    b = Binding(op, variant)
    pending_outputs = []
    for p in sig.params:
        v = args.get(p.name)
        if isinstance(p.spec, TensorSpec):
            if v is None:
                if p.is_output and not p.optional:
                    pending_outputs.append(p)
                elif not p.optional:
                    raise OpError("null", f"{op.name}: required tensor '{p.name}' is missing")
                continue
            arr = to_numpy(v, f"{op.name}: '{p.name}'")
            try:
                logical = _bind_tensor(b, p.name, p.spec, arr)
            except OpError as e:
                raise OpError(e.status, f"{op.name}: {e.message}") from None
            b.arrays[p.name] = logical
            if p.is_output:
                b.outputs[p.name] = arr
        elif isinstance(p.spec, AttrSpec):
            if v is None:
                if not p.spec.has_default:
                    raise OpError("null", f"{op.name}: attribute '{p.name}' is required")
                v = p.spec.default
            b.scalars[p.name] = attr_value(p.spec, v, f"{op.name}: attribute '{p.name}'")
        elif isinstance(p.spec, SizeSpec):
            if v is None:
                raise OpError("null", f"{op.name}: size '{p.name}' is required")
            n = int_value(v, f"{op.name}: size '{p.name}'", SIZE_RANGE)
            _bind_dim(b, p.name, p.spec.dim.name, n)
            b.scalars[p.name] = n
    for p in pending_outputs:  # allocate outputs whose shape is fully bound by the inputs
        spec = p.spec
        assert isinstance(spec, TensorSpec)
        if isinstance(spec.dtype, DTypeVar) and spec.dtype.name not in b.dtypes:
            raise OpError("null", f"{op.name}: output '{p.name}' must be given (its dtype "
                                  f"{spec.dtype.name} is not bound by any input)")
        shape = []
        for d in spec.shape:
            if isinstance(d, Batch):
                shape.extend(b.batch_shapes.get(d.name, (b.dims.get(d.name, -1),)))
            elif isinstance(d, int):
                shape.append(d)
            else:
                shape.append(b.dims.get(d.name, -1))
        if -1 in shape:
            raise OpError("null", f"{op.name}: output '{p.name}' must be given (its shape is "
                                  f"not bound by the inputs)")
        dt = spec.dtype if isinstance(spec.dtype, dtypes.DType) else b.dtypes[spec.dtype.name]
        b.output_meta[p.name] = (tuple(shape), dt)
        if not allocate:
            continue
        zero, fresh = output_zeroing(op, p.name, shape, dt)
        arr = allocate_output(f"{op.name}: output '{p.name}'", shape, dt, zero)
        if fresh:
            b.fresh_zero.append(p.name)
        b.outputs[p.name] = arr
        b.arrays[p.name] = _bind_tensor(b, p.name, spec, arr)
    used = {ir_t.dtype for ir_t in (a.type for a in variant.body.block.args)}  # type: ignore[attr-defined]
    for dvar in sig.dtype_vars():
        if dvar not in b.dtypes and dvar in used:
            raise OpError("dtype", f"{op.name}: dtype variable {dvar} is not bound")
    return b


#: the alignment of the outputs the Python API allocates (one cache line, as PyTorch's CPU
#: allocator gives). numpy's large arrays start 16 bytes into a line: every 64-byte vector store
#: of a kernel then splits over two lines (softmax backward, 8192x4096 f32: 15.0 ms against 13.1)
ALIGN = 64
#: arrays of at least HUGE_MIN bytes start at a multiple of HUGE_ALIGN (2 MiB) instead, as
#: PyTorch's CPU allocator places large tensors with THP_MEM_ALLOC_ENABLE=1: numpy asks for
#: transparent huge pages on them too, but an unaligned start leaves the first and last 2 MiB
#: on small pages, and a kernel writing fresh output pages faults them in faster on huge ones
#: (embedding backward, a 65 MB bf16 output: 12.4 -> 11.3 ms on a Zen 3, alternating in one process)
HUGE_MIN = 4 << 20
HUGE_ALIGN = 2 << 20


def aligned_zeros(shape: Sequence[int], dtype: np.dtype | type, align: int = ALIGN, zero: bool = True) -> np.ndarray:
    """A zero-filled (``zero``; else uninitialised) C-contiguous array of ``shape`` whose data
    starts at a multiple of ``align`` bytes, of HUGE_ALIGN bytes when it is HUGE_MIN bytes or
    more (a view into a slightly larger buffer: large zeroed ones are fresh pages, zero without
    being written, as ``np.zeros``'s; the unused head is never touched)."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes >= HUGE_MIN:
        align = max(align, HUGE_ALIGN)
    raw = (np.zeros if zero else np.empty)(nbytes + align, np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes].view(dt).reshape(shape)


#: from this size on (bytes) an output is allocated zeroed even when the op does not read it: the
#: C library's calloc then maps fresh pages from the OS (glibc maps every block of 32 MiB or more:
#: its largest mmap threshold), zero without a memset, and a kernel told so skips its stores of
#: zeros (runtime.call: opgen_zero_hint) — the pages only those would touch are never faulted in
ZERO_FREE_MIN = 32 << 20


def reads_prior_contents(o: OpDef, name: str) -> bool:
    """Whether some variant of ``o`` reads output ``name`` before writing it (it then starts
    from zeros; otherwise the call allocates it uninitialised: every element is written)."""
    for f in o.variants.values():
        names = [a.data for a in f.arg_names.data]
        if name in names and f.body.block.args[names.index(name)].uses:
            return True
    return False


def output_zeroing(o: OpDef, name: str, shape: Sequence[int], dt: dtypes.DType) -> tuple[bool, bool]:
    """How output ``name`` of ``shape`` and ``dt`` is allocated when the caller passes none:
    (zero-filled, fresh zero pages the library may be told of). Zero-filled where the op reads
    it before writing it, or where it is ZERO_FREE_MIN bytes or more (then fresh pages, which
    are zero without a memset); otherwise uninitialised."""
    reads = reads_prior_contents(o, name)
    fresh = not reads and math.prod(shape) * dt.itemsize >= ZERO_FREE_MIN
    return reads or fresh, fresh


def allocate_output(what: str, shape: list[int] | tuple[int, ...], dt: dtypes.DType, zero: bool) -> np.ndarray:
    """An output, zero-filled where ``zero`` (the op reads it before writing it), else
    uninitialised: every element is written (a kernel writes the whole of each output it does
    not read, as the C ABI's callers rely on; tests/test_outputs_written.py checks every op).
    Uninitialised memory is what PyTorch allocates too: a block freed by an earlier call comes
    back without calloc's single-threaded memset (a bf16 linear's 16 MiB output: 1.4 ms of a
    37 ms call on a Zen 5). Too large to address is ``shape``, no memory for it ``alloc``."""
    nbytes = math.prod(shape) * dt.itemsize
    if nbytes >= 2**63:
        raise OpError("shape", f"{what}: shape {tuple(shape)} {dt} is too large to allocate "
                               f"({nbytes} bytes, more than 2**63 - 1)")
    try:
        return aligned_zeros(shape, dt.np_dtype, zero=zero)
    except (MemoryError, ValueError) as e:
        raise OpError("alloc", f"{what}: cannot allocate shape {tuple(shape)} {dt} "
                               f"({nbytes} bytes): {e}") from None


def _python_scalar(v: Any, what: str) -> Any:
    """``v`` with numpy scalars, 0-d numpy arrays and 0-d torch tensors unwrapped."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray) or is_torch(v):
        if getattr(v, "ndim", None) == 0:
            try:
                return v.item()
            except (RuntimeError, TypeError, ValueError) as e:  # e.g. a meta tensor
                raise OpError("param", f"{what}: cannot read the scalar ({e})") from None
        raise OpError("param", f"{what} must be a scalar, got {type(v).__name__} of shape "
                               f"{tuple(getattr(v, 'shape', ()))}")
    return v


def int_value(v: Any, what: str, bounds: tuple[int, int], allowed: str | None = None) -> int:
    """``v`` as a Python int in ``[lo, hi)``; :class:`OpError` ``param`` otherwise.

    Accepted: ints (numpy and 0-d arrays included) and integral floats. Refused: bools, other
    types (strings, None, complex), non-integral or non-finite floats, values out of range —
    nothing is wrapped, truncated or saturated. ``allowed`` overrides the range the message
    states (when a caller checks only part of the rule).
    """
    lo, hi = bounds
    v = _python_scalar(v, what)
    if isinstance(v, bool):
        raise OpError("param", f"{what} must be an integer, got the bool {v}")
    if isinstance(v, numbers.Integral) or (hasattr(v, "__index__") and not isinstance(v, numbers.Real)):
        try:
            iv = operator.index(v)
        except TypeError:
            raise OpError("param", f"{what} must be an integer, got {type(v).__name__} {v!r}") from None
    elif isinstance(v, numbers.Real):
        try:
            iv = int(v)
        except (OverflowError, ValueError):  # inf, nan
            raise OpError("param", f"{what} must be an integer, got {v}") from None
        if iv != v:
            raise OpError("param", f"{what} must be an integer, got {v}")
    else:
        raise OpError("param", f"{what} must be an integer, got {type(v).__name__} {v!r}")
    if not lo <= iv < hi:
        raise OpError("param", f"{what} = {iv} is out of range: allowed "
                               f"{allowed or f'[{_pow2(lo)}, {_pow2(hi)})'}")
    return iv


def float_value(v: Any, what: str) -> float:
    """``v`` rounded to f32 (round to nearest even), as a Python float.

    Accepted: real numbers (not bools), numpy scalars and 0-d arrays included; ``inf``/``nan``
    pass as given. A finite value that would round to infinity (``|v| > 3.4028235e38``) is
    :class:`OpError` ``param`` (out of range), not silently made infinite.
    """
    v = _python_scalar(v, what)
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise OpError("param", f"{what} must be a real number, got {type(v).__name__} {v!r}")
    try:
        x = float(v)
        given_inf = math.isinf(x)
    except OverflowError:  # an int beyond the double range: surely beyond f32
        x, given_inf = (math.inf if v > 0 else -math.inf), False
    with np.errstate(over="ignore"):
        f = np.float32(x)
    if np.isinf(f) and not given_inf:
        raise OpError("param", f"{what} = {v} is out of range: a float attribute is f32, finite "
                               f"values must have magnitude <= {float(np.finfo(np.float32).max):.8g}")
    return float(f)


def bool_value(v: Any, what: str) -> bool:
    """``v`` as a bool: True/False (numpy and 0-d arrays included) or the integers 0 and 1;
    anything else (strings, 2, 0.5, None) is :class:`OpError` ``param``."""
    v = _python_scalar(v, what)
    if isinstance(v, bool):
        return v
    if isinstance(v, numbers.Integral) and v in (0, 1):
        return bool(v)
    raise OpError("param", f"{what} must be a bool (True/False or 0/1), got {type(v).__name__} {v!r}")


def attr_value(spec: AttrSpec, v: Any, what: str) -> float | int | bool:
    """The value of scalar attribute ``spec`` (the rules of docs/dsl.md section 2): ``bool``
    by :func:`bool_value`; ``int`` in ``[-2**63, 2**64)``, values ``>= 2**63`` read as their
    two's-complement int64 (an unsigned 64-bit ABI value); ``float`` by :func:`float_value`.
    ``what`` names the op and attribute in errors."""
    if spec.dtype == dtypes.BOOL:
        return bool_value(v, what)
    if spec.dtype == dtypes.I64:
        iv = int_value(v, what, INT_ATTR_RANGE)
        if iv >= 2**63:  # an unsigned 64-bit ABI value read as int64 (two's complement)
            iv -= 2**64
        return iv
    return float_value(v, what)
