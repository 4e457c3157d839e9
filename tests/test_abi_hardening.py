"""Hardening of the C ABIs (plain ``opgen_<op>``, infiniop, aclnn) against hostile arguments, and
the OpenMP runtime's behaviour across threads and fork().

Every check is a function ``check_<name>()`` of this module (no torch: it also runs under an
ASan-preloaded interpreter). pytest runs each one in a subprocess
(``python -m tests.test_abi_hardening NAME``), so a crash or a hang of the library is a test
failure, not a dead test session: a check passes when the subprocess prints ``ok NAME``.
``test_bad_input_under_asan_and_ubsan`` runs the bad-input checks once more against the
sanitized library (build/cpu/libopgen_asan.so, as in tests/test_cpu_sanitizers.py), and
``test_saturating_size_helpers`` compiles tests/c/sz_helpers.c against the runtime header.

What is checked (statuses as documented in docs/facades.md):
- a NULL workspace with a non-zero size: OPGEN_ERR_NULL / NULL_POINTER / PARAM_NULLPTR, nothing
  written; a workspace at any (odd) address works (the runtime aligns it itself);
- sizes: an empty table with 2^62 rows (aclnn numWeights = 2^62, infiniop table (2^62, 0))
  needs no table-sized workspace and no loop over its rows: success at once; a workspace that
  does not fit in size_t (2^62 broadcast indices) is a shape error; strides whose extent
  overflows int64 are a strides error; huge strides of an empty tensor are harmless;
- aclCreateTensor refuses impossible views (negative offset, offset or extent outside the
  storage, products overflowing int64): NULL;
- outputs whose elements overlap each other are a strides error; non-overlapping negative or
  permuted strides are fine;
- tensor data not aligned to its element size: OPGEN_ERR_PARAM / BAD_PARAM / PARAM_INVALID;
- threads: a workspace sized on a thread with 1 OpenMP thread suffices on one with 2 or more (and
  back); a fork() child of a process that ran parallel regions computes the right result without
  hanging (os.fork and multiprocessing's 'fork' context).
Results are compared with the oracle (opgen.oracle), outputs of refused calls byte for byte with
their prior contents.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading
from ctypes import POINTER, byref, c_int, c_int64, c_size_t, c_ssize_t, c_uint64, c_void_p
from typing import Any

import numpy as np
import pytest

from opgen import compile as cc
from opgen import dtypes, registry, runtime
from tests.cpu_cases import (
    CODE,
    assert_c_close,
    c_call,
    edb_args,
    oracle_outputs,
    permuted_leading,
    rms_args,
    root,
    set_shape,
)
from tests.test_cpu_sanitizers import BAD_MARKERS, sanitizer_env

REPO = registry.REPO_ROOT
EDB, RMS, EB = "embedding_dense_backward", "rms_norm_backward", "embedding_backward"
BIG = 2**62

# vendor status values (SPEC §6), written out independently of opgen.emit.facades
INFINI = {"SUCCESS": 0, "BAD_PARAM": 3, "NULL_POINTER": 4, "BAD_TENSOR_SHAPE": 11, "BAD_TENSOR_STRIDES": 12,
          "INSUFFICIENT_WORKSPACE": 13}
ACLNN = {"SUCCESS": 0, "PARAM_NULLPTR": 161001, "PARAM_INVALID": 161002}
ACL_FLOAT, ACL_INT64, ACL_FORMAT_ND = 0, 9, 2
INFINI_F32, INFINI_I64 = 13, 6


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def lib() -> ctypes.CDLL:
    return runtime.load()


def snapshot(arrays: list[np.ndarray]) -> list[bytes]:
    return [root(a).tobytes() for a in arrays]


def misaligned(a: np.ndarray, by: int = 1) -> np.ndarray:
    """A copy of ``a`` (C-contiguous) whose data starts ``by`` bytes past an aligned address."""
    raw = np.zeros(a.nbytes + 64 + by, np.uint8)
    start = (-raw.ctypes.data) % 64 + by
    out = np.frombuffer(raw[start:start + a.nbytes].data, dtype=a.dtype).reshape(a.shape)
    out[...] = a
    assert out.ctypes.data % a.itemsize != 0 or a.itemsize == 1
    return out


def strided_view(base: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """A view of ``base`` with element strides (may overlap itself)."""
    return np.lib.stride_tricks.as_strided(base, shape, tuple(s * base.itemsize for s in strides))


# ---------------------------------------------------------------------------------- vendor access
class Infini:
    """Minimal ctypes access to the infiniop facade (descriptors, Create, run, Destroy)."""

    def __init__(self, library: ctypes.CDLL | None = None) -> None:
        self.lib = library or lib()
        L = self.lib
        L.infiniopCreateHandle.argtypes = [POINTER(c_void_p)]
        L.infiniopCreateTensorDescriptor.argtypes = [POINTER(c_void_p), c_size_t, POINTER(c_size_t),
                                                     POINTER(c_ssize_t), c_int]
        L.infiniopDestroyTensorDescriptor.argtypes = [c_void_p]
        self.handle = c_void_p()
        assert L.infiniopCreateHandle(byref(self.handle)) == 0

    def desc(self, shape: tuple[int, ...], dtype: int, strides: tuple[int, ...] | None = None) -> tuple[int, Any]:
        d = c_void_p()
        sh = (c_size_t * max(len(shape), 1))(*shape)
        st = None if strides is None else (c_ssize_t * max(len(shape), 1))(*strides)
        return self.lib.infiniopCreateTensorDescriptor(byref(d), len(shape), sh, st, dtype), d

    def tensor(self, a: np.ndarray) -> Any:
        st, d = self.desc(a.shape, dtypes.from_numpy(a.dtype).infini, tuple(s // a.itemsize for s in a.strides))
        assert st == 0
        return d

    def eb_create(self, dtable1: Any, dy: Any, i1: Any) -> tuple[int, c_void_p]:
        fn = self.lib.infiniopCreateEmbeddingBackwardDescriptor
        fn.argtypes = [c_void_p, POINTER(c_void_p), c_void_p, c_void_p, c_void_p, c_void_p, c_void_p,
                       ctypes.c_float, ctypes.c_float, ctypes.c_char, ctypes.c_char]
        out = c_void_p()
        return fn(self.handle, byref(out), dtable1, None, dy, i1, None, 1.0, 0.0, b"\0", b"\0"), out

    def eb_run(self, desc: c_void_p, dtable1: np.ndarray, dy: np.ndarray, i1: np.ndarray) -> int:
        fn = self.lib.infiniopEmbeddingBackward
        fn.argtypes = [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]
        return fn(desc, dtable1.ctypes.data, None, dy.ctypes.data, i1.ctypes.data, None, None)

    def rms_create(self, a: dict[str, np.ndarray]) -> tuple[int, c_void_p]:
        fn = self.lib.infiniopCreateRMSNormBackwardDescriptor
        fn.argtypes = [c_void_p, POINTER(c_void_p), *[c_void_p] * 5]
        out = c_void_p()
        descs = [self.tensor(a[k]) for k in ("grad_x", "grad_w", "grad_y", "x", "w")]
        return fn(self.handle, byref(out), *descs), out

    def rms_run(self, desc: c_void_p, a: dict[str, np.ndarray], ws: Any, ws_size: int) -> int:
        fn = self.lib.infiniopRMSNormBackward
        fn.argtypes = [c_void_p, c_void_p, c_size_t, *[c_void_p] * 5, c_void_p]
        return fn(desc, ws, ws_size, *(a[k].ctypes.data for k in ("grad_x", "grad_w", "grad_y", "x", "w")), None)

    def rms_ws(self, desc: c_void_p) -> int:
        fn = self.lib.infiniopGetRMSNormBackwardWorkspaceSize
        fn.argtypes = [c_void_p, POINTER(c_size_t)]
        size = c_size_t()
        assert fn(desc, byref(size)) == 0
        return size.value


class Acl:
    """Minimal ctypes access to aclCreateTensor and aclnnEmbeddingDenseBackward."""

    def __init__(self) -> None:
        self.lib = L = lib()
        L.aclCreateTensor.restype = c_void_p
        L.aclCreateTensor.argtypes = [POINTER(c_int64), c_uint64, c_int, POINTER(c_int64), c_int64, c_int,
                                      POINTER(c_int64), c_uint64, c_void_p]
        L.aclDestroyTensor.argtypes = [c_void_p]
        self.ws_fn = L.aclnnEmbeddingDenseBackwardGetWorkspaceSize
        self.ws_fn.argtypes = [c_void_p, c_void_p, c_uint64, c_uint64, ctypes.c_bool, c_void_p, POINTER(c_uint64),
                               POINTER(c_void_p)]
        self.run_fn = L.aclnnEmbeddingDenseBackward
        self.run_fn.argtypes = [c_void_p, c_uint64, c_void_p, c_void_p]
        self.made: list[int] = []

    def create(self, view: tuple[int, ...], dtype: int, strides: tuple[int, ...] | None, offset: int,
               storage: tuple[int, ...], data: int | None) -> int | None:
        n = max(len(view), 1)
        t = self.lib.aclCreateTensor((c_int64 * n)(*view), len(view), dtype,
                                     None if strides is None else (c_int64 * n)(*strides), offset, ACL_FORMAT_ND,
                                     (c_int64 * max(len(storage), 1))(*storage), len(storage), data)
        if t:
            self.made.append(t)
        return t

    def tensor(self, a: np.ndarray, base: np.ndarray | None = None) -> int:
        """An aclTensor viewing ``a``, an element offset into ``base`` (storage: base, 1-D)."""
        base = a if base is None else base
        t = self.create(a.shape, dtypes.from_numpy(a.dtype).acl, tuple(s // a.itemsize for s in a.strides),
                        (a.ctypes.data - base.ctypes.data) // a.itemsize, (base.size,), base.ctypes.data)
        assert t
        return t

    def phase1(self, grad: Any, indices: Any, out: Any, num_weights: int, padding: int = -1,
               scale: bool = False) -> tuple[int, int, c_void_p]:
        size, ex = c_uint64(), c_void_p()
        st = self.ws_fn(grad, indices, num_weights, padding % 2**64, scale, out, byref(size), byref(ex))
        return st, size.value, ex

    def close(self) -> None:
        for t in self.made:
            assert self.lib.aclDestroyTensor(t) == 0


# ---------------------------------------------------------------------------- checks: workspace
def _rms_table_case() -> dict[str, Any]:
    """rms_norm_backward with a permuted (non-coalescable) batch: the runtime builds a row table."""
    a = rms_args(_rng(1), "f32", (5, 3, 40))
    a["x"] = permuted_leading(a["x"])
    return a


def check_null_workspace_with_size() -> None:
    """Plain ABI: NULL workspace with a non-zero size is OPGEN_ERR_NULL (too small a size is
    OPGEN_ERR_WORKSPACE first), nothing written; NULL with size 0 allocates."""
    for name, a in ((RMS, _rms_table_case()), (EDB, edb_args(_rng(2), "f32", "i64", lead=(4, 6), D=16))):
        st, need = c_call(name, a, size_query=True)
        assert st == 0 and need > 0
        outs = [v for k, v in a.items() if k in ("grad_x", "grad_w", "out")]
        before = snapshot(outs)
        for size in (need, need + 1000, 2**40):
            st, msg = c_call(name, a, workspace=None, workspace_size=size)
            assert st == CODE["null"], (name, size, st, msg)
            assert "workspace is NULL" in msg, msg
        st, msg = c_call(name, a, workspace=None, workspace_size=need - 1)
        assert st == CODE["workspace"], (st, msg)
        assert snapshot(outs) == before
        ref = oracle_outputs(name, a)
        st, msg = c_call(name, a)  # NULL, 0: allocated by the call
        assert st == 0, msg
        for k, v in ref.items():
            assert_c_close(a[k], v, k)


def check_workspace_at_any_address() -> None:
    """The size the query reports suffices at every byte offset (the runtime rounds the base up
    itself: no misaligned row-table stores, no misaligned kernel temporaries)."""
    for name, a in ((RMS, _rms_table_case()), (EDB, edb_args(_rng(3), "f16", "i32", lead=(3, 5), D=24))):
        st, need = c_call(name, a, size_query=True)
        assert st == 0 and need > 0
        ref = oracle_outputs(name, a)
        raw = np.zeros(need + 128, np.uint8)
        base = (-raw.ctypes.data) % 64
        for by in (0, 1, 4, 8, 63):
            for k in ref:
                a[k][...] = 7
            ws = raw[base + by:]
            st, msg = c_call(name, a, workspace=ws, workspace_size=need)
            assert st == 0, (name, by, msg)
            for k, v in ref.items():
                assert_c_close(a[k], v, f"{name}.{k} (workspace +{by})")


def _edb_2p62(n: int) -> dict[str, Any]:
    """embedding_dense_backward with numWeights = 2^62 and D = 0: out (2^62, 0) is empty."""
    return {"grad": np.zeros((n, 0), np.float32), "indices": np.full(n, 5, np.int64), "num_weights": BIG,
            "out": np.zeros((0, 0), np.float32)}


def _big_out(desc: Any, hold: Any) -> None:
    set_shape(desc, hold, (BIG, 0), (0, 1))


def _broadcast_indices(desc: Any, hold: Any) -> None:
    """2^62 indices, all the same element (stride 0): their int64 copy needs 2^65 bytes."""
    set_shape(desc, hold, (BIG,), (0,))


def _broadcast_grad(desc: Any, hold: Any) -> None:
    set_shape(desc, hold, (BIG, 0), (0, 1))


def check_plain_workspace_overflow_2p62() -> None:
    """Plain ABI. numWeights = 2^62 with N = 0 and 1 (an empty (2^62, 0) table): the workspace
    grows with the indices, not the table, and no loop walks the empty rows: success, at once.
    2^62 (broadcast) indices: their workspace does not fit in size_t: OPGEN_ERR_SHAPE from the size
    query and from the call (never a short workspace and a wild kernel)."""
    for n in (0, 1):
        a = _edb_2p62(n)
        st, size = c_call(EDB, a, tamper={"out": _big_out}, size_query=True)
        assert st == 0 and size < 4096, (n, st, size)
        st, msg = c_call(EDB, a, tamper={"out": _big_out})
        assert st == 0, (n, st, msg)
    a = _edb_2p62(1)
    a["num_weights"] = 10
    tamper = {"indices": _broadcast_indices, "grad": _broadcast_grad,
              "out": lambda d, h: set_shape(d, h, (10, 0), (0, 1))}
    st, size = c_call(EDB, a, tamper=tamper, size_query=True)
    assert st == CODE["shape"], (st, size)
    st, msg = c_call(EDB, a, tamper=tamper)
    assert st == CODE["shape"] and "workspace size overflows" in msg, (st, msg)


def check_aclnn_workspace_overflow_2p62() -> None:
    """aclnnEmbeddingDenseBackward, numWeights = 2^62, N = 0 and 1 (an empty table): both phases
    succeed at once; 2^62 broadcast indices: PARAM_INVALID at phase 1 (the workspace overflows)."""
    acl = Acl()
    try:
        for n in (0, 1):
            grad = np.zeros((n, 0), np.float32)
            idx = np.full(n, 5, np.int64)
            tg = acl.tensor(grad)
            ti = acl.tensor(idx)
            out_buf = np.zeros(1, np.float32)
            to = acl.create((BIG, 0), ACL_FLOAT, (0, 1), 0, (0,), out_buf.ctypes.data)
            assert to
            st, size, ex = acl.phase1(tg, ti, to, BIG)
            assert st == ACLNN["SUCCESS"] and size < 4096, (n, st, size, acl.lib.opgen_last_error())
            ws = np.zeros(max(size, 1), np.uint8)
            assert acl.run_fn(ws.ctypes.data, size, ex, None) == ACLNN["SUCCESS"]
        one = np.full(1, 5, np.int64)
        ti = acl.create((BIG,), ACL_INT64, (0,), 0, (1,), one.ctypes.data)
        g = np.zeros(1, np.float32)
        tg = acl.create((BIG, 0), ACL_FLOAT, (0, 1), 0, (1,), g.ctypes.data)
        to = acl.create((10, 0), ACL_FLOAT, (0, 1), 0, (1,), g.ctypes.data)
        assert ti and tg and to
        st, size, ex = acl.phase1(tg, ti, to, 10)
        assert st == ACLNN["PARAM_INVALID"], (st, size, acl.lib.opgen_last_error())
    finally:
        acl.close()


def check_infiniop_workspace_overflow_2p62() -> None:
    """infiniop EmbeddingBackward with a table of shape (2^62, 0): Create and the call succeed at
    once (nothing to write); 2^62 broadcast indices: BAD_TENSOR_SHAPE at Create."""
    e = Infini()
    for n in (0, 1):
        st, t1 = e.desc((BIG, 0), INFINI_F32)
        assert st == 0
        st, dy = e.desc((n, 0), INFINI_F32)
        assert st == 0
        st, i1 = e.desc((n,), INFINI_I64)
        assert st == 0
        st, desc = e.eb_create(t1, dy, i1)
        assert st == INFINI["SUCCESS"], (n, st, e.lib.opgen_last_error())
        buf, idx = np.zeros(1, np.float32), np.full(max(n, 1), 5, np.int64)
        assert e.eb_run(desc, buf, buf, idx) == INFINI["SUCCESS"]
        e.lib.infiniopDestroyEmbeddingBackwardDescriptor.argtypes = [c_void_p]
        assert e.lib.infiniopDestroyEmbeddingBackwardDescriptor(desc) == 0
        for d in (t1, dy, i1):
            assert e.lib.infiniopDestroyTensorDescriptor(d) == 0
    st, t1 = e.desc((10, 0), INFINI_F32)
    st2, dy = e.desc((BIG, 0), INFINI_F32, (0, 1))
    st3, i1 = e.desc((BIG,), INFINI_I64, (0,))
    assert st == st2 == st3 == 0
    st, desc = e.eb_create(t1, dy, i1)
    assert st == INFINI["BAD_TENSOR_SHAPE"], (st, e.lib.opgen_last_error())
    for d in (t1, dy, i1):
        assert e.lib.infiniopDestroyTensorDescriptor(d) == 0


# ------------------------------------------------------------------------ checks: strides, sizes
def check_stride_extent_overflow() -> None:
    """An input whose strides reach past int64 (rows 2^62 elements apart) is a strides error,
    refused before anything is read."""
    a = rms_args(_rng(4), "f32", (3, 8))
    before = snapshot([a["grad_x"], a["grad_w"]])
    for strides in ((BIG, 1), (-BIG, 1), (2**63 - 1, 1)):
        st, msg = c_call(RMS, a, tamper={"x": lambda d, h, s=strides: set_shape(d, h, (3, 8), s)})
        assert st == CODE["strides"], (strides, st, msg)
        st, _ = c_call(RMS, a, tamper={"x": lambda d, h, s=strides: set_shape(d, h, (3, 8), s)}, size_query=True)
        assert st == CODE["strides"], (strides, st)
    assert snapshot([a["grad_x"], a["grad_w"]]) == before


def check_empty_tensor_with_huge_strides() -> None:
    """An empty tensor's strides mean nothing: (N, 0) with a row stride of 2^62 is valid (no
    offset arithmetic overflows), and the result is the oracle's."""
    a = edb_args(_rng(5), "f32", "i64", lead=(6,), D=0, V=5)
    ref = oracle_outputs(EDB, a)
    st, msg = c_call(EDB, a, tamper={"grad": lambda d, h: set_shape(d, h, (6, 0), (BIG, 1))})
    assert st == 0, msg
    assert_c_close(a["out"], ref["out"], "out")


