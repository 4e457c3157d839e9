"""Shared by the tests of the compiled CPU library (test_cpu_abi, test_cpu_determinism,
test_cpu_sanitizers) and their subprocess worker (tests/cpu_worker.py): input builders for every
op, a raw call into the plain C ABI that returns the exact status code, and the tolerance of the
C library against the numpy oracle.

Tolerance (C vs oracle). Both accumulate f16/bf16 in f32 and round once, but in a different
order, so two f32 values that differ by summation-order noise ``d`` may round to neighbouring
values of the storage dtype. Elementwise the bound is therefore

    |c - oracle| <= EPS[T] * max(|c|, |oracle|) + TINY[T] + REORDER[T] * max|oracle|

with EPS[T] the machine epsilon of the storage dtype (one ulp at that magnitude; 0 for f32 and
f64 beyond their own rounding), TINY the smallest subnormal, and REORDER the f32 (f64)
summation-order noise relative to the largest result. NaN/Inf positions and signs must match.

A kernel whose matmuls take bf16 products on bf16 units (narrow-products: on a machine with AMX
or AVX512-BF16, the bf16 instances of the cross-entropy gradients) rounds an operand computed in f32 — the
logits' gradient — to bf16 before its products, as PyTorch's bf16 path does; its bf16 results
are then held to SPEC §0's margin for bf16 (PRODUCTS, relative to max|oracle|) instead of
REORDER. tests/test_gemm.py checks those products tightly; test_flce_vs_torch holds the op to
SPEC §0's policy against PyTorch's own bf16 computation.

This module imports no torch, so the worker can run under an ASan-preloaded interpreter.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import ml_dtypes
import numpy as np

from opgen import dtypes, oracle, registry, runtime
from opgen.binding import to_numpy
from opgen.lower import sched
from opgen.passes import pipeline

NP = {
    "f16": np.dtype(np.float16), "bf16": np.dtype(ml_dtypes.bfloat16), "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64), "i8": np.dtype(np.int8), "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32), "i64": np.dtype(np.int64), "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16), "u32": np.dtype(np.uint32), "u64": np.dtype(np.uint64),
    "bool": np.dtype(np.bool_),
}

EPS = {"f16": 2.0**-10, "bf16": 2.0**-7, "f32": 0.0, "f64": 0.0}
TINY = {"f16": 2.0**-24, "bf16": 2.0**-133, "f32": 2.0**-149, "f64": 0.0}
REORDER = {"f16": 1e-5, "bf16": 1e-5, "f32": 1e-5, "f64": 1e-12}
#: SPEC §0's margin for results of bf16 tile products (module docstring)
PRODUCTS = {"bf16": 8e-3}

#: plain-ABI status codes (generated/include/opgen.h)
CODE = {"null": 1, "param": 2, "shape": 3, "dtype": 4, "strides": 5, "index": 6, "workspace": 7}

SENTINEL = 7.0

FLCE = "fused_linear_cross_entropy_loss_grad"


# ----------------------------------------------------------------------------- arrays


def rounded(a: Any, T: str) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).astype(NP[T])


def floats(rng: np.random.Generator, shape: Any, T: str, scale: float = 1.0) -> np.ndarray:
    return rounded(rng.standard_normal(shape) * scale, T)


def filled(shape: Any, T: str, value: float = SENTINEL) -> np.ndarray:
    return np.full(shape, value, NP[T])


def root(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s memory (for byte-exact 'nothing was written' checks)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def name_of(a: np.ndarray) -> str:
    return dtypes.from_numpy(a.dtype).name


def reversed_rows(a: np.ndarray) -> np.ndarray:
    """Same values, stored bottom-up: a negative row stride."""
    return np.ascontiguousarray(a[::-1])[::-1]


def row_strided(a: np.ndarray, pad: int = 3) -> np.ndarray:
    """Same values as a column block of a wider array (last dim contiguous, row stride larger)."""
    wide = filled((*a.shape[:-1], a.shape[-1] + pad), name_of(a))
    wide[..., pad:] = a
    return wide[..., pad:]


def permuted_leading(a: np.ndarray) -> np.ndarray:
    """Same values, (B, S, ...) stored as (S, B, ...): leading axes that cannot be coalesced."""
    return np.ascontiguousarray(np.swapaxes(a, 0, 1)).swapaxes(0, 1)


# ----------------------------------------------------------------------------- builders


def eb_args(rng, T, IT, N=37, D=13, N1=7, N2=11, table2=True, acc=(True, False),
            alpha=(2.0, -0.75), i2=None, dtable2=None) -> dict[str, Any]:
    """embedding_backward: two tables of different sizes, duplicated indices; a table with
    acc=1 holds random values, one with acc=0 holds NaN (which must be ignored)."""
    dy = floats(rng, (N, D), T, 2.0)
    i1 = rng.integers(0, N1, N)
    i1[: min(N, 5)] = N1 - 1
    j2 = rng.integers(0, N2, N)
    j2[-min(N, 4):] = 0
    t1 = floats(rng, (N1, D), T) if acc[0] else filled((N1, D), T, np.nan)
    t2 = floats(rng, (N2, D), T) if acc[1] else filled((N2, D), T, np.nan)
    a = {"dy": dy, "i1": i1.astype(NP[IT]), "alpha1": alpha[0], "dtable1_acc": acc[0],
         "dtable1": t1}
    use_i2 = table2 if i2 is None else i2
    use_t2 = table2 if dtable2 is None else dtable2
    if use_i2:
        a["i2"] = j2.astype(NP[IT])
        a["alpha2"] = alpha[1]
    if use_t2:
        a["dtable2"] = t2
        a["dtable2_acc"] = acc[1]
    return a


def edb_indices(rng, shape, V, IDX) -> np.ndarray:
    if IDX == "bool":
        return rng.random(shape) < 0.5
    i = rng.integers(0, V, shape)
    flat = i.reshape(-1)
    flat[: min(flat.size, 4)] = V - 1
    if NP[IDX].kind == "f":  # fractional parts that truncation toward zero must drop
        return (i + rng.choice([0.0, 0.25, 0.75], shape)).astype(NP[IDX])
    return i.astype(NP[IDX])


def edb_args(rng, T, IDX, lead=(3, 5), D=9, V=11, padding_idx=3, scale=True) -> dict[str, Any]:
    V = 2 if IDX == "bool" else V
    return {"grad": floats(rng, (*lead, D), T), "indices": edb_indices(rng, lead, V, IDX),
            "num_weights": V, "padding_idx": padding_idx if IDX != "bool" else 1,
            "scale_grad_by_freq": scale, "out": filled((V, D), T)}


def ebw_args(rng, IT, W, T, N=29, D=10, V=9) -> dict[str, Any]:
    idx = rng.integers(0, V, N)
    idx[: min(N, 6)] = min(2, V - 1)
    return {"indices": idx.astype(NP[IT]), "weight": filled((V, D), W, np.nan),
            "grad": floats(rng, (N, D), T), "out": filled((V, D), T)}


def rms_args(rng, T, shape=(6, 40), eps=1e-6) -> dict[str, Any]:
    D = shape[-1]
    return {"grad_y": floats(rng, shape, T), "x": floats(rng, shape, T, 1.5),
            "w": floats(rng, D, T), "eps": eps, "grad_x": filled(shape, T),
            "grad_w": filled(D, T)}


def softmax_inputs(X: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(softmax, logits_max, sum_exp) of X W^T, f32, consistent with each other."""
    logits = X.astype(np.float64) @ W.astype(np.float64).T
    lmax = logits.max(axis=1) if logits.shape[1] else np.zeros(logits.shape[0])
    lmax32 = lmax.astype(np.float32)
    e = np.exp(logits - lmax32.astype(np.float64)[:, None])
    s = e.sum(axis=1)
    with np.errstate(all="ignore"):
        sm = (e / s[:, None]).astype(np.float32)
    return sm, lmax32, s.astype(np.float32)


