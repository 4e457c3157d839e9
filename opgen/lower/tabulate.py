"""``tabulate``: an expensive function of one 16-bit element becomes a table lookup (CPU).

An element of bf16 or f16 holds one of 65536 values. Where a loop body computes an expensive
value from one element of a caller's input alone — GELU's ``Phi(x) + x phi(x)``, an erf and an
exp of ``x`` — the function can be evaluated once for every value the element can hold and
looked up by the element's bits: the lookup (a gather from a 256 KiB table whose used part
stays in L1 for activations) costs the same whatever the function, and gives the same bits
as computing it (the same C, evaluated once per value).

The pass finds, in each loop body, the *cone* of each ``sched.load`` of an ``in`` buffer whose
dtype can bind to bf16 or f16: the elementwise ops computed from that element and compile-time
constants alone. A cone value used outside the cone (a *root*) whose ops cost at least
``THRESHOLD`` (:data:`COST`, in cycles per 16 lanes) becomes a ``sched.load_fn``: the load and
the root's ops, cloned into the op's isolated region. The ops no longer used go. The C printer
(opgen/emit/cpu.py) prints a ``sched.load_fn`` of a 16-bit element as a lookup into a table
built on first use, and of any other element (the f32 instance of the same kernel) as its
region in place: the f32 code does not change. A load that map-cpu staged (a stream loop's row,
read a strip at a time) passes that on to its ``sched.load_fn`` where the lookup may be staged
too (:func:`~opgen.lower.cpu_map.staged_loads`): the printer then looks up a strip at a time
(``opgen_table_load_strip``).

The costs were measured on the Zen 5 machine of docs/performance.md (a loop of 32 bf16 elements
a strip, one thread, data in L1): a table lookup costs about 14 cycles per 16 lanes, so only
functions of at least 1.5 times that are looked up (GELU backward's 27; SiLU's sigmoid, 12, and
a lone exp, 9, are not: computing them is cheaper). A staged lookup (below) costs about 8, but
the threshold stays: lookups of strided rows and outside stream loops are gathers still, and
SiLU backward's two roots (the sigmoid and ``1 + x (1 - s)``) would both be looked up where
one sigmoid computed costs less than two lookups.
"""

from __future__ import annotations

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import MAPPING, cpu_mapping, staged_loads
from opgen.lower.sched import CpuMapping

#: cycles per 16 lanes of each op (vectorised, the runtime's math functions; others
#: :data:`DEFAULT_COST`); measured on the Zen 5 (module docstring). ``pow`` is libm's, per lane.
COST: dict[type[Operation], float] = {
    ir.ErfOp: 16.0, ir.ExpOp: 9.0, ir.LogOp: 16.5, ir.TanhOp: 18.0, ir.SigmoidOp: 12.0, ir.PowOp: 300.0,
    ir.DivOp: 1.0, ir.RecipOp: 1.0, ir.SqrtOp: 1.5, ir.RsqrtOp: 4.0}
#: an add, multiply, compare, select, cast...
DEFAULT_COST = 0.5
#: a table lookup (a gather of 16 lanes)
LOOKUP_COST = 14.0
#: the least cost of a function that is looked up
THRESHOLD = 1.5 * LOOKUP_COST
#: the element dtypes whose every value a table holds
SIXTEEN_BIT = frozenset({dtypes.BF16, dtypes.F16})


def sixteen_bit(k: s.KernelOp, buf: SSAValue) -> bool:
    """Whether a caller's input ``buf`` of kernel ``k`` holds 16-bit floats in some instance."""
    t = s.buf_type(buf)
    if t.role.data != "in":
        return False
    return any(d in SIXTEEN_BIT for d in k.dtype_options(t.dtype))


def _floats(k: s.KernelOp, dtype: str) -> bool:
    """Whether values of ``dtype`` (a name or a dtype variable of ``k``) are floats in every instance."""
    return all(d.is_float for d in k.dtype_options(dtype))


