"""Run aclnn cases through the Ascend library (kernels on the CPU model) and the CPU library.

Used as a subprocess by tests/test_ascendc_aclnn.py, since the model aborts the process on a
broken hardware rule:

    OPGEN_LIB=CPU_LIB OPGEN_OPS_DIR=OPS python -m tests.ascendc_aclnn_worker ASCEND_LIB CASES.pkl OUT.pkl

``CASES.pkl`` holds a list of :class:`Case`. Every case runs twice, on fresh copies of its arrays:
through the Ascend library's ``aclnn<Name>GetWorkspaceSize`` / ``aclnn<Name>`` (side ``asc``) and
through the CPU library's (side ``cpu``); the aclTensors of both come from the CPU library's
``aclCreateTensor`` (``$OPGEN_LIB``, loaded RTLD_GLOBAL first: it plays CANN's host side, so the
Ascend facade's accessor calls and aclrt* calls resolve to it). The oracle runs on the case's
inputs. ``OUT.pkl`` maps each case name to ``{"asc": Result, "cpu": Result, "ref": outputs or
status}``; the test makes every assertion. Nothing here compares a library with itself.
"""

from __future__ import annotations

import copy
import ctypes
import itertools
import os
import pickle
import sys
from ctypes import POINTER, byref, c_int, c_int64, c_uint64, c_void_p
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opgen import dtypes, oracle, registry  # noqa: E402
from opgen.abi import Aclnn  # noqa: E402
from opgen.binding import OpError  # noqa: E402
from opgen.emit import facades  # noqa: E402

ACL_FORMAT_ND = 2
#: fake aclrtStream values, one per call (never dereferenced: the CPU library ignores streams, the
#: model records the last launch's)
_STREAMS = itertools.count(0x5EA0000, 0x100)
_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "bool": ctypes.c_bool, "int64_t": c_int64,
           "uint64_t": c_uint64}


@dataclass
class View:
    """``shape``/``strides`` (elements) starting ``offset`` elements into ``base``: the aclTensor's
    data pointer is ``base``'s, its storage all of ``base``."""

    base: np.ndarray
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def array(self) -> np.ndarray:
        flat = self.base.reshape(-1)
        return np.lib.stride_tricks.as_strided(flat[self.offset:], self.shape,
                                               tuple(s * flat.itemsize for s in self.strides))


@dataclass
class Case:
    """One aclnn call sequence. ``tensors``: every tensor argument (a C-contiguous array, a
    :class:`View`, or None for a NULL aclTensor); ``acl_dtype``/``acl_format``: what the aclTensor
    claims instead; ``misaligned``: tensors whose data start one byte past an aligned address;
    ``null``: arguments passed as NULL (``workspaceSize``, ``executor`` in phase 1; ``workspace``,
    ``executor2`` in phase 2); ``short``: bytes fewer than needed given to phase 2; ``executor``:
    ``own`` (phase 2 once), ``reuse`` (twice), ``other-op`` (first to op ``other``'s phase 2, then
    to its own), ``other-lib`` (first to the other library's phase 2 of this op, then its own)."""

    name: str
    op: str
    tensors: dict[str, np.ndarray | View | None]
    scalars: dict[str, Any] = field(default_factory=dict)
    acl_dtype: dict[str, int] = field(default_factory=dict)
    acl_format: dict[str, int] = field(default_factory=dict)
    misaligned: tuple[str, ...] = ()
    null: tuple[str, ...] = ()
    short: int = 0
    executor: str = "own"
    other: str = ""


@dataclass
class Result:
    statuses: list[int]  # phase 1, then every phase-2 call
    workspace_size: int
    buffers: dict[str, np.ndarray]  # each tensor's whole buffer after the calls (base of a view)
    views: dict[str, np.ndarray]  # each tensor's view after the calls
    stream_forwarded: bool | None  # asc, a successful phase 2 that launched: the launch got our stream
    error: str = ""