def flce_args(rng, T, M, TI, mode, BT=70, H=20, V=300, mask_p=0.4, mask_extra=0) -> dict[str, Any]:
    """fused_linear_cross_entropy_loss_grad in ``mode`` "softmax" or "memory_saving"; the mask
    is bit-packed (M=u8, ``mask_extra`` extra bytes) or bool (M=bool, extra flags)."""
    X = floats(rng, (BT, H), T)
    W = floats(rng, (V, H), T, 0.5)
    sm, lmax, sexp = softmax_inputs(X, W)
    outside = rng.random(BT) < mask_p
    if M == "u8":
        mask = np.concatenate([np.packbits(outside, bitorder="little"),
                               rng.integers(0, 256, mask_extra).astype(np.uint8)])
    else:
        mask = np.concatenate([outside, rng.random(mask_extra) < 0.5])
    a = {"grad": floats(rng, BT, "f32"), "input": X, "weight": W, "target_mask": mask,
         "masked_target": rng.integers(0, V, BT).astype(NP[TI]),
         "input_grad": filled((BT, H), T), "weight_grad": filled((V, H), T)}
    if mode == "softmax":
        a["softmax"] = sm
    else:
        a["logits_max"], a["sum_exp_logits"] = lmax, sexp
    return a


# ----------------------------------------------------------------------------- checks


