"""Calling the generated C library from Python (ctypes), on numpy arrays or torch CPU tensors.

>>> from opgen import runtime
>>> out = runtime.call("my_op", x=x, eps=1e-6)   # doctest: +SKIP

Outputs not passed are allocated (zero-filled) when their shape follows from the inputs.
Failures raise :class:`opgen.binding.OpError` with the abstract status of the C status code.

Before the library runs, the Python side refuses (``OpError``) what the C ABI cannot express or
would get wrong: unknown argument names; an output that cannot be written in place (read-only
numpy arrays such as ``np.frombuffer`` over ``bytes``, non-arrays, torch tensors requiring grad
under grad mode or inference tensors outside inference mode) — status ``param``; scalars out of
their ABI type's range or of the wrong kind — ``param`` (see :func:`opgen.binding.attr_value`);
arrays whose dtype the library has no code for (complex, object, non-native byte order) —
``dtype``; data not aligned to its item size — ``param`` (the C ABI's rule too); torch tensors
on another device — ``param``. Inputs are only read; a torch output's version counter is bumped after it is written.
"""

from __future__ import annotations

import ctypes
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from opgen import dtypes, registry
from opgen.binding import (
    I64_RANGE,
    OpError,
    aligned_zeros,
    allocate_output,
    attr_value,
    bind,
    dtype_of,
    int_value,
    is_torch,
    output_array,
    output_zeroing,
    to_numpy,
)
from opgen.dsl.spec import AttrSpec, SizeSpec, TensorSpec

#: plain-ABI status code -> abstract status (see opgen.emit.render.STATUSES)
STATUS = {1: "null", 2: "param", 3: "shape", 4: "dtype", 5: "strides", 6: "index", 7: "workspace", 8: "alloc",
          9: "internal"}


class TensorDesc(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64))]


def library_path(sanitize: bool = False) -> Path:
    env = os.environ.get("OPGEN_LIB")
    if env:
        return Path(env)
    name = "libopgen_asan.so" if sanitize else "libopgen.so"
    return registry.REPO_ROOT / "build" / "cpu" / name


@cache
def load(path: str | None = None) -> ctypes.CDLL:
    """Load the library (default: build/cpu/libopgen.so, or $OPGEN_LIB)."""
    p = Path(path) if path else library_path()
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist; run 'opgen build' first")
    lib = ctypes.CDLL(str(p))
    lib.opgen_last_error.restype = ctypes.c_char_p
    return lib


