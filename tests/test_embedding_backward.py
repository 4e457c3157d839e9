"""EmbeddingBackward (SPEC §1): the oracle against torch ``index_add_`` in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opgen import oracle
from opgen.binding import OpError
from tests.reference import (
    NP,
    TORCH,
    assert_close_policy,
    assert_f64_close,
    f32_scalar,
    rounded,
    t64,
    tlong,
    tt,
)

T_ALL = ("f16", "bf16", "f32", "f64")
I_ALL = ("i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64")


@pytest.fixture
def op(ops):
    return ops["embedding_backward"]


def ref_table(table, acc, dy, idx, alpha):
    """float64: ``(acc ? table : 0)`` then ``index_add_(idx, dy, alpha)`` (alpha is a C float)."""
    base = t64(table) if acc else torch.zeros(table.shape, dtype=torch.float64)
    return base.index_add_(0, tlong(idx), t64(dy), alpha=f32_scalar(alpha))


def torch_table(table, acc, dy, idx, alpha, T):
    """PyTorch's own computation in dtype T."""
    base = tt(table, T) if acc else torch.zeros(table.shape, dtype=TORCH[T])
    return base.index_add_(0, tlong(idx), tt(dy, T), alpha=f32_scalar(alpha))


def check_table(out, table, acc, dy, idx, alpha, T, what):
    assert_close_policy(out, ref_table(table, acc, dy, idx, alpha),
                        torch_table(table, acc, dy, idx, alpha, T), T, what)


def make_case(rng, T, IT, N=9, D=5, N1=3, N2=6):
    dy = rounded(rng.standard_normal((N, D)) * 2, T)
    i1 = rng.integers(0, N1, N)
    i1[:3] = 1  # duplicates
    i2 = rng.integers(0, N2, N)
    i2[-3:] = N2 - 1
    t1 = rounded(rng.standard_normal((N1, D)), T)
    t2 = rounded(rng.standard_normal((N2, D)), T)
    return dy, i1.astype(NP[IT]), i2.astype(NP[IT]), t1, t2


@pytest.mark.parametrize("IT", I_ALL)
@pytest.mark.parametrize("T", T_ALL)
def test_two_tables_match_torch(op, rng, T, IT):
    dy, i1, i2, t1, t2 = make_case(rng, T, IT)
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha1=2.0, alpha2=-0.75, dtable1_acc=True,
                     dtable2_acc=False, dtable1=t1, dtable2=t2)
    assert set(out) == {"dtable1", "dtable2"}
    check_table(out["dtable1"], t1, True, dy, i1, 2.0, T, "dtable1")
    check_table(out["dtable2"], t2, False, dy, i2, -0.75, T, "dtable2")


@pytest.mark.parametrize("acc1,acc2", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("T", T_ALL)
def test_acc_flags(op, rng, T, acc1, acc2):
    """acc=1 keeps the prior contents; acc=0 ignores them entirely, even NaN."""
    dy, i1, i2, t1, t2 = make_case(rng, T, "i64")
    if not acc1:
        t1[:] = np.nan
    if not acc2:
        t2[:] = np.nan
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha1=1.0, alpha2=0.5, dtable1_acc=acc1,
                     dtable2_acc=acc2, dtable1=t1, dtable2=t2)
    for name, table, acc, idx, alpha in (("dtable1", t1, acc1, i1, 1.0), ("dtable2", t2, acc2, i2, 0.5)):
        assert np.isfinite(out[name].astype(np.float64)).all(), name
        check_table(out[name], table, acc, dy, idx, alpha, T, name)


@pytest.mark.parametrize("T", ("f16", "f32"))
def test_acc_keeps_nan_and_inf(op, rng, T):
    dy, i1, _, t1, _ = make_case(rng, T, "i32")
    t1[0, 1] = np.nan
    t1[2, 0] = np.inf
    out = oracle.run(op, dy=dy, i1=i1, dtable1_acc=True, dtable1=t1)["dtable1"]
    assert np.isnan(out[0, 1]) and out[2, 0] == np.inf
    check_table(out, t1, True, dy, i1, 1.0, T, "dtable1")


@pytest.mark.parametrize("T", ("bf16", "f32"))
def test_nonfinite_dy_propagates(op, rng, T):
    dy, i1, _, t1, _ = make_case(rng, T, "i64")
    dy[0, 0] = np.inf
    dy[4, 2] = np.nan
    dy[5, 3] = -np.inf
    out = oracle.run(op, dy=dy, i1=i1, dtable1=t1)["dtable1"]
    check_table(out, t1, False, dy, i1, 1.0, T, "dtable1")


