"""The vendor C ABI facades (infiniop, aclnn) generated from the ops' ``@op(abi=[...])``
declarations, on the CPU library ``build/cpu/libopgen.so``:

(a) plain C programs (tests/c/*.c) written against InfiniCore's ``<infiniop.h>`` and CANN's
    ``acl/acl.h`` + ``aclnnop/...`` headers, compiled with gcc (and g++) against generated/include
    and linked to the library, checked against PyTorch float64;
(b) ctypes calls of every declared facade against the oracle, and the status codes of bad input
    (the outputs then keep their prior contents);
(c) header checks (C and C++, vendor enum values) and a new op getting its facades with no
    change outside its own file.

``$OPGEN_LIB`` selects another library (as for :mod:`opgen.runtime`), ``$OPGEN_INCLUDE`` another
header directory.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from ctypes import POINTER, byref, c_int, c_int64, c_size_t, c_ssize_t, c_uint64, c_void_p
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from opgen import compile as cc
from opgen import dtypes, oracle, registry, runtime
from opgen.abi import Aclnn, Infiniop
from opgen.dsl.spec import AttrSpec, DSLError
from opgen.emit import cpu, facades
from tests.reference import MARGIN, NP, assert_close_policy, f64, rounded, t64, tt

INCLUDE = Path(os.environ.get("OPGEN_INCLUDE", registry.REPO_ROOT / "generated" / "include"))
C_DIR = Path(__file__).parent / "c"
SEEDS = registry.REPO_ROOT.parent / "shared" / "seeds"
GCC = shutil.which("gcc")
GXX = shutil.which("g++")

# Vendor values from SPEC §6 (written out here, independent of opgen.emit.facades' tables).
INFINI = {"SUCCESS": 0, "INTERNAL_ERROR": 1, "BAD_PARAM": 3, "NULL_POINTER": 4, "BAD_TENSOR_DTYPE": 10,
          "BAD_TENSOR_SHAPE": 11, "BAD_TENSOR_STRIDES": 12, "INSUFFICIENT_WORKSPACE": 13}
ACLNN = {"SUCCESS": 0, "PARAM_NULLPTR": 161001, "PARAM_INVALID": 161002, "RUNTIME_ERROR": 361001,
         "INNER": 561000}
ACL_FORMAT_ND, ACL_FORMAT_FRACTAL_NZ = 2, 29


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    path = runtime.library_path()
    if not path.exists():
        pytest.skip(f"{path} does not exist; run 'opgen build'")
    lib = ctypes.CDLL(str(path))
    lib.opgen_last_error.restype = ctypes.c_char_p
    return lib


def facade(op_name: str, kind: type) -> Any:
    o = registry.get(op_name)
    f = next(f for f in o.abis if isinstance(f, kind))
    return o, (facades.infiniop_model(o, f) if kind is Infiniop else facades.aclnn_model(o, f))


_CTYPES = {"float": ctypes.c_float, "double": ctypes.c_double, "char": ctypes.c_byte, "bool": ctypes.c_bool,
           "int64_t": c_int64, "uint64_t": c_uint64, "int32_t": ctypes.c_int32, "size_t": c_size_t}


def _scalar(c_type: str, value: Any) -> Any:
    t = _CTYPES[c_type]
    if c_type in ("uint64_t", "size_t") and int(value) < 0:
        value = int(value) + 2**64  # e.g. paddingIdx -1 -> UINT64_MAX
    return t(value)


def _value(o: Any, scalars: dict[str, Any], param: str) -> Any:
    """The value given for scalar ``param``, else its DSL default."""
    if param in scalars:
        return scalars[param]
    spec = next(p.spec for p in o.signature.params if p.name == param)
    assert isinstance(spec, AttrSpec) and spec.has_default
    return spec.default


def _elem_strides(a: np.ndarray) -> list[int]:
    assert all(s % a.itemsize == 0 for s in a.strides)
    return [s // a.itemsize for s in a.strides]


# ------------------------------------------------------------------------------------ infiniop
class Infini:
    """ctypes access to the infiniop facade of one op (argument lists from its declaration)."""

    def __init__(self, lib: ctypes.CDLL, op_name: str):
        self.lib = lib
        self.o, self.m = facade(op_name, Infiniop)
        lib.infiniopCreateHandle.argtypes = [POINTER(c_void_p)]
        lib.infiniopCreateTensorDescriptor.argtypes = [POINTER(c_void_p), c_size_t, POINTER(c_size_t),
                                                       POINTER(c_ssize_t), c_int]
        for fn in ("infiniopDestroyHandle", "infiniopDestroyTensorDescriptor",
                   f"infiniopDestroy{self.m.name}Descriptor"):
            getattr(lib, fn).argtypes = [c_void_p]
        self.handle = c_void_p()
        assert lib.infiniopCreateHandle(byref(self.handle)) == 0
        self.keep: list[Any] = []

    def close(self) -> None:
        assert self.lib.infiniopDestroyHandle(self.handle) == 0

    def tensor(self, a: np.ndarray, dtype: int | None = None, contiguous_null: bool = False) -> c_void_p:
        d = c_void_p()
        shape = (c_size_t * max(a.ndim, 1))(*a.shape)
        strides = None if contiguous_null else (c_ssize_t * max(a.ndim, 1))(*_elem_strides(a))
        dt = dtypes.from_numpy(a.dtype).infini if dtype is None else dtype
        st = self.lib.infiniopCreateTensorDescriptor(byref(d), a.ndim, shape, strides, dt)
        assert st == 0, st
        self.keep.append(d)
        return d

    def create(self, descs: dict[str, c_void_p | None], scalars: dict[str, Any], ext: str = "",
               handle: Any = "self", desc_ptr: bool = True) -> tuple[int, c_void_p]:
        entry = next(e for e in self.m.extensions if e["suffix"] == ext)
        args: list[Any] = [self.handle if handle == "self" else handle]
        out = c_void_p()
        args.append(byref(out) if desc_ptr else None)
        args += [descs.get(t.param) for t in self.m.tensors]
        for s in [*self.m.scalars, *entry["args"]]:
            args.append(_scalar(s.c_type, _value(self.o, scalars, s.param)))
        fn = getattr(self.lib, f"infiniopCreate{self.m.name}Descriptor{ext}")
        fn.argtypes = [c_void_p, POINTER(c_void_p), *[c_void_p] * len(self.m.tensors),
                       *[_CTYPES[s.c_type] for s in [*self.m.scalars, *entry["args"]]]]
        return fn(*args), out

    def workspace_size(self, desc: c_void_p) -> int:
        fn = getattr(self.lib, f"infiniopGet{self.m.name}WorkspaceSize")
        fn.argtypes = [c_void_p, POINTER(c_size_t)]
        size = c_size_t()
        assert fn(desc, byref(size)) == 0
        return size.value

    def run(self, desc: c_void_p, data: dict[str, np.ndarray | None], workspace: Any = None,
            workspace_size: int | None = None, null: tuple[str, ...] = ()) -> int:
        args: list[Any] = [desc]
        types: list[Any] = [c_void_p]
        if self.m.workspace:
            if workspace_size is None:
                workspace_size = self.workspace_size(desc) if desc else 0
            if workspace is None:
                workspace = np.zeros(max(workspace_size, 1), np.uint8)
                self.keep.append(workspace)
            args += [workspace.ctypes.data if isinstance(workspace, np.ndarray) else workspace,
                     workspace_size]
            types += [c_void_p, c_size_t]
        for a in self.m.data:
            arr = data.get(a.param)
            args.append(None if arr is None or a.param in null else arr.ctypes.data)
            types.append(c_void_p)
        args.append(None)
        types.append(c_void_p)
        fn = getattr(self.lib, f"infiniop{self.m.name}")
        fn.argtypes = types
        return fn(*args)

    def destroy(self, desc: c_void_p) -> int:
        return getattr(self.lib, f"infiniopDestroy{self.m.name}Descriptor")(desc)

    def call(self, arrays: dict[str, np.ndarray | None], scalars: dict[str, Any] | None = None,
             ext: str = "") -> tuple[int, str]:
        """Create (descriptors from ``arrays``), run, destroy; (status, stage that failed)."""
        descs = {k: self.tensor(v) for k, v in arrays.items() if v is not None}
        st, desc = self.create(descs, scalars or {}, ext)
        if st == 0:
            st2 = self.run(desc, arrays)
            assert self.destroy(desc) == 0
            return st2, "run"
        return st, "create"


@pytest.fixture
def infini(lib):
    made: list[Infini] = []

    def make(op_name: str) -> Infini:
        made.append(Infini(lib, op_name))
        return made[-1]

    yield make
    for m in made:
        for d in m.keep:
            if isinstance(d, c_void_p):
                assert lib.infiniopDestroyTensorDescriptor(d) == 0
        m.close()


def assert_near_oracle(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    """A facade result against the oracle (both in the storage dtype; at most rounding apart)."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape, what
    o, r = f64(ours), f64(ref)
    dt = dtypes.from_numpy(ours.dtype).name
    scale = float(np.max(np.abs(r), initial=0.0))
    err = float(np.max(np.abs(o - r), initial=0.0))
    assert err <= MARGIN.get(dt, 0.0) * max(scale, 1.0), f"{what}: error {err:.3e} (scale {scale:.3e})"


