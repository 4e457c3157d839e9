"""Interleaved strips of map-cpu's ``stream`` loops (:func:`opgen.lower.cpu_map.copies`).

A stream loop whose body computes something slow from what it reads runs four strips a step
where a strip is one vector of f32, two where it is two (bf16: 32 elements), the copies of its
body printed statement by statement in turn (opgen/emit/c_family.py, ``stream_loop``). On ops
written only in the tests (GELU exact and tanh, SiLU, softmax backward): which loops
interleave, the C of two, results against a float64 numpy reference and bitwise against the
same ops built without interleaving (row lengths around the step of 64, unit-stride and strided
rows), and the library under ASan/UBSan. bf16 rows run as pairs (:func:`opgen.lower.cpu_map.paired`):
the C of softmax backward's instances, and its bits against numpy's f32 model of the documented
lane order.
"""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Iterator

import ml_dtypes
import numpy as np
import pytest

from opgen import runtime
from opgen.lower import cpu_map
from opgen.lower import sched as s
from opgen.passes import pipeline
from tests.ops_dirs import built_ops, built_ops_patched
from tests.test_ascendc import NEW_OPS
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers
from tests.test_new_op_backends import GELU, GELU_TANH

SOURCES = {"new_ops.py": NEW_OPS, "gelu_ops.py": GELU, "gelu_tanh_ops.py": GELU_TANH}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("interleave"), "opgen_test_interleave", SOURCES) as b:
        yield b


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The same ops built with one strip a step."""
    with built_ops_patched(tmp_path_factory.mktemp("interleave_off"), "opgen_test_interleave_off", SOURCES,
                           cpu_map, "COPIES", 1) as b:
        yield b["lib"]


def _stream_loops(built: dict, name: str) -> list[s.ForOp]:
    m = built["ops"][name].module()
    pipeline.run(m, "cpu")
    return [o for o in m.walk() if isinstance(o, s.ForOp) and cpu_map.cpu_mapping(o) == s.CpuMapping.STREAM]


@pytest.mark.parametrize("name, slow", [("gelu_backward", True), ("gelu_tanh_backward", True),
                                        ("silu_backward", True), ("softmax_backward", False)])
def test_slow_bodies_interleave_four_vectors(built, name, slow):
    """GELU (erf, exp), GELU-tanh and SiLU (exp, a division) compute slowly per element: four
    strips a step in f32 (a strip of 16, one vector), two in bf16 and f16 (a strip of 32 is two
    vectors of f32 arithmetic): four vectors' chains either way. Softmax's second pass (a
    subtraction and a product per element; its row sum is loop-invariant) interleaves nowhere."""
    (loop,) = _stream_loops(built, name)
    assert cpu_map.slow(loop) == slow
    assert (cpu_map.COPIES_ATTR in loop.attributes) == slow  # (map-cpu's decision, in the IR opgen show prints)
    assert "copies = 4 : i64" in str(loop) if slow else "copies" not in str(loop)
    assert cpu_map.copies(loop, [4, 4]) == (cpu_map.COPIES if slow else 1)
    assert cpu_map.copies(loop, [2, 2]) == (cpu_map.COPIES // 2 if slow else 1)
    assert cpu_map.copies(loop, [2, 4]) == (cpu_map.COPIES if slow else 1)  # (a strip is a line of the widest)


def test_invariant_slow_work_does_not_count(built):
    """LayerNorm backward's second pass divides and takes a square root only of its row
    statistics (loop-invariant: the compiler computes them once a row): not slow."""
    loops = _stream_loops(built, "layer_norm_backward")
    assert loops and not any(cpu_map.slow(o) for o in loops)


def test_the_strips_run_interleaved_copies(built):
    """The C of GELU-tanh backward's unit-stride f32 instance: a step of 64 elements, each of the
    four lines prefetched in both rows it reads, the copies' loads and tanh calls side by side,
    and four strip stores (a line each, so each may stream). SiLU backward's bf16 instance: a
    step of 64 too, two strips of 32 the same way (GELU-tanh's bf16 tanh is a table lookup; a
    slow body does not run as pairs: cpu_map.pair_loads)."""
    text = (built["out"] / "cpu" / "gelu_tanh_backward.c").read_text()  # (as built: `single` patches COPIES)
    f32 = text[text.index("k_gelu_tanh_backward_f32_u("):]
    f32 = f32[:f32.index("return OPGEN_SUCCESS")]
    head = f32.index("+ 64 <= d_D; ")
    strip = f32[head:f32.index("#pragma omp simd", f32.index("store_strip", head))]
    for k in (16, 32, 48):
        for row in ("p_grad", "p_x"):
            assert re.search(rf"OPGEN_PREFETCH\({row}, [^;]*\(r\d+ \+ {k}\), 2048\);", strip)
        assert re.search(rf"opgen_f32_store_strip\(&p_dx\[[^;]*\(r\d+ \+ {k}\)\], 1, stg\d+ \+ {k}, 16, ", strip)
    assert strip.count("OPGEN_PREFETCH(p_grad, ") == strip.count("OPGEN_PREFETCH(p_x, ") == 4
    assert strip.count("opgen_tanhf(") == 4 and strip.count("opgen_f32_store_strip(") == 4
    lines = [ln.strip() for ln in strip.splitlines()]
    loads = [i for i, ln in enumerate(lines) if "= p_x[" in ln]
    assert len(loads) == 4 and loads == list(range(loads[0], loads[0] + 4))  # (in turn, not one copy after another)
    tanhs = [i for i, ln in enumerate(lines) if "opgen_tanhf(" in ln]
    assert tanhs == list(range(tanhs[0], tanhs[0] + 4))
    text = (built["out"] / "cpu" / "silu_backward.c").read_text()
    bf16 = text[text.index("k_silu_backward_bf16_u("):]
    bf16 = bf16[:bf16.index("return OPGEN_SUCCESS")]
    head = bf16.index("+ 64 <= d_D; ")
    strip = bf16[head:bf16.index("#pragma omp simd", bf16.index("store_strip", head))]
    for row in ("p_grad", "p_x"):
        assert re.search(rf"OPGEN_PREFETCH\({row}, [^;]*\(r\d+ \+ 32\), 2048\);", strip)
    assert re.search(r"opgen_bf16_store_strip\(&p_dx\[[^;]*\(r\d+ \+ 32\)\], 1, stg\d+ \+ 32, 32, ", strip)
    assert strip.count("opgen_expf(") == 2 and strip.count("opgen_bf16_store_strip(") == 2
    lines = [ln.strip() for ln in strip.splitlines()]
    exps = [i for i, ln in enumerate(lines) if "opgen_expf(" in ln]
    assert exps == [exps[0], exps[0] + 1]


def _want(name: str, g: np.ndarray, x: np.ndarray) -> np.ndarray:
    if name == "gelu_backward":
        erf = np.vectorize(math.erf)(x / math.sqrt(2))
        return g * (0.5 * (1 + erf) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    if name == "gelu_tanh_backward":
        c = math.sqrt(2 / math.pi)
        th = np.tanh(c * (x + 0.044715 * x**3))
        return g * (0.5 * (1 + th) + 0.5 * x * (1 - th * th) * c * (1 + 3 * 0.044715 * x * x))
    sg = 1 / (1 + np.exp(-x))
    return g * sg * (1 + x * (1 - sg))


#: the ops and dtypes checked (the GELU ops take f32 and bf16; SiLU f16 too)
CASES = [(name, dt) for name in ("gelu_backward", "gelu_tanh_backward", "silu_backward")
         for dt in (np.float32, ml_dtypes.bfloat16)] + [("silu_backward", np.float16)]


@pytest.mark.parametrize("name, dt", CASES)
@pytest.mark.parametrize("d", [1, 15, 16, 17, 33, 63, 64, 65, 96, 130, 200])
@pytest.mark.parametrize("strided", [False, True])
def test_results_match_numpy_and_the_single_strip_build(built, single, rng, name, dt, d, strided):
    """Row lengths below, at and around the step (64) and the strips (16 f32, 32 bf16 and f16):
    the float64 reference within the dtype's margin, and bitwise the build with one strip a step (interleaving
    reorders statements, never an element's arithmetic). Strided rows take the general flavour."""
    n = 3
    g = rng.standard_normal((n, 2 * d if strided else d)).astype(dt)
    x = (3 * rng.standard_normal((n, 2 * d if strided else d))).astype(dt)
    if strided:
        g, x = g[:, ::2], x[:, ::2]
    got = np.asarray(runtime.call(name, lib=built["lib"], grad=g, x=x)["dx"])
    off = np.asarray(runtime.call(name, lib=single, grad=g, x=x)["dx"])
    want = _want(name, g.astype(np.float64), x.astype(np.float64))
    tol = {np.float32: 2e-6, np.float16: 2e-3}.get(dt, 1e-2)
    assert np.abs(got.astype(np.float64) - want).max() <= tol * (np.abs(want).max() + 1)
    assert np.array_equal(got.view(np.uint8), off.view(np.uint8))


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    rng = np.random.default_rng(0)
    for name, dt in [(name, dt) for name in ("gelu_backward", "gelu_tanh_backward", "silu_backward")
                     for dt in (np.float32, ml_dtypes.bfloat16)] + [("silu_backward", np.float16)]:
        for n, d in ((1, 1), (2, 63), (3, 64), (5, 65), (2, 96), (4, 200), (2, 4096)):
            g = rng.standard_normal((n, d)).astype(dt)
            runtime.call(name, lib=lib, grad=g, x=g[::-1].copy())
            wide = rng.standard_normal((n, 2 * d)).astype(dt)  # (strided rows)
            runtime.call(name, lib=lib, grad=wide[:, ::2], x=wide[:, 1::2])
            off = np.zeros(n * d + 5, dt)[5:].reshape(n, d)  # (rows off a line)
            runtime.call(name, lib=lib, grad=g, x=g, dx=off)
    for n, d in ((1, 1), (2, 31), (3, 33), (2, 64), (3, 100), (2, 4096)):  # (bf16 rows in pairs)
        g = rng.standard_normal((n, 2 * d)).astype(ml_dtypes.bfloat16)
        runtime.call("softmax_backward", lib=lib, grad=g[:, :d], y=g[:, d:])
        runtime.call("softmax_backward", lib=lib, grad=g[:, ::2], y=g[:, 1::2])
        off = np.zeros(n * d + 5, ml_dtypes.bfloat16)[5:].reshape(n, d)
        runtime.call("softmax_backward", lib=lib, grad=np.ascontiguousarray(g[:, :d]), y=np.ascontiguousarray(g[:, d:]),
                     dx=off)
    print("done")
