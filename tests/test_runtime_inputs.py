"""What the Python runtime (``opgen.runtime.call``, the ttnn-style facade, the binding the oracle
shares) accepts and refuses before the compiled library runs (docs/dsl.md section 7):

1. outputs that cannot be written in place — read-only numpy arrays (``writeable=False``,
   ``np.frombuffer`` over immutable ``bytes``), non-arrays, torch tensors requiring grad under grad
   mode, inference tensors outside inference mode — are ``param``, with nothing written (the
   ``bytes`` stay unchanged); inputs are only read (read-only inputs work, byte-identical after);
   a torch output written in place has its autograd version bumped;
2. scalars are never wrapped: an ``int`` attribute takes [-2**63, 2**64) (the upper half is the
   uint64 ABI value, e.g. CANN's paddingIdx, read as int64), a size [0, 2**63), a ``float``
   attribute any real whose f32 rounding is finite (inf/nan as given), a ``bool`` True/False/0/1;
   anything else is ``param``; an output too large to allocate is ``shape`` / ``alloc``;
3. arrays the library has no code for (complex, object, big-endian) are ``dtype``, misaligned data
   ``param`` (the C ABI's alignment rule); torch tensors on another device are ``param``;
   non-contiguous torch tensors and requires-grad inputs give PyTorch's results.

Results are checked against the oracle (``opgen.oracle``) or PyTorch CPU; errors by status.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from opgen import oracle, registry, runtime, runtime_cuda
from opgen.binding import OpError
from tests.cpu_cases import (
    FLCE,
    SENTINEL,
    assert_c_close,
    bf16_products,
    eb_args,
    ebw_args,
    edb_args,
    flce_args,
    oracle_outputs,
    rms_args,
)

EB, EDB, EBW, RMS = "embedding_backward", "embedding_dense_backward", "embedding_bw", "rms_norm_backward"

#: one small valid call per op, all outputs given (pre-filled with SENTINEL)
BUILD = {
    EB: lambda r: eb_args(r, "f32", "i32", N=9, D=5),
    EDB: lambda r: edb_args(r, "f32", "i64", lead=(2, 3), D=4, V=6, padding_idx=2),
    EBW: lambda r: ebw_args(r, "i32", "f32", "f32", N=7, D=4, V=5),
    RMS: lambda r: rms_args(r, "f32", (3, 8)),
    FLCE: lambda r: flce_args(r, "f16", "u8", "i32", "softmax", BT=6, H=4, V=130),
}
#: the output each case makes read-only
OUT = {EB: "dtable1", EDB: "out", EBW: "out", RMS: "grad_w", FLCE: "weight_grad"}


def frozen(a: np.ndarray) -> tuple[np.ndarray, bytes]:
    """A read-only array over an immutable ``bytes`` holding ``a``'s values (and the bytes)."""
    buf = np.ascontiguousarray(a).tobytes()
    v = np.frombuffer(buf, a.dtype).reshape(a.shape)
    assert not v.flags.writeable and v.flags.aligned
    return v, buf


def edb_small() -> tuple[np.ndarray, np.ndarray]:
    grad = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    return grad, np.array([0, 2, 2, 1], np.int64)


def edb_torch(grad: np.ndarray, idx: np.ndarray, V: int, padding_idx: int = -1,
              scale: bool = False) -> np.ndarray:
    """PyTorch's embedding_dense_backward (float64)."""
    return torch.ops.aten.embedding_dense_backward(
        torch.from_numpy(grad.astype(np.float64)), torch.from_numpy(idx.astype(np.int64)), V,
        padding_idx, scale).numpy()


def status_of(fn: Any) -> OpError:
    with pytest.raises(OpError) as e:
        fn()
    return e.value


# ============================================================================ 1. outputs / inputs