def _in_cone(op: Operation, cone: set[SSAValue]) -> bool:
    """Whether ``op`` computes from ``cone`` values and compile-time constants alone (and from
    at least one of the former): a scalar elementwise op without side effects."""
    if not isinstance(op, ir.ElementwiseOp) or isinstance(op, s.SIZE_EXPR_OPS) or op.regions:
        return False
    if ir.tensor_type(op.results[0]).rank != 0:
        return False
    found = False
    for v in op.operands:
        if v in cone:
            found = True
        elif not isinstance(v.owner, ir.ConstantOp):
            return False
    return found


def cone(ld: s.LoadOp) -> list[Operation]:
    """The ops after ``ld`` in its block computed from its element and constants alone, in order."""
    vals: set[SSAValue] = {ld.result}
    ops: list[Operation] = []
    op = ld.next_op
    while op is not None:
        if _in_cone(op, vals):
            ops.append(op)
            vals.update(op.results)
        op = op.next_op
    return ops


def _needed(root: Operation, ops: list[Operation]) -> list[Operation]:
    """The ops of ``ops`` that ``root`` depends on (itself included), in order."""
    inside = set(ops)
    need: set[Operation] = set()
    todo = [root]
    while todo:
        o = todo.pop()
        if o in need:
            continue
        need.add(o)
        todo.extend(v.owner for v in o.operands if v.owner in inside)  # type: ignore[misc]
    return [o for o in ops if o in need]


def cost(ops: list[Operation]) -> float:
    """Estimated cycles per 16 lanes of ``ops`` (:data:`COST`)."""
    return sum(COST.get(type(o), DEFAULT_COST) for o in ops)


def _load_fn(ld: s.LoadOp, ops: list[Operation]) -> s.LoadFnOp:
    """A ``sched.load_fn`` of ``ld``'s element computing the last of ``ops`` (clones, with the
    constants they read)."""
    block = Block(arg_types=[ld.result.type])
    mapping: dict[SSAValue, SSAValue] = {ld.result: block.args[0]}
    for o in ops:
        for v in o.operands:
            if v not in mapping and isinstance(v.owner, ir.ConstantOp):
                c = v.owner.clone()
                block.add_op(c)
                mapping[v] = c.results[0]
        c = o.clone(value_mapper=mapping)
        block.add_op(c)
    block.add_op(s.YieldOp(mapping[ops[-1].results[0]]))
    return s.LoadFnOp(ld.buf, list(ld.idx), Region(block), ops[-1].results[0].type)


def tabulate_load(k: s.KernelOp, ld: s.LoadOp) -> int:
    """Replace the expensive roots of ``ld``'s cone with ``sched.load_fn`` ops (module
    docstring); the number replaced."""
    ops = cone(ld)
    inside = set(ops)
    roots = [o for o in ops if any(u.operation not in inside for r in o.results for u in r.uses)]
    done = 0
    for root in roots:
        need = _needed(root, ops)
        if cost(need) < THRESHOLD or not _floats(k, ir.tensor_type(root.results[0]).dtype):
            continue
        new = _load_fn(ld, need)
        root.parent_block().insert_op_before(new, root)
        outside = [u for u in root.results[0].uses if u.operation not in inside]
        for u in outside:
            u.operation.operands[u.index] = new.result
        loop = new.parent_op()
        if cpu_mapping(ld) == CpuMapping.STAGED and isinstance(loop, s.ForOp) and new in staged_loads(loop):
            new.attributes[MAPPING] = ld.attributes[MAPPING]  # (looked up a strip at a time, as it was loaded)
        done += 1
    if done:
        for o in reversed([ld, *ops]):
            if not any(r.uses for r in o.results):
                o.detach()
                o.erase()
    return done


class Tabulate(ModulePass):
    """Look up expensive functions of one 16-bit element in tables (module docstring)."""

    name = "tabulate"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if not isinstance(k, s.KernelOp):
                continue
            loads = [o for o in k.walk() if isinstance(o, s.LoadOp) and isinstance(o.parent_op(), s.ForOp)
                     and sixteen_bit(k, o.buf)]
            for ld in loads:
                tabulate_load(k, ld)