""")


def test_interleaved_strips_are_clean_under_asan_and_ubsan(built):
    """The interleaved strips (row lengths around the step, strided rows, rows off a line) and
    softmax backward's bf16 rows in pairs (a pair's word read from its first element: rows
    starting at odd elements, strided, off a line) under ASan/UBSan."""
    assert_clean_under_sanitizers(built, SANITIZED)


def test_f16_rows_are_widened_a_strip_at_a_time(built, rng):
    """map-cpu stages a stream loop's loads of rows (``staged``); the f16 instance of unit stride
    widens each strip of 32 at once (``opgen_f16_load_strip``: two vcvtph2ps with AVX-512), the
    strided one value by value: both give the same bits (row lengths around the step)."""
    (loop,) = _stream_loops(built, "silu_backward")
    assert [cpu_map.cpu_mapping(o) for o in loop.body.block.ops if isinstance(o, s.LoadOp)] == \
        [s.CpuMapping.STAGED] * 2
    text = (built["out"] / "cpu" / "silu_backward.c").read_text()  # (as built: the single build patches COPIES)
    fns = {f.split("(")[0]: f for f in text.split("static opgen_status_t k_silu_backward_")[1:]}
    assert fns["f16_u"].count("opgen_f16_load_strip(") == 4  # (grad and x, two strips a step)
    assert "opgen_f16_load_strip(" not in fns["f16_g"] + fns["bf16_u"] + fns["f32_u"]
    for d in (1, 31, 32, 33, 63, 64, 65, 96, 130, 200):
        g = rng.standard_normal((3, 2 * d)).astype(np.float16)
        x = (3 * rng.standard_normal((3, 2 * d))).astype(np.float16)
        strided = np.asarray(runtime.call("silu_backward", lib=built["lib"], grad=g[:, ::2], x=x[:, ::2])["dx"])
        unit = np.asarray(runtime.call("silu_backward", lib=built["lib"], grad=np.ascontiguousarray(g[:, ::2]),
                                       x=np.ascontiguousarray(x[:, ::2]))["dx"])
        assert np.array_equal(unit.view(np.uint16), strided.view(np.uint16)), d


# ----------------------------------------------------------------------------- pairs (bf16)


def _loops(built: dict, name: str) -> list[s.ForOp]:
    m = built["ops"][name].module()
    pipeline.run(m, "cpu")
    return [o for o in m.walk() if isinstance(o, s.ForOp)]


def _bodies(built: dict, name: str) -> dict[str, str]:
    """The C of ``name``'s kernel instances by flavour (``bf16_u``: bf16, unit-stride rows)."""
    text = (built["out"] / "cpu" / f"{name}.c").read_text()
    return {f.split("(")[0]: f.split("return OPGEN_SUCCESS")[0]
            for f in text.split(f"static opgen_status_t k_{name}_")[1:]}


