"""Calling the CUDA library (``build/cuda/libopgen_cuda.so``) from Python on torch CUDA tensors.

>>> from opgen import runtime_cuda
>>> outs = runtime_cuda.call("my_op", x=x_cuda, eps=1e-6)  # doctest: +SKIP

Tensor arguments are torch CUDA tensors (numpy arrays are copied to the current device, bf16
through ``ml_dtypes``); outputs not passed are allocated (zero-filled) with the shapes the
binding gives. The call is enqueued on torch's current stream (or ``stream``, a raw
``cudaStream_t`` as an int) and returns the outputs by name, as torch tensors, without
synchronising. Host-side failures raise :class:`opgen.binding.OpError`; an index out of range is
only seen on the device: :func:`device_status` (which synchronises) reports it.

Only the GPU machine can run this; importing it needs neither torch nor a GPU.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from opgen import dtypes, registry
from opgen.binding import OpError, bind, check_writable_torch, dtype_of, to_numpy
from opgen.runtime import STATUS, TensorDesc, bump_versions, check_args, marshal

TORCH_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "i8": "int8",
               "i16": "int16", "i32": "int32", "i64": "int64", "u8": "uint8", "u16": "uint16",
               "u32": "uint32", "u64": "uint64", "bool": "bool"}


def library_path() -> Path:
    env = os.environ.get("OPGEN_CUDA_LIB")
    return Path(env) if env else registry.REPO_ROOT / "build" / "cuda" / "libopgen_cuda.so"


@cache
def load(path: str | None = None) -> ctypes.CDLL:
    """Load the CUDA library (default: build/cuda/libopgen_cuda.so, or $OPGEN_CUDA_LIB)."""
    p = Path(path) if path else library_path()
    if not p.exists():
        raise FileNotFoundError(f"{p} does not exist; run 'opgen build --cuda' first (needs nvcc)")
    lib = ctypes.CDLL(str(p))
    lib.opgen_cuda_last_error.restype = ctypes.c_char_p
    lib.opgen_cuda_device_status.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.opgen_cuda_device_status.restype = ctypes.c_int
    return lib


def dtype_name(t: Any) -> str:
    """opgen dtype name of a torch tensor."""
    rev = {v: k for k, v in TORCH_NAMES.items()}
    return rev[str(t.dtype).removeprefix("torch.")]


def to_device(x: Any, device: Any = None) -> Any:
    """A torch CUDA tensor holding ``x`` (a torch tensor is moved, a numpy array copied)."""
    import torch

    if isinstance(x, torch.Tensor):
        return x if x.is_cuda else x.to(device or "cuda")
    a = np.asarray(x)
    if a.dtype == dtypes.BF16.np_dtype:
        t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    else:
        t = torch.from_numpy(np.ascontiguousarray(a))
    return t.to(device or "cuda")


def to_host(t: Any) -> np.ndarray:
    """numpy copy of a torch tensor (bf16 as ml_dtypes.bfloat16)."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtypes.BF16.np_dtype)
    return t.numpy()


def describe(t: Any, what: str = "tensor") -> tuple[TensorDesc, tuple[Any, ...]]:
    """An opgen_tensor_t for a torch CUDA tensor (plus the ctypes arrays that must outlive it);
    :class:`OpError` ``dtype`` for a torch dtype opgen has no code for."""
    shape = (ctypes.c_int64 * max(t.dim(), 1))(*t.shape)
    strides = (ctypes.c_int64 * max(t.dim(), 1))(*t.stride())
    try:
        d = dtypes.BY_NAME[dtype_name(t)]
    except KeyError:
        raise OpError("dtype", f"{what}: unsupported dtype {t.dtype}") from None
    desc = TensorDesc(t.data_ptr() if t.numel() else None, dtypes.code(d), t.dim(), shape, strides)
    return desc, (shape, strides, t)


def prepare(op_name: str, lib: ctypes.CDLL | None = None, stream: int | None = None,
            workspace: Any = None, **args: Any) -> tuple[Any, dict[str, Any]]:
    """Bind ``op_name``'s arguments once: returns ``(launch, outputs)``, where ``launch()``
    enqueues the call (the C entry point with the marshalled arguments, nothing else; raises
    :class:`OpError` on a failing status) and ``outputs`` are the output tensors by name. For
    timing the library without the Python binding, and for replaying one call."""
    import torch

    o = registry.get(op_name)
    lib = lib or load()
    sig = o.signature
    args = {k: v for k, v in args.items() if v is not None}
    check_args(o, args)
    missing = [p.name for p in sig.outputs if p.name not in args and not p.optional]
    if missing:  # shapes from the binding (on host copies)
        host = {k: (to_host(v) if isinstance(v, torch.Tensor) else v) for k, v in args.items()}
        b = bind(o, host)
        for name in missing:
            args[name] = np.zeros_like(b.outputs[name])

    def device_arg(p: Any, v: Any) -> tuple[Any, Any, Any]:
        what = f"{o.name}: '{p.name}'"
        if isinstance(v, torch.Tensor):
            if p.is_output:  # written in place (a host tensor is copied: the copy is returned)
                check_writable_torch(v, what)
        else:
            v = to_numpy(v, what)
            dtype_of(v, what)
        t = to_device(v)
        return (t, *describe(t, what))

    cargs, outs, keep = marshal(sig, args, device_arg, o.name)
    if stream is None:
        stream = torch.cuda.current_stream().cuda_stream
    ws_ptr = ctypes.c_void_p(workspace.data_ptr()) if workspace is not None else None
    ws_size = ctypes.c_size_t(workspace.numel() * workspace.element_size() if workspace is not None else 0)
    fn = getattr(lib, f"opgen_cuda_{o.name}")
    full = (*cargs, ws_ptr, ws_size, ctypes.c_void_p(stream))

    def launch() -> None:
        st = fn(*full)
        _ = keep, workspace  # the marshalled descriptors and buffers live as long as launch
        if st != 0:
            msg = lib.opgen_cuda_last_error().decode()
            raise OpError(STATUS.get(st, "internal"), f"status {st}: {msg}")

    return launch, outs


def call(op_name: str, lib: ctypes.CDLL | None = None, stream: int | None = None,
         workspace: Any = None, **args: Any) -> dict[str, Any]:
    """Enqueue ``op_name`` through ``opgen_cuda_<op>``; returns the output tensors by name."""
    launch, outs = prepare(op_name, lib, stream, workspace, **args)
    launch()
    bump_versions(outs.values())
    return outs


def workspace_size(op_name: str, lib: ctypes.CDLL | None = None, **args: Any) -> int:
    """Bytes of workspace ``opgen_cuda_<op>`` needs for these (torch CUDA) arguments."""
    o = registry.get(op_name)
    lib = lib or load()
    cargs, _, _keep = marshal(o.signature, args, lambda p, v: (v, *describe(v, f"{o.name}: '{p.name}'")), o.name)
    size = ctypes.c_size_t(0)
    st = getattr(lib, f"opgen_cuda_{o.name}_workspace_size")(*cargs, ctypes.byref(size))
    if st != 0:
        msg = lib.opgen_cuda_last_error().decode()
        raise OpError(STATUS.get(st, "internal"), f"status {st}: {msg}")
    return int(size.value)


def device_status(stream: int | None = None, clear: bool = True, lib: ctypes.CDLL | None = None) -> int:
    """Synchronise and return the device-side status word (0, or 6 = index out of range)."""
    import torch

    lib = lib or load()
    if stream is None:
        stream = torch.cuda.current_stream().cuda_stream
    return int(lib.opgen_cuda_device_status(ctypes.c_void_p(stream), int(clear)))
