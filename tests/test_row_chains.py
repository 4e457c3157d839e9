"""Row reductions read by other row reductions of the same rows (a softmax's max, read by its sum
of exps; a LayerNorm's mean, read by its variance): row groups take the whole chain as row-local
values (planned consumers first), so one parallel loop reads each row once, where the first
reduction had its own pass over every row before (LayerNorm forward 8192x4096 f32 10.2 -> 8.0 ms,
group statistics 9.7 -> 5.9, a softmax 19.2 -> 17.2 on the Zen 5 VM's 2 threads). And a costly
elementwise value read by more than one loop nest of the row (a softmax's exps, by their sum and
by the output) is computed once per row into a row of scratch (``kept_rows``). Against PyTorch
(float64 and same-dtype) and the oracle, rows of NaN and infinities, lengths around the lanes,
strided; the same bits as the unfused lowering (each reduction its own nest, every value
computed where it is read) and on 1 and 3 threads; clean under ASan/UBSan."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from opgen import oracle, runtime
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower import to_loops
from opgen.lower.row_groups import RowGroupLowering
from opgen.passes import pipeline
from tests.ops_dirs import LOWER_FUNC, built_ops, built_unfused, no_fusion, top_loops
from tests.reference import assert_close_policy, rounded, t64, tt
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

CHAIN_OPS = '''
"""Row reductions read by other row reductions of the same rows."""
from opgen.dsl import *

N, D, B, G, C = dims("N D B G C")
T = dtype_var("T", f32, bf16)


@op
def softmax_rows(x: Tensor[T, N, D], *, y: Output[T, N, D]):
    """The max, then the sum of exps about it, then the output."""
    xf = cast(x, f32)
    e = exp(xf - max(xf, axis=-1, keepdims=True))
    return {"y": e / sum(e, axis=-1, keepdims=True)}


@op
def layer_norm_rows(x: Tensor[T, N, D], w: Tensor[T, D], eps: float, *, y: Output[T, N, D],
                    rstd: Output[f32, N]):
    """LayerNorm forward: the mean, then the variance about it, then the output."""
    xf = cast(x, f32)
    xc = xf - mean(xf, axis=-1, keepdims=True)
    r = rsqrt(mean(xc * xc, axis=-1) + eps)
    return {"y": xc * r[:, None] * cast(w, f32)[None, :], "rstd": r}


@op
def group_stats(x: Tensor[T, B, G, C], *, mu: Output[f32, B, G], var: Output[f32, B, G]):
    """Each group's mean and the variance about it (both outputs)."""
    xf = cast(x, f32)
    m = mean(xf, axis=-1)
    d = xf - m[:, :, None]
    return {"mu": m, "var": mean(d * d, axis=-1)}


