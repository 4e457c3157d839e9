"""Canonicalization patterns of the opgen dialect (attached to ops via traits, run by xDSL's
``canonicalize`` pass). Each is exact: it never changes a computed bit."""

from __future__ import annotations

from xdsl.pattern_rewriter import PatternRewriter, RewritePattern, op_type_rewrite_pattern

from opgen.ir import dialect as ir


class ComposeBroadcasts(RewritePattern):
    """``broadcast(broadcast(x, d1), d2)`` -> ``broadcast(x, d2[d1])``."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ir.BroadcastOp, rewriter: PatternRewriter) -> None:
        inner = op.x.owner
        if not isinstance(inner, ir.BroadcastOp):
            return
        outer_map = op.dim_map
        dims = [outer_map[d] for d in inner.dim_map]
        src, dst = ir.tensor_type(inner.x), ir.tensor_type(op.result)
        # a size-1 source dim that the inner broadcast kept as 1 may now map onto a real dim: fine
        if all(src.shape[i] in ("1", dst.shape[d]) for i, d in enumerate(dims)):
            rewriter.replace(op, ir.BroadcastOp(inner.x, dims, dst))


class IdentityBroadcast(RewritePattern):
    """A broadcast to the operand's own type is the operand."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ir.BroadcastOp, rewriter: PatternRewriter) -> None:
        if op.x.type == op.result.type and op.dim_map == tuple(range(ir.tensor_type(op.x).rank)):
            rewriter.replace(op, [], [op.x])


class IdentityCast(RewritePattern):
    """A cast to the operand's own dtype is the operand."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ir.CastOp, rewriter: PatternRewriter) -> None:
        if op.x.type == op.result.type:
            rewriter.replace(op, [], [op.x])


class ComposeTransposes(RewritePattern):
    """``transpose(transpose(x, p), q)`` -> ``transpose(x, p[q])`` (or ``x`` when identity)."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ir.TransposeOp, rewriter: PatternRewriter) -> None:
        inner = op.x.owner
        if not isinstance(inner, ir.TransposeOp):
            return
        p, q = inner.permutation, op.permutation
        perm = [p[i] for i in q]
        if perm == sorted(perm):
            rewriter.replace(op, [], [inner.x])
        else:
            rewriter.replace(op, ir.TransposeOp(inner.x, perm))


class RedundantCheck(RewritePattern):
    """A check whose condition is the constant true, or that repeats an earlier check of the
    same block (same condition value, status and message), can never be the first to fail."""

    @op_type_rewrite_pattern
    def match_and_rewrite(self, op: ir.CheckOp, rewriter: PatternRewriter) -> None:
        if ir.constant_int(op.cond) == 1:
            rewriter.erase(op)
            return
        prev = op.prev_op
        while prev is not None:
            if isinstance(prev, ir.CheckOp) and prev.cond is op.cond and prev.status == op.status \
                    and prev.message == op.message:
                rewriter.erase(op)
                return
            prev = prev.prev_op