def describe(arr: np.ndarray, what: str = "tensor", check_aligned: bool = True) -> tuple[TensorDesc, tuple[Any, ...]]:
    """An opgen_tensor_t for ``arr`` (plus the ctypes arrays that must outlive it).

    Raises :class:`OpError` ``dtype`` for a dtype the library has no code for (complex, object,
    non-native byte order, ...), ``strides`` for strides that are not a multiple of the item size
    and ``param`` for a data address that is not (unless ``check_aligned`` is false: tests of the
    C ABIs hand such descriptors to the library, which must refuse them itself); ``what`` names
    the argument in the message."""
    d = dtype_of(arr, what)
    item = arr.itemsize
    if any(st % item for st in arr.strides):
        raise OpError("strides", f"{what}: array strides {arr.strides} are not a multiple of the item "
                                 f"size {item}")
    data = arr.ctypes.data if arr.size else None  # (read once: each read builds a ctypes helper, ~1 us)
    if check_aligned and data and data % item:
        raise OpError("param", f"{what}: the data address is not aligned to the {item}-byte item size")
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(arr.ndim, 1))(*(st // item for st in arr.strides))
    desc = TensorDesc(data, dtypes.code(d), arr.ndim, shape, strides)
    return desc, (shape, strides, arr)


def marshal(sig: Any, args: dict[str, Any], tensor_arg: Any,
            op_name: str = "op") -> tuple[list[Any], dict[str, Any], list[Any]]:
    """ctypes arguments of a plain entry point, in signature order. ``tensor_arg(param, v)`` returns
    (the object handed back for outputs, its TensorDesc, what must stay alive); scalars use their
    declared C types (an unsigned 64-bit int attribute is passed as its int64 bit pattern).

    Scalars go through :func:`opgen.binding.attr_value` (the binding's rules, so nothing is wrapped
    or truncated into its C type); a size parameter must fit int64 (its sign is the library's to
    check); a missing attribute without default is :class:`OpError` ``null``."""
    keep: list[Any] = []
    cargs: list[Any] = []
    outs: dict[str, Any] = {}
    for p in sig.params:
        v = args.get(p.name)
        if isinstance(p.spec, TensorSpec):
            if v is None:
                cargs.append(None)
                continue
            obj, desc, hold = tensor_arg(p, v)
            if p.is_output:
                outs[p.name] = obj
            keep.append((desc, hold))
            cargs.append(ctypes.pointer(desc))
        elif isinstance(p.spec, AttrSpec):
            if v is None:
                if not p.spec.has_default:
                    raise OpError("null", f"{op_name}: attribute '{p.name}' is required")
                v = p.spec.default
            val = attr_value(p.spec, v, f"{op_name}: attribute '{p.name}'")
            if p.spec.dtype == dtypes.F32:
                cargs.append(ctypes.c_float(val))
            elif p.spec.dtype == dtypes.I64:
                cargs.append(ctypes.c_int64(int(val)))
            else:
                cargs.append(ctypes.c_bool(bool(val)))
        else:
            assert isinstance(p.spec, SizeSpec)
            # any int64 goes through: a negative size is the library's to refuse (status param)
            n = -1 if v is None else int_value(v, f"{op_name}: size '{p.name}'", I64_RANGE,
                                               allowed="[0, 2**63)")
            cargs.append(ctypes.c_int64(n))
    return cargs, outs, keep


def check_args(o: Any, args: dict[str, Any]) -> None:
    """:class:`OpError` ``param`` for argument names ``o``'s signature does not have (a misspelt
    attribute would otherwise silently take its default); ``null`` for a size parameter not
    given (as the binding says, rather than the library's "must be >= 0" for its -1 sentinel)."""
    known = [p.name for p in o.signature.params]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise OpError("param", f"{o.name}: unknown argument(s) {unknown}; parameters: {', '.join(known)}")
    for p in o.signature.sizes:
        if args.get(p.name) is None:
            raise OpError("null", f"{o.name}: size '{p.name}' is required")


def bump_versions(objs: Any) -> None:
    """Tell autograd that torch tensors among ``objs`` were written in place (the library writes
    through their numpy view, which torch's version counter does not see)."""
    for t in objs:
        if type(t).__module__.startswith("torch"):
            import torch

            torch.autograd.graph.increment_version(t)


#: the outputs runtime.call allocates, by op and what its arguments look like (:func:`output_plan`)
_PLANS: dict[tuple[Any, ...], tuple[Any, list[tuple[str, tuple[int, ...], dtypes.DType, bool, bool]]]] = {}
#: at most this many plans are kept (then they are dropped and found again)
PLANS_MAX = 1024


def _plan_key(o: Any, args: dict[str, Any]) -> tuple[Any, ...] | None:
    """Everything :func:`opgen.binding.bind` reads of ``args``: each numpy array's dtype, shape
    and strides; each torch tensor's dtype, shape, strides and what decides its numpy view
    (device, layout, conjugate and negative bits); each Python scalar's type and value (None: an
    argument of another kind, bound every time)."""
    key: list[Any] = [o.name]
    for k in sorted(args):
        v = args[k]
        if type(v) is np.ndarray:
            key.append((k, v.dtype, v.shape, v.strides))
        elif type(v) in (int, float, bool):
            key.append((k, type(v), v))
        elif is_torch(v) and hasattr(v, "is_neg"):  # (a torch.Tensor, torch not imported here)
            key.append((k, "torch", v.dtype, tuple(v.shape), v.stride(), v.device.type, v.layout, v.is_conj(),
                        v.is_neg()))
        else:
            return None
    return tuple(key)


def output_plan(o: Any, args: dict[str, Any],
                missing: list[str]) -> list[tuple[str, tuple[int, ...], dtypes.DType, bool, bool]]:
    """(name, shape, dtype, zero-filled, fresh zero pages) of each output in ``missing``, as
    :func:`opgen.binding.bind` finds them (which validates the call first: its errors are
    raised); remembered for the next call whose arguments look the same (:func:`_plan_key`), so
    repeated calls of one op on arrays of one layout skip binding in Python (the library checks
    every call again). Nothing is allocated here."""
    key = _plan_key(o, args)
    hit = _PLANS.get(key) if key is not None else None
    if hit is not None and hit[0] is o:  # (the same op object: a reloaded registry binds again)
        return hit[1]
    b = bind(o, args, allocate=False)
    plan = []
    for name in missing:
        shape, dt = b.output_meta[name]
        plan.append((name, shape, dt, *output_zeroing(o, name, shape, dt)))
    if key is not None:
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = (o, plan)
    return plan


def call(op_name: str, /, lib: ctypes.CDLL | None = None, **args: Any) -> dict[str, np.ndarray]:
    """Run ``op_name`` through its plain C entry point; returns the outputs by name (numpy views of
    the outputs passed, or new arrays). Raises :class:`OpError` (see the module docstring) before
    anything runs for an argument the library must not get, else with the library's status.
    Every other keyword is the op's (even one named ``op_name`` or ``workspace``; an op parameter
    named ``lib`` is taken as such when the value is not a loaded library)."""
    o = registry.get(op_name)
    if lib is not None and not isinstance(lib, ctypes.CDLL) and any(p.name == "lib" for p in o.signature.params):
        args["lib"], lib = lib, None
    lib = lib or load()
    sig = o.signature
    args = {k: v for k, v in args.items() if v is not None}
    check_args(o, args)
    missing = [p.name for p in sig.outputs if p.name not in args and not p.optional]
    zero: list[np.ndarray] = []
    if missing:  # allocate outputs the way the oracle does (validating the call in Python)
        for name, shape, dt, zeroed, fresh in output_plan(o, args, missing):
            args[name] = allocate_output(f"{o.name}: output '{name}'", shape, dt, zeroed)
            if fresh:
                zero.append(args[name])

    def numpy_arg(p: Any, v: Any) -> tuple[np.ndarray, TensorDesc, Any]:
        what = f"{o.name}: '{p.name}'"
        arr = output_array(v, what) if p.is_output else to_numpy(v, what)
        return (arr, *describe(arr, what))

    cargs, outs, _keep = marshal(sig, args, numpy_arg, o.name)
    fn = getattr(lib, f"opgen_{o.name}")
    if zero:  # (fresh zero pages: the kernel may skip its stores of zeros there; see opgen_rt.h)
        ptrs = (ctypes.c_void_p * len(zero))(*(a.ctypes.data for a in zero))
        sizes = (ctypes.c_size_t * len(zero))(*(a.nbytes for a in zero))
        lib.opgen_zero_hint(ptrs, sizes, len(zero))
    try:
        st = fn(*cargs, None, ctypes.c_size_t(0))
    finally:
        if zero:
            lib.opgen_zero_hint(None, None, 0)
    if st != 0:
        msg = lib.opgen_last_error().decode()
        raise OpError(STATUS.get(st, "internal"), f"status {st}: {msg}")
    bump_versions(args[p.name] for p in sig.outputs if p.name in args)
    return outs


# ------------------------------------------------------------------ ttnn-style facades

def _dtype_of(dtype: Any) -> np.dtype | None:
    """A ttnn-ish dtype argument (a string like 'bfloat16', a numpy or torch dtype) as numpy."""
    if dtype is None:
        return None
    name = str(dtype).split(".")[-1].lower()
    table = {"bfloat16": dtypes.BF16.np_dtype, "bf16": dtypes.BF16.np_dtype, "float32": np.dtype(np.float32),
             "f32": np.dtype(np.float32), "float": np.dtype(np.float32)}
    if name in table:
        return table[name]
    raise OpError("dtype", f"unsupported dtype {dtype!r}")


def ttnn_function(op_name: str) -> Any:
    """The ttnn-style Python function an op declares with ``Ttnn(...)`` (see opgen.abi.Ttnn).

    Positional tensors are flattened to the op's logical rank (leading dims merged); the output
    is returned with the declared leading unit dims. ``output_tensor`` (when given) is written
    and returned; ``dtype`` must match the output's dtype; ``memory_config``/``queue_id`` are
    accepted for signature compatibility and ignored on the CPU.
    """
    from opgen.abi import Ttnn

    o = registry.get(op_name)
    decl = next((f for f in o.abis if isinstance(f, Ttnn)), None)
    if decl is None:
        raise KeyError(f"op {op_name!r} declares no ttnn facade")
    sig = o.signature
    out_spec = sig[decl.output].spec
    assert isinstance(out_spec, TensorSpec)

    def fn(*positional: Any, dtype: Any = None, output_tensor: Any = None, memory_config: Any = None,
           queue_id: int = 0) -> Any:
        del memory_config, queue_id
        if len(positional) != len(decl.positional):
            raise TypeError(f"{decl.name}() takes {len(decl.positional)} positional arguments "
                            f"({', '.join(a.c_name for a in decl.positional)})")
        as_torch = any(type(x).__module__.startswith("torch") for x in positional)
        args: dict[str, Any] = {}
        for a, x in zip(decl.positional, positional, strict=True):
            arr = to_numpy(x, f"{decl.name}: '{a.c_name}'")
            spec = sig[a.param].spec
            assert isinstance(spec, TensorSpec)
            rank = len(spec.shape)
            if arr.ndim >= rank:  # merge the leading dims (a view where numpy can, else a copy)
                nb = arr.ndim - rank + 1
                arr = arr.reshape((math.prod(arr.shape[:nb]), *arr.shape[nb:]))
            args[a.param] = arr  # (a lower rank is left to the binding's shape check)
        b = bind(o, dict(args))
        want = np.dtype(b.outputs[decl.output].dtype)
        req = _dtype_of(dtype)
        if req is not None and req != want:
            raise OpError("dtype", f"{decl.name}: dtype {dtype} must match the gradient's dtype {want}")
        lead = decl.output_lead
        logical = b.outputs[decl.output].shape
        if output_tensor is not None:
            out_full = output_array(output_tensor, f"{decl.name}: 'output_tensor'")
            if out_full.dtype != want:
                raise OpError("dtype", f"{decl.name}: output_tensor must be {want}, got {out_full.dtype}")
            if out_full.shape not in (tuple(logical), (*lead, *logical)):
                raise OpError("shape", f"{decl.name}: output_tensor must be {(*lead, *logical)} {want}")
        else:
            out_full = aligned_zeros((*lead, *logical), want)
        # drop the unit leading dims by indexing: always a view, so the library writes out_full
        args[decl.output] = out_full[(0,) * (out_full.ndim - len(logical))]
        call(op_name, **args)
        if output_tensor is not None:
            bump_versions([output_tensor])
            return output_tensor
        if as_torch:
            import torch

            if want == dtypes.BF16.np_dtype:
                return torch.from_numpy(out_full.view(np.int16)).view(torch.bfloat16)
            return torch.from_numpy(out_full)
        return out_full

    fn.__name__ = decl.name
    fn.__doc__ = f"ttnn.{decl.name} over opgen op '{op_name}' ({o.where}).\n\n{o.doc}"
    return fn


class _TtnnNamespace:
    """``opgen.runtime.ttnn.<name>``: every op's ttnn-style facade, by its ttnn name."""

    def __getattr__(self, name: str) -> Any:
        from opgen.abi import Ttnn

        for o in registry.load_all().values():
            if any(isinstance(f, Ttnn) and f.name == name for f in o.abis):
                return ttnn_function(o.name)
        raise AttributeError(f"no op declares ttnn.{name}")


ttnn = _TtnnNamespace()