def emb_case(rng, T, IT, N=7, D=5, N1=6, N2=4, two=True, acc=(False, True)):
    dy = rounded(rng.standard_normal((N, D)), T)
    i1 = rng.integers(0, N1, N).astype(NP[IT])
    i1[:3] = N1 - 1
    a = {"dy": dy, "i1": i1,
         "dtable1": rounded(rng.standard_normal((N1, D)), T),
         "dtable2": rounded(rng.standard_normal((N2, D)), T) if two else None,
         "i2": rng.integers(0, N2, N).astype(NP[IT]) if two else None}
    s = {"alpha1": 0.5, "alpha2": -2.0 if two else 0.0, "dtable1_acc": acc[0], "dtable2_acc": acc[1]}
    return a, s


def oracle_outputs(op_name: str, arrays: dict[str, Any], scalars: dict[str, Any]) -> dict[str, np.ndarray]:
    args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in {**arrays, **scalars}.items()
            if v is not None}
    return oracle.run(registry.get(op_name), **args)


# ------------------------------------------------------------------------ (b) infiniop vs oracle
@pytest.mark.parametrize(("T", "IT"), [("f32", "i64"), ("f16", "i32"), ("bf16", "u8"), ("f64", "i16")])
@pytest.mark.parametrize("two", [False, True])
def test_infiniop_embedding_backward_matches_oracle(infini, rng, T, IT, two):
    e = infini("embedding_backward")
    a, s = emb_case(rng, T, IT, two=two)
    want = oracle_outputs("embedding_backward", a, s)
    st, stage = e.call(a, s)
    assert st == 0, (stage, e.lib.opgen_last_error())
    for k, v in want.items():
        assert_near_oracle(a[k], v, k)


def test_infiniop_embedding_backward_table2_needs_both(infini, rng):
    """dtable2 without i2 (alpha2 = 0) is left as it is; so is the absent dtable2 when i2 is given."""
    e = infini("embedding_backward")
    a, s = emb_case(rng, "f32", "i32")
    want1 = oracle_outputs("embedding_backward", {**a, "i2": None, "dtable2": None},
                           {**s, "alpha2": 0.0})["dtable1"]
    before2 = a["dtable2"].copy()
    b = {**a, "i2": None, "dtable1": a["dtable1"].copy()}
    assert e.call(b, {**s, "alpha2": 0.0}) == (0, "run")
    assert np.array_equal(a["dtable2"], before2)
    assert_near_oracle(b["dtable1"], want1, "dtable1 (no i2)")
    c = {**a, "dtable2": None, "dtable1": a["dtable1"].copy()}
    assert e.call(c, s) == (0, "run")
    assert_near_oracle(c["dtable1"], want1, "dtable1 (no dtable2)")