@pytest.mark.parametrize("how", ["writeable_false", "frombuffer_bytes"])
@pytest.mark.parametrize("op", list(BUILD))
def test_read_only_output_is_refused_and_nothing_written(rng, op, how):
    """A read-only output is ``param`` before the library runs: the array (and the immutable
    ``bytes`` under it) and every other output keep their contents."""
    args = BUILD[op](rng)
    name = OUT[op]
    buf = None
    if how == "writeable_false":
        args[name] = args[name].copy()
        args[name].flags.writeable = False
    else:
        args[name], buf = frozen(args[name])
        buf_before = bytearray(buf)  # a copy (bytes(buf) would be buf itself)
    before = {k: v.tobytes() for k, v in args.items() if isinstance(v, np.ndarray)}
    e = status_of(lambda: runtime.call(op, **args))
    assert e.status == "param", e
    assert op in e.message and f"'{name}'" in e.message and "read-only" in e.message
    for k, v in args.items():
        if isinstance(v, np.ndarray):
            assert v.tobytes() == before[k], f"{op}: '{k}' was written by a refused call"
    if buf is not None:
        assert buf == buf_before, "the immutable bytes changed"


#: larger calls (several threads, sorted/segmented scatter paths, FLCE's memory-saving tiles)
BUILD_LARGE = {
    EB: lambda r: eb_args(r, "bf16", "i64", N=3000, D=40, N1=50, N2=30),
    EDB: lambda r: edb_args(r, "f32", "f32", lead=(40, 60), D=33, V=70, padding_idx=5),
    EBW: lambda r: ebw_args(r, "u32", "f32", "bf16", N=2500, D=24, V=40),
    RMS: lambda r: rms_args(r, "bf16", (4, 50, 64)),
    FLCE: lambda r: flce_args(r, "bf16", "bool", "i64", "memory_saving", BT=40, H=24, V=200),
}


@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("op", list(BUILD))
def test_read_only_inputs_are_read_not_written(rng, op, size):
    """Every input as a read-only view of immutable ``bytes``: accepted, the oracle's results, and
    the bytes byte-identical afterwards (the library only reads inputs)."""
    args = (BUILD if size == "small" else BUILD_LARGE)[op](rng)
    ref = oracle_outputs(op, args)
    outs = {p.name for p in registry.get(op).signature.outputs}
    bufs = {}
    for k, v in list(args.items()):
        if isinstance(v, np.ndarray) and k not in outs:
            args[k], bufs[k] = frozen(v)
    copies = {k: bytearray(b) for k, b in bufs.items()}
    got = runtime.call(op, **args)
    for k, v in ref.items():
        assert_c_close(got[k], v, f"{op}.{k}", bf16_products(op))
    for k, b in bufs.items():
        assert b == copies[k], f"{op}: input '{k}' was modified"


def test_output_that_is_not_an_array_is_refused():
    """A list as an output would be written into np.asarray's temporary copy and lost."""
    grad, idx = edb_small()
    out = [[SENTINEL] * 3 for _ in range(3)]
    e = status_of(lambda: runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out))
    assert e.status == "param" and "'out'" in e.message
    assert out == [[SENTINEL] * 3 for _ in range(3)]


def test_ttnn_read_only_output_tensor_is_refused():
    indices = np.array([[0, 2, 2]], np.uint32)
    grad = np.ones((1, 1, 3, 4), np.float32)
    out, buf = frozen(np.full((1, 1, 5, 4), SENTINEL, np.float32))
    e = status_of(lambda: runtime.ttnn.embedding_bw(indices, np.zeros((5, 4), np.float32), grad,
                                                    output_tensor=out))
    assert e.status == "param" and "embedding_bw" in e.message and "output_tensor" in e.message
    assert np.all(np.frombuffer(buf, np.float32) == SENTINEL)


