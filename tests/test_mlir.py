"""Upstream MLIR as a second, independent implementation of the CPU loop level.

Every op's ``mlir`` pipeline output (func/scf/memref/arith/math, opgen/lower/to_std.py) is parsed
and verified by MLIR's own Python bindings, run through upstream passes (canonicalize, lowering to
the LLVM dialect), and executed by MLIR's ExecutionEngine. The differential tests compare those
results with the C library on random inputs of awkward shapes (sizes 0 and 1, odd sizes, more k
terms than one GEMM block, strided and batched tensors): **bitwise** where the function uses no
transcendental ``math`` op (the C library computes exp/log/tanh/erf with its own polynomials),
else within the C library's own tolerance against the oracle. Failed checks return the C ABI's
status and write nothing.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from opgen import mlir as om
from opgen import registry, runtime
from opgen.dsl.spec import AttrSpec, Batch, DTypeVar, TensorSpec
from opgen.lower.sched import GEMM_KC, bindings
from tests import cpu_cases as cc
from tests.ops_dirs import built_ops

TRANSCENDENTAL = ("math.exp", "math.log", "math.tanh", "math.erf", "math.powf")

_JITS: dict[tuple[str, int, str], om.Jit] = {}


def jit(o: Any, level: str = "loops") -> om.Jit:
    key = (o.name, id(o), level)
    if key not in _JITS:
        _JITS[key] = om.Jit(o, level=level)
    return _JITS[key]


@pytest.fixture(params=["loops", "linalg"])
def level(request: pytest.FixtureRequest) -> str:
    """The loop level (``--target mlir``) or the tensor-level export (``--target linalg``)."""
    return request.param


def uses_transcendental(j: om.Jit, fn: str) -> bool:
    """Whether function ``fn`` calls a math function the C library computes with its own
    polynomial (then the two agree to a few ulp, not bitwise)."""
    return any(o.name in TRANSCENDENTAL for o in j.funcs[fn].walk())


def function_for(o: Any, args: dict[str, Any], level: str) -> tuple[om.Jit, str]:
    """The JIT of ``o`` at ``level`` and its function for these arguments (the variant of the
    optional tensors given, the dtypes of the tensors)."""
    present = tuple(p.name for p in o.signature.optionals if args.get(p.name) is not None)
    j = jit(o, level)
    return j, j.function(present, dtype_bindings(o, args))


def dtype_bindings(o: Any, args: dict[str, Any]) -> dict[str, str]:
    """The dtype each dtype variable of ``o`` takes for these arguments."""
    return {p.spec.dtype.name: cc.name_of(np.asarray(args[p.name])) for p in o.signature.params
            if isinstance(p.spec, TensorSpec) and isinstance(p.spec.dtype, DTypeVar) and args.get(p.name) is not None}


def run_both(o: Any, args: dict[str, Any], lib: Any = None, level: str = "loops") -> None:
    """The op through the C library and through MLIR's JIT on copies of the same arguments;
    every output compared: the loop level bitwise unless transcendental, the tensor-level export
    (whose reductions and matmuls sum in their own order) within the C library's tolerance."""
    sig = o.signature
    j, fn = function_for(o, args, level)
    c_args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    m_args = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in args.items()}
    for p in sig.params:  # scalars the caller left to their defaults
        if isinstance(p.spec, AttrSpec) and p.name not in m_args:
            m_args[p.name] = p.spec.default
    c_out = runtime.call(o.name, lib=lib, **c_args)
    assert j.call(fn, **m_args) == 0
    # (bf16 products on bf16 units, AMX or AVX512-BF16: their own bits, which the MLIR loops do not model)
    tiles = cc.bf16_products(o.name) and "bf16" in dtype_bindings(o, args).values()
    exact = level == "loops" and not uses_transcendental(j, fn) and not tiles
    for name, ref in c_out.items():
        got = m_args[name]
        assert got.shape == ref.shape, name
        if exact:
            assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(ref).view(np.uint8)), \
                f"{fn}: '{name}' differs from the C library's bits"
        else:
            cc.assert_c_close(got, ref, f"{fn}: '{name}'", tiles)


# ----------------------------------------------------------------------------- every op parses


@pytest.mark.parametrize("target", ["mlir", "linalg"])
def test_every_op_parses_verifies_lowers_and_compiles(target: str) -> None:
    """The generated module of every op: upstream MLIR parses and verifies it, the lowering to
    the LLVM dialect succeeds (after bufferization, for the tensor level), the ExecutionEngine
    compiles it; one function per variant and dtype binding (of the kernels: index tensors are
    taken converted, as the C library's kernels take them)."""
    from opgen.emit import cpu

    for name, o in registry.load_all().items():
        m = om.parse(om.module_text(o, target))
        fns = [op for op in m.body.operations if op.operation.name == "func.func"]
        n_inst = sum(len(list(bindings(k))) for k in cpu.kernels(o).values())
        assert len(fns) == n_inst >= 1, name
        jit(o, "loops" if target == "mlir" else "linalg")


