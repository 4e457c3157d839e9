"""Hypothesis fuzzing of every C ABI of every op against the numpy oracle, under ASan + UBSan.

Targets (``python -m tests.fuzz_worker list``): the plain ABI ``opgen_<op>`` of every op and every
infiniop / aclnn facade an op declares (EmbeddingBackward, RMSNormBackward; EmbeddingDenseBackward,
FusedLinearCrossEntropyLossGrad). Each target is fuzzed in its own subprocess with the sanitized
library (``build_library(..., sanitize=True)``, libasan + libubsan preloaded, ``$OPGEN_LIB``: the
set-up of tests/test_cpu_sanitizers.py); a sanitizer report or a crash fails the target, and the
case being called when it happened is printed.

One example (tests/fuzz_worker.py ``cases``) draws:

- a dtype binding of the op's signature; dims with 0, 1 and small odd sizes first, now and then
  larger ones (several threads, FLCE row / vocab tiles); values from the builders of
  tests/cpu_cases.py; attributes, NaN / Inf / huge / negative ones included (alpha, eps, uint64
  paddingIdx, infiniop ``char`` flags other than 0/1);
- a memory layout for every tensor, each in its own buffer surrounded by a byte pattern: permuted
  axes, gapped strides, reversed axes (negative strides), for inputs also broadcast (stride 0) and
  overlapping strides, infiniop NULL strides for contiguous tensors; RMSNorm's grad_x in place
  over grad_y (its declared alias);
- NaN / +-Inf at random positions of float data;
- the workspace: NULL with size 0 (the library allocates), exactly or more than the reported size,
  at any byte offset;
- at most one fault (see ``fuzz_worker.FAULTS``): an out-of-range index (NaN / Inf for float
  indices); a dtype outside the declared set or mismatching its dtype variable; a dtype code the
  ABI can carry but opgen does not know; a wrong dim / rank; a required tensor missing; NULL data
  of a non-empty tensor; a data pointer not aligned to its element size; a last dim that must be
  contiguous and is not; an output that is broadcast or whose elements overlap; an output
  overlapping another tensor; a bad attribute (alpha2 without i2, negative or mismatching
  numWeights, labelSmoothing != 0, V < 128); Python ints out of range for an int64 attribute
  (``runtime.call``); numWeights 2**62 / INT64_MAX; an aclTensor storage offset of -1 / 2**62; a
  workspace one byte too small, NULL with a non-zero size, or non-NULL with size 0.

Every call must either succeed with every output the oracle writes within the C-vs-oracle
tolerance of tests/cpu_cases.py (``assert_c_close``: NaN / Inf positions exact), inputs
byte-identical and not one byte of any buffer written outside the outputs' elements; or fail
with the status the oracle / binding gives for the same arguments (faults the oracle cannot see:
the documented status) mapped to the ABI's code (``runtime.STATUS``; the facades' generated status
tables), with every buffer byte-identical.

Bounds: ``OPGEN_FUZZ_EXAMPLES`` examples per target (default 200: with every target passing the
file takes about 70 s on two cores once build/cpu/libopgen_asan.so is built; a failing target
adds its shrinking), ``derandomize=True``, so a CI run draws the same examples every time; no
example database. Longer local runs with fresh examples::

    OPGEN_FUZZ_RANDOM=1 OPGEN_FUZZ_EXAMPLES=2000 python -m pytest -m fuzz tests/test_fuzz_abi.py

(``OPGEN_FUZZ_SEED=<n>`` fixes a random run; ``OPGEN_FUZZ_FAULTS=index,shape`` draws only those
faults; ``python -m tests.fuzz_worker replay TARGET 'SPEC'`` re-runs a printed falsifying example.)
``-m "not fuzz"`` deselects this module.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from opgen.abi import Aclnn, Infiniop
from tests import fuzz_worker as fw
from tests.conftest import SEED_OPS
from tests.test_cpu_sanitizers import BAD_MARKERS, asan_env  # noqa: F401 (asan_env: a fixture)

pytestmark = pytest.mark.fuzz

DEFAULT_EXAMPLES = "200"
TIMEOUT = 900


def test_every_c_abi_of_every_seed_op_is_a_target():
    names = {t.name for t in fw.targets()}
    want = {f"plain:{op}" for op in SEED_OPS}
    for op in SEED_OPS:
        want |= {f"{f.kind}:{f.name}" for f in registry.get(op).abis if isinstance(f, (Infiniop, Aclnn))}
    assert want <= names
    assert {"infiniop:EmbeddingBackward", "infiniop:RMSNormBackward", "aclnn:EmbeddingDenseBackward",
            "aclnn:FusedLinearCrossEntropyLossGrad"} <= names


# ------------------------------------------------------------------ the checker catches what it must

CONTROL_SPEC = {  # rms_norm_backward, f32, (3, 5) with gapped rows, a valid call
    "b": {"seed": 3, "T": "f32", "lead": (3,), "D": 5, "eps": 1e-3}, "fault": None, "inject": [],
    "ws": ["exact", 0, 0],
    "layouts": {n: {"perm": list(range(r)), "mul": [1] * r, "add": [2] * (r - 1) + [0], "neg": [False] * r}
                for n, r in (("grad_y", 2), ("x", 2), ("w", 1), ("grad_x", 2), ("grad_w", 1))},
}


def _tampered_call(monkeypatch, how):
    """The plain-ABI call of the worker, followed by ``how(case)`` (a simulated library bug)."""
    real = fw.CALL["plain"]

    def call(case):
        got = real(case)
        return how(case, got)

    monkeypatch.setitem(fw.CALL, "plain", call)


def test_checker_accepts_a_valid_call():
    fw.run_case(fw.target("plain:rms_norm_backward"), CONTROL_SPEC)


@pytest.mark.parametrize("bug", ["gap_byte", "wrong_value", "nan_lost", "wrong_status", "input_written",
                                 "write_on_failure"])
def test_checker_catches_a_misbehaving_library(monkeypatch, bug):
    """Positive controls: each simulated defect (after a real call) must fail the check."""
    spec = CONTROL_SPEC
    if bug == "write_on_failure":
        spec = {**CONTROL_SPEC, "fault": ["shape", "w", "grow", 0]}

    def how(case, got):
        gx = case.args["grad_x"]
        if bug == "gap_byte":  # one byte between two rows of grad_x
            root = case.bufs["grad_x"].root
            root[gx.ctypes.data - root.ctypes.data + gx.strides[0] - 1] ^= 1
        elif bug == "wrong_value":
            gx[1, 2] = gx[1, 2] * np.float32(1.001) + np.float32(1e-3)
        elif bug == "nan_lost":
            case.args["grad_w"][0] = 0.0 if np.isnan(case.args["grad_w"][0]) else np.nan
        elif bug == "input_written":
            case.args["x"][0, 0] += 1
        elif bug == "write_on_failure":
            gx[0, 0] = 1.0
        return (5, "simulated") if bug == "wrong_status" else got

    _tampered_call(monkeypatch, how)
    with pytest.raises(AssertionError):
        fw.run_case(fw.target("plain:rms_norm_backward"), spec)


# ------------------------------------------------------------------ the fuzzing, under the sanitizers


@pytest.mark.parametrize("target", [t.name for t in fw.targets()])
def test_fuzz_c_abi_under_asan_ubsan(asan_env, target, tmp_path):  # noqa: F811
    env = {**asan_env, "OPGEN_FUZZ_EXAMPLES": os.environ.get("OPGEN_FUZZ_EXAMPLES", DEFAULT_EXAMPLES)}
    last = tmp_path / "last_case.txt"
    r = subprocess.run([sys.executable, "-m", "tests.fuzz_worker", target, str(last)], cwd=registry.REPO_ROOT,
                       env=env, capture_output=True, text=True, timeout=TIMEOUT)
    found = [m for m in BAD_MARKERS if m in r.stderr]
    where = last.read_text() if last.exists() else "(none)"
    clean = r.returncode == 0 and not found
    assert clean, (
        f"{target}: rc={r.returncode}, sanitizer reports {found}\n--- case being called last:\n{where}\n"
        f"--- stdout (tail):\n{r.stdout[-6000:]}\n--- stderr:\n{r.stderr[:12000]}")
    assert f"{target}: " in r.stdout and " examples OK" in r.stdout, r.stdout[-2000:]


def test_worker_module_is_importable_without_torch():
    """The plain targets run with no torch in the process (only the facade wrappers bring it in)."""
    code = "import sys, tests.fuzz_worker; assert 'torch' not in sys.modules"
    r = subprocess.run([sys.executable, "-c", code], cwd=Path(registry.REPO_ROOT), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
