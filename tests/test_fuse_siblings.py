"""``fuse-siblings`` (opgen/lower/fuse_siblings.py) and map-cpu's prefetch of rows read at a column
offset (``sched.prefetch ... shift``, :func:`opgen.lower.cpu_map.shifted_streams`).

Rotary-embedding backward (a concat of two column spans, written only in tests/test_shapes_dsl.py)
on the CPU pipeline's IR: one loop over the heads holding both spans, the rotated half's rows
prefetched ahead; the built library against a float64 numpy reference, bitwise against the op
built without the pass, and under ASan/UBSan. Softmax backward over the last axis of attention
scores (B, H, S, S): its row sums and the rows' second pass in one nest (the sums' scratch and
the output sliced by the heads' counter at different axes), against PyTorch and bitwise the
unfused build. The legality rule on hand-written sched IR: siblings fuse where each iteration
touches only its own slice of every buffer they write (or that may alias one), and not where one
reads another iteration's slice, writes a buffer without the counter, or holds a serial loop.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest
from xdsl.parser import Parser

from opgen import registry, runtime
from opgen.ir import dialect as ir
from opgen.lower import fuse_siblings
from opgen.lower import sched as s
from opgen.lower.cpu_map import CpuMapping, cpu_mapping
from opgen.lower.row_groups import RowGroupLowering
from opgen.passes import pipeline
from tests.ops_dirs import built_ops, built_ops_patched
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers
from tests.test_shapes_dsl import ROPE

ATTN = '''
"""Softmax backward over the last axis of attention scores."""
from opgen.dsl import *

B, H, S = dims("B H S")
T = dtype_var("T", f32, bf16)


@op
def attn_softmax_backward(grad: Tensor[T, B, H, S, S], y: Tensor[T, B, H, S, S], *, dx: Output[T, B, H, S, S]):
    """dx = y (g - sum(g y)) over the last axis."""
    g = cast(grad, f32)
    yf = cast(y, f32)
    return {"dx": yf * (g - sum(g * yf, axis=-1, keepdims=True))}
'''
SOURCES = {"rope.py": ROPE, "attn.py": ATTN}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("fuse_siblings"), "opgen_test_fuse_siblings", SOURCES) as b:
        yield b


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The same ops built without the pass."""
    with built_ops_patched(tmp_path_factory.mktemp("fuse_siblings_off"), "opgen_test_fuse_siblings_off",
                           SOURCES, fuse_siblings, "ENABLED", False) as b:
        yield b["lib"]


def _kernel(stage: str) -> s.KernelOp:
    (k,) = [o for o in pipeline.run(registry.get("rope_backward").module(), "cpu", until=stage).body.block.ops
            if isinstance(o, s.KernelOp)]
    return k


def _loops(block_op: s.ForOp) -> list[s.ForOp]:
    return [o for o in block_op.body.block.ops if isinstance(o, s.ForOp)]


def test_the_heads_loop_holds_both_spans(built):
    """Each row n: one loop over the heads (fused), its body the two column spans in order
    (columns [0, k) then [k, D)); without the pass, two loops over the heads."""
    (rows,) = _loops(_kernel("fuse-siblings"))  # type: ignore[arg-type]
    (heads,) = _loops(rows)
    spans = _loops(heads)
    assert len(spans) == 2 and spans[0].hi is spans[1].lo
    for span in spans:
        stores = [o for o in span.body.block.ops if isinstance(o, s.StoreOp)]
        assert len(stores) == 1 and stores[0].idx[1] is heads.iv and stores[0].idx[2] is span.iv
    mp = pytest.MonkeyPatch()
    mp.setattr(fuse_siblings, "ENABLED", False)
    try:
        (rows,) = _loops(_kernel("fuse-siblings"))  # type: ignore[arg-type]
        assert len(_loops(rows)) == 2
    finally:
        mp.undo()


