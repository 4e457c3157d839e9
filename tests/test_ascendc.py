"""The Ascend C target without an NPU: the generated kernels and host code (generated/ascendc/)
compiled with g++ against the project's CPU model of the Ascend C subset (tests/ascendc_model:
vendor spellings, blocks as threads with private unified buffers, the ten hardware rules enforced)
and run through ``opgen_ascendc_<op>`` against the oracle (tests/ascendc_worker.py, in a
subprocess: a broken rule aborts it). Also: results bitwise identical for 1, 3 and 48 cores;
the statuses of bad input equal the CPU library's; ops written only in an ops directory (SiLU,
softmax and LayerNorm backward) get kernels that pass; the static report meets the traffic and
core goals; ops the tile level cannot express yet are reported, not built.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from opgen import registry, runtime
from opgen.binding import OpError
from opgen.emit import ascendc
from tests.ascendc_model import build as model
from tests.cpu_cases import rms_args
from tests.test_new_op_backends import GELU, GELU_TANH, LN_CAST

REPO = registry.REPO_ROOT
OUT = REPO / "build" / "ascendc-model"
FLCE = "fused_linear_cross_entropy_loss_grad"
pytestmark = pytest.mark.skipif(model.cxx() is None, reason="no g++: the Ascend C model cannot be built")

NEW_OPS = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f16, bf16, f32)


@op
def silu_backward(grad: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], *, dx: Output[T, Batch(N), D]):
    """d/dx of x * sigmoid(x)."""
    s = sigmoid(x)
    return {"dx": grad * s * (1 + x * (1 - s))}


@op
def softmax_backward(grad: Tensor[T, Batch(N), D], y: Tensor[T, Batch(N), D], *, dx: Output[T, Batch(N), D]):
    """dx = y * (g - sum(g * y)) along the last dim."""
    return {"dx": y * (grad - sum(grad * y, axis=-1, keepdims=True))}


@op
def layer_norm_backward(grad_y: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], w: Tensor[T, D],
                        eps: float = 1e-5, *, grad_x: Output[T, Batch(N), D], grad_w: Output[T, D],
                        grad_b: Output[T, D]):
    """LayerNorm backward; weight and bias gradients summed over the rows."""
    mu = mean(x, axis=-1, keepdims=True)
    xc = x - mu
    rstd = rsqrt(mean(xc * xc, axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    g = grad_y * w
    gx = rstd * (g - mean(g, axis=-1, keepdims=True) - xhat * mean(g * xhat, axis=-1, keepdims=True))
    return {"grad_x": gx, "grad_w": sum(grad_y * xhat, axis=0), "grad_b": sum(grad_y, axis=0)}
'''


#: a mask of six dtypes read only as ``cast(keep, boolean)``: converted once by the host entry,
#: on the NPU (opgen/tile/boundary.py), so the kernels are instantiated per T only
GATE_OP = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16, f16)
M = dtype_var("M", boolean, u8, i32, f32, bf16, f16)


@op
def gate_rows(x: Tensor[T, Batch(N), D], keep: Tensor[M, Batch(N)], *, y: Output[T, Batch(N), D]):
    """y = x on rows whose keep flag is non-zero (NaN counts as non-zero), else x * 0."""
    return {"y": x * cast(cast(keep, boolean), f32)[:, None]}
'''


#: a matmul chain reading its targets only as ``cast(t, i64)``: converted once by the host (NPU
#: kernels per dtype on Ascend, a read-back on TT-Metal), kernels per T only
TARGET_OP = '''
from opgen.dsl import *

BT, H, V = dims("BT H V")
T = dtype_var("T", bf16)
TI = dtype_var("TI", i32, f32, bf16, u8)


@op
def target_logit_grad(x: Tensor[T, BT, H], w: Tensor[T, V, H], lmax: Tensor[f32, BT], sexp: Tensor[f32, BT],
                      t: Tensor[TI, BT], *, gx: Output[T, BT, H]):
    """gx = (exp(x w^T - lmax) / sexp - onehot(t)) w, t truncated toward zero (any other
    value, NaN included, marks no column)."""
    probs = exp(x @ w.T - lmax[:, None]) / sexp[:, None]
    is_t = iota((BT, V), axis=1) == cast(t, i64)[:, None]
    return {"gx": (probs - where(is_t, 1.0, 0.0)) @ w}
'''


#: per-element conditions: comparisons against a tile, a per-row value and scalars (either side),
#: selects of two tiles and of a tile and a scalar, a comparison used as a number
MASK_OPS = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16, f16)


@op
def relu_backward(grad: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], *, dx: Output[T, Batch(N), D]):
    """dx = grad where x > 0, else 0 (NaN: 0)."""
    return {"dx": where(x > 0, grad, 0.0)}


@op
def clip_grad(g: Tensor[T, N, D], x: Tensor[T, N, D], lo: Tensor[T, N], *, dx: Output[T, N, D],
              hits: Output[T, N, D]):
    """The gradient of clip(x, lo, 1) (per-row lower bounds), and 1 where x sits on the lower bound
    or 2.5 <= g (a scalar on the left), else -3."""
    inside = where(x > lo[:, None], g, x * 0.0)
    return {"dx": inside * cast(x <= 1.0, f32), "hits": where((x == lo[:, None]) | (2.5 <= g), 1.0, -3.0)}
'''


def target_cases(rng: np.random.Generator, BT: int = 40, H: int = 24, V: int = 70) -> list[tuple[str, dict]]:
    """target_logit_grad's arguments with targets of four dtypes: fractions, negatives, NaN and
    values past V (the softmax statistics computed in f32 from the inputs)."""
    from tests.cpu_cases import floats

    base = np.array([0, 3, V - 1, V, -1, 5.7, -0.5, np.nan, 12.9, 1e9])
    out = []
    for dt in ("i32", "f32", "bf16", "u8"):
        t = np.resize(base, BT)
        if dt in ("i32", "u8"):
            t = np.nan_to_num(np.trunc(t), nan=7.0)
            t = np.clip(t, 0, 200) if dt == "u8" else np.clip(t, -5, 10**6)
        x, w = floats(rng, (BT, H), "bf16"), floats(rng, (V, H), "bf16")
        logits = x.astype(np.float32) @ w.astype(np.float32).T
        out.append((dt, {"x": x, "w": w, "lmax": logits.max(axis=1).astype(np.float32),
                         "sexp": np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1).astype(np.float32),
                         "t": t.astype({"i32": np.int32, "f32": np.float32, "bf16": ml_dtypes.bfloat16,
                                        "u8": np.uint8}[dt]), "gx": np.zeros((BT, H), ml_dtypes.bfloat16)}))
    return out


def _library(generated: Path, out: Path) -> Path:
    """The Ascend library of a generated tree, built against the model."""
    sources = {p.name: p.read_text() for p in (generated / "ascendc").iterdir() if p.is_file()}
    return model.build(sources, out, include_dirs=[generated / "include"])


@pytest.fixture(scope="module")
def new_ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(library, environment) of the three new ops, generated from their own ops directory."""
    return _ops_library(tmp_path_factory.mktemp("ascendc-ops"), "opgen_test_ascendc_ops", "new-ops",
                        {"newops.py": NEW_OPS, "gate.py": GATE_OP, "target.py": TARGET_OP, "ln_cast.py": LN_CAST,
                         "mask.py": MASK_OPS, "gelu.py": GELU, "gelu_tanh.py": GELU_TANH})


