"""Calling the generated C library from Python (ctypes), on numpy arrays or torch CPU tensors.

>>> from opgen import runtime
>>> out = runtime.call("rms_norm_backward", grad_y=gy, x=x, w=w, eps=1e-6)   # doctest: +SKIP

Outputs not passed are allocated (zero-filled) when their shape follows from the inputs.
Failures raise :class:`opgen.binding.OpError` with the abstract status of the C status code.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from opgen import dtypes, registry
from opgen.binding import OpError, bind, to_numpy
from opgen.dsl.spec import AttrSpec, SizeSpec, TensorSpec

#: plain-ABI status code -> abstract status (see opgen.emit.render.STATUSES)
STATUS = {1: "null", 2: "param", 3: "shape", 4: "dtype", 5: "strides", 6: "index"}


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


def describe(arr: np.ndarray) -> tuple[TensorDesc, tuple[Any, ...]]:
    """An opgen_tensor_t for ``arr`` (plus the ctypes arrays that must outlive it)."""
    d = dtypes.from_numpy(arr.dtype)
    item = arr.itemsize
    if any(st % item for st in arr.strides):
        raise OpError("strides", "array strides are not a multiple of the item size")
    shape = (ctypes.c_int64 * max(arr.ndim, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(arr.ndim, 1))(*(st // item for st in arr.strides))
    desc = TensorDesc(arr.ctypes.data if arr.size else None, dtypes.ALL.index(d), arr.ndim, shape, strides)
    return desc, (shape, strides, arr)


def call(op_name: str, lib: ctypes.CDLL | None = None, workspace: bool = True, **args: Any) -> dict[str, np.ndarray]:
    """Run ``op_name`` through its plain C entry point; returns the outputs by name."""
    o = registry.get(op_name)
    lib = lib or load()
    sig = o.signature
    args = {k: v for k, v in args.items() if v is not None}
    missing = [p.name for p in sig.outputs if p.name not in args and not p.optional]
    if missing:  # allocate outputs the way the oracle does (validating the call in Python)
        b = bind(o, args)
        for name in missing:
            args[name] = b.outputs[name]
    keep: list[Any] = []
    cargs: list[Any] = []
    outs: dict[str, np.ndarray] = {}
    for p in sig.params:
        v = args.get(p.name)
        if isinstance(p.spec, TensorSpec):
            if v is None:
                cargs.append(None)
                continue
            arr = to_numpy(v)
            if p.is_output:
                outs[p.name] = arr
            desc, hold = describe(arr)
            keep.append((desc, hold))
            cargs.append(ctypes.pointer(desc))
        elif isinstance(p.spec, AttrSpec):
            val = p.spec.default if v is None else v
            if p.spec.dtype == dtypes.F32:
                cargs.append(ctypes.c_float(float(val)))
            elif p.spec.dtype == dtypes.I64:
                iv = int(val)
                cargs.append(ctypes.c_int64(iv - 2**64 if iv >= 2**63 else iv))
            else:
                cargs.append(ctypes.c_bool(bool(val)))
        else:
            assert isinstance(p.spec, SizeSpec)
            cargs.append(ctypes.c_int64(int(v) if v is not None else -1))
    fn = getattr(lib, f"opgen_{o.name}")
    st = fn(*cargs, None, ctypes.c_size_t(0))
    if st != 0:
        msg = lib.opgen_last_error().decode()
        raise OpError(STATUS.get(st, "param"), f"status {st}: {msg}")
    return outs