def test_ttnn_torch_output_tensor_requiring_grad_is_refused():
    indices = torch.tensor([[0, 2, 2]], dtype=torch.int32)
    out = torch.full((1, 1, 5, 4), SENTINEL, requires_grad=True)
    e = status_of(lambda: runtime.ttnn.embedding_bw(indices, torch.zeros(5, 4), torch.ones(1, 1, 3, 4),
                                                    output_tensor=out))
    assert e.status == "param" and "requires grad" in e.message
    assert torch.all(out.detach() == SENTINEL)


def test_ttnn_empty_embedding_dim():
    """D = 0 (SPEC §0: empty tensors are valid): a (1, 1, V, 0) result, not numpy's reshape error."""
    out = runtime.ttnn.embedding_bw(np.zeros((2, 3), np.uint32), np.zeros((4, 0), np.float32),
                                    np.zeros((1, 1, 6, 0), np.float32))
    assert out.shape == (1, 1, 4, 0) and out.dtype == np.float32


def test_torch_output_requiring_grad():
    """Refused under grad mode (torch's ``out=`` rule), nothing written; under no_grad it is
    written in place with torch's result, and autograd sees the write (a graph that saved the
    tensor refuses to backpropagate through the stale value)."""
    grad, idx = edb_small()
    out = torch.full((3, 3), SENTINEL, requires_grad=True)
    e = status_of(lambda: runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out))
    assert e.status == "param" and "requires grad" in e.message and "'out'" in e.message
    assert torch.all(out.detach() == SENTINEL)
    with torch.no_grad():
        runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out)
    np.testing.assert_array_equal(out.detach().numpy(), edb_torch(grad, idx, 3))


def test_torch_output_write_is_seen_by_autograd():
    grad, idx = edb_small()
    out = torch.zeros(3, 3)
    x = torch.ones(3, 3, requires_grad=True)
    y = (x * out).sum()  # saves `out` for backward
    runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out)
    np.testing.assert_array_equal(out.numpy(), edb_torch(grad, idx, 3))
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_inference_tensor_output():
    """An inference tensor may only be written inside inference mode (torch's rule)."""
    grad, idx = edb_small()
    with torch.inference_mode():
        out = torch.full((3, 3), SENTINEL)
    e = status_of(lambda: runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out))
    assert e.status == "param" and "inference" in e.message
    assert torch.all(out == SENTINEL)
    with torch.inference_mode():
        runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out)
    np.testing.assert_array_equal(out.numpy(), edb_torch(grad, idx, 3))


def test_torch_noncontiguous_and_requires_grad_inputs():
    """Transposed / sliced torch inputs (one requiring grad: detached, only read), an output that
    is a strided view of a bigger tensor: PyTorch's result in the view, the rest untouched."""
    g = torch.arange(24, dtype=torch.float32).reshape(3, 8)  # grad = g.t()[::2]: (4, 3), strided
    grad = g.t()[::2]
    idx_full = torch.tensor([0, 9, 2, 9, 2, 9, 1, 9])
    idx = idx_full[::2]
    big = torch.full((3, 7), SENTINEL)
    out = big[:, 1:7:2]  # (3, 3), strides (7, 2)
    assert not grad.is_contiguous() and not idx.is_contiguous() and not out.is_contiguous()
    w = grad.detach().clone().requires_grad_(True)
    runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out)
    expect = edb_torch(grad.numpy(), idx.numpy(), 3)
    np.testing.assert_array_equal(out.numpy(), expect)
    keep = torch.ones(3, 7, dtype=torch.bool)
    keep[:, 1:7:2] = False
    assert torch.all(big[keep] == SENTINEL)
    got = runtime.call(EDB, grad=w, indices=idx, num_weights=3)["out"]
    np.testing.assert_array_equal(got, expect)
    assert w.grad is None and w.requires_grad


def test_torch_tensor_on_another_device_is_refused():
    _, idx = edb_small()
    meta = torch.empty(4, 3, device="meta")
    e = status_of(lambda: runtime.call(EDB, grad=meta, indices=idx, num_weights=3))
    assert e.status == "param" and "'grad'" in e.message and "meta" in e.message
    e = status_of(lambda: oracle.run(registry.get(EDB), grad=meta, indices=idx, num_weights=3))
    assert e.status == "param"


