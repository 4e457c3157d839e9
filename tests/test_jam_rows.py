"""``jam-rows`` (opgen/lower/jam_rows.py): rows whose second pass adds into column accumulators
go two at a time, rows of a loop that only sums columns ``READ_STREAMS`` tensor rows at a time;
``combine-accums`` (opgen/lower/combine_accums.py): the jammed rows' sums into one accumulator
element read it once and write it once.

The decisions are checked on the CPU pipeline's IR (RMSNorm backward's row loop jammed, its
rows' next rows prefetched by map-cpu; a scatter-add's segment loop and a row loop whose first
pass reads the accumulator left alone); the built library's results against a float64 numpy
reference for row counts around the group and pair boundaries, bitwise against the same op
built without the pass (the same additions in the same order), in place, and under ASan and
UBSan.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

from opgen import registry, runtime
from opgen.ir import dialect as ir
from opgen.lower import jam_rows
from opgen.lower import sched as s
from opgen.lower.cpu_map import CpuMapping, cpu_mapping
from opgen.passes import pipeline
from tests.ops_dirs import built_ops, built_ops_patched
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

OPS = '''
"""A norm-like backward with two column sums (written only here)."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16)


@op(may_alias=[("dx", "g")])
def norm_cols(g: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D], dw: Output[T, D],
              db: Output[T, D]):
    """r = 1 / sqrt(mean(x^2) + 1e-5) per row; dx = g r - x mean(g x) r^3; dw, db: column sums
    of g x r and of g."""
    r = rsqrt(mean(x * x, axis=-1, keepdims=True) + 1e-5)
    return {"dx": g * r - x * (mean(g * x, axis=-1, keepdims=True) * r * r * r),
            "dw": sum(g * x * r, axis=0), "db": sum(g, axis=0)}


@op
def scale_cols(x: Tensor[T, N, D], m: Tensor[f32, D], r: Tensor[f32, D], *, y: Output[T, N, D]):
    """y = (x - m) r, m and r per column (a row loop reading column vectors: 2 rows at a time)."""
    return {"y": (cast(x, f32) - m[None, :]) * r[None, :]}


@op
def twice(x: Tensor[T, N, D], *, y: Output[T, N, D]):
    """y = 2 x (no column vector: one row at a time)."""
    return {"y": x * 2.0}


@op
def col_sum(x: Tensor[T, N, D], *, s: Output[f32, D]):
    """The column sums of x (a loop that only reads rows: 8 rows at a time)."""
    return {"s": sum(cast(x, f32), axis=0)}


@op
def col_stats(g: Tensor[T, N, D], x: Tensor[T, N, D], *, a: Output[f32, D], b: Output[f32, D]):
    """The column sums of g and of g x (two tensors' rows: 4 rows at a time)."""
    gf = cast(g, f32)
    return {"a": sum(gf, axis=0), "b": sum(gf * cast(x, f32), axis=0)}