def test_the_rotated_half_is_prefetched_ahead(built):
    """map-cpu: the first span reads each row at j and at j + k (the rotated half); its strips
    prefetch both, 2 KiB ahead (``shift k``), as they do the plain rows; the second span re-reads
    the row and prefetches the next head's instead."""
    k = _kernel("map-cpu")
    (rows,) = _loops(k)  # type: ignore[arg-type]
    (heads,) = _loops(rows)
    first, second = _loops(heads)
    assert cpu_mapping(first) == cpu_mapping(second) == CpuMapping.STREAM
    names = k.param_names
    hints = [o for o in first.body.block.ops if isinstance(o, s.PrefetchOp)]
    plain = sorted(names[h.buf] for h in hints if h.shift is None)
    shifted = [h for h in hints if h.shift is not None]
    assert plain == ["cos", "grad"] and sorted(names[h.buf] for h in shifted) == ["grad", "sin"]
    for h in shifted:
        assert h.idx[-1] is first.iv and h.ahead.data == 2048 and isinstance(h.shift.owner, ir.SizeSubOp)
    assert not any(h.shift is not None for h in second.body.block.ops if isinstance(h, s.PrefetchOp))
    # (the shift in the op's assembly format: printed and parsed back)
    again = Parser(pipeline.context(), str(k.parent_op())).parse_module()
    texts = [str(o) for o in again.walk() if isinstance(o, s.PrefetchOp) and o.shift is not None]
    assert len(texts) == 2 and all(" shift %" in t for t in texts)


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 2, 5), (4, 3, 128), (2, 5, 130)])
def test_results_match_numpy_and_the_unfused_build(built, unfused, rng, dt, shape):
    """Odd and even D (the spans k = D - D // 2 and D // 2), head counts 1 to 5: the float64
    reference within the dtype's margin, and bitwise the build without the pass."""
    n, _, d = shape
    grad = rng.standard_normal(shape).astype(dt)
    cos = rng.standard_normal((n, d)).astype(dt)
    sin = rng.standard_normal((n, d)).astype(dt)
    got = np.asarray(runtime.call("rope_backward", lib=built["lib"], grad=grad, cos=cos, sin=sin)["dx"])
    off = np.asarray(runtime.call("rope_backward", lib=unfused, grad=grad, cos=cos, sin=sin)["dx"])
    g64, c64, s64 = (a.astype(np.float64) for a in (grad, cos, sin))
    u = g64 * s64[:, None, :]
    k = d - d // 2
    want = g64 * c64[:, None, :] + np.concatenate([u[..., k:], -u[..., :k]], axis=-1)
    tol = 1e-5 if dt == np.float32 else 2e-2
    assert np.abs(got.astype(np.float64) - want).max() <= tol * (np.abs(want).max() + 1)
    assert np.array_equal(got.view(np.uint8), off.view(np.uint8))