@pytest.mark.parametrize("alpha", [0.0, 1.0, -1.0, 0.1, 3.5, -1e4])
@pytest.mark.parametrize("T", ("bf16", "f32", "f64"))
def test_alpha_values(op, rng, T, alpha):
    dy, i1, i2, t1, t2 = make_case(rng, T, "i32")
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha1=alpha, alpha2=-alpha, dtable1_acc=True,
                     dtable1=t1, dtable2=t2)
    check_table(out["dtable1"], t1, True, dy, i1, alpha, T, "dtable1")
    check_table(out["dtable2"], t2, False, dy, i2, -alpha, T, "dtable2")


@pytest.mark.parametrize("T", ("f16", "bf16", "f32", "f64"))
def test_f64_mode_matches_torch_float64(op, rng, T):
    dy, i1, i2, t1, t2 = make_case(rng, T, "u16", N=12, D=7)
    out = oracle.run(op, precision="f64", dy=dy, i1=i1, i2=i2, alpha1=0.3, alpha2=-1.7,
                     dtable1_acc=True, dtable2_acc=False, dtable1=t1, dtable2=t2)
    assert_f64_close(out["dtable1"], ref_table(t1, True, dy, i1, 0.3), "dtable1")
    assert_f64_close(out["dtable2"], ref_table(t2, False, dy, i2, -1.7), "dtable2")


def test_different_table_sizes(op, rng):
    """N1 and N2 are independent dims: a large table 1 and a one-row table 2."""
    dy = rounded(rng.standard_normal((6, 4)), "f32")
    i1 = np.array([0, 9, 9, 3, 0, 7], np.int32)
    i2 = np.zeros(6, np.int32)
    t1, t2 = np.zeros((10, 4), np.float32), np.ones((1, 4), np.float32)
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha2=2.0, dtable2_acc=True, dtable1=t1, dtable2=t2)
    assert out["dtable1"].shape == (10, 4) and out["dtable2"].shape == (1, 4)
    check_table(out["dtable1"], t1, False, dy, i1, 1.0, "f32", "dtable1")
    check_table(out["dtable2"], t2, True, dy, i2, 2.0, "f32", "dtable2")


# ------------------------------------------------------------------------ table 2 absent


def test_table2_absent(op, rng):
    dy, i1, _, t1, _ = make_case(rng, "f32", "i64")
    out = oracle.run(op, dy=dy, i1=i1, alpha1=-2.0, dtable1=t1)
    assert set(out) == {"dtable1"}
    check_table(out["dtable1"], t1, False, dy, i1, -2.0, "f32", "dtable1")


def test_dtable2_without_i2_is_not_written(op, rng):
    dy, i1, _, t1, t2 = make_case(rng, "f32", "i64")
    out = oracle.run(op, dy=dy, i1=i1, dtable1=t1, dtable2=t2)
    assert set(out) == {"dtable1"}
    check_table(out["dtable1"], t1, False, dy, i1, 1.0, "f32", "dtable1")


def test_i2_without_dtable2_uses_table1_only(op, rng):
    dy, i1, i2, t1, _ = make_case(rng, "f32", "i64")
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha2=3.0, dtable1=t1)
    assert set(out) == {"dtable1"}
    check_table(out["dtable1"], t1, False, dy, i1, 1.0, "f32", "dtable1")