def check_infiniop_descriptor_arithmetic() -> None:
    """infiniopCreateTensorDescriptor computes contiguous strides with checked arithmetic: (2^62, 8)
    is described (strides (8, 1)) and refused by an op's Create as too large; a shape whose
    contiguous strides do not fit int64 is BAD_TENSOR_SHAPE at once."""
    e = Infini()
    st, big = e.desc((BIG, 8), INFINI_F32)
    assert st == 0
    st, _ = e.desc((3, BIG, 4), INFINI_F32)
    assert st == INFINI["BAD_TENSOR_SHAPE"], st
    st, empty = e.desc((0, BIG, 4), INFINI_F32)  # empty: strides do not matter
    assert st == 0
    a = rms_args(_rng(6), "f32", (4, 8))
    descs = {k: e.tensor(v) for k, v in a.items() if isinstance(v, np.ndarray)}
    fn = e.lib.infiniopCreateRMSNormBackwardDescriptor
    fn.argtypes = [c_void_p, POINTER(c_void_p), *[c_void_p] * 5]
    out = c_void_p()
    st = fn(e.handle, byref(out), descs["grad_x"], descs["grad_w"], descs["grad_y"], big, descs["w"])
    assert st == INFINI["BAD_TENSOR_SHAPE"], st
    for d in (big, empty, *descs.values()):
        assert e.lib.infiniopDestroyTensorDescriptor(d) == 0