def test_attention_rows_are_summed_and_rewritten_in_one_nest(built):
    """Softmax backward on (B, H, S, S): one loop over the heads, one over the rows, and in it the
    row's sum (``lanes``) then its second pass (``stream``, prefetching the next row): the row is
    read again from cache. The row group's rows run over (B, H, S) (fold_rows: the three loops
    collapsed), each row computing its sum then its second pass; with B's rows alone (the row
    group's rows before fold_rows, kept here by a patch), this pass fuses the nest of sums and the
    nest of second passes that lowering leaves under the heads loop."""
    def heads(stage: str, fold: bool = True) -> list[s.ForOp]:
        mp = pytest.MonkeyPatch()
        if not fold:
            mp.setattr(RowGroupLowering, "row_dims", lambda self, g: [g.dim])
        try:
            m = pipeline.run(registry.get("attn_softmax_backward").module(), "cpu", until=stage)
        finally:
            mp.undo()
        (k,) = [o for o in m.body.block.ops if isinstance(o, s.KernelOp)]
        (batch,) = _loops(k)  # type: ignore[arg-type]
        return _loops(batch)

    for fold in (True, False):
        mp = pytest.MonkeyPatch()
        mp.setattr(fuse_siblings, "ENABLED", True)  # (the unfused build's fixture, if up, turned it off)
        try:
            (h,) = heads("map-cpu", fold)
        finally:
            mp.undo()
        (rows,) = _loops(h)
        total, second = _loops(rows)
        assert cpu_mapping(total) == CpuMapping.LANES and cpu_mapping(second) == CpuMapping.STREAM
        nxt = [o for o in second.body.block.ops if isinstance(o, s.PrefetchOp) and o.idx[2] is not rows.iv]
        assert len(nxt) == 2  # (grad's and y's next row)
        mp = pytest.MonkeyPatch()
        mp.setattr(fuse_siblings, "ENABLED", False)
        try:
            assert len(heads("fuse-siblings", fold)) == (1 if fold else 2), fold
        finally:
            mp.undo()


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 3, 5), (1, 2, 64), (2, 2, 97)])
def test_attention_softmax_backward_matches_torch_and_the_unfused_build(built, unfused, rng, dt, shape):
    """Against PyTorch's softmax backward (float64 on the same values; and its own in the dtype),
    and bitwise the build without the pass."""
    import torch

    from tests.reference import assert_close_policy, t64, tt

    name = "f32" if dt == np.float32 else "bf16"
    b, h, n = shape
    g = rng.standard_normal((b, h, n, n)).astype(dt)
    y = torch.softmax(torch.tensor(rng.standard_normal((b, h, n, n))), -1).numpy().astype(dt)
    got = np.asarray(runtime.call("attn_softmax_backward", lib=built["lib"], grad=g, y=y)["dx"])
    off = np.asarray(runtime.call("attn_softmax_backward", lib=unfused, grad=g, y=y)["dx"])
    assert np.array_equal(got.view(np.uint8), off.view(np.uint8))
    ref = torch.ops.aten._softmax_backward_data(t64(g), t64(y), -1, torch.float64)
    same = torch.ops.aten._softmax_backward_data(tt(g, name), tt(y, name), -1, tt(g, name).dtype)
    assert_close_policy(got, ref, same, name, f"attention softmax backward {shape}")


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    rng = np.random.default_rng(0)
    for dt in (np.float32, ml_dtypes.bfloat16):
        for n, h, d in ((1, 1, 1), (2, 3, 5), (3, 4, 64), (5, 2, 131)):
            grad = rng.standard_normal((n, h, d)).astype(dt)
            cs = rng.standard_normal((n, d)).astype(dt)
            runtime.call("rope_backward", lib=lib, grad=grad, cos=cs, sin=cs[::-1].copy())
            wide = rng.standard_normal((n, h, 2 * d)).astype(dt)  # (rows apart)
            runtime.call("rope_backward", lib=lib, grad=wide[..., ::2], cos=cs, sin=cs)
        for b, h, n in ((1, 1, 1), (2, 3, 5), (1, 2, 64), (2, 2, 97)):
            g = rng.standard_normal((b, h, n, 2 * n)).astype(dt)
            runtime.call("attn_softmax_backward", lib=lib, grad=g[..., :n], y=g[..., n:])
            runtime.call("attn_softmax_backward", lib=lib, grad=np.ascontiguousarray(g[..., :n]),
                         y=np.ascontiguousarray(g[..., n:]))
    print("done")