'''


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("jam_rows"), "opgen_test_jam_rows", {"n.py": OPS}) as b:
        yield b


@pytest.fixture(scope="module")
def unjammed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The same op built without the pass."""
    with built_ops_patched(tmp_path_factory.mktemp("jam_rows_off"), "opgen_test_jam_rows_off", {"n.py": OPS},
                           jam_rows, "FACTOR", 1) as b:
        yield b["lib"]


#: jam-rows' factor as built (the ``unjammed`` fixture sets 1 for as long as it lives, on its worker)
FACTOR = jam_rows.FACTOR


def _run(module: object, stage: str) -> object:
    """The CPU pipeline up to ``stage`` with jam-rows' own factor."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jam_rows, "FACTOR", FACTOR)
        return pipeline.run(module, "cpu", until=stage)


def _staged(name: str, stage: str) -> list[s.KernelOp]:
    m = _run(registry.get(name).module(), stage)
    return [k for k in m.body.block.ops if isinstance(k, s.KernelOp)]


def _built_staged(built: dict[str, object], name: str, stage: str) -> s.KernelOp:
    """The kernel of an op written here after ``stage`` of the CPU pipeline."""
    m = _run(built["ops"][name].module(), stage)  # type: ignore[index]
    (k,) = [k for k in m.body.block.ops if isinstance(k, s.KernelOp)]
    return k


def _jammed(k: s.KernelOp) -> list[s.ForOp]:
    """The loops jam-rows made (serial loops over pairs: counter hint ``p``)."""
    return [o for o in k.walk() if isinstance(o, s.ForOp) and o.iv.name_hint == "p"]


def test_rms_norm_rows_go_two_at_a_time():
    """RMSNorm backward: the row loop over a group becomes a loop over pairs (rows lo + 2p and
    lo + 2p + 1: each row's first pass, then one second pass adding both rows' terms into the
    dgamma accumulator, row lo + 2p first) and the original loop for the row left over."""
    (k,) = _staged("rms_norm_backward", "jam-rows")
    pairs = [p for p in _jammed(k) if any(isinstance(o, s.ForOp) and o.kind.data == "reduce" for o in p.walk())]
    assert len(pairs) == 1
    pair = pairs[0]
    second = pair.body.block.last_op
    assert isinstance(second, s.ForOp) and second.kind.data == "parallel"
    accs = [o for o in second.body.block.ops if isinstance(o, s.AccumOp)]
    assert len(accs) == 2 and accs[0].buf is accs[1].buf and accs[0].kind.data == "sum"
    rows = [st.idx[0] for st in second.body.block.ops if isinstance(st, s.StoreOp)]
    assert len(rows) == 2
    base = rows[0].owner
    assert isinstance(base, ir.AddOp)
    step = base.rhs.owner
    assert isinstance(step, ir.MulOp) and step.lhs is pair.iv and ir.constant_int(step.rhs) == jam_rows.FACTOR
    nxt = rows[1].owner
    assert isinstance(nxt, ir.AddOp) and nxt.lhs is rows[0] and ir.constant_int(nxt.rhs) == 1
    rest = pair.next_op
    assert isinstance(rest, s.ForOp) and rest.kind.data == "serial" and rest.lo.owner.operands[0] is base.lhs
    assert isinstance(rest.body.block.last_op, s.ForOp)  # (the original body, one row)


def test_the_jammed_second_pass_streams_and_prefetches_the_next_pair():
    """After map-cpu the jammed second pass is a stream loop whose next-row prefetches name
    rows lo + 2 (p + 1) and that plus one, clamped to the tensor's rows (max(min(row, N - 1),
    0)): the next pair, at a group's end the next group's first pair, never a row past the tensor."""
    (k,) = _staged("rms_norm_backward", "map-cpu")
    pair = next(p for p in _jammed(k) if any(isinstance(o, s.ForOp) and o.kind.data == "reduce" for o in p.walk()))
    second = pair.body.block.last_op
    assert cpu_mapping(second) == CpuMapping.STREAM
    nexts = [p for p in second.body.block.ops if isinstance(p, s.PrefetchOp) and not p.write]
    names = {k.param_names.get(p.buf) for p in nexts}
    assert names == {"grad_y", "x"} and len(nexts) == 4
    for p in nexts:
        clamp = p.idx[0].owner
        assert isinstance(clamp, ir.MaxOp) and ir.constant_int(clamp.rhs) == 0
        below = clamp.lhs.owner
        top = below.rhs.owner
        assert isinstance(below, ir.MinOp) and isinstance(top, ir.SubOp) and ir.constant_int(top.rhs) == 1
        assert isinstance(top.lhs.owner, ir.DimOp) and top.lhs.owner.dim.data == "N"
        row = below.lhs
        add = row.owner if isinstance(row.owner, ir.AddOp) and ir.constant_int(row.owner.rhs) == 1 else None
        first = add.lhs if add is not None else row
        mul = first.owner.rhs.owner
        assert isinstance(mul, ir.MulOp) and ir.constant_int(mul.rhs) == jam_rows.FACTOR
        plus = mul.lhs.owner
        assert isinstance(plus, ir.AddOp) and plus.lhs is pair.iv and ir.constant_int(plus.rhs) == 1


def test_a_scatter_adds_segment_loop_is_left_alone():
    """Embedding backward's loop over an output row's segment (bounds read at run time: the
    empty-range branch and the gathered-row prefetches are for that loop) is not jammed."""
    for k in _staged("embedding_dense_backward", "jam-rows"):
        assert _jammed(k) == []


def _rms_row_loop() -> tuple[s.KernelOp, s.ForOp, s.ForOp]:
    """RMSNorm backward before jam-rows: the kernel, its row loop and the loop's second pass."""
    (k,) = _staged("rms_norm_backward", "column-strips")
    loop = next(o for o in k.walk() if isinstance(o, s.ForOp) and o.kind.data == "serial"
                and isinstance(o.body.block.last_op, s.ForOp) and o.body.block.last_op.kind.data == "parallel")
    return k, loop, loop.body.block.last_op


def test_a_first_pass_reading_the_accumulator_is_not_jammed():
    """A row loop whose first pass also reads the column accumulator: jamming would read it
    before the previous row's terms are in: refused."""
    _, loop, second = _rms_row_loop()
    acc = next(o for o in second.body.block.ops if isinstance(o, s.AccumOp)).buf
    assert jam_rows.jammable(loop, set()) is second
    zero = ir.ConstantOp(0, "i64")
    peek = s.LoadOp(acc, [zero.result])
    loop.body.block.insert_ops_before([zero, peek], loop.body.block.first_op)
    assert jam_rows.jammable(loop, set()) is None


@pytest.mark.parametrize("param", ["grad_x", "grad_y"])
def test_a_written_or_aliased_row_read_elsewhere_is_not_jammed(param):
    """A read of grad_x (written by the second pass) or of grad_y (which may be grad_x) at a
    row other than the counter's — row 0 — could meet the other row of a pair: refused; x, which
    nothing writes, may be read anywhere."""
    k, loop, second = _rms_row_loop()
    aliased = k.aliased_args
    by_name = {n: a for a, n in k.param_names.items()}
    assert jam_rows.jammable(loop, aliased) is second
    zero = ir.ConstantOp(0, "i64")
    x0 = s.LoadOp(by_name["x"], [zero.result, zero.result])
    loop.body.block.insert_ops_before([zero, x0], loop.body.block.first_op)
    assert jam_rows.jammable(loop, aliased) is second
    peek = s.LoadOp(by_name[param], [zero.result, zero.result])
    loop.body.block.insert_op_after(peek, x0)
    assert jam_rows.jammable(loop, aliased) is None


def test_a_dsl_norm_with_two_column_sums_is_jammed(built):
    """The op written here (dw and db summed in the rows' second pass, dx in place over g
    allowed): its row loop is jammed, both sums in one jammed loop."""
    (k,) = _staged("norm_cols", "jam-rows")
    seconds = [p.body.block.last_op for p in _jammed(k)]
    assert any(len({a.buf for a in o.body.block.ops if isinstance(a, s.AccumOp)}) == 2 for o in seconds)


def _reference(g: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g64, x64 = g.astype(np.float64), x.astype(np.float64)
    r = 1 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + 1e-5)
    dx = g64 * r - x64 * ((g64 * x64).mean(-1, keepdims=True) * r ** 3)
    return dx, (g64 * x64 * r).sum(0), g64.sum(0)


ROWS = [1, 2, 3, 31, 32, 33, 34, 65, 97]


def _reads_caller(k: s.KernelOp) -> s.ForOp:
    """The jammed loop over the caller's rows (not the one over the 32-row partials after it)."""
    (group,) = [p for p in _jammed(k) if any(isinstance(o, s.LoadOp) and s.buf_type(o.buf).role.data == "in"
                                             for o in p.walk())]
    return group


@pytest.mark.parametrize(("name", "tensors"), [("col_sum", 1), ("col_stats", 2)])
def test_loops_that_only_read_rows_run_read_streams_rows(built, name, tensors):
    """A row loop that writes no caller tensor runs READ_STREAMS // (tensors a row reads) rows an
    iteration (8 of col_sum's x, 4 of col_stats' g and x); after combine-accums the jammed loop
    reads each accumulator element once, adds every row's term in row order, and writes it once."""
    k = _built_staged(built, name, "jam-rows")
    group = _reads_caller(k)
    step = next(o for o in group.body.block.ops if isinstance(o, ir.MulOp) and o.lhs is group.iv)
    rows = jam_rows.READ_STREAMS // tensors
    assert ir.constant_int(step.rhs) == rows
    second = group.body.block.last_op
    assert len([o for o in second.body.block.ops if isinstance(o, s.AccumOp)]) == rows * tensors
    k = _built_staged(built, name, "combine-accums")
    group = _reads_caller(k)
    second = group.body.block.last_op
    body = list(second.body.block.ops)
    assert not any(isinstance(o, s.AccumOp) for o in body)
    accs = {o.buf for o in body if isinstance(o, s.StoreOp)}
    assert len(accs) == tensors
    for acc in accs:
        (load,) = [o for o in body if isinstance(o, s.LoadOp) and o.buf is acc]
        (store,) = [o for o in body if isinstance(o, s.StoreOp) and o.buf is acc]
        chain, v = [], store.value
        while v is not load.result:  # (back from the store: one add per row, the first row's first)
            assert isinstance(v.owner, ir.AddOp)
            chain.append(v.owner)
            v = v.owner.lhs
        assert len(chain) == rows and body.index(load) < body.index(chain[-1])


def test_parallel_rows_reading_column_vectors_go_two_at_a_time(built):
    """scale_cols: its parallel row loop, whose body is one column loop reading the column
    vectors m and r, becomes a parallel loop over groups of ROW_FACTOR rows (one column loop
    computing each row's elements in turn) and the original loop for the rows left over; twice
    (no column vector) keeps its row loop."""
    k = _built_staged(built, "scale_cols", "jam-rows")
    (group,) = _jammed(k)
    assert group.kind.data == "parallel" and isinstance(group.parent_op(), s.KernelOp)
    step = next(o for o in group.body.block.ops if isinstance(o, ir.MulOp) and o.lhs is group.iv)
    assert ir.constant_int(step.rhs) == jam_rows.ROW_FACTOR
    cols = group.body.block.last_op
    stores = [o for o in cols.body.block.ops if isinstance(o, s.StoreOp)]
    assert len(stores) == jam_rows.ROW_FACTOR and len({st.idx[0] for st in stores}) == jam_rows.ROW_FACTOR
    rest = group.next_op
    assert isinstance(rest, s.ForOp) and rest.kind.data == "parallel"
    assert _jammed(_built_staged(built, "twice", "jam-rows")) == []


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 33])
def test_jammed_parallel_rows_match_numpy_and_the_unjammed_build(built, unjammed, rng, dt, n):
    """Odd and even row counts (the last row in the loop left over), rows further apart than
    their length: numpy's values rounded once, bitwise the build without the pass."""
    d = 37 if n % 2 else 64
    x = rng.standard_normal((n, d + 5)).astype(dt)[:, 2:d + 2]
    m = rng.standard_normal(d).astype(np.float32)
    r = rng.standard_normal(d).astype(np.float32)
    got = runtime.call("scale_cols", lib=built["lib"], x=x, m=m, r=r)["y"]
    off = runtime.call("scale_cols", lib=unjammed, x=x, m=m, r=r)["y"]
    want = ((x.astype(np.float32) - m) * r).astype(dt)
    assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))
    assert np.array_equal(np.asarray(got).view(np.uint8), np.asarray(off).view(np.uint8))


def test_combine_accums_leaves_lanes_single_sums_and_dtype_variables_alone(built):
    """combine-accums leaves alone: norm_cols' jammed column sums (its accumulators of the dtype
    variable T: a bf16 instance's sum may be rounded to its storage at each addition) and its
    row sums (reduce loops over scalars: map-cpu's lanes); col_sum's row left over after the
    groups of 8 (one sum into each element)."""
    k = _built_staged(built, "norm_cols", "combine-accums")
    (pair,) = [p for p in _jammed(k) if any(isinstance(o, s.ForOp) and o.kind.data == "reduce" for o in p.walk())]
    accs = [o for o in pair.body.block.last_op.body.block.ops if isinstance(o, s.AccumOp)]
    assert len(accs) == 4 and all(s.buf_type(a.buf).dtype == "T" for a in accs)
    reduces = [o for o in k.walk() if isinstance(o, s.ForOp) and o.kind.data == "reduce"]
    assert reduces and all(any(isinstance(a, s.AccumOp) for a in r.body.block.ops) for r in reduces)
    rest = _reads_caller(_built_staged(built, "col_sum", "combine-accums")).next_op
    assert len([o for o in rest.body.block.last_op.body.block.ops if isinstance(o, s.AccumOp)]) == 1


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 9, 31, 32, 33, 41, 65])
def test_column_sums_match_numpy_and_the_unjammed_build(built, unjammed, rng, dt, n):
    """Row counts around the jammed groups (4 and 8 rows) and the 32-row partials: the float64
    sums within f32's margin, and bitwise the build without jam-rows (so without combined sums:
    one sum a loop)."""
    d = 37 if n % 2 else 64
    g = rng.standard_normal((n, d)).astype(dt)
    x = rng.standard_normal((n, d)).astype(dt)
    g64, x64 = g.astype(np.float64), x.astype(np.float64)
    for name, args, want in (("col_sum", {"x": x}, {"s": x64.sum(0)}),
                             ("col_stats", {"g": g, "x": x}, {"a": g64.sum(0), "b": (g64 * x64).sum(0)})):
        got = runtime.call(name, lib=built["lib"], **args)
        off = runtime.call(name, lib=unjammed, **args)
        for out, ref in want.items():
            have = np.asarray(got[out]).astype(np.float64)
            assert np.abs(have - ref).max() <= 1e-5 * (np.abs(ref).max() + 1) * n, (name, out)
            assert np.array_equal(np.asarray(got[out]).view(np.uint8), np.asarray(off[out]).view(np.uint8)), (name, out)


@pytest.mark.parametrize("dt", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("n", ROWS)
def test_results_match_numpy_and_the_unjammed_build(built, unjammed, rng, dt, n):
    """Row counts around the 32-row groups and the pairs (odd groups leave a row to the
    original loop): the float64 reference within the dtype's margin, and bitwise the build
    without the pass, out of place and in place (dx over g)."""
    d = 37 if n % 2 else 64
    g = rng.standard_normal((n, d)).astype(dt)
    x = rng.standard_normal((n, d)).astype(dt)
    got = runtime.call("norm_cols", lib=built["lib"], g=g, x=x)
    off = runtime.call("norm_cols", lib=unjammed, g=g, x=x)
    tol = 1e-4 if dt == np.float32 else 2e-2
    for name, want in zip(("dx", "dw", "db"), _reference(g, x), strict=True):
        have = np.asarray(got[name]).astype(np.float64)
        assert np.abs(have - want).max() <= tol * (np.abs(want).max() + 1), name
        assert np.array_equal(np.asarray(got[name]).view(np.uint8), np.asarray(off[name]).view(np.uint8)), name
    inplace = g.copy()
    out = runtime.call("norm_cols", lib=built["lib"], g=inplace, x=x, dx=inplace)
    assert np.array_equal(inplace.view(np.uint8), np.asarray(got["dx"]).view(np.uint8))
    assert np.array_equal(np.asarray(out["dw"]).view(np.uint8), np.asarray(got["dw"]).view(np.uint8))


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    rng = np.random.default_rng(0)
    for dt in (np.float32, ml_dtypes.bfloat16):
        for n, d in ((1, 1), (2, 3), (3, 17), (33, 40), (66, 129)):
            g = rng.standard_normal((n, d)).astype(dt)
            x = rng.standard_normal((n, d)).astype(dt)
            runtime.call("norm_cols", lib=lib, g=g, x=x)
            runtime.call("norm_cols", lib=lib, g=g, x=x, dx=g)
            g2 = rng.standard_normal((2 * n, d)).astype(dt)  # (rows apart: the next-row prefetch's
            runtime.call("norm_cols", lib=lib, g=g2[::2], x=x)  # row clamped to the tensor's rows)
            runtime.call("col_sum", lib=lib, x=g2[::2])
            runtime.call("col_stats", lib=lib, g=g, x=x)
            runtime.call("scale_cols", lib=lib, x=g2[::2], m=x[0].astype(np.float32), r=g[0].astype(np.float32))
    print("done")
""")


def test_jammed_rows_are_clean_under_asan_and_ubsan(built):
    """Odd and even row counts, in place and not, rows apart, under AddressSanitizer and
    UndefinedBehaviorSanitizer."""
    assert_clean_under_sanitizers(built, SANITIZED)