def check_acl_create_tensor_validates_views() -> None:
    """aclCreateTensor returns NULL for a view that cannot lie in its storage: a negative offset,
    an offset or extent past the storage's element count, negative dims, products that overflow
    int64 (offset 2^62 x itemsize; view (2^62, 8)); a view inside its storage is accepted,
    negative strides included."""
    acl = Acl()
    buf = np.zeros(64, np.float32)
    p = buf.ctypes.data
    try:
        ok = [((4, 8), (8, 1), 0, (32,)), ((4, 8), (8, 1), 32, (64,)), ((4, 8), (-8, 1), 24, (32,)),
              ((4, 8), None, 0, (4, 8)), ((0, 8), (8, 1), 64, (64,)), ((), None, 63, (64,))]
        for view, strides, off, storage in ok:
            assert acl.create(view, ACL_FLOAT, strides, off, storage, p), (view, strides, off, storage)
        bad = [((4, 8), (8, 1), -1, (32,)), ((4, 8), (8, 1), 1, (32,)), ((4, 8), (8, 1), BIG, (2**63 - 1,)),
               ((4, 8), (-8, 1), 0, (32,)), ((4, 8), (8, 1), 0, (31,)), ((-1, 8), (8, 1), 0, (32,)),
               ((BIG, 8), None, 0, (BIG, 8)), ((BIG, 8), (8, 1), 0, (2**63 - 1,)), ((4, 8), (8, 1), 0, (-32,)),
               ((0, 8), (8, 1), 65, (64,)), ((4, 8), (BIG, 1), 0, (2**63 - 1,)), ((), None, 64, (64,))]
        for view, strides, off, storage in bad:
            assert not acl.create(view, ACL_FLOAT, strides, off, storage, p), (view, strides, off, storage)
    finally:
        acl.close()


