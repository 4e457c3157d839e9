"""Timing helpers shared by the benchmark scripts (benchmarks/cpu.py, benchmarks/newops.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


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
    of COPY_BYTES (or of ``nbytes`` / 2 when larger: arrays the caches cannot hold), the faster
    of numpy's (one thread) and PyTorch's ``copy_`` (its threads), timed alternately with
    ``call`` (the median, as the call's): this VM's host lends it 41-78 GB/s, switching within
    seconds, so a copy timed once at the start of a run did not describe its later rows;
    ``pct_copy``: the median over the repetitions of the call's bandwidth (``nbytes`` per call)
    as a percentage of the copy's timed right after it (the same window of the host's, where
    the two medians may come from different windows)."""
    half = max(COPY_BYTES, nbytes // 8 * 4)
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
    """A copy of ``nbytes`` (a multiple of 4) between two arrays made here: each call returns the
    seconds of the faster of numpy's copy (one thread) and PyTorch's ``copy_`` (its threads)."""
    import numpy as np
    import torch

    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    ts, td = torch.from_numpy(src), torch.from_numpy(dst)
    return lambda: min(timed(lambda: np.copyto(dst, src)), timed(lambda: td.copy_(ts)))
