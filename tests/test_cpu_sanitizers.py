"""The CPU library under AddressSanitizer + UndefinedBehaviorSanitizer.

``opgen.compile.build_library(..., sanitize=True)`` builds build/cpu/libopgen_asan.so from
generated/cpu (incremental: the first build takes a couple of minutes, later ones seconds). A
Python subprocess with libasan and libubsan preloaded (LD_PRELOAD) and OPGEN_LIB pointing at it
then calls every op (tests/cpu_worker.py ``asan``: several dtype bindings each, empty tensors,
batch views, in-place, failing index-out-of-range calls) and checks the results against the
oracle. A positive control first proves that the set-up catches an out-of-bounds access made
inside the library. Nothing here is skipped: a missing sanitizer runtime is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opgen import compile as cc
from opgen import registry

REPO = registry.REPO_ROOT
BAD_MARKERS = ("ERROR: AddressSanitizer", "runtime error:", "ERROR: LeakSanitizer")


def _runtime_lib(name: str) -> str:
    r = subprocess.run([cc.compiler(), f"-print-file-name={name}"], capture_output=True, text=True,
                       check=True)
    path = r.stdout.strip()
    assert os.path.isabs(path) and os.path.exists(path), \
        f"{cc.compiler()} has no {name} (got {path!r}): install the gcc sanitizer runtimes"
    return path


def sanitizer_env(**extra: str) -> dict[str, str]:
    """The environment of a Python process that loads an ASan + UBSan instrumented library: the
    compiler's sanitizer runtimes preloaded, the first report fatal, no leak check; ``extra``
    added."""
    return {**os.environ, "LD_PRELOAD": f"{_runtime_lib('libasan.so')}:{_runtime_lib('libubsan.so')}",
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",
            "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1", **extra}


def assert_clean_under_sanitizers(built: dict[str, object], script: str) -> None:
    """Build the instrumented library of ops built by :func:`tests.ops_dirs.built_ops` and run
    ``script`` (Python; its first argument is that library's path) on 3 threads under the
    sanitizers: it must exit 0 after printing ``done``, with no sanitizer report."""
    out = Path(built["out"])  # type: ignore[arg-type]
    lib = cc.build_library(out / "cpu", out / "include", Path(built["root"]) / "asan",  # type: ignore[arg-type]
                           sanitize=True, verbose=False)
    r = subprocess.run([sys.executable, "-c", script, str(lib)], capture_output=True, text=True, timeout=600,
                       cwd=REPO, env=sanitizer_env(OMP_NUM_THREADS="3"))
    found = [m for m in BAD_MARKERS if m in r.stderr]
    assert r.returncode == 0 and r.stdout.strip() == "done" and not found, \
        f"rc={r.returncode}, {found}:\n{r.stderr[:6000]}"


@pytest.fixture(scope="module")
def asan_env() -> dict[str, str]:
    lib = cc.build_library(REPO / "generated" / "cpu", REPO / "generated" / "include", REPO / "build" / "cpu",
                           sanitize=True, verbose=False)
    assert lib.name == "libopgen_asan.so" and lib.exists()
    assert b"__asan_report" in lib.read_bytes(), f"{lib} is not instrumented"
    return sanitizer_env(OPGEN_LIB=str(lib), OMP_NUM_THREADS="3")


def _run(env: dict[str, str], args: list[str], timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


CONTROL = textwrap.dedent("""
    import numpy as np
    from opgen import runtime
    from tests.cpu_cases import c_call, set_shape
    assert "asan" in str(runtime.library_path())
    D, N = 1024, 17
    gx, gw = np.zeros((N, D), np.float32), np.zeros(D, np.float32)
    for _ in range(100):  # x's claimed extent must not cover an output (else: a clean "overlap")
        x = np.ones((N - 1, D), np.float32)
        lo, hi = x.ctypes.data, x.ctypes.data + N * D * 4
        if not any(lo < o.ctypes.data + o.nbytes and o.ctypes.data < hi for o in (gx, gw)):
            break
    a = {"grad_y": np.ones((N, D), np.float32), "x": x, "w": np.ones(D, np.float32),
         "grad_x": gx, "grad_w": gw}
    # x claims N rows but holds N - 1: the kernel reads one row past the end of its buffer
    print(c_call("rms_norm_backward", a, {"x": lambda desc, hold: set_shape(desc, hold, (N, D))}))
    print("not caught")
""")



def test_positive_control_catches_an_overflow_inside_the_library(asan_env):
    r = _run(asan_env, ["-c", CONTROL])
    assert r.returncode != 0 and "ERROR: AddressSanitizer" in r.stderr, \
        f"the sanitizer set-up did not catch a heap overflow:\nrc={r.returncode}\n{r.stdout}\n{r.stderr[:3000]}"
    # the report's stack runs through the library's own (instrumented, symbolized) code
    assert " in opgen_run " in r.stderr and "heap-buffer-overflow" in r.stderr, r.stderr[:3000]
    assert "not caught" not in r.stdout


def test_every_op_is_clean_under_asan_and_ubsan(asan_env):
    r = _run(asan_env, ["-m", "tests.cpu_worker", "asan"])
    found = [m for m in BAD_MARKERS if m in r.stderr]
    assert r.returncode == 0 and not found, \
        f"rc={r.returncode}, sanitizer reports {found}:\n{r.stdout[-2000:]}\n{r.stderr[:6000]}"
    assert "calls OK" in r.stdout, r.stdout


def test_sanitized_library_is_where_the_runtime_looks(asan_env):
    """opgen.runtime.library_path(sanitize=True) names the library this module builds."""
    from opgen import runtime

    saved = os.environ.pop("OPGEN_LIB", None)
    try:
        assert runtime.library_path(sanitize=True) == Path(asan_env["OPGEN_LIB"])
    finally:
        if saved is not None:
            os.environ["OPGEN_LIB"] = saved
