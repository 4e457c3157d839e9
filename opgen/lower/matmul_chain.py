"""Matmul chains: ``G = f(P, ...)`` elementwise over an (M, N) tile space, consumed only by
``G @ C`` (-> M rows) and ``G^T @ D`` (-> N rows), with ``P = A @ B`` optional. G is never
materialised: both products are computed tile by tile, each pass owning its output rows.

  pass 1, parallel over row blocks of M:  acc = sum over column blocks of  f(A_i B_j) @ C_j
  pass 2, parallel over column blocks of N: acc = sum over row blocks of  f(A_i B_j)^T @ D_i

P's tiles are recomputed in each pass (4 tile products instead of 3) so that every output row
block is summed by one thread in a fixed order — deterministic, with O(tile) workspace. This is
the memory-saving schedule of linear-layer loss gradients, found from the IR's shape alone.

With ``groups`` (the CPU and MLIR pipelines) and both kinds of outputs, one pass computes each
P tile once (3 tile products): the column blocks are split into at most ``groups`` groups of
consecutive blocks, fixed by N alone; in parallel over the groups, each column block sums its
``G^T @ D`` rows over all row blocks (owned, in order), and ``G @ C`` goes into the group's own
partial sums (a workspace of groups x M rows, each row block added in column-block order); then,
in parallel over row blocks, the row outputs are the partial sums added in group order. The
order is fixed by the shapes, not the threads: deterministic, with ``groups x M x H`` f32 of
workspace beside the tiles.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from xdsl.ir import Operation, SSAValue

from opgen import dtypes
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.to_loops import NotFusable, _Builder, _Lowering

#: default tile of the (M, N) space; a pipeline may ask for fewer rows per block (more blocks)
ROW_BLOCK = 256
COL_BLOCK = 256
#: column groups of the one-pass schedule (module docstring): partial sums of the row outputs,
#: and the parallelism of that pass, whatever the thread count
CHAIN_GROUPS = 4


@dataclass
class Chain:
    g: SSAValue  # the (M, N) elementwise value
    p: ir.MatmulOp | None  # the product G reads pointwise (None: G reads only inputs)
    row_out: list[tuple[str, SSAValue, ir.MatmulOp]]  # (output, value, G @ C)
    col_out: list[tuple[str, SSAValue, ir.MatmulOp]]  # (output, value, G^T @ D)


def _strip_cast(v: SSAValue, through: Callable[[ir.CastOp], bool] = lambda _: True) -> SSAValue:
    """``v`` seen through the casts that produce it (those ``through`` accepts)."""
    while isinstance(v.owner, ir.CastOp) and through(v.owner):
        v = v.owner.x
    return v


class _Side(NamedTuple):
    """One dim of a chain's product G = f(A @ B) as a pass walks it: its size, the block it is
    walked in, and the operand whose rows run along it (A; or B^T, ``transposed``)."""

    dim: str
    block: int
    operand: SSAValue | None
    transposed: bool


class MatmulChainLowering(_Lowering):
    """``lower-to-loops`` for functions shaped as a matmul chain (else NotFusable); tiles of
    ``row_block`` x ``col_block`` elements of G."""

    def __init__(self, func: ir.FuncOp, aliases: set[str], row_block: int = ROW_BLOCK,
                 col_block: int = COL_BLOCK, groups: int | None = None):
        super().__init__(func, aliases)
        self.row_block, self.col_block = row_block, col_block
        self.groups = groups

    def plan(self) -> Chain:
        names = [n.data for n in self.ret.names.data]
        g: SSAValue | None = None
        row_out, col_out = [], []
        for name, v in zip(names, self.ret.values, strict=True):
            mm = _strip_cast(v).owner
            if not isinstance(mm, ir.MatmulOp):
                raise NotFusable("an output is not a matmul")
            lhs = _strip_cast(mm.lhs)
            if isinstance(lhs.owner, ir.TransposeOp):
                cand, lst = _strip_cast(lhs.owner.x), col_out
            else:
                cand, lst = lhs, row_out
            if g is None:
                g = cand
            elif cand is not g:
                raise NotFusable("outputs are products of different values")
            lst.append((name, v, mm))
        if g is None or self.materialises(g.owner) or not isinstance(g.owner, Operation):
            raise NotFusable("no elementwise producer")
        mats = [m for m in self.materialised() if m.owner not in
                [mm for _, _, mm in row_out + col_out] and m is not g]
        products = [m for m in mats if isinstance(m.owner, ir.MatmulOp)]
        others = [m for m in mats if m not in products and not self._is_operand_copy(m)]
        if len(products) > 1 or others:
            raise NotFusable("more than one product, or other materialised values")
        p = products[0].owner if products else None
        if ir.tensor_type(g).rank != 2:
            raise NotFusable("G must be 2-D")
        return Chain(g, p, row_out, col_out)  # type: ignore[arg-type]

    def _is_operand_copy(self, m: SSAValue) -> bool:
        """Values materialised only because a matmul reads them (the chain reads them in tiles)."""
        return all(isinstance(u.operation, ir.MatmulOp | ir.TransposeOp) for u in m.uses)

    # ------------------------------------------------------------------ emission helpers
    def local(self, b: _Builder, shape: list[str], dtype: str, zero: bool = False) -> SSAValue:
        return b.alloc(shape, dtype, "local", zero=zero).result

    def fill(self, b: _Builder, dst: SSAValue, rows: SSAValue, cols: str | SSAValue,
             value_at: object) -> None:
        """``dst[r, c] = value_at(r, c)`` for r < rows, c < cols."""
        zero = b.const(0, "i64")
        r = b.open(zero, rows, "parallel", "r")
        c = b.open(zero, b.dim(cols) if isinstance(cols, str) else cols, "parallel", "c")
        b.stmt(s.StoreOp(value_at(r, c), dst, [r, c]))  # type: ignore[operator]
        b.close_n(2)

    def block_range(self, b: _Builder, blk: SSAValue, size: int, dim: str) -> tuple[SSAValue, SSAValue]:
        base = b.scalar(ir.MulOp(blk, b.const(size, "i64")))
        end = b.scalar(ir.MinOp(b.scalar(ir.AddOp(base, b.const(size, "i64"))), b.dim(dim)))
        return base, b.scalar(ir.SubOp(end, base))

    def tile(self, b: _Builder, ch: Chain, i0: SSAValue, rows: SSAValue, j0: SSAValue,
             cols: SSAValue, a_blk: SSAValue | None, b_blk: SSAValue | None) -> SSAValue:
        """The G tile (row_block x col_block, f32) for rows i0.. and columns j0.."""
        gdt = ir.tensor_type(ch.g).dtype
        shape = [str(self.row_block), str(self.col_block)]
        t = self.local(b, shape, ir.tensor_type(ch.p.result).dtype if ch.p else gdt)
        if ch.p is not None:
            k = b.dim(ir.tensor_type(ch.p.lhs).shape[1])
            b.stmt(s.BufferMatmulOp(a_blk, b_blk, t, rows, cols, k, False, True))  # type: ignore[arg-type]
        g_t = self.local(b, shape, gdt)

        def g_at(r: SSAValue, c: SSAValue) -> SSAValue:
            gi = b.scalar(ir.AddOp(i0, r))
            gj = b.scalar(ir.AddOp(j0, c))
            if ch.p is not None:
                b.memo[("val", ch.p.result, (gi, gj))] = b.scalar(s.LoadOp(t, [r, c]))
            return self.emit(b, ch.g, [gi, gj])

        self.fill(b, g_t, rows, cols, g_at)
        return g_t

    def load_rows(self, b: _Builder, v: SSAValue, base: SSAValue, rows: SSAValue, size: int,
                  transposed: bool) -> SSAValue:
        """A (size x K) f32-compute copy of rows base.. of v (or of v^T when ``transposed``)."""
        t = ir.tensor_type(v)
        kdim = t.shape[0] if transposed else t.shape[1]
        buf = self.local(b, [str(size), kdim], t.dtype)

        def at(r: SSAValue, c: SSAValue) -> SSAValue:
            gi = b.scalar(ir.AddOp(base, r))
            return self.emit(b, v, [c, gi] if transposed else [gi, c])

        self.fill(b, buf, rows, kdim, at)
        return buf

    def _f32_held(self, dtype: str) -> bool:
        """Values of ``dtype`` (every member of a dtype variable) are held as f32."""
        dvars = self.func.dtype_vars.data
        members = [m.data for m in dvars[dtype].data] if dtype in dvars else [dtype]  # type: ignore[attr-defined]
        return all(dtypes.BY_NAME[m].compute == dtypes.F32 for m in members)

    def _rows_source(self, v: SSAValue, transposed: bool) -> SSAValue | None:
        """The value whose rows ``load_rows(v, transposed)`` copies, seen through float casts
        that do not change held values (``opgen.cast`` between f16/bf16/f32 is logical)."""
        def logical(c: ir.CastOp) -> bool:
            return self._f32_held(ir.tensor_type(c.result).dtype) and self._f32_held(ir.tensor_type(c.x).dtype)

        v = _strip_cast(v, logical)
        if transposed:
            if not isinstance(v.owner, ir.TransposeOp):
                return None
            v = _strip_cast(v.owner.x, logical)
        return v

    def same_rows(self, v: SSAValue, vt: bool, w: SSAValue, wt: bool) -> bool:
        """``load_rows`` of (v, vt) and of (w, wt) hold the same values."""
        src = self._rows_source(v, vt)
        return src is not None and src is self._rows_source(w, wt)

    def store_rows(self, b: _Builder, name: str, out_v: SSAValue, mm: ir.MatmulOp, acc: SSAValue,
                   base: SSAValue, rows: SSAValue) -> None:
        dst = self.kblock.args[[a.data for a in self.func.arg_names.data].index(name)]
        ncols = ir.tensor_type(out_v).shape[1]

        def at(r: SSAValue, c: SSAValue) -> SSAValue:
            gi = b.scalar(ir.AddOp(base, r))
            b.memo[("val", mm.result, (gi, c))] = b.scalar(s.LoadOp(acc, [r, c]))
            return self.emit(b, out_v, [gi, c])

        zero = b.const(0, "i64")
        r = b.open(zero, rows, "parallel", "r")
        c = b.open(zero, b.dim(ncols), "parallel", "c")
        val = at(r, c)
        b.stmt(s.StoreOp(val, dst, [b.scalar(ir.AddOp(base, r)), c]))
        b.close_n(2)

    def chain_pass(self, ch: Chain, outs: list[tuple[str, SSAValue, ir.MatmulOp]], by_rows: bool) -> None:
        """One pass: parallel over blocks of the dim the outputs' rows run along ("own"),
        summing over blocks of the other dim in order."""
        m_dim, n_dim = ir.tensor_type(ch.g).shape
        a_v, b_v = (ch.p.lhs, ch.p.rhs) if ch.p is not None else (None, None)  # b_v: (K, N)
        rows = _Side(m_dim, self.row_block, a_v, False)
        cols = _Side(n_dim, self.col_block, b_v, True)
        own, other = (rows, cols) if by_rows else (cols, rows)
        b = _Builder(self.kblock)
        (ob,) = b.loops([f"cdiv({own.dim},{own.block})"], "parallel", "ob")
        o0, on = self.block_range(b, ob, own.block, own.dim)
        own_blk = self.load_rows(b, own.operand, o0, on, own.block, own.transposed) if own.operand is not None else None
        accs = [self.local(b, [str(own.block), ir.tensor_type(mm.result).shape[1]], ir.tensor_type(mm.result).dtype,
                           zero=True) for _, _, mm in outs]
        (xb,) = b.loops([f"cdiv({other.dim},{other.block})"], "serial", "xb")
        x0, xn = self.block_range(b, xb, other.block, other.dim)
        other_blk = (self.load_rows(b, other.operand, x0, xn, other.block, other.transposed)
                     if other.operand is not None else None)
        if by_rows:
            g_t = self.tile(b, ch, o0, on, x0, xn, own_blk, other_blk)
        else:
            g_t = self.tile(b, ch, x0, xn, o0, on, other_blk, own_blk)
        for (_, _, mm), acc in zip(outs, accs, strict=True):
            if other_blk is not None:  # e.g. the W rows of X W^T are those of G W: loaded once
                blk = self.rhs_block(b, mm, other_blk, other.operand, other.transposed, x0, xn, other.block)
            else:
                blk = self.load_rows(b, mm.rhs, x0, xn, other.block, False)
            h = b.dim(ir.tensor_type(mm.result).shape[1])
            # own rows of the product: G @ blk (by rows) or G^T @ blk (by columns)
            b.stmt(s.BufferMatmulOp(g_t, blk, acc, on, h, xn, not by_rows, False, True))
        b.close()
        for (name, v, mm), acc in zip(outs, accs, strict=True):
            self.store_rows(b, name, v, mm, acc, o0, on)
        b.close()

    def rhs_block(self, b: _Builder, mm: ir.MatmulOp, loaded: SSAValue, src: SSAValue, transposed: bool,
                  base: SSAValue, n: SSAValue, size: int) -> SSAValue:
        """The rows base.. of ``mm``'s right-hand side: ``loaded`` when it holds them already
        (the rows of ``src``, or of ``src^T``), else a copy."""
        if self.same_rows(mm.rhs, False, src, transposed):
            return loaded
        return self.load_rows(b, mm.rhs, base, n, size, False)

    def one_pass(self, ch: Chain) -> None:
        """The three-product schedule (module docstring)."""
        assert ch.p is not None and self.groups
        m_dim, n_dim = ir.tensor_type(ch.g).shape
        a_v, b_v = ch.p.lhs, ch.p.rhs
        b = _Builder(self.kblock)
        nblk = f"cdiv({n_dim},{self.col_block})"
        # column blocks per group: ceil(nblk / groups), at least 1 (no block: one, and no group)
        per = f"div(sub({nblk},1),{self.groups})+1"
        ngroups = f"cdiv({nblk},{per})"
        out_of = {mm: (ir.tensor_type(mm.result).shape[1], ir.tensor_type(mm.result).dtype)
                  for _, _, mm in ch.row_out + ch.col_out}
        parts = [b.alloc([f"mul({ngroups},{m_dim})", out_of[mm][0]], out_of[mm][1], "temp", zero=True,
                         top=True).result for _, _, mm in ch.row_out]
        (q,) = b.loops([ngroups], "parallel", "grp")
        j0 = b.scalar(ir.MulOp(q, b.dim(per)))
        j1 = b.scalar(ir.MinOp(b.scalar(ir.AddOp(j0, b.dim(per))), b.dim(nblk)))
        jb = b.open(j0, j1, "serial", "xb")
        o0, on = self.block_range(b, jb, self.col_block, n_dim)
        w_blk = self.load_rows(b, b_v, o0, on, self.col_block, True)
        accs = [self.local(b, [str(self.col_block), out_of[mm][0]], out_of[mm][1], zero=True)
                for _, _, mm in ch.col_out]
        (ib,) = b.loops([f"cdiv({m_dim},{self.row_block})"], "serial", "xb")
        x0, xn = self.block_range(b, ib, self.row_block, m_dim)
        x_blk = self.load_rows(b, a_v, x0, xn, self.row_block, False)
        g_t = self.tile(b, ch, x0, xn, o0, on, x_blk, w_blk)
        row = b.scalar(ir.AddOp(b.scalar(ir.MulOp(q, b.dim(m_dim))), x0))  # the group's rows x0..
        for (_, _, mm), part in zip(ch.row_out, parts, strict=True):
            blk = self.rhs_block(b, mm, w_blk, b_v, True, o0, on, self.col_block)
            b.stmt(s.BufferMatmulOp(g_t, blk, part, xn, b.dim(out_of[mm][0]), on, False, False, True, c_row=row))
        for (_, _, mm), acc in zip(ch.col_out, accs, strict=True):
            blk = self.rhs_block(b, mm, x_blk, a_v, False, x0, xn, self.row_block)
            b.stmt(s.BufferMatmulOp(g_t, blk, acc, on, b.dim(out_of[mm][0]), xn, True, False, True))
        b.close()
        for (name, v, mm), acc in zip(ch.col_out, accs, strict=True):
            self.store_rows(b, name, v, mm, acc, o0, on)
        b.close_n(2)
        # the row outputs: each row block's partial sums added in group order
        (rb,) = b.loops([f"cdiv({m_dim},{self.row_block})"], "parallel", "ob")
        r0, rn = self.block_range(b, rb, self.row_block, m_dim)
        zero = b.const(0, "i64")
        for (name, v, mm), part in zip(ch.row_out, parts, strict=True):
            acc = self.local(b, [str(self.row_block), out_of[mm][0]], out_of[mm][1], zero=True)
            (qq,) = b.loops([ngroups], "serial", "grp")
            base = b.scalar(ir.AddOp(b.scalar(ir.MulOp(qq, b.dim(m_dim))), r0))
            r = b.open(zero, rn, "parallel", "r")
            c = b.open(zero, b.dim(out_of[mm][0]), "parallel", "c")
            b.stmt(s.AccumOp("sum", b.scalar(s.LoadOp(part, [b.scalar(ir.AddOp(base, r)), c])), acc, [r, c]))
            b.close_n(3)
            self.store_rows(b, name, v, mm, acc, r0, rn)
        b.close()

    # ------------------------------------------------------------------ driver
    def run(self) -> s.KernelOp:
        if self.late_checks():
            raise NotFusable("a check reads a materialised value")
        ch = self.plan()
        self.prologue()
        if self.groups and ch.p is not None and ch.row_out and ch.col_out:
            self.one_pass(ch)
            return self.kernel
        for outs, by_rows in ((ch.row_out, True), (ch.col_out, False)):
            if outs:
                self.chain_pass(ch, outs, by_rows)
        return self.kernel