def check_aclnn_offset_reaches_op() -> None:
    """A valid offset view still computes the oracle's result (grad at offset 5 of its storage),
    and grad's offset -1 never reaches the op (aclCreateTensor refuses it)."""
    acl = Acl()
    try:
        a = edb_args(_rng(7), "f32", "i64", lead=(3, 4), D=6, V=7, padding_idx=-1, scale=False)
        store = np.full(a["grad"].size + 5, 9.0, np.float32)
        store[5:] = a["grad"].reshape(-1)
        grad = store[5:].reshape(a["grad"].shape)
        ref = oracle_outputs(EDB, a)["out"]
        st, size, ex = acl.phase1(acl.tensor(grad, base=store), acl.tensor(a["indices"]), acl.tensor(a["out"]), 7)
        assert st == 0
        ws = np.zeros(max(size, 1), np.uint8)
        assert acl.run_fn(ws.ctypes.data, size, ex, None) == 0
        assert_c_close(a["out"], ref, "out")
        assert not acl.create((3, 4, 6), ACL_FLOAT, None, -1, (72,), store.ctypes.data)
    finally:
        acl.close()


def check_self_overlapping_outputs_refused() -> None:
    """An output two of whose elements share an address (strides (1, 1); rows D-1 apart) is a
    strides error in every ABI, nothing written; flipped and permuted outputs that do not overlap
    still give the oracle's result."""
    a = edb_args(_rng(8), "f32", "i64", lead=(4, 5), D=6, V=7)
    ref = oracle_outputs(EDB, a)["out"]
    for strides in ((1, 1), (5, 1), (0, 1)):
        st, msg = c_call(EDB, a, tamper={"out": lambda d, h, s=strides: set_shape(d, h, (7, 6), s)})
        assert st == CODE["strides"], (strides, st, msg)
        st, _ = c_call(EDB, a, tamper={"out": lambda d, h, s=strides: set_shape(d, h, (7, 6), s)}, size_query=True)
        assert st == CODE["strides"], (strides, st)
    # not overlapping: rows flipped, columns flipped, transposed storage, padded rows
    for view in (lambda b: b[::-1], lambda b: b[:, ::-1], lambda b: np.ascontiguousarray(b.T).T,
                 lambda b: np.zeros((7, 9), np.float32)[:, 1:7]):
        out = view(np.full((7, 6), 3.0, np.float32))
        st, msg = c_call(EDB, {**a, "out": out})
        assert st == 0, msg
        assert_c_close(np.ascontiguousarray(out), ref, "out")
    # rms_norm_backward's grad_x (last dim contiguous): rows overlapping by one element
    r = rms_args(_rng(9), "f32", (4, 8))
    store = np.full(40, 5.0, np.float32)
    r["grad_x"] = strided_view(store, (4, 8), (7, 1))
    before = store.tobytes()
    st, msg = c_call(RMS, r)
    assert st == CODE["strides"], (st, msg)
    assert store.tobytes() == before
    # infiniop: BAD_TENSOR_STRIDES at Create; aclnn: PARAM_INVALID at phase 1
    e = Infini()
    st, _ = e.rms_create(r)
    assert st == INFINI["BAD_TENSOR_STRIDES"], st
    acl = Acl()
    try:
        o = strided_view(np.zeros(64, np.float32), (7, 6), (1, 1))
        to = acl.create((7, 6), ACL_FLOAT, (1, 1), 0, (64,), o.ctypes.data)
        assert to
        st, _, _ = acl.phase1(acl.tensor(a["grad"]), acl.tensor(a["indices"]), to, 7)
        assert st == ACLNN["PARAM_INVALID"], st
    finally:
        acl.close()


