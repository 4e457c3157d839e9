"""Row groups over several leading dims (lower-to-loops' ``fold_rows``, the CPU's): where every
output and row-local value of a group shares leading dims after the first and each row so
indexed is computed on its own, the group's rows are those of all of them, and map-cpu splits the
whole nest among the threads (``collapse(n)``). Before, the rows were those of the first dim
alone: an RMSNorm over (1, T, D) ran on one thread (2 threads: 41 -> 23 ms at 1x8192x4096 f32),
an attention softmax's backward over (1, H, S, S) on one. Checked: the planned rows (and where
folding must stop: a reduction over T, column sums, split outputs), the generated pragma, the
results against PyTorch float64 (same-dtype setting the margin) and the oracle with empty and
unit dims and strided inputs, the same bits as the unfused lowering on 1 and 3 threads, and
ASan/UBSan."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from opgen import oracle, runtime
from opgen.emit import cpu
from opgen.ir import dialect as ir
from opgen.lower import cpu_map
from opgen.lower import sched as s
from opgen.lower.row_groups import RowGroupLowering
from opgen.passes import pipeline
from tests.ops_dirs import built_ops, built_unfused, top_loops
from tests.reference import assert_close_policy, rounded, t64, tt
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

FOLD_OPS = '''
"""Ops over (B, T, D) and attention's (B, H, S, L): rows over several leading dims."""
from opgen.dsl import *

B, T, D, H, S, L = dims("B T D H S L")
F = dtype_var("F", f32, bf16)


@op
def rms_btd(x: Tensor[F, B, T, D], w: Tensor[F, D], *, y: Output[F, B, T, D]):
    """RMSNorm over the last axis of (B, T, D)."""
    xf = cast(x, f32)
    r = rsqrt(mean(xf * xf, axis=-1, keepdims=True) + 1e-6)
    return {"y": cast(xf * r * cast(w, f32), F)}


@op
def softmax_bhsl(x: Tensor[F, B, H, S, L], *, y: Output[F, B, H, S, L]):
    """Attention's softmax over the last axis: the exps kept in a row of scratch."""
    xf = cast(x, f32)
    e = exp(xf - max(xf, axis=-1, keepdims=True))
    return {"y": cast(e / sum(e, axis=-1, keepdims=True), F)}


@op
def gelu_btd(x: Tensor[F, B, T, D], *, y: Output[F, B, T, D]):
    """An elementwise op over (B, T, D): no row-local value."""
    xf = cast(x, f32)
    return {"y": cast(0.5 * xf * (1.0 + erf(xf * 0.7071067811865476)), F)}


@op
def centre_tokens_btd(x: Tensor[F, B, T, D], *, y: Output[F, B, T, D]):
    """x less its mean over the tokens (axis 1): its rows are B's alone."""
    xf = cast(x, f32)
    return {"y": cast(xf - mean(xf, axis=1, keepdims=True), F)}