@pytest.mark.parametrize("with_dtable2", [False, True])
@pytest.mark.parametrize("alpha2", [1.0, -0.5, 1e-30])
def test_alpha2_without_i2_is_bad_param(op, rng, alpha2, with_dtable2):
    dy, i1, _, t1, t2 = make_case(rng, "f32", "i32")
    kw = {"dtable2": t2} if with_dtable2 else {}
    with pytest.raises(OpError) as e:
        oracle.run(op, dy=dy, i1=i1, alpha2=alpha2, dtable1=t1, **kw)
    assert e.value.status == "param"
    assert "alpha2" in e.value.message


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("IT", "bad", "table"), [
    ("i32", 3, 1), ("i64", -1, 1), ("i8", -128, 1), ("u8", 255, 1), ("u64", 2**63 + 1, 1),
    ("u64", 2**64 - 1, 1), ("i16", 6, 2), ("u32", 2**32 - 1, 2),
])
def test_out_of_range_index(op, rng, IT, bad, table):
    dy, i1, i2, t1, t2 = make_case(rng, "f32", "i64", N1=3, N2=6)
    i1, i2 = i1.astype(NP[IT]), i2.astype(NP[IT])
    (i1 if table == 1 else i2)[4] = bad
    before = (t1.copy(), t2.copy(), dy.copy())
    with pytest.raises(OpError) as e:
        oracle.run(op, dy=dy, i1=i1, i2=i2, alpha2=1.0, dtable1_acc=True, dtable2_acc=True,
                   dtable1=t1, dtable2=t2)
    assert e.value.status == "index"
    assert str(bad) in e.value.message
    for a, b in zip((t1, t2, dy), before, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("T", ("f16", "f64"))
@pytest.mark.parametrize("acc", [False, True])
def test_empty_n(op, rng, T, acc):
    """N = 0: tables are zero-filled (acc=0) or kept (acc=1); no error."""
    D = 4
    dy = np.zeros((0, D), NP[T])
    i1, i2 = np.zeros(0, np.int32), np.zeros(0, np.int32)
    t1 = rounded(rng.standard_normal((3, D)), T)
    t2 = np.full((2, D), np.nan, NP[T])
    out = oracle.run(op, dy=dy, i1=i1, i2=i2, alpha2=1.0, dtable1_acc=acc, dtable1=t1, dtable2=t2)
    check_table(out["dtable1"], t1, acc, dy, i1, 1.0, T, "dtable1")
    assert np.array_equal(out["dtable2"], np.zeros((2, D), NP[T]))


def test_empty_d(op):
    out = oracle.run(op, dy=np.zeros((3, 0), np.float32), i1=np.array([0, 1, 0]),
                     dtable1=np.zeros((2, 0), np.float32))
    assert out["dtable1"].shape == (2, 0)


@pytest.mark.parametrize("T", ("bf16", "f32"))
def test_noncontiguous_dy_and_indices(op, rng, T):
    """A column slice of a wider array (last dim contiguous, row stride 3*D), every other row
    of a taller one, and strided index arrays are all fine."""
    N, D = 7, 4
    wide = rounded(rng.standard_normal((N, 3 * D)), T)
    dy = wide[:, D:2 * D]
    tall = rounded(rng.standard_normal((2 * N, D)), T)
    dy2 = tall[::2]
    idx_store = rng.integers(0, 5, 2 * N).astype(np.int64)
    i1 = idx_store[::2]
    tbl_store = rounded(rng.standard_normal((5, 2 * D)), T)
    t1 = tbl_store[:, :D]  # row stride 2*D, last dim contiguous
    for d in (dy, dy2):
        assert not d.flags.c_contiguous
        out = oracle.run(op, dy=d, i1=i1, dtable1_acc=True, dtable1=t1)["dtable1"]
        check_table(out, t1, True, np.ascontiguousarray(d), np.ascontiguousarray(i1), 1.0, T,
                    "dtable1")


@pytest.mark.parametrize("which", ["dy", "dtable1", "dtable2"])
def test_noncontiguous_last_dim_is_strides_error(op, rng, which):
    N, D = 5, 4
    args = {
        "dy": rng.standard_normal((N, D)).astype(np.float32),
        "i1": np.array([0, 1, 2, 1, 0]), "i2": np.array([0, 1, 1, 1, 0]), "alpha2": 1.0,
        "dtable1": np.zeros((3, D), np.float32), "dtable2": np.zeros((2, D), np.float32),
    }
    wide = np.zeros((args[which].shape[0], 2 * D), np.float32)
    wide[:, ::2] = args[which]
    args[which] = wide[:, ::2]
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == "strides"
    assert which in e.value.message


@pytest.mark.parametrize(("change", "status"), [
    ({"dy": np.zeros((5, 4), np.int32)}, "dtype"),
    ({"dy": np.zeros((5, 4), np.float16)}, "dtype"),  # tables are f32
    ({"i1": np.zeros(5, np.float32)}, "dtype"),
    ({"i1": np.zeros(4, np.int64)}, "shape"),
    ({"dtable1": np.zeros((3, 5), np.float32)}, "shape"),
    ({"dy": np.zeros((5, 4, 1), np.float32)}, "shape"),
    ({"i2": np.zeros(5, np.int32)}, "dtype"),  # I is already i64 (from i1)
])
def test_bad_arguments(op, change, status):
    args = {"dy": np.zeros((5, 4), np.float32), "i1": np.zeros(5, np.int64),
            "i2": np.zeros(5, np.int64), "dtable1": np.zeros((3, 4), np.float32),
            "dtable2": np.zeros((2, 4), np.float32)}
    args.update(change)
    with pytest.raises(OpError) as e:
        oracle.run(op, **args)
    assert e.value.status == status