""")


def test_fused_rope_is_clean_under_asan_and_ubsan(built):
    assert_clean_under_sanitizers(built, SANITIZED)


# ---------------------------------------------------------------------- the legality rule
HEADER = ('builtin.module {\n"sched.kernel"() <{sym_name = "k", arg_names = ["x", "y", "z"], '
          'dtype_vars = {T = ["f32"]}%s}> ({\n'
          "^bb0(%%x: !sched.buf<[N, D], T, in>, %%y: !sched.buf<[N, D], T, out>, %%z: !sched.buf<[N, D], T, out>):\n"
          '%%n = opgen.dim "N" : !opgen.tensor<[], i64>\n%%d = opgen.dim "D" : !opgen.tensor<[], i64>\n'
          '%%c0 = "opgen.constant"() <{value = 0 : i64}> : () -> !opgen.tensor<[], i64>\n'
          '%%c1 = "opgen.constant"() <{value = 1 : i64}> : () -> !opgen.tensor<[], i64>\n')
I64 = "!opgen.tensor<[], i64>"
F32 = "!opgen.tensor<[], f32>"
BUF = "!sched.buf<[N, D], T, %s>"


def _nest(i: str, inner: str, body: str, kind: str = "parallel") -> str:
    return (f"sched.for parallel %c0 to %n {{\n^bb0(%{i}: {I64}):\n"
            f"sched.for {kind} %c0 to %d {{\n^bb0(%{inner}: {I64}):\n{body}}}\n}}\n")


def _fusions(a_body: str, b_body: str, alias: str = "", b_kind: str = "parallel") -> int:
    text = (HEADER % alias + _nest("i", "j", a_body) + _nest("p", "q", b_body, b_kind) + "}) : () -> ()\n}")
    m = Parser(pipeline.context(), text).parse_module()
    (k,) = m.body.block.ops
    return fuse_siblings.fuse_block(k.body.block, k.aliased_args)  # type: ignore[attr-defined]


COPY_XY = (f"%a = sched.load %x[%i, %j] : {BUF % 'in'} -> {F32}\n"
           f"sched.store %a, %y[%i, %j] : {F32}, {BUF % 'out'}\n")


def _copy_to_z(src: str, at: str, to: str) -> str:
    """The second loop's body: z[to] = src[at] (src x, an input, or y, the first loop's output)."""
    return (f"%b = sched.load %{src}[{at}] : {BUF % ('in' if src == 'x' else 'out')} -> {F32}\n"
            f"sched.store %b, %z[{to}] : {F32}, {BUF % 'out'}\n")


OTHER_ROW = f"%r = opgen.sub %n, %p : {I64}\n%r1 = opgen.sub %r, %c1 : {I64}\n"


@pytest.mark.parametrize("case, b_body, alias, kind, fusions", [
    ("reads y at its own row", _copy_to_z("y", "%p, %q", "%p, %q"), "", "parallel", 2),
    ("reads y at another row", OTHER_ROW + _copy_to_z("y", "%r1, %q", "%p, %q"), "", "parallel", 0),
    ("writes z at row 0", _copy_to_z("x", "%p, %q", "%c0, %q"), "", "parallel", 0),
    ("reads x only", _copy_to_z("x", "%c0, %q", "%p, %q"), "", "parallel", 2),
    ("x may alias y, read at row 0", _copy_to_z("x", "%c0, %q", "%p, %q"), ', may_alias = {y = "x"}', "parallel", 0),
    ("a serial inner loop", _copy_to_z("x", "%p, %q", "%p, %q"), "", "serial", 0),
    ("a reduce inner loop", _copy_to_z("x", "%p, %q", "%p, %q"), "", "reduce", 1),
    ("writes z transposed", _copy_to_z("y", "%p, %q", "%q, %p"), "", "parallel", 2),
    ("x may alias y, z transposed", _copy_to_z("x", "%p, %q", "%q, %p"), ', may_alias = {y = "x"}', "parallel", 2),
    ("z may alias y, z transposed", _copy_to_z("x", "%p, %q", "%q, %p"), ', may_alias = {z = "x", y = "x"}',
     "parallel", 0),
])
def test_siblings_fuse_only_where_each_iteration_keeps_to_its_slice(case, b_body, alias, kind, fusions):
    """The first loop copies x's row i into y's; the second fuses when it reads y only at its
    own row, or x anywhere (read only), or writes z's column p (each buffer's own slice, at its
    own axis) — the row loops, then the column loops now siblings in the fused body (2); the row
    loops only where the second's inner loop is a reduce loop (1) — and not when it reads
    another row of y, writes one row of z for all p, reads x elsewhere while x may alias y,
    writes z's columns while z and y may alias the same x (the aliased buffers' slices at
    different axes), or holds a serial loop (0)."""
    assert _fusions(COPY_XY, b_body, alias, kind) == fusions, case