@functools.cache
def bf16_products(name: str) -> bool:
    """Op ``name``'s C kernels take bf16 products on bf16 units in this process (module
    docstring): a matmul marked by narrow-products, and opgen_bf16_units() > 0."""
    if not runtime.load().opgen_bf16_units():
        return False
    m = pipeline.run(registry.get(name).module(), "cpu", until="narrow-products")
    return any(isinstance(x, sched.BufferMatmulOp) and x.products is not None for x in m.walk())


def assert_c_close(ours: np.ndarray, ref: np.ndarray, what: str = "", products: bool = False) -> None:
    """The C result against the oracle's (same storage dtype), per the module docstring
    (``products``: the op's matmuls took bf16 products, :func:`bf16_products`)."""
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} vs oracle {ref.dtype}"
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs oracle {ref.shape}"
    T = name_of(ours)
    o, r = ours.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(o), np.isnan(r)), (
        f"{what}: NaN positions differ: C {np.argwhere(np.isnan(o)).tolist()[:6]} vs oracle "
        f"{np.argwhere(np.isnan(r)).tolist()[:6]}")
    for s in (np.inf, -np.inf):
        assert np.array_equal(o == s, r == s), f"{what}: {s} positions differ"
    fin = np.isfinite(r)
    if not fin.any():
        return
    scale = float(np.abs(r[fin]).max())
    err = np.abs(o[fin] - r[fin])
    margin = PRODUCTS.get(T, REORDER[T]) if products else REORDER[T]
    bound = EPS[T] * np.maximum(np.abs(o[fin]), np.abs(r[fin])) + TINY[T] + margin * scale
    bad = err > bound
    if bad.any():
        k = int(np.argmax(err - bound))
        pos = np.argwhere(fin)[k].tolist()
        raise AssertionError(
            f"{what} [{T}]: {int(bad.sum())} of {err.size} elements beyond tolerance; worst at "
            f"{pos}: C {o[fin][k]!r} vs oracle {r[fin][k]!r} (bound {bound[k]:.3e}, max|ref| "
            f"{scale:.3e})")


def copied(args: dict[str, Any]) -> dict[str, Any]:
    """``args`` with every array copied (for the oracle beside a call that writes its outputs)."""
    return {k: np.copy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}


def snapshot(args: dict[str, Any]) -> dict[str, bytes]:
    return {k: np.array(v).tobytes() for k, v in args.items() if isinstance(v, np.ndarray)}