@pytest.mark.parametrize("target", ["mlir", "linalg"])
def test_show_prints_what_upstream_parses(target: str) -> None:
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "show", "rms_norm_backward", "--target", target],
                       capture_output=True, text=True, check=True)
    m = om.parse(r.stdout)
    names = {op.attributes["sym_name"].value for op in m.body.operations}
    assert names == {"rms_norm_backward_f16", "rms_norm_backward_f32", "rms_norm_backward_bf16"}


# ----------------------------------------------------------------------------- seed ops vs the C library


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("shape", [(6, 40), (1, 1), (0, 7), (17, 1000), (2, 3, 33)])
def test_rms_norm_backward(T: str, shape: tuple[int, ...], level: str) -> None:
    rng = np.random.default_rng(sum(shape))
    run_both(registry.get("rms_norm_backward"), cc.rms_args(rng, T, shape), level=level)


def test_rms_norm_backward_strided_rows(level: str) -> None:
    rng = np.random.default_rng(1)
    a = cc.rms_args(rng, "f32", (9, 21))
    a["x"] = cc.row_strided(a["x"])
    a["grad_y"] = cc.reversed_rows(a["grad_y"])
    if level == "loops":  # (the tensor level takes dense outputs)
        a["grad_x"] = cc.row_strided(a["grad_x"])
    run_both(registry.get("rms_norm_backward"), a, level=level)


def test_rms_norm_backward_permuted_batch_axes(level: str) -> None:
    """(N1, N2, D) inputs whose batch axes are permuted: not one stride apart, so they are
    flattened through a copy (inputs only)."""
    rng = np.random.default_rng(2)
    a = cc.rms_args(rng, "bf16", (4, 5, 33))
    a["x"] = cc.permuted_leading(a["x"])
    run_both(registry.get("rms_norm_backward"), a, level=level)


@pytest.mark.parametrize("T,IDX", [("f32", "i64"), ("bf16", "i32"), ("f16", "i64"), ("f32", "u8")])
@pytest.mark.parametrize("lead,D,V,scale", [((3, 5), 9, 11, True), ((40,), 33, 7, False), ((0,), 4, 5, True),
                                            ((1,), 1, 1, True)])
def test_embedding_dense_backward(T: str, IDX: str, lead: tuple[int, ...], D: int, V: int, scale: bool,
                                  level: str) -> None:
    rng = np.random.default_rng(D + V)
    a = cc.edb_args(rng, T, IDX, lead=lead, D=D, V=V, padding_idx=min(3, V - 1), scale=scale)
    run_both(registry.get("embedding_dense_backward"), a, level=level)


@pytest.mark.parametrize("T,IT", [("f32", "i64"), ("bf16", "i32"), ("f16", "i64")])
@pytest.mark.parametrize("table2", [True, False])
def test_embedding_backward(T: str, IT: str, table2: bool, level: str) -> None:
    rng = np.random.default_rng(7)
    run_both(registry.get("embedding_backward"), cc.eb_args(rng, T, IT, table2=table2), level=level)


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize("N,V", [(29, 9), (1, 1), (0, 3)])
def test_embedding_bw(T: str, N: int, V: int, level: str) -> None:
    rng = np.random.default_rng(N)
    o = registry.get("embedding_bw")
    W = T
    run_both(o, cc.ebw_args(rng, "i32", W, T, N=N, V=V), level=level)


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("T,M", [("bf16", "u8"), ("f16", "bool")])
@pytest.mark.parametrize("BT,H,V", [(70, 20, 300), (5, GEMM_KC + 3, 130), (1, 1, 128)])
def test_fused_linear_cross_entropy_loss_grad(mode: str, T: str, M: str, BT: int, H: int, V: int, level: str) -> None:
    """k runs past one GEMM block (V = 300 for input_grad, H = KC + 3 for the logits); V >= 128
    as SPEC.md requires."""
    rng = np.random.default_rng(BT + H)
    a = cc.flce_args(rng, T, M, "i64", mode, BT=BT, H=H, V=V)
    run_both(registry.get(cc.FLCE), a, level=level)


@pytest.mark.parametrize("BT,H,V", [(33, 20, GEMM_KC + 44), (1, 3, 2)])
def test_linear_cross_entropy_grad(BT: int, H: int, V: int, level: str) -> None:
    rng = np.random.default_rng(BT)
    a = cc.flce_args(rng, "f32", "bool", "i64", "memory_saving", BT=BT, H=H, V=V, mask_p=0.3)
    no_target = a.pop("target_mask")[:BT]
    a["no_target"] = no_target
    a["target"] = a.pop("masked_target")
    run_both(registry.get("linear_cross_entropy_grad"), a, level=level)


