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


def given_ms(call: Callable[[], object], reps: int = 5) -> float:
    """Median ms of ``call`` with its outputs passed in and already written once (the kernel
    without the operating system's zeroing of fresh output pages)."""
    call()
    return statistics.median(timed(call) for _ in range(reps)) * 1e3
