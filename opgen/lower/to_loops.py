"""``lower-to-loops``: L0 tensor functions -> ``sched`` kernels in destination-passing style.

Values that must live in memory ("materialised") are the results of reductions, scatter-adds,
bincounts, matmuls and concatenations (each part written by its own loop nest, so no load is
ever guarded; a concat read only by outputs through elementwise ops is instead inlined into
their nests, split at its parts: ``split_concats``), matmul operands, and every index tensor
used by gather/scatter/bincount (which is range-checked while it is materialised). Everything
else — elementwise math, broadcasts, transposes, slices, reshapes, casts, iota, gather, unpacked
masks — is inlined as scalar code at each use and hoisted to the outermost loop where its
indices are known.

Kernel order: run-time checks, index tensors (range-checked: an error returns before any output
is touched), intermediate values, then outputs; outputs that may alias an input come last.
Scatter-add is owner-computes over a stable counting sort of its indices: each output row sums
its contributions in increasing input order, so the result is deterministic on any thread count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass

from opgen.ir import dialect as ir
from opgen.ir import dims
from opgen.lower import sched as s

MATERIALISED = (ir.ReduceOp, ir.ScatterAddOp, ir.BincountOp, ir.MatmulOp, ir.ConcatOp)

#: rows of the leading dim per partial of a column sum (a target may take fewer: the GPU's)
COLUMN_CHUNK = 32
#: a unit attribute on the loop over a column sum's chunks of rows (each its own row of partials):
#: where kept axes are walked outside it (``hoist``), map-cpu splits both among the threads
CHUNKS = "chunks"
#: a unit attribute on each loop but the outermost of a row group's rows over several leading dims
#: (``fold_rows``): map-cpu splits the whole nest among the threads
ROWS = "rows"
#: elements per partial of a 1-D tensor summed whole where sums run in lanes (``full_sum_lanes``)
FULL_SUM_CHUNK = 16384


class NotFusable(Exception):
    """Raised when a row group cannot be formed; the op is then lowered unfused."""


@dataclass
class _Level:
    block: Block
    loop: Operation | None  # the child loop currently being filled at this level (insert before)
    ivs: set[SSAValue] = field(default_factory=set)


class _Builder:
    """Builds nested loops, placing each scalar op at the outermost level it can live at."""

    def __init__(self, block: Block):
        self.levels: list[_Level] = [_Level(block, None)]
        self.level_of: dict[SSAValue, int] = {}
        self.memo: dict[tuple, SSAValue] = {}

    def _insert(self, op: Operation, level: int) -> None:
        lv = self.levels[level]
        child = lv.loop
        if child is not None and child.parent is lv.block:
            lv.block.insert_op_before(op, child)
        else:
            lv.block.add_op(op)

    def level(self, v: SSAValue) -> int:
        return self.level_of.get(v, 0)

    def scalar(self, op: Operation, key: tuple | None = None, pinned: bool = False) -> SSAValue:
        """Insert a pure scalar op at the deepest level among its operands (or innermost)."""
        if key is not None and key in self.memo:
            return self.memo[key]
        lvl = len(self.levels) - 1 if pinned else max(
            [self.level(o) for o in op.operands] + [0])
        self._insert(op, lvl)
        res = op.results[0]
        self.level_of[res] = lvl
        if key is not None:
            self.memo[key] = res
        return res

    def stmt(self, op: Operation) -> None:
        self._insert(op, len(self.levels) - 1)

    def const(self, value: float | int, dtype: str) -> SSAValue:
        return self.scalar(ir.ConstantOp(value, dtype), key=("const", value, dtype))

    def dim(self, d: str) -> SSAValue:
        """The value of a spelled dim: a constant, ``opgen.dim``, or the ops a derived size is
        (``cdiv(a,b)``: ``opgen.ceil_div``; ``segs(rows,n)``: ``sched.seg_words``; a derived
        dim's ``div``/``sub``/``add``/``mul``: ``opgen.size_*``; ``+ k``)."""
        if d.isdigit():
            return self.const(int(d), "i64")
        head, args, plus = ir.split_dim(d)
        if head == "cdiv":
            v = self.scalar(ir.CeilDivOp(self.dim(args[0]), self.dim(args[1])), key=("cdiv", *args))
        elif head in ir.SIZE_OPS:  # a derived dim (opgen.ir.dims)
            v = self.scalar(ir.SIZE_OPS[head](self.dim(args[0]), self.dim(args[1])), key=(head, *args))
        elif head == "segs":
            v = self.scalar(s.SegWordsOp(self.dim(args[0]), self.dim(args[1])), key=("segs", *args))
        else:
            v = self.scalar(ir.DimOp(head), key=("dim", head))
        return self.scalar(ir.AddOp(v, self.const(plus, "i64")), key=("plus", head, *args, plus)) if plus else v

    def alloc(self, shape: Sequence[str], dtype: str, role: str, zero: bool = False,
              top: bool = False) -> s.AllocOp:
        """A ``temp``/``local`` buffer of ``shape`` with its sizes as values, inserted as a
        statement of the innermost level (``top``: of the outermost, before the nest being built)."""
        a = s.AllocOp(s.BufType.make(list(shape), dtype, role), [self.dim(d) for d in shape], zero=zero)
        level = 0 if top else len(self.levels) - 1
        self._insert(a, level)
        self.level_of[a.result] = level  # (a load of it, even at no index, goes no higher)
        return a

    def open(self, lo: SSAValue, hi: SSAValue, kind: str, hint: str, tag: str | None = None) -> SSAValue:
        """A ``sched.for`` from ``lo`` to ``hi`` (``tag``: a unit attribute on it, for later
        passes: ``CHUNKS``); what is built next goes into its body (until :meth:`close`)."""
        loop = s.ForOp(lo, hi, kind, hint)
        if tag is not None:
            loop.attributes[tag] = UnitAttr()
        self.stmt(loop)
        self.levels[-1].loop = loop
        self.levels.append(_Level(loop.body.block, None))
        self.level_of[loop.iv] = len(self.levels) - 1
        return loop.iv

    def close(self) -> None:
        self.levels.pop()
        self.levels[-1].loop = None
        # values memoised inside the closed loop are no longer visible
        depth = len(self.levels)
        self.memo = {k: v for k, v in self.memo.items() if self.level_of.get(v, 0) < depth}

    def loops(self, dims: Sequence[str], kind: str, hint: str = "i", skip_if: SSAValue | None = None,
              starts: Sequence[str] | None = None, tag_last: str | None = None) -> list[SSAValue]:
        """A loop per dim, outermost first, each from 0 (or its entry of ``starts``) to the dim.
        ``skip_if`` (a bool scalar): the outermost loop runs no iteration when it holds (see
        :meth:`empty`); ``tag_last``: :meth:`open`'s ``tag`` of the innermost loop."""
        out = []
        for k, d in enumerate(dims):
            lo = self.dim(starts[k]) if starts is not None else self.const(0, "i64")
            hi = self.dim(d)
            if k == 0 and skip_if is not None:
                hi = self.scalar(ir.SelectOp(skip_if, lo, hi))
            out.append(self.open(lo, hi, kind, f"{hint}{k}", tag_last if k == len(dims) - 1 else None))
        return out

    def empty(self, *shapes: Sequence[str]) -> SSAValue | None:
        """True when every one of ``shapes`` has a zero dim (None when some shape has no dim
        that can be zero): a nest whose work all lies in such shapes has nothing to do, and
        must not walk its other dims (an empty (2^62, 0) table has 2^62 rows and no element)."""
        conds = []
        for shape in shapes:
            zs = [self.scalar(ir.CmpOp("eq", self.dim(d), self.const(0, "i64"))) for d in shape if not d.isdigit()]
            if any(d.isdigit() and int(d) == 0 for d in shape):
                continue  # always empty
            if not zs:
                return None
            c = zs[0]
            for z in zs[1:]:
                c = self.scalar(ir.OrOp(c, z))
            conds.append(c)
        if not conds:
            return None
        c = conds[0]
        for x in conds[1:]:
            c = self.scalar(ir.AndOp(c, x))
        return c

    def close_n(self, n: int) -> None:
        for _ in range(n):
            self.close()

    def open_if(self, cond: SSAValue) -> s.IfOp:
        """A ``sched.if`` on ``cond``; what is built next goes into its ``then`` block (until
        :meth:`otherwise`, then :meth:`close`)."""
        op = s.IfOp(cond)
        self.stmt(op)
        self.levels[-1].loop = op
        self.levels.append(_Level(op.then.block, None))
        return op

    def otherwise(self, op: s.IfOp) -> None:
        """What is built next goes into ``op``'s ``otherwise`` block (``op`` the innermost open
        :meth:`open_if`); values of its ``then`` block are no longer visible."""
        depth = len(self.levels) - 1
        self.memo = {k: v for k, v in self.memo.items() if self.level_of.get(v, 0) < depth}
        self.levels[-1] = _Level(op.otherwise.block, None)


class _Lowering:
    #: a sum down to one value per kept index (a 1-D tensor, or every axis, summed whole) adds its
    #: innermost axis in a ``reduce`` loop (map-cpu's fixed lanes: vector adds, the order fixed)
    #: instead of one element after another, and a 1-D tensor's partials take FULL_SUM_CHUNK
    #: elements each, not COLUMN_CHUNK (set by LowerToLoops' ``full_sum_lanes``: the CPU's)
    full_sum_lanes: bool = False
    #: a column sum walked with kept axes outside its chunks (``hoist``) stores each unit's sums
    #: straight into the result where there is one chunk, and its partials' sum then runs no
    #: iteration (:meth:`one_chunk`; set by LowerToLoops' ``one_chunk_direct``: the CPU's)
    one_chunk_direct: bool = False
    #: a row group keeps in a row of scratch an elementwise value that costs a polynomial an
    #: element and is read by more than one of its loop nests (``RowGroupLowering.kept_rows``;
    #: set by LowerToLoops' ``row_scratch``: the CPU's)
    row_scratch: bool = False
    #: a row group's rows are those of its members' shared leading dims, not of the first alone,
    #: where each row is computed on its own ((B, T, D) with a sum over D; attention's (B, H, S, S)
    #: with one over the last S): every thread takes rows even where B is small
    #: (``RowGroupLowering.row_dims``; set by LowerToLoops' ``fold_rows``: the CPU's)
    fold_rows: bool = False

    def __init__(self, func: ir.FuncOp, aliases: set[str], chunk: int | None = None):
        self.func = func
        self.chunk = chunk or COLUMN_CHUNK  # rows per partial of a column sum
        self.aliases = aliases
        names = [a.data for a in func.arg_names.data]
        self.ret = func.body.block.last_op
        assert isinstance(self.ret, ir.ReturnOp)
        out_names = {n.data for n in self.ret.names.data}
        in_memory = set(func.in_memory_scalars)
        arg_types = []
        for n, a in zip(names, func.body.block.args, strict=True):
            t = ir.tensor_type(a)
            if t.rank == 0 and n not in in_memory:
                arg_types.append(t)  # an attribute or a size: passed by value
            else:
                arg_types.append(s.BufType.make(t.shape, t.dtype, "out" if n in out_names else "in"))
        self.kernel = s.KernelOp(func.sym_name.data, names, arg_types, func.dtype_vars)
        for kept in ("boundary_casts", "may_alias", "batched", "sizes"):
            if kept in func.properties:
                self.kernel.properties[kept] = func.properties[kept]
        self.kblock = self.kernel.body.block
        self.buf: dict[SSAValue, SSAValue] = {}  # L0 value -> buffer holding it
        self.ibuf: dict[SSAValue, SSAValue] = {}  # index value -> its range-checked i64 copy
        self.rowlocal: dict[SSAValue, tuple[SSAValue, tuple[SSAValue, ...]]] = {}  # value -> (local row, row ivs)
        self.scalars: dict[SSAValue, SSAValue] = {}
        self.segs: dict[tuple[SSAValue, str], tuple[SSAValue, SSAValue]] = {}  # see segments()
        self.split = self.split_concats()  # returned value -> the concat its nest splits over
        self.part: dict[ir.ConcatOp, tuple[int, str]] = {}  # concat -> (part, offset) being emitted
        for a, ka in zip(func.body.block.args, self.kblock.args, strict=True):
            (self.buf if isinstance(ka.type, s.BufType) else self.scalars)[a] = ka

    # ------------------------------------------------------------------ analysis
    @staticmethod
    def counted_by_segments(op: Operation) -> bool:
        """A bincount read only at its own indices (``gather(bincount(i, R), i)``, as in
        scale-by-frequency): each count is the length of that index's segment in the sorted
        indices, so no R-sized table is built (the workspace grows with the indices, not R)."""
        return isinstance(op, ir.BincountOp) and bool(op.result.uses) and all(
            isinstance(u.operation, ir.GatherOp) and u.operation.table is op.result and u.operation.idx is op.idx
            for u in op.result.uses)

    def materialises(self, op: Operation | None) -> bool:
        """``op``'s result lives in memory (see the module docstring)."""
        return isinstance(op, MATERIALISED) and not self.counted_by_segments(op) \
            and op not in self.split.values()

    def sources(self, v: SSAValue) -> set[SSAValue]:
        """Materialised values read (through inlined ops) to compute ``v``."""
        out: set[SSAValue] = set()
        todo = [v]
        seen: set[SSAValue] = set()
        while todo:
            x = todo.pop()
            op = x.owner
            if not isinstance(op, Operation):
                continue
            for o in op.operands:
                if o in seen:
                    continue
                seen.add(o)
                if self.materialises(o.owner):
                    out.add(o)
                else:
                    todo.append(o)
        return out

    @staticmethod
    def _elementwise_concats(v: SSAValue) -> set[ir.ConcatOp]:
        """The concats ``v`` reads at its own indices, through elementwise ops only."""
        out: set[ir.ConcatOp] = set()
        todo, seen = [v], set()
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            op = x.owner
            if isinstance(op, ir.ConcatOp):
                out.add(op)
            elif isinstance(op, ir.ElementwiseOp):
                todo.extend(op.operands)
        return out

    def split_concats(self) -> dict[SSAValue, ir.ConcatOp]:
        """Returned values whose loop nest is split over the parts of a concat (on an axis other
        than the first) instead of reading it from memory: each part's span of the axis gets its
        own loop, where the concat is that part, inlined. A concat qualifies when it is the only
        one its returned values read that way and nothing else reads it, and no output may alias
        an input (a split nest is written after the others of its row)."""
        if self.aliases:
            return {}
        roots: dict[ir.ConcatOp, list[SSAValue]] = {}
        for v in self.ret.values:
            cs = self._elementwise_concats(v)
            for c in cs:
                roots.setdefault(c, []).append(v if len(cs) == 1 else None)  # type: ignore[arg-type]
        out: dict[SSAValue, ir.ConcatOp] = {}
        for c, vs in roots.items():
            if c.axis.data == 0 or None in vs:
                continue
            reached: set[SSAValue] = set()
            todo = [c.result]
            ok = True
            while todo and ok:
                x = todo.pop()
                if x in reached:
                    continue
                reached.add(x)
                for use in x.uses:
                    u = use.operation
                    if isinstance(u, ir.ReturnOp):
                        ok = x in vs
                    elif isinstance(u, ir.ElementwiseOp):
                        todo.extend(u.results)
                    else:
                        ok = False
            if ok:
                out.update({v: c for v in vs})
        return out

    def split_nests(self, b: _Builder, c: ir.ConcatOp, shape: Sequence[str], lead: Sequence[SSAValue],
                    hint: str, store: Callable[[list[SSAValue]], None]) -> None:
        """One loop nest over ``shape`` (after the ``lead`` indices already open) per part of
        concat ``c``, over that part's span of the axis, calling ``store`` with each element's
        full indices while ``c`` reads as that part (without ``lead``, a part's nest skips its
        rows when their rest is empty)."""
        a = c.axis.data - len(lead)
        offset = "0"
        for k, part in enumerate(c.parts):
            length = ir.tensor_type(part).shape[c.axis.data]
            dims_k = [length if i == a else d for i, d in enumerate(shape)]
            # (the part's span [offset, offset + length) walked by its own counter: the output's
            # index is the counter, a row walk map-cpu vectorises and streams)
            ends = [dims.add(offset, length) if i == a else d for i, d in enumerate(shape)]
            starts = [offset if i == a else "0" for i in range(len(shape))]
            ivs = b.loops(ends, "parallel", hint, skip_if=None if lead else b.empty(dims_k[1:]), starts=starts)
            self.part[c] = (k, offset)
            store([*lead, *ivs])
            del self.part[c]
            b.close_n(len(ivs))
            offset = dims.add(offset, length)

    def materialised(self) -> list[SSAValue]:
        need: dict[SSAValue, None] = {}
        for op in self.func.body.block.ops:
            if self.materialises(op):
                need[op.results[0]] = None
            if isinstance(op, ir.MatmulOp):
                for o in (op.lhs, op.rhs):
                    base = o.owner.x if isinstance(o.owner, ir.TransposeOp) else o
                    if base not in self.buf:
                        need[base] = None
        return sorted(need, key=self.position.__getitem__)

    @functools.cached_property
    def position(self) -> dict[SSAValue, int]:
        """Each value of the function by the position of its op (program order; the function is
        only read while it is lowered)."""
        return {v: i for i, op in enumerate(self.func.body.block.ops) for v in op.results}

    def index_values(self) -> dict[SSAValue, list[str]]:
        """Index tensors of gather/scatter/bincount, with the row counts they must stay below."""
        out: dict[SSAValue, list[str]] = {}
        for op in self.func.body.block.ops:
            if isinstance(op, ir.GatherOp):
                rows = ir.tensor_type(op.table).shape[0]
            elif isinstance(op, ir.ScatterAddOp | ir.BincountOp):
                rows = ir.tensor_type(op.result).shape[0]  # (a bincount counted by segments too)
            else:
                continue
            lst = out.setdefault(op.idx, [])
            if rows not in lst:
                lst.append(rows)
        return out

    # ------------------------------------------------------------------ scalar code
    def emit(self, b: _Builder, v: SSAValue, idx: Sequence[SSAValue]) -> SSAValue:
        """Scalar code computing ``v[idx]``."""
        key = ("val", v, tuple(idx))
        if key in b.memo:
            return b.memo[key]
        if v in self.scalars:
            return self.scalars[v]
        if v in self.rowlocal:
            local, xs = self.rowlocal[v]
            if any(i is not x for i, x in zip(idx, xs, strict=False)):
                raise NotFusable(f"{v} read at another row")
            if s.buf_type(local).rank == 0:
                return b.scalar(s.LoadOp(local, []), pinned=True)
            return b.scalar(s.LoadOp(local, list(idx[len(xs):])), key=key)
        if v in self.buf:
            buf = self.buf[v]
            bt = s.buf_type(buf)
            if bt.rank == 0 and bt.role.data == "in":  # a rank-0 input: read once, up front
                return b.scalar(s.LoadOp(buf, []), key=key)
            if bt.rank == 0:
                return b.scalar(s.LoadOp(buf, []), pinned=True)
            return b.scalar(s.LoadOp(buf, list(idx)), key=key)
        op = v.owner
        assert isinstance(op, Operation)
        res = self._emit_op(b, op, idx)
        b.memo[key] = res
        return res

    def _emit_op(self, b: _Builder, op: Operation, idx: Sequence[SSAValue]) -> SSAValue:
        if isinstance(op, ir.ConstantOp):
            return b.const(op.number, ir.tensor_type(op.result).dtype)
        if isinstance(op, ir.DimOp):
            return b.dim(op.dim.data)
        if isinstance(op, ir.FullOp):
            return self.emit(b, op.value, [])
        if isinstance(op, ir.IotaOp):
            i = idx[op.axis.data]
            dt = ir.tensor_type(op.result).dtype
            return i if dt == "i64" else b.scalar(ir.CastOp(i, dt))
        if isinstance(op, ir.BroadcastOp):
            src = ir.tensor_type(op.x)
            zero = b.const(0, "i64")
            sub = [zero if src.shape[i] == "1" else idx[d] for i, d in enumerate(op.dim_map)]
            return self.emit(b, op.x, sub)
        if isinstance(op, ir.TransposeOp):
            perm = op.permutation
            return self.emit(b, op.x, [idx[perm.index(i)] for i in range(len(perm))])
        if isinstance(op, ir.SliceOp):
            a, start = op.axis.data, op.start.data
            sub = list(idx)
            if start != "0":
                sub[a] = b.scalar(ir.AddOp(idx[a], b.dim(start)))
            return self.emit(b, op.x, sub)
        if isinstance(op, ir.ConcatOp) and op in self.part:  # inside one part's span (split_nests)
            k, offset = self.part[op]
            sub = list(idx)
            a = op.axis.data
            if offset != "0":
                sub[a] = b.scalar(ir.SubOp(idx[a], b.dim(offset)))
            return self.emit(b, op.parts[k], sub)
        if isinstance(op, ir.ReshapeOp):
            return self.emit(b, op.x, reshape_index(b, ir.tensor_type(op.x).shape,
                                                    ir.tensor_type(op.result).shape, idx))
        if isinstance(op, ir.GatherOp):
            row = b.scalar(s.LoadOp(self.ibuf[op.idx], list(idx[:1])), key=("idx", op.idx, idx[0]))
            if self.counted_by_segments(op.table.owner):  # type: ignore[arg-type]
                return self._segment_length(b, op.table.owner, row)  # type: ignore[arg-type]
            return self.emit(b, op.table, [row, *idx[1:]])
        if isinstance(op, ir.UnpackBitsOp):
            return b.scalar(s.LoadBitOp(self.buf[op.packed], idx[0]))
        if isinstance(op, ir.CastOp):
            return b.scalar(ir.CastOp(self.emit(b, op.x, idx), ir.tensor_type(op.result).dtype))
        if isinstance(op, ir.SelectOp):
            c, x, y = (self.emit(b, o, idx) for o in op.operands)
            return b.scalar(ir.SelectOp(c, x, y))
        if isinstance(op, ir.CmpOp):
            x, y = (self.emit(b, o, idx) for o in op.operands)
            return b.scalar(ir.CmpOp(op.predicate.data, x, y))
        if isinstance(op, ir.BinaryOp):
            x, y = (self.emit(b, o, idx) for o in op.operands)
            return b.scalar(type(op)(x, y))
        if isinstance(op, ir.UnaryOp):
            return b.scalar(type(op)(self.emit(b, op.x, idx)))
        raise NotImplementedError(f"lower-to-loops: cannot inline {op.name}")

    # ------------------------------------------------------------------ kernels
    def temp(self, v: SSAValue) -> SSAValue:
        t = ir.tensor_type(v)
        alloc = _Builder(self.kblock).alloc(t.shape, t.dtype, "temp", top=True)
        self.buf[v] = alloc.result
        return alloc.result

    def lower_value(self, v: SSAValue, dst: SSAValue) -> None:
        """Compute L0 value ``v`` into buffer ``dst``."""
        op = v.owner
        t = ir.tensor_type(v)
        b = _Builder(self.kblock)
        if isinstance(op, ir.ReduceOp):
            self._reduce(b, op, dst)
        elif isinstance(op, ir.ScatterAddOp):
            self._scatter(b, op, dst)
        elif isinstance(op, ir.BincountOp):
            self._bincount(b, op, dst)
        elif isinstance(op, ir.MatmulOp):
            self._matmul(op, dst)
        elif isinstance(op, ir.ConcatOp) or v in self.split:
            # each part of the concat into its span of the axis (a split value: the whole value,
            # the concat it reads being that part there); under one row loop unless split on rows
            c = op if isinstance(op, ir.ConcatOp) else self.split[v]
            lead = b.loops(t.shape[:1], "parallel", skip_if=b.empty(t.shape[1:])) if c.axis.data else []
            self.split_nests(b, c, t.shape[len(lead):], lead, "i",
                             lambda at: b.stmt(s.StoreOp(self._emit_op(b, op, at), dst, at)))  # type: ignore[arg-type]
            b.close_n(len(lead))
        else:
            ivs = b.loops(t.shape, "parallel", skip_if=b.empty(t.shape[1:]))
            owner = v.owner
            val = self._emit_op(b, owner, ivs) if isinstance(owner, Operation) \
                else self.emit(b, v, ivs)
            b.stmt(s.StoreOp(val, dst, ivs))
            b.close_n(len(ivs))

    def lower_index(self, v: SSAValue, rows: list[str]) -> None:
        """Materialise index tensor ``v`` as i64, failing (status ``index``) on any value outside
        ``[0, rows)`` before a single output element is written."""
        t = ir.tensor_type(v)
        b = _Builder(self.kblock)
        alloc = b.alloc(t.shape, "i64", "temp", top=True)
        self.ibuf[v] = alloc.result
        ivs = b.loops(t.shape, "serial")
        val = self.emit(b, v, ivs)
        val = val if t.dtype == "i64" else b.scalar(ir.CastOp(val, "i64"))
        zero = b.const(0, "i64")
        for r in rows:
            ok = b.scalar(ir.AndOp(b.scalar(ir.CmpOp("ge", val, zero)),
                                   b.scalar(ir.CmpOp("lt", val, b.dim(r)))))
            b.stmt(s.RequireOp(ok, "index", f"index out of range [0, {r})"))
        b.stmt(s.StoreOp(val, alloc.result, ivs))
        b.close_n(len(ivs))

    def _reduce(self, b: _Builder, op: ir.ReduceOp, dst: SSAValue) -> None:
        src = ir.tensor_type(op.x)
        axes = op.axis_list
        if self.column_sum_op(op.result) is op:
            self.column_sums([op], [dst])
            return
        keep = [d for i, d in enumerate(src.shape) if i not in axes]
        outer = b.loops(keep, "parallel", skip_if=b.empty(keep[1:]))
        acc = b.alloc([], src.dtype, "local", zero=op.kind.data == "sum")
        if op.kind.data != "sum":
            inf = float("inf") if op.kind.data == "min" else float("-inf")
            init = b.scalar(ir.ConstantOp(inf, src.dtype), pinned=True)
            b.stmt(s.StoreOp(init, acc.result, []))
        red = [src.shape[a] for a in axes]
        inner = b.loops(red, "reduce", "r", skip_if=b.empty(red[1:]))
        full: list[SSAValue] = []
        it_o, it_i = iter(outer), iter(inner)
        for i in range(src.rank):
            full.append(next(it_i) if i in axes else next(it_o))
        b.stmt(s.AccumOp(op.kind.data, self.emit(b, op.x, full), acc.result, []))
        b.close_n(len(inner))
        b.stmt(s.StoreOp(b.scalar(s.LoadOp(acc.result, []), pinned=True), dst, outer))
        b.close_n(len(outer))

    @staticmethod
    def column_sum_op(v: SSAValue) -> ir.ReduceOp | None:
        """The reduction ``v`` is when it sums over a run of adjacent axes before the last (a
        column sum: over the rows of a matrix, the tokens of (B, N, D), the rows and tokens...)."""
        op = v.owner
        if isinstance(op, ir.ReduceOp) and op.kind.data == "sum":
            rank, axes = ir.tensor_type(op.x).rank, op.axis_list
            if axes and axes == tuple(range(axes[0], axes[-1] + 1)) and axes[-1] < rank - 1:
                return op
        return None

    def lower_values(self, vals: Sequence[tuple[SSAValue, SSAValue]]) -> None:
        """:meth:`lower_value` for each (value, buffer), in order; consecutive column sums over
        the same axes of one shape, none reading another, share one walk over the rows
        (:meth:`column_sums`)."""
        i = 0
        while i < len(vals):
            first = self.column_sum_op(vals[i][0])
            if first is None:
                self.lower_value(*vals[i])
                i += 1
                continue
            ops, dsts = [first], [vals[i][1]]
            for v, dst in vals[i + 1:]:
                op = self.column_sum_op(v)
                if op is None or ir.tensor_type(op.x).shape != ir.tensor_type(first.x).shape \
                        or op.axis_list != first.axis_list or self.sources(v) & {o.result for o in ops}:
                    break
                ops.append(op)
                dsts.append(dst)
            self.column_sums(ops, dsts)
            i += len(ops)

    def chunk_rows(self, b: _Builder, c: SSAValue, rows: str, chunk: int | None = None) -> tuple[SSAValue, SSAValue]:
        """[lo, hi): the rows of dim ``rows`` in chunk ``c`` (``chunk`` rows, by default
        ``self.chunk``; the last fewer)."""
        chunk = chunk or self.chunk
        lo = b.scalar(ir.MulOp(c, b.const(chunk, "i64")))
        return lo, b.scalar(ir.MinOp(b.scalar(ir.AddOp(lo, b.const(chunk, "i64"))), b.dim(rows)))

    def sum_walk(self, whole: bool, axes: int) -> tuple[int, str]:
        """(rows per partial, the kind of the innermost summed loop) of a column sum over
        ``axes`` axes: ``self.chunk`` rows added in order; with ``full_sum_lanes``, a sum down to
        one value per kept index (``whole``) adds its innermost summed axis in a ``reduce`` loop,
        and over one axis (a 1-D tensor summed whole) takes FULL_SUM_CHUNK rows a partial."""
        lanes = self.full_sum_lanes and whole
        return (FULL_SUM_CHUNK if lanes and axes == 1 else self.chunk), ("reduce" if lanes else "serial")

    def column_sums(self, ops: Sequence[ir.ReduceOp], dsts: Sequence[SSAValue]) -> None:
        """Column sums (:meth:`column_sum_op`, over the same axes of one shape) walked row by row:
        a walk down each column reads its elements a row length apart (BatchNorm backward's column
        means took 80 times the memory time, a sum over the tokens of (B, N, D) 9 times
        PyTorch's). Split as (kept before, summed, kept after): for each index of the axes kept
        before, chunks of ``self.chunk`` rows of the first summed axis (with the kept axes before,
        the unit of parallelism) add their rows in order along the axes after into a row of
        partials per sum, summed afterwards in chunk order (:meth:`combine_partials`):
        deterministic whatever the thread count. Several sums read their rows in one walk.

        The kept axes after the summed ones but the last are walked outside the chunks
        (``hoist``, as row groups do: :mod:`~opgen.lower.row_groups`): a row of partials, in L1,
        and more units of parallelism than chunks. The same additions in the same order."""
        src = ir.tensor_type(ops[0].x)
        axes = ops[0].axis_list
        pre, summed = list(src.shape[:axes[0]]), list(src.shape[axes[0]:axes[-1] + 1])
        rest = list(src.shape[axes[-1] + 1:])
        hoist, row = rest[:-1], rest[-1:]
        b = _Builder(self.kblock)
        chunk, last = self.sum_walk(not rest, len(summed))
        kinds = ["serial"] * (len(summed) - 1) + [last]
        nchunk = f"cdiv({summed[0]},{chunk})"
        partials = [_Builder(self.kblock).alloc([*pre, nchunk, *rest], src.dtype, "temp", top=True).result for _ in ops]
        *at, c = b.loops([*pre, *hoist, nchunk], "parallel", "c", skip_if=b.empty(rest), tag_last=CHUNKS)
        at, up = at[:len(pre)], at[len(pre):]
        accs = [b.alloc(row, src.dtype, "local", zero=True).result for _ in ops]
        rows = [b.open(*self.chunk_rows(b, c, summed[0], chunk), kinds[0], "x")]
        rows += [b.loops([d], kind, f"y{i}")[0] for i, (d, kind) in enumerate(zip(summed[1:], kinds[1:], strict=True))]
        inner = b.loops(row, "parallel", "d")
        for op, acc in zip(ops, accs, strict=True):
            b.stmt(s.AccumOp("sum", self.emit(b, op.x, [*at, *rows, *up, *inner]), acc, inner))
        b.close_n(len(inner) + len(rows))
        one = self.store_sums(b, hoist, nchunk, [(acc, row, dst, [*at, *up], p, [*at, c, *up])
                                                 for acc, dst, p in zip(accs, dsts, partials, strict=True)])
        b.close_n(len(pre) + len(hoist) + 1)
        for op, p, dst in zip(ops, partials, dsts, strict=True):
            self.combine_partials(op, p, dst, nchunk, len(pre), skip_if=one)

    def store_sums(self, b: _Builder, hoist: Sequence[str], nchunk: str,
                   sums: Sequence[tuple[SSAValue, list[str], SSAValue, list[SSAValue], SSAValue, list[SSAValue]]],
                   ) -> SSAValue | None:
        """Each unit's rows of sums, ``(acc, its shape, result, result index, partials, partials
        index)`` per sum (the indexes before ``acc``'s own), stored into the partials, or where
        there is one chunk (:meth:`one_chunk`) straight into the result: that condition returned
        (``combine_partials``' ``skip_if``). One loop nest per distinct shape of ``acc``."""
        one = self.one_chunk(b, hoist, nchunk)
        by_row: dict[tuple[str, ...], list[tuple[SSAValue, SSAValue, list[SSAValue], SSAValue, list[SSAValue]]]] = {}
        for acc, row, dst, dst_at, p, p_at in sums:
            by_row.setdefault(tuple(row), []).append((acc, dst, dst_at, p, p_at))

        def store(direct: bool) -> None:
            for row, items in by_row.items():
                inner = b.loops(list(row), "parallel", "d")
                for acc, dst, dst_at, p, p_at in items:
                    to, at = (dst, dst_at) if direct else (p, p_at)
                    b.stmt(s.StoreOp(b.scalar(s.LoadOp(acc, inner)), to, [*at, *inner]))
                b.close_n(len(inner))
        if one is None:
            store(direct=False)
            return None
        branch = b.open_if(one)
        store(direct=True)
        b.otherwise(branch)
        store(direct=False)
        b.close()
        return one

    def one_chunk(self, b: _Builder, hoist: Sequence[str], nchunk: str) -> SSAValue | None:
        """Where a column sum walked with kept axes outside its chunks (``hoist``) has one chunk
        (``nchunk`` is 1), each unit stores its row of sums straight into the result, and the
        partials' sum (:meth:`combine_partials`) runs no iteration: the value true then (None
        where ``one_chunk_direct`` is off or nothing is hoisted). The same bits: the partials' sum
        is ``0 + p0``, and a sum begun at +0 is never -0. A sum over the leading axis of
        8x1024x4096 wrote its partials (16 MiB f32), then read them back and stored them."""
        if not (self.one_chunk_direct and hoist):
            return None
        return b.scalar(ir.CmpOp("eq", b.dim(nchunk), b.const(1, "i64")))

    def combine_partials(self, r: ir.ReduceOp, p: SSAValue, dst: SSAValue, nchunk: str, pre: int = 0,
                         skip_if: SSAValue | None = None) -> None:
        """``dst`` = the sum of the ``nchunk`` partials in ``p``, in order: ``p`` is ``dst``'s
        shape with the chunks' axis inserted after its first ``pre`` axes (no iteration where
        ``skip_if`` holds: :meth:`one_chunk`)."""
        b = _Builder(self.kblock)
        out = b.loops(list(ir.tensor_type(r.result).shape), "parallel", "d", skip_if=skip_if)
        acc = b.alloc([], ir.tensor_type(r.x).dtype, "local", zero=True)
        (c,) = b.loops([nchunk], "serial", "c")
        b.stmt(s.AccumOp("sum", b.scalar(s.LoadOp(p, [*out[:pre], c, *out[pre:]])), acc.result, []))
        b.close()
        b.stmt(s.StoreOp(b.scalar(s.LoadOp(acc.result, []), pinned=True), dst, out))
        b.close_n(len(out))

    def _scatter(self, b: _Builder, op: ir.ScatterAddOp, dst: SSAValue) -> None:
        rt = ir.tensor_type(op.result)
        rows = rt.shape[0]
        rest = list(rt.shape[1:])
        (v,) = b.loops([rows], "parallel", "v", skip_if=b.empty(rest))
        row = b.alloc(rest, rt.dtype, "local", zero=True)
        self.segment_sum(b, op, v, row.result)
        inner = b.loops(rest, "parallel", "d")
        b.stmt(s.StoreOp(b.scalar(s.LoadOp(row.result, inner)), dst, [v, *inner]))
        b.close_n(len(inner) + 1)

    def segments(self, b: _Builder, idx: SSAValue, rows: str) -> tuple[SSAValue, SSAValue]:
        """(segment table, order) of index tensor ``idx`` sorted into ``rows`` segments: one
        stable sort per index tensor, inserted at the top level before the nest being built."""
        key = (idx, rows)
        if key not in self.segs:
            n = ir.tensor_type(idx).shape[0]
            seg = b.alloc([f"segs({rows},{n})"], "i64", "temp", top=True)
            order = b.alloc([n], "i64", "temp", top=True)
            b._insert(s.SegmentsOp(self.ibuf[idx], seg.result, order.result, b.dim(rows)), 0)
            self.segs[key] = (seg.result, order.result)
        return self.segs[key]

    def _segment_bounds(self, b: _Builder, idx: SSAValue, rows: str, v: SSAValue) -> tuple[SSAValue, SSAValue]:
        """[lo, hi) in ``order`` of the positions n with ``idx[n] == v``."""
        seg, _ = self.segments(b, idx, rows)
        r, n = b.dim(rows), b.dim(ir.tensor_type(idx).shape[0])
        lo = b.scalar(s.SegmentStartOp(seg, v, r, n))
        hi = b.scalar(s.SegmentStartOp(seg, b.scalar(ir.AddOp(v, b.const(1, "i64"))), r, n))
        return lo, hi

    def _segment_length(self, b: _Builder, op: ir.BincountOp, row: SSAValue) -> SSAValue:
        """``bincount(idx, R)[row]`` as the length of ``row``'s segment."""
        lo, hi = self._segment_bounds(b, op.idx, ir.tensor_type(op.result).shape[0], row)
        count = b.scalar(ir.SubOp(hi, lo))
        dt = ir.tensor_type(op.result).dtype
        return count if dt == "i64" else b.scalar(ir.CastOp(count, dt))

    def segment_sum(self, b: _Builder, op: ir.ScatterAddOp, v: SSAValue, row: SSAValue) -> None:
        """``row += values[n]`` for every n with ``idx[n] == v``, in increasing n (owner-computes
        over a stable sort of the indices, built once before the outermost loop)."""
        rows = ir.tensor_type(op.result).shape[0]
        _, order = self.segments(b, op.idx, rows)
        lo, hi = self._segment_bounds(b, op.idx, rows, v)
        seg = b.open(lo, hi, "serial", "s")
        n = b.scalar(s.LoadOp(order, [seg]))
        inner = b.loops(list(ir.tensor_type(op.result).shape[1:]), "parallel", "d")
        b.stmt(s.AccumOp("sum", self.emit(b, op.values, [n, *inner]), row, inner))
        b.close_n(len(inner) + 1)

    def _bincount(self, b: _Builder, op: ir.BincountOp, dst: SSAValue) -> None:
        rt = ir.tensor_type(op.result)
        (v,) = b.loops([rt.shape[0]], "parallel", "v")
        b.stmt(s.StoreOp(b.const(0, rt.dtype), dst, [v]))
        b.close()
        n_dim = ir.tensor_type(op.idx).shape[0]
        (n,) = b.loops([n_dim], "serial", "n")
        row = b.scalar(s.LoadOp(self.ibuf[op.idx], [n]))
        b.stmt(s.AccumOp("sum", b.const(1, rt.dtype), dst, [row]))
        b.close()

    def _matmul(self, op: ir.MatmulOp, dst: SSAValue) -> None:
        def operand(v: SSAValue) -> tuple[SSAValue, bool]:
            if isinstance(v.owner, ir.TransposeOp) and v.owner.x in self.buf:
                return self.buf[v.owner.x], True
            return self.buf[v], False

        (a, ta), (bb, tb) = operand(op.lhs), operand(op.rhs)
        b = _Builder(self.kblock)
        m, n = ir.tensor_type(op.result).shape
        k = ir.tensor_type(op.lhs).shape[1]
        self.kblock.add_op(s.BufferMatmulOp(a, bb, dst, b.dim(m), b.dim(n), b.dim(k), ta, tb))

    # ------------------------------------------------------------------ driver
    def _reads(self, v: SSAValue) -> tuple[bool, bool]:
        """Whether ``v`` (through inlined ops) reads tensor data, and whether it reads a
        materialised value (a reduction, scatter-add, bincount or matmul)."""
        data = late = False
        todo, seen = [v], set()
        while todo:
            x = todo.pop()
            if x in seen:
                continue
            seen.add(x)
            if x in self.buf:
                data = True
            op = x.owner
            if self.materialises(op):
                data = late = True
            elif isinstance(op, Operation):
                todo.extend(op.operands)
        return data, late

    @staticmethod
    def _gathers(v: SSAValue) -> bool:
        """Whether ``v`` reads through a gather (so needs the range-checked indices)."""
        todo, seen = [v], set()
        while todo:
            x = todo.pop()
            if x in seen or not isinstance(x.owner, Operation):
                continue
            seen.add(x)
            if isinstance(x.owner, ir.GatherOp):
                return True
            todo.extend(x.owner.operands)
        return False

    def late_checks(self) -> list[ir.CheckOp]:
        """Checks whose condition reads a materialised value: run once those are computed (into
        temporaries), before any output is written."""
        return [op for op in self.func.body.block.ops if isinstance(op, ir.CheckOp) and self._reads(op.cond)[1]]

    def lower_check(self, op: ir.CheckOp) -> None:
        """Fail with the check's status unless every element of its condition holds."""
        b = _Builder(self.kblock)
        ivs = b.loops(ir.tensor_type(op.cond).shape, "serial", "c")
        b.stmt(s.RequireOp(self.emit(b, op.cond, ivs), op.status.data, op.message.data))
        b.close_n(len(ivs))

    def prologue(self) -> None:
        """Everything that can fail, before any output is touched: the op's run-time checks on
        scalars and sizes, mask lengths, the range-checked copies of index tensors, then checks
        on tensor data (those reading materialised values come later, see late_checks)."""
        b = _Builder(self.kblock)
        data_checks = []
        for op in self.func.body.block.ops:
            if isinstance(op, ir.CheckOp):
                data, late = self._reads(op.cond)
                if not data:
                    b.stmt(s.RequireOp(self.emit(b, op.cond, []), op.status.data, op.message.data))
                elif not late:
                    data_checks.append(op)
            if isinstance(op, ir.UnpackBitsOp):
                self._mask_check(b, op)
        gathers = [op for op in data_checks if self._gathers(op.cond)]
        for op in data_checks:  # before the index checks, as the oracle (program order) has them
            if op not in gathers:
                self.lower_check(op)
        for v, rows in self.index_values().items():
            self.lower_index(v, rows)
        for op in gathers:  # these read through range-checked indices
            self.lower_check(op)

    def run(self) -> s.KernelOp:
        self.prologue()
        late = self.late_checks()
        vals = []
        for v in self.materialised():
            ret_only = all(u.operation is self.ret for u in v.uses)
            direct = isinstance(v.owner, ir.ReduceOp | ir.ScatterAddOp) and ret_only \
                and sum(1 for x in self.ret.values if x is v) == 1
            if not direct:  # (else computed straight into its output below)
                vals.append((v, self.temp(v)))
        self.lower_values(vals)
        for op in late:
            self.lower_check(op)
        outs = list(zip((n.data for n in self.ret.names.data), self.ret.values, strict=True))
        outs.sort(key=lambda nv: nv[0] in self.aliases)  # aliased outputs are written last
        names = [a.data for a in self.func.arg_names.data]
        for name, v in outs:
            dst = self.kblock.args[names.index(name)]
            if v in self.buf:
                self._copy(v, dst)  # already in memory: store it (rounding once)
            else:
                self.lower_value(v, dst)
        return self.kernel

    def _copy(self, v: SSAValue, dst: SSAValue) -> None:
        b = _Builder(self.kblock)
        shape = ir.tensor_type(v).shape
        ivs = b.loops(shape, "parallel", skip_if=b.empty(shape[1:]))
        b.stmt(s.StoreOp(self.emit(b, v, ivs), dst, ivs))
        b.close_n(len(ivs))

    def _mask_check(self, b: _Builder, op: ir.UnpackBitsOp) -> None:
        p = ir.tensor_type(op.packed)
        n = ir.tensor_type(op.result).shape[0]
        flags = b.scalar(s.FlagsPerElemOp(self.buf[op.packed]))
        have = b.scalar(ir.MulOp(b.dim(p.shape[0]), flags))
        ok = b.scalar(ir.CmpOp("ge", have, b.dim(n)))
        b.stmt(s.RequireOp(ok, "shape", f"mask must hold at least {n} flags"))


def reshape_index(b: _Builder, src: Sequence[str], dst: Sequence[str], idx: Sequence[SSAValue]) -> list[SSAValue]:
    """The source indices of element ``idx`` of a row-major reshape ``src -> dst``, group by
    group (opgen.ir.dims.reshape_groups): a group's result indices make a linear index, which
    its source dims split again (innermost first)."""
    out: list[SSAValue] = [b.const(0, "i64")] * len(src)
    for gs, gd in dims.reshape_groups(src, dst):
        if len(gs) == 1 and len(gd) == 1:
            out[gs[0]] = idx[gd[0]]
            continue
        lin: SSAValue | None = None
        for j in gd:
            if dst[j] == "1":
                continue
            lin = idx[j] if lin is None else b.scalar(ir.AddOp(b.scalar(ir.MulOp(lin, b.dim(dst[j]))), idx[j]))
        if lin is None:
            continue
        real = [i for i in gs if src[i] != "1"]
        for k, i in enumerate(reversed(real)):
            if k == len(real) - 1:
                out[i] = lin
                break
            q = b.scalar(ir.DivOp(lin, b.dim(src[i])))
            out[i] = b.scalar(ir.SubOp(lin, b.scalar(ir.MulOp(q, b.dim(src[i])))))
            lin = q
    return out


def lower_func(func: ir.FuncOp, aliases: set[str] = frozenset(), fuse: bool = True,  # type: ignore[assignment]
               chain_rows: int | None = None, chain_groups: int | None = None,
               column_chunk: int | None = None, full_sum_lanes: bool = False,
               one_chunk_direct: bool = False, row_scratch: bool = False, fold_rows: bool = False) -> s.KernelOp:
    """Lower one function; with ``fuse``, matmul chains (opgen.lower.matmul_chain, tiles of
    ``chain_rows`` rows; one pass over ``chain_groups`` column groups when given) or row groups
    (opgen.lower.row_groups, column partials per ``column_chunk`` rows) are formed where legal,
    else every materialised value gets its own loop nest (``full_sum_lanes``, ``one_chunk_direct``,
    ``row_scratch``, ``fold_rows``: _Lowering's)."""
    def run(lowering: _Lowering) -> s.KernelOp:
        lowering.full_sum_lanes = full_sum_lanes
        lowering.one_chunk_direct = one_chunk_direct
        lowering.row_scratch = row_scratch
        lowering.fold_rows = fold_rows
        return lowering.run()

    if fuse:
        from opgen.lower.matmul_chain import ROW_BLOCK, MatmulChainLowering
        from opgen.lower.row_groups import RowGroupLowering

        try:
            return run(MatmulChainLowering(func, set(aliases), row_block=chain_rows or ROW_BLOCK, groups=chain_groups))
        except NotFusable:
            pass
        try:
            return run(RowGroupLowering(func, set(aliases), column_chunk))
        except NotFusable:
            pass
    return run(_Lowering(func, set(aliases), column_chunk))


@dataclass(frozen=True)
class LowerToLoops(ModulePass):
    """Replace every ``opgen.func`` with a ``sched.kernel`` (see module docstring)."""

    name = "lower-to-loops"
    fuse: bool = True
    #: rows per tile of matmul chains (None: the default, opgen.lower.matmul_chain.ROW_BLOCK)
    chain_rows: int | None = None
    #: matmul chains in one pass over this many column groups (None: two passes, each owning
    #: its outputs' rows; opgen.lower.matmul_chain)
    chain_groups: int | None = None
    #: rows per partial of a column sum (None: COLUMN_CHUNK)
    column_chunk: int | None = None
    #: sums down to one value per kept index in lanes (_Lowering.full_sum_lanes)
    full_sum_lanes: bool = False
    #: a column sum of one chunk stored straight into its result (_Lowering.one_chunk_direct)
    one_chunk_direct: bool = False
    #: costly values read by several nests of a row kept in a row of scratch (_Lowering.row_scratch)
    row_scratch: bool = False
    #: a row group's rows over its members' shared leading dims (_Lowering.fold_rows)
    fold_rows: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for f in list(op.body.block.ops):
            if isinstance(f, ir.FuncOp):
                k = lower_func(f, set(f.aliased_outputs), self.fuse, self.chain_rows, self.chain_groups,
                               self.column_chunk, self.full_sum_lanes, self.one_chunk_direct, self.row_scratch,
                               self.fold_rows)
                op.body.block.insert_op_before(k, f)
                op.body.block.erase_op(f)
