"""The CPU runtime's packed f32 GEMM (generated/cpu/opgen_rt.c: opgen_sgemm, opgen_sgemm_par)
driven directly (tests/c/gemm_check.c) on shapes around its blocking — partial MR-row panels and
NR-column panels, several row blocks and OPGEN_NC column blocks, k within one OPGEN_KC block and
across several, k = 0, transposed (strided) operands, accumulation, a padded leading dimension:

* against float64 matmul (an independent reference) within f32 accumulation error;
* bitwise the same built for AVX-512 (the 14x32 intrinsics kernel) and without it (the 8x32
  auto-vectorised kernel), single-threaded and on 1 and 3 OpenMP threads: the k order is fixed
  (blocks of ``GEMM_KC``), whatever the tiles, the instruction set or the threads;
* the padding columns of C are never written."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from opgen.compile import CFLAGS, compiler
from opgen.lower.sched import GEMM_KC

C_SRC = Path(__file__).parent / "c" / "gemm_check.c"
GEN = registry.REPO_ROOT / "generated"
AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False

# (m, n, k): one partial panel; a block and a half of rows (OPGEN_MC = 18 panels of 14) with n past
# a column block (OPGEN_NC = 1024); k across three GEMM_KC blocks with a remainder; k = 0; a vector
SHAPES = [(13, 31, 7), (14 * 27 + 5, 1024 + 40, 2 * GEMM_KC + 9), (29, 65, GEMM_KC), (5, 9, 0), (1, 33, 300),
          (300, 1, 70)]


@pytest.fixture(scope="module")
def drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The driver linked with the runtime built natively and (on AVX-512 machines) without AVX-512."""
    out = tmp_path_factory.mktemp("gemm")
    flags = [f for f in CFLAGS if f != "-fPIC"]
    variants = {"native": []}
    if AVX512:
        variants["no-avx512"] = ["-mno-avx512f"]
    exes = {}
    for name, extra in variants.items():
        exe = out / f"gemm_check_{name}"
        r = subprocess.run([compiler(), *flags, *extra, f"-I{GEN / 'include'}", f"-I{GEN / 'cpu'}", str(C_SRC),
                            str(GEN / "cpu" / "opgen_rt.c"), "-o", str(exe), "-lm"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        exes[name] = exe
    return exes


def run(exe: Path, tmp: Path, a: np.ndarray, b: np.ndarray, c: np.ndarray, m: int, n: int, k: int, ta: int,
        tb: int, acc: int, pad: int, par: int, threads: str = "1") -> np.ndarray:
    src, dst = tmp / "in.bin", tmp / f"out-{exe.name}-{par}-{threads}.bin"
    np.concatenate([a.ravel(), b.ravel(), c.ravel()]).astype(np.float32).tofile(src)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "OMP_DYNAMIC": "false"}
    r = subprocess.run([str(exe), str(src), str(dst), *map(str, (m, n, k, ta, tb, acc, pad, par))],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return np.fromfile(dst, dtype=np.float32).reshape(m, n + pad)


@pytest.mark.parametrize(("m", "n", "k"), SHAPES)
def test_gemm_against_float64_and_bitwise_on_every_path(drivers, tmp_path, m, n, k):
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    for ta, tb, acc, pad in ((0, 0, 0, 0), (1, 1, 1, 3), (0, 1, 1, 0), (1, 0, 0, 5)):
        a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
        b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
        c = rng.standard_normal((m, n + pad)).astype(np.float32)
        opa = (a.T if ta else a).astype(np.float64)
        opb = (b.T if tb else b).astype(np.float64)
        want = opa @ opb + (c[:, :n].astype(np.float64) if acc else 0.0)
        results = []
        for exe in drivers.values():
            results.append(run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 0))
            for threads in ("1", "3"):
                results.append(run(exe, tmp_path, a, b, c, m, n, k, ta, tb, acc, pad, 1, threads))
        got = results[0]
        bound = 4e-7 * (np.abs(opa) @ np.abs(opb) + (np.abs(c[:, :n]) if acc else 0.0)) * (k + 2) + 1e-30
        assert np.all(np.abs(got[:, :n].astype(np.float64) - want) <= bound), (ta, tb, acc, pad)
        assert np.array_equal(got[:, n:], c[:, n:]), "the padding columns of C were written"
        for other in results[1:]:
            assert np.array_equal(other.view(np.uint32), got.view(np.uint32)), \
                f"not bitwise the same on every path ({list(drivers)}, 1 and 3 threads): {(ta, tb, acc, pad)}"