def check_misaligned_data_refused() -> None:
    """Tensor data must be aligned to its element size: OPGEN_ERR_PARAM (plain), BAD_PARAM
    (infiniop, at the run call), PARAM_INVALID (aclnn, phase 1), nothing written."""
    a = rms_args(_rng(10), "f32", (4, 16))

    def shift(desc: Any, hold: Any) -> None:  # (opgen.runtime refuses misaligned arrays itself)
        desc.data = desc.data + 2

    for k in ("x", "grad_y", "w", "grad_x"):
        b = dict(a)
        room = np.zeros(a[k].size + 1, a[k].dtype)  # the shifted view still lies inside its buffer
        b[k] = room[:a[k].size].reshape(a[k].shape)
        for o in ("grad_x", "grad_w"):
            if o != k:
                b[o] = np.full_like(a[o], 3.0)
        outs = [b["grad_x"], b["grad_w"]]
        before = snapshot([*outs, room])
        st, msg = c_call(RMS, b, tamper={k: shift})
        assert st == CODE["param"], (k, st, msg)
        assert f"{k} data is not aligned to its element size (4 bytes)" in msg, msg
        assert snapshot([*outs, room]) == before
    e = Infini()
    st, desc = e.rms_create(a)
    assert st == 0
    need = e.rms_ws(desc)
    ws = np.zeros(need + 1, np.uint8)
    b = dict(a, x=misaligned(a["x"], 1))
    assert e.rms_run(desc, b, ws.ctypes.data + 1, need) == INFINI["BAD_PARAM"]
    ref = oracle_outputs(RMS, a)
    assert e.rms_run(desc, a, ws.ctypes.data + 1, need) == 0  # an odd workspace is fine
    for k, v in ref.items():
        assert_c_close(a[k], v, k)
    acl = Acl()
    try:
        d = edb_args(_rng(11), "f32", "i64", lead=(3,), D=4, V=5)
        g = misaligned(d["grad"], 1)
        st, _, _ = acl.phase1(acl.tensor(g), acl.tensor(d["indices"]), acl.tensor(d["out"]), 5)
        assert st == ACLNN["PARAM_INVALID"], st
    finally:
        acl.close()


