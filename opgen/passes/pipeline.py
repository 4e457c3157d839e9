"""The pass pipeline of every target, in one place.

A pipeline is a list of named stages; each stage is an xDSL ``ModulePass``. ``opgen show OP
--stage NAME`` prints the module after any stage.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from xdsl.context import Context
from xdsl.dialects.arith import Arith
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.dialects.func import Func
from xdsl.dialects.linalg import Linalg
from xdsl.dialects.math import Math
from xdsl.dialects.memref import MemRef
from xdsl.dialects.scf import Scf
from xdsl.dialects.tensor import Tensor as TensorDialect
from xdsl.passes import ModulePass
from xdsl.transforms.canonicalize import CanonicalizePass
from xdsl.transforms.common_subexpression_elimination import CommonSubexpressionElimination
from xdsl.transforms.dead_code_elimination import DeadCodeElimination
from xdsl.utils.exceptions import VerifyException

from opgen.ir.dialect import Opgen
from opgen.lower.boundary import ConvertAtBoundary
from opgen.lower.column_strips import ColumnStrips
from opgen.lower.combine_accums import CombineAccums
from opgen.lower.cpu_map import MapCpu
from opgen.lower.empty_ranges import SpecialiseEmptyRanges
from opgen.lower.expand_math import ExpandMath
from opgen.lower.flat_chunks import ChunkFlatLoops
from opgen.lower.fuse_reductions import FuseReductions
from opgen.lower.fuse_siblings import FuseSiblings
from opgen.lower.gather_prefetch import PrefetchGathers
from opgen.lower.gpu_map import MapGpu, PlanGpuWorkspace
from opgen.lower.gpu_sync import ChunkGpuLoops, PlaceGpuBarriers
from opgen.lower.hoist_packing import HoistPacking
from opgen.lower.jam_rows import JamRows
from opgen.lower.matmul_chain import CHAIN_GROUPS
from opgen.lower.matmul_output import MatmulIntoOutput
from opgen.lower.narrow_products import ExactOperands, NarrowProducts
from opgen.lower.sched import Sched
from opgen.lower.tabulate import Tabulate
from opgen.lower.tile_transposes import TileTransposes
from opgen.lower.to_linalg import LowerToLinalg
from opgen.lower.to_loops import LowerToLoops
from opgen.lower.to_std import LowerToStd
from opgen.tile.boundary import ConvertAtBoundaryTiles
from opgen.tile.buffers import PlanBuffers
from opgen.tile.casts import SplitCasts
from opgen.tile.dialect import Tile
from opgen.tile.sizes import PlanWorkspace, SizeTiles, SplitCores
from opgen.tile.to_tiles import LowerToTiles
from opgen.ttmetal.cache import CacheRowsTt
from opgen.ttmetal.dialect import Ttk
from opgen.ttmetal.lower import LowerToTtKernel
from opgen.ttmetal.share import ShareKernels
from opgen.ttmetal.sizes import SizeTilesTt

#: Tensor-level (L0) clean-up shared by every target.
L0: list[ModulePass] = [CanonicalizePass(), CommonSubexpressionElimination(), DeadCodeElimination()]

#: CUDA's mapping onto the grid, its workspace, its thread chunks and barriers (opgen/lower/gpu_map.py,
#: opgen/lower/gpu_sync.py); canonicalization merges adjacent barriers.
GPU_MAPPING: list[ModulePass] = [MapGpu(), PlanGpuWorkspace(), ChunkGpuLoops(), PlaceGpuBarriers(), CanonicalizePass()]

PIPELINES: dict[str, list[ModulePass]] = {
    "l0": L0,
    # C11 + OpenMP: loops over buffers (independent reductions over one range fused, adjacent
    # parallel loops over one range too where each iteration touches its own slice:
    # opgen/lower/fuse_siblings.py; a matmul
    # feeding only an elementwise epilogue writes its output: opgen/lower/matmul_output.py; a
    # matmul of bf16 values takes bf16 products, AMX or AVX512-BF16 where the machine has them:
    # opgen/lower/narrow_products.py, its right-hand operand packed once before the loops that
    # leave it alone: opgen/lower/hoist_packing.py; matmul chains in one pass of 3 tile products
    # over column groups: opgen/lower/matmul_chain.py); map-cpu
    # marks the outermost parallel loop of each nest for OpenMP and the reductions split into
    # fixed lanes (opgen/lower/cpu_map.py; printed by opgen/emit/cpu.py); a loop over a run-time
    # range (a scatter-add's segment) gets a branch for the empty range (opgen/lower/empty_ranges.py);
    # column sums down serial loops run strips of 64 columns side by side (opgen/lower/column_strips.py);
    # a nest writing rows from a transposed input walks tiles, an f32/bf16/f16 input's tile staged
    # transposed and the next tile prefetched while the rows are written (opgen/lower/tile_transposes.py);
    # rows whose second pass adds into column accumulators go two at a time, a loop that only
    # sums columns 8 rows' streams at a time, a parallel row loop reading column vectors two rows
    # at a time (opgen/lower/jam_rows.py), the rows' first passes then fused by fuse-reductions
    # again, and their sums into one accumulator element read and written once
    # (opgen/lower/combine_accums.py); a parallel loop over 1-D tensors runs in chunks, each walked
    # like a row (opgen/lower/flat_chunks.py);
    # rows read through an index table are prefetched a few iterations ahead
    # (opgen/lower/gather_prefetch.py); an expensive function of one bf16/f16 element is looked up
    # in a table of its 65536 values (opgen/lower/tabulate.py).
    # Index and mask parameters are read in one dtype (i64/bool), converted by the binder: kernels per
    # compute type only.
    "cpu": [*L0, ConvertAtBoundary(), LowerToLoops(chain_groups=CHAIN_GROUPS, full_sum_lanes=True,
                                                   one_chunk_direct=True, row_scratch=True, fold_rows=True),
            FuseReductions(),
            CommonSubexpressionElimination(), CanonicalizePass(), FuseSiblings(), MatmulIntoOutput(), NarrowProducts(),
            HoistPacking(), ColumnStrips(), TileTransposes(), JamRows(), FuseReductions(), CombineAccums(),
            ChunkFlatLoops(), MapCpu(),
            SpecialiseEmptyRanges(), PrefetchGathers(), Tabulate()],
    # CUDA: the same loops; map-gpu outlines the device kernels, maps them onto the grid and
    # their loops onto threads and fixed-tree block reductions, plan-gpu-workspace numbers the
    # workspace regions (opgen/lower/gpu_map.py); chunk-gpu-loops gives thread loops vector
    # chunks, place-gpu-barriers the block's barriers (opgen/lower/gpu_sync.py); printed by
    # opgen/emit/cuda.py. Matmul chains in tiles of 64 rows: one block per 64 rows of the
    # row pass (BT = 8192 -> 128 blocks, enough for an H100's 132 SMs), one tensor-core tile high;
    # exact-operands records the operands holding bf16/f16 values, which the TF32 tensor-core
    # products take without an error-compensating split (opgen/lower/narrow_products.py).
    # Column reductions of a row group in partials of 8 rows: one block per 8 rows (N = 8192 ->
    # 1024 blocks; 32-row partials left 2 blocks per SM idle-waiting: RMSNorm backward measured
    # 35-55% of the copy bandwidth on an H100); the partials' sum is a `columns` kernel.
    "cuda": [*L0, ConvertAtBoundary(), LowerToLoops(chain_rows=64, column_chunk=8), FuseReductions(),
             CommonSubexpressionElimination(),
             CanonicalizePass(), ExactOperands(), *GPU_MAPPING],
    # Upstream MLIR: the CPU pipeline's loops, then func/scf/memref/arith/math, one function per
    # dtype binding (opgen/lower/to_std.py); printed in MLIR's textual syntax, which mlir-opt and
    # MLIR's Python bindings parse (generated/mlir/; opgen/mlir.py runs it).
    "mlir": [*L0, ConvertAtBoundary(), LowerToLoops(chain_groups=CHAIN_GROUPS, full_sum_lanes=True), FuseReductions(),
             CommonSubexpressionElimination(), CanonicalizePass(), MatmulIntoOutput(), MapCpu(), LowerToStd(),
             CommonSubexpressionElimination()],
    # Upstream MLIR at the tensor level: the L0 IR as linalg/tensor (value semantics), one function
    # per dtype binding (opgen/lower/to_linalg.py); generated/mlir/<op>.linalg.mlir.
    "linalg": [*L0, ConvertAtBoundary(), LowerToLinalg(), CommonSubexpressionElimination()],
    # Ascend C: the tile level (opgen/tile/): row tiles walked block-cyclically over the vector
    # cores, on-chip buffers planned under the unified buffer's capacity (opgen/emit/ascendc.py).
    # Tensors read only cast (opgen/tile/boundary.py) are converted by the host entries on the
    # NPU; index tensors to range-checked int32 by the tile level (opgen/tile/indices.py). Vector
    # casts A2 lacks go through f16 (opgen/tile/casts.py). Its vector unit has no erf or tanh:
    # the shared polynomial kernels replace them (opgen/lower/expand_math.py, opgen/vmath.py).
    "ascendc": [*L0, ConvertAtBoundaryTiles(), ExpandMath(("erf", "tanh")), LowerToTiles(), CanonicalizePass(),
                CommonSubexpressionElimination(), SplitCasts(), PlanBuffers(), SizeTiles(), SplitCores(),
                PlanWorkspace(), CanonicalizePass(), CommonSubexpressionElimination(), CanonicalizePass()],
    # TT-Metal: the same tile level, with Tensix tile sizes (32x32 tiles, groups of row blocks per
    # core; a matmul chain's spans split over the cores when its blocks are too few), then
    # reader/compute/writer kernels with their CBs and DST sections
    # (opgen/ttmetal/lower.py; printed by opgen/emit/ttmetal.py). Tensors read only cast are
    # converted by the host function (any IndexType), indices by the scatter plan.
    "ttmetal": [*L0, ConvertAtBoundaryTiles(), LowerToTiles(split_spans=True, target="tt-metal"), CanonicalizePass(),
                CommonSubexpressionElimination(), CacheRowsTt(), SizeTilesTt(), LowerToTtKernel(),
                CommonSubexpressionElimination(), ShareKernels()],
}


class StageFailed(Exception):
    """A pass of a target's pipeline raised: ``stage`` names the pass, ``__cause__`` is the error."""

    def __init__(self, target: str, stage: str, cause: BaseException):
        super().__init__(f"stage '{stage}' of pipeline '{target}': {type(cause).__name__}: {cause}")
        self.target = target
        self.stage = stage


