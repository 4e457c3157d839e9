"""Slicing with bounds, ``concat``, ``reshape`` and integer arithmetic of dims, as a user writes
them in an ops directory: rotary-embedding backward on (N, H, D) tensors and a few reshapes.

The oracle is checked against PyTorch autograd (float64 and same-dtype), the CPU library and the
CUDA kernels (nvcc; the CPU model of CUDA) against the oracle; bad shapes are refused with status
``shape`` before anything is written; the NPU targets say plainly that they lack these ops.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from opgen import compile as cc
from opgen import oracle, runtime
from opgen.binding import OpError
from opgen.dsl import DSLError, dims
from opgen.ir import dialect as ir
from opgen.ir import dims as symdims
from opgen.lower import sched
from opgen.tile.lower import TileUnsupported
from tests.cpu_cases import copied
from tests.cuda_emu import emu_build, emu_worker
from tests.ops_dirs import built_ops
from tests.reference import NP, assert_close_policy, assert_f64_close, rounded, t64, tt

ROPE = '''
"""Rotary embedding backward, rotate-half form (as in Llama): y = x * cos + rotate_half(x) * sin
with rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])."""
from opgen.dsl import *

N, H, D = dims("N H D")
T = dtype_var("T", f32, bf16)


@op
def rope_backward(grad: Tensor[T, N, H, D], cos: Tensor[T, N, D], sin: Tensor[T, N, D], *,
                  dx: Output[T, N, H, D]):
    """dx = grad * cos + rotate_half^T(grad * sin), rotate_half^T(u) = concat(u[k:], -u[:k])."""
    u = grad * sin[:, None, :]
    k = D - D // 2  # rotate_half(x) = concat(-x[..., D//2:], x[..., :D//2]): -x2 fills the first k
    return {"dx": grad * cos[:, None, :] + concat([u[..., k:], -u[..., :k]], axis=-1)}
'''

SHAPES = '''
from opgen.dsl import *

N, H, D, HD = dims("N H D HD")


@op
def heads_sum(x: Tensor[f32, N, HD], w: Tensor[f32, H, D], *, y: Output[f32, N, D]):
    """x viewed as (N, H, D), times w, summed over the heads (HD must be H * D)."""
    return {"y": sum(x.reshape(N, H, D) * w, axis=1)}


@op
def merge_heads(x: Tensor[f32, N, H, D], *, y: Output[f32, N, HD]):
    return {"y": x.reshape(N, HD) * 2}


@op
def flat_scale(x: Tensor[f32, N, H, D], s: Tensor[f32, D], *, y: Output[f32, N, H, D]):
    """A reshape the dims prove (no run-time check): (N, H, D) -> (N, H * D) -> back."""
    z = x.reshape(N, H * D) + 1
    return {"y": z.reshape(N, H, D) * s}


@op
def halves(x: Tensor[f32, N, D], *, swapped: Output[f32, N, D], s: Output[f32, N]):
    """The halves of each row swapped; the first half's sum plus its length."""
    h = x[:, : D // 2]
    return {"swapped": concat([x[:, D // 2:], h], axis=1), "s": sum(h, axis=1) + size(D // 2)}


@op
def cat_sum(x: Tensor[f32, N, D], *, s: Output[f32, N]):
    """A concat read by a reduction: kept in memory, written part by part."""
    return {"s": sum(concat([x, x * 2], axis=1), axis=1)}


@op
def trim(x: Tensor[f32, N, D], *, y: Output[f32, N, H]):
    """Drop the first and last column (H must be D - 2: checked)."""
    return {"y": x[:, 1:-1].reshape(N, H)}


@op
def window(x: Tensor[f32, N, D], start: H, *, y: Output[f32, N, HD]):
    """Columns [start, start + HD) of x: bounds are run-time sizes."""
    return {"y": x[:, H:H + HD]}
'''

SOURCES = {"rope_ops.py": ROPE, "shape_ops.py": SHAPES}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The ops above built by ``opgen build --out`` (CPU library) from their own ops directory."""
    with built_ops(tmp_path_factory.mktemp("shapeops"), "opgen_test_shapeops", SOURCES) as b:
        yield b


# ------------------------------------------------------------------ dim arithmetic


def test_dim_arithmetic_evaluates_like_python_ints():
    """Every derived dim, spelled canonically, evaluates to what Python's ints give, and
    spellings of one size compare equal."""
    N, D, H = dims("N D H")
    exprs = {
        "D // 2": (D // 2, lambda n, d, h: d // 2),
        "D - D // 2": (D - D // 2, lambda n, d, h: d - d // 2),
        "D // 2 + (D - D // 2)": (D // 2 + (D - D // 2), lambda n, d, h: d),
        "H * D": (H * D, lambda n, d, h: h * d),
        "2 * D + 1": (2 * D + 1, lambda n, d, h: 2 * d + 1),
        "(H * D) // 3": ((H * D) // 3, lambda n, d, h: h * d // 3),
        "N + D - 1": (N + D - 1, lambda n, d, h: n + d - 1),
        "(D + 7) // 8 * 8": ((D + 7) // 8 * 8, lambda n, d, h: (d + 7) // 8 * 8),
    }
    for (n, d, h) in itertools.product([1, 2, 7, 64], [1, 3, 8, 4096], [1, 5, 32]):
        for label, (e, f) in exprs.items():
            assert symdims.evaluate(e.name, {"N": n, "D": d, "H": h}) == f(n, d, h), (label, e.name)
    assert (D // 2 + (D - D // 2)).name == "D"
    assert (H * D).name == (D * H).name
    assert (D + D).name == (2 * D).name
    with pytest.raises(DSLError):
        D // 0
    with pytest.raises(DSLError):
        D - (D + 1)  # negative for every D


# ------------------------------------------------------------------ oracle vs PyTorch


def rope_inputs(rng: np.random.Generator, T: str, n: int, h: int, d: int) -> dict[str, np.ndarray]:
    ang = rng.random((n, d)) * 6.3
    return {"grad": rounded(rng.standard_normal((n, h, d)), T), "cos": rounded(np.cos(ang), T),
            "sin": rounded(np.sin(ang), T)}


def torch_rope_grad(a: dict[str, np.ndarray], T: str) -> torch.Tensor:
    """d/dx of Llama's apply_rotary_pos_emb (rotate_half over the last dim), by autograd."""
    conv = t64 if T == "f64" else (lambda v, **k: tt(v, T, **k))
    g, c, s = conv(a["grad"]), conv(a["cos"])[:, None, :], conv(a["sin"])[:, None, :]
    x = torch.zeros(g.shape, dtype=g.dtype, requires_grad=True)
    d = g.shape[-1]

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((-t[..., d // 2:], t[..., : d // 2]), dim=-1)

    (x * c + rotate_half(x) * s).backward(g)
    return x.grad


@pytest.mark.parametrize("shape", [(6, 4, 64), (3, 2, 7), (5, 1, 2), (4, 3, 1)])
@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_rope_backward_oracle_matches_torch(op_files, rng, T, shape):
    o = op_files({"rope.py": ROPE})["rope_backward"]
    a = rope_inputs(rng, T, *shape)
    out = oracle.run(o, **a)["dx"]
    assert out.dtype == NP[T] and out.shape == shape
    assert_close_policy(out, torch_rope_grad(a, "f64"), torch_rope_grad(a, T), T, "dx")
    assert_f64_close(oracle.run(o, precision="f64", **a)["dx"], torch_rope_grad(a, "f64"), "dx (f64)")


def test_shape_ops_oracle_matches_torch(op_files, rng):
    ops = op_files({"shapes.py": SHAPES})
    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    ref = (torch.tensor(x, dtype=torch.float64).reshape(5, 3, 4) * torch.tensor(w, dtype=torch.float64)).sum(1)
    assert np.allclose(oracle.run(ops["heads_sum"], x=x, w=w)["y"], ref.numpy(), rtol=1e-6, atol=1e-6)
    x4 = rng.standard_normal((5, 3, 4)).astype(np.float32)
    got = oracle.run(ops["merge_heads"], x=x4, y=np.zeros((5, 12), np.float32))["y"]
    assert np.array_equal(got, (torch.tensor(x4).reshape(5, 12) * 2).numpy())
    s = rng.standard_normal(4).astype(np.float32)
    got = oracle.run(ops["flat_scale"], x=x4, s=s)["y"]
    assert np.array_equal(got, ((torch.tensor(x4).reshape(5, 12) + 1).reshape(5, 3, 4) * torch.tensor(s)).numpy())
    for d in (1, 6, 7):
        xd = rng.standard_normal((3, d)).astype(np.float32)
        r = oracle.run(ops["halves"], x=xd)
        t = torch.tensor(xd)
        assert np.array_equal(r["swapped"], torch.cat((t[:, d // 2:], t[:, : d // 2]), 1).numpy())
        assert np.allclose(r["s"], (t[:, : d // 2].double().sum(1) + d // 2).numpy(), rtol=1e-6)
    t = torch.tensor(x, dtype=torch.float64)
    got = oracle.run(ops["cat_sum"], x=x)["s"]
    assert np.allclose(got, torch.cat((t, t * 2), 1).sum(1).numpy(), rtol=1e-5, atol=1e-5)
    xt = rng.standard_normal((3, 9)).astype(np.float32)
    assert np.array_equal(oracle.run(ops["trim"], x=xt, y=np.zeros((3, 7), np.float32))["y"], xt[:, 1:-1])
    got = oracle.run(ops["window"], x=xt, start=2, y=np.zeros((3, 5), np.float32))["y"]
    assert np.array_equal(got, torch.tensor(xt)[:, 2:7].numpy())


BAD_SHAPES = [  # (op, args, what): each must fail with status "shape" and write nothing
    ("merge_heads", {"x": np.ones((2, 3, 4), np.float32), "y": np.full((2, 11), 7, np.float32)}, "HD != H*D"),
    ("heads_sum", {"x": np.ones((2, 13), np.float32), "w": np.ones((3, 4), np.float32),
                   "y": np.full((2, 4), 7, np.float32)}, "HD != H*D"),
    ("trim", {"x": np.ones((2, 9), np.float32), "y": np.full((2, 6), 7, np.float32)}, "H != D - 2"),
    ("trim", {"x": np.ones((2, 1), np.float32), "y": np.full((2, 1), 7, np.float32)}, "1:-1 of 1 column"),
    ("window", {"x": np.ones((2, 9), np.float32), "start": 5, "y": np.full((2, 5), 7, np.float32)}, "past the end"),
]


@pytest.mark.parametrize("name,args,what", BAD_SHAPES, ids=[b[2] for b in BAD_SHAPES])
def test_bad_shapes_are_refused_by_oracle_and_library(built, name, args, what):
    out_name = "y"
    with pytest.raises(OpError) as e:
        oracle.run(built["ops"][name], **copied(args))  # type: ignore[index]
    assert e.value.status == "shape", what
    y = args[out_name]
    with pytest.raises(OpError) as e:
        runtime.call(name, lib=built["lib"], **args)  # type: ignore[arg-type]
    assert e.value.status == "shape", what
    assert (y == 7).all(), f"{what}: output written"


# ------------------------------------------------------------------ CPU library vs oracle


def _strided(a: np.ndarray) -> np.ndarray:
    """``a``'s values in a buffer with padded rows (a non-contiguous view)."""
    big = np.zeros((*a.shape[:-1], a.shape[-1] + 3), a.dtype)
    big[..., : a.shape[-1]] = a
    return big[..., : a.shape[-1]]


def test_rope_backward_reads_the_concat_in_place(built):
    """The concat feeding rope's output is not stored: the output's nest is split at the parts'
    boundary, each half reading its part directly (one pass over grad, no workspace)."""
    src = (built["out"] / "cpu" / "rope_backward.c").read_text()  # type: ignore[operator]
    assert "(wp + off)" not in src, "a temporary buffer was allocated"
    cat = (built["out"] / "cpu" / "cat_sum.c").read_text()  # type: ignore[operator]
    assert "(wp + off)" in cat, "a concat read by a reduction lives in memory"


def test_each_part_of_a_split_concat_walks_the_output_by_its_own_counter(built):
    """Each part's nest runs over the part's span of the axis ([0, k), then [k, D)) with the
    output indexed by the loop's counter itself, so map-cpu sees both as row walks: vector loops
    that stream (strips, prefetches) and store the output around the caches (nontemporal), the
    second part as the first (rope backward bf16, 4096x32x128, outputs given, 2 threads: 1.50 ->
    1.29 ms once the second half's loop was one)."""
    from opgen.lower import cpu_map
    from opgen.passes import pipeline

    m = built["ops"]["rope_backward"].module()  # type: ignore[index]
    pipeline.run(m, "cpu")
    (k,) = m.body.block.ops
    stores = [o for o in k.walk() if isinstance(o, sched.StoreOp) and k.param_names.get(o.buf) == "dx"]
    assert len(stores) == 2  # (one per part)
    for st in stores:
        loop = st.parent_op()
        assert isinstance(loop, sched.ForOp) and st.idx[-1] is loop.iv
        assert cpu_map.cpu_mapping(loop) == sched.CpuMapping.STREAM
        assert cpu_map.cpu_mapping(st) == sched.CpuMapping.NONTEMPORAL
    first, second = (st.parent_op() for st in stores)
    assert ir.constant_int(first.lo) == 0 and ir.constant_int(second.lo) is None  # (the second from k)


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_rope_backward_cpu_library_matches_oracle(built, rng, T):
    for shape in [(7, 3, 64), (4, 2, 9), (0, 2, 4), (3, 1, 1), (2, 3, 2)]:
        a = rope_inputs(rng, T, *shape)
        want = oracle.run(built["ops"]["rope_backward"], **a)["dx"]  # type: ignore[index]
        got = runtime.call("rope_backward", lib=built["lib"], **a)["dx"]  # type: ignore[arg-type]
        assert np.array_equal(got, want), shape
        got = runtime.call("rope_backward", lib=built["lib"], grad=_strided(a["grad"]), cos=a["cos"],
                           sin=_strided(a["sin"]))["dx"]  # type: ignore[arg-type]
        assert np.array_equal(got, want), f"{shape} strided"


def test_shape_ops_cpu_library_match_oracle(built, rng):
    cases = [
        ("heads_sum", {"x": rng.standard_normal((6, 12)), "w": rng.standard_normal((3, 4))}),
        ("heads_sum", {"x": rng.standard_normal((0, 12)), "w": rng.standard_normal((3, 4))}),
        ("merge_heads", {"x": rng.standard_normal((5, 3, 4)), "y": np.zeros((5, 12))}),
        ("flat_scale", {"x": rng.standard_normal((5, 3, 4)), "s": rng.standard_normal(4)}),
        ("trim", {"x": rng.standard_normal((4, 9)), "y": np.zeros((4, 7))}),
        ("trim", {"x": rng.standard_normal((4, 2)), "y": np.zeros((4, 0))}),
        ("window", {"x": rng.standard_normal((3, 9)), "start": 4, "y": np.zeros((3, 5))}),
        ("window", {"x": rng.standard_normal((3, 9)), "start": 9, "y": np.zeros((3, 0))}),
        ("cat_sum", {"x": rng.standard_normal((5, 7))}),
        ("cat_sum", {"x": rng.standard_normal((5, 0))}),
    ] + [("halves", {"x": rng.standard_normal((4, d))}) for d in (0, 1, 2, 7, 33)]
    for name, args in cases:
        args = {k: v.astype(np.float32) if isinstance(v, np.ndarray) else v for k, v in args.items()}
        want = oracle.run(built["ops"][name], **copied(args))  # type: ignore[index]
        got = runtime.call(name, lib=built["lib"], **args)  # type: ignore[arg-type]
        for k, v in want.items():
            assert np.allclose(got[k], v, rtol=1e-6, atol=1e-6), (name, k)


# ------------------------------------------------------------------ CUDA and the NPU targets

NVCC = cc.nvcc()


@pytest.mark.skipif(NVCC is None, reason="nvcc not found: the CUDA compile check needs the CUDA toolkit")
def test_cuda_sources_compile_with_nvcc(built):
    """The ops' .cu files compile for sm_80 and sm_90 with warnings as errors."""
    out: Path = built["out"]  # type: ignore[assignment]
    cc.build_cuda_library(out / "cuda", out / "include", built["root"] / "cuda-build", verbose=False)  # type: ignore[operator]


@pytest.mark.skipif(emu_build.cxx() is None, reason="no g++ for the CPU model of CUDA")
def test_cuda_kernels_on_the_cpu_model(built, rng):
    out: Path = built["out"]  # type: ignore[assignment]
    sources = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    lib = emu_worker.load(emu_build.build(sources, built["root"] / "emu"))  # type: ignore[operator]
    for T, shape in [("f32", (5, 3, 64)), ("bf16", (4, 2, 9)), ("f32", (2, 2, 1))]:
        a = rope_inputs(rng, T, *shape)
        want = oracle.run(built["ops"]["rope_backward"], **a)["dx"]  # type: ignore[index]
        assert np.array_equal(runtime.call("rope_backward", lib=lib, **a)["dx"], want), (T, shape)
    x = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    want = oracle.run(built["ops"]["heads_sum"], x=x, w=w)["y"]  # type: ignore[index]
    assert np.allclose(runtime.call("heads_sum", lib=lib, x=x, w=w)["y"], want, rtol=1e-6, atol=1e-6)
    for d in (1, 7):
        x = rng.standard_normal((3, d)).astype(np.float32)
        want = oracle.run(built["ops"]["halves"], x=x)  # type: ignore[index]
        got = runtime.call("halves", lib=lib, x=x)
        assert np.array_equal(got["swapped"], want["swapped"]) and np.allclose(got["s"], want["s"], rtol=1e-6)


def test_npu_targets_name_what_they_lack(built):
    from opgen.emit import ascendc, ttmetal

    for mod in (ascendc, ttmetal):
        with pytest.raises(TileUnsupported) as e:
            mod.op_sources(built["ops"]["halves"])  # type: ignore[index]
        assert "slicing with bounds" in str(e.value), str(e.value)


# ------------------------------------------------------------------ DSL errors


@pytest.mark.parametrize("body,msg", [
    ("x[:, ::2]", "slices take no step"),
    ("x[:, 3:1]", "negative length"),
    ("x[:, 0]", "use gather()"),
    ("concat([x, x[:, None]], axis=1)", "one rank"),
    ("concat([x, x.T], axis=1)", "differ off axis"),
    ("concat([x], axis=0)", "at least two"),
    ("x.reshape(N, 'D?')", "reshape"),
])
def test_shape_mistakes_are_dsl_errors(op_files, body, msg):
    src = f'''
from opgen.dsl import *
N, D = dims("N D")

@op
def bad(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    return {{"y": {body}}}
'''
    with pytest.raises(DSLError) as e:
        for o in op_files({"bad.py": src}).values():
            o.variants  # noqa: B018 - tracing happens here
    assert msg in str(e.value), str(e.value)
