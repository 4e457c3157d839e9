"""Matmul chains on the Ascend C target (opgen/tile/chain.py): ops whose outputs are ``G @ C`` and
``G^T @ D`` of an elementwise ``G`` (with or without a recomputed product ``A B^T`` under it) get
MIX kernels — products on the cube unit through the Matmul API, G and the accumulation on the
vector unit — that run on the CPU model of Ascend C (its Matmul API enforces the registration
order, the tiling's bounds, no float atomics, MIX launches) against the oracle, bitwise identical
for 1, 3 and 48 vector cores. Two ops written in their own ops directory: the backward of
``sigmoid(x w^T)`` (a recomputed product) and of ``(x w^T) * s`` (G from inputs only).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from opgen import registry
from tests.ascendc_model import build as model
from tests.cpu_cases import filled, floats
from tests.test_ascendc import _bitwise_across_cores, _library

REPO = registry.REPO_ROOT
OUT = REPO / "build" / "ascendc-model"
pytestmark = pytest.mark.skipif(model.cxx() is None, reason="no g++: the Ascend C model cannot be built")

CHAIN_OPS = '''
from opgen.dsl import *

M, N, K = dims("M N K")
T = dtype_var("T", f16, bf16, f32)


@op
def sigmoid_linear_backward(x: Tensor[T, M, K], w: Tensor[T, N, K], gy: Tensor[f32, M, N], *,
                            dx: Output[T, M, K], dw: Output[T, N, K]):
    """Gradients of y = sigmoid(x w^T) for an upstream gy."""
    s = sigmoid(x @ w.T)
    dz = gy * s * (1 - s)
    return {"dx": dz @ w, "dw": dz.T @ x}


@op
def scaled_linear_backward(gy: Tensor[T, M, N], s: Tensor[f32, N], x: Tensor[T, M, K], w: Tensor[T, N, K], *,
                           dx: Output[T, M, K], dw: Output[T, N, K]):
    """Gradients of y = (x w^T) * s (a per-column scale) for an upstream gy."""
    dz = gy * s[None, :]
    return {"dx": dz @ w, "dw": dz.T @ x}
'''


@pytest.fixture(scope="module")
def chain_ops(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(library, environment, generated tree) of the two chain ops, from their own ops directory."""
    root = tmp_path_factory.mktemp("ascendc-chain")
    ops = root / "opgen_test_ascendc_chain_ops"
    ops.mkdir()
    (ops / "chain.py").write_text(CHAIN_OPS)
    env = dict(os.environ, OPGEN_OPS_DIR=str(ops))
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--out", str(root / "generated"), "-q"],
                       cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return _library(root / "generated", OUT / "chain-ops"), env, root / "generated"


# (M, N, K): one and several blocks of 128 rows, several spans of 2,048 (N in the row pass, M in
# the column pass), partial blocks and spans, empty dims
SHAPES = ((5, 7, 9), (130, 300, 70), (1, 1, 1), (257, 129, 33), (0, 5, 8), (4, 0, 8), (3, 4, 0), (2100, 20, 8),
          (5, 4200, 8))


def _cases() -> list[tuple[str, str, dict[str, Any]]]:
    rng = np.random.default_rng(11)
    cases = []
    for T in ("f32", "f16", "bf16"):
        for m, n, k in SHAPES:
            tag = f"{T}-{m}x{n}x{k}"
            outs = {"dx": filled((m, k), T), "dw": filled((n, k), T)}
            cases.append((f"sig-{tag}", "sigmoid_linear_backward",
                          {"x": floats(rng, (m, k), T, 0.3), "w": floats(rng, (n, k), T, 0.3),
                           "gy": floats(rng, (m, n), "f32"), **outs}))
            cases.append((f"scaled-{tag}", "scaled_linear_backward",
                          {"gy": floats(rng, (m, n), T), "s": floats(rng, n, "f32"), "x": floats(rng, (m, k), T),
                           "w": floats(rng, (n, k), T), **{k_: v.copy() for k_, v in outs.items()}}))
    return cases


def test_matmul_chains_on_the_model(chain_ops, tmp_path):
    lib, env, _ = chain_ops
    _bitwise_across_cores(lib, _cases(), tmp_path, env)


def test_chain_kernels_are_mix_kernels_of_the_matmul_api(chain_ops):
    """What the generated source says: a MIX kernel (KERNEL_TYPE_MIX_AIC_1_2), Matmul objects
    registered before any buffer, products from global memory, the system workspace set, and the
    host's tiling from the Matmul tiling API."""
    gen = chain_ops[2] / "ascendc"
    src = {p.name: p.read_text() for p in gen.iterdir()}
    kern = src["sigmoid_linear_backward_kernel.cpp"]
    host = src["sigmoid_linear_backward_host.cpp"]
    for body in kern.split('extern "C" __global__ __aicore__ void ')[1:]:
        assert body.count("KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);") == 1
        assert body.index("REGIST_MATMUL_OBJ(&pipe, GetSysWorkSpacePtr(), mm_p, &tl.mm_p, mm_0, &tl.mm_0);") \
            < body.index("pipe.InitBuffer")
        assert "SetSysWorkspace(p_workspace);" in body and "GetBlockNum() * GetTaskRation()" in body
        assert ".IterateAll(" in body and "SetAtomicAdd" not in body
    assert host.count("matmul_tiling::MatmulApiTiling mt(") == 12  # 2 products x 2 passes x 3 dtypes
    assert "GetTiling(tl->mm_p) == -1" in host


def test_static_report_of_a_chain(op_files):
    """At an LLM-head size (M = 8,192 rows, N = 32,000, K = 4,096) every kernel's tiling holds:
    the unified buffer within its capacity, all 48 vector cores busy, and a workspace of a few
    blocks per core whatever M and N — G (M x N) never exists in global memory."""
    from opgen.passes import pipeline
    from opgen.tile import dialect as tdl
    from opgen.tile import report

    ops = op_files({"chain.py": CHAIN_OPS})
    plat = {"cores": 48, "ub_bytes": 196608}
    dims = {"M": 8192, "N": 32000, "K": 4096}
    for name in ("sigmoid_linear_backward", "scaled_linear_backward"):
        m = ops[name].module()
        pipeline.run(m, "ascendc")
        ks = [k for k in m.body.block.ops if isinstance(k, tdl.KernelOp)]
        rs = report.chosen(ks, dims, plat, traffic=False)
        assert len(rs) == 6, rs  # 3 dtypes x 2 passes
        for r in rs:
            assert r.failed is None and r.ub_used <= r.ub_capacity and r.cores == 48, r
            big = report.chosen([k for k in ks if k.sym_name.data == r.kernel],
                                {"M": 65536, "N": 256000, "K": 4096}, plat, traffic=False)[0]
            assert big.params["ws_bytes"] == r.params["ws_bytes"] < dims["M"] * dims["N"] * 4 // 2, r.params
