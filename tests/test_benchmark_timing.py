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


def test_the_bf16_peak_is_that_of_the_units_the_library_uses(tmp_path):
    """benchmarks/fma_peak.c's "amx" peak (what benchmarks/cpu.py divides a bf16 GEMM's rate by
    where the library runs it on AMX) is a tile-product rate far above the f32 FMA peak where the
    library uses AMX, and "nan" on a machine without AMX-BF16: a bf16 row must never be shown as a
    percentage of the slower AVX512-BF16 dot products while it runs on AMX tiles (it read 579%)."""
    import math
    import subprocess

    from opgen import compile as cc
    from opgen import runtime

    exe = tmp_path / "fma_peak"
    subprocess.run([cc.compiler(), "-O2", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=fast",
                    "-fopenmp", "-Wall", "-Wextra", "-Werror", str(registry.REPO_ROOT / "benchmarks" / "fma_peak.c"),
                    "-o", str(exe)], check=True)
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    f32 = float(subprocess.run([str(exe)], capture_output=True, text=True, check=True, env=env).stdout)
    amx = float(subprocess.run([str(exe), "amx"], capture_output=True, text=True, check=True, env=env).stdout)
    assert f32 > 0
    units = runtime.load().opgen_bf16_units()
    if units == 2:
        assert amx > 4 * f32, (amx, f32)  # (16 x 16 x 32 products per instruction)
    with open("/proc/cpuinfo") as f:
        has_amx = " amx_bf16 " in f.read().replace("\n", " ")
    if not has_amx:
        assert math.isnan(amx)


def test_the_table_notes_a_row_measured_in_a_copy_window(monkeypatch):
    """benchmarks/cpu.py's table notes the copy bandwidth a row's percentage was measured against
    where it is more than WINDOW from the run's first (the VM's fast copy windows), and only there."""
    monkeypatch.syspath_prepend(str(registry.REPO_ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("opgen_bench_cpu", registry.REPO_ROOT / "benchmarks" / "cpu.py")
    assert spec is not None and spec.loader is not None
    cpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cpu)
    row = {"ours_ms": 10.0, "torch_ms": 20.0, "bytes": 400_000_000, "given_ms": 8.0, "pct_copy": 50.0}
    rows = [dict(row, row="usual", copy_gbs=55.0), dict(row, row="fast", copy_gbs=100.0),
            dict(row, row="slow", copy_gbs=30.0)]
    lines = {ln.split(" | ")[0][2:]: ln for ln in cpu.table(rows, 52.0, None).splitlines()[2:]}
    assert "copy beside it" not in lines["usual"]
    assert "copy beside it 100 GB/s, 1.92x the run's first" in lines["fast"]
    assert "copy beside it 30 GB/s, 0.58x the run's first" in lines["slow"]
    assert all("| 50% |" in ln for ln in lines.values())  # (the percentage itself as measured)