# ----------------------------------------------------------------------------- checks and statuses


def expect_status(o: Any, a: dict[str, Any], status: str, level: str) -> None:
    """The call returns ``status``; the loop level writes nothing (the tensor level writes in
    place never: its outputs are new values, then unspecified, and the caller's arrays stay)."""
    j, fn = function_for(o, a, level)
    for p in o.signature.params:
        if isinstance(p.spec, AttrSpec) and p.name not in a:
            a[p.name] = p.spec.default
    before = cc.snapshot(a)
    assert j.call(fn, **a) == cc.CODE[status]
    if level == "loops":
        assert cc.snapshot(a) == before


def test_shape_mismatch_is_status_shape(level: str) -> None:
    a = cc.rms_args(np.random.default_rng(0), "f32", (4, 8))
    a["w"] = a["w"][:7].copy()
    expect_status(registry.get("rms_norm_backward"), a, "shape", level)


@pytest.mark.parametrize("bad", ["past_end", "negative", "huge"])
def test_index_out_of_range_is_status_index(bad: str, level: str) -> None:
    def value(rows: int) -> int:
        return {"past_end": rows, "negative": -1, "huge": 2**40}[bad]

    a = cc.edb_args(np.random.default_rng(0), "f32", "i64", lead=(6,), V=5)
    a["indices"][4] = value(5)
    expect_status(registry.get("embedding_dense_backward"), a, "index", level)
    b = cc.eb_args(np.random.default_rng(1), "f32", "i64")  # tables of 7 and 11 rows
    b["i2"][3] = value(11)
    expect_status(registry.get("embedding_backward"), b, "index", level)


def test_flce_needs_128_rows_status_param(level: str) -> None:
    a = cc.flce_args(np.random.default_rng(0), "bf16", "u8", "i64", "softmax", BT=4, H=8, V=100)
    expect_status(registry.get(cc.FLCE), a, "param", level)


def test_flce_mask_too_short_status_shape(level: str) -> None:
    a = cc.flce_args(np.random.default_rng(0), "bf16", "u8", "i64", "softmax", BT=20, H=8, V=128)
    a["target_mask"] = a["target_mask"][:2].copy()  # 16 flags for 20 rows
    expect_status(registry.get(cc.FLCE), a, "shape", level)


def test_size_parameter_must_match_its_dim(level: str) -> None:
    """A negative size is refused; one that disagrees with the tensor carrying its dim too (at
    the tensor level no input carries V: ``out`` is a result, and ``num_weights`` gives V)."""
    o = registry.get("embedding_dense_backward")
    for nw in (-1, 4) if level == "loops" else (-1,):
        a = cc.edb_args(np.random.default_rng(0), "f32", "i64", lead=(6,), V=5)
        a["num_weights"] = nw
        expect_status(o, a, "shape", level)


def test_build_target_mlir_writes_only_its_folder(tmp_path: Any) -> None:
    """``opgen build --target mlir`` writes OUT/mlir/ (both levels of every op), compiles nothing,
    leaves other files alone; ``--check`` then finds it up to date; the texts are the ones
    :func:`opgen.mlir.module_text` makes."""
    out = tmp_path / "gen"
    (out / "cpu").mkdir(parents=True)
    (out / "cpu" / "keep.c").write_text("/* not the build's */\n")
    cmd = [sys.executable, "-m", "opgen.cli", "build", "--target", "mlir", "--out", str(out), "-q"]
    subprocess.run(cmd, check=True)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    names = sorted(registry.load_all())
    assert written == sorted(["cpu/keep.c", *(f"mlir/{n}.mlir" for n in names),
                              *(f"mlir/{n}.linalg.mlir" for n in names)])
    assert not (tmp_path / "gen.build").exists()
    o = registry.get("rms_norm_backward")
    assert (out / "mlir" / "rms_norm_backward.linalg.mlir").read_text() == om.module_text(o, "linalg")
    assert subprocess.run([*cmd, "--check"]).returncode == 0
    bad = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--target", "cuda"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# ----------------------------------------------------------------------------- DSL-only ops


def _dsl_sources() -> dict[str, str]:
    from tests.test_ascendc import NEW_OPS
    from tests.test_new_op_backends import GELU, GELU_TANH, LINEAR, LN_CAST
    from tests.test_shapes_dsl import ROPE, SHAPES

    return {"newops.py": NEW_OPS, "gelu.py": GELU, "gelu_tanh.py": GELU_TANH, "linear.py": LINEAR,
            "ln_cast.py": LN_CAST, "rope.py": ROPE, "shapes.py": SHAPES}


