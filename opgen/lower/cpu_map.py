"""``map-cpu``: where the C11/OpenMP target runs threads and splits reductions into lanes.

Each ``sched.for`` (and top-level ``sched.matmul``) the CPU printer treats specially gets a
``cpu_mapping`` (``#sched<cpu_mapping ...>``):

* ``omp_for``: the outermost ``parallel`` loop of each loop nest (and a ``sched.matmul`` outside
  any parallel loop: its rows) is an ``omp parallel for`` with a static schedule over the team;
* ``lanes``: a ``reduce`` loop whose body accumulates into scalars and holds no loop is split
  into ``LANES`` fixed lanes combined pairwise in a fixed order (opgen/emit/c_family.py), so the
  result never depends on the thread count.

Everything else is a plain C loop. ``opgen show OP --target cpu --stage map-cpu`` shows the
decisions; the printer (opgen/emit/cpu.py, opgen/emit/c_family.py) follows them.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from opgen.lower import sched as s
from opgen.lower.sched import CpuMapping, CpuMappingAttr

MAPPING = "cpu_mapping"
#: the fixed lanes of a ``lanes`` reduction (lane l takes iterations l, l + LANES, ...; combined
#: pairwise 8-4-2-1): the C printer and lower-to-std print the same split
LANES = 16


def cpu_mapping(op: Operation) -> str | None:
    """The op's ``cpu_mapping`` (None: a plain loop)."""
    a = op.attributes.get(MAPPING)
    return a.data.value if isinstance(a, CpuMappingAttr) else None


def lane_split(op: s.ForOp) -> list[s.AccumOp]:
    """The scalar accumulations a ``reduce`` loop splits into lanes (empty: it is not split)."""
    accs = s.scalar_accums(op)
    if op.kind.data == "reduce" and accs and not any(isinstance(o, s.ForOp) for o in op.body.block.ops):
        return accs
    return []


def _map(op: Operation, in_parallel: bool) -> None:
    """Mark the loops nested in ``op`` (``in_parallel``: inside a parallel loop)."""
    for r in op.regions:
        for b in r.blocks:
            for o in b.ops:
                inner = in_parallel
                if isinstance(o, s.ForOp):
                    if o.kind.data == "parallel" and not in_parallel:
                        o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.OMP_FOR)
                    elif lane_split(o):
                        o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.LANES)
                    inner = in_parallel or o.kind.data == "parallel"
                elif isinstance(o, s.BufferMatmulOp) and not in_parallel:
                    o.attributes[MAPPING] = CpuMappingAttr(CpuMapping.OMP_FOR)
                _map(o, inner)


class MapCpu(ModulePass):
    """Mark the CPU target's OpenMP loops and lane-split reductions (module docstring)."""

    name = "map-cpu"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, s.KernelOp):
                _map(k, False)
