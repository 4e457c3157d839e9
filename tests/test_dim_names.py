"""An op's dims and arguments may have any names: no target reads meaning into them.

The ops below are the shapes of schedule every target has (elementwise, a row sum, a row vector
with a column sum, a scatter-add) written with dims named ``R``, ``C``, ``W`` and ``CC`` — the
names the tile level once gave its own row-tile, chunk, workspace and column-chunk dims — and
never ``N`` or ``D``, the seed ops' names (the TT-Metal target once sized its row walk by a dim
named ``N`` and its columns by one named ``D``: ops with other dims got their first row tile
computed and the rest left unwritten; a dim named ``C`` stopped its lowering with a KeyError).
Each runs on the CPU library, the CPU model of CUDA, the Ascend C model and the TT-Metal model
against the oracle; so does an op whose tensors are named ``cores`` and ``int``, its scalar
``mesh``, its output ``program`` and a dim ``rows`` (the TT-Metal host and kernels once used the
op's names as they were, beside their own ``cores``, ``program``, ``mesh`` and ``rows``). And a dim
whose name is not an identifier is refused by the DSL.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opgen import oracle, runtime
from opgen.dsl import DSLError, dims
from tests import ttmetal_runner as tt_runner
from tests.ascendc_model import build as ascend_model
from tests.cpu_cases import assert_c_close, copied, filled, floats
from tests.cuda_emu import emu_build, emu_worker
from tests.ops_dirs import built_ops
from tests.ttmetal_model import build as tt_model

REPO = Path(__file__).resolve().parent.parent

OPS = '''
from opgen.dsl import *

R, C, W, CC, rows = dims("R C W CC rows")
T = dtype_var("T", bf16, f32)


@op
def named_silu_backward(grad: Tensor[T, Batch(R), C], x: Tensor[T, Batch(R), C], *, dx: Output[T, Batch(R), C]):
    """d/dx of x * sigmoid(x), on dims R and C."""
    s = sigmoid(x)
    return {"dx": grad * s * (1 + x * (1 - s))}


@op
def named_softmax_backward(grad: Tensor[T, W, C], y: Tensor[T, W, C], *, dx: Output[T, W, C]):
    """dx = y * (g - sum(g * y)) along the last dim, on dims W and C."""
    return {"dx": y * (grad - sum(grad * y, axis=-1, keepdims=True))}


@op
def named_scaled_colsum(x: Tensor[T, CC, C], w: Tensor[f32, C], *, y: Output[T, CC, C], cs: Output[f32, C]):
    """x scaled by a row vector, and the column sums of its squares, on dims CC and C."""
    xf = cast(x, f32)
    return {"y": xf * w[None, :], "cs": sum(xf * xf, axis=0)}


@op
def named_scatter_rows(grad: Tensor[T, R, C], idx: Tensor[i32, R], num_rows: W, *, out: Output[T, W, C]):
    """out = 0; out[idx[r]] += grad[r] (rows of C columns into a table of W rows)."""
    return {"out": scatter_add(grad, cast(idx, i64), W)}


@op
def named_odd_args(cores: Tensor[T, rows, C], int: Tensor[T, rows, C], mesh: float = 2.0, *,
                   program: Output[T, rows, C]):
    """A softmax backward whose tensors and scalar are named like the targets' own names (the
    TT-Metal host's core set, program and device, a C++ keyword) on a dim named like a tiling
    parameter."""
    return {"program": int * (cores - sum(cores * int, axis=-1, keepdims=True)) * mesh}
'''

#: (rows, columns) of each case: rows not a multiple of 32, rows longer than a resident tile
SHAPES = ((45, 77), (70, 300), (3, 3000))
TABLE_ROWS = 13


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    """(case, op, arguments) of every op, f32 and bf16, each shape (outputs pre-filled)."""
    rng = np.random.default_rng(17)
    out = []
    for T in ("f32", "bf16"):
        for r, c in SHAPES:
            tag = f"{T}-{r}x{c}"
            g, x = floats(rng, (r, c), T), floats(rng, (r, c), T)
            out.append((f"silu-{tag}", "named_silu_backward", {"grad": g, "x": x, "dx": filled((r, c), T)}))
            out.append((f"softmax-{tag}", "named_softmax_backward", {"grad": g, "y": x, "dx": filled((r, c), T)}))
            out.append((f"colsum-{tag}", "named_scaled_colsum", {"x": x, "w": floats(rng, c, "f32"),
                                                                  "y": filled((r, c), T), "cs": filled(c, "f32")}))
            idx = rng.integers(0, TABLE_ROWS, r).astype(np.int32)
            out.append((f"scatter-{tag}", "named_scatter_rows", {"grad": g, "idx": idx, "num_rows": TABLE_ROWS,
                                                                 "out": filled((TABLE_ROWS, c), T)}))
            out.append((f"odd-{tag}", "named_odd_args", {"cores": g, "int": x, "mesh": 0.5,
                                                         "program": filled((r, c), T)}))
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("dimnames"), "opgen_test_dim_names", {"named.py": OPS}) as b:
        yield b


def _against_oracle(built: dict, call: Any) -> None:
    """Every case through ``call(op, args) -> outputs`` against the oracle."""
    failures = []
    for name, op, args in _cases():
        ref = oracle.run(built["ops"][op], **copied(args))
        got = call(op, copied(args))
        for k, v in ref.items():
            try:
                assert_c_close(np.asarray(got[k]), v, f"{name}.{k}")
            except AssertionError as e:
                failures.append(str(e))
    assert not failures, "\n".join(failures)


def test_cpu_library(built):
    _against_oracle(built, lambda op, a: runtime.call(op, lib=built["lib"], **a))


@pytest.mark.skipif(emu_build.cxx() is None, reason="no g++ for the CPU model of CUDA")
def test_cuda_on_the_cpu_model(built):
    out: Path = built["out"]
    sources = {str(p.relative_to(out)): p.read_text() for p in out.rglob("*") if p.is_file()}
    lib = emu_worker.load(emu_build.build(sources, built["root"] / "emu"))
    _against_oracle(built, lambda op, a: runtime.call(op, lib=lib, **a))


def test_ascend_c_on_the_model(built, tmp_path):
    gen: Path = built["out"]
    sources = {p.name: p.read_text() for p in (gen / "ascendc").iterdir() if p.is_file()}
    lib = ascend_model.build(sources, built["root"] / "ascend", include_dirs=[gen / "include"])
    cases_file, out_file = tmp_path / "cases.pkl", tmp_path / "out.npz"
    cases_file.write_bytes(pickle.dumps(_cases()))
    env = dict(os.environ, OPGEN_ASCEND_AIV_CORES="8")  # (OPGEN_OPS_DIR: set by the fixture)
    r = subprocess.run([sys.executable, "-m", "tests.ascendc_worker", str(lib), str(cases_file), str(out_file)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    # (the worker checks each case against the oracle and prints a line per failure)
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
    assert f"{len(_cases())} case(s), 0 failure(s)" in r.stdout, r.stdout[-6000:]


@pytest.mark.skipif(tt_model.cxx() is None, reason="no g++ for the TT-Metal model")
def test_ttmetal_on_the_model(built, tmp_path):
    exes = {}
    for o in built["ops"].values():
        tt_runner.register(o)
        exes[o.name] = tt_runner.build(o.name, built["root"] / "tt" / o.name)

    def call(op: str, a: dict[str, Any]) -> dict[str, np.ndarray]:
        proc, outs = tt_runner.run(exes[op], op, a, tmp_path / f"{op}-{len(list(tmp_path.iterdir()))}", grid=(8, 8))
        assert proc.returncode == 0, f"{op}: {proc.stderr[-3000:]}"
        return outs

    _against_oracle(built, call)


@pytest.mark.skipif(not tt_runner.CHECKER.is_file() or shutil.which("bash") is None,
                    reason="tt-kernel-check not available")
def test_ttmetal_kernels_pass_the_real_header_check(built):
    """The TT-Metal kernels of these ops (their names prefixed in C++: a tensor ``int``, a dim
    ``rows``) through tt-kernel-check --werror against the real tt-metal headers."""
    for o in built["ops"].values():
        tt_runner.register(o)
    tt_runner.check_headers(list(built["ops"]), built["root"] / "tt-check")


@pytest.mark.parametrize("names", ["N 2D", "a.b", "N-1"])
def test_a_dim_name_must_be_an_identifier(names):
    with pytest.raises(DSLError, match="must be an identifier"):
        dims(names)