# ============================================================================ 2. scalars


def edb_call(path: str, **kw: Any) -> dict[str, np.ndarray]:
    """embedding_dense_backward on edb_small() through ``path``: the library with ``out`` given
    (scalars marshalled straight to C), the library with ``out`` allocated (bound first), or the
    oracle."""
    grad, idx = edb_small()
    kw.setdefault("num_weights", 3)
    if path == "c_out_given":
        out = np.full((3, 3), SENTINEL, np.float32)
        try:
            return runtime.call(EDB, grad=grad, indices=idx, out=out, **kw)
        except OpError:
            assert np.all(out == SENTINEL), "a refused call wrote its output"
            raise
    if path == "c_allocated":
        return runtime.call(EDB, grad=grad, indices=idx, **kw)
    return oracle.run(registry.get(EDB), grad=grad, indices=idx, **kw)


PATHS = ["c_out_given", "c_allocated", "oracle"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "what"), [
    (2**64 + 2, "out of range"),  # used to wrap to 2 (row 2 zeroed)
    (2**64, "out of range"),
    (-2**63 - 1, "out of range"),
    (2.5, "must be an integer"),
    (float("nan"), "must be an integer"),
    ("2", "must be an integer"),
    (True, "must be an integer"),
    (np.array([1, 2]), "must be a scalar"),
])
def test_int_attribute_out_of_range_or_wrong_kind(path, value, what):
    e = status_of(lambda: edb_call(path, padding_idx=value))
    assert e.status == "param", e
    assert EDB in e.message and "'padding_idx'" in e.message and what in e.message


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "torch_pad"), [
    (2, 2), (np.int64(2), 2), (np.uint64(2), 2), (2.0, 2), (np.array(2), 2),
    (2**64 - 1, -1), (2**63, -1), (2**64 - 2, -1), (-2**63, -1), (7, -1),
])
def test_int_attribute_accepted_values(path, value, torch_pad):
    """In-range values, numpy scalars, 0-d arrays and integral floats are taken; [2**63, 2**64)
    is the uint64 ABI value read as int64 (negative: no padding row), as PyTorch's padding_idx=-1."""
    grad, idx = edb_small()
    got = edb_call(path, padding_idx=value)["out"]
    np.testing.assert_array_equal(got, edb_torch(grad, idx, 3, torch_pad))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "status"), [
    (2**70, "param"), (2**63, "param"), (-1, "param"), (3.5, "param"), ("3", "param"),
    (True, "param"), (None, "null"),
])
def test_size_out_of_range_or_wrong_kind(path, value, status):
    e = status_of(lambda: edb_call(path, num_weights=value))
    assert e.status == status, e
    assert EDB in e.message and "num_weights" in e.message
    if status == "param" and not isinstance(value, str | bool | float):
        assert "out of range" in e.message or "must be >= 0" in e.message


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", [3, np.int32(3), np.uint64(3), 3.0, np.array(3)])
def test_size_accepted_values(path, value):
    grad, idx = edb_small()
    np.testing.assert_array_equal(edb_call(path, num_weights=value)["out"], edb_torch(grad, idx, 3))


@pytest.mark.parametrize(("V", "status"), [(2**63 - 1, "shape"), (2**62, "shape"), (2**59, "alloc")])
def test_output_too_large_to_allocate(V, status):
    """num_weights valid as a size but the (V, 3) f32 output is beyond int64 bytes (``shape``) or
    beyond any address space (2**61 bytes: ``alloc``) — not numpy's ValueError / MemoryError."""
    for path in ("c_allocated", "oracle"):
        e = status_of(lambda p=path: edb_call(p, num_weights=V))
        assert e.status == status, e
        assert "'out'" in e.message and "allocate" in e.message


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "scale"), [
    (True, True), (False, False), (np.bool_(True), True), (1, True), (0, False), (np.array(True), True),
])
def test_bool_attribute_accepted_values(path, value, scale):
    grad, idx = edb_small()
    got = edb_call(path, scale_grad_by_freq=value)["out"]
    np.testing.assert_allclose(got, edb_torch(grad, idx, 3, scale=scale), rtol=1e-6)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("value", ["no", "False", 2, -1, 0.5, 1.0])
