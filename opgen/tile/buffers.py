"""``plan-buffers``: which on-chip buffer every tile value lives in.

* a ``tile.copy_in`` fills a copy-in queue of its own (memory space UB), a value a
  ``tile.copy_out`` copies out is computed into a copy-out queue of its own; inside a loop these
  queues are two deep (double buffering: the copy engine fills or drains one slot while the vector
  unit works on the other), outside one deep;
* every other tile value gets a compute buffer; a compute buffer is reused by a later value of
  the same dtype and layout once every use of its value is over (a linear scan over the program,
  a value used inside a loop stays live to the loop's end);
* a loop-carried tile (its initial value, the block argument, the yielded value and the loop's
  result) keeps one compute buffer — through nested loops too, so ``tile.add_row`` accumulates
  in place;
* a broadcast of a scalar, of a per-row value ([R, 1]) or of a column vector ([1, c]) whose every
  use is an add, sub, mul, max or min is *folded* into those ops (they read the row's scalar or
  the vector directly) and gets no buffer; so is a broadcast scalar a comparison, an add_row or a
  select reads (a select by a per-element condition: as its second operand only);
* a comparison's result on tiles is a *mask*, a bit an element (``bits``: the vector unit's
  ``Compare`` writes bits), and so are and/or/not of masks; the tiles a comparison compares get
  buffers padded to whole 256-byte repeats (``align``: ``Compare`` covers whole repeats, so its
  count is rounded up to them);
* ``tile.segments`` gets its on-chip table: the segment starts and running cursors of a block's
  rows (``segrows``: ``seg_rows + 1`` int32 each), a window of sorted positions (``segwin``) and a
  copy-in queue for the indices it scans (``segchunk``), named by its ``buffers`` attribute;
* a value copied out that no op of the walk computed (a loop's result, an input tile) is first
  moved into its copy-out queue (``tile.move``).
Queue tiles are given back with ``tile.release`` after their last use.

Layout classes, from the tile's shape: ``tile`` ([R, c]: R rows of ``pitch`` elements),
``vec`` ([R, 1]: R consecutive elements), ``row`` ([1, c]: one row of ``pitch`` elements, or of
``col_chunk`` elements in the column-sum phase). size-tiles turns them into byte counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, StringAttr
from xdsl.ir import Block, BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.tile import dialect as t

FOLDABLE = (ir.AddOp, ir.SubOp, ir.MulOp, ir.MaxOp, ir.MinOp)
#: bytes a comparison's operand buffers are padded to (one repeat of the vector unit)
COMPARE_ALIGN = 256


def layout(shape: tuple[str, ...]) -> str:
    """The layout class of a tile shape (see the module docstring)."""
    if len(shape) != 2:
        return "scalar"
    rows, cols = shape
    if rows != "1":
        return "vec" if cols == "1" else "tile"
    return "row" if cols != "1" else "vec"


def is_tile(v: SSAValue) -> bool:
    return isinstance(v.type, ir.TensorType) and v.type.rank == 2


def is_mask(v: SSAValue) -> bool:
    """A comparison's result on tiles, or a logical op of such: stored a bit an element (see the
    module docstring)."""
    op = v.owner
    return is_tile(v) and (isinstance(op, ir.CmpOp) or (isinstance(op, ir.AndOp | ir.OrOp | ir.NotOp)
                                                         and all(is_mask(x) for x in op.operands)))


def scalar_broadcast(v: SSAValue) -> bool:
    """``v`` is one scalar broadcast over a tile."""
    return isinstance(v.owner, ir.BroadcastOp) and ir.tensor_type(v.owner.x).rank == 0


@dataclass
class _Slot:
    sym: str
    kind: t.BufferKind
    dtype: str
    layout: str
    cols: str
    depth: int
    bits: bool = False  # a mask: a bit an element
    align: int = 32  # the bytes its size is rounded to
    free_at: int = -1  # position after which a compute buffer may take another value
    values: list[SSAValue] = field(default_factory=list)


def _ops(block: Block) -> Iterator[tuple[Operation, int]]:
    """Every op below ``block`` in program order (nested loops included)."""
    for op in block.ops:
        yield op, 0
        for r in op.regions:
            for b in r.blocks:
                yield from _ops(b)


def folded(op: Operation) -> bool:
    """A broadcast the consumers read directly (see the module docstring)."""
    if not isinstance(op, ir.BroadcastOp) or not op.result.uses:
        return False
    src = ir.tensor_type(op.x)
    if src.rank == 2 and src.shape == ir.tensor_type(op.result).shape:
        return False
    def reads_directly(u: Operation, index: int) -> bool:
        if isinstance(u, ir.SelectOp) and not scalar_broadcast(u.cond):  # a per-element condition
            return src.rank == 0 and index == 2
        if isinstance(u, ir.SelectOp | t.AddRowOp):
            return src.rank == 0 and (not isinstance(u, t.AddRowOp) or u.value is op.result)
        if isinstance(u, ir.CmpOp):
            return src.rank == 0 and not all(scalar_broadcast(x) for x in u.operands)
        return (isinstance(u, FOLDABLE) and u.result.type == op.result.type
                and layout(ir.tensor_type(u.result).shape) in ("tile", "vec", "row"))

    return all(reads_directly(u.operation, u.index) for u in op.result.uses)


class _Planner:
    def __init__(self, k: t.KernelOp):
        self.k = k
        self.pos: dict[Operation, int] = {}
        self.end: dict[Operation, int] = {}  # a loop's last position
        self.slots: list[_Slot] = []
        self.slot_of: dict[SSAValue, _Slot] = {}
        self.counter = {"in": 0, "out": 0, "calc": 0}

    def number(self, block: Block, n: int = 0) -> int:
        for op in block.ops:
            self.pos[op] = n
            n += 1
            for r in op.regions:
                for b in r.blocks:
                    n = self.number(b, n)
            self.end[op] = n
            n += 1
        return n

    def last_use(self, v: SSAValue) -> int:
        """Position of the last use of ``v``, counting a use inside a loop that ``v`` was defined
        outside of as a use at the loop's end."""
        last = self.pos.get(v.owner, -1) if isinstance(v.owner, Operation) else -1
        def_parent = v.owner.parent_op()  # (an op result: the op holding it; a block argument: its loop)
        for u in v.uses:
            op = u.operation
            if folded(op):  # read through the broadcast by its users
                last = max(last, self.last_use(op.results[0]))
                continue
            at = self.pos[op]
            anc = op.parent_op()
            while anc is not None and anc is not def_parent and anc is not self.k:
                if isinstance(anc, t.ForOp):
                    at = max(at, self.end[anc])
                anc = anc.parent_op()
            last = max(last, at)
        return last

    def new(self, kind: t.BufferKind, v: SSAValue, depth: int) -> _Slot:
        self.counter[kind.value] += 1
        shape = ir.tensor_type(v).shape
        s = _Slot(f"{kind.value}{self.counter[kind.value]}", kind, ir.tensor_type(v).dtype, layout(shape), shape[1],
                  depth, bits=is_mask(v))
        self.slots.append(s)
        return s

    def assign(self, v: SSAValue, s: _Slot) -> None:
        self.slot_of[v] = s
        s.values.append(v)
        if s.kind == t.BufferKind.CALC:
            s.free_at = max(s.free_at, self.last_use(v))

    def calc(self, v: SSAValue) -> _Slot:
        """A compute buffer for ``v``: a free one of the same dtype and layout, or a new one. An
        elementwise op may write over an operand it is the last use of (vector ops allow the
        destination to be a source)."""
        op = v.owner
        at = self.pos[op] if isinstance(op, Operation) else -1
        in_place = isinstance(op, ir.BinaryOp | ir.UnaryOp)
        tt = ir.tensor_type(v)
        for s in self.slots:
            if (s.kind == t.BufferKind.CALC and s.dtype == tt.dtype and s.layout == layout(tt.shape)
                    and s.cols == tt.shape[1] and s.bits == is_mask(v)
                    and (s.free_at < at or (in_place and s.free_at == at))):
                return s
        return self.new(t.BufferKind.CALC, v, 1)

    def in_loop(self, op: Operation) -> bool:
        anc = op.parent_op()
        while anc is not None and anc is not self.k:
            if isinstance(anc, t.ForOp):
                return True
            anc = anc.parent_op()
        return False

    def run(self) -> None:
        self.number(self.k.body.block)
        # copy-outs of values no op of their block computed: move them into a queue first
        for op, _ in list(_ops(self.k.body.block)):
            if isinstance(op, t.CopyOutOp):
                src = op.value
                owner = src.owner
                if (isinstance(src, BlockArgument) or isinstance(owner, t.ForOp | t.CopyInOp)
                        or (isinstance(owner, Operation) and owner.parent is not op.parent) or len(list(src.uses)) > 1):
                    mv = t.MoveOp(src)
                    op.parent.insert_op_before(mv, op)  # type: ignore[union-attr]
                    op.operands[0] = mv.result
        # a loop-carried tile's initial value that is used elsewhere too (CSE shares equal values)
        # gets a copy of its own: the loop writes over it
        for op, _ in list(_ops(self.k.body.block)):
            if isinstance(op, t.ForOp):
                for i, init in enumerate(op.inits):
                    if is_tile(init) and len(list(init.uses)) > 1:
                        mv = t.MoveOp(init)
                        op.parent.insert_op_before(mv, op)  # type: ignore[union-attr]
                        op.operands[3 + i] = mv.result
        self.pos.clear()
        self.end.clear()
        self.number(self.k.body.block)
        # queues first: copy-ins and the values copied out
        for op, _ in _ops(self.k.body.block):
            depth = 2 if self.in_loop(op) else 1
            if isinstance(op, t.CopyInOp):
                self.assign(op.result, self.new(t.BufferKind.IN, op.result, depth))
            elif isinstance(op, t.CopyOutOp):
                self.assign(op.value, self.new(t.BufferKind.OUT, op.value, depth))
        # loop-carried tiles: one buffer for the init, the carried argument, the yield and the result
        for op, _ in _ops(self.k.body.block):
            if isinstance(op, t.ForOp):
                y = op.body.block.last_op
                assert isinstance(y, t.YieldOp)
                for init, arg, val, res in zip(op.inits, op.body.block.args[1:], y.values, op.res, strict=True):
                    if not is_tile(init):
                        continue
                    s = self.slot_of.get(init) or self.new(t.BufferKind.CALC, init, 1)  # (nested carries)
                    for x in (init, arg, val, res):
                        if self.slot_of.get(x) is not s:
                            self.assign(x, s)
        # everything else, in program order
        for op, _ in _ops(self.k.body.block):
            if isinstance(op, t.TilingOp) or (op.parent_op() is not None and isinstance(op.parent_op(), t.TilingOp)):
                continue
            for r in op.results:
                if not is_tile(r) or r in self.slot_of:
                    continue
                if folded(op):
                    op.attributes["folded"] = StringAttr("yes")
                    continue
                self.assign(r, self.calc(r))
        # the tiles a comparison reads: whole repeats
        for op, _ in _ops(self.k.body.block):
            if isinstance(op, ir.CmpOp) and is_tile(op.result):
                for x in op.operands:
                    if x in self.slot_of:
                        self.slot_of[x].align = COMPARE_ALIGN
        # the tables of tile.segments
        for op, _ in _ops(self.k.body.block):
            if isinstance(op, t.SegmentsOp):
                n = len([x for x in self.slots if x.layout == "segwin"]) + 1
                syms = []
                for role, kind, lay in (("start", t.BufferKind.CALC, "segrows"), ("cur", t.BufferKind.CALC, "segrows"),
                                        ("win", t.BufferKind.CALC, "segwin"), ("scan", t.BufferKind.IN, "segchunk")):
                    slot = _Slot(f"seg{n}{role}", kind, "i32", lay, "1", 1)
                    self.slots.append(slot)
                    syms.append(slot.sym)
                op.attributes["buffers"] = StringAttr(" ".join(syms))
        # scratch of the reductions along rows: a 32-byte result and a row of work space
        row_reduces = [op for op, _ in _ops(self.k.body.block) if isinstance(op, t.ReduceOp) and op.axis.data == 1]
        if row_reduces:
            cols = ir.tensor_type(row_reduces[0].x).shape[1]
            dst = _Slot("rdst", t.BufferKind.CALC, "f32", "scratch", "1", 1)
            work = _Slot("rwork", t.BufferKind.CALC, "f32", "row", cols, 1)
            self.slots += [dst, work]
            for op in row_reduces:
                op.attributes["scratch"] = StringAttr("rdst rwork")
        # declarations, value -> buffer names, releases of queue tiles
        anchor = self.k.body.block.first_op
        for s in self.slots:
            kind_space = t.MemSpace.UB
            b = t.BufferOp(s.sym, kind_space, s.kind, s.depth, f"bytes_{s.sym}")
            b.attributes["elem"] = StringAttr(s.dtype)
            b.attributes["layout"] = StringAttr(s.layout)
            b.attributes["cols"] = StringAttr(s.cols)
            if s.bits:
                b.attributes["bits"] = StringAttr("1")
            if s.align != 32:
                b.attributes["align"] = StringAttr(str(s.align))
            self.k.body.block.insert_op_after(b, anchor) if anchor is not None else self.k.body.block.add_op(b)
            anchor = b
            for v in s.values:
                if isinstance(v.owner, Operation):
                    v.owner.attributes["buffer"] = StringAttr(s.sym)
                else:  # a loop's block argument: its loop records it
                    loop = v.owner.parent_op()  # type: ignore[union-attr]
                    loop.attributes[f"buffer{v.index}"] = StringAttr(s.sym)  # type: ignore[union-attr]
        for s in self.slots:
            if s.kind != t.BufferKind.IN:
                continue
            for v in s.values:
                owner = v.owner
                assert isinstance(owner, Operation)
                uses = [u.operation for u in v.uses]
                uses += [w.operation for o in uses if folded(o) for w in o.results[0].uses]
                last = max(uses, key=lambda o: self.pos[o], default=None)
                if last is None:
                    owner.parent.insert_op_after(t.ReleaseOp(v), owner)  # type: ignore[union-attr]
                    continue
                # release after the last use, at the level of the copy-in (after a loop that reads it)
                while last.parent is not owner.parent:
                    last = last.parent_op()  # type: ignore[assignment]
                last.parent.insert_op_after(t.ReleaseOp(v), last)  # type: ignore[union-attr]


class PlanBuffers(ModulePass):
    """Assign every tile value an on-chip buffer (see the module docstring)."""

    name = "plan-buffers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for k in op.body.block.ops:
            if isinstance(k, t.KernelOp):
                _Planner(k).run()