@pytest.mark.parametrize("T", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape", [(5, 16), (2, 3, 24)])
@pytest.mark.parametrize("ext", ["", "WithEpsilon"])
def test_infiniop_rms_norm_backward_matches_oracle(infini, rng, T, shape, ext):
    e = infini("rms_norm_backward")
    D = shape[-1]
    pad = np.zeros((*shape[:-1], D + 3))  # x with padded rows: non-contiguous batch strides
    x = rounded(pad, T)[..., :D]
    x[...] = rounded(rng.standard_normal(shape), T)
    a = {"grad_y": rounded(rng.standard_normal(shape), T), "x": x,
         "w": rounded(rng.standard_normal(D), T),
         "grad_x": np.full(shape, np.nan, NP[T]), "grad_w": np.full(D, np.nan, NP[T])}
    s = {"eps": 1e-3} if ext else {}
    want = oracle_outputs("rms_norm_backward", {k: v for k, v in a.items() if not k.startswith("grad_")
                                                or k == "grad_y"}, s)
    st, stage = e.call(a, s, ext=ext)
    assert st == 0, (stage, e.lib.opgen_last_error())
    for k in ("grad_x", "grad_w"):
        assert_near_oracle(a[k], want[k], k)


def test_infiniop_rms_norm_backward_in_place(infini, rng):
    """grad_x may alias grad_y (SPEC §3)."""
    e = infini("rms_norm_backward")
    gy = rounded(rng.standard_normal((4, 8)), "f32")
    a = {"grad_y": gy, "x": rounded(rng.standard_normal((4, 8)), "f32"),
         "w": rounded(rng.standard_normal(8), "f32"), "grad_w": np.zeros(8, np.float32)}
    want = oracle_outputs("rms_norm_backward", {k: a[k] for k in ("grad_y", "x", "w")}, {})
    a["grad_x"] = gy
    st, _ = e.call(a)
    assert st == 0
    assert_near_oracle(gy, want["grad_x"], "grad_x (in place)")


# ----------------------------------------------------------------------- (b) infiniop statuses
def test_infiniop_handle_and_descriptor_null_pointers(lib, infini, rng):
    e = infini("rms_norm_backward")
    a = {"grad_y": np.ones((2, 4), np.float32), "x": np.ones((2, 4), np.float32),
         "w": np.ones(4, np.float32), "grad_x": np.zeros((2, 4), np.float32),
         "grad_w": np.zeros(4, np.float32)}
    descs = {k: e.tensor(v) for k, v in a.items()}
    assert lib.infiniopCreateHandle(None) == INFINI["NULL_POINTER"]
    assert e.create(descs, {}, handle=None)[0] == INFINI["NULL_POINTER"]
    assert e.create(descs, {}, desc_ptr=False)[0] == INFINI["NULL_POINTER"]
    assert e.create({**descs, "x": None}, {})[0] == INFINI["NULL_POINTER"]  # a required tensor
    assert lib.infiniopCreateTensorDescriptor(None, 1, (c_size_t * 1)(4), None, 13) == INFINI["NULL_POINTER"]
    d = c_void_p()
    assert lib.infiniopCreateTensorDescriptor(byref(d), 2, None, None, 13) == INFINI["NULL_POINTER"]
    assert lib.infiniopCreateTensorDescriptor(byref(d), 1, (c_size_t * 1)(4), None, 99) \
        == INFINI["BAD_TENSOR_DTYPE"]
    st, desc = e.create(descs, {})
    assert st == 0
    assert e.run(None, a) == INFINI["NULL_POINTER"]
    assert e.run(desc, a, null=("x",)) == INFINI["NULL_POINTER"]
    fn = lib.infiniopGetRMSNormBackwardWorkspaceSize
    fn.argtypes = [c_void_p, c_void_p]
    assert fn(desc, None) == INFINI["NULL_POINTER"]
    assert e.destroy(None) == INFINI["NULL_POINTER"]
    # another op's descriptor is refused
    other = infini("embedding_backward")
    assert other.run(desc, {}) == INFINI["BAD_PARAM"]
    assert other.destroy(desc) == INFINI["BAD_PARAM"]
    dev, dev_id = c_int(-1), c_int(-1)
    assert lib.infiniopGetDescriptorDeviceType(desc, byref(dev)) == 0 and dev.value == 0  # CPU
    assert lib.infiniopGetDescriptorDeviceId(desc, byref(dev_id)) == 0 and dev_id.value == 0
    assert e.destroy(desc) == 0


def test_infiniop_bad_dtype_shape_strides(infini, rng):
    e = infini("embedding_backward")
    a, s = emb_case(rng, "f32", "i32", two=False)

    def create(**over):
        b = {**a, **over}
        descs = {k: e.tensor(v) for k, v in b.items() if v is not None}
        st, desc = e.create(descs, s)
        if st == 0:
            e.destroy(desc)
        return st

    assert create(dy=a["dy"].astype(np.float16)) == INFINI["BAD_TENSOR_DTYPE"]  # dT mismatch
    assert create(i1=a["i1"].astype(np.float32)) == INFINI["BAD_TENSOR_DTYPE"]  # float indices
    assert create(dy=a["dy"].astype(np.int32), dtable1=a["dtable1"].astype(np.int32)) \
        == INFINI["BAD_TENSOR_DTYPE"]
    assert create(dy=a["dy"][:, :4]) == INFINI["BAD_TENSOR_SHAPE"]  # D mismatch
    assert create(i1=a["i1"][:5]) == INFINI["BAD_TENSOR_SHAPE"]  # N mismatch
    assert create(i1=a["i1"].reshape(7, 1)) == INFINI["BAD_TENSOR_SHAPE"]  # rank
    wide = np.zeros((7, 10), np.float32)
    assert create(dy=wide[:, ::2]) == INFINI["BAD_TENSOR_STRIDES"]  # last dim not contiguous
    # a dtype InfiniCore has but opgen does not (C64) is refused at Create
    descs = {k: e.tensor(v) for k, v in a.items() if v is not None}
    descs["dy"] = e.tensor(a["dy"], dtype=17)
    assert e.create(descs, s)[0] == INFINI["BAD_TENSOR_DTYPE"]


def test_infiniop_index_out_of_range_and_alpha2_leave_outputs_untouched(infini, rng):
    e = infini("embedding_backward")
    a, s = emb_case(rng, "f32", "i64", two=True)
    before1, before2 = a["dtable1"].copy(), a["dtable2"].copy()
    bad = dict(a, i2=a["i2"].copy())
    bad["i2"][-1] = 4  # N2 = 4: out of range (the check runs before any output is written)
    st, stage = e.call(bad, s)
    assert (st, stage) == (INFINI["BAD_PARAM"], "run")  # "index" maps to BAD_PARAM
    assert np.array_equal(a["dtable1"], before1) and np.array_equal(a["dtable2"], before2)
    bad["i2"][-1] = -1
    assert e.call(bad, s)[0] == INFINI["BAD_PARAM"]
    # alpha2 != 0 without i2 (SPEC §1): a scalar check, reported by Create already
    st, stage = e.call(dict(a, i2=None, dtable2=None), dict(s, alpha2=1.5))
    assert (st, stage) == (INFINI["BAD_PARAM"], "create")
    assert np.array_equal(a["dtable1"], before1)


def test_infiniop_workspace(infini, rng):
    e = infini("rms_norm_backward")
    a = {"grad_y": rounded(rng.standard_normal((6, 8)), "f32"),
         "x": rounded(rng.standard_normal((6, 8)), "f32"),
         "w": rounded(rng.standard_normal(8), "f32"), "grad_x": np.zeros((6, 8), np.float32),
         "grad_w": np.zeros(8, np.float32)}
    descs = {k: e.tensor(v) for k, v in a.items()}
    st, desc = e.create(descs, {})
    assert st == 0
    need = e.workspace_size(desc)
    assert need > 0
    before = a["grad_x"].copy()
    assert e.run(desc, a, workspace_size=need - 1) == INFINI["INSUFFICIENT_WORKSPACE"]
    assert e.run(desc, a, workspace=None, workspace_size=0) == INFINI["INSUFFICIENT_WORKSPACE"]
    assert e.run(desc, a, workspace=0, workspace_size=need) == INFINI["NULL_POINTER"]
    assert np.array_equal(a["grad_x"], before)
    big = np.zeros(need + 100, np.uint8)
    assert e.run(desc, a, workspace=big, workspace_size=need + 100) == 0
    # the descriptor is reusable, and the tensor descriptors it was made from may be gone
    for k in list(descs):
        assert e.lib.infiniopDestroyTensorDescriptor(descs[k]) == 0
        e.keep.remove(descs[k])
    assert e.run(desc, a) == 0
    assert e.destroy(desc) == 0


# --------------------------------------------------------------------------------- aclnn helpers
class Acl:
    """ctypes access to the aclnn facade of one op (argument lists from its declaration)."""

    def __init__(self, lib: ctypes.CDLL, op_name: str):
        self.lib = lib
        self.o, self.m = facade(op_name, Aclnn)
        lib.aclCreateTensor.restype = c_void_p
        lib.aclCreateTensor.argtypes = [POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int,
                                        POINTER(c_int64), c_uint64, c_void_p]
        lib.aclDestroyTensor.argtypes = [c_void_p]
        self.ws_fn = getattr(lib, f"aclnn{self.m.name}GetWorkspaceSize")
        self.ws_fn.argtypes = [*(c_void_p if "tensor" in a else _CTYPES[a["scalar"].c_type]
                                 for a in self.m.args),
                               POINTER(c_uint64), POINTER(c_void_p)]
        self.run_fn = getattr(lib, f"aclnn{self.m.name}")
        self.run_fn.argtypes = [c_void_p, c_uint64, c_void_p, c_void_p]
        self.tensors: list[int] = []

    def tensor(self, a: np.ndarray, base: np.ndarray | None = None, dtype: int | None = None,
               fmt: int = ACL_FORMAT_ND) -> int:
        """An aclTensor viewing ``a``, ``offset`` elements into ``base`` (default: the array that owns
        ``a``'s memory), whose elements are the storage (the view must lie inside it)."""
        dims = (c_int64 * max(a.ndim, 1))(*a.shape)
        strides = (c_int64 * max(a.ndim, 1))(*_elem_strides(a))
        if base is None:
            base = a
            while isinstance(base.base, np.ndarray):
                base = base.base
        offset = (a.ctypes.data - base.ctypes.data) // a.itemsize
        storage = (c_int64 * 1)(base.nbytes // a.itemsize)
        dt = dtypes.from_numpy(a.dtype).acl if dtype is None else dtype
        t = self.lib.aclCreateTensor(dims, a.ndim, dt, strides, offset, fmt, storage, 1, base.ctypes.data)
        assert t
        self.tensors.append(t)
        return t

    def phase1(self, tensors: dict[str, int | None], scalars: dict[str, Any],
               null_out: bool = False) -> tuple[int, int, c_void_p]:
        args: list[Any] = []
        for a in self.m.args:
            if "tensor" in a:
                args.append(tensors.get(a["tensor"].param))
            else:
                s = a["scalar"]
                args.append(_scalar(s.c_type, _value(self.o, scalars, s.param)))
        size, ex = c_uint64(), c_void_p()
        st = self.ws_fn(*args, None if null_out else byref(size), byref(ex))
        return st, size.value, ex

    def phase2(self, ex: Any, size: int, workspace: Any = "alloc") -> int:
        if isinstance(workspace, str):
            workspace = np.zeros(max(size, 1), np.uint8)
        ptr = workspace.ctypes.data if isinstance(workspace, np.ndarray) else workspace
        return self.run_fn(ptr, size, ex, None)

    def call(self, arrays: dict[str, np.ndarray | None],
             scalars: dict[str, Any] | None = None) -> tuple[int, str]:
        ts = {k: self.tensor(v) for k, v in arrays.items() if v is not None}
        st, size, ex = self.phase1(ts, scalars or {})
        if st != 0:
            return st, "phase1"
        return self.phase2(ex, size), "phase2"

    def close(self) -> None:
        for t in self.tensors:
            assert self.lib.aclDestroyTensor(t) == 0


@pytest.fixture
def acl(lib):
    made: list[Acl] = []

    def make(op_name: str) -> Acl:
        made.append(Acl(lib, op_name))
        return made[-1]

    yield make
    for m in made:
        m.close()


def edb_case(rng, T="f32", IT="i64", shape=(3, 4), D=5, V=7):
    grad = rounded(rng.standard_normal((*shape, D)), T)
    idx = rng.integers(0, V, shape)
    idx.reshape(-1)[:2] = V - 1
    return {"grad": grad, "indices": idx.astype(NP[IT]), "out": np.full((V, D), np.nan, NP[T])}


# --------------------------------------------------------------------------- (b) aclnn vs oracle
@pytest.mark.parametrize(("T", "IT"), [("f32", "i64"), ("f16", "i32"), ("bf16", "f32"), ("f32", "bool"),
                                       ("f32", "u8")])
@pytest.mark.parametrize(("padding", "scale"), [(-1, False), (2**64 - 1, True), (1, True), (3, False)])
def test_aclnn_embedding_dense_backward_matches_oracle(acl, rng, T, IT, padding, scale):
    e = acl("embedding_dense_backward")
    a = edb_case(rng, T, IT)
    if IT == "bool":
        a["indices"] = a["indices"] % 2 == 0
    if IT == "f32":
        a["indices"] = a["indices"] + np.float32(0.5)  # truncation toward zero
    s = {"num_weights": 7, "padding_idx": padding, "scale_grad_by_freq": scale}
    want = oracle_outputs("embedding_dense_backward", {k: a[k] for k in ("grad", "indices")}, s)["out"]
    st, stage = e.call(a, s)
    assert st == 0, (stage, e.lib.opgen_last_error())
    assert_near_oracle(a["out"], want, "out")


def test_aclnn_views_with_offset_and_strides(acl, rng):
    """aclTensor views: the element offset and any strides reach the op (grad transposed, indices
    a strided slice, out a row-padded view into a bigger buffer)."""
    e = acl("embedding_dense_backward")
    gbase = rounded(rng.standard_normal((6, 4, 3)), "f32")
    grad = gbase[1:5].transpose(1, 0, 2)[:, 1:, :]  # (4, 3, 3): offset, permuted strides
    ibase = rng.integers(0, 5, (4, 7)).astype(np.int32)
    indices = ibase[:, 1::2]  # (4, 3), stride 2
    obase = np.full((6, 8), 123.0, np.float32)
    out = obase[1:, 2:5]  # (5, 3), offset 10, row stride 8
    ts = {"grad": e.tensor(grad, base=gbase), "indices": e.tensor(indices, base=ibase),
          "out": e.tensor(out, base=obase)}
    st, size, ex = e.phase1(ts, {"num_weights": 5, "padding_idx": 2})
    assert st == 0
    assert e.phase2(ex, size) == 0
    want = oracle_outputs("embedding_dense_backward", {"grad": grad, "indices": indices},
                          {"num_weights": 5, "padding_idx": 2})["out"]
    assert_near_oracle(np.ascontiguousarray(out), want, "out")
    outside = np.ones(obase.shape, bool)
    outside[1:, 2:5] = False
    assert np.all(obase[outside] == 123.0)


class Flce:
    def __init__(self, rng, T, BT=6, H=8, V=128):
        X = rounded(rng.standard_normal((BT, H)), T)
        W = rounded(rng.standard_normal((V, H)) * 0.5, T)
        logits = f64(X) @ f64(W).T
        lmax = logits.max(axis=1)
        ex = np.exp(logits - lmax[:, None])
        self.a = {"grad": rounded(rng.standard_normal(BT), "f32"), "input": X, "weight": W,
                  "masked_target": rng.integers(0, V, BT).astype(np.int32),
                  "target_mask": np.packbits(rng.random(BT) < 0.4, bitorder="little")}
        self.softmax = rounded(ex / ex.sum(1, keepdims=True), "f32")
        self.logits_max = rounded(lmax, "f32")
        self.sum_exp = rounded(np.exp(logits - f64(self.logits_max)[:, None]).sum(1), "f32")
        self.out = {"input_grad": np.full((BT, H), np.nan, NP[T]),
                    "weight_grad": np.full((V, H), np.nan, NP[T])}

    def args(self, mode: str) -> dict[str, np.ndarray]:
        extra = {"softmax": self.softmax} if mode == "softmax" else \
            {"logits_max": self.logits_max, "sum_exp_logits": self.sum_exp}
        return {**self.a, **extra}


@pytest.mark.parametrize("T", ["f16", "bf16"])
@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
def test_aclnn_fused_linear_cross_entropy_loss_grad_matches_oracle(acl, rng, T, mode):
    e = acl("fused_linear_cross_entropy_loss_grad")
    c = Flce(rng, T)
    want = oracle_outputs("fused_linear_cross_entropy_loss_grad", c.args(mode), {})
    st, stage = e.call({**c.args(mode), **c.out})
    assert st == 0, (stage, e.lib.opgen_last_error())
    for k in ("input_grad", "weight_grad"):
        assert_near_oracle(c.out[k], want[k], k)


# -------------------------------------------------------------------------- (b) aclnn statuses
def test_aclnn_edb_bad_input(acl, rng):
    e = acl("embedding_dense_backward")
    a = edb_case(rng)
    s = {"num_weights": 7}

    def p1(**over):
        b = {**a, **over}
        ts = {k: (e.tensor(v) if v is not None else None) for k, v in b.items()}
        return e.phase1(ts, {**s, **over.get("scalars", {})} if "scalars" in over else s)

    assert p1(grad=None)[0] == ACLNN["PARAM_NULLPTR"]
    assert p1(out=None)[0] == ACLNN["PARAM_NULLPTR"]
    ts = {k: e.tensor(v) for k, v in a.items()}
    assert e.phase1(ts, s, null_out=True)[0] == ACLNN["PARAM_NULLPTR"]
    assert p1(out=a["out"].astype(np.float16))[0] == ACLNN["PARAM_INVALID"]  # dtype mismatch
    assert p1(indices=a["indices"].astype(np.uint16))[0] == ACLNN["PARAM_INVALID"]  # unsupported dtype
    assert p1(indices=a["indices"][:, :3])[0] == ACLNN["PARAM_INVALID"]  # shape
    assert p1(out=a["out"][:6])[0] == ACLNN["PARAM_INVALID"]  # numWeights disagrees
    bcast = np.lib.stride_tricks.as_strided(a["out"], a["out"].shape, (0, 4))
    assert e.phase1({**ts, "out": e.tensor(bcast, base=a["out"])}, s)[0] == ACLNN["PARAM_INVALID"]  # strides
    assert e.phase1(ts, {"num_weights": 2**63})[0] == ACLNN["PARAM_INVALID"]  # > INT64_MAX
    nz = e.tensor(a["grad"], fmt=ACL_FORMAT_FRACTAL_NZ)
    assert e.phase1({**ts, "grad": nz}, s)[0] == ACLNN["PARAM_INVALID"]  # a private format
    complex64 = e.tensor(a["grad"], dtype=16)
    assert e.phase1({**ts, "grad": complex64}, s)[0] == ACLNN["PARAM_INVALID"]


def test_aclnn_edb_index_out_of_range_leaves_out_untouched(acl, rng):
    e = acl("embedding_dense_backward")
    a = edb_case(rng)
    a["out"][:] = 3.25
    a["indices"][1, 2] = 7  # numWeights = 7
    st, stage = e.call(a, {"num_weights": 7})
    assert (st, stage) == (ACLNN["PARAM_INVALID"], "phase2")
    assert np.all(a["out"] == 3.25)


def test_aclnn_executor_is_single_use(lib, acl, rng):
    e = acl("embedding_dense_backward")
    a = edb_case(rng)
    ts = {k: e.tensor(v) for k, v in a.items()}
    st, size, ex = e.phase1(ts, {"num_weights": 7})
    assert st == 0
    ws = np.zeros(max(size, 1), np.uint8)
    assert e.phase2(None, size, ws) == ACLNN["PARAM_NULLPTR"]
    if size:
        assert e.phase2(ex, size - 1, ws) == ACLNN["PARAM_INVALID"]  # too small: consumed as well
        st, size, ex = e.phase1(ts, {"num_weights": 7})
    # an executor of another op is refused and stays usable
    other = acl("fused_linear_cross_entropy_loss_grad")
    assert other.phase2(ex, size) == ACLNN["PARAM_INVALID"]
    assert e.phase2(ex, size, ws) == 0
    assert e.phase2(ex, size, ws) == ACLNN["PARAM_INVALID"]  # used: refused, no crash
    # repeatable executors survive until destroyed
    lib.aclSetAclOpExecutorRepeatable.argtypes = [c_void_p]
    lib.aclDestroyAclOpExecutor.argtypes = [c_void_p]
    st, size, ex = e.phase1(ts, {"num_weights": 7})
    assert lib.aclSetAclOpExecutorRepeatable(ex) == 0
    assert e.phase2(ex, size) == 0 and e.phase2(ex, size) == 0
    assert lib.aclDestroyAclOpExecutor(ex) == 0
    assert e.phase2(ex, size) == ACLNN["PARAM_INVALID"]
    assert lib.aclDestroyAclOpExecutor(ex) == ACLNN["PARAM_INVALID"]


def test_aclnn_flce_bad_input(acl, rng):
    e = acl("fused_linear_cross_entropy_loss_grad")
    c = Flce(rng, "f16")
    args = {**c.args("memory_saving"), **c.out}
    # memory-saving mode without logitsMax: PARAM_NULLPTR at phase 1
    st, stage = e.call({**args, "logits_max": None})
    assert (st, stage) == (ACLNN["PARAM_NULLPTR"], "phase1")
    assert e.call({**args, "logits_max": None, "sum_exp_logits": None})[0] == ACLNN["PARAM_NULLPTR"]
    # labelSmoothing != 0: PARAM_INVALID, outputs untouched
    st, _ = e.call(args, {"label_smoothing": 0.1})
    assert st == ACLNN["PARAM_INVALID"]
    assert np.isnan(f64(c.out["input_grad"])).all() and np.isnan(f64(c.out["weight_grad"])).all()
    # V < 128, dtype mismatch, mask dtype
    small = Flce(rng, "f16", V=64)
    assert e.call({**small.args("softmax"), **small.out})[0] == ACLNN["PARAM_INVALID"]
    assert e.call({**args, "weight": c.a["weight"].astype(np.float32)})[0] == ACLNN["PARAM_INVALID"]
    assert e.call({**args, "target_mask": c.a["target_mask"].astype(np.int8)})[0] == ACLNN["PARAM_INVALID"]


def test_acl_runtime_shims(lib):
    lib.aclrtMalloc.argtypes = [POINTER(c_void_p), c_size_t, c_int]
    lib.aclrtMemcpy.argtypes = [c_void_p, c_size_t, c_void_p, c_size_t, c_int]
    lib.aclrtFree.argtypes = [c_void_p]
    p = c_void_p()
    assert lib.aclrtMalloc(byref(p), 0, 0) == 100000  # ACL_ERROR_INVALID_PARAM
    assert lib.aclrtMalloc(byref(p), 64, 0) == 0 and p.value % 64 == 0
    src = np.arange(16, dtype=np.uint8)
    assert lib.aclrtMemcpy(p, 64, src.ctypes.data, 16, 1) == 0
    dst = np.zeros(16, np.uint8)
    assert lib.aclrtMemcpy(dst.ctypes.data, 8, p, 16, 2) == 100000  # count > destMax
    assert lib.aclrtMemcpy(dst.ctypes.data, 16, p, 16, 2) == 0 and np.array_equal(dst, src)
    assert lib.aclrtFree(p) == 0
    assert lib.aclrtSetDevice(1) == 100000


def test_acl_tensor_accessors(lib):
    """CANN's accessors (nnopbase's signatures; the Ascend library reads aclTensors only through
    them): the view's dims and strides (contiguous ones when none were given), the storage dims,
    the raw data pointer and the offset as given; arrays allocated by the call (non-NULL even for
    rank 0, released here with free()); any NULL argument: ACLNN_ERR_PARAM_NULLPTR."""
    lib.aclCreateTensor.restype = c_void_p
    lib.aclCreateTensor.argtypes = [POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int,
                                    POINTER(c_int64), c_uint64, c_void_p]
    lib.aclDestroyTensor.argtypes = [c_void_p]
    arrays = ("aclGetViewShape", "aclGetViewStrides", "aclGetStorageShape")
    for name in arrays:
        getattr(lib, name).argtypes = [c_void_p, POINTER(POINTER(c_int64)), POINTER(c_uint64)]
    lib.aclGetRawTensorAddr.argtypes = [c_void_p, POINTER(c_void_p)]
    lib.aclGetViewOffset.argtypes = [c_void_p, POINTER(c_int64)]
    lib.aclGetDataType.argtypes = [c_void_p, POINTER(c_int)]
    lib.aclGetFormat.argtypes = [c_void_p, POINTER(c_int)]
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [c_void_p]
    buf = np.zeros(64, np.float32)

    def make(view, strides, offset, storage):
        arr = (c_int64 * max(len(view), 1))(*view)
        st = None if strides is None else (c_int64 * max(len(view), 1))(*strides)
        t = lib.aclCreateTensor(arr, len(view), 0, st, offset, ACL_FORMAT_ND,
                                (c_int64 * max(len(storage), 1))(*storage), len(storage), buf.ctypes.data)
        assert t
        return t

    def get(name, t):
        p, n = POINTER(c_int64)(), c_uint64(99)
        assert getattr(lib, name)(t, byref(p), byref(n)) == ACLNN["SUCCESS"]
        assert p, name  # allocated even for rank 0
        out = [p[i] for i in range(n.value)]
        libc.free(ctypes.cast(p, c_void_p))
        return out

    strided = make((3, 4), (16, -2), 7, (8, 8))
    contiguous = make((2, 3, 5), None, 0, (64,))
    scalar = make((), None, 3, (64,))
    try:
        assert (get("aclGetViewShape", strided), get("aclGetViewStrides", strided),
                get("aclGetStorageShape", strided)) == ([3, 4], [16, -2], [8, 8])
        assert get("aclGetViewStrides", contiguous) == [15, 5, 1]
        assert get("aclGetViewShape", scalar) == get("aclGetViewStrides", scalar) == []
        addr, off, dt, fmt = c_void_p(), c_int64(-1), c_int(-1), c_int(-1)
        assert lib.aclGetRawTensorAddr(strided, byref(addr)) == 0 and addr.value == buf.ctypes.data
        assert lib.aclGetViewOffset(strided, byref(off)) == 0 and off.value == 7
        assert lib.aclGetDataType(strided, byref(dt)) == 0 and dt.value == 0  # ACL_FLOAT
        assert lib.aclGetFormat(strided, byref(fmt)) == 0 and fmt.value == ACL_FORMAT_ND
        p, n = POINTER(c_int64)(), c_uint64()
        for name in arrays:
            fn = getattr(lib, name)
            assert fn(None, byref(p), byref(n)) == ACLNN["PARAM_NULLPTR"]
            assert fn(strided, None, byref(n)) == ACLNN["PARAM_NULLPTR"]
            assert fn(strided, byref(p), None) == ACLNN["PARAM_NULLPTR"]
        assert lib.aclGetRawTensorAddr(None, byref(addr)) == ACLNN["PARAM_NULLPTR"]
        assert lib.aclGetRawTensorAddr(strided, None) == ACLNN["PARAM_NULLPTR"]
        assert lib.aclGetViewOffset(None, byref(off)) == ACLNN["PARAM_NULLPTR"]
        assert not p  # nothing allocated by a refused call
    finally:
        for t in (strided, contiguous, scalar):
            assert lib.aclDestroyTensor(t) == 0


# ------------------------------------------------------------------------ (a) plain C programs
def _compile(tmp: Path, src: Path, cxx: bool = False) -> Path:
    lib_dir = runtime.library_path().parent
    exe = tmp / (src.stem + ("_cxx" if cxx else ""))
    if cxx:
        cmd = [GXX, "-x", "c++", "-std=c++11"]
    else:
        cmd = [GCC, "-std=c11"]
    cmd += ["-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{INCLUDE}", str(src), "-o", str(exe),
            f"-L{lib_dir}", f"-l:{runtime.library_path().name}", f"-Wl,-rpath,{lib_dir}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    return exe


def _run(exe: Path, inp: Path, out: Path) -> str:
    r = subprocess.run([str(exe), str(inp), str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{exe.name} exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


@pytest.mark.skipif(GCC is None, reason="no gcc")
@pytest.mark.parametrize("cxx", [False, True])
def test_c_program_infinicore_rms_norm_backward(lib, tmp_path, rng, cxx):
    if cxx and GXX is None:
        pytest.skip("no g++")
    exe = _compile(tmp_path, C_DIR / "infinicore_user.c", cxx)
    N1, N2, D = 3, 4, 32
    for with_eps, eps in ((0, 0.0), (1, 1e-5)):
        gy = rounded(rng.standard_normal((N1, N2, D)), "f32")
        x = rounded(rng.standard_normal((N1, N2, D)), "f32")
        w = rounded(rng.standard_normal(D), "f32")
        inp = tmp_path / "in.bin"
        inp.write_bytes(np.array([N1, N2, D, with_eps], np.int64).tobytes() + np.float32(eps).tobytes()
                        + gy.tobytes() + x.tobytes() + w.tobytes())
        stdout = _run(exe, inp, tmp_path / "out.bin")
        assert re.search(r"workspace \d+ device 0 id 0", stdout), stdout
        res = np.fromfile(tmp_path / "out.bin", np.float32)
        gx, gw = res[:N1 * N2 * D].reshape(N1, N2, D), res[N1 * N2 * D:]

        def torch_grads(dt: str, gy=gy, x=x, w=w, eps=eps):
            xt, wt = (t64 if dt == "f64" else lambda a, **k: tt(a, dt, **k))(x, requires_grad=True), \
                (t64 if dt == "f64" else lambda a, **k: tt(a, dt, **k))(w, requires_grad=True)
            e32 = float(np.float32(eps))
            y = xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + e32) * wt
            y.backward(t64(gy) if dt == "f64" else tt(gy, dt))
            return xt.grad, wt.grad

        ref_x, ref_w = torch_grads("f64")
        same_x, same_w = torch_grads("f32")
        assert_close_policy(gx, ref_x, same_x, "f32", "grad_x")
        assert_close_policy(gw, ref_w, same_w, "f32", "grad_w")


@pytest.mark.skipif(GCC is None, reason="no gcc")
@pytest.mark.parametrize("cxx", [False, True])
def test_c_program_cann_embedding_dense_backward(lib, tmp_path, rng, cxx):
    if cxx and GXX is None:
        pytest.skip("no g++")
    exe = _compile(tmp_path, C_DIR / "cann_user.c", cxx)
    B, S, D, V = 2, 5, 6, 9
    for padding, scale, offset in ((-1, 0, 0), (3, 1, 5), (2**63 - 1, 1, 1)):
        grad = rounded(rng.standard_normal((B, S, D)), "f32")
        idx = rng.integers(0, V, (B, S))
        idx[0, :3] = 3
        inp = tmp_path / "in.bin"
        inp.write_bytes(np.array([B, S, D, V, padding, scale, offset], np.int64).tobytes() + grad.tobytes()
                        + idx.astype(np.int64).tobytes())
        stdout = _run(exe, inp, tmp_path / "out.bin")
        assert stdout.startswith("workspace "), stdout
        out = np.fromfile(tmp_path / "out.bin", np.float32).reshape(V, D)
        it = torch.tensor(idx)
        ref = torch.ops.aten.embedding_dense_backward(t64(grad), it, V, padding, bool(scale))
        same = torch.ops.aten.embedding_dense_backward(tt(grad, "f32"), it, V, padding, bool(scale))
        assert_close_policy(out, ref, same, "f32", "out")


# ------------------------------------------------------------------------ (c) headers, new ops
def _headers() -> list[str]:
    return sorted(str(p.relative_to(INCLUDE)) for p in INCLUDE.rglob("*.h") if p.name != "opgen.h")


@pytest.mark.skipif(GCC is None, reason="no gcc")
@pytest.mark.parametrize("lang", ["c99", "c11", "c++11", "c++17"])
def test_headers_compile_as_c_and_cxx_with_vendor_values(tmp_path, lang):
    names = _headers()
    for must in ("infinicore.h", "infiniop.h", "infiniop/handle.h", "infiniop/tensor_descriptor.h",
                 "infiniop/operator_descriptor.h", "infiniop/ops/rms_norm_backward.h",
                 "infiniop/ops/embedding_backward.h", "acl/acl.h", "aclnn/acl_meta.h", "aclnn/aclnn_base.h",
                 "aclnnop/aclnn_embedding_dense_backward.h",
                 "aclnnop/aclnn_fused_linear_cross_entropy_loss_grad.h"):
        assert must in names
    asserts = {"INFINI_STATUS_SUCCESS": 0, "INFINI_STATUS_INTERNAL_ERROR": 1,
               "INFINI_STATUS_NOT_IMPLEMENTED": 2,
               "INFINI_STATUS_BAD_PARAM": 3, "INFINI_STATUS_NULL_POINTER": 4,
               "INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED": 5, "INFINI_STATUS_BAD_TENSOR_DTYPE": 10,
               "INFINI_STATUS_BAD_TENSOR_SHAPE": 11, "INFINI_STATUS_BAD_TENSOR_STRIDES": 12,
               "INFINI_STATUS_INSUFFICIENT_WORKSPACE": 13, "INFINI_DTYPE_I32": 5, "INFINI_DTYPE_I64": 6,
               "INFINI_DTYPE_F16": 12, "INFINI_DTYPE_F32": 13, "INFINI_DTYPE_F64": 14,
               "INFINI_DTYPE_BF16": 19,
               "INFINI_DEVICE_CPU": 0, "ACL_FLOAT": 0, "ACL_FLOAT16": 1, "ACL_INT8": 2, "ACL_INT32": 3,
               "ACL_UINT8": 4, "ACL_INT16": 6, "ACL_UINT16": 7, "ACL_UINT32": 8, "ACL_INT64": 9,
               "ACL_UINT64": 10, "ACL_DOUBLE": 11, "ACL_BOOL": 12, "ACL_BF16": 27, "ACL_FORMAT_ND": 2,
               "ACLNN_SUCCESS": 0, "ACLNN_ERR_PARAM_NULLPTR": 161001, "ACLNN_ERR_PARAM_INVALID": 161002,
               "ACLNN_ERR_RUNTIME_ERROR": 361001, "ACLNN_ERR_INNER": 561000, "ACL_SUCCESS": 0,
               "ACL_MEMCPY_HOST_TO_DEVICE": 1, "ACL_MEMCPY_DEVICE_TO_HOST": 2, "ACL_MEM_MALLOC_HUGE_FIRST": 0}
    sa = "static_assert" if lang.startswith("c++") else "_Static_assert"
    src = "".join(f'#include "{h}"\n' for h in names) + "#include <immintrin.h>\n" + "".join(
        f'{sa}({k} == {v}, "{k}");\n' for k, v in asserts.items()) + (
        f'{sa}(sizeof(aclnnStatus) == 4, "aclnnStatus");\n{sa}(sizeof(aclrtStream) == sizeof(void *), "s");\n'
        "int main(void) { return 0; }\n")
    f = tmp_path / "all.c"
    f.write_text(src)
    cmd = [GXX, "-x", "c++"] if lang.startswith("c++") else [GCC]
    if cmd[0] is None:
        pytest.skip("no compiler")
    r = subprocess.run([*cmd, f"-std={lang}", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{INCLUDE}",
                        "-fsyntax-only", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(GXX is None, reason="no g++")
def test_seed_cann_sample_compiles_unchanged(tmp_path):
    """The C++ sample of seed 003 compiles against the generated headers as it is."""
    seed = SEEDS / "003_e15f902cbf80e4bf.txt"
    if not seed.exists():
        pytest.skip("seed file not available")
    m = re.search(r"```c\+\+\n(.*?)```", seed.read_text(), re.S)
    assert m
    f = tmp_path / "sample.cpp"
    f.write_text("#include <cstdio>\n" + m.group(1))  # printf: the real headers bring <stdio.h>
    r = subprocess.run([GXX, "-std=c++14", f"-I{INCLUDE}", "-fsyntax-only", str(f)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(GCC is None, reason="no gcc")
def test_seed_prototypes_match_the_headers(tmp_path):
    """Every C prototype the seed documents give (infiniop code blocks, aclnn signatures) is a
    compatible redeclaration of what the generated headers declare (C rejects a mismatch)."""
    if not SEEDS.is_dir():
        pytest.skip("seed files not available")
    decls = []
    for f in sorted(SEEDS.glob("*.txt")):
        text = f.read_text()
        decls += [b for b in re.findall(r"```c\n(.*?)```", text, re.S) if "infiniop" in b]
        decls += sorted(set(re.findall(r"aclnnStatus aclnn\w+\([^)]*\)", text)))
    assert len(decls) >= 10
    src = ('#include <infiniop.h>\n#include "aclnnop/aclnn_embedding_dense_backward.h"\n'
           '#include "aclnnop/aclnn_fused_linear_cross_entropy_loss_grad.h"\n'
           + "".join(d.strip().rstrip(";") + ";\n" for d in decls)
           + "int main(void) { return INFINI_STATUS_BAD_DEVICE == 5 ? 0 : 1; }\n")
    (tmp_path / "seed.c").write_text(src)
    r = subprocess.run([GCC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", "-fsyntax-only",
                        str(tmp_path / "seed.c")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


NEW_OP = '''\
"""A new op declaring both vendor facades; nothing else in opgen changes."""

from opgen.abi import Aclnn, Arg, Infiniop, args
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, f16)


@op(abi=[Infiniop("ScaledAdd", descriptors=args("out_desc=out", "a_desc=a", "b_desc=b"),
                  data=args("out", "a", "b"), scalars=(Arg("alpha", "alpha", "double"),),
                  extensions={"WithBeta": (Arg("beta", "beta", "float"),)}),
         Aclnn("ScaledAdd", header="aclnnop/aclnn_scaled_add.h",
               args=args("self=a", "other=b", Arg("alpha", "alpha", "float"), "out"))])
def scaled_add(a: Tensor[T, N, D], b: Tensor[T, N, D] | None = None, alpha: float = 1.0,
               beta: float = 2.0, *, out: Output[T, N, D]):
    """``out = beta * a + alpha * b`` (b absent: ``beta * a``)."""
    if b is None:
        return {"out": a * beta}
    return {"out": a * beta + b * alpha}
'''


@pytest.mark.skipif(GCC is None, reason="no gcc")
def test_new_op_gets_its_facades(op_files, tmp_path, rng):
    o = op_files({"scaled_add.py": NEW_OP})["scaled_add"]
    gen = tmp_path / "gen"
    from opgen import build

    files = build.generate_common([o])  # headers, runtimes and facades of this op alone
    files["cpu/scaled_add.c"] = cpu.op_source(o)
    for p, text in files.items():
        (gen / p).parent.mkdir(parents=True, exist_ok=True)
        (gen / p).write_text(text)
    assert "infiniopCreateScaledAddDescriptorWithBeta" in files["include/infiniop/ops/scaled_add.h"]
    assert '#include "infiniop/ops/scaled_add.h"' in files["include/infiniop.h"]
    libpath = cc.build_library(gen / "cpu", gen / "include", tmp_path / "build", verbose=False)
    lib = ctypes.CDLL(str(libpath))
    a = rounded(rng.standard_normal((3, 4)), "f32")
    b = rounded(rng.standard_normal((3, 4)), "f32")
    out = np.zeros((3, 4), np.float32)

    e = Infini.__new__(Infini)
    e.lib, e.o, e.m, e.keep = lib, o, facades.infiniop_model(o, o.abis[0]), []
    lib.infiniopCreateHandle.argtypes = [POINTER(c_void_p)]
    lib.infiniopCreateTensorDescriptor.argtypes = [POINTER(c_void_p), c_size_t, POINTER(c_size_t),
                                                   POINTER(c_ssize_t), c_int]
    e.handle = c_void_p()
    assert lib.infiniopCreateHandle(byref(e.handle)) == 0
    assert e.call({"a": a, "b": b, "out": out}, {"alpha": 0.5}) == (0, "run")
    np.testing.assert_allclose(out, 2.0 * a + 0.5 * b, rtol=1e-6)  # beta: the DSL default
    assert e.call({"a": a, "b": None, "out": out}, {"beta": 3.0}, ext="WithBeta") == (0, "run")
    np.testing.assert_allclose(out, 3.0 * a, rtol=1e-6)
    assert e.call({"a": a, "b": b[:, :2], "out": out}, {})[0] == INFINI["BAD_TENSOR_SHAPE"]

    lib.aclCreateTensor.restype = c_void_p
    ac = Acl.__new__(Acl)
    ac.lib, ac.o, ac.m, ac.tensors = lib, o, facades.aclnn_model(o, o.abis[1]), []
    lib.aclCreateTensor.argtypes = [POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int,
                                    POINTER(c_int64), c_uint64, c_void_p]
    ac.ws_fn = lib.aclnnScaledAddGetWorkspaceSize
    ac.ws_fn.argtypes = [c_void_p, c_void_p, ctypes.c_float, c_void_p, POINTER(c_uint64), POINTER(c_void_p)]
    ac.run_fn = lib.aclnnScaledAdd
    ac.run_fn.argtypes = [c_void_p, c_uint64, c_void_p, c_void_p]
    assert ac.call({"a": a, "b": b, "out": out}, {"alpha": -1.0}) == (0, "phase2")
    np.testing.assert_allclose(out, 2.0 * a - b, rtol=1e-6)


def test_bad_declarations_are_reported(op_files):
    bad = NEW_OP.replace('"b_desc=b"', '"b_desc=bb"')
    o = op_files({"scaled_add.py": bad})["scaled_add"]
    with pytest.raises(DSLError, match="unknown parameter 'bb'"):
        facades.generate([o])
    bad = NEW_OP.replace('descriptors=args("out_desc=out", "a_desc=a", "b_desc=b")',
                         'descriptors=args("out_desc=out", "b_desc=b")').replace('data=args("out", "a", "b")',
                                                                                  'data=args("out", "b")')
    o = op_files({"scaled_add.py": bad})["scaled_add"]
    with pytest.raises(DSLError, match="required tensor 'a'"):
        facades.generate([o])
    bad = NEW_OP.replace('Arg("alpha", "alpha", "double")', 'Arg("alpha", "alpha", "complex")')
    o = op_files({"scaled_add.py": bad})["scaled_add"]
    with pytest.raises(DSLError, match="C type"):
        facades.generate([o])
