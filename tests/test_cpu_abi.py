"""The compiled CPU library (build/cpu/libopgen.so, or $OPGEN_LIB) through its plain C entry
points ``opgen_<op>``, against the numpy oracle:

1. every op x every dtype binding of its signature (embedding_backward: a representative subset of
   index dtypes x all float dtypes), then the edge cases: duplicate indices, padding_idx in range /
   negative / out of range, scale_grad_by_freq, empty tensors, non-contiguous, negative-stride,
   broadcast (stride 0) and non-coalescable batch views, two tables of different sizes, acc on/off,
   eps 0 / 1e-6, both FLCE modes with packed and bool masks, in-place rms_norm_backward, and sizes
   large enough for several threads; a few results straight against PyTorch float64;
2. bad input (SPEC §0): the exact status code and not a single byte written to any buffer;
   the workspace protocol (size query, too small, exact).

Tolerance: see tests/cpu_cases.py (one ulp of the storage dtype + f32 summation-order noise).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from opgen import registry, runtime
from opgen.binding import OpError
from tests.cpu_cases import (
    CODE,
    FLCE,
    NP,
    assert_c_close,
    bf16_products,
    c_call,
    check_against_oracle,
    eb_args,
    ebw_args,
    edb_args,
    filled,
    flce_args,
    floats,
    name_of,
    oracle_outputs,
    permuted_leading,
    reversed_rows,
    rms_args,
    root,
    row_strided,
    set_shape,
    snapshot,
    softmax_inputs,
)
from tests.reference import TORCH, assert_close_policy, f32_scalar, t64, tlong, tt

EB, EDB, EBW, RMS = ("embedding_backward", "embedding_dense_backward", "embedding_bw",
                     "rms_norm_backward")


def members(op: str, var: str) -> list[str]:
    return [str(m) for m in registry.get(op).signature.dtype_vars()[var].members]


def bindings(op: str, **subset: tuple[str, ...]) -> list[dict[str, str]]:
    """Every combination of the op's dtype-variable members, by variable name (a variable in
    ``subset`` is limited to those members, which must all be in the signature). The variable
    ``I`` is passed to the builders as ``IT``."""
    dvars = registry.get(op).signature.dtype_vars()
    cols = []
    for name in dvars:
        m = members(op, name)
        if name in subset:
            assert set(subset[name]) <= set(m), (name, subset[name], m)
            m = list(subset[name])
        cols.append(m)
    keys = ["IT" if k == "I" else k for k in dvars]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*cols)]


def binding_ids(b: dict[str, str]) -> str:
    return "-".join(b.values())


# =============================================================================== dtype bindings

EB_I = ("i8", "i32", "i64", "u8", "u64")


@pytest.mark.parametrize("b", bindings("embedding_backward", I=EB_I), ids=binding_ids)
def test_embedding_backward_bindings(rng, b):
    """(T, I): two tables (N1=7, N2=11), duplicates in both, acc on for table 1 and off (NaN)
    for table 2."""
    check_against_oracle("embedding_backward", eb_args(rng, **b))


@pytest.mark.parametrize("b", bindings("embedding_dense_backward"), ids=binding_ids)
def test_embedding_dense_backward_bindings(rng, b):
    """(T, IDX): rank-3 grad, padding_idx in range, scale_grad_by_freq; float indices carry
    fractions."""
    check_against_oracle("embedding_dense_backward", edb_args(rng, **b))


@pytest.mark.parametrize("b", bindings("embedding_bw"), ids=binding_ids)
def test_embedding_bw_bindings(rng, b):
    """(I, W, T): weight is all NaN (only its shape is used); out starts as a sentinel."""
    check_against_oracle("embedding_bw", ebw_args(rng, **b))


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("shape", [(6, 40), (2, 3, 40)])
@pytest.mark.parametrize("b", bindings("rms_norm_backward"), ids=binding_ids)
def test_rms_norm_backward_bindings(rng, b, shape, eps):
    check_against_oracle("rms_norm_backward", rms_args(rng, shape=shape, eps=eps, **b))


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("b", bindings(FLCE), ids=binding_ids)
def test_flce_bindings(rng, b, mode):
    """(T, M, TI): BT=70 (two row tiles), V=300 (two vocab tiles), packed (u8) or bool mask."""
    check_against_oracle(FLCE, flce_args(rng, mode=mode, **b))


# =============================================================================== embedding_backward


@pytest.mark.parametrize("acc", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("T", ["bf16", "f32", "f64"])
def test_eb_acc_flags(rng, T, acc):
    """acc=1 adds to the table; acc=0 overwrites it (its NaN contents must not leak)."""
    a = eb_args(rng, T, "i64", acc=acc, alpha=(0.5, -3.25))
    got = check_against_oracle("embedding_backward", a)
    for k, flag in (("dtable1", acc[0]), ("dtable2", acc[1])):
        if not flag:
            assert np.isfinite(got[k].astype(np.float64)).all(), k


@pytest.mark.parametrize("acc", [(False, False), (True, True)])
@pytest.mark.parametrize("T", ["f16", "f32"])
def test_eb_empty_n(rng, T, acc):
    """N = 0: acc=0 tables become zeros, acc=1 tables keep their contents."""
    a = eb_args(rng, T, "i32", N=0, acc=acc)
    got = check_against_oracle("embedding_backward", a)
    if not acc[0]:
        assert not got["dtable1"].astype(np.float64).any()


@pytest.mark.parametrize("T", ["bf16", "f64"])
def test_eb_empty_d(rng, T):
    check_against_oracle("embedding_backward", eb_args(rng, T, "u8", D=0))


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_eb_table2_variants(rng, T):
    """One table (i2, dtable2 absent); i2 without dtable2 (table 1 only); dtable2 without i2
    (alpha2 = 0: dtable2 must not be written)."""
    check_against_oracle("embedding_backward", eb_args(rng, T, "i64", table2=False))
    check_against_oracle("embedding_backward", eb_args(rng, T, "i64", i2=True, dtable2=False))
    a = eb_args(rng, T, "i64", i2=False, dtable2=True, acc=(True, True))
    assert "alpha2" not in a
    got = check_against_oracle("embedding_backward", a)
    assert "dtable2" in got  # passed through, and checked unchanged by check_against_oracle


@pytest.mark.parametrize(("N1", "N2"), [(1, 200), (200, 1), (3, 3)])
def test_eb_table_sizes(rng, N1, N2):
    check_against_oracle("embedding_backward", eb_args(rng, "f32", "i16", N=50, N1=N1, N2=N2))


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_eb_noncontiguous(rng, T):
    """dy with a wide row stride, strided and reversed index arrays, a table with a wide row
    stride and one stored bottom-up."""
    a = eb_args(rng, T, "i64", N=20, D=8, acc=(True, True))
    a["dy"] = row_strided(a["dy"], 5)
    a["i1"] = np.repeat(a["i1"], 3)[::3]
    a["i2"] = reversed_rows(a["i2"])
    a["dtable1"] = row_strided(a["dtable1"], 8)
    a["dtable2"] = reversed_rows(a["dtable2"])
    assert not any(a[k].flags.c_contiguous for k in ("dy", "i1", "i2", "dtable1", "dtable2"))
    check_against_oracle("embedding_backward", a)


@pytest.mark.parametrize("T", ["f16", "f32"])
def test_eb_broadcast_inputs(rng, T):
    """Stride-0 inputs: every row of dy is the same row; every i1 is the same index."""
    a = eb_args(rng, T, "u16", N=20, D=8)
    a["dy"] = np.broadcast_to(a["dy"][3], a["dy"].shape)
    a["i1"] = np.broadcast_to(a["i1"][:1], (20,))
    check_against_oracle("embedding_backward", a)


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_eb_large(rng, T):
    """V=50, N=4000, D=64: ~80 duplicates per row, several threads."""
    a = eb_args(rng, T, "i64", N=4000, D=64, N1=50, N2=37)
    a["i1"][::2] = 7  # a very hot row
    check_against_oracle("embedding_backward", a)


# =============================================================================== embedding_dense_backward

PADS = [3, 0, 10, -1, -7, 11, 50, 2**63, 2**64 - 1, 2**64 - 12]


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("pad", PADS)
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_edb_padding_and_scale(rng, T, pad, scale):
    """padding_idx in range (3, 0, V-1), negative, >= V, and huge uint64 values (read as int64:
    2**64-1 is -1, 2**64-12 is -12: no padding row)."""
    a = edb_args(rng, T, "i32", lead=(6, 5), V=11, padding_idx=pad, scale=scale)
    a["indices"][0, :3] = [0, 10, 3]
    got = check_against_oracle("embedding_dense_backward", a)
    if 0 <= pad < 11:
        assert not got["out"][pad].astype(np.float64).any(), "the padding row must stay zero"


@pytest.mark.parametrize("lead", [(17,), (3, 5), (2, 3, 4), (2, 1, 3, 2), (1, 1, 1, 1, 1, 1, 5)],
                         ids=lambda s: f"rank{len(s) + 1}")
@pytest.mark.parametrize("T", ["f16", "f32"])
def test_edb_grad_ranks(rng, T, lead):
    check_against_oracle("embedding_dense_backward", edb_args(rng, T, "i64", lead=lead))


@pytest.mark.parametrize("case", ["N=0", "B*0", "D=0", "V=0,N=0"])
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_edb_empty(rng, T, case):
    """Empty grads are valid: out is all zeros (it starts as the sentinel)."""
    if case == "N=0":
        a = edb_args(rng, T, "f16", lead=(0,))
    elif case == "B*0":
        a = edb_args(rng, T, "i8", lead=(3, 0))
    elif case == "D=0":
        a = edb_args(rng, T, "i64", D=0)
    else:
        a = edb_args(rng, T, "i32", lead=(0,), V=0)
        a["out"] = filled((0, 9), T)
    got = check_against_oracle("embedding_dense_backward", a)
    assert not got["out"].astype(np.float64).any()


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_edb_noncontiguous(rng, T):
    """Batch dims over non-coalescable strides (a (B,S,D) view of (S,B,D) memory), a strided
    last dim (allowed here), broadcast indices, reversed axes and a transposed output."""
    a = edb_args(rng, T, "i64", lead=(5, 3), D=6, padding_idx=2)
    a["grad"] = permuted_leading(a["grad"])
    a["indices"] = permuted_leading(a["indices"])
    check_against_oracle("embedding_dense_backward", a)

    a = edb_args(rng, T, "f32", lead=(4, 3), D=6, scale=True)
    wide = filled((4, 3, 12), T)
    wide[:, :, ::2] = a["grad"]
    a["grad"] = wide[:, :, ::2]
    a["indices"] = np.broadcast_to(a["indices"][:1], (4, 3))
    a["out"] = filled((6, 11), T).T
    check_against_oracle("embedding_dense_backward", a)

    a = edb_args(rng, T, "u8", lead=(5, 3), D=6, scale=True)
    a["grad"] = a["grad"][::-1, ::-1]
    a["indices"] = a["indices"][::-1, ::-1]
    a["out"] = reversed_rows(a["out"])
    check_against_oracle("embedding_dense_backward", a)


def test_edb_unit_axes_with_odd_strides(rng):
    """Unit leading axes whose strides are arbitrary (they never move): still one row stride."""
    a = edb_args(rng, "f32", "i64", lead=(1, 6, 1, 2), D=5)
    g = a["grad"]
    a["grad"] = np.lib.stride_tricks.as_strided(g, g.shape, (999 * 4, g.strides[1], 0, *g.strides[3:]))
    check_against_oracle("embedding_dense_backward", a)


def test_edb_float_indices_truncate_toward_zero(rng):
    """-0.75 truncates to 0 (valid), 10.9 to 10, 3.5 to 3 (the padding row)."""
    a = edb_args(rng, "f32", "f32", lead=(6,), V=11, padding_idx=3)
    a["indices"][:] = [-0.75, 10.9, 3.5, 0.25, 10.0, 2.999]
    got = check_against_oracle("embedding_dense_backward", a)
    assert got["out"][0].astype(np.float64).any() and not got["out"][3].astype(np.float64).any()


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_edb_large(rng, T):
    check_against_oracle("embedding_dense_backward",
                         edb_args(rng, T, "i64", lead=(40, 100), D=64, V=50, padding_idx=7))


# =============================================================================== embedding_bw


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_ebw_empty(rng, T):
    got = check_against_oracle("embedding_bw", ebw_args(rng, "u32", "f32", T, N=0))
    assert not got["out"].astype(np.float64).any()
    check_against_oracle("embedding_bw", ebw_args(rng, "i32", "bf16", T, D=0))


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_ebw_noncontiguous(rng, T):
    a = ebw_args(rng, "i64", "f64", T, N=12, D=5)
    tall = filled((24, 5), T)
    tall[::2] = a["grad"]
    a["grad"] = tall[::2]
    a["indices"] = reversed_rows(a["indices"])
    a["weight"] = np.broadcast_to(np.zeros(5), (9, 5))
    a["out"] = filled((5, 9), T).T
    check_against_oracle("embedding_bw", a)


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_ebw_large(rng, T):
    check_against_oracle("embedding_bw", ebw_args(rng, "u32", "f32", T, N=4000, D=64, V=50))


# =============================================================================== rms_norm_backward


@pytest.mark.parametrize("shape", [(0, 8), (2, 0, 8), (0, 3, 8), (3, 0)])
@pytest.mark.parametrize("T", ["f16", "bf16", "f32"])
def test_rms_empty(rng, T, shape):
    """No rows: grad_w is the empty sum, zeros (it starts as the sentinel)."""
    got = check_against_oracle("rms_norm_backward", rms_args(rng, T, shape))
    assert not got["grad_w"].astype(np.float64).any()


@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_rms_noncontiguous(rng, T):
    """(B,S,D) views of (S,B,D) memory for x and grad_x, reversed grad_y rows, strided w and
    grad_w."""
    a = rms_args(rng, T, (4, 6, 8))
    a["x"] = permuted_leading(a["x"])
    a["grad_y"] = reversed_rows(a["grad_y"])
    a["grad_x"] = filled((6, 4, 8), T).swapaxes(0, 1)
    a["w"] = np.repeat(a["w"], 3)[::3]
    a["grad_w"] = filled(16, T)[::2]
    check_against_oracle("rms_norm_backward", a)
    a = rms_args(rng, T, (5, 8))
    a["x"] = row_strided(a["x"], 4)
    a["grad_w"] = reversed_rows(a["grad_w"])
    a["w"] = np.broadcast_to(a["w"][:1], (8,))
    check_against_oracle("rms_norm_backward", a)


@pytest.mark.parametrize("layout", ["2d", "3d", "permuted", "large"])
@pytest.mark.parametrize("T", ["f16", "bf16", "f32"])
def test_rms_grad_x_aliases_grad_y(rng, T, layout):
    """In place: the SAME array is grad_y and grad_x; the oracle runs on a copy."""
    shape = {"2d": (5, 40), "3d": (2, 3, 40), "permuted": (4, 6, 8), "large": (300, 256)}[layout]
    a = rms_args(rng, T, shape)
    if layout == "permuted":
        a["grad_y"] = permuted_leading(a["grad_y"])
    a["grad_x"] = a["grad_y"]
    check_against_oracle("rms_norm_backward", a, aliased=("grad_y",))


@pytest.mark.parametrize("T", ["f16", "f32"])
def test_rms_zero_row_eps0_is_nan(rng, T):
    a = rms_args(rng, T, (3, 8), eps=0.0)
    a["x"][1] = 0
    got = check_against_oracle("rms_norm_backward", a)
    assert np.isnan(got["grad_x"][1].astype(np.float64)).all()


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("T", ["bf16", "f32"])
def test_rms_large(rng, T, eps):
    check_against_oracle("rms_norm_backward", rms_args(rng, T, (512, 1024), eps))


# =============================================================================== FLCE


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("case", ["BT=0", "H=0"])
def test_flce_empty(rng, case, mode):
    a = flce_args(rng, "bf16", "u8", "i32", mode, **({"BT": 0} if case == "BT=0" else {"H": 0}))
    got = check_against_oracle(FLCE, a)
    if case == "BT=0":
        assert not got["weight_grad"].astype(np.float64).any()


@pytest.mark.parametrize("T", ["f32", "bf16"])
@pytest.mark.parametrize(("BT", "V"), [(5, 0), (0, 300), (40, 9 * 256 + 3)])
def test_linear_cross_entropy_grad_vocab_sizes(rng, T, BT, V):
    """The DSL-only cross-entropy gradient (one pass over at most 4 groups of column blocks):
    no vocabulary at all (no group; before, the group count divided by zero), no rows, and 10
    column blocks in groups of 3, 3, 3 and 1, against the oracle."""
    X, W = floats(rng, (BT, 16), T), floats(rng, (V, 16), T, 0.5)
    _, lmax, sexp = softmax_inputs(X, W)
    a = {"grad": floats(rng, BT, "f32"), "input": X, "weight": W, "no_target": rng.random(BT) < 0.3 if V else
         np.ones(BT, bool), "target": rng.integers(0, max(V, 1), BT).astype(np.int64), "logits_max": lmax,
         "sum_exp_logits": sexp}
    check_against_oracle("linear_cross_entropy_grad", a)


@pytest.mark.parametrize("mask", ["u8+3", "bool+5", "all_outside", "all_inside"])
@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
def test_flce_masks(rng, mode, mask):
    """Longer masks than needed (extra bytes / flags are ignored) and all-0 / all-1 masks."""
    M = "bool" if mask.startswith("bool") else "u8"
    extra = int(mask.split("+")[1]) if "+" in mask else 0
    p = {"all_outside": 1.0, "all_inside": 0.0}.get(mask, 0.4)
    check_against_oracle(FLCE, flce_args(rng, "f16", M, "i64", mode, mask_p=p, mask_extra=extra))


@pytest.mark.parametrize("V", [128, 256, 257])
def test_flce_vocab_tile_edges(rng, V):
    check_against_oracle(FLCE, flce_args(rng, "bf16", "u8", "i32", "memory_saving", BT=65, V=V))


def test_flce_mask_bit_order(rng):
    """Only row 1 outside: byte 0b10 (LSB first); row 6 is inside."""
    a = flce_args(rng, "f16", "u8", "i32", "softmax", BT=8, mask_p=0.0)
    a["target_mask"][:] = [0b10]
    check_against_oracle(FLCE, a)


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
def test_flce_noncontiguous(rng, mode):
    """Transposed input / softmax / input_grad, strided weight, weight_grad, stats, mask and
    target."""
    a = flce_args(rng, "bf16", "u8", "i32", mode)
    a["input"] = np.ascontiguousarray(a["input"].T).T
    a["weight"] = np.repeat(a["weight"], 2, axis=0)[::2]
    if mode == "softmax":
        a["softmax"] = np.ascontiguousarray(a["softmax"].T).T
    else:
        a["logits_max"] = np.repeat(a["logits_max"], 2)[::2]
        a["sum_exp_logits"] = reversed_rows(a["sum_exp_logits"])
    a["grad"] = reversed_rows(a["grad"])
    a["target_mask"] = np.repeat(a["target_mask"], 3)[::3]
    a["masked_target"] = np.repeat(a["masked_target"], 2)[1::2]
    a["input_grad"] = filled((20, 70), "bf16").T
    a["weight_grad"] = filled((300, 40), "bf16")[:, ::2]
    check_against_oracle(FLCE, a)


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
def test_flce_targets_out_of_range_on_masked_rows(rng, mode):
    """A row whose target is outside this shard (mask bit set) may carry any masked_target
    (Megatron leaves garbage there): no -1, no error, no out-of-bounds access. Out-of-range
    targets on rows inside the shard are an index error (BAD below)."""
    a = flce_args(rng, "bf16", "bool", "i32", mode, mask_p=0.0)
    a["masked_target"][:8] = [300, -1, 1000, -5, 299, 0, 2**31 - 1, -(2**31)]
    a["target_mask"][:8] = [True, True, True, True, False, False, True, True]
    check_against_oracle(FLCE, a)


def test_flce_softmax_mode_ignores_stats(rng):
    a = flce_args(rng, "f16", "bool", "i32", "softmax")
    a["logits_max"] = np.full(70, np.nan, np.float32)
    a["sum_exp_logits"] = np.full(70, np.nan, np.float32)
    check_against_oracle(FLCE, a)


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("T", ["f16", "bf16"])
def test_flce_large(rng, T, mode):
    check_against_oracle(FLCE, flce_args(rng, T, "u8", "i64", mode, BT=200, H=64, V=600))


# =============================================================================== random layouts


def random_layout(rng, a: np.ndarray, last_contig: bool, output: bool, broadcast: bool = True) -> np.ndarray:
    """The values of ``a`` in a randomly chosen memory layout the op must accept (``broadcast``:
    may repeat its first row with a 0 stride)."""
    if a.ndim == 0 or a.size == 0:
        return a
    kinds = ["as_is", "reversed", "row_strided"]
    if a.ndim >= 3 and a.shape[0] > 1 and a.shape[1] > 1:
        kinds.append("permuted")
    if not last_contig:
        kinds.append("last_strided")
        if a.ndim == 2:
            kinds.append("transposed")
    if broadcast and not output and a.shape[0] > 1:
        kinds.append("broadcast")
    kind = kinds[rng.integers(len(kinds))]
    if kind == "reversed":
        return reversed_rows(a)
    if kind == "row_strided":
        return row_strided(a[:, None], 2)[:, 0] if a.ndim == 1 else row_strided(a, int(rng.integers(1, 5)))
    if kind == "permuted":
        return permuted_leading(a)
    if kind == "last_strided":
        wide = np.zeros((*a.shape[:-1], 2 * a.shape[-1]), a.dtype)
        wide[..., ::2] = a
        return wide[..., ::2]
    if kind == "transposed":
        return np.ascontiguousarray(a.T).T
    if kind == "broadcast":
        return np.broadcast_to(a[:1], a.shape)
    return a


def _random_case(rng, op):
    if op == EB:
        T, IT = rng.choice(members(EB, "T")), rng.choice(members(EB, "I"))
        t2 = bool(rng.integers(2))
        return eb_args(rng, T, IT, N=int(rng.integers(0, 300)), D=int(rng.integers(0, 70)),
                       N1=int(rng.integers(1, 60)), N2=int(rng.integers(1, 60)), table2=t2,
                       acc=(bool(rng.integers(2)), bool(rng.integers(2))),
                       alpha=(float(rng.standard_normal()), float(rng.standard_normal())))
    if op == EDB:
        lead = tuple(int(x) for x in rng.integers(0, 7, rng.integers(1, 4)))
        V = int(rng.integers(1, 30))
        return edb_args(rng, rng.choice(members(EDB, "T")), rng.choice(members(EDB, "IDX")), lead=lead,
                        D=int(rng.integers(0, 20)), V=V, padding_idx=int(rng.integers(-2, V + 2)),
                        scale=bool(rng.integers(2)))
    if op == EBW:
        return ebw_args(rng, rng.choice(members(EBW, "I")), rng.choice(members(EBW, "W")),
                        rng.choice(members(EBW, "T")), N=int(rng.integers(0, 300)), D=int(rng.integers(0, 70)),
                        V=int(rng.integers(1, 60)))
    if op == RMS:
        lead = tuple(int(x) for x in rng.integers(0, 9, rng.integers(1, 3)))
        return rms_args(rng, rng.choice(members(RMS, "T")), (*lead, int(rng.integers(2, 300))),
                        float(rng.choice([0.0, 1e-6, 1e-3])))
    return flce_args(rng, rng.choice(members(FLCE, "T")), rng.choice(members(FLCE, "M")),
                     rng.choice(members(FLCE, "TI")), rng.choice(["softmax", "memory_saving"]),
                     BT=int(rng.integers(0, 150)), H=int(rng.integers(1, 70)), V=int(rng.integers(128, 400)),
                     mask_p=float(rng.random()), mask_extra=int(rng.integers(0, 3)))


@pytest.mark.parametrize("op", [EB, EDB, EBW, RMS, FLCE])
def test_random_shapes_dtypes_and_layouts(rng, op):
    """100 random calls per op: sizes (0 included), dtype bindings, attributes, and a random
    memory layout for every tensor (reversed, row-strided, permuted batch axes, strided last
    dim / transposed where allowed, broadcast inputs). Not drawn, because the exact result is
    then ~0 by cancellation and only f32 noise is left to compare (relative to max|ref| that is
    no test): identical (broadcast) FLCE weight rows (dX = grad * w * (sum softmax - 1)) and
    rms_norm_backward with D = 1 (grad_x = 0 exactly for eps = 0)."""
    sig = registry.get(op).signature
    for it in range(100):
        a = _random_case(rng, op)
        for p in sig.params:
            v = a.get(p.name)
            if isinstance(v, np.ndarray):
                spec = p.spec
                a[p.name] = random_layout(rng, v, bool(getattr(spec, "last_contiguous", False)), p.is_output,
                                          broadcast=not (op == FLCE and p.name == "weight"))
        try:
            check_against_oracle(op, a)
        except AssertionError as e:
            layout = {k: (v.shape, v.strides, str(v.dtype)) for k, v in a.items() if isinstance(v, np.ndarray)}
            raise AssertionError(f"call {it}: {layout}\n{e}") from None


# =============================================================================== straight vs torch f64


@pytest.mark.parametrize("T", ["bf16", "f32", "f64"])
def test_eb_vs_torch(rng, T):
    a = eb_args(rng, T, "i64", acc=(True, False))
    t1_before = a["dtable1"].copy()
    out = runtime.call("embedding_backward", **a)
    for k, base64, base_t, idx, alpha in (
            ("dtable1", t64(t1_before), tt(t1_before, T), a["i1"], a["alpha1"]),
            ("dtable2", torch.zeros(11, 13, dtype=torch.float64), torch.zeros(11, 13, dtype=TORCH[T]),
             a["i2"], a["alpha2"])):
        ref = base64.index_add_(0, tlong(idx), t64(a["dy"]), alpha=f32_scalar(alpha))
        same = base_t.index_add_(0, tlong(idx), tt(a["dy"], T), alpha=f32_scalar(alpha))
        assert_close_policy(out[k], ref, same, T, k)


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("T", ["bf16", "f16", "f32"])
def test_edb_vs_torch(rng, T, scale):
    a = edb_args(rng, T, "i64", lead=(4, 6), D=7, V=11, padding_idx=5, scale=scale)
    a["grad"] = permuted_leading(a["grad"])
    a["indices"] = permuted_leading(a["indices"])
    out = runtime.call("embedding_dense_backward", **a)["out"]
    g = np.ascontiguousarray(a["grad"])
    idx = tlong(np.ascontiguousarray(a["indices"]))
    ref = torch.ops.aten.embedding_dense_backward(t64(g), idx, 11, 5, scale)
    same = torch.ops.aten.embedding_dense_backward(tt(g, T), idx, 11, 5, scale)
    assert_close_policy(out, ref, same, T, "out")


def _torch_rms(gy, x, w, eps, T):
    xt = tt(np.ascontiguousarray(x), T, requires_grad=True)
    wt = tt(np.ascontiguousarray(w), T, requires_grad=True)
    y = torch.nn.functional.rms_norm(xt, (x.shape[-1],), wt, eps=f32_scalar(eps))
    y.backward(tt(np.ascontiguousarray(gy), T))
    return xt.grad, wt.grad


@pytest.mark.parametrize("eps", [0.0, 1e-6])
@pytest.mark.parametrize("T", ["bf16", "f16", "f32"])
def test_rms_vs_torch(rng, T, eps):
    a = rms_args(rng, T, (3, 20, 64), eps)
    gy, x, w = a["grad_y"].copy(), a["x"], a["w"]
    a["grad_x"] = a["grad_y"]  # in place, as in a real training step
    out = runtime.call("rms_norm_backward", **a)
    rx, rw = _torch_rms(gy, x, w, eps, "f64")
    sx, sw = _torch_rms(gy, x, w, eps, T)
    assert_close_policy(out["grad_x"], rx, sx, T, "grad_x")
    assert_close_policy(out["grad_w"], rw, sw, T, "grad_w")


@pytest.mark.parametrize("mode", ["softmax", "memory_saving"])
@pytest.mark.parametrize("T", ["bf16", "f16"])
def test_flce_vs_torch(rng, T, mode):
    """The SPEC formula in torch float64 (and PyTorch's own computation in T)."""
    from tests.test_fused_linear_cross_entropy_loss_grad import Case

    c = Case(rng, T, "i64", BT=70, H=24, V=300)
    a = c.args(mode, "packed")
    out = runtime.call(FLCE, **a)
    rx, rw = c.grads(mode, "f64")
    sx, sw = c.grads(mode, T)
    assert_close_policy(out["input_grad"], rx, sx, T, "input_grad")
    assert_close_policy(out["weight_grad"], rw, sw, T, "weight_grad")


# =============================================================================== bad input



def _t(**fields):
    """A tamper function setting descriptor fields (dtype code, data pointer)."""
    def f(desc, hold):
        for k, v in fields.items():
            setattr(desc, k, v)
    return f


def _shape(shape, strides=None):
    """A tamper function giving a descriptor a shape numpy cannot make (negative, stride 0)."""
    return lambda desc, hold: set_shape(desc, hold, shape, strides)


def _set(a, **kw):
    a.update(kw)
    return a


def _drop(a, *keys):
    return {k: v for k, v in a.items() if k not in keys}


def _idx(a, key, pos, value):
    a[key].reshape(-1)[pos] = value
    return a


def _same(a, out, inp):
    a[out] = a[inp]
    return a


def _overlap(a, out, inp, shift):
    """``a[out]`` starts ``shift`` rows before the end of ``a[inp]`` in one buffer."""
    x, y = a[inp], a[out]
    rows_in, rows_out = len(x), len(y)
    buf = filled((rows_in + rows_out, x.shape[-1]), name_of(x))
    buf[:rows_in] = x
    a[inp] = buf[:rows_in]
    a[out] = buf[rows_in - shift: rows_in - shift + rows_out]
    return a


def _last_strided(shape, T="f32"):
    return filled((*shape[:-1], 2 * shape[-1]), T)[..., ::2]


def _eb(r, **kw):
    kw.setdefault("acc", (True, True))
    return eb_args(r, "f32", "i64", **kw)


def _edb(r, **kw):
    return edb_args(r, "f32", "i64", **kw)


def _ebw(r, IT="u32", T="f32"):
    return ebw_args(r, IT, "f32", T)


def _rms(r, **kw):
    return rms_args(r, "f32", **kw)


def _fl(r, mode="softmax", **kw):
    return flce_args(r, "bf16", "u8", "i32", mode, **kw)


def _fl32(r):
    a = _fl(r)
    for k, shape in (("input", (70, 20)), ("weight", (300, 20)), ("input_grad", (70, 20)),
                     ("weight_grad", (300, 20))):
        a[k] = filled(shape, "f32")
    return a


def _rms64(r):
    return {k: v.astype(np.float64) if isinstance(v, np.ndarray) else v for k, v in _rms(r).items()}


def _weight_grad_in_softmax(r):
    a = _fl(r)
    a["weight_grad"] = a["softmax"].view(NP["bf16"]).reshape(-1)[1000:1000 + 300 * 20].reshape(300, 20)
    return a


def _edb_bool_v1(r):
    a = _idx(edb_args(r, "f16", "bool"), "indices", 0, True)
    return _set(a, num_weights=1, out=filled((1, 9), "f16"))


I64, F32 = np.int64, np.float32

# id -> (op, builder(rng) -> args, status, tamper or None)
BAD = {
    # --- index out of range (checked before any output is touched)
    "eb-i1-negative": (EB, lambda r: _idx(_eb(r), "i1", 3, -1), "index", None),
    "eb-i1-eq-N1": (EB, lambda r: _idx(_eb(r), "i1", 36, 7), "index", None),
    "eb-i2-eq-N2": (EB, lambda r: _idx(_eb(r), "i2", 5, 11), "index", None),
    "eb-i2-acc0": (EB, lambda r: _idx(_eb(r, acc=(False, False)), "i2", 0, 11), "index", None),
    "eb-u64-2^63+1": (EB, lambda r: _idx(eb_args(r, "f32", "u64"), "i1", 0, 2**63 + 1), "index", None),
    "eb-u64-max": (EB, lambda r: _idx(eb_args(r, "bf16", "u64"), "i2", 9, 2**64 - 1), "index", None),
    "eb-i8-min": (EB, lambda r: _idx(eb_args(r, "f16", "i8"), "i1", 0, -128), "index", None),
    "eb-u8-255": (EB, lambda r: _idx(eb_args(r, "f64", "u8"), "i1", 4, 255), "index", None),
    "eb-one-table": (EB, lambda r: _idx(_eb(r, table2=False), "i1", 2, 7), "index", None),
    "edb-negative": (EDB, lambda r: _idx(_edb(r), "indices", 7, -1), "index", None),
    "edb-eq-V": (EDB, lambda r: _idx(_edb(r), "indices", 14, 11), "index", None),
    "edb-eq-V-noscale": (EDB, lambda r: _idx(_edb(r, scale=False), "indices", 0, 11), "index", None),
    "edb-eq-V-is-padding": (EDB, lambda r: _idx(_edb(r, padding_idx=11), "indices", 0, 11), "index", None),
    "edb-f32-nan": (EDB, lambda r: _idx(edb_args(r, "bf16", "f32"), "indices", 0, np.nan), "index", None),
    "edb-f32-11.5": (EDB, lambda r: _idx(edb_args(r, "bf16", "f32"), "indices", 3, 11.5), "index", None),
    "edb-f16--1.5": (EDB, lambda r: _idx(edb_args(r, "f16", "f16"), "indices", 3, -1.5), "index", None),
    "edb-f64-inf": (EDB, lambda r: _idx(edb_args(r, "f32", "f64"), "indices", 1, np.inf), "index", None),
    "edb-f64-1e300": (EDB, lambda r: _idx(edb_args(r, "f32", "f64"), "indices", 1, 1e300), "index", None),
    "edb-i8-min": (EDB, lambda r: _idx(edb_args(r, "f16", "i8"), "indices", 0, -128), "index", None),
    "edb-u8-200": (EDB, lambda r: _idx(edb_args(r, "bf16", "u8"), "indices", 0, 200), "index", None),
    "edb-bool-V1": (EDB, _edb_bool_v1, "index", None),
    "ebw-u32-V": (EBW, lambda r: _idx(_ebw(r), "indices", 3, 9), "index", None),
    "ebw-u32-max": (EBW, lambda r: _idx(_ebw(r), "indices", 3, 2**32 - 1), "index", None),
    "ebw-i32-neg": (EBW, lambda r: _idx(_ebw(r, "i32", "bf16"), "indices", 0, -1), "index", None),
    "ebw-i64-2^40": (EBW, lambda r: _idx(_ebw(r, "i64", "bf16"), "indices", 28, 2**40), "index", None),
    # FLCE: a row inside the shard (mask bit 0) needs its target in [0, V = 300)
    **{f"flce-{mode}-target-{v}": (FLCE, lambda r, m=mode, v=v: _idx(_fl(r, m, mask_p=0.0), "masked_target", 5, v),
                                   "index", None)
       for mode in ("softmax", "memory_saving") for v in (300, -1, 2**31 - 1, -(2**31))},
    # --- dtypes: mismatch within a dtype variable; not a member; not a dtype at all
    "eb-dtable1-f16-vs-f32": (EB, lambda r: _set(_eb(r), dtable1=filled((7, 13), "f16")), "dtype", None),
    "eb-dtable2-f64-vs-f32": (EB, lambda r: _set(_eb(r), dtable2=filled((11, 13), "f64")), "dtype", None),
    "eb-i2-i32-vs-i64": (EB, lambda r: _set(_eb(r), i2=np.zeros(37, np.int32)), "dtype", None),
    "eb-dy-i32": (EB, lambda r: _set(_eb(r), dy=np.zeros((37, 13), np.int32)), "dtype", None),
    "eb-indices-bool": (EB, lambda r: _set(_eb(r), i1=np.zeros(37, bool), i2=np.zeros(37, bool)),
                        "dtype", None),
    "eb-i1-f32": (EB, lambda r: _set(_eb(r), i1=np.zeros(37, F32)), "dtype", None),
    "eb-dtype-code-99": (EB, _eb, "dtype", {"dy": _t(dtype=99)}),
    "eb-dtype-code-neg": (EB, _eb, "dtype", {"i1": _t(dtype=-1)}),
    "edb-out-f16-vs-f32": (EDB, lambda r: _set(_edb(r), out=filled((11, 9), "f16")), "dtype", None),
    "edb-indices-u32": (EDB, lambda r: _set(_edb(r), indices=np.zeros((3, 5), np.uint32)), "dtype", None),
    "edb-grad-f64": (EDB, lambda r: _set(_edb(r), grad=np.zeros((3, 5, 9)), out=filled((11, 9), "f64")),
                     "dtype", None),
    "ebw-out-bf16-vs-f32": (EBW, lambda r: _set(_ebw(r), out=filled((9, 10), "bf16")), "dtype", None),
    "ebw-indices-u16": (EBW, lambda r: _set(_ebw(r), indices=np.zeros(29, np.uint16)), "dtype", None),
    "ebw-grad-f16": (EBW, lambda r: _set(_ebw(r), grad=np.zeros((29, 10), np.float16),
                                         out=filled((9, 10), "f16")), "dtype", None),
    "ebw-weight-i32": (EBW, lambda r: _set(_ebw(r), weight=np.zeros((9, 10), np.int32)), "dtype", None),
    "rms-x-f16-vs-f32": (RMS, lambda r: _set(_rms(r), x=filled((6, 40), "f16")), "dtype", None),
    "rms-grad_w-bf16-vs-f32": (RMS, lambda r: _set(_rms(r), grad_w=filled(40, "bf16")), "dtype", None),
    "rms-all-f64": (RMS, _rms64, "dtype", None),
    "flce-grad-f16": (FLCE, lambda r: _set(_fl(r), grad=np.zeros(70, np.float16)), "dtype", None),
    "flce-weight-f16-vs-bf16": (FLCE, lambda r: _set(_fl(r), weight=filled((300, 20), "f16")),
                                "dtype", None),
    "flce-input_grad-f16-vs-bf16": (FLCE, lambda r: _set(_fl(r), input_grad=filled((70, 20), "f16")),
                                    "dtype", None),
    "flce-all-f32": (FLCE, _fl32, "dtype", None),
    "flce-target-i16": (FLCE, lambda r: _set(_fl(r), masked_target=np.zeros(70, np.int16)), "dtype", None),
    "flce-mask-i8": (FLCE, lambda r: _set(_fl(r), target_mask=np.zeros(9, np.int8)), "dtype", None),
    "flce-softmax-f16": (FLCE, lambda r: _set(_fl(r), softmax=np.zeros((70, 300), np.float16)),
                         "dtype", None),
    "flce-logits_max-f64": (FLCE, lambda r: _set(_fl(r, "memory_saving"), logits_max=np.zeros(70)),
                            "dtype", None),
    # --- shapes and ranks
    "eb-i1-short": (EB, lambda r: _set(_eb(r), i1=np.zeros(36, I64)), "shape", None),
    "eb-i2-long": (EB, lambda r: _set(_eb(r), i2=np.zeros(38, I64)), "shape", None),
    "eb-dtable1-D": (EB, lambda r: _set(_eb(r), dtable1=filled((7, 14), "f32")), "shape", None),
    "eb-dtable2-D": (EB, lambda r: _set(_eb(r), dtable2=filled((11, 12), "f32")), "shape", None),
    "eb-dy-rank3": (EB, lambda r: _set(_eb(r), dy=np.zeros((1, 37, 13), F32)), "shape", None),
    "eb-i1-rank2": (EB, lambda r: _set(_eb(r), i1=np.zeros((37, 1), I64)), "shape", None),
    "eb-dtable2-rank1": (EB, lambda r: _set(_eb(r), dtable2=filled(13, "f32")), "shape", None),
    "eb-negative-dim": (EB, _eb, "shape", {"dtable1": _shape((-7, 13), (13, 1))}),
    "edb-indices-batch-shape": (EDB, lambda r: _set(_edb(r), indices=np.zeros((5, 3), I64)), "shape", None),
    "edb-indices-flat": (EDB, lambda r: _set(_edb(r), indices=np.zeros(15, I64)), "shape", None),
    "edb-out-D": (EDB, lambda r: _set(_edb(r), out=filled((11, 8), "f32")), "shape", None),
    "edb-out-V": (EDB, lambda r: _set(_edb(r), num_weights=12), "shape", None),
    "edb-num_weights-negative": (EDB, lambda r: _set(_edb(r), num_weights=-1), "param", None),
    "edb-grad-rank1": (EDB, lambda r: _set(_edb(r), grad=np.zeros(9, F32), indices=np.zeros((), I64)),
                       "shape", None),
    "edb-grad-rank9": (EDB, lambda r: _set(_edb(r), grad=np.zeros((1,) * 8 + (9,), F32),
                                           indices=np.zeros((1,) * 8, I64)), "shape", None),
    "edb-indices-rank0": (EDB, lambda r: _set(_edb(r), indices=np.zeros((), I64)), "shape", None),
    "edb-out-rank3": (EDB, lambda r: _set(_edb(r), out=filled((1, 11, 9), "f32")), "shape", None),
    "ebw-weight-D": (EBW, lambda r: _set(_ebw(r), weight=filled((9, 11), "f32")), "shape", None),
    "ebw-out-V": (EBW, lambda r: _set(_ebw(r), out=filled((10, 10), "f32")), "shape", None),
    "ebw-indices-N": (EBW, lambda r: _set(_ebw(r), indices=np.zeros(27, np.uint32)), "shape", None),
    "ebw-grad-rank3": (EBW, lambda r: _set(_ebw(r), grad=np.zeros((1, 29, 10), F32)), "shape", None),
    "rms-x-batch-shape": (RMS, lambda r: _set(_rms(r), x=np.zeros((2, 3, 40), F32)), "shape", None),
    "rms-grad_x-rows": (RMS, lambda r: _set(_rms(r), grad_x=filled((7, 40), "f32")), "shape", None),
    "rms-w-D": (RMS, lambda r: _set(_rms(r), w=filled(41, "f32")), "shape", None),
    "rms-grad_w-D": (RMS, lambda r: _set(_rms(r), grad_w=filled(39, "f32")), "shape", None),
    "rms-w-rank2": (RMS, lambda r: _set(_rms(r), w=filled((1, 40), "f32")), "shape", None),
    "rms-x-rank1": (RMS, lambda r: _set(_rms(r), x=filled(40, "f32")), "shape", None),
    "flce-weight-H": (FLCE, lambda r: _set(_fl(r), weight=filled((300, 21), "bf16")), "shape", None),
    "flce-weight_grad-H": (FLCE, lambda r: _set(_fl(r), weight_grad=filled((300, 21), "bf16")),
                           "shape", None),
    "flce-target-BT": (FLCE, lambda r: _set(_fl(r), masked_target=np.zeros(69, np.int32)), "shape", None),
    "flce-softmax-V": (FLCE, lambda r: _set(_fl(r), softmax=np.zeros((70, 301), F32)), "shape", None),
    "flce-logits_max-BT": (FLCE, lambda r: _set(_fl(r, "memory_saving"), logits_max=np.zeros(69, F32)),
                           "shape", None),
    "flce-grad-rank2": (FLCE, lambda r: _set(_fl(r), grad=np.zeros((70, 1), F32)), "shape", None),
    "flce-mask-rank2": (FLCE, lambda r: _set(_fl(r), target_mask=np.zeros((9, 1), np.uint8)),
                        "shape", None),
    # --- FLCE's own rules
    "flce-label-smoothing": (FLCE, lambda r: _set(_fl(r), label_smoothing=0.1), "param", None),
    "flce-label-smoothing-ms": (FLCE, lambda r: _set(_fl(r, "memory_saving"), label_smoothing=-1e-3),
                                "param", None),
    "flce-V127": (FLCE, lambda r: _fl(r, V=127), "param", None),
    "flce-V127-ms": (FLCE, lambda r: _fl(r, "memory_saving", V=127), "param", None),
    "flce-no-logits_max": (FLCE, lambda r: _drop(_fl(r, "memory_saving"), "logits_max"), "null", None),
    "flce-no-sum_exp": (FLCE, lambda r: _drop(_fl(r, "memory_saving"), "sum_exp_logits"), "null", None),
    "flce-no-stats-no-softmax": (FLCE, lambda r: _drop(_fl(r, "memory_saving"), "logits_max",
                                                       "sum_exp_logits"), "null", None),
    "flce-packed-mask-short": (FLCE, lambda r: _set(_fl(r, BT=17), target_mask=np.zeros(2, np.uint8)),
                               "shape", None),
    "flce-packed-mask-empty": (FLCE, lambda r: _set(_fl(r, "memory_saving", BT=1),
                                                    target_mask=np.zeros(0, np.uint8)), "shape", None),
    "flce-bool-mask-short": (FLCE, lambda r: _set(flce_args(r, "f16", "bool", "i64", "softmax", BT=17),
                                                  target_mask=np.zeros(16, bool)), "shape", None),
    # --- embedding_backward's alpha2 rule
    "eb-alpha2-without-i2": (EB, lambda r: _set(_eb(r, table2=False), alpha2=1.0), "param", None),
    "eb-alpha2-without-i2-with-dtable2": (EB, lambda r: _set(_eb(r, i2=False), alpha2=-0.5), "param", None),
    "eb-tiny-alpha2-without-i2": (EB, lambda r: _set(_eb(r, i2=False), alpha2=1e-30), "param", None),
    # --- strides: last dim contiguous where the op says so; outputs never broadcast
    "eb-dy-last-strided": (EB, lambda r: _set(_eb(r), dy=_last_strided((37, 13))), "strides", None),
    "eb-dtable1-last-strided": (EB, lambda r: _set(_eb(r), dtable1=_last_strided((7, 13))), "strides", None),
    "eb-dtable2-fortran": (EB, lambda r: _set(_eb(r), dtable2=np.asfortranarray(filled((11, 13), "f32"))),
                           "strides", None),
    "rms-x-last-strided": (RMS, lambda r: _set(_rms(r), x=_last_strided((6, 40))), "strides", None),
    "rms-grad_y-last-strided": (RMS, lambda r: _set(_rms(r), grad_y=_last_strided((6, 40))), "strides", None),
    "rms-grad_x-last-strided": (RMS, lambda r: _set(_rms(r), grad_x=_last_strided((6, 40))), "strides", None),
    "rms-grad_x-last-reversed": (RMS, lambda r: _set(_rms(r), grad_x=filled((6, 40), "f32")[:, ::-1]),
                                 "strides", None),
    "eb-dtable1-broadcast": (EB, _eb, "strides", {"dtable1": _shape((7, 13), (0, 1))}),
    "edb-out-broadcast": (EDB, _edb, "strides", {"out": _shape((11, 9), (9, 0))}),
    "rms-grad_w-broadcast": (RMS, _rms, "strides", {"grad_w": _shape((40,), (0,))}),
    # --- outputs overlapping inputs or each other (only grad_x IS grad_y is allowed)
    "eb-dtable1-overlaps-dy": (EB, lambda r: _overlap(_eb(r), "dtable1", "dy", 1), "param", None),
    "eb-dtable2-overlaps-dtable1": (EB, lambda r: _overlap(_eb(r), "dtable2", "dtable1", 2), "param", None),
    "eb-dtable2-is-dtable1": (EB, lambda r: _same(_eb(r, N2=7), "dtable2", "dtable1"), "param", None),
    "edb-out-overlaps-grad": (EDB, lambda r: _overlap(_edb(r, lead=(15,)), "out", "grad", 1), "param", None),
    "ebw-out-overlaps-grad": (EBW, lambda r: _overlap(_ebw(r), "out", "grad", 3), "param", None),
    "ebw-out-is-weight": (EBW, lambda r: _same(_ebw(r), "weight", "out"), "param", None),
    "rms-grad_x-is-x": (RMS, lambda r: _same(_rms(r), "grad_x", "x"), "param", None),
    "rms-grad_x-shifted-grad_y": (RMS, lambda r: _overlap(_rms(r), "grad_x", "grad_y", 5), "param", None),
    "rms-grad_w-is-w": (RMS, lambda r: _same(_rms(r), "grad_w", "w"), "param", None),
    "flce-input_grad-overlaps-input": (FLCE, lambda r: _overlap(_fl(r), "input_grad", "input", 30),
                                       "param", None),
    "flce-weight_grad-in-softmax": (FLCE, _weight_grad_in_softmax, "param", None),
    # --- missing tensors / data
    "eb-no-dy": (EB, lambda r: _drop(_eb(r), "dy"), "null", None),
    "eb-no-i1": (EB, lambda r: _drop(_eb(r), "i1"), "null", None),
    "eb-i1-data-null": (EB, _eb, "null", {"i1": _t(data=None)}),
    "edb-out-data-null": (EDB, _edb, "null", {"out": _t(data=None)}),
    "rms-no-w": (RMS, lambda r: _drop(_rms(r), "w"), "null", None),
    "flce-no-grad": (FLCE, lambda r: _drop(_fl(r), "grad"), "null", None),
}


def _grad_w_in_grad_x(r):
    a = _rms(r)
    a["grad_w"] = a["grad_x"][2]
    return a


BAD["rms-grad_w-in-grad_x"] = (RMS, _grad_w_in_grad_x, "param", None)


def _fill_outputs(name, args):
    for p in registry.get(name).signature.outputs:
        v = args.get(p.name)
        if isinstance(v, np.ndarray) and v.size and v.flags.writeable:
            v[...] = np.asarray(7.0).astype(v.dtype)


def _roots(args):
    return {id(root(v)): root(v) for v in args.values() if isinstance(v, np.ndarray)}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_status_and_nothing_written(rng, case):
    """SPEC §0: the documented status, and every buffer (outputs pre-filled with 7.0, and the
    inputs) byte-identical after the call."""
    name, build, status, tamper = BAD[case]
    args = build(rng)
    _fill_outputs(name, args)
    roots = _roots(args)
    before = {k: r.tobytes() for k, r in roots.items()}
    st, msg = c_call(name, args, tamper)
    assert st == CODE[status], f"{case}: status {st} ({msg!r}), expected {status} ({CODE[status]})"
    assert msg, f"{case}: no error message"
    for k, r in roots.items():
        assert r.tobytes() == before[k], f"{case}: a buffer was written by a failing call"


@pytest.mark.parametrize(("case", "status"), [
    ("eb-i1-negative", "index"), ("edb-out-f16-vs-f32", "dtype"), ("rms-x-rank1", "shape"),
    ("rms-x-last-strided", "strides"), ("rms-grad_x-is-x", "param"), ("flce-no-logits_max", "null"),
])
def test_runtime_call_raises_the_status(rng, case, status):
    """The same through opgen.runtime.call (outputs given, so the C library validates)."""
    name, build, _, _ = BAD[case]
    with pytest.raises(OpError) as e:
        runtime.call(name, **build(rng))
    assert e.value.status == status
    assert e.value.message.startswith(f"status {CODE[status]}:")


def _rms_permuted(r):
    a = rms_args(r, "bf16", (8, 3, 64))
    a["x"] = permuted_leading(a["x"])
    return a


WS_CASES = {
    EB: lambda r: eb_args(r, "bf16", "i32", N=300, D=40),
    EDB: lambda r: edb_args(r, "f16", "f32", lead=(3, 4, 5)),
    EBW: lambda r: ebw_args(r, "i64", "f16", "bf16"),
    RMS: _rms_permuted,
    FLCE + ":softmax": lambda r: flce_args(r, "f16", "u8", "i64", "softmax"),
    FLCE + ":memory_saving": lambda r: flce_args(r, "bf16", "bool", "i32", "memory_saving"),
}


@pytest.mark.parametrize("case", list(WS_CASES))
def test_workspace_protocol(rng, case):
    """opgen_<op>_workspace_size gives the size; one byte less is OPGEN_ERR_WORKSPACE with
    nothing written; exactly that much (caller-owned, misaligned) gives the oracle's result."""
    name = case.split(":")[0]
    args = WS_CASES[case](rng)
    st, need = c_call(name, args, size_query=True)
    assert st == 0 and need > 0
    ref = oracle_outputs(name, args)
    roots = _roots(args)
    before = {k: r.tobytes() for k, r in roots.items()}
    ws = np.zeros(need + 64, np.uint8)
    st, msg = c_call(name, args, workspace=ws, workspace_size=need - 1)
    assert st == CODE["workspace"], msg
    assert all(r.tobytes() == before[k] for k, r in roots.items())
    st, msg = c_call(name, args, workspace=ws[1:], workspace_size=need)
    assert st == 0, msg
    for k, v in ref.items():
        assert_c_close(args[k], v, k, bf16_products(name))


def test_interleaved_disjoint_views(rng):
    """grad_x and grad_y interleaved in one buffer (column halves) share no element. The C
    library may run it correctly or refuse it conservatively as an overlap (param) — then it
    writes nothing."""
    a = rms_args(rng, "f32", (6, 8))
    buf = filled((6, 16), "f32")
    buf[:, 8:] = a["grad_y"]
    a["grad_y"], a["grad_x"] = buf[:, 8:], buf[:, :8]
    ref = oracle_outputs(RMS, a)
    before = buf.tobytes()
    st, msg = c_call(RMS, a)
    if st == 0:
        assert_c_close(a["grad_x"], ref["grad_x"], "grad_x")
    else:
        assert st == CODE["param"], msg
        assert buf.tobytes() == before


def test_element_count_overflow_is_a_shape_error(rng):
    """A descriptor whose shape multiplies past int64 is refused before anything is read."""
    a = rms_args(rng, "f32")
    before = snapshot(a)
    huge = (2**40, 2**30, 40)
    st, msg = c_call("rms_norm_backward", a, tamper={"x": _shape(huge, (0, 0, 1))})
    assert st == 3 and "too many elements" in msg
    assert snapshot(a) == before


# ================================================================= found by tests/test_fuzz_abi.py


@pytest.mark.parametrize("T", ["f16", "bf16", "f32"])
def test_overflowing_products_give_the_oracles_nan(T):
    """alpha * dy overflows to +inf and -inf in two rows summed into one: NaN, as in the oracle
    and PyTorch (a contracted multiply-add kept the product exact and gave inf)."""
    a = {"dy": np.array([[2.0], [-2.0]], NP[T]), "i1": np.array([0, 0]), "alpha1": 3e38,
         "dtable1": filled((1, 1), T), "dtable1_acc": False}
    got = check_against_oracle(EB, a)["dtable1"]
    assert np.isnan(got.astype(np.float64)).all()


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e30])
def test_a_float_index_that_is_no_integer_is_an_index_error_everywhere(bad):
    """NaN/Inf/huge float indices convert to the integer type's minimum on every backend and the
    oracle (docs/dsl.md 4.4), so they fail the index check: status index, nothing written."""
    from opgen import oracle

    a = {"grad": np.ones((2, 3), np.float32), "indices": np.array([1.0, bad], np.float32), "num_weights": 4,
         "out": filled((4, 3), "f32")}
    with pytest.raises(OpError) as e:
        oracle.run(registry.get(EDB), **a)
    assert e.value.status == "index"
    before = a["out"].tobytes()
    st, _ = c_call(EDB, a)
    assert st == CODE["index"] and a["out"].tobytes() == before


def test_in_place_alias_ignores_strides_of_unit_axes(rng):
    """grad_x IS grad_y when both name the same elements: a size-1 axis may carry any stride."""
    a = rms_args(rng, "f32", (1, 4))
    ref = oracle_outputs(RMS, a)
    buf = np.array(a["grad_y"])
    a["grad_y"] = buf
    a["grad_x"] = np.lib.stride_tricks.as_strided(buf, (1, 4), (7 * 4, 4))
    st, msg = c_call(RMS, a)
    assert st == 0, msg
    assert_c_close(buf, ref["grad_x"], "grad_x (in place)")
    assert_c_close(a["grad_w"], ref["grad_w"], "grad_w")