def test_bool_attribute_wrong_kind(path, value):
    """bool("no") is True: strings (and other non-bools) are refused, not truth-tested."""
    e = status_of(lambda: edb_call(path, scale_grad_by_freq=value))
    assert e.status == "param" and "'scale_grad_by_freq'" in e.message and "bool" in e.message


def rms_call(path: str, eps: Any) -> dict[str, np.ndarray]:
    r = np.random.default_rng(5)
    a = rms_args(r, "f32", (3, 8), eps=eps)
    if path == "oracle":
        return oracle.run(registry.get(RMS), **{k: v for k, v in a.items() if k not in ("grad_x", "grad_w")})
    if path == "c_allocated":
        del a["grad_x"], a["grad_w"]
    return runtime.call(RMS, **a)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("value", "what"), [
    (1e300, "out of range"), (-3.5e38, "out of range"), (2**200, "out of range"), (10**400, "out of range"),
    ("1e-6", "real number"), (True, "real number"), (1j, "real number"),
])
def test_float_attribute_overflow_or_wrong_kind(path, value, what):
    """A finite value whose f32 rounding is infinite is refused (the C float would be inf)."""
    e = status_of(lambda: rms_call(path, value))
    assert e.status == "param" and RMS in e.message and "'eps'" in e.message and what in e.message


@pytest.mark.parametrize("path", ["c_out_given", "c_allocated"])
@pytest.mark.parametrize("value", [1e-6, np.float64(1e-6), 3.4028235e38, 1, float("inf"), float("nan")])
def test_float_attribute_accepted_values(path, value):
    """Representable values, ints, the f32 maximum and inf/nan as given: the oracle's result with
    the same eps (rounded to f32)."""
    got = rms_call(path, value)
    ref = rms_call("oracle", value)
    for k, v in ref.items():
        assert_c_close(got[k], v, k)


def test_float_attributes_of_other_ops():
    """alpha (embedding_backward) and labelSmoothing (FLCE) follow the same float rule."""
    r = np.random.default_rng(1)
    a = eb_args(r, "f32", "i32", N=9, D=5)
    e = status_of(lambda: runtime.call(EB, **{**a, "alpha1": 1e39}))
    assert e.status == "param" and "'alpha1'" in e.message
    f = flce_args(r, "f16", "u8", "i32", "softmax", BT=6, H=4, V=130)
    e = status_of(lambda: runtime.call(FLCE, **{**f, "label_smoothing": "0"}))
    assert e.status == "param" and "'label_smoothing'" in e.message


def test_unknown_argument_name_is_refused_with_outputs_given(rng):
    """A misspelt attribute used to be ignored silently when every output was given."""
    a = rms_args(rng, "f32", (3, 8))
    before = a["grad_x"].tobytes()
    e = status_of(lambda: runtime.call(RMS, **a, epsilon=1e-6))
    assert e.status == "param" and "epsilon" in e.message
    assert a["grad_x"].tobytes() == before


# ============================================================================ 3. dtypes, layout


@pytest.mark.parametrize("where", ["grad", "out"])
@pytest.mark.parametrize("dt", [np.complex64, object, ">f4"])
def test_unsupported_array_dtype_is_a_dtype_error(where, dt):
    """complex, object and big-endian arrays never reach the C library (it reads native f32)."""
    grad, idx = edb_small()
    out = np.full((3, 3), SENTINEL, np.float32)
    if where == "grad":
        grad = grad.astype(dt)
    else:
        out = out.astype(dt)
    before = out.copy()
    e = status_of(lambda: runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out))
    assert e.status == "dtype" and f"'{where}'" in e.message, e
    if dt == ">f4":
        assert "byte order" in e.message
    assert np.array_equal(out, before)