def test_bf16_rows_run_as_pairs(built):
    """map-cpu marks softmax backward's row sum (a lanes loop) and its second pass (a stream
    loop) ``pairs``, and their loads of the rows ``pair``; the bf16 instance of unit stride
    widens each pair's word by a shift and a mask (``opgen_bf16_first``/``_second``), sums the
    firsts in lanes 0-15 and the seconds in lanes 16-31, and rounds a strip as two vectors
    (``opgen_bf16_store_strip_pairs``). The strided bf16 instance splits its lanes the same way
    but loads element by element; the f32 and f16 instances do not run as pairs, nor do slow
    bodies (SiLU, GELU: :func:`~opgen.lower.cpu_map.pair_loads`)."""
    loops = [o for o in _loops(built, "softmax_backward") if cpu_map.PAIRS in o.attributes]
    assert {cpu_map.cpu_mapping(o) for o in loops} == {s.CpuMapping.LANES, s.CpuMapping.STREAM}
    for o in loops:
        assert {ld.buf for ld in o.body.block.ops if isinstance(ld, s.LoadOp) and cpu_map.PAIR in ld.attributes}
    f = _bodies(built, "softmax_backward")
    assert f["bf16_u"].count("opgen_bf16_first(&p_grad[") >= 2 and f["bf16_u"].count("opgen_bf16_second(&p_y[") >= 2
    assert "opgen_bf16_store_strip_pairs(&p_dx[" in f["bf16_u"] and "opgen_bf16_store_strip(&p_dx[" not in f["bf16_u"]
    assert re.search(r"lane\d+\[l \+ 16\] \+= ", f["bf16_u"]) and re.search(r"lane\d+\[l \+ 16\] \+= ", f["bf16_g"])
    assert "opgen_bf16_first(" not in f["bf16_g"]
    for flavour in ("f32_u", "f32_g", "f16_u", "f16_g"):
        assert "opgen_bf16_first(" not in f[flavour] and "[l + 8] += " not in f[flavour] \
            and "_pairs(" not in f[flavour], flavour
    for name in ("gelu_backward", "gelu_tanh_backward", "silu_backward"):
        assert not [o for o in _loops(built, name) if cpu_map.PAIRS in o.attributes], name
        bf16 = _bodies(built, name)["bf16_u"]
        assert "_pairs(" not in bf16 and "opgen_bf16_first(" not in bf16


