"""SPEC §0 determinism of the compiled CPU library: every op (bf16 and f32 where the op has them,
many duplicate indices, sizes that split over several threads: V=50, N=4000, D=64; rms 512x1024;
FLCE BT=200, H=64, V=600) gives bitwise identical outputs run after run and for
OMP_NUM_THREADS = 1, 2 and 3. Each run is a fresh process (tests/cpu_worker.py ``det``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from tests.cpu_cases import assert_c_close, bf16_products, oracle_outputs
from tests.cpu_worker import DET_CASES

THREADS = (1, 2, 3)
REPEATS = 2


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[int, int], Path]:
    """Output folder of each (threads, repeat) run; the runs go two at a time."""
    base = tmp_path_factory.mktemp("det")
    todo = [(t, k) for t in THREADS for k in range(REPEATS)]
    out: dict[tuple[int, int], Path] = {}
    for i in range(0, len(todo), 2):  # two at a time
        procs = []
        for t, k in todo[i:i + 2]:
            d = base / f"t{t}-r{k}"
            env = {**os.environ, "OMP_NUM_THREADS": str(t), "OMP_DYNAMIC": "false"}
            cmd = [sys.executable, "-m", "tests.cpu_worker", "det", str(d)]
            procs.append(((t, k), d, subprocess.Popen(cmd, cwd=registry.REPO_ROOT, env=env, text=True,
                                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
        for key, d, p in procs:
            so, se = p.communicate(timeout=300)
            assert p.returncode == 0, f"worker {key} failed:\n{so}\n{se}"
            out[key] = d
    return out


def test_thread_counts_took_effect(runs):
    for (t, _), d in runs.items():
        assert (d / "threads.txt").read_text() == str(t)


@pytest.mark.parametrize("case", list(DET_CASES))
def test_bitwise_identical_across_runs_and_threads(runs, case):
    ref_dir = runs[(1, 0)]
    files = sorted(p.name for p in ref_dir.glob(f"{case}.*.npy"))
    assert files, f"{case}: no outputs saved"
    for key, d in runs.items():
        for f in files:
            a, b = np.load(ref_dir / f), np.load(d / f)
            if not np.array_equal(a, b):
                n = int(np.count_nonzero(a != b))
                raise AssertionError(f"{f}: threads={key[0]} run {key[1]} differs from threads=1 run 0 "
                                     f"in {n} of {a.size} bytes")


@pytest.mark.parametrize("case", list(DET_CASES))
def test_saved_results_match_the_oracle(runs, case):
    """The (identical) results are also right."""
    op, build = DET_CASES[case]
    args = build()
    ref = oracle_outputs(op, args)
    for k, v in ref.items():
        raw = np.load(runs[(3, 1)] / f"{case}.{k}.npy")
        got = raw.view(v.dtype).reshape(v.shape)
        assert_c_close(got, v, f"{case}.{k}", bf16_products(op))