def _ops_library(root: Path, package: str, out: str, files: dict[str, str]) -> tuple[Path, dict[str, str]]:
    """(the model's library, the environment naming the ops directory) of DSL ``files`` written
    into ``root/package`` and built by ``opgen build`` (a subprocess), the library in ``OUT/out``."""
    ops = root / package
    ops.mkdir()
    for name, text in files.items():
        (ops / name).write_text(text)
    env = dict(os.environ, OPGEN_OPS_DIR=str(ops))
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--out", str(root / "generated"), "-q"],
                       cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return _library(root / "generated", OUT / out), env


def _run(lib: Path, cases: list[tuple[str, str, dict[str, Any]]], tmp: Path, cores: int,
         env: dict[str, str] | None = None) -> dict[str, np.ndarray]:
    cases_file, out_file = tmp / f"cases{cores}.pkl", tmp / f"out{cores}.npz"
    cases_file.write_bytes(pickle.dumps(cases))
    e = dict(env or os.environ, OPGEN_ASCEND_AIV_CORES=str(cores))
    r = subprocess.run([sys.executable, "-m", "tests.ascendc_worker", str(lib), str(cases_file), str(out_file)],
                       cwd=REPO, env=e, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"cores={cores}\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    with np.load(out_file) as z:
        return {k: z[k] for k in z.files}


def _bitwise_across_cores(lib: Path, cases: list, tmp: Path, env: dict[str, str] | None = None,
                          cores: tuple[int, ...] = (1, 3, 48)) -> None:
    """Every case passes against the oracle on each number of cores, with the same bits."""
    runs = {c: _run(lib, cases, tmp, c, env) for c in cores}
    for c in cores[1:]:
        assert runs[c].keys() == runs[cores[0]].keys()
        for k in (k for k in runs[cores[0]] if not k.startswith("status.")):
            assert runs[c][k].tobytes() == runs[cores[0]][k].tobytes(), f"{k}: {c} cores differ from {cores[0]}"


# ---------------------------------------------------------------------- seed ops

def _rms_cases() -> list[tuple[str, str, dict[str, Any]]]:
    rng = np.random.default_rng(7)
    cases = []
    for T in ("f32", "f16", "bf16"):
        for shape in ((7, 13), (300, 520), (1000, 1), (2, 3, 40), (0, 8), (3, 0), (1, 4096)):
            for eps in (0.0, 1e-6):
                a = rms_args(rng, T, shape, eps)
                cases.append((f"rms-{T}-{'x'.join(map(str, shape))}-{eps}", "rms_norm_backward", a))
    a = rms_args(rng, "bf16", (33, 70), 1e-6)
    a["grad_x"] = a["grad_y"]  # in place (may_alias)
    cases.append(("rms-in-place", "rms_norm_backward", a))
    return cases


def test_rms_norm_backward_on_the_model(seed_lib, tmp_path):
    _bitwise_across_cores(seed_lib, _rms_cases(), tmp_path)


def test_infiniop_facade_of_the_ascend_library(seed_lib, tmp_path):
    """infiniopRMSNormBackward and infiniopEmbeddingBackward on an ASCEND handle run the Ascend
    kernels (the same facade code as the CPU library's, over opgen_ascendc_<op>)."""
    rng = np.random.default_rng(5)
    cases = [(f"infiniop-{T}", "infiniop:rms_norm_backward", rms_args(rng, T, (2, 9, 48), 0.0))
             for T in ("f32", "f16", "bf16")]
    from tests.cpu_cases import eb_args

    for T, IT in (("f32", "i64"), ("bf16", "i32")):  # (the run has no workspace: the library allocates one)
        a = eb_args(rng, T, IT, table2=False, acc=(False, False), alpha=(1.0, 0.0))
        cases.append((f"infiniop-eb-{T}", "infiniop:embedding_backward", a))
    _bitwise_across_cores(seed_lib, cases, tmp_path, cores=(1, 48))


def test_rows_longer_than_the_unified_buffer_use_column_tiles(seed_lib, tmp_path):
    """D = 65,536 (and 9,000) f32/bf16 rows do not fit one tile: the column-tile kernel walks each
    row in chunks (the model aborts if the unified buffer is ever exceeded)."""
    rng = np.random.default_rng(1)
    cases = [(f"rms-{T}-{n}x{d}", "rms_norm_backward", rms_args(rng, T, (n, d), 1e-6))
             for T, n, d in (("f32", 2, 65536), ("bf16", 3, 9000))]
    _bitwise_across_cores(seed_lib, cases, tmp_path, cores=(1, 2))


# ---------------------------------------------------------------------- scatter-adds

def _edb(rng: np.random.Generator, T: str, IDX: str, idx: np.ndarray, D: int, V: int, pad: int,
         scale: bool) -> dict[str, Any]:
    from tests.cpu_cases import NP, filled, floats

    return {"grad": floats(rng, (*idx.shape, D), T), "indices": idx.astype(NP[IDX]), "num_weights": V,
            "padding_idx": pad, "scale_grad_by_freq": scale, "out": filled((V, D), T)}


def _scatter_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """The three embedding backward seeds: every index dtype the NPU converts, both scale modes,
    padding rows, duplicates (one row holding thousands of positions: more than a window), empty
    tensors, D = 1 and D not a multiple of 16, V = 1, both tables / one table / accumulate flags."""
    from tests.cpu_cases import eb_args, ebw_args, edb_args

    rng = np.random.default_rng(21)
    cases = []
    for T in ("f32", "f16", "bf16"):
        for IDX in ("f32", "f16", "i64", "i32", "i16", "i8", "u8", "bool"):
            cases.append((f"edb-{T}-{IDX}", "embedding_dense_backward", edb_args(rng, T, IDX, scale=IDX != "i8")))
    for T in ("f32", "bf16"):
        for n, D, V, pad, scale in ((0, 5, 4, 1, True), (40, 1, 7, 0, True), (100, 33, 1, -1, True),
                                    (300, 17, 2000, 5, False), (9, 0, 3, 1, True), (0, 3, 0, -1, False),
                                    (5000, 16, 3, 2, True)):
            cases.append((f"edb-{T}-{n}x{D}-V{V}", "embedding_dense_backward",
                          _edb(rng, T, "i64", rng.integers(0, max(V, 1), n), D, V, pad, scale)))
    for T in ("f32", "f16", "bf16"):
        for IT in ("i64", "i32", "u8"):
            cases.append((f"eb-{T}-{IT}", "embedding_backward", eb_args(rng, T, IT)))
    cases.append(("eb-one-table", "embedding_backward", eb_args(rng, "f32", "i32", table2=False, acc=(False, False))))
    cases.append(("eb-i2-only", "embedding_backward", eb_args(rng, "bf16", "i16", dtable2=False, alpha=(1.0, 0.5))))
    cases.append(("eb-empty", "embedding_backward", eb_args(rng, "f32", "i64", N=0)))
    for IT in ("u32", "i32", "i64"):
        for W, T in (("f64", "bf16"), ("f16", "f32")):
            cases.append((f"ebw-{IT}-{W}-{T}", "embedding_bw", ebw_args(rng, IT, W, T)))
    return cases


def test_scatter_adds_on_the_model(seed_lib, tmp_path):
    """Owner-computes scatter-adds: every case against the oracle, the same bits on 1, 3 and 48
    cores (each table row is summed in increasing position on any number of cores)."""
    _bitwise_across_cores(seed_lib, _scatter_cases(), tmp_path)


def test_scatter_add_extremes(seed_lib, tmp_path):
    """D = 65,536 (column tiles) and V = 2^20 table rows: the unified buffer is never exceeded."""
    rng = np.random.default_rng(4)
    cases = [("edb-wide", "embedding_dense_backward",
              _edb(rng, "f32", "i32", rng.integers(0, 4, 6), 65536, 4, 1, True)),
             ("edb-tall", "embedding_dense_backward",
              _edb(rng, "bf16", "i64", rng.integers(0, 2**20, 64), 1, 2**20, 7, True))]
    _bitwise_across_cores(seed_lib, cases, tmp_path, cores=(1, 5))


# ---------------------------------------------------------------------- new ops

def _new_cases() -> list[tuple[str, str, dict[str, Any]]]:
    from tests.cpu_cases import floats

    rng = np.random.default_rng(11)
    cases = []
    for T in ("f32", "bf16", "f16"):
        for shape in ((9, 33), (130, 64), (2, 5, 17), (0, 4)):
            g, x = floats(rng, shape, T), floats(rng, shape, T)
            cases.append((f"silu-{T}-{shape}", "silu_backward", {"grad": g, "x": x}))
            y = floats(rng, shape, T, 0.2)
            cases.append((f"softmax-{T}-{shape}", "softmax_backward", {"grad": g, "y": y}))
            w = floats(rng, shape[-1], T)
            cases.append((f"layernorm-{T}-{shape}", "layer_norm_backward", {"grad_y": g, "x": x, "w": w}))
    return cases


def _gate_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """gate_rows with its mask in each of six dtypes: zeros, ones, other values, -0.0, NaN and
    infinities, 0.4 (non-zero: a bool cast is ``!= 0``), an empty call and batch dims."""
    from tests.cpu_cases import floats

    rng = np.random.default_rng(13)
    special = np.array([0.0, 1.0, -0.0, np.nan, np.inf, -np.inf, 0.4, -3.0, 7.0, 0.0, 2.0, 0.0])
    cases = []
    for T in ("f32", "bf16"):
        for M in ("bool", "u8", "i32", "f32", "bf16", "f16"):
            for shape in ((12, 33), (2, 6, 17), (0, 5)):
                n = int(np.prod(shape[:-1]))
                flags = np.resize(special, n)
                keep = (flags != 0) if M == "bool" else \
                    np.abs(np.nan_to_num(flags, nan=3.0, posinf=9.0, neginf=5.0)).astype(NP_INT[M]) \
                    if M in NP_INT else flags.astype(NP_FLOAT[M])
                a = {"x": floats(rng, shape, T), "keep": keep.reshape(shape[:-1])}
                cases.append((f"gate-{T}-{M}-{'x'.join(map(str, shape))}", "gate_rows", a))
    return cases


def test_tensor_read_only_cast_is_converted_on_the_npu(new_ops, tmp_path):
    """A mask read only as ``cast(keep, boolean)``, and a matmul chain's targets read only as
    ``cast(t, i64)``, are converted at the boundary: one kernel per T (not per mask or target
    dtype), the host entry of each dtype converting first with an NPU kernel
    (``opgen_convert_<dtype>_bool`` / ``_i64``); against the oracle, bitwise across cores."""
    from opgen import registry
    from opgen.emit import ascendc

    lib, env = new_ops
    src = ascendc.op_sources(registry.load_all(env["OPGEN_OPS_DIR"])["gate_rows"])
    assert src["ascendc/gate_rows_kernel.cpp"].count("__global__") == 6  # T x (resident, streamed)
    host = src["ascendc/gate_rows_host.cpp"]
    assert "opgen_ascendc_convert(&b[1], OPGEN_F16, " in host and "OPGEN_BOOL, " in host
    _bitwise_across_cores(lib, _gate_cases(), tmp_path, env, cores=(1, 3))
    src = ascendc.op_sources(registry.load_all(env["OPGEN_OPS_DIR"])["target_logit_grad"])
    assert src["ascendc/target_logit_grad_kernel.cpp"].count("__global__") == 1  # (a chain: one T)
    assert "opgen_ascendc_convert(&b[4], OPGEN_F32, dims[0], OPGEN_I64, " in src["ascendc/target_logit_grad_host.cpp"]
    cases = [(f"target-{dt}", "target_logit_grad", a) for dt, a in target_cases(np.random.default_rng(3))]
    _bitwise_across_cores(lib, cases, tmp_path, env, cores=(1, 3))


NP_INT = {"u8": np.uint8, "i32": np.int32}
NP_FLOAT = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def test_new_ops_on_the_model(new_ops, tmp_path):
    lib, env = new_ops
    _bitwise_across_cores(lib, _new_cases(), tmp_path, env)


@pytest.fixture(scope="module")
def more_ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(library, environment) of tests/test_more_new_ops.py's ops (those with a rank-0 tensor
    parameter are named and not built: not yet on the tile level)."""
    from tests.test_more_new_ops import SOURCE

    return _ops_library(tmp_path_factory.mktemp("ascendc-more-ops"), "opgen_test_ascendc_more", "more-ops",
                        {"more.py": SOURCE})


def test_more_new_ops_on_the_model(more_ops, tmp_path):
    """A new user's log-softmax, SwiGLU, L2-normalize, softplus and hardswish backward and bias
    gradient (tests/test_more_new_ops.py), against the oracle on the model, bitwise across
    cores: rows shorter and longer than a vector, batch dims, an empty call."""
    from tests.test_more_new_ops import ROWS_ONLY, _inputs

    lib, env = more_ops
    rng = np.random.default_rng(17)
    cases = []
    for T in ("f32", "bf16", "f16"):
        for name in ("log_softmax_backward", "swiglu_backward", "l2norm_backward", "softplus_backward",
                     "hardswish_backward", "bias_grad"):
            for shape in ((9, 33), (130, 64), (2, 5, 17), (0, 4)):
                if len(shape) > 2 and name in ROWS_ONLY:
                    continue
                cases.append((f"{name}-{T}-{shape}", name, _inputs(name, shape, T, rng)))
    _bitwise_across_cores(lib, cases, tmp_path, env, cores=(1, 3))


def _mask_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """Per-element conditions and the expanded erf/tanh (the shared polynomial kernels): values on
    both sides of every threshold and branch point, exact ties, +-0, NaN and +-inf, tiles whose
    elements are no whole number of 256-byte repeats (the comparisons round their count up)."""
    from tests.cpu_cases import floats

    rng = np.random.default_rng(19)
    special = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.nan, np.inf, -np.inf, 0.875, -0.875, 0.55, 3.925, -3.925,
                        5.0, -9.5, 1e-30, -1e-38, 0.3, 12.0, -40.0], np.float64)
    cases = []
    for T in ("f32", "bf16", "f16"):
        for shape in ((9, 33), (130, 64), (2, 5, 17), (0, 4), (1, 1), (3, 70)):
            n = int(np.prod(shape))
            x = np.resize(special, n).reshape(shape) * (1 + rng.random(shape) * (rng.random(shape) < 0.5))
            x = x.astype(NP_FLOAT[T])
            g = floats(rng, shape, T)
            cases.append((f"relu-{T}-{shape}", "relu_backward", {"grad": g, "x": x}))
            w = (rng.standard_normal(shape) * 3).astype(NP_FLOAT[T])
            if n:
                w.reshape(-1)[::7] = x.reshape(-1)[::7]
            mixed = np.where(rng.random(shape) < 0.5, x, w)
            cases.append((f"gelu-{T}-{shape}", "gelu_backward", {"grad": g, "x": mixed}))
            if T != "f16":
                cases.append((f"gelu-tanh-{T}-{shape}", "gelu_tanh_backward", {"grad": g, "x": w}))
            if len(shape) == 2:
                lo = x[:, 0].copy() if shape[1] else np.zeros(shape[0], NP_FLOAT[T])
                cases.append((f"clip-{T}-{shape}", "clip_grad", {"g": (g * 3).astype(NP_FLOAT[T]), "x": x, "lo": lo}))
    return cases


def test_per_element_conditions_and_expanded_math_on_the_model(new_ops, tmp_path):
    """where() by comparisons (Compare / CompareScalar into bit masks, Select, Or of masks, a mask
    cast to a number) and GELU backward in both forms (erf and tanh expanded into the shared
    polynomial kernels: the A2 vector unit has neither) against the oracle, bitwise across cores."""
    lib, env = new_ops
    from opgen import registry
    from opgen.emit import ascendc

    ops = registry.load_all(env["OPGEN_OPS_DIR"])
    for name in ("relu_backward", "clip_grad", "gelu_backward", "gelu_tanh_backward"):
        assert ascendc.unsupported_reason(ops[name]) is None, name
    src = ascendc.op_sources(ops["clip_grad"])["ascendc/clip_grad_kernel.cpp"]
    for call in ("Compare(", "CompareScalar(", "Or(", "VSEL_TENSOR_TENSOR_MODE", "VSEL_TENSOR_SCALAR_MODE"):
        assert call in src, call
    _bitwise_across_cores(lib, _mask_cases(), tmp_path, env, cores=(1, 3))


def test_column_sums_behind_a_cast_on_the_model(new_ops, tmp_path):
    """LayerNorm backward from saved f32 statistics with its weight/bias gradients cast from
    f32 column sums (tests/test_new_op_backends.py's LN_CAST): fused into the row tiles as
    column partials, against the oracle, bitwise across cores."""
    from tests.test_new_op_backends import ln_cast_args

    lib, env = new_ops
    rng = np.random.default_rng(17)
    cases = [(f"ln-cast-{T}-{shape}", "ln_cast_backward", ln_cast_args(rng, T, shape))
             for T in ("f32", "bf16") for shape in ((9, 33), (130, 64), (2, 5, 17), (0, 4))]
    _bitwise_across_cores(lib, cases, tmp_path, env, cores=(1, 3))


# ---------------------------------------------------------------------- FLCE (a matmul chain)

def _flce_cases() -> list[tuple[str, str, dict[str, Any]]]:
    """FLCE in both modes (softmax given; memory-saving from logits_max and sum_exp_logits), every
    binding the NPU serves (T f16/bf16, mask u8/bool, targets i32/i64), one and several 128-blocks
    of rows and vocabulary and several 2,048-spans of each, V = 128, H = 1, no rows / every row
    outside the shard, targets past V on rows outside the shard (ignored), and the variant given
    all three optional tensors."""
    from tests.cpu_cases import flce_args

    rng = np.random.default_rng(31)
    cases = []
    for T in ("f16", "bf16"):
        for M in ("u8", "bool"):
            for TI in ("i32", "i64"):
                for mode in ("softmax", "memory_saving"):
                    cases.append((f"flce-{T}-{M}-{TI}-{mode}", FLCE, flce_args(rng, T, M, TI, mode)))
        for mode in ("softmax", "memory_saving"):
            for BT, H, V, p in ((300, 70, 500, 0.3), (5, 1, 128, 0.5), (0, 8, 130, 0.5), (40, 16, 200, 1.0),
                                (30, 8, 4200, 0.3), (2100, 8, 130, 0.3)):  # (several spans of 2,048)
                a = flce_args(rng, T, "u8", "i64", mode, BT=BT, H=H, V=V, mask_p=p, mask_extra=2)
                cases.append((f"flce-{T}-{mode}-{BT}x{H}x{V}-p{p}", FLCE, a))
        a = flce_args(rng, T, "bool", "i32", "memory_saving", BT=33, H=12, V=140, mask_p=1.0)
        a["masked_target"][::3] = 10**6  # outside the shard: never read as a column
        cases.append((f"flce-{T}-outside-targets", FLCE, a))
        a = flce_args(rng, T, "u8", "i32", "softmax", BT=20, H=9, V=150)
        b = flce_args(rng, T, "u8", "i32", "memory_saving", BT=20, H=9, V=150)
        cases.append((f"flce-{T}-all-three", FLCE, dict(a, logits_max=b["logits_max"],
                                                        sum_exp_logits=b["sum_exp_logits"])))
    return cases


def test_flce_on_the_model(seed_lib, tmp_path):
    """FLCE on the cube and vector units against the oracle, bitwise across 1, 3 and 48 cores."""
    _bitwise_across_cores(seed_lib, _flce_cases(), tmp_path)


# ---------------------------------------------------------------------- bad input

def test_bad_input_gets_the_cpu_statuses(seed_lib, tmp_path):
    """Through opgen_ascendc_<op>: the same status as the CPU library, nothing written."""
    from tests.cpu_cases import filled

    rng = np.random.default_rng(3)
    f32 = rms_args(rng, "f32", (4, 8))
    bad = {
        "dtype-mix": dict(f32, w=filled(8, "f16")),
        "f64": {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in f32.items()},
        "shape": dict(f32, w=filled(7, "f32")),
        "rank": dict(f32, w=filled((1, 8), "f32")),
        "overlap": dict(f32, grad_x=f32["x"]),
    }
    cases = [(f"bad-{k}", "rms_norm_backward", a) for k, a in bad.items()]
    # indices out of range: negative, past the table, NaN; converted and checked before any write
    edb = _edb(rng, "f32", "i64", np.array([0, 2, 1]), 4, 3, -1, True)
    for k, idx in (("neg", np.array([0, -1, 1])), ("past", np.array([0, 3, 1])),
                   ("nan", np.array([0.0, np.nan, 1.0], np.float32)), ("huge", np.array([0, 2**40, 1]))):
        cases.append((f"bad-edb-{k}", "embedding_dense_backward", dict(edb, indices=idx, out=edb["out"].copy())))
    eb = __import__("tests.cpu_cases", fromlist=["eb_args"]).eb_args(rng, "f32", "i32")
    eb["i2"] = eb["i2"].copy()
    eb["i2"][3] = 11  # N2 = 11
    cases.append(("bad-eb-i2", "embedding_backward", eb))
    # FLCE: a target outside [0, V) on a row inside the shard (checked on the device before any
    # kernel writes), a mask too short, label smoothing, V < 128, memory-saving without sum_exp
    from tests.cpu_cases import flce_args

    for k, mode, edit in (("past", "softmax", {"t": 300}), ("neg", "memory_saving", {"t": -1}),
                          ("short-mask", "softmax", {"mask": 1}), ("smoothing", "softmax", {"ls": 0.1}),
                          ("small-v", "softmax", {"V": 100}), ("no-sum-exp", "memory_saving", {"drop": 1})):
        a = flce_args(rng, "bf16", "u8", "i64", mode, BT=20, H=8, V=edit.get("V", 300), mask_p=0.0)
        if "t" in edit:
            a["masked_target"][7] = edit["t"]
        if "mask" in edit:
            a["target_mask"] = a["target_mask"][:1]
        if "ls" in edit:
            a["label_smoothing"] = edit["ls"]
        if "drop" in edit:
            del a["sum_exp_logits"]
        cases.append((f"bad-flce-{k}", FLCE, a))
    got = _run(seed_lib, cases, tmp_path, 4)
    for case, op, a in cases:
        try:
            runtime.call(op, **a)  # (as given: the overlap case shares memory on purpose)
            want = "ok"
        except OpError as e:
            want = e.status
        assert str(got[f"status.{case}"]) == want != "ok", (case, str(got[f"status.{case}"]), want)


def test_unsupported_bindings_are_a_status(seed_lib, tmp_path):
    """f64 indices have no conversion on the NPU: a dtype status (the CPU library computes them)."""
    rng = np.random.default_rng(8)
    a = _edb(rng, "f32", "f64", np.array([0.0, 2.0, 1.0]), 4, 3, -1, True)
    got = _run(seed_lib, [("bad-f64-indices", "embedding_dense_backward", a)], tmp_path, 2)
    assert str(got["status.bad-f64-indices"]) == "dtype"


# ---------------------------------------------------------------------- generation

def test_unsupported_ops_are_named_not_built(op_files):
    """Every seed op has Ascend kernels; an op using what the tile level lacks is reported by
    name (and left out of the Ascend library), never a crash."""
    for name in ("rms_norm_backward", "embedding_backward", "embedding_dense_backward", "embedding_bw", FLCE):
        assert ascendc.unsupported_reason(registry.get(name)) is None, name
    ops = op_files({"odd.py": """
from opgen.dsl import *
N, D = dims("N D")

@op
def half_rows(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    return {"y": concat([x[:, D // 2:], x[:, :D // 2]], axis=1)}
"""})
    assert ascendc.unsupported_reason(ops["half_rows"]) == "slicing with bounds"


def test_static_report_meets_the_goals():
    """At the benchmark size: global traffic within 1.25x the minimum, all 48 cores busy; the
    unified buffer never over its capacity, from one-element rows to rows of 65,536 (column tiles)."""
    from opgen.passes import pipeline
    from opgen.tile import dialect as tdl
    from opgen.tile import report

    m = registry.get("rms_norm_backward").module()
    pipeline.run(m, "ascendc")
    ks = [k for k in m.body.block.ops if isinstance(k, tdl.KernelOp)]
    plat = {"cores": 48, "ub_bytes": 196608}
    for dims in ({"N": 8192, "D": 4096}, {"N": 4096, "D": 1}, {"N": 1, "D": 4096}, {"N": 8, "D": 65536}):
        rs = report.chosen(ks, dims, plat)
        assert len(rs) == 3, rs  # f16, bf16, f32
        for r in rs:
            assert r.failed is None and r.ub_used <= r.ub_capacity, (dims, r)
            assert r.kernel.endswith(".streamed") == (dims["D"] == 65536), (dims, r.kernel)
            if dims == {"N": 8192, "D": 4096}:
                assert r.traffic_ratio <= 1.25 and r.cores == 48, r


def test_static_report_of_the_scatter_adds():
    """The embedding backward seeds at the benchmark size (V = 32,000, N = 8,192, D = 1,024): within
    1.25x the minimum traffic on 48 cores; at D = 65,536 (column tiles) and V = 2^20 the unified
    buffer holds."""
    from opgen.passes import pipeline
    from opgen.tile import dialect as tdl
    from opgen.tile import report

    plat = {"cores": 48, "ub_bytes": 196608}
    for name, rows in (("embedding_dense_backward", ("V",)), ("embedding_bw", ("V",)),
                       ("embedding_backward", ("N1", "N2"))):
        m = registry.get(name).module()
        pipeline.run(m, "ascendc")
        ks = [k for k in m.body.block.ops if isinstance(k, tdl.KernelOp)
              and k.sym_name.data.split(".")[0] in ("embedding_backward__i2_dtable2", name)]
        for size in ({"N": 8192, "D": 1024, "V": 32000}, {"N": 6, "D": 65536, "V": 4}, {"N": 64, "D": 1, "V": 2**20}):
            dims = {"N": size["N"], "D": size["D"], **{r: size["V"] for r in rows}}
            for r in report.chosen(ks, dims, plat, traffic=size["V"] == 32000):
                assert r.failed is None and r.ub_used <= r.ub_capacity, (dims, r)
                assert r.kernel.endswith(".streamed") == (size["D"] == 65536), (dims, r.kernel)
                if size["V"] == 32000:
                    assert r.traffic_ratio <= 1.25 and r.cores == 48, r