def _softmax_pairs(g: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Softmax backward of bf16 rows in f32 with the row sum in the order cpu_map.paired
    documents: 32 lanes, strip ``k`` (elements ``32 k ... 32 k + 31``) adding element
    ``32 k + 2 j`` to lane ``j`` and ``32 k + 2 j + 1`` to lane ``16 + j``, the tail's element
    ``32 K + l`` to lane ``l``; lanes combined pairwise (16, 8, 4, 2, 1); each step rounded to f32
    (numpy's float32 arithmetic), the result rounded to bf16."""
    out = np.empty(g.shape, ml_dtypes.bfloat16)
    for r in range(g.shape[0]):
        p = g[r].astype(np.float32) * y[r].astype(np.float32)
        lanes = np.zeros(32, np.float32)
        whole = len(p) // 32 * 32
        for k in range(0, whole, 32):
            lanes[:16] += p[k:k + 32:2]
            lanes[16:] += p[k + 1:k + 32:2]
        lanes[:len(p) - whole] += p[whole:]
        w = 16
        while w:
            lanes[:w] += lanes[w:2 * w]
            w //= 2
        out[r] = (y[r].astype(np.float32) * (g[r].astype(np.float32) - lanes[0])).astype(ml_dtypes.bfloat16)
    return out


@pytest.mark.parametrize("d", [1, 2, 31, 32, 33, 63, 64, 65, 100, 130, 4096])
def test_pairs_sum_in_their_documented_order_for_any_layout(built, rng, d):
    """Softmax backward bf16 (a row sum in pairs, then a second pass in pairs): bitwise the f32
    evaluation in the documented lane order (:func:`_softmax_pairs`, numpy), for unit-stride rows,
    strided rows (the general flavour: element by element, the same lanes) and rows off a line.
    Where a row has a whole strip, its elements 0, 1 and 16 are 2^24, 1 and -2^24 (y 1): lanes 0,
    16 and 8 in the pair layout, so the combination's first step gives 2^24 + 1 = 2^24 in f32
    and the 1 is lost (in the elements' order, lanes 0, 1 and 16, 2^24 and -2^24 would cancel
    first and the 1 stay: other bits for every output of the row; numpy's model of that order
    differs in 93 of the 99 outputs at d = 33)."""
    g = rng.standard_normal((3, 2 * d)).astype(ml_dtypes.bfloat16)
    y = rng.random((3, 2 * d)).astype(ml_dtypes.bfloat16)
    if d >= 32:
        g[:, 0], g[:, 2], g[:, 32] = 2.0**24, 1.0, -(2.0**24)  # (elements 0, 1 and 16 of the strided rows)
        y[:, :64] = 1.0
    want = _softmax_pairs(g[:, ::2], y[:, ::2])
    unit = np.asarray(runtime.call("softmax_backward", lib=built["lib"], grad=np.ascontiguousarray(g[:, ::2]),
                                   y=np.ascontiguousarray(y[:, ::2]))["dx"])
    strided = np.asarray(runtime.call("softmax_backward", lib=built["lib"], grad=g[:, ::2], y=y[:, ::2])["dx"])
    off = np.zeros(3 * d + 5, ml_dtypes.bfloat16)[5:].reshape(3, d)
    runtime.call("softmax_backward", lib=built["lib"], grad=np.ascontiguousarray(g[:, ::2]),
                 y=np.ascontiguousarray(y[:, ::2]), dx=off)
    for got in (unit, strided, off):
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