def test_big_endian_grad_bound_first():
    grad, idx = edb_small()
    e = status_of(lambda: runtime.call(EDB, grad=grad.astype(">f4"), indices=idx, num_weights=3))
    assert e.status == "dtype" and "byte order" in e.message


@pytest.mark.parametrize("where", ["grad", "out"])
def test_misaligned_data_is_a_param_error(where):
    """Data one byte off its item alignment (a C float* may not point there)."""
    grad, idx = edb_small()
    out = np.full((3, 3), SENTINEL, np.float32)

    def off_by_one(a: np.ndarray) -> np.ndarray:
        raw = np.zeros(a.nbytes + 1, np.uint8)
        v = raw[1:].view(a.dtype).reshape(a.shape)
        v[...] = a
        return v

    if where == "grad":
        grad = off_by_one(grad)
    else:
        out = off_by_one(out)
    e = status_of(lambda: runtime.call(EDB, grad=grad, indices=idx, num_weights=3, out=out))
    assert e.status == "param" and f"'{where}'" in e.message and "aligned" in e.message
    assert np.all(out == SENTINEL)


def test_cuda_runtime_checks_before_any_device_work():
    """runtime_cuda shares the checks: a misspelt name and an out-of-range size are refused
    before the library (here: none) or a device is touched."""
    grad, idx = edb_small()
    no_lib: Any = object()
    e = status_of(lambda: runtime_cuda.call(EDB, lib=no_lib, grad=grad, indices=idx, num_weights=3, paddng_idx=1))
    assert e.status == "param" and "paddng_idx" in e.message
    e = status_of(lambda: runtime_cuda.call(EDB, lib=no_lib, grad=grad, indices=idx, num_weights=2**64))
    assert e.status == "param" and "out of range" in e.message



@pytest.mark.parametrize("shape", [(7, 13), (300, 520), (0, 8)])
def test_outputs_it_allocates_start_on_a_cache_line(rng, shape):
    """Non-empty outputs ``runtime.call`` (and the ttnn facade) allocate start on a 64-byte boundary, as
    PyTorch's do (numpy's large arrays start 16 bytes into a line, where every vector store of a
    kernel splits over two lines), are zero-filled C-contiguous arrays of the output's shape and
    dtype, and hold the oracle's result."""
    from opgen.binding import ALIGN, aligned_zeros

    for T in ("f32", "bf16"):
        args = {k: v for k, v in rms_args(rng, T, shape, eps=1e-6).items() if k not in ("grad_x", "grad_w")}
        got = runtime.call("rms_norm_backward", **args)
        assert set(got) == {"grad_x", "grad_w"}
        want = oracle.run(registry.get("rms_norm_backward"), **args)
        for name, arr in got.items():
            assert arr.size == 0 or arr.ctypes.data % ALIGN == 0, name  # (an empty array has no data)
            assert arr.flags.c_contiguous and arr.flags.writeable, name
            assert arr.shape == want[name].shape and arr.dtype == want[name].dtype, name
            assert_c_close(arr, want[name], name)
    for dt in (np.float32, np.uint16, np.int64, np.bool_):
        z = aligned_zeros((3, 5, 2), dt)
        assert z.ctypes.data % ALIGN == 0 and z.shape == (3, 5, 2) and z.dtype == dt and not z.any()