def check_null_workspace_facades() -> None:
    """The facades' workspace rules agree with the plain ABI's: a NULL workspace that must hold
    something is NULL_POINTER (infiniop) / PARAM_NULLPTR (aclnn); the plain ABI behind them never
    sees it."""
    e = Infini()
    a = _rms_table_case()
    st, desc = e.rms_create(a)
    assert st == 0
    need = e.rms_ws(desc)
    before = snapshot([a["grad_x"], a["grad_w"]])
    assert e.rms_run(desc, a, None, need) == INFINI["NULL_POINTER"]
    assert snapshot([a["grad_x"], a["grad_w"]]) == before
    acl = Acl()
    try:
        d = edb_args(_rng(12), "f32", "i64", lead=(3, 4), D=4, V=5)
        st, size, ex = acl.phase1(acl.tensor(d["grad"]), acl.tensor(d["indices"]), acl.tensor(d["out"]), 5)
        assert st == 0 and size > 0
        assert acl.run_fn(None, size, ex, None) == ACLNN["PARAM_NULLPTR"]
    finally:
        acl.close()


# ---------------------------------------------------------------------------------- checks: threads
def _gomp() -> ctypes.CDLL:
    lib()  # the library's own libgomp is loaded first
    g = ctypes.CDLL("libgomp.so.1")
    g.omp_set_num_threads.argtypes = [c_int]
    return g