@op
def layer_norm_grad(grad_y: Tensor[T, N, D], x: Tensor[T, N, D], w: Tensor[T, D], eps: float, *,
                    grad_x: Output[T, N, D], grad_w: Output[T, D], grad_b: Output[T, D]):
    """LayerNorm backward recomputing its statistics; the weight's and bias's gradients summed
    over the rows (column sums in the same row loop)."""
    mu = mean(x, axis=-1, keepdims=True)
    xc = x - mu
    rstd = rsqrt(mean(xc * xc, axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    g = grad_y * w
    gx = rstd * (g - mean(g, axis=-1, keepdims=True) - xhat * mean(g * xhat, axis=-1, keepdims=True))
    return {"grad_x": gx, "grad_w": sum(grad_y * xhat, axis=0), "grad_b": sum(grad_y, axis=0)}


@op
def ce_grad(grad_loss: Tensor[f32], logits: Tensor[T, N, D], target: Tensor[i64, N], *,
            dlogits: Output[T, N, D]):
    """Mean cross-entropy backward: the exps read by their sum and by the output."""
    lf = cast(logits, f32)
    e = exp(lf - max(lf, axis=1, keepdims=True))
    p = e / sum(e, axis=1, keepdims=True)
    onehot = where(iota((N, D), axis=1) == target[:, None], 1.0, 0.0)
    return {"dlogits": grad_loss * (p - onehot) / cast(size(N), f32)}


@op
def softmax_moments(x: Tensor[T, N, D], *, y: Output[T, N, D], mx: Output[f32, N]):
    """The softmax and the mean of x under it: the exps read by two sums and by the output."""
    xf = cast(x, f32)
    e = exp(xf - max(xf, axis=-1, keepdims=True))
    s = sum(e, axis=-1)
    return {"y": e / s[:, None], "mx": sum(e * xf, axis=-1) / s}
'''

EPS = 1e-5
#: row lengths around the CPU's lanes (16 f32, 32 bf16; a row max's 64 and 128) and longer rows
LENGTHS = (1, 15, 16, 17, 33, 100, 129, 300)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("chains"), "opgen_test_chains", {"chain_ops.py": CHAIN_OPS}) as b:
        yield b


@pytest.fixture(scope="module")
def unfused(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """The same ops built with lower-to-loops' unfused lowering: each reduction its own nest."""
    with built_unfused(tmp_path_factory.mktemp("unfused"), "opgen_test_chains_unfused",
                       {"chain_ops.py": CHAIN_OPS}) as b:
        yield b


def _passes_over(built: dict[str, object], name: str, arg: str, lower: object = LOWER_FUNC) -> int:
    """How many of op ``name``'s outermost loops (after the CPU pipeline, lowered by ``lower``:
    set here, as the unfused fixture's patch stays while that fixture lives) read caller tensor
    ``arg``."""
    mp = pytest.MonkeyPatch()
    mp.setattr(to_loops, "lower_func", lower)
    try:
        loops = top_loops(built, name)
    finally:
        mp.undo()
    k = loops[0].parent_op()
    names = k.param_names  # type: ignore[union-attr]
    return sum(any(isinstance(o, s.LoadOp) and names.get(o.buf) == arg for o in loop.walk()) for loop in loops)


def _lowered(built: dict[str, object], name: str) -> s.KernelOp:
    """Op ``name``'s kernel after lower-to-loops (the CPU pipeline's, unpatched)."""
    mp = pytest.MonkeyPatch()
    mp.setattr(to_loops, "lower_func", LOWER_FUNC)
    try:
        m = built["ops"][name].module()  # type: ignore[index]
        pipeline.run(m, "cpu", until="lower-to-loops")
    finally:
        mp.undo()
    return next(x for x in m.walk() if isinstance(x, s.KernelOp))


def test_each_row_is_read_in_one_pass(built):
    """One outermost loop reads x (and grad_y) in each op: the chain's first reduction is
    computed in the row loop, not in a pass of its own (the unfused lowering has one per
    reduction: what the chains were before)."""
    for name, args in (("softmax_rows", ("x",)), ("layer_norm_rows", ("x",)), ("group_stats", ("x",)),
                       ("layer_norm_grad", ("x", "grad_y"))):
        for arg in args:
            assert _passes_over(built, name, arg) == 1, (name, arg)
        assert _passes_over(built, name, "x", no_fusion) >= 2, name
    (row,) = [o for o in _lowered(built, "softmax_rows").body.block.ops if isinstance(o, s.ForOp)]
    kinds = [a.kind.data for a in row.walk() if isinstance(a, s.AccumOp)]
    assert kinds == ["max", "sum"], kinds  # (the max first, then the sum reading it, in one row)


def test_costly_values_read_by_several_nests_are_kept_per_row(built):
    """The exps of a softmax, of cross-entropy backward and of the softmax's moments: computed
    once per row (one exp in the kernel) into a row of local scratch, which their sums and the
    output load; LayerNorm's values (no costly op) and group statistics (one nest) keep none."""
    for name in ("softmax_rows", "ce_grad", "softmax_moments"):
        k = _lowered(built, name)
        assert sum(isinstance(o, ir.ExpOp) for o in k.walk()) == 1, name
        (row,) = [o for o in k.body.block.ops if isinstance(o, s.ForOp)]
        scratch = [a.result for a in row.walk() if isinstance(a, s.AllocOp) and s.buf_type(a.result).rank == 1]
        assert len(scratch) == 1 and s.buf_type(scratch[0]).role.data == "local", name
        stores = [o for o in row.walk() if isinstance(o, s.StoreOp) and o.buf is scratch[0]]
        loads = [o for o in row.walk() if isinstance(o, s.LoadOp) and o.buf is scratch[0]]
        assert len(stores) == 1 and len(loads) == (3 if name == "softmax_moments" else 2), name
    for name in ("softmax_rows", "ce_grad", "softmax_moments", "layer_norm_rows", "layer_norm_grad", "group_stats"):
        kept = _kept(built, name)
        if name.startswith(("softmax", "ce")):
            assert [type(v.owner) for v in kept] == [ir.ExpOp], name
        else:
            assert kept == [], name


def _kept(built: dict[str, object], name: str) -> list[object]:
    """The elementwise values row groups plan to keep in rows of scratch for op ``name``."""
    m = built["ops"][name].module()  # type: ignore[index]
    pipeline.run(m, "cpu", until="convert-at-boundary")
    f = next(x for x in m.walk() if isinstance(x, ir.FuncOp))
    low = RowGroupLowering(f, set(f.aliased_outputs))
    low.row_scratch = True
    return [v for g in low.plan() for v in g.rowlocal if isinstance(v.owner, ir.ElementwiseOp)]


def _special_rows(x: np.ndarray) -> np.ndarray:
    """``x`` with rows holding NaN, +inf, -inf, all -inf, and a row of huge values (where it has
    the rows and columns)."""
    x = x.copy()
    if x.shape[0] >= 6 and x.shape[1] >= 2:
        x[1, 1] = np.nan
        x[2, 0] = np.inf
        x[3, -1] = -np.inf
        x[4, :] = -np.inf
        x[5, :] *= 1e30
    return x


def _softmax_refs(x: np.ndarray, T: str) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.softmax(t64(x), -1), torch.softmax(tt(x, T).float(), -1).to(tt(x, T).dtype)


def _ln_refs(x: np.ndarray, w: np.ndarray, T: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    out = {}
    for key, xt, wt in (("f64", t64(x), t64(w)), ("same", tt(x, T).float(), tt(w, T).float())):
        mu = xt.mean(-1)
        r = torch.rsqrt(((xt - mu[:, None]) ** 2).mean(-1) + EPS)
        out[key] = ((xt - mu[:, None]) * r[:, None] * wt, r)
    dt = tt(x, T).dtype
    return {"y": (out["f64"][0], out["same"][0].to(dt)), "rstd": (out["f64"][1], out["same"][1])}


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_forward_chains_against_pytorch(built, rng, T, strided):
    """Softmax and LayerNorm forward (rows of NaN and infinities too) and group statistics,
    every row length around the lanes, contiguous and strided (every other element), against
    PyTorch float64 (same-dtype PyTorch setting the margin) and the oracle."""
    lib, ops = built["lib"], built["ops"]
    for n in (0, 1, 7, 40):
        for d in LENGTHS:
            what = f"{T} N={n} D={d} strided={strided}"
            full = rounded(rng.standard_normal((n, 2 * d)) * 3, T)
            x = full[:, ::2] if strided else np.ascontiguousarray(full[:, :d])
            xs = _special_rows(x)
            got = runtime.call("softmax_rows", lib=lib, x=xs)["y"]
            ref, same = _softmax_refs(xs, T)
            assert_close_policy(got, ref, same, T, "softmax " + what)
            orc = oracle.run(ops["softmax_rows"], x=xs.copy())["y"]  # type: ignore[index]
            assert_close_policy(orc, ref, same, T, "oracle softmax " + what)
            tg = rng.integers(0, d, n)
            gl = np.array(0.75, np.float32)
            got = runtime.call("ce_grad", lib=lib, grad_loss=gl, logits=xs, target=tg)["dlogits"]
            onehot = torch.nn.functional.one_hot(torch.from_numpy(tg), d)
            ref, same = ((s_ - onehot) * 0.75 / max(n, 1) for s_ in _softmax_refs(xs, T))
            assert_close_policy(got, ref, same.to(tt(xs, T).dtype), T, "cross-entropy backward " + what)
            orc = oracle.run(ops["ce_grad"], grad_loss=gl, logits=xs.copy(), target=tg)["dlogits"]  # type: ignore[index]
            assert_close_policy(orc, ref, same.to(tt(xs, T).dtype), T, "oracle cross-entropy backward " + what)
            got = runtime.call("softmax_moments", lib=lib, x=xs)
            p64, p_same = _softmax_refs(xs, T)
            mx = ((p64 * t64(xs)).sum(-1), (torch.softmax(tt(xs, T).float(), -1) * tt(xs, T).float()).sum(-1))
            assert_close_policy(got["y"], p64, p_same, T, "softmax of the moments " + what)
            assert_close_policy(got["mx"], *mx, "f32", "mean under the softmax " + what)
            w = rounded(rng.standard_normal(d), T)
            got = runtime.call("layer_norm_rows", lib=lib, x=x, w=w, eps=EPS)
            orc = oracle.run(ops["layer_norm_rows"], x=x.copy(), w=w, eps=EPS)  # type: ignore[index]
            for k, (ref, same) in _ln_refs(x, w, T).items():
                dt = "f32" if k == "rstd" else T
                assert_close_policy(got[k], ref, same, dt, f"layer norm {k} " + what)
                assert_close_policy(orc[k], ref, same, dt, f"oracle layer norm {k} " + what)
    for b, g, c in ((1, 1, 1), (3, 5, 17), (2, 4, 70)):
        x = rounded(rng.standard_normal((b, g, c)) + 2, T)
        got = runtime.call("group_stats", lib=lib, x=x)
        var, mu = torch.var_mean(t64(x), -1, unbiased=False)
        var_s, mu_s = torch.var_mean(tt(x, T).float(), -1, unbiased=False)
        assert_close_policy(got["mu"], mu, mu_s, "f32", f"group mean {T} {(b, g, c)}")
        assert_close_policy(got["var"], var, var_s, "f32", f"group variance {T} {(b, g, c)}")


@pytest.mark.parametrize("T", ["f32", "bf16"])
def test_layer_norm_backward_against_autograd(built, rng, T):
    """LayerNorm backward recomputing its statistics, row counts around the column sums' chunks,
    against PyTorch float64 autograd (same-dtype PyTorch setting the margin) and the oracle."""
    lib, op = built["lib"], built["ops"]["layer_norm_grad"]  # type: ignore[index]
    for n, d in ((1, 1), (7, 17), (33, 40), (70, 100)):
        x = rounded(rng.standard_normal((n, d)) + 1, T)
        gy, w = rounded(rng.standard_normal((n, d)), T), rounded(rng.standard_normal(d), T)
        refs = {}
        for key, conv in (("f64", t64), ("same", lambda a, T=T: tt(a, T).float())):
            xt, wt, bt = conv(x).requires_grad_(), conv(w).requires_grad_(), torch.zeros(d, dtype=conv(w).dtype,
                                                                                          requires_grad=True)
            y = torch.nn.functional.layer_norm(xt, (d,), wt, bt, EPS)
            refs[key] = torch.autograd.grad(y, (xt, wt, bt), conv(gy))
        got = runtime.call("layer_norm_grad", lib=lib, grad_y=gy, x=x, w=w, eps=EPS)
        orc = oracle.run(op, grad_y=gy, x=x.copy(), w=w, eps=EPS)
        dt = tt(x, T).dtype
        for i, k in enumerate(("grad_x", "grad_w", "grad_b")):
            ref, same = refs["f64"][i], refs["same"][i].to(dt)
            assert_close_policy(got[k], ref, same, T, f"{k} {T} N={n} D={d}")
            assert_close_policy(orc[k], ref, same, T, f"oracle {k} {T} N={n} D={d}")


def test_the_same_bits_as_each_reduction_in_its_own_nest(built, unfused, rng):
    """The chains computed in one row loop give the bits of the unfused lowering (each
    reduction in its own nest: the same lanes, the same order), on 1 and 3 threads."""
    gomp = ctypes.CDLL("libgomp.so.1")
    team = gomp.omp_get_max_threads()
    for T in ("f32", "bf16"):
        x = _special_rows(rounded(rng.standard_normal((37, 700)), T))  # (rows of many lanes' strips)
        xf = rounded(rng.standard_normal((37, 70)), T)
        gy, w = rounded(rng.standard_normal((37, 70)), T), rounded(rng.standard_normal(70), T)
        calls = [("softmax_rows", {"x": x}), ("softmax_moments", {"x": x}),
                 ("ce_grad", {"grad_loss": np.array(0.5, np.float32), "logits": x, "target": rng.integers(0, 700, 37)}),
                 ("layer_norm_rows", {"x": xf, "w": w, "eps": EPS}),
                 ("group_stats", {"x": xf.reshape(37, 7, 10)}),
                 ("layer_norm_grad", {"grad_y": gy, "x": xf, "w": w, "eps": EPS})]
        for name, args in calls:
            want = runtime.call(name, lib=unfused["lib"], **args)
            for threads in (1, 3):
                gomp.omp_set_num_threads(threads)
                try:
                    got = runtime.call(name, lib=built["lib"], **args)
                finally:
                    gomp.omp_set_num_threads(team)
                for k, v in want.items():
                    assert got[k].tobytes() == v.tobytes(), (name, T, threads, k)


def test_row_maxima_run_four_vectors_of_lanes(built):
    """A row's max pass (softmax's, cross-entropy's) splits into EXTREMA_CHAINS times the lanes of
    a sum (cpu_map.lanes: 64 f32, 128 where it reads bf16: four vectors, four chains side by
    side), its sums keep 16 and 32; the lanes start from the accumulator (a sum's lane 0 only)."""
    import re

    from opgen.emit import cpu
    from opgen.lower.cpu_map import EXTREMA_CHAINS, LANES, lanes

    assert lanes([4], ["max"]) == lanes([4], ["min"]) == EXTREMA_CHAINS * LANES
    assert lanes([2, 4], ["max"]) == 2 * EXTREMA_CHAINS * LANES
    assert lanes([4], ["max", "sum"]) == lanes([4]) == LANES and lanes([2], ["sum"]) == 2 * LANES
    for name in ("softmax_rows", "ce_grad"):
        text = cpu.op_source(built["ops"][name])  # type: ignore[index]
        for T, factor in (("f32", 1), ("bf16", 2)):
            body = text[text.index(f"k_{name}_{T}_u("):]
            body = body[:body.index("return OPGEN_SUCCESS")]
            decl = dict(re.findall(r"float (lane\d+)\[(\d+)\];", body))
            inits = dict(re.findall(r"(lane\d+)\[l\] = (l \? 0 : )?", body))
            maxima = {n for n, z in inits.items() if not z}
            sums = {n for n, z in inits.items() if z}
            assert maxima and sums, (name, T)
            assert {int(decl[n]) for n in maxima} == {factor * EXTREMA_CHAINS * LANES}, (name, T)
            assert {int(decl[n]) for n in sums} == {factor * LANES}, (name, T)


def test_row_maxima_of_signed_zeros_nans_and_ties(built, rng):
    """Rows whose maximum is a tie of +0 and -0, a NaN in any lane (of the four vectors or the
    tail), or the last element: softmax and cross-entropy backward against PyTorch float64."""
    for T in ("f32", "bf16"):
        d = 2 * 128 + 37
        x = rounded(rng.standard_normal((8, d)) - 5, T)
        x[0] = -1.0
        x[0, ::3] = 0.0
        x[0, 1::3] = -0.0
        for r, c in ((1, 5), (2, 70), (3, 140), (4, d - 1)):
            x[r, c] = np.nan
        x[5, -1] = 40.0
        x[6, 63] = x[6, 64] = 7.0
        got = runtime.call("softmax_rows", lib=built["lib"], x=x)["y"]
        ref, same = _softmax_refs(x, T)
        assert_close_policy(got, ref, same, T, f"softmax {T}")
        tg = rng.integers(0, d, 8)
        got = runtime.call("ce_grad", lib=built["lib"], grad_loss=np.array(1.0, np.float32), logits=x,
                           target=tg)["dlogits"]
        onehot = torch.nn.functional.one_hot(torch.from_numpy(tg), d)
        ref, same = ((s_ - onehot) / 8 for s_ in _softmax_refs(x, T))
        assert_close_policy(got, ref, same.to(tt(x, T).dtype), T, f"cross-entropy backward {T}")


SANITIZED = """
import sys, numpy as np, ml_dtypes
from opgen import runtime
lib = runtime.load(sys.argv[1])
rng = np.random.default_rng(0)
for dt in (np.float32, ml_dtypes.bfloat16):
    for n in (0, 1, 7, 33):
        for d in (1, 15, 16, 17, 33, 100, 129):
            x = rng.standard_normal((n, 2 * d)).astype(dt)
            w = rng.standard_normal(d).astype(dt)
            runtime.call("softmax_rows", lib=lib, x=x[:, ::2])
            runtime.call("softmax_moments", lib=lib, x=np.ascontiguousarray(x[:, :d]))
            runtime.call("ce_grad", lib=lib, grad_loss=np.array(1.0, np.float32), logits=x[:, 1::2],
                         target=rng.integers(0, d, n))
            runtime.call("layer_norm_rows", lib=lib, x=np.ascontiguousarray(x[:, :d]), w=w, eps=1e-5)
            runtime.call("layer_norm_grad", lib=lib, grad_y=x[:, 1::2], x=x[:, ::2], w=w, eps=1e-5)
    runtime.call("group_stats", lib=lib, x=rng.standard_normal((3, 5, 17)).astype(dt))
print("done")
"""


def test_row_chains_are_clean_under_asan_and_ubsan(built):
    """The chains (empty and short rows, lengths around the lanes, strided) under ASan/UBSan."""
    assert_clean_under_sanitizers(built, SANITIZED)
