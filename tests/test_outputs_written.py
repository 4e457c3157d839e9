"""The seed ops write every element of every output they do not read (tests/outputs_written.py):
the Python API allocates such outputs uninitialised. The ops written only in DSL files are checked
beside their builds (tests/test_new_op_backends.py, test_shapes_dsl.py, test_segments.py,
test_mlir.py)."""

from __future__ import annotations

import ctypes

import numpy as np

from opgen import registry, runtime
from tests.cpu_cases import eb_args, flce_args
from tests.outputs_written import assert_every_output_written, random_calls


def test_seed_ops_write_every_output_element() -> None:
    """Every seed op, random inputs for up to four dtype bindings at dims 16 and 37; FLCE on
    valid inputs in both modes (its random inputs lack the memory-saving statistics), and
    embedding_backward with its tables given (it accumulates into them when asked: read, so
    allocated zeroed and not compared)."""
    ops = registry.load_all()
    rng = np.random.default_rng(0)
    flce = "fused_linear_cross_entropy_loss_grad"
    calls = {flce: [flce_args(rng, T, M, "i64", mode) for T in ("f32", "bf16") for M in ("u8", "bool")
                    for mode in ("softmax", "memory_saving")],
             "embedding_backward": [eb_args(rng, T, "i32") for T in ("f32", "bf16")]}
    assert flce in ops and len(ops) >= 6
    assert_every_output_written(ops, runtime.load(), calls)
    assert all(random_calls(o) for o in ops.values())


# ------------------------------------------------------------------ zero hints


def _embedding_call(V: int, D: int, N: int, dt: np.dtype, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return dict(grad=rng.standard_normal((N, D)).astype(dt), indices=rng.integers(0, V, N).astype(np.int64),
                num_weights=V, padding_idx=-1, scale_grad_by_freq=False)


def test_zero_fill_marks_only_stores_of_positive_zero() -> None:
    """map-cpu marks the embedding gradients' rows of zeros (empty-ranges' branch: +0 cast to the
    output dtype) ``zero_fill``, and no other store of the seed ops (FLCE's and RMSNorm's stores
    are computed; embedding_backward accumulates into its tables)."""
    from opgen.lower import cpu_map
    from opgen.lower import sched as s
    from opgen.passes import pipeline

    marked = {}
    for name, o in registry.load_all().items():
        m = o.module()
        pipeline.run(m, "cpu")
        stores = [x for x in m.walk() if isinstance(x, s.StoreOp) and cpu_map.ZERO_FILL in x.attributes]
        marked[name] = len(stores)
        for st in stores:
            assert cpu_map.cpu_mapping(st) == s.CpuMapping.NONTEMPORAL
            loop = st.parent_op()
            assert isinstance(loop, s.ForOp) and cpu_map.zero_fill_loop(loop) is st.buf
    assert {k for k, v in marked.items() if v} == {"embedding_dense_backward", "embedding_bw"}, marked


def test_fresh_zero_outputs_skip_their_zero_rows_and_match_the_oracle() -> None:
    """An output of 32 MiB or more that the op does not read is allocated zeroed (fresh pages) and
    the library told so for that call only: the embedding's rows no index hits are not stored,
    and the result is still the oracle's (those rows read back as zeros); the promise is withdrawn
    after the call."""
    from opgen import binding, oracle

    lib = runtime.load()
    V, D = 8192, 1024  # (f32: 32 MiB, binding.ZERO_FREE_MIN)
    assert V * D * 4 >= binding.ZERO_FREE_MIN
    args = _embedding_call(V, D, 300, np.float32)
    o = registry.get("embedding_dense_backward")
    assert binding.bind(o, dict(args)).fresh_zero == ["out"]
    assert [fresh for *_, fresh in runtime.output_plan(o, dict(args), ["out"])] == [True]  # (what runtime.call uses)
    got = runtime.call("embedding_dense_backward", lib=lib, **args)["out"]
    ref = oracle.run(o, **args)["out"]
    np.testing.assert_array_equal(got, ref)
    assert not np.isin(np.arange(V), args["indices"]).all() and not got[~np.isin(np.arange(V), args["indices"])].any()
    lib.opgen_known_zero.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    assert lib.opgen_known_zero(got.ctypes.data, got.nbytes) == 0  # (withdrawn)


def test_zero_hint_needs_the_whole_contiguous_output() -> None:
    """The library skips zero rows only for a contiguous output wholly inside a promised range:
    promised over a strided (every other row) output, or over part of one, the kernel writes
    every row (given outputs full of NaN come back without one)."""
    lib = runtime.load()
    lib.opgen_zero_hint.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    V, D = 64, 40
    args = _embedding_call(V, D, 20, np.float32)
    for out in ("strided", "partial"):
        base = np.full((2 * V, D), np.nan, np.float32)
        given = base[::2] if out == "strided" else base[:V]
        nbytes = base.nbytes if out == "strided" else given.nbytes - 4
        promised = ((ctypes.c_void_p * 1)(base.ctypes.data), (ctypes.c_size_t * 1)(nbytes))
        lib.opgen_zero_hint(promised[0], promised[1], 1)
        try:
            runtime.call("embedding_dense_backward", lib=lib, **args, out=given)
        finally:
            lib.opgen_zero_hint(None, None, 0)
        assert not np.isnan(given).any(), out


def test_known_zero_ranges() -> None:
    """opgen_known_zero: inside one promised range (up to its end), not across or outside one;
    a new opgen_zero_hint replaces the promises, n = 0 withdraws them."""
    lib = runtime.load()
    lib.opgen_zero_hint.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    lib.opgen_known_zero.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    buf = np.zeros(4096, np.uint8)
    p = buf.ctypes.data
    ptrs, sizes = (ctypes.c_void_p * 2)(p, p + 2048), (ctypes.c_size_t * 2)(1024, 1024)
    lib.opgen_zero_hint(ptrs, sizes, 2)
    try:
        assert lib.opgen_known_zero(p, 1024) == 1 and lib.opgen_known_zero(p + 100, 924) == 1
        assert lib.opgen_known_zero(p + 2048, 1024) == 1
        assert lib.opgen_known_zero(p, 1025) == 0 and lib.opgen_known_zero(p + 1000, 100) == 0
        assert lib.opgen_known_zero(p + 1024, 1024) == 0 and lib.opgen_known_zero(None, 0) == 0
        lib.opgen_zero_hint(ptrs, sizes, 1)
        assert lib.opgen_known_zero(p + 2048, 1024) == 0 and lib.opgen_known_zero(p, 1024) == 1
    finally:
        lib.opgen_zero_hint(None, None, 0)
    assert lib.opgen_known_zero(p, 1024) == 0
