"""Per-row values on the tile level: integers and flags of a row, evaluated by the core's scalar
unit from single elements of the parameters — the targets and masks a one-hot tile or a check on
tensor data reads (FLCE's ``iota == target`` and its range check)."""

from __future__ import annotations

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, IntAttr, StringAttr
from xdsl.ir import BlockArgument, SSAValue

from opgen.ir import dialect as ir
from opgen.lower.matmul_chain import _strip_cast
from opgen.tile import dialect as t
from opgen.tile.indices import IndexUnsupported, index_params, mark_converted
from opgen.tile.lower import TileUnsupported


def scalar_bcast(v: SSAValue) -> SSAValue | None:
    """The rank-0 value ``v`` broadcasts, if it is one."""
    op = v.owner
    if isinstance(op, ir.BroadcastOp | ir.FullOp) and ir.tensor_type(op.operands[0]).rank == 0:
        return op.operands[0]
    return None


class RowValues:
    """Mixin: per-row values (shape ``[X]`` or ``[X, 1]``) of integers and flags evaluated by the
    scalar unit at one row, reading single elements of the parameters (``tile.load``,
    ``tile.load_bit``): the targets and masks a one-hot or a check on tensor data reads."""

    def row_value(self, v: SSAValue, row: SSAValue, memo: dict[SSAValue, SSAValue]) -> SSAValue:
        if v in memo:
            return memo[v]
        op = v.owner
        tt = ir.tensor_type(v)
        if tt.rank == 0:
            res = self.scalar(v)  # type: ignore[attr-defined]
        elif isinstance(v, BlockArgument):
            if tt.rank != 1:
                raise TileUnsupported(self.name, "a per-row value of a 2-D tensor")  # type: ignore[attr-defined]
            res = self.add(t.LoadOp(self.args[self.names[v.index]], row))  # type: ignore[attr-defined]
        elif isinstance(op, ir.UnpackBitsOp):
            if not isinstance(op.packed, BlockArgument):
                raise TileUnsupported(self.name, "unpack_bits of a computed mask")  # type: ignore[attr-defined]
            res = self.add(t.LoadBitOp(self.args[self.names[op.packed.index]], row))  # type: ignore[attr-defined]
        elif isinstance(op, ir.BroadcastOp) and ir.tensor_type(op.x).rank <= 1:
            res = self.row_value(op.x, row, memo)
        elif isinstance(op, ir.CastOp):
            x = self.row_value(op.x, row, memo)
            dt = self.dt(tt.dtype)  # type: ignore[attr-defined]
            res = x if ir.tensor_type(x).dtype == dt else self.add(ir.CastOp(x, dt))  # type: ignore[attr-defined]
        elif isinstance(op, ir.CmpOp | ir.AndOp | ir.OrOp | ir.NotOp | ir.AddOp | ir.SubOp | ir.MulOp | ir.SelectOp):
            ops = [self.row_value(o, row, memo) for o in op.operands]
            res = self.add(self._rebuild(op, ops))  # type: ignore[attr-defined]
        else:
            raise TileUnsupported(self.name, f"{op.name} in a per-row value")  # type: ignore[attr-defined, union-attr]
        memo[v] = res
        return res

    def begin_kernel(self, suffix: str, schedule: str) -> t.KernelOp:
        """A kernel of this binding (symbol ``<op>.<dtypes>[.<suffix>]``) whose tensor parameters
        keep their dtypes (no index conversion), with the lowering's state set for building its
        body: the tiling region, then the op's host checks."""
        self.index = self.index_params()  # type: ignore[attr-defined]
        names, args, binding = self.names, self.func.body.block.args, self.binding  # type: ignore[attr-defined]
        arg_types = [tt if (tt := ir.tensor_type(a)).rank == 0 else t.GmType.make(tt.shape, self.dt(tt.dtype))  # type: ignore[attr-defined]
                     for a in args]
        sym = ".".join([self.name, *(d.name for d in binding.values()), *([suffix] if suffix else [])])  # type: ignore[attr-defined]
        k = t.KernelOp(sym, [*names, "workspace"], [*arg_types, t.GmType.make([t.WS_BYTES], "u8")],
                       DictionaryAttr({v: StringAttr(d.name) for v, d in binding.items()}))
        k.attributes["part"] = IntAttr(self.part)  # type: ignore[attr-defined]
        k.attributes["indices"] = DictionaryAttr({})
        k.attributes["free"] = ArrayAttr([])
        mark_converted(k, self.func)  # type: ignore[attr-defined]
        k.attributes["schedule"] = StringAttr(schedule)
        self.block = self.cur = k.body.block
        self.args = dict(zip(names, k.body.block.args, strict=False))
        self.env, self.col_env, self.rowvals = {}, {}, {}
        self.scalars = {a: ka for a, ka in zip(args, k.body.block.args, strict=False) if ir.tensor_type(a).rank == 0}
        self.anchor = None
        self.partials: list[SSAValue] = []
        self.tiling = t.TilingOp()
        self.block.add_op(self.tiling)
        self.emit_checks()
        return k

    def index_params(self) -> dict[str, object]:
        """The function's index parameters (opgen/tile/indices.py), or TileUnsupported."""
        try:
            return index_params(self.func)  # type: ignore[attr-defined]
        except IndexUnsupported as e:
            raise TileUnsupported(self.name, str(e)) from None  # type: ignore[attr-defined]


def one_hot(v: SSAValue) -> tuple[SSAValue, list[SSAValue]] | None:
    """``(t, conds)`` when ``v`` ([X, N] bool) is ``iota(axis=1) == t[:, None]`` and-ed with
    per-row flags ``conds``: true at most at one column per row."""
    op = v.owner
    if isinstance(op, ir.AndOp):
        for a, b in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
            inner = one_hot(a)
            if inner is not None and _per_row(b) is not None:
                return inner[0], [*inner[1], _per_row(b)]  # type: ignore[list-item]
        return None
    if not (isinstance(op, ir.CmpOp) and op.predicate.data == "eq"):
        return None
    for a, b in ((op.lhs, op.rhs), (op.rhs, op.lhs)):
        if isinstance(_strip_cast(a).owner, ir.IotaOp) and _strip_cast(a).owner.axis.data == 1:  # type: ignore[union-attr]
            row = _per_row(b)
            if row is not None:
                return row, []
    return None


def _per_row(v: SSAValue) -> SSAValue | None:
    """The [X] or [X, 1] value a [X, N] value broadcasts along its rows, if it does."""
    op = v.owner
    tt = ir.tensor_type(v)
    if tt.rank == 2 and isinstance(op, ir.BroadcastOp) and ir.tensor_type(op.x).shape in ((tt.shape[0], "1"),
                                                                                          (tt.shape[0],)):
        return op.x
    return None