def oracle_outputs(name: str, args: dict[str, Any], precision: str = "native") -> dict[str, np.ndarray]:
    """The oracle on copies of ``args`` (so an in-place alias in ``args`` cannot matter)."""
    copies = {k: np.array(v, order="C") if isinstance(v, np.ndarray) else v for k, v in args.items()}
    return oracle.run(registry.get(name), precision=precision, **copies)


def check_against_oracle(name: str, args: dict[str, Any], aliased: tuple[str, ...] = ()) -> dict:
    """Run the oracle (on copies) and the C library (on ``args``); every output the oracle
    writes must match, every output it does not write must be left byte-identical, and no
    input (except those in ``aliased``, which are also outputs) may change."""
    ref = oracle_outputs(name, args)
    o = registry.get(name)
    out_names = {p.name for p in o.signature.outputs}
    before = snapshot(args)
    got = runtime.call(name, **args)
    for k, v in ref.items():
        assert k in got, f"{name}: C returned no {k}"
        assert_c_close(got[k], v, f"{name}.{k}", bf16_products(name))
    for k, v in args.items():
        if not isinstance(v, np.ndarray) or k in ref or k in aliased:
            continue
        what = "output not written by this variant" if k in out_names else "input"
        assert np.array(v).tobytes() == before[k], f"{name}: {what} '{k}' was modified"
    return got


# ----------------------------------------------------------------------------- raw C calls


class Hold:
    """Keeps ctypes objects alive for the duration of a raw call."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def keep(self, x: Any) -> Any:
        self.items.append(x)
        return x


def c_call(name: str, args: dict[str, Any], tamper: dict[str, Any] | None = None,
           workspace: np.ndarray | None = None, workspace_size: int | None = None,
           lib: ctypes.CDLL | None = None, size_query: bool = False) -> tuple[int, str | int]:
    """Call ``opgen_<name>`` (or, with ``size_query``, ``opgen_<name>_workspace_size``) with
    descriptors built like ``runtime.call`` builds them; ``tamper[param](desc, hold)`` may edit a
    descriptor first. Returns (status code, last error message) — or (status, size) for a size
    query. Nothing is allocated: every output must be in ``args``."""
    o = registry.get(name)
    lib = lib or runtime.load()
    hold = Hold()

    def tensor_arg(p: Any, v: Any) -> tuple[Any, Any, Any]:
        desc, keep = runtime.describe(to_numpy(v), check_aligned=False)  # the library must refuse it
        hold.keep(keep)
        if tamper and p.name in tamper:
            tamper[p.name](desc, hold)
        return v, desc, hold

    cargs, _, _ = runtime.marshal(o.signature, args, tensor_arg)
    if size_query:
        size = ctypes.c_size_t(0)
        st = getattr(lib, f"opgen_{o.name}_workspace_size")(*cargs, ctypes.byref(size))
        return st, size.value
    ws = None if workspace is None else ctypes.c_void_p(workspace.ctypes.data)
    n = workspace_size if workspace_size is not None else (0 if workspace is None else workspace.nbytes)
    st = getattr(lib, f"opgen_{o.name}")(*cargs, ws, ctypes.c_size_t(n))
    return st, lib.opgen_last_error().decode()


def set_shape(desc: Any, hold: Hold, shape: tuple[int, ...], strides: tuple[int, ...] | None = None) -> None:
    """Give a descriptor another shape (and strides, in elements) — for shapes numpy cannot make."""
    n = max(len(shape), 1)
    desc.ndim = len(shape)
    desc.shape = ctypes.cast(hold.keep((ctypes.c_int64 * n)(*shape)), ctypes.POINTER(ctypes.c_int64))
    if strides is not None:
        desc.strides = ctypes.cast(hold.keep((ctypes.c_int64 * n)(*strides)),
                                   ctypes.POINTER(ctypes.c_int64))