class Entries:
    """ctypes access to one library's aclnn entries of one op (argument lists from its declaration)."""

    def __init__(self, lib: ctypes.CDLL, op: str):
        o = registry.get(op)
        f = next(f for f in o.abis if isinstance(f, Aclnn))
        self.o, self.m = o, facades.aclnn_model(o, f)
        self.ws_fn = getattr(lib, f"aclnn{self.m.name}GetWorkspaceSize")
        self.ws_fn.argtypes = [*(c_void_p if "tensor" in a else _CTYPES[a["scalar"].c_type] for a in self.m.args),
                               POINTER(c_uint64), POINTER(c_void_p)]
        self.run_fn = getattr(lib, f"aclnn{self.m.name}")
        self.run_fn.argtypes = [c_void_p, c_uint64, c_void_p, c_void_p]

    def scalar(self, scalars: dict[str, Any], param: str) -> Any:
        if param in scalars:
            return scalars[param]
        return next(p.spec for p in self.o.signature.params if p.name == param).default  # type: ignore[attr-defined]


class Libraries:
    def __init__(self, asc_path: str):
        # CANN's host side (aclCreateTensor, the accessors, aclrt*) is the CPU library's: loaded
        # RTLD_GLOBAL before the Ascend library, whose undefined acl* symbols then resolve to it
        self.cpu = ctypes.CDLL(os.environ["OPGEN_LIB"], mode=ctypes.RTLD_GLOBAL)
        self.asc = ctypes.CDLL(asc_path)
        self.cpu.opgen_last_error.restype = ctypes.c_char_p
        self.asc.opgen_ascendc_last_error.restype = ctypes.c_char_p
        self.asc.ascendc_model_last_stream.restype = c_void_p
        L = self.cpu
        L.aclCreateTensor.restype = c_void_p
        L.aclCreateTensor.argtypes = [POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int,
                                      POINTER(c_int64), c_uint64, c_void_p]
        L.aclDestroyTensor.argtypes = [c_void_p]
        self.entries: dict[tuple[str, str], Entries] = {}

    def lib(self, side: str) -> ctypes.CDLL:
        return self.asc if side == "asc" else self.cpu

    def get(self, side: str, op: str) -> Entries:
        if (side, op) not in self.entries:
            self.entries[side, op] = Entries(self.lib(side), op)
        return self.entries[side, op]

    def error(self, side: str) -> str:
        fn = self.asc.opgen_ascendc_last_error if side == "asc" else self.cpu.opgen_last_error
        return (fn() or b"").decode()