def _on_thread(fn: Any, threads: int) -> Any:
    """``fn()`` on a new thread whose OpenMP thread count is ``threads``; returns its result."""
    box: dict[str, Any] = {}

    def body() -> None:
        _gomp().omp_set_num_threads(threads)
        try:
            box["r"] = fn()
        except BaseException as e:  # re-raised on the caller's thread
            box["e"] = e

    t = threading.Thread(target=body)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["r"]


def check_team_functions() -> None:
    """opgen_team_cap() is fixed (OMP_NUM_THREADS=2 here) whatever a thread sets;
    opgen_team() = min(that thread's omp_get_max_threads(), cap)."""
    L = lib()
    assert os.environ.get("OMP_NUM_THREADS") == "2"
    assert L.opgen_team_cap() == 2
    assert _on_thread(lambda: (L.opgen_team_cap(), L.opgen_team()), 1) == (2, 1)
    assert _on_thread(lambda: (L.opgen_team_cap(), L.opgen_team()), 5) == (2, 2)
    assert L.opgen_team() == 2


def check_workspace_size_independent_of_threads() -> None:
    """A workspace sized on a thread with 1 OpenMP thread suffices on one with 2 or 5 (capped to
    2), and the other way round; exactly that size, plain ABI and aclnn."""
    a = edb_args(_rng(13), "f32", "i64", lead=(64, 8), D=256, V=40)  # per-thread rows of D floats
    ref = oracle_outputs(EDB, a)["out"]
    sizes = {n: _on_thread(lambda: c_call(EDB, a, size_query=True), n) for n in (1, 2, 5)}
    assert all(st == 0 for st, _ in sizes.values())
    assert len({s for _, s in sizes.values()}) == 1, sizes
    need = sizes[1][1]
    for sized, run in ((1, 2), (1, 5), (2, 1), (5, 1)):
        need = sizes[sized][1]
        ws = np.zeros(need, np.uint8)
        a["out"][...] = 7
        st, msg = _on_thread(lambda ws=ws, need=need: c_call(EDB, a, workspace=ws, workspace_size=need), run)
        assert st == 0, (sized, run, msg)
        assert_c_close(a["out"], ref, f"out (sized on {sized}, run on {run} threads)")
    acl = Acl()
    try:
        for sized, run in ((1, 2), (2, 1)):
            a["out"][...] = 7
            ts = [acl.tensor(a[k]) for k in ("grad", "indices", "out")]
            st, size, ex = _on_thread(lambda ts=ts: acl.phase1(ts[0], ts[1], ts[2], 40, 3, True), sized)
            assert st == 0
            ws = np.zeros(size, np.uint8)
            assert _on_thread(lambda ws=ws, size=size, ex=ex: acl.run_fn(ws.ctypes.data, size, ex, None), run) == 0, \
                lib().opgen_last_error()
            assert_c_close(a["out"], ref, "out (aclnn)")
    finally:
        acl.close()


