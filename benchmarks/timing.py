"""Timing helpers shared by the benchmark scripts (benchmarks/cpu.py, benchmarks/newops.py)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def best_of(fn: Callable[[], object], n: int) -> float:
    """The fewest seconds of ``n`` timed calls of ``fn``, after an untimed one."""
    fn()
    return min(timed(fn) for _ in range(n))


def alternate(ours: Callable[[], object], theirs: Callable[[], object], reps: int) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``theirs``, called alternately ``reps`` times after a warm-up
    of three calls each (a process's first large allocations fault in pages the VM host has not
    backed yet: ten times slower for the first few calls of the first row, whichever side)."""
    for _ in range(3):
        ours(), theirs()
    a, b = [], []
    for _ in range(reps):
        a.append(timed(ours))
        b.append(timed(theirs))
    return statistics.median(a), statistics.median(b)


#: bytes copied by the copy-bandwidth reference (each of source and destination)
COPY_BYTES = 256 << 20


def given_ms(call: Callable[[], object], nbytes: int, reps: int = 15) -> dict[str, float]:
    """``given_ms``: the median ms of ``call`` with its outputs passed in and already written once
    (the kernel without the operating system's zeroing of fresh output pages; each timed call
    right after an untimed one, as each timed copy: neither pays for the other's dirty cache
    lines); ``copy_gbs``: the copy bandwidth (bytes read + written per second, GB/s) of a copy
    of COPY_BYTES (or of ``nbytes`` / 2 when larger: arrays the caches cannot hold), the fastest
    of numpy's, PyTorch's and a streaming-store copy (``copier``), timed alternately with
    ``call`` (the median, as the call's): this VM's host lends it 41-78 GB/s, switching within
    seconds, so a copy timed once at the start of a run did not describe its later rows;
    ``pct_copy``: the median over the repetitions of the call's bandwidth (``nbytes`` per call)
    as a percentage of the copy's timed right after it (the same window of the host's, where
    the two medians may come from different windows)."""
    half = max(COPY_BYTES, nbytes // 128 * 64)
    copy = copier(half)
    mine, copies = [], []
    for _ in range(reps):
        call()  # (each timed call after an untimed one of itself: not right after the other's
        mine.append(timed(call))  # 256 MiB of stores, which cost the kernel after them 5-20%)
        copy()
        copies.append(copy())
    pct = statistics.median(100 * nbytes * c / (2 * half * t) for t, c in zip(mine, copies, strict=True))
    return {"given_ms": statistics.median(mine) * 1e3, "copy_gbs": 2 * half / statistics.median(copies) / 1e9,
            "pct_copy": pct}


def copier(nbytes: int) -> Callable[[], float]:
    """A copy of ``nbytes`` (a multiple of 64) between two 64-byte aligned arrays made here: each
    call returns the seconds of the fastest of numpy's copy (one thread), PyTorch's ``copy_``
    (its threads) and a copy with streaming stores on the OpenMP threads (benchmarks/stream_copy.c,
    compiled on first use; skipped without a C compiler): the first two read each destination line
    before writing it, uncounted traffic the third avoids (it moved 55-65 GB/s where they moved
    40-45 on the Zen 5 VM)."""
    import ctypes

    import numpy as np
    import torch

    from opgen.binding import aligned_zeros

    src = aligned_zeros((nbytes // 4,), np.float32, align=64)
    src[:] = 1
    dst = aligned_zeros((nbytes // 4,), np.float32, align=64)
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    lib = _stream_copy_lib()
    copies = [lambda: np.copyto(dst, src), lambda: td.copy_(ts)]
    if lib is not None:
        s, d, n = ctypes.c_void_p(src.ctypes.data), ctypes.c_void_p(dst.ctypes.data), ctypes.c_size_t(nbytes // 64 * 64)
        copies.append(lambda: lib.stream_copy(s, d, n))
    return lambda: min(timed(c) for c in copies)


def reader(nbytes: int) -> Callable[[], float]:
    """A read of ``nbytes`` (a multiple of 64) from a 64-byte aligned array made here: each call
    returns the seconds of the fastest of benchmarks/stream_read (the OpenMP threads, 8 streams
    each) and PyTorch's ``sum`` (its threads). The ceiling of a pass that only reads: on the Zen 5
    VM 70-75% of the copy's bandwidth (bytes read + written) of :func:`copier`."""
    import ctypes

    import numpy as np
    import torch

    from opgen.binding import aligned_zeros

    src = aligned_zeros((nbytes // 4,), np.float32, align=64)
    src[:] = 1
    ts = torch.from_numpy(src)
    reads = [lambda: ts.sum()]
    lib = _stream_copy_lib()
    if lib is not None:
        s, n = ctypes.c_void_p(src.ctypes.data), ctypes.c_size_t(nbytes // 64 * 64)
        reads.append(lambda: lib.stream_read(s, n))
    return lambda: min(timed(r) for r in reads)


@functools.cache
def _stream_copy_lib() -> object | None:
    """benchmarks/stream_copy.c as a shared library (compiled once per process), or None when no
    C compiler builds it."""
    import ctypes
    import os
    import subprocess
    import tempfile

    from opgen import compile as cc

    so = os.path.join(tempfile.mkdtemp(), "stream_copy.so")
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stream_copy.c")
    try:
        r = subprocess.run([cc.compiler(), "-O2", "-march=native", "-fopenmp", "-shared", "-fPIC", src, "-o", so],
                           capture_output=True, text=True)
    except (OSError, cc.CompileError):
        return None
    if r.returncode != 0:
        return None
    lib = ctypes.CDLL(so)
    lib.stream_read.restype = ctypes.c_double
    return lib
