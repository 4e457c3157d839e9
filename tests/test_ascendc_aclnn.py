"""The aclnn two-phase entries of the Ascend library, on the CPU model of Ascend C.

Two ops written in their own ops directory with ``Aclnn(...)`` declarations (SiLU backward, and
LayerNorm backward, whose ``double eps`` exercises the scalar conversion) get, from ``opgen build``,
``generated/ascendc/facade_aclnn_<name>.cpp`` beside their kernels; the Ascend library built from
that tree against the model (tests/ascendc_model) is driven through ctypes by
tests/ascendc_aclnn_worker.py (a subprocess: a broken hardware rule aborts it), with aclTensors
from the CPU library's ``aclCreateTensor`` (which plays CANN's nnopbase: the Ascend facade reads
them only through ``aclGetViewShape`` & co.). Checked: results against the oracle and against the
CPU library's entries of the same ops (f32, f16, bf16; views with offsets), the stream reaching
the kernels' launch, bad input giving the CPU facade's aclnnStatus with nothing written, executors
single-use and private to their library, and no CANN symbol defined by the Ascend library.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opgen import registry, runtime
from tests.ascendc_aclnn_worker import Case, View
from tests.ascendc_model import build as model
from tests.cpu_cases import SENTINEL, assert_c_close, bf16_products, edb_args, filled, floats

REPO = registry.REPO_ROOT
OUT = REPO / "build" / "ascendc-model" / "aclnn"
pytestmark = pytest.mark.skipif(model.cxx() is None, reason="no g++: the Ascend C model cannot be built")

# aclnnStatus values (CANN's op_errno.h), written out independently of opgen.emit.facades
SUCCESS, NULLPTR, INVALID = 0, 161001, 161002
ACL_COMPLEX64, ACL_FORMAT_FRACTAL_NZ = 16, 29

OPS = '''
from opgen.abi import Aclnn, Arg, args
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f16, bf16, f32)


@op(abi=[Aclnn("SiluBackwardOpgen", header="aclnnop/aclnn_silu_backward_opgen.h",
               args=args("gradOutput=grad", "self=x", "gradInput=dx"))])
def silu_backward(grad: Tensor[T, Batch(N), D], x: Tensor[T, Batch(N), D], *, dx: Output[T, Batch(N), D]):
    """d/dx of x * sigmoid(x)."""
    s = sigmoid(x)
    return {"dx": grad * s * (1 + x * (1 - s))}


@op(abi=[Aclnn("LayerNormBackwardOpgen", header="aclnnop/aclnn_layer_norm_backward_opgen.h",
               args=args("gradOut=grad_y", "input=x", "weight=w", Arg("eps", "eps", "double"),
                         "gradInputOut=grad_x", "gradWeightOut=grad_w", "gradBiasOut=grad_b"))])
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
NAMES = {"silu_backward": "silu_backward_opgen", "layer_norm_backward": "layer_norm_backward_opgen"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """(generated tree, Ascend library, worker environment: the CPU library of the same ops)."""
    root = tmp_path_factory.mktemp("ascendc-aclnn")
    ops = root / "opgen_test_ascendc_aclnn_ops"
    ops.mkdir()
    (ops / "ops.py").write_text(OPS)
    env = dict(os.environ, OPGEN_OPS_DIR=str(ops))
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--out", str(root / "generated"), "-q"],
                       cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    gen = root / "generated"
    sources = {p.name: p.read_text() for p in (gen / "ascendc").iterdir() if p.is_file()}
    lib = model.build(sources, OUT, include_dirs=[gen / "include"])
    env["OPGEN_LIB"] = str(root / "generated.build" / "cpu" / "libopgen.so")
    return gen, lib, env


def _run(built: tuple[Path | None, Path, dict[str, str]], cases: list[Case], tmp: Path) -> dict[str, dict[str, Any]]:
    _, lib, env = built
    cases_file, out_file = tmp / "cases.pkl", tmp / "out.pkl"
    cases_file.write_bytes(pickle.dumps(cases))
    r = subprocess.run([sys.executable, "-m", "tests.ascendc_aclnn_worker", str(lib), str(cases_file),
                        str(out_file)], cwd=REPO, env=dict(env, OPGEN_ASCEND_AIV_CORES="8"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    return pickle.loads(out_file.read_bytes())


def _covered(base: np.ndarray, view: View) -> np.ndarray:
    """Which elements of ``base`` the view covers."""
    idx = View(np.arange(base.size).reshape(base.shape), view.offset, view.shape, view.strides).array()
    mask = np.zeros(base.size, bool)
    mask[idx.reshape(-1)] = True
    return mask.reshape(base.shape)


# ----------------------------------------------------------------------------- cases
def silu(rng: np.random.Generator, T: str, shape: tuple[int, ...] = (9, 33), **kw: Any) -> Case:
    return Case(kw.pop("name", f"silu-{T}-{shape}"), "silu_backward",
                {"grad": floats(rng, shape, T), "x": floats(rng, shape, T), "dx": filled(shape, T)},
                other="layer_norm_backward", **kw)


def layer_norm(rng: np.random.Generator, T: str, shape: tuple[int, ...] = (9, 33), **kw: Any) -> Case:
    D = shape[-1]
    kw.setdefault("scalars", {"eps": 1e-3})  # a double, converted to the op's float
    return Case(kw.pop("name", f"ln-{T}-{shape}"), "layer_norm_backward",
                {"grad_y": floats(rng, shape, T), "x": floats(rng, shape, T), "w": floats(rng, D, T),
                 "grad_x": filled(shape, T), "grad_w": filled(D, T), "grad_b": filled(D, T)},
                other="silu_backward", **kw)


def _good_cases() -> list[Case]:
    rng = np.random.default_rng(17)
    cases = []
    for T in ("f32", "f16", "bf16"):
        for shape in ((9, 33), (2, 5, 17), (0, 4)):
            cases += [silu(rng, T, shape), layer_norm(rng, T, shape)]
        cases.append(layer_norm(rng, T, (130, 64), name=f"ln-{T}-default-eps", scalars={}))
        # views with offsets: rows 2..10 of a (14, 33) input, rows 1..9 of a (12, 33) output, the
        # weight and grad_w 3 elements into their buffers
        c = silu(rng, T, name=f"silu-{T}-views")
        c.tensors["x"] = View(floats(rng, (14, 33), T), 66, (9, 33), (33, 1))
        c.tensors["dx"] = View(filled((12, 33), T), 33, (9, 33), (33, 1))
        cases.append(c)
        c = layer_norm(rng, T, name=f"ln-{T}-views")
        c.tensors["w"] = View(floats(rng, 40, T), 3, (33,), (1,))
        c.tensors["grad_w"] = View(filled(40, T), 5, (33,), (1,))
        c.tensors["grad_x"] = View(filled((10, 33), T), 33, (9, 33), (33, 1))
        cases.append(c)
    return cases


def test_generated_tree_has_the_aclnn_entries(built):
    """The per-op aclnn sources appear beside the kernels of every op with an Aclnn declaration
    that the Ascend target builds; the library defines the entries and none of CANN's own calls
    (aclCreateTensor, the accessors, aclrt*: it links against CANN's), which it uses undefined."""
    gen, lib, _ = built
    names = {p.name for p in (gen / "ascendc").iterdir()}
    assert {"facade_aclnn.h", "facade_aclnn.cpp", *(f"facade_aclnn_{n}.cpp" for n in NAMES.values())} <= names
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    defined = set(subprocess.run([nm, "-D", "--defined-only", "--format=just-symbols", str(lib)],
                                 capture_output=True, text=True, check=True).stdout.split())
    undefined = set(subprocess.run([nm, "-D", "--undefined-only", "--format=just-symbols", str(lib)],
                                   capture_output=True, text=True, check=True).stdout.split())
    for n in ("SiluBackwardOpgen", "LayerNormBackwardOpgen"):
        assert {f"aclnn{n}GetWorkspaceSize", f"aclnn{n}"} <= defined
    # (aclrtlaunch_<kernel> are the launch stubs CANN's toolchain generates into the library)
    cann = [s for s in defined if s.startswith(("aclCreate", "aclDestroy", "aclGet", "aclSet", "aclrt", "aclInit",
                                                "aclFinalize", "aclnnInit", "aclnnFinalize"))
            and not s.startswith("aclrtlaunch_")]
    assert cann == [], cann
    assert not [s for s in defined if s.startswith("opgen_aclnn_")]  # its helpers are opgen_ascendc_aclnn_*
    assert {"aclGetViewShape", "aclGetViewStrides", "aclGetViewOffset", "aclGetRawTensorAddr", "aclGetDataType",
            "aclGetFormat"} <= undefined


def test_results_match_the_oracle_and_the_cpu_library(built, tmp_path):
    cases = _good_cases()
    got = _run(built, cases, tmp_path)
    for c in cases:
        r = got[c.name]
        asc, cpu, ref = r["asc"], r["cpu"], r["ref"]
        assert asc.statuses == [SUCCESS, SUCCESS], (c.name, asc.statuses, asc.error)
        assert cpu.statuses == [SUCCESS, SUCCESS], (c.name, cpu.statuses, cpu.error)
        assert isinstance(ref, dict), (c.name, ref)
        assert asc.stream_forwarded is not False, f"{c.name}: a kernel was launched on another stream"
        if all(v.size for v in ref.values()):  # (an empty tensor may need no launch)
            assert asc.stream_forwarded, f"{c.name}: no kernel was launched on the caller's stream"
        for k, want in ref.items():
            assert_c_close(asc.views[k], want, f"{c.name}.{k} (Ascend vs oracle)")
            assert_c_close(cpu.views[k], want, f"{c.name}.{k} (CPU vs oracle)")
            assert_c_close(asc.views[k], cpu.views[k], f"{c.name}.{k} (Ascend vs CPU)")
            t = c.tensors[k]
            if isinstance(t, View):  # outside the view: untouched
                outside = ~_covered(t.base, t)
                for side in (asc, cpu):
                    assert np.all(side.buffers[k][outside] == t.base[outside]), f"{c.name}.{k}: wrote outside"
        for k, t in c.tensors.items():  # inputs unchanged
            if k not in ref and t is not None:
                base = t.base if isinstance(t, View) else t
                assert asc.buffers[k].tobytes() == base.tobytes(), f"{c.name}: input {k} modified"


def test_dense_tensors_only(built, tmp_path):
    """The Ascend kernels take dense row-major tensors: a view with padded rows (the CPU library
    computes it) is PARAM_INVALID (a strides error) at phase 1, nothing written."""
    rng = np.random.default_rng(4)
    c = silu(rng, "f32", name="padded-rows")
    c.tensors["x"] = View(floats(rng, (9, 40), "f32"), 0, (9, 33), (40, 1))
    r = _run(built, [c], tmp_path)["padded-rows"]
    assert r["asc"].statuses == [INVALID]
    assert "dense" in r["asc"].error, r["asc"].error
    assert np.all(r["asc"].buffers["dx"] == SENTINEL)
    assert r["cpu"].statuses == [SUCCESS, SUCCESS]
    assert_c_close(r["cpu"].views["dx"], r["ref"]["dx"], "dx (CPU)")


def _bad_cases() -> list[tuple[Case, list[int]]]:
    """(case, the statuses CANN's conventions give; the CPU library must agree)."""
    rng = np.random.default_rng(9)
    out: list[tuple[Case, list[int]]] = []
    for make in (silu, layer_norm):
        tag = make.__name__
        c = make(rng, "f32", name=f"{tag}-null-input")
        c.tensors["x"] = None
        out.append((c, [NULLPTR]))
        c = make(rng, "f16", name=f"{tag}-null-output")
        c.tensors["dx" if tag == "silu" else "grad_x"] = None
        out.append((c, [NULLPTR]))
        out.append((make(rng, "bf16", name=f"{tag}-null-workspace-size", null=("workspaceSize",)), [NULLPTR]))
        out.append((make(rng, "f32", name=f"{tag}-null-executor", null=("executor",)), [NULLPTR]))
        c = make(rng, "f32", name=f"{tag}-dtype-mix")
        c.tensors["x"] = c.tensors["x"].astype(np.float16)  # type: ignore[union-attr]
        out.append((c, [INVALID]))
        c = make(rng, "f32", name=f"{tag}-f64")
        c.tensors = {k: v.astype(np.float64) for k, v in c.tensors.items()}  # type: ignore[union-attr]
        out.append((c, [INVALID]))
        out.append((make(rng, "f32", name=f"{tag}-acl-complex64", acl_dtype={"x": ACL_COMPLEX64}), [INVALID]))
        out.append((make(rng, "f32", name=f"{tag}-fractal-nz", acl_format={"x": ACL_FORMAT_FRACTAL_NZ}), [INVALID]))
        c = make(rng, "bf16", name=f"{tag}-shape")
        c.tensors["x"] = floats(rng, (9, 32), "bf16")
        out.append((c, [INVALID]))
        out.append((make(rng, "f32", name=f"{tag}-misaligned-input", misaligned=("x",)), [INVALID]))
        out.append((make(rng, "f16", name=f"{tag}-misaligned-output",
                         misaligned=("dx" if tag == "silu" else "grad_w",)), [INVALID]))
        out.append((make(rng, "f32", name=f"{tag}-short-workspace", short=1), [SUCCESS, INVALID]))
        out.append((make(rng, "f32", name=f"{tag}-null-workspace", null=("workspace",)), [SUCCESS, NULLPTR]))
        out.append((make(rng, "f32", name=f"{tag}-null-executor-phase2", null=("executor2",)), [SUCCESS, NULLPTR]))
    c = layer_norm(rng, "f32", name="layer_norm-weight-shape")
    c.tensors["w"] = floats(rng, 32, "f32")
    out.append((c, [INVALID]))
    return out


def test_bad_input_gets_the_cpu_statuses_and_writes_nothing(built, tmp_path):
    cases = _bad_cases()
    got = _run(built, [c for c, _ in cases], tmp_path)
    for c, want in cases:
        r = got[c.name]
        assert r["asc"].statuses == r["cpu"].statuses == want, (c.name, r["asc"].statuses, r["cpu"].statuses,
                                                                r["asc"].error, r["cpu"].error)
        for side in ("asc", "cpu"):
            for k, buf in r[side].buffers.items():
                t = c.tensors[k]
                before = t.base if isinstance(t, View) else t
                if k in c.misaligned:
                    assert np.array_equal(r[side].views[k], before), (c.name, side, k)
                else:
                    assert buf.tobytes() == before.tobytes(), f"{c.name}: {side} wrote {k}"  # type: ignore[union-attr]


def test_executors_are_single_use_and_private(built, tmp_path):
    """A consumed executor, one of the other op, one of the other library: PARAM_INVALID, as in the
    CPU library; a refused executor stays usable for its own op (and gives the oracle's result)."""
    rng = np.random.default_rng(12)
    cases = [silu(rng, "f32", name="reuse", executor="reuse"),
             layer_norm(rng, "bf16", name="ln-reuse", executor="reuse"),
             silu(rng, "f16", name="other-op", executor="other-op"),
             layer_norm(rng, "f32", name="ln-other-op", executor="other-op"),
             silu(rng, "f32", name="other-lib", executor="other-lib"),
             layer_norm(rng, "f16", name="ln-other-lib", executor="other-lib")]
    want = {"reuse": [SUCCESS, SUCCESS, INVALID], "other-op": [SUCCESS, INVALID, SUCCESS],
            "other-lib": [SUCCESS, INVALID, SUCCESS]}
    got = _run(built, cases, tmp_path)
    for c in cases:
        r = got[c.name]
        assert r["asc"].statuses == r["cpu"].statuses == want[c.executor], (c.name, r["asc"].statuses,
                                                                            r["cpu"].statuses)
        for k, v in r["ref"].items():
            assert_c_close(r["asc"].views[k], v, f"{c.name}.{k} (Ascend)")
            assert_c_close(r["cpu"].views[k], v, f"{c.name}.{k} (CPU)")


# ----------------------------------------------------------------------------- the seed's entry
def _edb(rng: np.random.Generator, T: str, IDX: str, name: str, **kw: Any) -> Case:
    a = edb_args(rng, T, IDX, **kw)
    scalars = {k: a.pop(k) for k in ("num_weights", "padding_idx", "scale_grad_by_freq")}
    return Case(name, "embedding_dense_backward", a, scalars=scalars)


def test_embedding_dense_backward_entry_of_the_seeds(seed_lib, tmp_path):
    """``aclnnEmbeddingDenseBackward`` of the Ascend library (the seed's own declaration, over its
    owner-computes kernels and the index conversion at the boundary) against the oracle and the
    CPU library's entry: every index dtype but f64, both scale modes, views with offsets; an index
    past numWeights is PARAM_INVALID at phase 2 in both, nothing written; f64 indices have no
    Ascend kernel (PARAM_INVALID at phase 1) where the CPU library computes them."""
    rng = np.random.default_rng(23)
    env = {k: v for k, v in os.environ.items() if k != "OPGEN_OPS_DIR"}
    env["OPGEN_LIB"] = str(runtime.library_path())
    good = [_edb(rng, T, IDX, f"edb-{T}-{IDX}", scale=IDX in ("i64", "u8", "f16"))
            for T in ("f32", "f16", "bf16") for IDX in ("i64", "i32", "i16", "i8", "u8", "bool", "f32", "f16")]
    good.append(_edb(rng, "f32", "i64", "edb-no-padding", padding_idx=2**64 - 1, lead=(40,), V=5, D=70))
    c = _edb(rng, "bf16", "i32", "edb-views", lead=(6,), V=4, D=8)
    c.tensors["grad"] = View(floats(rng, (9, 8), "bf16"), 16, (6, 8), (8, 1))
    c.tensors["out"] = View(filled((6, 8), "bf16"), 8, (4, 8), (8, 1))
    good.append(c)
    oob = _edb(rng, "f16", "i64", "edb-index-past-the-end")
    oob.tensors["indices"][1, 2] = oob.scalars["num_weights"]  # type: ignore[index]
    f64 = _edb(rng, "f32", "f64", "edb-f64-indices")
    got = _run((None, seed_lib, env), [*good, oob, f64], tmp_path)
    for c in good:
        r = got[c.name]
        asc, cpu, ref = r["asc"], r["cpu"], r["ref"]
        assert asc.statuses == cpu.statuses == [SUCCESS, SUCCESS], (c.name, asc.statuses, asc.error, cpu.error)
        assert asc.stream_forwarded, f"{c.name}: no kernel was launched on the caller's stream"
        assert_c_close(asc.views["out"], ref["out"], f"{c.name} (Ascend vs oracle)")
        assert_c_close(cpu.views["out"], ref["out"], f"{c.name} (CPU vs oracle)")
        t = c.tensors["out"]
        if isinstance(t, View):
            outside = ~_covered(t.base, t)
            assert np.all(asc.buffers["out"][outside] == t.base[outside]), f"{c.name}: wrote outside the view"
    r = got[oob.name]
    assert r["asc"].statuses == r["cpu"].statuses == [SUCCESS, INVALID], (r["asc"].statuses, r["cpu"].statuses)
    assert "range" in r["asc"].error or "index" in r["asc"].error, r["asc"].error
    for side in ("asc", "cpu"):
        assert np.all(r[side].buffers["out"] == SENTINEL), f"{side} wrote out"
    r = got[f64.name]
    assert r["asc"].statuses == [INVALID] and "indices f64" in r["asc"].error, (r["asc"].statuses, r["asc"].error)
    assert np.all(r["asc"].buffers["out"] == SENTINEL)
    assert r["cpu"].statuses == [SUCCESS, SUCCESS]
    assert_c_close(r["cpu"].views["out"], r["ref"]["out"], "f64 indices (CPU vs oracle)")


def test_flce_entry_of_the_seeds(seed_lib, tmp_path):
    """``aclnnFusedLinearCrossEntropyLossGrad`` of the Ascend library (its kernels: the cube's
    products, the vector unit's softmax gradient, the targets checked on the device first) against
    the oracle and the CPU library's entry, both modes (absent optionals are NULL aclTensors); a
    target past V on a row inside the shard is the CPU entry's status, nothing written."""
    from tests.cpu_cases import flce_args

    rng = np.random.default_rng(29)
    env = {k: v for k, v in os.environ.items() if k != "OPGEN_OPS_DIR"}
    env["OPGEN_LIB"] = str(runtime.library_path())
    good = []
    for T, M, TI, mode in (("f16", "u8", "i32", "softmax"), ("bf16", "bool", "i64", "memory_saving"),
                           ("bf16", "u8", "i32", "memory_saving")):
        a = flce_args(rng, T, M, TI, mode, BT=140, H=24, V=260)
        tensors = {k: a.get(k) for k in ("grad", "input", "weight", "target_mask", "masked_target", "logits_max",
                                         "sum_exp_logits", "softmax", "input_grad", "weight_grad")}
        good.append(Case(f"flce-{T}-{M}-{TI}-{mode}", "fused_linear_cross_entropy_loss_grad", tensors,
                         scalars={"label_smoothing": 0.0}))
    bad = Case("flce-target-past-v", "fused_linear_cross_entropy_loss_grad", dict(good[1].tensors),
               scalars={"label_smoothing": 0.0})
    mt = np.array(bad.tensors["masked_target"])
    mask = np.array(bad.tensors["target_mask"])
    mask[:] = False  # every row inside the shard
    mt[5] = 260
    bad.tensors.update(masked_target=mt, target_mask=mask)
    got = _run((None, seed_lib, env), [*good, bad], tmp_path)
    for c in good:
        r = got[c.name]
        asc, cpu, ref = r["asc"], r["cpu"], r["ref"]
        assert asc.statuses == cpu.statuses == [SUCCESS, SUCCESS], (c.name, asc.statuses, asc.error, cpu.error)
        assert asc.stream_forwarded, f"{c.name}: no kernel was launched on the caller's stream"
        for k in ("input_grad", "weight_grad"):
            assert_c_close(asc.views[k], ref[k], f"{c.name}.{k} (Ascend vs oracle)")
            assert_c_close(cpu.views[k], ref[k], f"{c.name}.{k} (CPU vs oracle)", bf16_products(c.op))
    r = got[bad.name]
    assert r["asc"].statuses == r["cpu"].statuses and r["asc"].statuses[-1] != SUCCESS, (r["asc"].statuses,
                                                                                       r["cpu"].statuses)
    for side in ("asc", "cpu"):
        for k in ("input_grad", "weight_grad"):
            assert np.all(r[side].buffers[k] == SENTINEL), f"{side} wrote {k}"
