"""benchmarks/timing.py's copy reference: the streaming-store copy (benchmarks/stream_copy.c) it
times beside numpy's and PyTorch's copies must copy every byte — a faster "copy" that did not
would make every "% copy BW" of benchmarks/cpu.py read low — and the copier returns the time of
a copy that happened; the read-only reference (stream_read) reads every float."""

from __future__ import annotations

import ctypes
import importlib.util

import numpy as np

from opgen import registry
from opgen.binding import aligned_zeros

_spec = importlib.util.spec_from_file_location("opgen_bench_timing", registry.REPO_ROOT / "benchmarks" / "timing.py")
assert _spec is not None and _spec.loader is not None
timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timing)


def test_the_streaming_copy_copies_every_byte():
    lib = timing._stream_copy_lib()
    assert lib is not None  # (gcc is part of what the repository needs)
    rng = np.random.default_rng(0)
    for n in (64, 4096, (1 << 20) + 192, (5 << 20) + 4160):  # (the last: several runs of 8 streams a thread)
        src = aligned_zeros((n,), np.uint8, align=64)
        src[:] = rng.integers(0, 256, n, dtype=np.uint8)
        dst = aligned_zeros((n + 64,), np.uint8, align=64)
        lib.stream_copy(ctypes.c_void_p(src.ctypes.data), ctypes.c_void_p(dst.ctypes.data), ctypes.c_size_t(n))
        assert np.array_equal(dst[:n], src) and not dst[n:].any()


def test_the_streaming_read_reads_every_float():
    """stream_read (the read-only reference) sums every float it is given: a faster "read" that
    skipped lines would make the read-only bandwidth of benchmarks/cpu.py read high."""
    lib = timing._stream_copy_lib()
    assert lib is not None
    rng = np.random.default_rng(1)
    for n in (64, 4096, (1 << 20) + 192, (5 << 20) + 4160):  # (the last: several runs of 8 streams a thread)
        src = aligned_zeros((n // 4 + 16,), np.float32, align=64)
        src[:n // 4] = rng.integers(-8, 9, n // 4)
        src[n // 4:] = 1000  # (past the end: never summed)
        got = lib.stream_read(ctypes.c_void_p(src.ctypes.data), ctypes.c_size_t(n))
        assert got == float(src[:n // 4].astype(np.float64).sum())


def test_the_reader_times_a_read():
    t = timing.reader(1 << 20)()
    assert 0 < t < 1.0


def test_the_copier_times_a_copy():
    copy = timing.copier(1 << 20)
    t = copy()
    assert 0 < t < 1.0