def _misaligned(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(raw buffer, copy of ``a`` starting one byte past a 64-byte boundary inside it)."""
    raw = np.zeros(a.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + 1
    out = np.frombuffer(raw[start:start + a.nbytes].data, dtype=a.dtype).reshape(a.shape)
    out[...] = a
    return raw, out


def _tensor(L: ctypes.CDLL, view: np.ndarray, base: np.ndarray, dtype: int, fmt: int) -> int:
    """An aclTensor (the CPU library's aclCreateTensor) of ``view``, whose storage is ``base``."""
    n = max(view.ndim, 1)
    dims = (c_int64 * n)(*view.shape)
    strides = (c_int64 * n)(*(s // view.itemsize for s in view.strides))
    offset = (view.ctypes.data - base.ctypes.data) // view.itemsize
    storage = (c_int64 * 1)(base.nbytes // view.itemsize)
    t = L.aclCreateTensor(dims, view.ndim, dtype, strides, offset, fmt, storage, 1, base.ctypes.data)
    assert t, "aclCreateTensor refused a valid view"
    return t


def run_side(libs: Libraries, case: Case, side: str) -> Result:
    c = copy.deepcopy(case)  # each side writes its own buffers
    e = libs.get(side, c.op)
    other = "cpu" if side == "asc" else "asc"
    buffers: dict[str, np.ndarray] = {}
    views: dict[str, np.ndarray] = {}
    handles: dict[str, int | None] = {}
    made: list[int] = []
    for name, t in c.tensors.items():
        if t is None:
            handles[name] = None
            continue
        if isinstance(t, View):
            base, view = t.base, t.array()
        elif name in c.misaligned:
            base, view = _misaligned(t)
        else:
            base = view = t
        dt = c.acl_dtype.get(name, dtypes.from_numpy(view.dtype).acl)
        if name in c.misaligned:  # the whole (misaligned) array is the storage
            h = _tensor(libs.cpu, view, view, dt, c.acl_format.get(name, ACL_FORMAT_ND))
        else:
            h = _tensor(libs.cpu, view, base, dt, c.acl_format.get(name, ACL_FORMAT_ND))
        handles[name] = h
        made.append(h)
        buffers[name], views[name] = base, view
    args = []
    for a in e.m.args:
        if "tensor" in a:
            args.append(handles.get(a["tensor"].param))
        else:
            s = a["scalar"]
            args.append(_CTYPES[s.c_type](e.scalar(c.scalars, s.param)))
    size, ex = c_uint64(0), c_void_p()
    st = e.ws_fn(*args, None if "workspaceSize" in c.null else byref(size),
                 None if "executor" in c.null else byref(ex))
    statuses, err, forwarded = [st], libs.error(side) if st else "", None
    if st == 0:
        need = size.value
        ws = np.zeros(need + 64, np.uint8)
        ws_ptr = None if "workspace" in c.null else ws.ctypes.data + (-ws.ctypes.data) % 64
        stream = c_void_p(next(_STREAMS))  # a distinct "stream" per case: the model only records it
        before = libs.asc.ascendc_model_last_stream()
        run_ex = None if "executor2" in c.null else ex
        n = need - c.short
        if c.executor == "other-op":
            statuses.append(libs.get(side, c.other).run_fn(ws_ptr, n, run_ex, stream))
        elif c.executor == "other-lib":
            statuses.append(libs.get(other, c.op).run_fn(ws_ptr, n, run_ex, stream))
        statuses.append(e.run_fn(ws_ptr, n, run_ex, stream))
        last = libs.asc.ascendc_model_last_stream()
        if statuses[-1] == 0 and side == "asc" and last != before:  # (empty tensors launch nothing)
            forwarded = last == stream.value
        if c.executor == "reuse":
            statuses.append(e.run_fn(ws_ptr, n, run_ex, stream))
        err = next((libs.error(side) for s in statuses[1:] if s), "")
    for h in made:
        assert libs.cpu.aclDestroyTensor(h) == 0
    return Result(statuses, size.value, {k: np.array(v) for k, v in buffers.items()},
                  {k: np.array(v) for k, v in views.items()}, forwarded, err)


def reference(case: Case) -> dict[str, np.ndarray] | str:
    """The oracle's outputs for the case's inputs (views materialised), or its status."""
    o = registry.get(case.op)
    outputs = {p.name for p in o.signature.outputs}
    args: dict[str, Any] = dict(case.scalars)
    for k, t in case.tensors.items():
        if t is not None and k not in outputs:
            args[k] = np.array(t.array() if isinstance(t, View) else t)
    try:
        return oracle.run(o, **args)
    except OpError as e:
        return e.status


def main() -> None:
    asc_path, cases_path, out_path = sys.argv[1:4]
    cases: list[Case] = pickle.loads(Path(cases_path).read_bytes())
    libs = Libraries(asc_path)
    out = {c.name: {"asc": run_side(libs, c, "asc"), "cpu": run_side(libs, c, "cpu"), "ref": reference(c)}
           for c in cases}
    Path(out_path).write_bytes(pickle.dumps(out))
    print(f"{len(cases)} case(s)")


if __name__ == "__main__":
    # run as the importable module, so that the pickled Case/View/Result classes are its own
    from tests import ascendc_aclnn_worker

    ascendc_aclnn_worker.main()
