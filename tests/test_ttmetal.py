"""The TT-Metal backend (opgen/ttmetal/, opgen/emit/ttmetal.py; docs/backend_ttmetal.md).

* Every generated kernel passes ``shared/tools/tt-kernel-check --werror`` (the real tt-metal 0.81.1
  kernel headers) with its manifest's CT args, CB formats and compute config.
* The generated host program + kernels run on the CPU model of TT-Metal (tests/ttmetal_model,
  through tests/ttmetal_runner.py) against the oracle, bf16 and f32, over the edge cases of the
  CPU suite (dims not multiples of 32, one column, batch dims, empty tensors, eps 0, in place),
  with tile padding filled with NaN; the results are bitwise identical on 1, 3 and 64 cores.
* Ops the backend cannot lower say so, naming the primitive.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opgen import oracle, registry
from opgen.binding import OpError
from opgen.emit import ttmetal
from opgen.tile.lower import TileUnsupported
from tests import ttmetal_runner as runner
from tests.cpu_cases import assert_c_close, copied, rms_args
from tests.reference import rounded
from tests.ttmetal_model import build as model_build

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "build" / "ttmetal-tests"
CHECKER = runner.CHECKER
FLCE = "fused_linear_cross_entropy_loss_grad"
LCE = "linear_cross_entropy_grad"  # (its bf16 instance: the f32 one takes f32 products, which TT lacks)
SUPPORTED = ("rms_norm_backward", "embedding_bw", "embedding_dense_backward", "embedding_backward", FLCE, LCE)

pytestmark = pytest.mark.skipif(model_build.cxx() is None, reason="no g++")


# ------------------------------------------------------------------------- real headers
@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_every_kernel_passes_the_real_header_check():
    runner.check_headers(SUPPORTED, OUT / "check")


# ------------------------------------------------------------------------------- model
@pytest.fixture(scope="module")
def rms_exe() -> Path:
    return runner.build("rms_norm_backward", OUT / "rms_norm_backward")


def _rms_cases() -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    rng = np.random.default_rng(11)
    cases = []
    for T in ("f32", "bf16"):
        for shape in ((7, 13), (300, 520), (1000, 1), (2, 3, 40), (0, 8), (3, 0), (1, 2048), (64, 96)):
            for eps in (0.0, 1e-6):
                cases.append((f"{T}-{'x'.join(map(str, shape))}-{eps}", rms_args(rng, T, shape, eps), {}))
    a = rms_args(rng, "bf16", (33, 70), 1e-6)
    cases.append(("in-place", a, {"grad_x": "grad_y"}))
    return cases


def _run_case(exe: Path, name: str, args: dict, alias: dict, grid: tuple[int, int], tmp: Path) -> dict:
    proc, outs = runner.run(exe, "rms_norm_backward", args, tmp / f"{name}-{grid[0]}x{grid[1]}", grid=grid,
                            alias=alias)
    assert proc.returncode == 0, f"{name} on {grid}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
    if alias:
        for dst, src in alias.items():
            outs[dst] = outs[src]
    return outs


def test_rms_norm_backward_on_the_model(rms_exe, tmp_path):
    """Every case against the oracle on an 8x8 grid; the same bits on 1 and 3 cores."""
    o = registry.get("rms_norm_backward")
    cases = _rms_cases()
    failures = []

    def one(case):
        name, args, alias = case
        ref_args = copied(args)
        if alias:
            for dst, src in alias.items():
                ref_args[dst] = ref_args[src]
        try:
            ref = oracle.run(o, **ref_args)
        except OpError as e:  # (no refusal among these cases)
            return [f"{name}: oracle refused: {e}"]
        runs = {g: _run_case(rms_exe, name, args, alias, g, tmp_path) for g in ((8, 8), (1, 1), (3, 1))}
        errs = []
        for k, v in ref.items():
            try:
                assert_c_close(runs[(8, 8)][k], v, f"{name}.{k}")
            except AssertionError as e:
                errs.append(str(e))
            for g in ((1, 1), (3, 1)):
                if runs[g][k].tobytes() != runs[(8, 8)][k].tobytes():
                    errs.append(f"{name}.{k}: {g[0] * g[1]} cores differ from 64")
        return errs

    with ThreadPoolExecutor(max_workers=2) as ex:
        for errs in ex.map(one, cases):
            failures += errs
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("T,shape,schedule", [("f32", (37, 4100), "cached"), ("bf16", (5, 9000), "cached"),
                                              ("f32", (9, 6100), "streamed"), ("bf16", (3, 12500), "streamed")])
def test_rows_too_long_for_l1_use_the_next_schedule(rms_exe, tmp_path, T, shape, schedule):
    """Rows whose resident CBs exceed L1 run the cached schedule (the block in L1, walked in
    column chunks twice); rows too long for that too, the streamed one (read twice). Against the
    oracle, the same bits on 1 and 64 cores. The static report shows the earlier ones refused."""
    from opgen.passes import pipeline
    from opgen.ttmetal import report

    m = registry.get("rms_norm_backward").module()
    pipeline.run(m, "ttmetal")
    dims = {"N": shape[0], "D": shape[1]}
    reps = {p.sym_name.data: report.report(p, dims) for p in ttmetal.programs(m)}
    order = [f"rms_norm_backward.{T}", f"rms_norm_backward.{T}.cached", f"rms_norm_backward.{T}.streamed"]
    runs = order.index(f"rms_norm_backward.{T}.{schedule}")
    assert all(reps[p].refused for p in order[:runs]), "an earlier schedule fits: the case tests nothing"
    assert not reps[order[runs]].refused
    a = rms_args(np.random.default_rng(3), T, shape, 1e-6)
    ref = oracle.run(registry.get("rms_norm_backward"), **copied(a))
    outs = {g: _run_case(rms_exe, f"long-{T}", a, {}, g, tmp_path) for g in ((8, 8), (1, 1))}
    for k, v in ref.items():
        assert_c_close(outs[(8, 8)][k], v, k)
        assert outs[(1, 1)][k].tobytes() == outs[(8, 8)][k].tobytes(), f"{k}: 1 core differs from 64"


# ------------------------------------------------------------------------ unsupported
ROW_MAX_OP = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", bf16, f32)


@op
def row_max_shift(x: Tensor[T, N, D], *, out: Output[T, N, D]):
    """x minus its row maximum (a max reduction: not lowered on TT-Metal)."""
    return {"out": x - max(x, axis=1, keepdims=True)}
'''


def test_ops_the_backend_cannot_lower_say_what(tmp_path):
    """A DSL op with a max reduction: a clear "not supported on ttmetal: <what>"."""
    d = tmp_path / "opgen_test_tt_unsupported"
    d.mkdir()
    (d / "rowmax.py").write_text(ROW_MAX_OP)
    o = registry.load_all(str(d))["row_max_shift"]
    with pytest.raises(TileUnsupported) as e:
        ttmetal.op_sources(o)
    assert "not supported on ttmetal: a max reduction" in str(e.value), str(e.value)


# ------------------------------------------------------------- ops written only in the DSL
#: an expression five DST tiles deep (more than the 4 of f32 accumulation): parts of it are spilled
DEEP_OP = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", bf16, f32)


@op
def deep_mix(x: Tensor[T, Batch(N), D], y: Tensor[T, Batch(N), D], *, out: Output[T, Batch(N), D],
             colsum: Output[T, D]):
    """A balanced expression five DST tiles deep, and its column sums."""
    a = (x * y + x * x) * (y * y - x * y)
    b = (x - y) * (x + y) * ((x * x - y) * (y * y - x))
    e = a + b * (x * y - (y - x) * (x + y * y))
    return {"out": e, "colsum": sum(e, axis=0)}
'''
#: unary math on a float parameter (before: an internal error in lower-to-ttkernel, a KeyError):
#: the host computes it with the other scalars and passes it as a runtime argument
PARAM_MATH_OP = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", bf16, f32)


@op
def param_math(x: Tensor[T, N, D], s: float, *, out: Output[T, N, D]):
    """out = x sqrt(s) + exp(-s) / |s| - rsqrt(s) tanh(s)."""
    return {"out": x * sqrt(s) + exp(-s) / absolute(s) - rsqrt(s) * tanh(s)}
'''
NEW = ("silu_backward", "softmax_backward", "layer_norm_backward", "deep_mix", "gelu_backward", "ln_cast_backward",
       "gelu_tanh_backward", "param_math")


@pytest.fixture(scope="module")
def new_ops(tmp_path_factory) -> dict[str, Any]:
    """silu_backward, softmax_backward and layer_norm_backward (tests/test_ascendc.py's DSL file),
    deep_mix, param_math, the exact GELU backward (erf) and the tanh GELU backward (tests/test_new_op_backends.py's),
    loaded from their own ops directory: nothing of them is in the compiler."""
    from tests.test_ascendc import MASK_OPS, NEW_OPS
    from tests.test_new_op_backends import GELU, GELU_TANH, LN_CAST

    d = tmp_path_factory.mktemp("tt-ops") / "opgen_test_tt_ops"
    d.mkdir()
    (d / "newops.py").write_text(NEW_OPS)
    (d / "deep.py").write_text(DEEP_OP)
    (d / "param_math.py").write_text(PARAM_MATH_OP)
    (d / "gelu.py").write_text(GELU)  # erf: SFPU erf_tile<false> (the accurate one)
    (d / "gelu_tanh.py").write_text(GELU_TANH)  # tanh: SFPU tanh_tile
    (d / "ln_cast.py").write_text(LN_CAST)  # column sums behind casts
    (d / "masks.py").write_text(MASK_OPS)  # where() by comparisons: relu_backward, clip_grad
    ops = registry.load_all(str(d))
    for o in ops.values():
        runner.register(o)
    return ops


def _new_args(rng, op: str, T: str, shape: tuple[int, ...]) -> dict[str, Any]:
    from tests.cpu_cases import filled, floats

    D = shape[-1]
    if op == "layer_norm_backward":
        return {"grad_y": floats(rng, shape, T), "x": floats(rng, shape, T), "w": floats(rng, D, T), "eps": 1e-5,
                "grad_x": filled(shape, T), "grad_w": filled(D, T), "grad_b": filled(D, T)}
    if op == "ln_cast_backward":
        from tests.test_new_op_backends import ln_cast_args

        a = ln_cast_args(rng, T, shape)
        return {**a, "grad_x": filled(shape, T), "grad_w": filled(D, T), "grad_b": filled(D, T)}
    if op == "deep_mix":
        return {"x": floats(rng, shape, T), "y": floats(rng, shape, T), "out": filled(shape, T),
                "colsum": filled(D, T)}
    if op == "param_math":
        return {"x": floats(rng, shape, T), "s": 1.7, "out": filled(shape, T)}
    second = "x" if op in ("silu_backward", "gelu_backward", "gelu_tanh_backward") else "y"
    return {"grad": floats(rng, shape, T), second: floats(rng, shape, T), "dx": filled(shape, T)}


def _on_64_and_1_core(exe: Path, op: str, a: dict[str, Any], ref: dict[str, np.ndarray], name: str,
                      tmp: Path) -> list[str]:
    """Op ``op``'s program ``exe`` run on 8 x 8 and on 1 core with arguments ``a``: what differs
    from the oracle's ``ref`` (assert_c_close) and from one core to 64 (bitwise)."""
    runs = {}
    for g in ((8, 8), (1, 1)):
        proc, outs = runner.run(exe, op, a, tmp / f"{name}-{g[0]}", grid=g)
        assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
        runs[g] = outs
    failures = []
    for k, v in ref.items():
        try:
            assert_c_close(runs[(8, 8)][k], v, f"{name}.{k}")
        except AssertionError as e:
            failures.append(str(e))
        if runs[(1, 1)][k].tobytes() != runs[(8, 8)][k].tobytes():
            failures.append(f"{name}.{k}: 1 core differs from 64")
    return failures


@pytest.mark.parametrize("op", NEW)
def test_new_dsl_ops_on_the_model(new_ops, op, tmp_path):
    """New ops get TT-Metal programs: each passes the real-header check's twin in
    test_new_dsl_ops_pass_the_real_header_check and runs on the model against the oracle,
    bitwise identical on 1 and 64 cores. Rows of 3,000 run LayerNorm backward's cached schedule
    (its resident one does not fit L1: x, gy, w and two column sums)."""
    exe = runner.build(op, OUT / op)
    if op == "layer_norm_backward":
        from opgen.passes import pipeline
        from opgen.ttmetal import report

        m = new_ops[op].module()
        pipeline.run(m, "ttmetal")
        reps = {p.sym_name.data: report.report(p, {"N": 3, "D": 3000}) for p in ttmetal.programs(m)}
        assert reps[f"{op}.f32"].refused and not reps[f"{op}.f32.cached"].refused
    rng = np.random.default_rng(5)
    failures = []
    for T in ("f32", "bf16"):
        for shape in ((45, 77), (2, 33, 32), (1, 1), (0, 5), (3, 3000)):
            if len(shape) > 2 and op in ("gelu_tanh_backward", "param_math"):
                continue  # (written on (N, D) only)
            a = _new_args(rng, op, T, shape)
            ref = oracle.run(new_ops[op], **copied(a))
            failures += _on_64_and_1_core(exe, op, a, ref, f"{op}-{T}-{'x'.join(map(str, shape))}", tmp_path)
    assert not failures, "\n".join(failures)


MASKED = ("relu_backward", "clip_grad")


def _flushed(a: np.ndarray) -> np.ndarray:
    """``a`` with its subnormals replaced by zeros of their sign (as the SFPU's comparisons see them)."""
    f = a.astype(np.float32)
    return np.where(np.abs(f) < np.finfo(np.float32).tiny, np.copysign(0.0, f), f).astype(a.dtype)


def test_per_element_conditions_on_the_model(new_ops, tmp_path):
    """where() by comparisons on TT-Metal (SFPU ``lt/gt/le/ge/eq/ne_binary_tile`` of two DST tiles,
    a scalar filled into one, masks combined by product and ``nez_tile``, picked by ``where_tile``)
    against the oracle: ties, +-0, NaN, +-inf (equal infinities compare equal), per-row bounds, a
    scalar on the left, bitwise the same on 1 and 64 cores. Subnormal inputs are flushed first: the
    SFPU's comparisons take them as zeros (docs/backend_ttmetal.md)."""
    from tests.test_ascendc import _mask_cases

    exes = {op: runner.build(op, OUT / op) for op in MASKED}
    failures = []
    for name, op, a in _mask_cases():
        if op not in MASKED or "f16" in name:
            continue  # (TT-Metal computes bf16 and f32)
        a = {k: _flushed(v) for k, v in a.items()}
        a.update({k: np.zeros_like(a["x"]) for k in (("dx", "hits") if op == "clip_grad" else ("dx",))})
        ref = oracle.run(new_ops[op], **{k: np.copy(v) for k, v in a.items()})
        runs = {}
        for g in ((8, 8), (1, 1)):
            proc, outs = runner.run(exes[op], op, a, tmp_path / f"{name}-{g[0]}".replace(" ", ""), grid=g)
            assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
            runs[g] = outs
        for k, v in ref.items():
            if runs[(8, 8)][k].tobytes() != v.tobytes():  # (picks and exact products: bitwise)
                failures.append(f"{name}.{k}: differs from the oracle")
            if runs[(1, 1)][k].tobytes() != runs[(8, 8)][k].tobytes():
                failures.append(f"{name}.{k}: 1 core differs from 64")
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_new_dsl_ops_pass_the_real_header_check(new_ops):
    runner.check_headers((*NEW, *MASKED), OUT / "check")


#: tests/test_more_new_ops.py's ops run on the model: those whose patterns no op above has
#: (``maximum`` with a parameter on a row value, ``where`` nested on constants, a column sum over
#: ``Batch`` rows alone); its log-softmax, SwiGLU and softplus backward are softmax's, SiLU's and
#: ReLU's patterns (each program's build costs ~10 s of the longest test file); mse and smooth-L1
#: backward take a rank-0 tensor parameter (named, not built)
MORE = ("l2norm_backward", "hardswish_backward", "bias_grad")


@pytest.fixture(scope="module")
def more_ops(tmp_path_factory) -> dict[str, Any]:
    """tests/test_more_new_ops.py's DSL file, loaded from its own ops directory."""
    from tests.test_more_new_ops import SOURCE

    d = tmp_path_factory.mktemp("tt-more") / "opgen_test_tt_more"
    d.mkdir()
    (d / "more.py").write_text(SOURCE)
    ops = registry.load_all(str(d))
    for o in ops.values():
        runner.register(o)
    return ops


@pytest.mark.parametrize("op", MORE)
def test_more_new_ops_on_the_model(more_ops, op, tmp_path):
    """A new user's ops (L2-normalize and hardswish backward, a bias gradient) on the model against
    the oracle, bf16 and f32, bitwise identical on 1 and 64 cores."""
    from tests.cpu_cases import filled
    from tests.test_more_new_ops import ROWS_ONLY, _inputs

    exe = runner.build(op, OUT / op)
    rng = np.random.default_rng(7)
    failures = []
    for T in ("f32", "bf16"):
        for shape in ((45, 77), (2, 33, 32), (1, 1), (0, 5)):
            if len(shape) > 2 and op in ROWS_ONLY:
                continue
            a = {k: _flushed(v) for k, v in _inputs(op, shape, T, rng).items()}  # (the SFPU's comparisons)
            ref = oracle.run(more_ops[op], **copied(a))
            a.update({k: filled(v.shape, T) for k, v in ref.items()})
            failures += _on_64_and_1_core(exe, op, a, ref, f"{op}-{T}-{'x'.join(map(str, shape))}", tmp_path)
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_more_new_ops_pass_the_real_header_check(more_ops):
    runner.check_headers(MORE, OUT / "check-more")


EXTREMA_OP = '''
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", bf16, f32)


@op
def extrema(x: Tensor[T, N, D], y: Tensor[T, N, D], lo: float, *, big: Output[T, N, D], small: Output[T, N, D]):
    """maximum of two tiles, minimum with a scalar."""
    return {"big": maximum(x, y), "small": minimum(x, lo)}
'''


def test_maximum_and_minimum_on_the_model(tmp_path_factory, tmp_path):
    """``maximum``/``minimum`` on TT-Metal (a ``where_tile`` by ``a > b`` or ``a != a``: the
    oracle's NaN-propagating extrema, not the SFPU's sign-magnitude ``binary_max_tile``):
    against the oracle bit for bit (NaN at the same places) over NaN on either side, infinities,
    -0.0 against +0.0 both ways, equal values and a scalar bound; 1 and 64 cores alike."""
    d = tmp_path_factory.mktemp("tt-extrema") / "opgen_test_tt_extrema"
    d.mkdir()
    (d / "extrema.py").write_text(EXTREMA_OP)
    ops = registry.load_all(str(d))
    runner.register(ops["extrema"])
    exe = runner.build("extrema", OUT / "extrema")
    special = [np.nan, 1.0, np.inf, -np.inf, -0.0, 0.0, 2.5, -2.5, 0.0, -0.0, 3.0, np.nan]
    other = [1.0, np.nan, 5.0, -5.0, 0.0, -0.0, 2.5, -1.0, np.inf, -np.inf, 3.0, np.nan]
    rng = np.random.default_rng(23)
    failures = []
    for T in ("f32", "bf16"):
        x = np.resize(np.array(special), (37, 70))
        y = np.resize(np.array(other), (37, 70))
        x[20:], y[20:] = rng.standard_normal((17, 70)), rng.standard_normal((17, 70))
        a = {"x": _flushed(rounded(x, T)), "y": _flushed(rounded(y, T)), "lo": 0.0}
        ref = oracle.run(ops["extrema"], **copied(a))
        a.update({k: np.zeros_like(v) for k, v in ref.items()})
        runs = {}
        for g in ((8, 8), (1, 1)):
            proc, outs = runner.run(exe, "extrema", a, tmp_path / f"extrema-{T}-{g[0]}", grid=g)
            assert proc.returncode == 0, proc.stderr[-3000:]
            runs[g] = outs
        for k, v in ref.items():
            got = runs[(8, 8)][k]
            nan = np.isnan(v.astype(np.float32))
            if not np.array_equal(np.isnan(got.astype(np.float32)), nan) or \
                    got[~nan].tobytes() != v[~nan].tobytes():
                failures.append(f"extrema-{T}.{k}: differs from the oracle")
            if runs[(1, 1)][k].tobytes() != got.tobytes():
                failures.append(f"extrema-{T}.{k}: 1 core differs from 64")
    assert not failures, "\n".join(failures)


# --------------------------------------------------------------------------- boundary conversion


@pytest.fixture(scope="module")
def target_op(tmp_path_factory) -> Any:
    """tests/test_ascendc.py's TARGET_OP (a matmul chain reading its targets only cast), loaded
    from its own ops directory and registered with the runner."""
    from tests.test_ascendc import TARGET_OP

    d = tmp_path_factory.mktemp("tt-target") / "opgen_test_tt_target"
    d.mkdir()
    (d / "target.py").write_text(TARGET_OP)
    o = registry.load_all(str(d))["target_logit_grad"]
    runner.register(o)
    return o


def test_tensor_read_only_cast_is_converted_by_the_host(target_op, tmp_path):
    """A matmul chain reading ``t`` only as ``cast(t, i64)``: one program per T (not per t
    dtype); the host function takes ``t_dtype`` and converts the buffer once (opgen.cast:
    floats truncate toward zero, NaN gives INT64_MIN). Targets of four dtypes with fractions,
    negatives, NaN and values past V, against the oracle."""
    from tests.test_ascendc import target_cases

    o = target_op
    man = runner.manifest(o.name)
    assert [v["variant"] for v in man["variants"]] == ["target_logit_grad.bf16"]
    assert any(a.get("converted_to") == "i64" for a in man["variants"][0]["args"])
    exe = runner.build(o.name, OUT / o.name)
    failures = []
    for dt, a in target_cases(np.random.default_rng(3)):
        ref = oracle.run(o, **copied(a))
        proc, outs = runner.run(exe, o.name, a, tmp_path / dt, grid=(4, 4))
        assert proc.returncode == 0, f"{dt}: {proc.stderr[-3000:]}"
        try:
            assert_c_close(outs["gx"], ref["gx"], f"t {dt}")
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not CHECKER.is_file() or shutil.which("bash") is None, reason="tt-kernel-check not available")
def test_target_op_passes_the_real_header_check(target_op):
    runner.check_headers((target_op.name,), OUT / "check")


# --------------------------------------------------------------------------- scatter-adds
@pytest.fixture(scope="module")
def ebw_exe() -> Path:
    return runner.build("embedding_bw", OUT / "embedding_bw")


def _ebw_cases() -> list[tuple[str, dict[str, Any]]]:
    from tests.cpu_cases import ebw_args

    rng = np.random.default_rng(21)
    cases = []
    for IT in ("u32", "i32", "i64"):
        for T in ("bf16", "f32"):
            for N, D, V in ((29, 10, 9), (70, 33, 40), (0, 8, 5), (64, 64, 1), (300, 40, 100)):
                cases.append((f"{IT}-{T}-{N}x{D}x{V}", ebw_args(rng, IT, "f32", T, N=N, D=D, V=V)))
    a = ebw_args(rng, "i32", "bf16", "bf16", N=200, D=65, V=70)
    a["indices"][:150] = 37  # one row hit 150 times: 150 batches in its table tile
    cases.append(("hot-row", a))
    return cases


def test_embedding_bw_on_the_model(ebw_exe, tmp_path):
    """Owner-computes scatter-add on TT-Metal: against the oracle (u32/i32/i64 indices, bf16/f32,
    dims not multiples of 32, N = 0, V = 1, a row hit 150 times), the same bits on 1, 3 and 64
    cores."""
    o = registry.get("embedding_bw")
    failures = []
    for name, a in _ebw_cases():
        ref = oracle.run(o, **{k: np.copy(v) for k, v in a.items()})
        runs = {}
        for g in ((8, 8), (1, 1), (3, 1)):
            proc, outs = runner.run(ebw_exe, "embedding_bw", a, tmp_path / f"{name}-{g[0]}x{g[1]}", grid=g)
            assert proc.returncode == 0, f"{name} on {g}: {proc.stderr[-3000:]}"
            runs[g] = outs["out"]
        try:
            assert_c_close(runs[(8, 8)], ref["out"], f"{name}.out")
        except AssertionError as e:
            failures.append(str(e))
        for g in ((1, 1), (3, 1)):
            if runs[g].tobytes() != runs[(8, 8)].tobytes():
                failures.append(f"{name}: {g[0] * g[1]} cores differ from 64")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("bad", [-1, 9])
def test_embedding_bw_refuses_out_of_range_indices_before_writing(ebw_exe, tmp_path, bad):
    from tests.cpu_cases import ebw_args

    a = ebw_args(np.random.default_rng(2), "i64", "f32", "f32", N=29, D=10, V=9)
    a["indices"][17] = bad
    with pytest.raises(OpError):
        oracle.run(registry.get("embedding_bw"), **{k: np.copy(v) for k, v in a.items()})
    proc, outs = runner.run(ebw_exe, "embedding_bw", a, tmp_path / "bad")
    assert proc.returncode == 3, proc.stderr
    assert f"index {bad} at position 17 is out of range [0, 9)" in proc.stderr
    assert outs["out"].tobytes() == a["out"].tobytes(), "the output was written"


@pytest.fixture(scope="module")
def edb_exe() -> Path:
    return runner.build("embedding_dense_backward", OUT / "embedding_dense_backward")


def test_embedding_dense_backward_on_the_model(edb_exe, tmp_path):
    """Per-row factors of a scatter-add (padding_idx rows get nothing, scale_grad_by_freq divides
    by the row's count) evaluated by the host plan: against the oracle for every index dtype
    (integers; floats with fractions that truncate toward zero; bool), bf16/f32, batch dims,
    N = 0; the same bits on 1 and 64 cores."""
    from tests.cpu_cases import edb_args

    o = registry.get("embedding_dense_backward")
    rng = np.random.default_rng(23)
    failures = []
    cases = []
    for T in ("bf16", "f32"):
        for IDX in ("u8", "i8", "i16", "i32", "i64", "f32", "f16", "f64", "bool"):
            combos = ((True, 3), (False, -1), (True, 0)) if IDX[0] in "ui" else ((True, 3), (False, -1))
            for scale, pad in combos:
                cases.append((f"{T}-{IDX}-{scale}-{pad}", edb_args(rng, T, IDX, (3, 5), 40, 37, pad, scale)))
        cases.append((f"{T}-empty", edb_args(rng, T, "i32", (0,), 9, 11, 3, True)))
        cases.append((f"{T}-wide", edb_args(rng, T, "i64", (70,), 65, 5, 2, True)))
    for name, a in cases:
        ref = oracle.run(o, **copied(a))
        runs = {}
        for g in ((8, 8), (1, 1)):
            proc, outs = runner.run(edb_exe, "embedding_dense_backward", a, tmp_path / f"{name}-{g[0]}", grid=g)
            assert proc.returncode == 0, f"{name} on {g}: {proc.stderr[-3000:]}"
            runs[g] = outs["out"]
        try:
            assert_c_close(runs[(8, 8)], ref["out"], f"{name}.out")
        except AssertionError as e:
            failures.append(str(e))
        if runs[(1, 1)].tobytes() != runs[(8, 8)].tobytes():
            failures.append(f"{name}: 1 core differs from 64")
    assert not failures, "\n".join(failures)


def test_embedding_dense_backward_refuses_bad_sizes_and_indices(edb_exe, tmp_path):
    from tests.cpu_cases import edb_args

    a = edb_args(np.random.default_rng(3), "f32", "i32", (3, 5), 8, 11, 3, True)
    a["num_weights"] = 12  # out has 11 rows
    with pytest.raises(OpError):
        oracle.run(registry.get("embedding_dense_backward"), **copied(a))
    proc, outs = runner.run(edb_exe, "embedding_dense_backward", a, tmp_path / "size")
    assert proc.returncode == 3 and "num_weights differs from the tensors' V" in proc.stderr, proc.stderr
    assert outs["out"].tobytes() == a["out"].tobytes()
    a["num_weights"] = 11
    a["indices"].reshape(-1)[4] = 11
    proc, outs = runner.run(edb_exe, "embedding_dense_backward", a, tmp_path / "index")
    assert proc.returncode == 3 and "index 11 at position 4 is out of range [0, 11)" in proc.stderr, proc.stderr
    assert outs["out"].tobytes() == a["out"].tobytes()
    # float indices: converted at the boundary (truncation toward zero), then range-checked
    for value, shown in ((np.nan, "nan"), (-1.0, "-1"), (11.0, "11"), (np.inf, "inf"), (1e30, "1e+30")):
        f = edb_args(np.random.default_rng(4), "f32", "f32", (3, 5), 8, 11, 3, True)
        f["indices"].reshape(-1)[6] = value
        proc, outs = runner.run(edb_exe, "embedding_dense_backward", f, tmp_path / f"float-{shown}")
        assert proc.returncode == 3 and f"index {shown} at position 6 is out of range [0, 11)" in proc.stderr, \
            proc.stderr
        assert outs["out"].tobytes() == f["out"].tobytes()


@pytest.fixture(scope="module")
def eb_exe() -> Path:
    return runner.build("embedding_backward", OUT / "embedding_backward")


def test_embedding_backward_on_the_model(eb_exe, tmp_path):
    """Two index tensors into two tables (two parts, one program), alpha factors, accumulation
    onto the tables (acc) or not (NaN tables ignored): against the oracle, bf16/f32, u8/i32/i64
    indices; the same bits on 1 and 64 cores."""
    from tests.cpu_cases import eb_args

    o = registry.get("embedding_backward")
    rng = np.random.default_rng(29)
    failures = []
    cases = []
    for T in ("bf16", "f32"):
        for IT in ("u8", "i32", "i64"):
            for table2, acc in ((True, (True, False)), (True, (False, True)), (False, (True, False))):
                cases.append((f"{T}-{IT}-{table2}-{acc}", eb_args(rng, T, IT, N=37, D=40, N1=7, N2=35,
                                                                    table2=table2, acc=acc)))
        cases.append((f"{T}-i2-only", eb_args(rng, T, "i32", i2=True, dtable2=False, alpha=(1.5, 0.0))))
        cases.append((f"{T}-empty", eb_args(rng, T, "i32", N=0, D=9)))
    for name, a in cases:
        try:
            ref = oracle.run(o, **copied(a))
        except OpError as e:
            failures.append(f"{name}: the oracle refused ({e}): fix the case")
            continue
        failures += _on_64_and_1_core(eb_exe, "embedding_backward", a, ref, name, tmp_path)
    assert not failures, "\n".join(failures)


def test_embedding_backward_refuses_before_writing_either_table(eb_exe, tmp_path):
    """An out-of-range index of the second part, or alpha2 != 0 without i2: refused before any
    launch — the first table is untouched too."""
    from tests.cpu_cases import eb_args

    a = eb_args(np.random.default_rng(5), "f32", "i32", N=37, D=40, N1=7, N2=35)
    a["i2"][20] = 35
    proc, outs = runner.run(eb_exe, "embedding_backward", a, tmp_path / "i2")
    assert proc.returncode == 3 and "index 35 at position 20 is out of range [0, 35)" in proc.stderr, proc.stderr
    assert outs["dtable1"].tobytes() == a["dtable1"].tobytes()
    assert outs["dtable2"].tobytes() == a["dtable2"].tobytes()
    b = eb_args(np.random.default_rng(6), "f32", "i32", table2=False)
    b["alpha2"] = 0.5
    with pytest.raises(OpError):
        oracle.run(registry.get("embedding_backward"), **copied(b))
    proc, outs = runner.run(eb_exe, "embedding_backward", b, tmp_path / "alpha2")
    assert proc.returncode == 3 and "alpha2 must be 0 when i2 is absent" in proc.stderr, proc.stderr
    assert outs["dtable1"].tobytes() == b["dtable1"].tobytes()


# ------------------------------------------------------------------------ FLCE (matmul chains)
@pytest.fixture(scope="module")
def flce_exe() -> Path:
    return runner.build(FLCE, OUT / FLCE)


def _flce_cases() -> list[tuple[str, dict[str, Any]]]:
    """Both modes (softmax given; memory-saving from logits_max and sum_exp_logits), mask u8/bool,
    targets i32/i64; several 128-row blocks, several 2,048-spans of V (row pass) and of BT (column
    pass; split over cores, then added), H = 4200 (the products over H too long for an L1 panel:
    output tiles in groups), V = 128 with H = 1, no rows, every row outside the shard, targets
    past V on rows outside (never read as a column), and the variant given all three optional
    tensors."""
    from tests.cpu_cases import flce_args

    rng = np.random.default_rng(37)
    cases = []
    for mode in ("softmax", "memory_saving"):
        for M, TI in (("u8", "i32"), ("bool", "i64")):
            cases.append((f"{mode}-{M}-{TI}", flce_args(rng, "bf16", M, TI, mode, BT=45, H=20, V=150)))
    for BT, H, V, p in ((300, 70, 500, 0.3), (5, 1, 128, 0.5), (0, 8, 130, 0.5), (40, 16, 200, 1.0),
                        (30, 8, 4200, 0.3), (2100, 8, 130, 0.3), (6, 4200, 130, 0.3)):
        a = flce_args(rng, "bf16", "u8", "i64", "memory_saving", BT=BT, H=H, V=V, mask_p=p, mask_extra=2)
        cases.append((f"memory_saving-{BT}x{H}x{V}-p{p}", a))
    a = flce_args(rng, "bf16", "bool", "i32", "memory_saving", BT=33, H=12, V=140, mask_p=1.0)
    a["masked_target"][::3] = 10**6
    cases.append(("outside-targets", a))
    a = flce_args(rng, "bf16", "u8", "i32", "softmax", BT=20, H=9, V=150)
    b = flce_args(rng, "bf16", "u8", "i32", "memory_saving", BT=20, H=9, V=150)
    cases.append(("all-three", dict(a, logits_max=b["logits_max"], sum_exp_logits=b["sum_exp_logits"])))
    return cases


#: cases also run on 1 and 3 cores: the same bits as on 64
_FLCE_GRIDS = {"memory_saving-300x70x500-p0.3": ((1, 1), (3, 1)), "memory_saving-2100x8x130-p0.3": ((1, 1),),
               "memory_saving-30x8x4200-p0.3": ((3, 1),), "softmax-u8-i32": ((1, 1),)}


def test_flce_on_the_model(flce_exe, tmp_path):
    """FLCE's matmul chain on TT-Metal (reader/compute/writer, matmul_tiles in DST, G split into
    bf16 high and low parts, one-hot tiles built by the reader, data checks on the host): against
    the oracle, and bitwise identical across grids."""
    o = registry.get(FLCE)

    def one(case):
        name, a = case
        errs = []
        ref = oracle.run(o, **copied(a))
        runs = {}
        for g in ((8, 8), *_FLCE_GRIDS.get(name, ())):
            proc, outs = runner.run(flce_exe, FLCE, a, tmp_path / f"{name}-{g[0]}x{g[1]}", grid=g)
            if proc.returncode != 0:
                return [f"{name} on {g}: rc {proc.returncode}\n{proc.stderr[-3000:]}"]
            runs[g] = outs
        for k, v in ref.items():
            try:
                assert_c_close(runs[(8, 8)][k], v, f"{name}.{k}")
            except AssertionError as e:
                errs.append(str(e)[:3000])
            for g, outs in runs.items():
                if outs[k].tobytes() != runs[(8, 8)][k].tobytes():
                    errs.append(f"{name}.{k}: {g} differs from 8x8")
        return errs

    with ThreadPoolExecutor(max_workers=2) as ex:
        failures = [e for errs in ex.map(one, _flce_cases()) for e in errs]
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def lce_exe() -> Path:
    return runner.build(LCE, OUT / LCE)


def test_linear_cross_entropy_grad_on_the_model(lce_exe, tmp_path):
    """The DSL-only cross-entropy gradient (a bool ``no_target`` mask, read element by element
    by the reader: before, its loads kept an i64 word where the op needed a bool, and the op had
    no TT-Metal code at all) in bf16: against the oracle, bitwise the same on 1 and 64 cores."""
    from tests.cpu_cases import flce_args

    o = registry.get(LCE)
    rng = np.random.default_rng(41)
    for BT, H, V, TI, p in ((45, 20, 150, "i64", 0.4), (300, 70, 500, "i32", 0.3), (5, 8, 130, "i64", 1.0)):
        f = flce_args(rng, "bf16", "bool", TI, "memory_saving", BT=BT, H=H, V=V, mask_p=p)
        a = {"grad": f["grad"], "input": f["input"], "weight": f["weight"], "no_target": f["target_mask"],
             "target": f["masked_target"], "logits_max": f["logits_max"], "sum_exp_logits": f["sum_exp_logits"],
             "input_grad": f["input_grad"], "weight_grad": f["weight_grad"]}
        ref = oracle.run(o, **{k: np.copy(v) for k, v in a.items()})
        runs = {}
        for g in ((8, 8), (1, 1)):
            proc, outs = runner.run(lce_exe, LCE, a, tmp_path / f"{BT}x{H}x{V}-{g[0]}x{g[1]}", grid=g)
            assert proc.returncode == 0, f"{BT}x{H}x{V} on {g}: rc {proc.returncode}\n{proc.stderr[-3000:]}"
            runs[g] = outs
        for k, v in ref.items():
            assert_c_close(runs[(8, 8)][k], v, f"{BT}x{H}x{V}.{k}")
            assert runs[(1, 1)][k].tobytes() == runs[(8, 8)][k].tobytes(), f"{k}: 1x1 differs from 8x8"


def test_flce_refuses_bad_input_before_writing(flce_exe, tmp_path):
    """A target outside [0, V) on a row inside the shard (the host's data check, before any
    launch), label smoothing, V < 128, a mask shorter than BT: an error naming it, outputs as they
    were — the oracle refuses the same input."""
    from tests.cpu_cases import flce_args

    rng = np.random.default_rng(41)
    for what, edit, msg in (("past", {"t": 150}, "maskedTarget out of [0, V)"),
                            ("neg", {"t": -1}, "maskedTarget out of [0, V)"),
                            ("smoothing", {"ls": 0.1}, "labelSmoothing must be 0"),
                            ("small-v", {"V": 100}, "V >= 128"),
                            ("short-mask", {"mask": 1}, "mask must hold at least BT flags")):
        a = flce_args(rng, "bf16", "u8", "i64", "memory_saving", BT=20, H=8, V=edit.get("V", 150), mask_p=0.0)
        if "t" in edit:
            a["masked_target"][7] = edit["t"]
        if "ls" in edit:
            a["label_smoothing"] = edit["ls"]
        if "mask" in edit:
            a["target_mask"] = a["target_mask"][:1]
        with pytest.raises(OpError):
            oracle.run(registry.get(FLCE), **copied(a))
        proc, outs = runner.run(flce_exe, FLCE, a, tmp_path / what)
        assert proc.returncode == 3 and msg in proc.stderr, (what, proc.returncode, proc.stderr[-2000:])
        for k in ("input_grad", "weight_grad"):
            assert outs[k].tobytes() == a[k].tobytes(), f"{what}: {k} was written"


# ------------------------------------------------------------------------ static report
def _report_of_run(op: str, args: dict[str, Any], dims: dict[str, int], indices: dict[str, np.ndarray] | None = None):
    """The static report of the schedule the host runs for ``args`` (the first that fits)."""
    from opgen.passes import pipeline
    from opgen.ttmetal import report

    base = runner.variant(op, args)["variant"]
    m = registry.get(op).module()
    pipeline.run(m, "ttmetal")
    progs = {p.sym_name.data: p for p in ttmetal.programs(m)}
    for name in (base, f"{base}.cached", f"{base}.streamed"):
        if name in progs:
            scalars = {n: int(v) for n, v in args.items() if isinstance(v, bool | int)}
            r = report.report(progs[name], dims, (8, 8), indices, scalars)
            if not r.refused:
                return r
    raise AssertionError(f"no schedule of {base} fits at {dims}")


def test_static_report_predicts_the_model_traffic(rms_exe, edb_exe, ebw_exe, eb_exe, flce_exe, tmp_path):
    """The report's DRAM bytes (the generated program interpreted at concrete sizes and index
    values) equal what the model's NOC transfers moved, byte for byte, for every schedule: RMSNorm
    resident, cached and streamed; the scatter-adds with their actual indices (uniform and one hot
    row); FLCE, with and without a block's spans split over cores. So the traffic ratios in
    docs/backend_ttmetal.md are the programs'."""
    from tests.cpu_cases import eb_args, ebw_args, edb_args, flce_args

    rng = np.random.default_rng(41)
    cases = [(rms_exe, "rms_norm_backward", rms_args(rng, T, s, 1e-6), {"N": s[0], "D": s[1]}, None)
             for T, s in (("f32", (70, 96)), ("bf16", (300, 520)), ("f32", (37, 4100)), ("f32", (9, 6100)))]
    a = edb_args(rng, "f32", "i64", (50,), 40, 300, -1, True)
    cases.append((edb_exe, "embedding_dense_backward", a, {"N": 50, "D": 40, "V": 300}, {"indices": a["indices"]}))
    a = edb_args(rng, "bf16", "i64", (90,), 70, 37, -1, False)
    a["indices"][:] = 5  # one hot row: 90 batches in its table tile
    cases.append((edb_exe, "embedding_dense_backward", a, {"N": 90, "D": 70, "V": 37}, {"indices": a["indices"]}))
    a = ebw_args(rng, "i32", "f32", "f32", N=61, D=33, V=100)
    cases.append((ebw_exe, "embedding_bw", a, {"N": 61, "D": 33, "V": 100}, {"indices": a["indices"]}))
    a = eb_args(rng, "f32", "i64", N=37, D=40, N1=7, N2=35)
    cases.append((eb_exe, "embedding_backward", a, {"N": 37, "D": 40, "N1": 7, "N2": 35},
                  {"i1": a["i1"], "i2": a["i2"]}))
    for BT, H, V in ((300, 70, 500), (30, 8, 4200)):  # (the second: V's spans split over 3 cores, combined)
        a = flce_args(rng, "bf16", "u8", "i64", "memory_saving", BT=BT, H=H, V=V)
        cases.append((flce_exe, FLCE, a, {"BT": BT, "H": H, "V": V, "L": a["target_mask"].size}, None))
    failures = []
    for i, (exe, op, args, dims, idx) in enumerate(cases):
        proc, _ = runner.run(exe, op, args, tmp_path / f"traffic-{i}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        read, written = runner.model_traffic(proc)
        r = _report_of_run(op, args, dims, idx)
        got = (sum(ln.read for ln in r.launches), sum(ln.written for ln in r.launches))
        if got != (read, written):
            failures.append(f"{r.program} at {dims}: report {got}, model {(read, written)}")
    assert not failures, "\n".join(failures)


def test_identical_kernels_share_one_file():
    """share-kernels: a kernel identical to an earlier dtype instance's is printed once and
    used from that file (host function and manifest); its own text would be that file's."""
    from opgen.emit.ttmetal import KernelPrinter, kernel_path
    from opgen.passes import pipeline
    from opgen.ttmetal import dialect as k

    o = registry.get("fused_linear_cross_entropy_loss_grad")
    m = o.module()
    pipeline.run(m, "ttmetal")
    files = ttmetal.op_sources(o)
    host = files[f"ttmetal/{o.name}/host.cpp"]
    shared = 0
    for prog in ttmetal.programs(m):
        for ln in (x for x in prog.body.block.ops if isinstance(x, k.LaunchOp)):
            for kern in (x for x in ln.body.block.ops if isinstance(x, k.KernelOp)):
                path = kernel_path(prog, kern)
                own = KernelPrinter(kern, prog.sym_name.data.split(".")[0], ln.index.data).print()
                assert files[f"ttmetal/{o.name}/{path}"] == own, path
                assert f'kernel_dir + "/{path}"' in host
                shared += kern.shared is not None
    assert shared > 0
    manifest_files = {kk["file"] for v in runner.manifest(o.name)["variants"] for ln in v["launches"]
                      for kk in ln["kernels"]}
    assert all(f"ttmetal/{o.name}/{f}" in files for f in manifest_files)


def test_bodies_differing_only_in_a_result_type_or_name_are_not_shared():
    """share-kernels compares bodies without printing them: a result type or an SSA name (both
    printed) tells two bodies apart; the same ops on other values of the same places do not."""
    from xdsl.dialects import arith
    from xdsl.dialects.builtin import f32, f64, i32
    from xdsl.ir import Block, Region

    from opgen.ttmetal.share import same_body

    def body(to: Any = f32, name: str | None = None) -> Region:
        b = Block(arg_types=[i32])
        conv = arith.SIToFPOp(b.args[0], to)
        conv.result.name_hint = name
        b.add_ops([conv, arith.AddfOp(conv.result, conv.result)])
        return Region(b)

    assert same_body(body(), body())
    assert not same_body(body(), body(f64))
    assert not same_body(body(), body(name="x"))