def test_large_outputs_start_on_a_huge_page_boundary():
    """Outputs of HUGE_MIN bytes or more start on a 2 MiB boundary (where transparent huge pages
    can back them from their first byte, as PyTorch places large tensors with
    THP_MEM_ALLOC_ENABLE=1); smaller ones on a cache line; both zero, of the asked shape."""
    from opgen.binding import ALIGN, HUGE_ALIGN, HUGE_MIN, aligned_zeros

    big = aligned_zeros((HUGE_MIN // 2 + 3, 2), np.uint16)
    assert big.ctypes.data % HUGE_ALIGN == 0 and big.shape == (HUGE_MIN // 2 + 3, 2) and not big[-1].any()
    small = aligned_zeros((HUGE_MIN // 4 - 16,), np.float32)
    assert small.ctypes.data % ALIGN == 0 and not small[::4096].any()
    out = runtime.call("embedding_dense_backward", grad=np.ones((2, 1024), np.float32),
                       indices=np.array([0, 1500], np.int64), num_weights=2000, padding_idx=-1,
                       scale_grad_by_freq=False)["out"]  # (8 MB: allocated by the runtime)
    assert out.ctypes.data % HUGE_ALIGN == 0
    assert out[0].sum() == 1024 and out[1500].sum() == 1024 and out.sum() == 2048


def test_repeated_calls_reuse_the_output_plan_and_still_refuse_bad_input(rng, monkeypatch):
    """``runtime.call`` binds a call in Python once per op and argument layout (dtype, shape and
    strides of each array, type and value of each scalar): the next call that looks the same
    allocates the outputs it found without binding again, and gives the oracle's result; a call
    that differs in any of those is bound (and refused) as the first was; torch tensors likewise
    (dtype, shape, strides, device, layout)."""
    import opgen.runtime as rt

    counted = {"n": 0}
    real = rt.bind

    def bind(*a: Any, **kw: Any) -> Any:
        counted["n"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(rt, "bind", bind)
    rt._PLANS.clear()
    args = {k: v for k, v in rms_args(rng, "f32", (5, 24)).items() if k not in ("grad_x", "grad_w")}
    want = oracle.run(registry.get(RMS), **args)
    for i in range(3):
        got = runtime.call(RMS, **args)
        assert counted["n"] == 1, f"call {i}: bound {counted['n']} times"
        for name in ("grad_x", "grad_w"):
            assert_c_close(got[name], want[name], name)
    assert not np.shares_memory(runtime.call(RMS, **args)["grad_x"], got["grad_x"])  # (fresh outputs)
    bad = dict(args, w=args["w"][:-1])  # (D = 23 against 24: a shape the binding refuses)
    with pytest.raises(OpError) as e:
        runtime.call(RMS, **bad)
    assert e.value.status == "shape" and counted["n"] == 2
    with pytest.raises(OpError) as e:  # (the same shapes in another dtype: refused again)
        runtime.call(RMS, **dict(args, w=args["w"].astype(np.float64)))
    assert e.value.status == "dtype"
    n = counted["n"]
    runtime.call(RMS, **dict(args, eps=1e-5))  # (another attribute value: bound)
    wide = np.zeros((5, 48), np.float32)
    wide[:, :24] = args["x"]
    runtime.call(RMS, **dict(args, x=wide[:, :24]))  # (other row strides: bound)
    with pytest.raises(OpError) as e:  # (a strided last dim: refused, as on a first call)
        runtime.call(RMS, **dict(args, x=np.asfortranarray(args["x"])))
    assert e.value.status == "strides"
    as_torch = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    for _ in range(2):  # (torch tensors: keyed on dtype, shape, strides, device, layout: bound once)
        got = runtime.call(RMS, **as_torch)
        assert_c_close(got["grad_x"], want["grad_x"], "grad_x")
    assert counted["n"] == n + 4
    with pytest.raises(OpError) as e:  # (a torch tensor of another dtype: bound and refused)
        runtime.call(RMS, **dict(as_torch, w=as_torch["w"].double()))
    assert e.value.status == "dtype" and counted["n"] == n + 5
    runtime.call(RMS, **dict(as_torch, x=torch.from_numpy(wide)[:, :24]))  # (other row strides: bound)
    assert counted["n"] == n + 6