def _fork_case() -> tuple[dict[str, Any], np.ndarray]:
    a = edb_args(_rng(14), "f32", "i64", lead=(200, 8), D=64, V=300)
    return a, oracle_outputs(EDB, a)["out"]


def _child_computes(a: dict[str, Any], ref: np.ndarray) -> int:
    """In a forked child: 0 when the op (run twice) gives the oracle's result with 1 thread."""
    import signal

    signal.alarm(30)  # a hang kills the child (SIGALRM), which the parent reports
    for _ in range(2):
        a["out"][...] = 7
        st, msg = c_call(EDB, a)
        if st != 0:
            print("child:", msg, flush=True)
            return 3
        assert_c_close(a["out"], ref, "out (forked child)")
    return 0 if lib().opgen_team() == 1 else 4


def _mp_target(q: Any) -> None:
    a, ref = _fork_case()
    q.put(_child_computes(a, ref))


def check_fork_after_parallel_regions() -> None:
    """The parent runs parallel regions (2 threads), then forks: the child's calls return the
    oracle's result (os.fork and multiprocessing 'fork'), and the parent's still do."""
    import multiprocessing

    L = lib()
    a, ref = _fork_case()
    for _ in range(3):
        st, msg = c_call(EDB, a)
        assert st == 0, msg
    assert L.opgen_team() == 2
    pid = os.fork()
    if pid == 0:
        code = 5
        try:
            code = _child_computes(a, ref)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"os.fork child: {how}"
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_mp_target, args=(q,))
    p.start()
    p.join(60)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("multiprocessing 'fork' child hung")
    assert p.exitcode == 0 and q.get(timeout=5) == 0, p.exitcode
    a["out"][...] = 7
    st, msg = c_call(EDB, a)  # the parent keeps its threads
    assert st == 0 and L.opgen_team() == 2, msg
    assert_c_close(a["out"], ref, "out (parent after fork)")


# ---------------------------------------------------------------------------------- the driver
CHECKS = {name[len("check_"):]: fn for name, fn in sorted(globals().items()) if name.startswith("check_")}
THREAD_CHECKS = ("team_functions", "workspace_size_independent_of_threads", "fork_after_parallel_regions")
BAD_INPUT_CHECKS = tuple(n for n in CHECKS if n not in THREAD_CHECKS)


def main(argv: list[str]) -> int:
    """Run the named checks (all by default); with ``--keep-going``, run every one even after a
    failure (reported as ``FAILED name: error``). Exit status 1 if any failed."""
    import traceback

    keep_going = "--keep-going" in argv
    names = [a for a in argv if a != "--keep-going"] or list(CHECKS)
    failed = 0
    for name in names:
        try:
            CHECKS[name]()
        except Exception as e:
            if not keep_going:
                raise
            failed += 1
            traceback.print_exc()
            print(f"FAILED {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        print(f"ok {name}", flush=True)
    return 1 if failed else 0


def _run(names: list[str], env: dict[str, str] | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    e = dict(os.environ if env is None else env)
    e["OMP_NUM_THREADS"] = "2"
    return subprocess.run([sys.executable, "-m", "tests.test_abi_hardening", *names], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", list(CHECKS))
def test_check(name: str) -> None:
    r = _run([name])
    assert r.returncode == 0 and f"ok {name}" in r.stdout, \
        f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"


def test_saturating_size_helpers(tmp_path) -> None:
    """opgen_sz_mul / opgen_sz_add / opgen_sz_dim / opgen_align of generated/cpu/opgen_rt.h
    (tests/c/sz_helpers.c): exact below the limit, SIZE_MAX (sticky) past it, never a wrap."""
    exe = tmp_path / "sz_helpers"
    cmd = [cc.compiler(), "-std=c11", "-Wall", "-Wextra", "-Werror", "-fopenmp", f"-I{REPO / 'generated' / 'cpu'}",
           f"-I{REPO / 'generated' / 'include'}", str(REPO / "tests" / "c" / "sz_helpers.c"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "sz helpers ok" in r.stdout, r.stdout + r.stderr


def test_bad_input_under_asan_and_ubsan() -> None:
    """The bad-input checks again, against the ASan + UBSan instrumented library: no report."""
    so = cc.build_library(REPO / "generated" / "cpu", REPO / "generated" / "include", REPO / "build" / "cpu",
                          sanitize=True, verbose=False)
    r = _run(["--keep-going", *BAD_INPUT_CHECKS], sanitizer_env(OPGEN_LIB=str(so)), timeout=300)
    found = [m for m in BAD_MARKERS if m in r.stderr]
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    assert r.returncode == 0 and not found and not failed, \
        f"rc={r.returncode} {found}\n{chr(10).join(failed)}\n{r.stdout[-3000:]}\n{r.stderr[:6000]}"
    assert all(f"ok {n}" in r.stdout for n in BAD_INPUT_CHECKS), r.stdout


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
