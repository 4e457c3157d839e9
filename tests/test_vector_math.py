"""The CPU runtime's vectorisable f32 math (generated/cpu/opgen_rt.h) against the correctly
rounded results: exp and log within 1 ulp, erf and tanh within 2, special values exact
(tests/c/ulp_check.c).

CI checks every 997th f32 bit pattern (4.3 million inputs, all exponents); ``OPGEN_ULP_STRIDE=1``
checks all 2^32 (about 30 s per function: the figure docs/backend_cpu.md records)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from opgen.compile import CFLAGS, compiler
from tests.reference import cpu_flag

C = Path(__file__).parent / "c" / "ulp_check.c"
GEN = registry.REPO_ROOT / "generated"


def _cc(*args: str) -> subprocess.CompletedProcess[str]:
    """The C compiler run as the library is built (its flags but -fPIC) against the generated
    runtime header, then ``args``; its run, which must succeed (stderr: the compiler's reports)."""
    flags = [f for f in CFLAGS if f not in ("-fPIC",)]
    r = subprocess.run([compiler(), *flags, f"-I{GEN / 'include'}", f"-I{GEN / 'cpu'}", *args],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def _build(src: Path, exe: Path, extra: tuple[str, ...] = ()) -> Path:
    """The C check ``src`` compiled as the library is (its flags but -fPIC, then ``extra``)
    against the generated runtime header, into ``exe``."""
    _cc(*extra, str(src), "-o", str(exe), "-lm")
    return exe


def _run_check(name: str, tmp_path: Path, build: str = "", extra: tuple[str, ...] = (), args: tuple[str, ...] = (),
               timeout: int = 300) -> list[str]:
    """The C check tests/c/``name``.c built as :func:`_build` does (``extra`` flags; ``build``
    names the executable) and run with ``args``; it must succeed: the words it prints."""
    exe = _build(Path(__file__).parent / "c" / f"{name}.c", tmp_path / f"{name}{'_' + build if build else ''}", extra)
    r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(C, tmp_path_factory.mktemp("ulp") / "ulp_check")


@pytest.mark.parametrize(("fn", "bound"), [("exp", 1.0), ("erf", 2.0), ("tanh", 2.0), ("log", 1.0)])
def test_vector_math_error_bound(checker: Path, fn: str, bound: float) -> None:
    """exp: 0.89 ulp at most over all inputs; erf: 1.61; tanh: 1.56; log: 0.83 (the bounds
    asserted leave room only for inputs a stride skips)."""
    stride = os.environ.get("OPGEN_ULP_STRIDE", "997")
    r = subprocess.run([str(checker), fn, stride], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    worst, bits, checked, special = r.stdout.split()
    assert int(checked) >= 2**32 // int(stride)
    assert int(special) == 0, "NaN, +-inf, +-0, log of negatives (and exp's overflow and underflow thresholds)"
    assert float(worst) <= bound, f"{fn}: {worst} ulp at input bits 0x{bits}"


def assert_loops_vectorise(src: Path, count: int) -> None:
    """Each of the ``count`` lines of C check ``src`` holding ``out[i] = opgen_`` is a loop the C
    compiler the library is built with vectorises (its -fopt-info report)."""
    lines = [i for i, text in enumerate(src.read_text().splitlines(), 1) if "out[i] = opgen_" in text]
    assert len(lines) == count
    r = _cc("-c", str(src), "-o", os.devnull, "-fopt-info-vec-optimized")
    for line in lines:
        assert any(f"{src.name}:{line}:" in x and "loop vectorized" in x for x in r.stderr.splitlines()), \
            f"line {line} of {src.name} is not vectorised:\n{r.stderr[-3000:]}"


def test_loops_calling_them_vectorise() -> None:
    """The point of these functions: a loop calling one is vectorised by the C compiler the
    library is built with (libm's expf/erff/tanhf/logf are calls that keep a loop scalar)."""
    assert_loops_vectorise(C, 4)


def _strip_builds() -> list[tuple[str, tuple[str, ...], int]]:
    """(name, extra flags, the vector path bf16_strip_check must report) for each strip rounding
    this machine can run: as the library is built (-march=native), and without AVX-512 on a
    machine that also has AVX2."""
    native = 1 if cpu_flag("avx512_bf16") else 2 if cpu_flag("avx2") else 0
    builds = [("native", (), native)]
    if cpu_flag("avx512f") and cpu_flag("avx2"):
        builds.append(("avx2", ("-mno-avx512f",), 2))
    return builds


@pytest.mark.parametrize(("name", "extra", "path"), _strip_builds(), ids=[b[0] for b in _strip_builds()])
def test_bf16_strip_rounding_is_the_scalar_rounding(tmp_path: Path, name: str, extra: tuple[str, ...],
                                                    path: int) -> None:
    """opgen_bf16_store_strip (map-cpu's staged bf16 stores; vcvtne2ps2bf16 on AVX512-BF16, whose
    denormal inputs read as zero; the integer steps 8 lanes at a time on AVX2) writes the bits
    opgen_f32_to_bf16 writes, opgen_f16_store_strip those of opgen_f32_to_f16 and
    opgen_f32_store_strip the f32 bits, each storing normally and streaming (nt: map-cpu's
    nontemporal stores), and nothing between a strided strip's elements: every 997th f32 bit
    pattern plus every exponent, sign and NaN payload with the rounding ties
    (tests/c/bf16_strip_check.c; OPGEN_ULP_STRIDE=1: all 2^32, checked once: no mismatch), for
    every vector path this machine runs; opgen_bf16_store_strip_pairs (a ``pairs`` strip's
    firsts then seconds) the same bits, and opgen_bf16_first/second those of opgen_bf16_to_f32
    for every bf16 pattern."""
    checked, bad, first, vector_path = _run_check("bf16_strip_check", tmp_path, name, extra,
                                                  (os.environ.get("OPGEN_ULP_STRIDE", "997"),), timeout=900)
    assert int(checked) > 2**32 // 997
    assert int(bad) == 0, f"first mismatch at input bits 0x{first}"
    assert int(vector_path) == path


def _table_builds() -> list[tuple[str, tuple[str, ...], int]]:
    """(name, extra flags, the vector path table_strip_check must report) for each strip lookup
    this machine can run: as the library is built, without AVX-512, and without SSE4.1."""
    native = 2 if cpu_flag("avx512f") else 1 if cpu_flag("sse4_1") else 0
    builds = [("native", (), native)]
    if native == 2 and cpu_flag("sse4_1"):
        builds.append(("sse4.1", ("-mno-avx512f",), 1))
    if native:
        builds.append(("scalar", ("-mno-sse4.1",), 0))
    return builds


@pytest.mark.parametrize(("name", "extra", "path"), _table_builds(), ids=[b[0] for b in _table_builds()])
def test_strip_lookups_are_the_plain_lookups(tmp_path: Path, name: str, extra: tuple[str, ...], path: int) -> None:
    """opgen_table_load_strip (map-cpu's staged lookups of a bf16/f16 row in a table of f32
    values: opgen/lower/tabulate.py) gives the bits of tab[src[l]] for every 16-bit index,
    strips of 1 to 64 elements at every alignment, and writes nothing past its strip, on
    every vector path this machine runs (tests/c/table_strip_check.c)."""
    checked, bad, vector_path = _run_check("table_strip_check", tmp_path, name, extra)
    assert int(checked) > 65536 * 64 and int(bad) == 0
    assert int(vector_path) == path


def _transpose_builds() -> list[tuple[str, tuple[str, ...], int]]:
    """(name, extra flags, the block path transpose_tile_check must report) for each staged-tile
    transpose this machine can run: as the library is built, AVX-512 without BW, without AVX-512."""
    native = 2 if cpu_flag("avx512bw") else 1 if cpu_flag("avx512f") else 0
    builds = [("native", (), native)]
    if native == 2:
        builds.append(("no-bw", ("-mno-avx512bw",), 1))
    if native:
        builds.append(("no-avx512", ("-mno-avx512f",), 0))
    return builds


@pytest.mark.parametrize(("name", "extra", "path"), _transpose_builds(), ids=[b[0] for b in _transpose_builds()])
def test_staged_tile_transposes_are_the_definition(tmp_path: Path, name: str, extra: tuple[str, ...],
                                                   path: int) -> None:
    """opgen_<dtype>_transpose_tile (sched.transpose_tile) writes d[c * ld + r] = the widened
    s[r * rs + c * cs] bit for bit, f32, bf16 and f16 of random bits, and
    opgen_bits16_transpose_tile (into a stage tile that holds bf16 as stored) the words as they
    are, rows and columns around the in-register blocks' edges (16 x 16; 16 x 32 for bf16 and the
    words with AVX512-BW), nothing outside the tile, on every block path this machine runs
    (tests/c/transpose_tile_check.c)."""
    checked, bad, block_path = _run_check("transpose_tile_check", tmp_path, name, extra)
    assert int(checked) > 1_000_000 and int(bad) == 0
    assert int(block_path) == path


def test_prefetch_shares_name_each_line_of_the_block_once(tmp_path: Path) -> None:
    """opgen_prefetch_share (tile-transposes' next tile, a share a row; sched.prefetch_share), its
    hints recorded: the shares of a block together name each of its lines once, in order, none
    outside it, for row lengths around a line, strides of both signs and 1 to 5000 shares; out-of-
    range shares name none (tests/c/prefetch_share_check.c). And the C compiler keeps the
    prefetches of the real hint (GCC 12 deletes a loop of prefetches alone)."""
    checked, bad = _run_check("prefetch_share_check", tmp_path)
    assert int(checked) > 10000 and int(bad) == 0
    src = tmp_path / "share.c"
    src.write_text("#include \"opgen_rt.h\"\n"
                   "void f(const float *p, int64_t rs, int64_t rows, int64_t cols, int64_t n) {\n"
                   "    for (int64_t i = 0; i < n; i++) opgen_prefetch_share(p, rs, rows, cols, i, n);\n}\n")
    asm = _cc("-S", "-o", "-", str(src))
    if cpu_flag("sse"):  # (x86: prefetcht2; elsewhere the builtin may be dropped by design)
        assert "prefetcht2" in asm.stdout


F16 = Path(__file__).parent / "c" / "f16_check.c"


def test_f16_conversions_are_ieee(tmp_path: Path) -> None:
    """opgen_f16_to_f32 for every f16 bit pattern, and opgen_f32_to_f16 for every 997th f32 one
    plus every sign, exponent and top mantissa bits with the low 13 bits at the rounding ties and
    their neighbours (0, 1, 0xfff, 0x1000, 0x1001, 0x1fff), against numpy's conversions: the same
    bits, round to nearest even, subnormals included; a NaN is quieted (its payload kept), where
    numpy keeps a signalling one. (OPGEN_ULP_STRIDE=1, all 2^32 f32 inputs: checked once against
    the F16C instructions, no mismatch.)"""
    exe = _build(F16, tmp_path / "f16_check")
    out = tmp_path / "h2f.bin"
    subprocess.run([str(exe), "h2f", str(out)], check=True)
    got = np.fromfile(out, np.uint32)
    h = np.arange(1 << 16, dtype=np.uint32)
    want = h.astype(np.uint16).view(np.float16).astype(np.float32).view(np.uint32)
    nan = (h & 0x7C00) == 0x7C00
    nan &= (h & 0x3FF) != 0
    want = np.where(nan, want | 0x400000, want)  # (quieted)
    assert np.array_equal(got, want), f"first mismatch at f16 bits 0x{int(h[np.argmax(got != want)]):04x}"
    stride = int(os.environ.get("OPGEN_ULP_STRIDE", "997"))
    top = np.arange(1 << 19, dtype=np.uint32) << 13
    bits = np.unique(np.concatenate([top | low for low in (0, 1, 0xFFF, 0x1000, 0x1001, 0x1FFF)] +
                                    [np.arange(0, 2**32, stride, dtype=np.uint64).astype(np.uint32)]))
    src, dst = tmp_path / "f32.bin", tmp_path / "f2h.bin"
    bits.tofile(src)
    subprocess.run([str(exe), "f2h", str(src), str(dst)], check=True)
    got16 = np.fromfile(dst, np.uint16)
    with np.errstate(over="ignore", invalid="ignore"):
        want16 = bits.view(np.float32).astype(np.float16).view(np.uint16)
    a = bits & 0x7FFFFFFF
    nan32 = a > 0x7F800000
    want16 = np.where(nan32, ((bits >> 16) & 0x8000) | 0x7E00 | ((a >> 13) & 0x3FF), want16).astype(np.uint16)
    bad = got16 != want16
    assert not bad.any(), f"first mismatch at f32 bits 0x{int(bits[np.argmax(bad)]):08x}: " \
                          f"0x{int(got16[bad][0]):04x}, numpy 0x{int(want16[bad][0]):04x}"


def test_f16_conversion_loops_vectorise() -> None:
    """A loop converting f16 to or from f32 is vectorised by the C compiler the library is built
    with (a _Float16 conversion is one scalar F16C instruction per value on a CPU without
    AVX512-FP16, and kept every loop holding one scalar: SiLU backward f16 8 ns an element)."""
    assert_loops_vectorise(F16, 2)