def context() -> Context:
    ctx = Context()
    ctx.load_dialect(Builtin)
    ctx.load_dialect(Opgen)
    ctx.load_dialect(Sched)
    ctx.load_dialect(Tile)
    ctx.load_dialect(Ttk)
    for d in (Arith, Func, Linalg, Math, MemRef, Scf, TensorDialect):
        ctx.load_dialect(d)
    return ctx


def _pass_stages(target: str) -> list[str]:
    """One stage name per pass: the pass's name, ``-2``, ``-3``... when it runs again."""
    seen: dict[str, int] = {}
    names = []
    for p in PIPELINES[target]:
        seen[p.name] = seen.get(p.name, 0) + 1
        names.append(p.name if seen[p.name] == 1 else f"{p.name}-{seen[p.name]}")
    return names


def stages(target: str) -> list[str]:
    """Stage names of a target's pipeline: ``traced`` then one per pass (a pass that runs again
    is ``NAME-2``, ``NAME-3``...)."""
    return ["traced", *_pass_stages(target)]


def verify_each_default() -> bool:
    """``$OPGEN_VERIFY_EACH`` (1/0; default 0): verify the IR after every pass, not only after the
    last one run."""
    return os.environ.get("OPGEN_VERIFY_EACH", "0").strip().lower() in ("1", "yes", "true", "on")


