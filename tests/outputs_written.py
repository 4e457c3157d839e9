"""Every element of every output a kernel does not read is written by the kernel: the Python API
allocates such outputs uninitialised (opgen/binding.py ``allocate_output``), as PyTorch's does
(opgen/torch/ops.py) and as a C ABI caller's buffers are. Shared by the tests of each set of ops:
each call runs three times on outputs given filled with the bytes 0x00, 0xFF (NaN, -1) and 0x7F,
and the results must be the same bytes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from opgen import binding, runtime
from opgen.binding import OpError
from opgen.cli import random_inputs
from opgen.dsl.opdef import OpDef


def _filled(shape: tuple[int, ...], dt: np.dtype, byte: int) -> np.ndarray:
    a = binding.aligned_zeros(shape, dt)
    a.reshape(-1).view(np.uint8)[...] = byte
    return a


def outputs_written(o: OpDef, lib: Any, args: dict[str, Any]) -> list[str]:
    """The outputs of one call (``args``: its inputs, and any output whose shape the inputs do
    not bind, as a template) that the kernel does not read and whose bytes depend on what the
    buffer held before (none, when every element is written). Raises OpError when the call is
    rejected."""
    given = {p.name: args[p.name] for p in o.signature.outputs if p.name in args}
    inputs = {k: v for k, v in args.items() if k not in given}
    meta = {k: (np.shape(v), np.asarray(v).dtype) for k, v in given.items()}
    meta |= {k: (s, d.np_dtype) for k, (s, d) in binding.bind(o, args, allocate=False).output_meta.items()}
    runs = []
    for byte in (0x00, 0xFF, 0x7F):
        outs = {k: _filled(s, d, byte) for k, (s, d) in meta.items()}
        runtime.call(o.name, lib=lib, **inputs, **outs)
        runs.append({k: v.reshape(-1).view(np.uint8).copy() for k, v in outs.items()})
    return [k for k in runs[0] if not binding.reads_prior_contents(o, k)
            and not all(np.array_equal(runs[0][k], r[k]) for r in runs[1:])]


def random_calls(o: OpDef, limit: int = 4) -> list[dict[str, Any]]:
    """Random inputs (opgen.cli.random_inputs) for up to ``limit`` dtype bindings of ``o``, each
    at every dim 16 and at every dim 37 (tails of the kernels' strips and lanes)."""
    dv = o.signature.dtype_vars()
    members = [[m.name for m in v.members] for v in dv.values()]
    combos = [dict(zip(dv, c, strict=True)) for c in itertools.product(*members)]
    outs = {p.name for p in o.signature.outputs}
    calls = []
    for c in (combos or [{}])[:limit]:
        for dims in ({}, {d: 37 for d in o.signature.dims()}):
            calls.append({k: v for k, v in random_inputs(o, dims, c, 0).items() if k not in outs})
    return calls


def assert_every_output_written(ops: dict[str, OpDef], lib: Any, calls: dict[str, list[dict[str, Any]]] | None = None,
                                ) -> None:
    """Each op of ``ops`` (name -> op) on ``calls[name]`` (default: :func:`random_calls`): at least
    one call accepted per op, and no output left partly unwritten."""
    failures, unexercised = [], []
    for name, o in sorted(ops.items()):
        ran = 0
        for args in (calls or {}).get(name) or random_calls(o):
            try:
                left = outputs_written(o, lib, args)
            except OpError:
                continue
            ran += 1
            failures += [f"{name}: {k} ({ {k: getattr(v, 'shape', v) for k, v in args.items()} })" for k in left]
        if not ran:
            unexercised.append(name)
    assert not unexercised, f"no accepted call for {unexercised}"
    assert not failures, "outputs partly left unwritten:\n" + "\n".join(failures)