@pytest.fixture(scope="module")
def dsl_ops(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with built_ops(tmp_path_factory.mktemp("mlirops"), "opgen_test_mlirops", _dsl_sources()) as b:
        yield b


def random_args(o: Any, sizes: dict[str, int], dtype_of: dict[str, str], rng: np.random.Generator,
                batch: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Random inputs for a DSL op (``batch``: how a batch dim spreads over leading axes)."""
    out: dict[str, Any] = {}
    for p in o.signature.params:
        spec = p.spec
        if not isinstance(spec, TensorSpec):
            continue
        shape: list[int] = []
        for d in spec.shape:
            if isinstance(d, Batch):
                shape += list(batch) if batch else [sizes[d.name]]
            else:
                shape.append(d if isinstance(d, int) else sizes[d.name])
        T = dtype_of[spec.dtype.name] if isinstance(spec.dtype, DTypeVar) else spec.dtype.name
        out[p.name] = cc.filled(tuple(shape), T) if p.is_output else cc.floats(rng, tuple(shape), T)
    return out


DSL_CASES = [
    ("softmax_backward", {"N": 37, "D": 129}, ("f32", "bf16", "f16")),
    ("layer_norm_backward", {"N": 17, "D": 100}, ("f32", "bf16")),
    ("ln_cast_backward", {"N": 9, "D": 65}, ("f32", "bf16")),
    ("silu_backward", {"N": 5, "D": 77}, ("f32", "bf16")),
    ("gelu_backward", {"N": 7, "D": 50}, ("f32", "bf16")),
    ("gelu_tanh_backward", {"N": 7, "D": 50}, ("f32", "bf16")),
    ("rope_backward", {"N": 6, "H": 3, "D": 10}, ("f32", "bf16")),
    ("rope_backward", {"N": 2, "H": 1, "D": 7}, ("f32",)),
    ("linear_relu", {"N": 19, "K": GEMM_KC + 30, "M": 45}, ("f32",)),
    ("linear_relu", {"N": 1, "K": 1, "M": 1}, ("f32",)),
    ("heads_sum", {"N": 5, "H": 3, "D": 7, "HD": 21}, ("f32",)),
    ("merge_heads", {"N": 4, "H": 2, "D": 9, "HD": 18}, ("f32",)),
    ("flat_scale", {"N": 3, "H": 4, "D": 5}, ("f32",)),
    ("halves", {"N": 6, "D": 11}, ("f32",)),
    ("cat_sum", {"N": 6, "D": 8}, ("f32",)),
    ("trim", {"N": 5, "D": 9, "H": 7}, ("f32",)),
]


@pytest.mark.parametrize("name,sizes,Ts", DSL_CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_dsl_op(dsl_ops: Any, name: str, sizes: dict[str, int], Ts: tuple[str, ...], level: str) -> None:
    o = dsl_ops["ops"][name]
    for T, batch in itertools.product(Ts, (None, (1, sizes.get("N", 1)))):
        rng = np.random.default_rng(len(name))
        run_both(o, random_args(o, sizes, {"T": T}, rng, batch), lib=dsl_ops["lib"], level=level)


def test_dsl_ops_parse_and_lower(dsl_ops: Any) -> None:
    for o in dsl_ops["ops"].values():
        om.lower(om.parse(om.module_text(o)))
        om.lower(om.lower(om.parse(om.module_text(o, "linalg")), om.BUFFERIZE))



def test_dsl_ops_write_every_output_element(dsl_ops: Any) -> None:
    """The DSL ops of these tests (NEW_OPS, GELU, linear, LayerNorm, RoPE, the shape ops) write
    every element of every output they do not read: the Python API allocates those uninitialised
    (tests/outputs_written.py). heads_sum needs HD = H * D; merge_heads, trim and window their
    outputs given (the inputs do not bind their shapes)."""
    from tests.outputs_written import assert_every_output_written

    rng = np.random.default_rng(0)
    f = np.float32
    calls = {"heads_sum": [{"x": rng.standard_normal((5, 3 * 37)).astype(f),
                            "w": rng.standard_normal((3, 37)).astype(f)}],
             "merge_heads": [{"x": rng.standard_normal((5, 3, 37)).astype(f), "y": np.zeros((5, 3 * 37), f)}],
             "trim": [{"x": rng.standard_normal((5, 37)).astype(f), "y": np.zeros((5, 35), f)}],
             "window": [{"x": rng.standard_normal((5, 37)).astype(f), "start": 3, "y": np.zeros((5, 30), f)}]}
    assert_every_output_written(dsl_ops["ops"], dsl_ops["lib"], calls)