def run(module: ModuleOp, target: str = "l0", until: str | None = None,
        observe: Callable[[str, ModuleOp], None] | None = None, verify_each: bool | None = None) -> ModuleOp:
    """Run ``target``'s pipeline on ``module`` in place (stopping after stage ``until``).

    The IR is verified after the last pass run, and after every pass with ``verify_each``
    (default ``$OPGEN_VERIFY_EACH``; a test runs every pipeline on every op so). Verifying takes
    as long as the passes themselves, so builds verify once, as release builds of MLIR-based
    compilers do; an error found at the end names the last stage, and ``OPGEN_VERIFY_EACH=1``
    finds the pass that made the IR invalid."""
    if target not in PIPELINES:
        raise KeyError(f"unknown pipeline {target!r}; known: {', '.join(PIPELINES)}")
    if until is not None and until not in stages(target):
        raise KeyError(f"unknown stage {until!r}; stages of {target}: {', '.join(stages(target))}")
    ctx = context()
    if observe:
        observe("traced", module)
    if until == "traced":
        return module
    each = verify_each_default() if verify_each is None else verify_each
    names = _pass_stages(target)
    last = names[-1] if until is None else until
    for p, name in zip(PIPELINES[target], names, strict=True):
        try:
            p.apply(ctx, module)
            if each or name == last or observe:
                module.verify()
        except VerifyException as e:
            if not each and name == last:  # (which pass made the IR invalid is not known)
                e = VerifyException(f"{e} (the IR is verified after the last pass only; OPGEN_VERIFY_EACH=1 "
                                    "verifies it after every pass)")
            raise StageFailed(target, name, e) from e
        except Exception as e:
            raise StageFailed(target, name, e) from e
        if observe:
            observe(name, module)
        if name == until:
            break
    return module
