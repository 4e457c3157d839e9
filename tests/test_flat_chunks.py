"""chunk-flat-loops (opgen/lower/flat_chunks.py): elementwise ops on 1-D tensors — an optimizer's
step, an activation over a flat vector — run in chunks, each walked like a row of a 2-D op (strips
under ``omp simd``, prefetches, staged and streaming stores), where the single parallel loop they
lowered to had stayed scalar. Against PyTorch (float64 and same-dtype), the same bits as the
library without the pass (small and streaming outputs, chunk edges, strided and in-place
calls), and clean under ASan/UBSan."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from opgen import oracle, registry, runtime
from opgen.emit import cpu
from opgen.lower import cpu_map
from opgen.lower import sched as s
from opgen.lower.flat_chunks import CHUNK, FLAT, ChunkFlatLoops
from tests.cpu_cases import copied
from tests.ops_dirs import built_ops, built_ops_patched, top_loops
from tests.reference import assert_close_policy, f32_scalar, rounded, t64, tt
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers
from tests.test_new_op_backends import nt_worker_runs

FLAT_OPS = '''
"""Elementwise ops on 1-D tensors."""
from opgen.dsl import *

N, M, D = dims("N M D")
T = dtype_var("T", f32, bf16, f16)


@op(may_alias=[("p_out", "p"), ("m_out", "m"), ("v_out", "v")])
def adam_step(p: Tensor[f32, N], g: Tensor[f32, N], m: Tensor[f32, N], v: Tensor[f32, N],
              lr: float, b1: float, b2: float, eps: float, bc1: float, bc2: float, *,
              p_out: Output[f32, N], m_out: Output[f32, N], v_out: Output[f32, N]):
    """One Adam step (bias corrections bc1, bc2 given), as torch.optim.Adam computes it; in place
    where the outputs are the inputs."""
    m2 = b1 * m + (1.0 - b1) * g
    v2 = b2 * v + (1.0 - b2) * g * g
    denom = sqrt(v2) / sqrt(bc2) + eps
    return {"p_out": p - (lr / bc1) * m2 / denom, "m_out": m2, "v_out": v2}


@op
def silu_flat(x: Tensor[T, N], *, y: Output[T, N]):
    """y = x sigmoid(x)."""
    xf = cast(x, f32)
    return {"y": xf * sigmoid(xf)}


@op
def gather_scale(table: Tensor[T, M], at: Tensor[i64, N], w: Tensor[T, N], *, y: Output[T, N]):
    """y[i] = table[at[i]] w[i] (a load at a loaded index; at in [0, M))."""
    return {"y": gather(table, at) * w}


@op
def sq_norm(g: Tensor[T, N], *, s: Output[f32]):
    """s = sum(g^2), a 1-D tensor summed whole (chunks' partials; before: every target's
    lowering read each chunk's partial before the chunk loop, an internal error)."""
    gf = cast(g, f32)
    return {"s": sum(gf * gf)}


@op
def silu_rows(x: Tensor[T, N, D], *, y: Output[T, N, D]):
    """y = x sigmoid(x) on a 2-D tensor: rows already (not rewritten)."""
    xf = cast(x, f32)
    return {"y": xf * sigmoid(xf)}
'''

SOURCES = {"flat_ops.py": FLAT_OPS}
#: lengths around the strips and the chunks
SIZES = (1, 15, 33, 100, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 17)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("flat"), "opgen_test_flat", SOURCES) as b:
        yield b


@pytest.fixture(scope="module")
def unchunked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The same ops built without the pass (its apply a no-op)."""
    with built_ops_patched(tmp_path_factory.mktemp("unchunked"), "opgen_test_unchunked", SOURCES, ChunkFlatLoops,
                           "apply", lambda self, ctx, op: None) as b:
        yield b


def test_flat_loops_run_in_chunks_of_rows(built):
    """A 1-D op's parallel loop becomes an ``omp_for`` over chunks around one ``flat`` loop, which
    map-cpu makes a stream (prefetching each input, staging its loads, streaming its stores); a
    loop with a gather in it too (loads are free; only ``w`` is prefetched: the indices come from
    the range check's scratch copy, the table is read where they point); a 2-D op keeps its row
    loop."""
    for name, ins, outs in (("adam_step", 4, 3), ("silu_flat", 1, 1), ("gather_scale", 1, 1)):
        *checks, outer = top_loops(built, name)  # (gather_scale: its indices' range check first)
        assert len(checks) == (name == "gather_scale"), name
        assert cpu_map.cpu_mapping(outer) == s.CpuMapping.OMP_FOR
        inner = [o for o in outer.body.block.ops if isinstance(o, s.ForOp)]
        assert len(inner) == 1 and FLAT in inner[0].attributes, name
        assert cpu_map.cpu_mapping(inner[0]) == s.CpuMapping.STREAM, name
        ops = list(inner[0].body.block.ops)
        assert len([o for o in ops if isinstance(o, s.PrefetchOp)]) == ins, name
        stores = [o for o in ops if isinstance(o, s.StoreOp)]
        assert [cpu_map.cpu_mapping(o) for o in stores] == [s.CpuMapping.NONTEMPORAL] * outs, name
    (rows,) = top_loops(built, "silu_rows")
    (cols,) = [o for o in rows.body.block.ops if isinstance(o, s.ForOp)]
    assert FLAT not in cols.attributes and cpu_map.cpu_mapping(cols) == s.CpuMapping.STREAM


def _adam_args(rng: np.random.Generator, n: int) -> dict[str, object]:
    p, g, m = (rounded(rng.standard_normal(n), "f32") for _ in range(3))
    v = rounded(np.abs(rng.standard_normal(n)), "f32")
    return dict(p=p, g=g, m=m, v=v, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, bc1=0.1, bc2=0.002)


def _adam_torch(a: dict, to: object) -> tuple[torch.Tensor, ...]:
    """The Adam step in PyTorch (``to``: float64 on the same values, or float32)."""
    p, g, m, v = (to(a[k]) for k in ("p", "g", "m", "v"))
    sc = {k: f32_scalar(a[k]) for k in ("lr", "b1", "b2", "eps", "bc1", "bc2")}
    m2 = sc["b1"] * m + (1 - sc["b1"]) * g
    v2 = sc["b2"] * v + (1 - sc["b2"]) * g * g
    denom = torch.sqrt(v2) / torch.sqrt(torch.tensor(sc["bc2"], dtype=v2.dtype)) + sc["eps"]
    return p - (sc["lr"] / sc["bc1"]) * m2 / denom, m2, v2


@pytest.mark.parametrize("n", SIZES)
def test_adam_step_against_pytorch(built, rng, n):
    """The compiled Adam step and the oracle against PyTorch (float64 on the same values, and its
    f32 computation), out of place and in place (the outputs are the inputs: may_alias)."""
    a = _adam_args(rng, n)
    ref = _adam_torch(a, t64)
    same = _adam_torch(a, lambda x: tt(x, "f32"))
    got = runtime.call("adam_step", lib=built["lib"], **a)
    orc = oracle.run(built["ops"]["adam_step"], **copied(a))
    for i, k in enumerate(("p_out", "m_out", "v_out")):
        assert_close_policy(got[k], ref[i], same[i], "f32", f"adam {k} n={n}")
        assert_close_policy(orc[k], ref[i], same[i], "f32", f"oracle adam {k} n={n}")
    inplace = copied(a)
    runtime.call("adam_step", lib=built["lib"], **inplace, p_out=inplace["p"], m_out=inplace["m"],
                 v_out=inplace["v"])
    for k, o in (("p", "p_out"), ("m", "m_out"), ("v", "v_out")):
        assert np.array_equal(inplace[k].view(np.uint32), np.asarray(got[o]).view(np.uint32)), (k, n)


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
def test_flat_silu_and_gather_against_pytorch(built, rng, T):
    """SiLU and a gather on 1-D tensors of each dtype, unit-stride and strided (the strided
    flavour), every length around the strips and chunks, against PyTorch."""
    for n in SIZES:
        x = rounded(3 * rng.standard_normal(2 * n), T)
        for xs in (x[:n], x[::2]):
            got = runtime.call("silu_flat", lib=built["lib"], x=xs)["y"]
            ref = torch.nn.functional.silu(t64(xs))
            same = torch.nn.functional.silu(tt(xs, T).float()).to(tt(xs, T).dtype)
            assert_close_policy(got, ref, same, T, f"silu n={n}")
        table = rounded(rng.standard_normal(257), T)
        at = rng.integers(0, 257, n).astype(np.int64)
        w = rounded(rng.standard_normal(2 * n), T)[::2]
        got = runtime.call("gather_scale", lib=built["lib"], table=table, at=at, w=w)["y"]
        ref = t64(table)[torch.tensor(at)] * t64(w)
        same = tt(table, T)[torch.tensor(at)] * tt(w, T)
        assert_close_policy(got, ref, same, T, f"gather n={n}")


@pytest.mark.parametrize("T", ["f32", "bf16", "f16"])
def test_a_1d_tensor_summed_whole(built, rng, T):
    """sum(g^2) of a 1-D tensor (partials of chunks of FULL_SUM_CHUNK elements, each added in
    map-cpu's fixed lanes, then the partials in order) against PyTorch, every length around the
    chunks, unit-stride and strided; the same bits on 1 and 3 threads (the partials do not depend
    on the team)."""
    import ctypes

    from opgen.lower.to_loops import FULL_SUM_CHUNK

    chunks, _ = top_loops(built, "sq_norm")  # (the chunks, then the partials summed in order)
    (lanes,) = [o for o in chunks.body.block.ops if isinstance(o, s.ForOp)]
    assert lanes.kind.data == "reduce" and cpu_map.cpu_mapping(lanes) == s.CpuMapping.LANES
    partials = next(o for o in chunks.walk() if isinstance(o, s.StoreOp)).buf
    assert list(s.buf_type(partials).shape) == [f"cdiv(N,{FULL_SUM_CHUNK})"]
    # the lanes' whole strips under `omp simd` (bf16's 16 pairs: without it GCC unrolled them and
    # vectorised across strips with permutes, 32M elements 12.8 ms against 2.0)
    text = cpu.op_source(built["ops"]["sq_norm"])
    fast = text[text.index("k_sq_norm_bf16_u("):]
    strip = fast.index("for (int l = 0; l < 16; l++) {")
    assert fast[:strip].rstrip().endswith("#pragma omp simd")

    gomp = ctypes.CDLL("libgomp.so.1")
    team = gomp.omp_get_max_threads()
    for n in SIZES:
        g = rounded(rng.standard_normal(2 * n), T)
        for gs in (g[:n], g[::2]):
            got = {}
            for threads in (1, 3):
                gomp.omp_set_num_threads(threads)
                try:
                    got[threads] = np.asarray(runtime.call("sq_norm", lib=built["lib"], g=gs)["s"])
                finally:
                    gomp.omp_set_num_threads(team)
            assert got[1].tobytes() == got[3].tobytes(), n
            ref = (t64(gs) ** 2).sum()
            same = (tt(gs, T).float() ** 2).sum()
            assert_close_policy(got[1], ref, same, "f32", f"sq_norm {T} n={n}")
            orc = oracle.run(built["ops"]["sq_norm"], g=gs.copy())["s"]
            assert_close_policy(orc, ref, same, "f32", f"oracle sq_norm {T} n={n}")


def test_chunks_give_the_same_bits_as_one_loop(built, unchunked, rng, tmp_path):
    """Each element is computed by the same operations: the chunked library's results are bitwise
    those of the library built without the pass, for cached and streaming stores (OPGEN_NT_BYTES
    0, in fresh processes on 2 threads; outputs 64-byte aligned and one element past), every
    length around the strips and chunks."""
    cases = []
    for n in SIZES:
        cases.append(("adam_step", _adam_args(rng, n), {k: ((n,), np.float32) for k in ("p_out", "m_out", "v_out")}))
        for T in ("f32", "bf16", "f16"):
            x = rounded(3 * rng.standard_normal(n), T)
            cases.append(("silu_flat", {"x": x}, {"y": ((n,), x.dtype)}))
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OMP_DYNAMIC": "false", "PYTHONPATH": str(registry.REPO_ROOT)}
    libs = {name: str(b["root"] / "generated.build" / "cpu" / "libopgen.so")  # type: ignore[operator]
            for name, b in (("chunked", built), ("unchunked", unchunked))}
    runs = {(name, nt): nt_worker_runs([(lib, *c) for c in cases], {**env, "OPGEN_NT_BYTES": nt}, tmp_path)
            for name, lib in libs.items() for nt in ("0", str(1 << 40))}  # (a worker each)
    for i, (op, _, _) in enumerate(cases):
        want = runs["unchunked", str(1 << 40)][i]
        for key, results in runs.items():
            got = results[i]
            for offset in (0, 1):
                for k, v in got[offset].items():
                    assert np.array_equal(v.view(np.uint8), want[offset][k].view(np.uint8)), (op, key, offset, k)


SANITIZED = """
import sys, numpy as np, ml_dtypes
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(0)
for n in (1, 15, 33, 16383, 16384, 16385, 49169):
    p, g, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(4))
    sc = dict(lr=1e-3, b1=0.9, b2=0.999, eps=1e-8, bc1=0.1, bc2=0.002)
    runtime.call("adam_step", lib=lib, p=p, g=g, m=m, v=np.abs(v), **sc)
    runtime.call("adam_step", lib=lib, p=p, g=g, m=m, v=np.abs(v), p_out=p, m_out=m, v_out=v, **sc)
    for dt in (np.float32, ml_dtypes.bfloat16, np.float16):
        x = rng.standard_normal(2 * n).astype(dt)
        runtime.call("silu_flat", lib=lib, x=x[:n])
        runtime.call("silu_flat", lib=lib, x=x[::2])
        off = np.zeros(n + 5, dt)[5:]  # (an output off a line)
        runtime.call("silu_flat", lib=lib, x=x[1:n + 1], y=off)
        runtime.call("sq_norm", lib=lib, g=x[::2])
        runtime.call("sq_norm", lib=lib, g=x[1:n + 1])
        table = rng.standard_normal(7).astype(dt)
        runtime.call("gather_scale", lib=lib, table=table, at=rng.integers(0, 7, n), w=x[::2])
print("done")
"""


def test_flat_chunks_are_clean_under_asan_and_ubsan(built):
    """The chunked loops (lengths around the strips and the chunks, strided, in place, outputs
    off a line) under ASan/UBSan."""
    assert_clean_under_sanitizers(built, SANITIZED)
