"""Every op of the ops directory as a PyTorch custom op, ``torch.ops.opgen.<op>``.

The schema follows the DSL signature: tensor inputs (``Tensor?`` when optional), attributes
(``float``/``int``/``bool`` with their defaults) and size parameters (``int``), in signature
order; the op returns its required outputs, allocated by the call (optional outputs are not
exposed). CPU tensors run on the CPU library (``opgen.runtime``), CUDA tensors on the CUDA
library on torch's current stream (``opgen.runtime_cuda``); a fake implementation gives
the outputs' shapes and dtypes from the inputs' (the binding's own shape rules), so
``torch.compile`` traces calls without graph breaks. Failures raise
:class:`opgen.binding.OpError` (status and message, nothing written).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
import torch

from opgen import binding, dtypes, registry, runtime
from opgen.dsl.opdef import OpDef
from opgen.dsl.spec import AttrSpec, SizeSpec, TensorSpec

NAMESPACE = "opgen"

#: opgen dtype name -> torch dtype
TORCH_DTYPES = {"bool": torch.bool, "i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
                "u8": torch.uint8, "u16": torch.uint16, "u32": torch.uint32, "u64": torch.uint64,
                "f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
_FROM_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def _default(spec: AttrSpec) -> str:
    v = spec.default
    if spec.dtype == dtypes.BOOL:
        return "True" if v else "False"
    if spec.dtype == dtypes.F32:
        return repr(float(v))  # type: ignore[arg-type]
    return str(int(v))  # type: ignore[arg-type]


def schema(o: OpDef) -> str:
    """The op's torch schema (without its name): ``(Tensor grad_y, ..., float eps=0.0) -> (Tensor, Tensor)``."""
    args = []
    for p in o.signature.params:
        if isinstance(p.spec, TensorSpec):
            if p.is_output:
                continue
            args.append(f"Tensor? {p.name}=None" if p.optional else f"Tensor {p.name}")
        elif isinstance(p.spec, AttrSpec):
            t = {"f32": "float", "i64": "int", "bool": "bool"}[p.spec.dtype.name]
            args.append(f"{t} {p.name}" + (f"={_default(p.spec)}" if p.spec.has_default else ""))
        else:
            assert isinstance(p.spec, SizeSpec)
            args.append(f"int {p.name}")
    outs = returned(o)
    ret = "Tensor" if len(outs) == 1 else f"({', '.join('Tensor' for _ in outs)})"
    return f"({', '.join(args)}) -> {ret}"


def returned(o: OpDef) -> list[str]:
    """The outputs the custom op returns (the required ones, signature order)."""
    return [p.name for p in o.signature.outputs if not p.optional]


def _inputs(o: OpDef) -> list[str]:
    return [p.name for p in o.signature.params if not p.is_output]


def _standin(t: torch.Tensor) -> np.ndarray:
    """A numpy array with ``t``'s shape and dtype and no memory of its size (for binding shapes):
    strides 0 except the last axis'."""
    if t.dtype not in _FROM_TORCH:
        raise binding.OpError("dtype", f"unsupported torch dtype {t.dtype}")
    dt = dtypes.BY_NAME[_FROM_TORCH[t.dtype]].np_dtype
    if t.dim() == 0:
        return np.zeros((), dt)
    base = np.zeros(max(t.shape[-1], 1), dt)
    strides = (0,) * (t.dim() - 1) + (dt.itemsize,)
    return np.lib.stride_tricks.as_strided(base, tuple(t.shape), strides, writeable=False)


def _outputs(o: OpDef, kw: dict[str, Any], meta: bool, device: torch.device,
             zeroed: frozenset[str]) -> dict[str, torch.Tensor]:
    """The required outputs, allocated on ``device``: shapes and dtypes as the binding finds
    them (``meta``: from the tensors' shapes and dtypes alone, through stand-ins), remembered per
    op and argument layout (:func:`opgen.runtime.output_plan`); zero-filled if named in
    ``zeroed``, else uninitialised."""
    args = {k: (_standin(v) if meta and isinstance(v, torch.Tensor) else v) for k, v in kw.items() if v is not None}
    out = {}
    for name, shape, dt, *_ in runtime.output_plan(o, args, returned(o)):
        make = torch.zeros if name in zeroed else torch.empty
        out[name] = make(shape, dtype=TORCH_DTYPES[dt.name], device=device)
    return out


def _device(kw: dict[str, Any]) -> torch.device:
    for v in kw.values():
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


def _run_cpu(name: str, **kw: Any) -> None:
    runtime.call(name, lib=library(), **kw)


def _run_cuda(name: str, **kw: Any) -> None:
    """CUDA tensors: the CUDA library (``opgen build --cuda``; ``opgen.runtime_cuda``), enqueued
    on torch's current stream without synchronising."""
    from opgen import runtime_cuda

    runtime_cuda.call(name, **kw)


def _impl(o: OpDef, run: Callable[..., None] | None, meta: bool) -> Callable[..., Any]:
    """An implementation of ``o``'s custom op: bind the arguments (``meta``: from their shapes
    and dtypes alone, no copy to the host), allocate the outputs, and ``run`` the library on them
    (None: the fake implementation, which only allocates)."""
    names = _inputs(o)
    # the outputs the op reads before writing them start from zeros (the fake implementation's
    # are never read)
    zeroed = frozenset() if run is None else frozenset(n for n in returned(o) if binding.reads_prior_contents(o, n))

    def impl(*args: Any) -> Any:
        kw = dict(zip(names, args, strict=False))  # (trailing defaults may be left out)
        outs = _outputs(o, kw, meta, _device(kw), zeroed)
        if run is not None:
            run(o.name, **{k: v for k, v in kw.items() if v is not None}, **outs)
        vals = tuple(outs[n] for n in returned(o))
        return vals[0] if len(vals) == 1 else vals

    return impl


@cache
def library() -> Any:
    """The CPU library the custom ops run on (``opgen.runtime.load()``: build/cpu/libopgen.so or
    ``$OPGEN_LIB``)."""
    return runtime.load()


_LIBS: list[torch.library.Library] = []


@cache
def register() -> tuple[str, ...]:
    """Define ``torch.ops.opgen.<op>`` for every op of the ops directory (once per process);
    returns the op names."""
    lib = torch.library.Library(NAMESPACE, "DEF")
    _LIBS.append(lib)  # (a Library must stay alive for its definitions to stay registered)
    names = []
    for name, o in registry.load_all().items():
        qual = f"{NAMESPACE}::{name}"
        lib.define(name + schema(o))
        torch.library.impl(qual, "cpu", lib=lib)(_impl(o, _run_cpu, meta=False))
        torch.library.impl(qual, "cuda", lib=lib)(_impl(o, _run_cuda, meta=True))
        torch.library.register_fake(qual, lib=lib)(_impl(o, None, meta=True))
        names.append(name)
    return tuple(names)