'''

#: each op's planned rows (B alone where a reduction runs over T)
ROWS = {"rms_btd": ["B", "T"], "softmax_bhsl": ["B", "H", "S"], "gelu_btd": ["B", "T"], "centre_tokens_btd": ["B"]}
#: (B, T, D) shapes: empty, unit and odd dims, B smaller than the threads
SHAPES = ((0, 3, 5), (2, 0, 5), (1, 1, 1), (1, 7, 33), (3, 5, 17), (2, 9, 100))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("fold_rows"), "opgen_test_fold_rows", {"fold_ops.py": FOLD_OPS}) as b:
        yield b


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_unfused(tmp_path_factory.mktemp("fold_unfused"), "opgen_test_fold_rows_unfused",
                       {"fold_ops.py": FOLD_OPS}) as b:
        yield b


def _planned_rows(built: dict[str, object], name: str) -> list[list[str]]:
    m = built["ops"][name].module()  # type: ignore[index]
    pipeline.run(m, "cpu", until="convert-at-boundary")
    f = next(x for x in m.walk() if isinstance(x, ir.FuncOp))
    low = RowGroupLowering(f, set(f.aliased_outputs))
    low.fold_rows = low.row_scratch = True
    return [g.rows for g in low.plan()]


def test_rows_over_the_shared_leading_dims(built):
    """The planned rows of each op; its one parallel loop over them shares the team across the
    nest (``collapse(n)``, printed), where a reduction over the tokens keeps B's rows alone;
    without ``fold_rows`` (the other targets) B's alone everywhere. The softmax keeps its exps in
    a row of scratch over L (kept rows of a folded group)."""
    for name, rows in ROWS.items():
        assert _planned_rows(built, name) == [rows], name
        (loop,) = top_loops(built, name)
        n = loop.attributes.get(cpu_map.COLLAPSE)
        assert (n.data if n is not None else 1) == len(rows), name  # type: ignore[union-attr]
        text = cpu.op_source(built["ops"][name])  # type: ignore[index]
        assert (f"#pragma omp for collapse({len(rows)}) schedule(static)" in text) == (len(rows) > 1), name
        m = built["ops"][name].module()  # type: ignore[index]
        pipeline.run(m, "cpu", until="convert-at-boundary")
        f = next(x for x in m.walk() if isinstance(x, ir.FuncOp))
        assert [g.rows for g in RowGroupLowering(f, set(f.aliased_outputs)).plan()] == [["B"]], name
    # the softmax's exps kept per row of L (its rows over B, H, S): one exp in the kernel
    m = built["ops"]["softmax_bhsl"].module()  # type: ignore[index]
    pipeline.run(m, "cpu", until="lower-to-loops")
    k = next(x for x in m.walk() if isinstance(x, s.KernelOp))
    assert sum(isinstance(o, ir.ExpOp) for o in k.walk()) == 1
    assert [s.buf_type(a.result).shape for a in k.walk() if isinstance(a, s.AllocOp)
            and s.buf_type(a.result).rank] == [("L",)]


def _refs(name: str, x: np.ndarray, w: np.ndarray | None, T: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float64, same-dtype) PyTorch references of op ``name``."""
    out = []
    for xt, wt in ((t64(x), t64(w) if w is not None else None),
                   (tt(x, T).float(), tt(w, T).float() if w is not None else None)):
        if name == "rms_btd":
            r = xt * torch.rsqrt((xt * xt).mean(-1, keepdim=True) + 1e-6) * wt
        elif name == "softmax_bhsl":
            r = torch.softmax(xt, -1)
        elif name == "gelu_btd":
            r = torch.nn.functional.gelu(xt)
        else:
            r = xt - xt.mean(1, keepdim=True)
        out.append(r)
    return out[0], out[1].to(tt(x, T).dtype)


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_against_pytorch_and_the_oracle(built, rng, T, strided):
    """Every op on empty and unit dims and B smaller than the threads, contiguous and strided
    (every other token), against PyTorch and the oracle."""
    lib, ops = built["lib"], built["ops"]
    for b, t, d in SHAPES:
        full = rounded(rng.standard_normal((b, 2 * t, d)) * 2, T)
        x = full[:, ::2] if strided else np.ascontiguousarray(full[:, :t])
        w = rounded(rng.standard_normal(d), T)
        calls = [("rms_btd", {"x": x, "w": w}, x, w), ("gelu_btd", {"x": x}, x, None),
                 ("centre_tokens_btd", {"x": x}, x, None)]
        x4 = x.reshape(b, 1, t, d) if strided else x.reshape(b, t, 1, d)
        calls.append(("softmax_bhsl", {"x": x4}, x4, None))
        for name, args, xa, wa in calls:
            what = f"{name} {T} {x.shape} strided={strided}"
            ref, same = _refs(name, xa, wa, T)
            got = runtime.call(name, lib=lib, **args)["y"]
            assert_close_policy(got, ref, same, T, what)
            orc = oracle.run(ops[name], **{k: v.copy() for k, v in args.items()})["y"]  # type: ignore[index]
            assert_close_policy(orc, ref, same, T, "oracle " + what)


def test_the_same_bits_as_the_unfused_lowering(built, unfused, rng):
    """Rows over several dims give the bits of the unfused lowering (each value its own nest),
    on 1 and 3 threads, with rows of many lanes' strips and B of 1 and 3."""
    gomp = ctypes.CDLL("libgomp.so.1")
    team = gomp.omp_get_max_threads()
    for T in ("f32", "bf16"):
        for b in (1, 3):
            x = rounded(rng.standard_normal((b, 13, 700)) * 2, T)
            calls = [("rms_btd", {"x": x, "w": rounded(rng.standard_normal(700), T)}), ("gelu_btd", {"x": x}),
                     ("centre_tokens_btd", {"x": x}), ("softmax_bhsl", {"x": x.reshape(b, 13, 1, 700)})]
            for name, args in calls:
                want = runtime.call(name, lib=unfused["lib"], **args)["y"]
                for threads in (1, 3):
                    gomp.omp_set_num_threads(threads)
                    try:
                        got = runtime.call(name, lib=built["lib"], **args)["y"]
                    finally:
                        gomp.omp_set_num_threads(team)
                    assert got.tobytes() == want.tobytes(), (name, T, b, threads)


SANITIZED = """
import sys, numpy as np, ml_dtypes
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(0)
for dt in (np.float32, ml_dtypes.bfloat16):
    for b, t, d in ((0, 3, 5), (2, 0, 5), (1, 1, 1), (1, 7, 33), (3, 5, 17), (2, 9, 100)):
        full = rng.standard_normal((b, 2 * t, d)).astype(dt)
        for x in (full[:, ::2], np.ascontiguousarray(full[:, :t])):
            runtime.call("rms_btd", lib=lib, x=x, w=rng.standard_normal(d).astype(dt))
            runtime.call("gelu_btd", lib=lib, x=x)
            runtime.call("centre_tokens_btd", lib=lib, x=x)
            runtime.call("softmax_bhsl", lib=lib, x=x.reshape(b, 1, t, d))
print("done")
"""


def test_folded_rows_are_clean_under_asan_and_ubsan(built):
    """The ops (empty and unit dims, B of 1, strided) under ASan/UBSan on 3 threads."""
    assert_clean_under_sanitizers(built, SANITIZED)
