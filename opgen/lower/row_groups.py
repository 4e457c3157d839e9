"""Row groups: one parallel loop over a leading dim X computing everything row-local at once.

A group for dim X holds
  * the outputs whose leading dim is X (stored row by row),
  * "column" reductions over X that are outputs (``sum(..., axis=0)``),
  * row-local values: reductions and scatter-adds whose result leads with X and which only
    group members read, always at the current row — computed into per-row scratch first.
Column reductions accumulate per fixed chunk of rows (to_loops.COLUMN_CHUNK, or the target's ``chunk``) into a
workspace of partials, summed afterwards in chunk order: deterministic and independent of the
thread count. A chunk is the unit of parallelism of the row loop: the GPU takes smaller ones.
Within a row, reads come before writes (column accumulations, then outputs, aliased ones last),
so an output may alias an input read at the same element.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects.builtin import ArrayAttr, StringAttr, UnitAttr
from xdsl.ir import Operation, SSAValue

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.to_loops import CHUNKS, ROWS, NotFusable, _Builder, _Lowering


def column_sum(v: SSAValue) -> ir.ReduceOp | None:
    """The sum over the leading dim that ``v`` is, also through float-to-float casts (storing the
    sum into the output rounds it to the output's dtype once, as the cast does): such an output
    is summed in the row loop as column partials."""
    op = v.owner
    while isinstance(op, ir.CastOp) and all(d.is_float for x in (op.x, op.result)
                                            for d in ir.dtype_members(op, ir.tensor_type(x).dtype)):
        op = op.x.owner
    if isinstance(op, ir.ReduceOp) and op.axis_list == (0,) and op.kind.data == "sum":
        return op
    return None


#: elementwise ops that cost a polynomial or more an element: a value computed with one and read
#: by more than one loop nest of a row is computed once per row and kept (RowGroupLowering.kept_rows)
COSTLY = (ir.ExpOp, ir.LogOp, ir.TanhOp, ir.SigmoidOp, ir.ErfOp, ir.PowOp)


@dataclass
class RowGroup:
    dim: str
    outputs: list[tuple[str, SSAValue]] = field(default_factory=list)
    colreds: list[tuple[str, ir.ReduceOp]] = field(default_factory=list)
    rowlocal: list[SSAValue] = field(default_factory=list)
    #: the dims of a row: ``dim`` and the members' shared leading dims after it where folded
    #: (RowGroupLowering.row_dims)
    rows: list[str] = field(default_factory=list)


class RowGroupLowering(_Lowering):
    """``lower-to-loops`` with row groups (falls back by raising NotFusable); column reductions
    take partials per ``chunk`` rows."""

    def __init__(self, func: ir.FuncOp, aliases: set[str], chunk: int | None = None):
        super().__init__(func, aliases, chunk)

    def sinks(self, v: SSAValue) -> set[SSAValue]:
        """Materialised values / returned values that consume ``v`` through inlined ops."""
        out: set[SSAValue] = set()
        todo = [v]
        seen: set[SSAValue] = set()
        while todo:
            x = todo.pop()
            for use in x.uses:
                u = use.operation
                if isinstance(u, ir.ReturnOp):
                    out.add(x)
                elif self.materialises(u) or isinstance(u, ir.CheckOp):
                    out.add(u.results[0] if u.results else x)
                else:
                    for r in u.results:
                        if r not in seen:
                            seen.add(r)
                            todo.append(r)
        return out

    def plan(self) -> list[RowGroup]:
        names = [n.data for n in self.ret.names.data]
        groups: dict[str, RowGroup] = {}
        for name, v in zip(names, self.ret.values, strict=True):
            t = ir.tensor_type(v)
            op = column_sum(v)
            if op is not None:
                x = ir.tensor_type(op.x).shape[0]
                groups.setdefault(x, RowGroup(x)).colreds.append((name, op))
            elif t.rank >= 1 and not isinstance(v.owner, ir.MatmulOp | ir.ConcatOp):
                groups.setdefault(t.shape[0], RowGroup(t.shape[0])).outputs.append((name, v))
            else:
                raise NotFusable("output outside any row group")
        members_of: dict[SSAValue, str] = {}
        for g in groups.values():
            for _, v in g.outputs:
                members_of[v] = g.dim
            for name, r in g.colreds:
                members_of[r.results[0]] = g.dim
                members_of[self.ret.output(name)] = g.dim
        mat = self.materialised()
        # consumers first: a row reduction read only by another row-local one (a softmax's max,
        # read by its sum of exps and its output) joins the group once that one has
        for m in reversed(mat):
            op = m.owner
            lead = ir.tensor_type(m).shape[0] if ir.tensor_type(m).rank else None
            row_op = (isinstance(op, ir.ReduceOp) and 0 not in op.axis_list) or isinstance(op, ir.ScatterAddOp)
            if m in members_of:
                if row_op and members_of[m] == lead and any(m is v for _, v in groups[lead].outputs):
                    groups[lead].rowlocal.append(m)  # an output that is itself a row reduction
                continue
            sinks = self.sinks(m)
            if row_op and lead in groups and sinks and all(
                    members_of.get(k) == lead for k in sinks):
                groups[lead].rowlocal.append(m)
                members_of[m] = lead
        for g in groups.values():
            g.rows = self.row_dims(g)
        if self.row_scratch:
            members = set(members_of)
            for g in groups.values():
                for v in self.kept_rows(g, members):
                    g.rowlocal.append(v)
                    members_of[v] = g.dim
        # values computed before the groups must not depend on group members
        for m in mat:
            if m not in members_of and any(src in members_of for src in self._all_sources(m)):
                raise NotFusable("a separately computed value depends on a row group")
        return list(groups.values())

    def row_dims(self, g: RowGroup) -> list[str]:
        """The dims of ``g``'s rows: ``g.dim``, then (``fold_rows``) each next leading dim that
        every output and row-local value of the group shares, as long as each row so indexed is
        computed on its own: no column sums, split outputs or scatter-adds, and each row-local
        reduction over axes after the rows' alone. The rows' loops nest one in another with
        nothing between them (map-cpu splits the nest among the threads: a (1, T, D) RMSNorm
        ran on one thread). The same values per row: the same bits."""
        if not self.fold_rows or g.colreds or any(v in self.split for _, v in g.outputs):
            return [g.dim]
        if any(not isinstance(m.owner, ir.ReduceOp | ir.ElementwiseOp) for m in g.rowlocal):
            return [g.dim]
        shapes = [ir.tensor_type(v).shape for _, v in g.outputs] + [ir.tensor_type(m).shape for m in g.rowlocal]
        rows = [g.dim]
        # (each output keeps an axis after its rows: its loop nest's innermost, vectorised)
        for k in range(1, min(len(ir.tensor_type(v).shape) for _, v in g.outputs) - 1):
            d = shapes[0][k]
            if d.isdigit() or any(len(sh) <= k or sh[k] != d for sh in shapes) or any(
                    isinstance(m.owner, ir.ReduceOp) and min(m.owner.axis_list) <= k for m in g.rowlocal):
                break
            rows.append(d)
        return rows

    def _elementwise_tree(self, root: SSAValue, stop: set[SSAValue]) -> list[SSAValue]:
        """The values ``root`` is computed from through elementwise ops alone (``root`` first
        where it is one), each read at ``root``'s own index; not past ``stop`` or a
        materialised value."""
        out: list[SSAValue] = []
        todo, seen = [root], set()
        while todo:
            v = todo.pop()
            if v in seen or v in stop or not isinstance(v.owner, ir.ElementwiseOp) or self.materialises(v.owner):
                continue
            seen.add(v)
            out.append(v)
            todo.extend(v.owner.operands)
        return out

    def kept_rows(self, g: RowGroup, members: set[SSAValue]) -> list[SSAValue]:
        """Elementwise values of ``g``'s rows worth a row of scratch each (row_scratch): computed
        with a COSTLY op and read by more than one of the group's loop nests (a softmax's exps,
        by its sum and by its output; each row-local reduction is a nest, the outputs and
        column sums sharing a row shape one), each then computed once per row (row_value) and
        loaded where it is read, the outermost first. The same values: the same bits. Only in a
        group with row-local reductions and no scatter-adds, for values of rank 2 (a row one
        vector: a row of a higher rank could outgrow the caches) read through elementwise ops
        alone (each at its own index, so at the current row) and by group members alone."""
        reductions = [m for m in g.rowlocal if isinstance(m.owner, ir.ReduceOp)]
        if not reductions or len(reductions) != len(g.rowlocal):
            return []
        nests: list[tuple[object, SSAValue]] = [(m, m.owner.x) for m in reductions]  # type: ignore[union-attr]
        nests += [(tuple(ir.tensor_type(r.x).shape[1:]), r.x) for _, r in g.colreds]
        nests += [(v if v in self.split else tuple(ir.tensor_type(v).shape[1:]), v) for _, v in g.outputs]
        picked: list[SSAValue] = []
        while True:
            stop = set(picked) | set(g.rowlocal)
            reach: dict[SSAValue, set[object]] = {}
            for nest, root in nests:
                for v in self._elementwise_tree(root, stop):
                    reach.setdefault(v, set()).add(nest)
            cands = [v for v, ns in reach.items() if len(ns) > 1 and self._worth_a_row(v, g, stop, members)]
            if not cands:
                return picked
            picked.append(max(cands, key=self.position.__getitem__))

    def _worth_a_row(self, v: SSAValue, g: RowGroup, stop: set[SSAValue], members: set[SSAValue]) -> bool:
        t = ir.tensor_type(v)
        k = len(g.rows)
        if t.rank != k + 1 or list(t.shape[:k]) != g.rows or not self.sinks(v) <= members | {v}:
            return False
        return any(isinstance(x.owner, COSTLY) for x in self._elementwise_tree(v, stop))

    def _all_sources(self, v: SSAValue) -> set[SSAValue]:
        out: set[SSAValue] = set()
        todo = list(self.sources(v))
        while todo:
            x = todo.pop()
            if x in out:
                continue
            out.add(x)
            todo.extend(self.sources(x) if isinstance(x.owner, Operation) else [])
            op = x.owner
            if isinstance(op, Operation):
                todo.extend(o for o in op.operands if self.materialises(o.owner))
        return out

    # ------------------------------------------------------------------ driver
    def run(self) -> s.KernelOp:
        if self.late_checks():
            raise NotFusable("a check reads a materialised value")
        groups = self.plan()
        self.prologue()
        grouped = {m for g in groups for m in g.rowlocal}
        grouped |= {v for g in groups for _, v in g.outputs}
        grouped |= {x for g in groups for name, r in g.colreds for x in (r.results[0], self.ret.output(name))}
        self.lower_values([(v, self.temp(v)) for v in self.materialised() if v not in grouped])
        for g in groups:
            self.lower_group(g)
        return self.kernel

    def arg(self, name: str) -> SSAValue:
        names = [a.data for a in self.func.arg_names.data]
        return self.kblock.args[names.index(name)]

    def lower_group(self, g: RowGroup) -> None:
        b = _Builder(self.kblock)
        x_dim = g.dim
        # no row does anything when every member's row is empty
        rests = [ir.tensor_type(r.x).shape[1:] for _, r in g.colreds] + \
            [ir.tensor_type(v).shape[1:] for _, v in g.outputs]
        skip = b.empty(*rests)
        partials: list[tuple[str, ir.ReduceOp, SSAValue, SSAValue]] = []
        # a 1-D tensor summed whole (no output, nothing after the rows' axis): sum_walk's lanes
        whole = (bool(g.colreds) and not g.outputs and not g.rowlocal
                 and all(not ir.tensor_type(r.x).shape[1:] for _, r in g.colreds))
        chunk, kind = self.sum_walk(whole, 1)
        nchunk = f"cdiv({x_dim},{chunk})"
        hoist = self.hoisted(g, rests)
        up: list[SSAValue] = []
        if g.colreds:
            for name, r in g.colreds:
                rest = list(ir.tensor_type(r.result).shape)
                p = _Builder(self.kblock).alloc([nchunk, *rest], ir.tensor_type(r.x).dtype, "temp", top=True)
                partials.append((name, r, p.result, SSAValue.get(p.result)))
            *up, c = b.loops([*hoist, nchunk], "parallel", "c", skip_if=skip, tag_last=CHUNKS)
            accs = []
            for _, r, _, _ in partials:
                rest = list(ir.tensor_type(r.result).shape)[len(hoist):]
                a = b.alloc(rest, ir.tensor_type(r.x).dtype, "local", zero=True)
                accs.append(a.result)
            x = b.open(*self.chunk_rows(b, c, x_dim, chunk), kind, "x")
        else:
            xs = b.loops(g.rows or [x_dim], "parallel", "x", skip_if=skip)
            for iv in xs[1:]:  # (folded rows: map-cpu splits the nest)
                iv.owner.parent_op().attributes[ROWS] = UnitAttr()  # type: ignore[union-attr]
            x = xs[0]
            accs = []
        rows = [x] if g.colreds else xs
        # row-local values, in program order
        for m in sorted(g.rowlocal, key=self.position.__getitem__):
            self.row_value(b, m, rows)
        # one loop nest over the trailing dims for all members sharing it; reads first
        members: list[tuple[str, object]] = []
        for (_, r), acc in zip(g.colreds, accs, strict=True):
            members.append(("acc", (r, acc)))
        outs = sorted(g.outputs, key=lambda nv: nv[0] in self.aliases)
        for name, v in outs:
            members.append(("out", (name, v)))
        by_rest: dict[tuple[str, ...], list[tuple[str, object]]] = {}
        split: list[tuple[str, SSAValue]] = []
        for kind, item in members:
            if kind == "acc":
                r = item[0]  # type: ignore[index]
                rest = tuple(ir.tensor_type(r.x).shape[len(rows) + len(hoist):])
            else:
                v = item[1]  # type: ignore[index]
                rest = tuple(ir.tensor_type(v).shape[len(rows) + len(hoist):])
                if v in self.split:  # its own nests (below), one per part of the concat it reads
                    split.append(item)  # type: ignore[arg-type]
                    continue
            by_rest.setdefault(rest, []).append((kind, item))
        for rest, items in by_rest.items():
            inner = b.loops(list(rest), "parallel", "d")
            for kind, item in items:
                if kind == "acc":
                    r, acc = item  # type: ignore[misc]
                    b.stmt(s.AccumOp("sum", self.emit(b, r.x, [*rows, *up, *inner]), acc, inner))
                else:
                    name, v = item  # type: ignore[misc]
                    b.stmt(s.StoreOp(self.emit(b, v, [*rows, *up, *inner]), self.arg(name), [*rows, *up, *inner]))
            b.close_n(len(inner))
        for name, v in split:
            self.split_nests(b, self.split[v], ir.tensor_type(v).shape[1:], [x], "d", lambda at, name=name, v=v: b.stmt(
                s.StoreOp(self.emit(b, v, at), self.arg(name), at)))
        b.close_n(len(rows))  # the rows
        if g.colreds:
            one = self.store_sums(b, hoist, nchunk, [
                (acc, list(ir.tensor_type(r.result).shape)[len(hoist):], self.arg(name), up, p, [c, *up])
                for (name, r, p, _), acc in zip(partials, accs, strict=True)])
            b.close_n(1 + len(hoist))  # c and the hoisted axes
            for name, r, p, _ in partials:
                self.combine_partials(r, p, self.arg(name), nchunk, skip_if=one)

    def hoisted(self, g: RowGroup, rests: list[list[str]]) -> list[str]:
        """The kept axes walked outside the chunks of rows (all but the last of the members'
        one shape after X; :meth:`~opgen.lower.to_loops._Lowering.column_sums`'s ``hoist``): a
        sum over the leading axis of (B, N, D) adds rows of D for each n with a row of partials in
        L1, N x chunks the units of parallelism, where a walk of whole (N, D) slices kept a slice
        of partials per thread (B = 8, N x D = 4M f32: one chunk, so one thread, and 16 MiB of
        partials; 0.2x PyTorch). The same additions in the same order. Only where the group has
        column sums, no row-local values (computed over a whole row) and no split outputs."""
        shapes = {tuple(r) for r in rests}
        if not g.colreds or g.rowlocal or len(shapes) != 1 or any(v in self.split for _, v in g.outputs):
            return []
        (rest,) = shapes
        return list(rest[:-1])

    def row_value(self, b: _Builder, m: SSAValue, xs: list[SSAValue]) -> None:
        """Compute the row of ``m`` at ``xs`` (its leading indices) into a per-row scratch buffer."""
        op = m.owner
        t = ir.tensor_type(m)
        k = len(xs)
        rest = list(t.shape[k:])
        local = b.alloc(rest, t.dtype, "local", zero=not isinstance(op, ir.ElementwiseOp))
        if isinstance(op, ir.ElementwiseOp):  # (kept_rows: each element stored before it is read)
            inner = b.loops(rest, "parallel", "d")
            loop = inner[0].owner.parent_op() if inner else None
            b.stmt(s.StoreOp(self._emit_op(b, op, [*xs, *inner]), local.result, inner))
            b.close_n(len(inner))
            read = sorted({s.buf_type(o.buf).dtype for o in (loop.walk() if loop else ()) if isinstance(o, s.LoadOp)
                           and s.buf_type(o.buf).role.data in ("in", "out")})
            if read:
                local.attributes[s.LANE_DTYPES] = ArrayAttr([StringAttr(d) for d in read])
        elif isinstance(op, ir.ReduceOp) and self.column_sum_op(m) is op and op.axis_list[0] > 0:
            # a column sum within the row (a sum over the tokens of (B, N, D)): the summed axes'
            # rows in order, each along the axes after them (column_sums)
            src, axes = ir.tensor_type(op.x), op.axis_list
            mid = b.loops([src.shape[i] for i in range(k, axes[0])], "parallel", "d")
            rows = b.loops([src.shape[a] for a in axes], "serial", "y")
            after = b.loops(list(src.shape[axes[-1] + 1:]), "parallel", "d")
            b.stmt(s.AccumOp("sum", self.emit(b, op.x, [*xs, *mid, *rows, *after]), local.result, [*mid, *after]))
            b.close_n(len(after) + len(rows) + len(mid))
        elif isinstance(op, ir.ReduceOp):
            src = ir.tensor_type(op.x)
            axes = op.axis_list
            kept = [i for i in range(src.rank) if i not in axes]
            outer = b.loops(rest, "parallel", "d")
            acc = b.alloc([], src.dtype, "local", zero=op.kind.data == "sum")
            if op.kind.data != "sum":
                inf = float("inf") if op.kind.data == "min" else float("-inf")
                b.stmt(s.StoreOp(b.scalar(ir.ConstantOp(inf, src.dtype), pinned=True), acc.result, []))
            inner = b.loops([src.shape[a] for a in axes], "reduce", "r")
            full: list[SSAValue] = [*xs, *[xs[0]] * (src.rank - k)]
            for i, iv in zip(kept[k:], outer, strict=True):
                full[i] = iv
            for a, iv in zip(axes, inner, strict=True):
                full[a] = iv
            b.stmt(s.AccumOp(op.kind.data, self.emit(b, op.x, full), acc.result, []))
            b.close_n(len(inner))
            b.stmt(s.StoreOp(b.scalar(s.LoadOp(acc.result, []), pinned=True), local.result, outer))
            b.close_n(len(outer))
        elif isinstance(op, ir.ScatterAddOp):
            self.segment_sum(b, op, xs[0], local.result)
        else:
            raise NotFusable(f"{op} cannot be computed per row")
        self.rowlocal[m] = (local.result, tuple(xs))

