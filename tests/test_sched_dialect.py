"""The ``sched`` loop dialect in xDSL's idiom: enum attributes for kinds and statuses, a verifier
on every op, declared memory effects (so xDSL's CSE runs after lowering), and a textual form
that parses back."""

from __future__ import annotations

import pytest
from xdsl.ir import Block
from xdsl.parser import Parser
from xdsl.traits import MemoryEffectKind, get_effects
from xdsl.utils.exceptions import ParseError, VerifyException

from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.passes import pipeline
from tests.conftest import SEED_OPS

I64 = ir.TensorType.make([], "i64")


def scalars(*dtypes: str) -> list:
    """Block arguments of the given rank-0 dtypes (values for building ops)."""
    return list(Block(arg_types=[ir.TensorType.make([], d) for d in dtypes]).args)


def buf(shape: list[str], dtype: str, role: str = "in"):
    return Block(arg_types=[s.BufType.make(shape, dtype, role)]).args[0]


def kinds(op) -> set[MemoryEffectKind]:
    effects = get_effects(op)
    assert effects is not None, f"{op.name} declares no memory effects"
    return {e.kind for e in effects}


@pytest.mark.parametrize("name", SEED_OPS)
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_lowered_kernels_print_and_parse_back(ops, name, target):
    m = ops[name].module()
    pipeline.run(m, target)
    text = str(m)
    assert "#sched<loop_kind " in text
    again = Parser(pipeline.context(), text).parse_module()
    again.verify()
    assert str(again) == text


def test_kinds_and_statuses_are_enums():
    lo, hi = scalars("i64", "i64")
    with pytest.raises(ValueError):
        s.ForOp(lo, hi, "sometimes")
    (v,) = scalars("f32")
    with pytest.raises(ValueError):
        s.AccumOp("product", v, buf([], "f32", "local"), [])
    (c,) = scalars("bool")
    with pytest.raises(ValueError):
        s.RequireOp(c, "oops", "message")
    loop = s.ForOp(lo, hi, "reduce")
    assert loop.kind.data == s.LoopKind.REDUCE == "reduce"
    bad = '"sched.require"(%c) <{status = #opgen<status whatever>, message = "m"}> : (!opgen.tensor<[], bool>) -> ()'
    with pytest.raises(ParseError):
        Parser(pipeline.context(), f"builtin.module {{\n^bb0(%c: !opgen.tensor<[], bool>):\n{bad}\n}}").parse_module()


def test_every_op_declares_its_memory_effects():
    i, n = scalars("i64", "i64")
    (f,) = scalars("f32")
    src, dst = buf(["N"], "f32"), buf(["N"], "f32", "out")
    load = s.LoadOp(src, [i])
    store = s.StoreOp(f, dst, [i])
    assert kinds(load) == {MemoryEffectKind.READ}
    assert kinds(store) == {MemoryEffectKind.WRITE}
    assert kinds(s.AccumOp("sum", f, dst, [i])) == {MemoryEffectKind.READ, MemoryEffectKind.WRITE}
    assert kinds(s.AllocOp(s.BufType.make(["N"], "f32", "temp"))) == {MemoryEffectKind.ALLOC}
    mask = buf(["L"], "u8")
    assert kinds(s.LoadBitOp(mask, i)) == {MemoryEffectKind.READ}
    assert kinds(s.FlagsPerElemOp(mask)) == set()
    (ok,) = scalars("bool")
    assert kinds(s.RequireOp(ok, "index", "i out of range")) == {MemoryEffectKind.WRITE}  # may end the kernel
    loop = s.ForOp(i, n, "serial")
    assert kinds(loop) == set()  # an empty body: nothing
    x = scalars("i64")[0]
    inner_load = s.LoadOp(src, [loop.iv])
    loop.body.block.add_op(inner_load)
    assert kinds(loop) == {MemoryEffectKind.READ}  # the body's effects
    a2, b2, c2 = buf(["M", "K"], "f32"), buf(["K", "N"], "f32"), buf(["M", "N"], "f32", "temp")
    mm = s.BufferMatmulOp(a2, b2, c2, i, n, x, False, False)
    assert kinds(mm) == {MemoryEffectKind.READ, MemoryEffectKind.WRITE}


def rejects(op, pattern: str) -> None:
    with pytest.raises(VerifyException, match=pattern):
        op.verify()


def test_verifiers():
    i, n = scalars("i64", "i64")
    f, c = scalars("f32", "bool")
    rejects(s.RequireOp(f, "param", "m"), r"sched.require: the condition must be a rank-0 bool")
    rejects(s.LoadBitOp(buf(["A", "B"], "u8"), i), r"sched.load_bit: the mask must be a 1-D buffer")
    rejects(s.LoadBitOp(buf(["L"], "u8"), f), r"sched.load_bit: the flag number must be a rank-0 i64")
    rejects(s.FlagsPerElemOp(buf(["A", "B"], "bool")), r"sched.flags_per_elem: the mask must be a 1-D buffer")
    rejects(s.SegmentStartOp(buf(["segs(V,N)"], "i64", "temp"), f, i, n), r"sched.segment_start: v must be")
    rows = buf(["N"], "i64", "temp")
    rejects(s.SegmentsOp(buf(["N"], "i32", "temp"), buf(["segs(V,N)"], "i64", "temp"), rows, i),
            r"sched.segments: idx must be a 1-D i64 buffer")
    rejects(s.BufferMatmulOp(buf(["N"], "f32"), buf(["N", "K"], "f32"), buf(["N", "K"], "f32", "temp"), i, n, n,
                             False, False), r"sched.matmul: operands must be 2-D buffers")
    rejects(s.BufferMatmulOp(buf(["N", "K"], "f32"), buf(["K", "N"], "f32"), buf(["N", "N"], "f32", "temp"),
                             i, f, n, False, False), r"sched.matmul: n must be a rank-0 i64")
    vec = ir.TensorType.make(["N"], "f32")
    (v,) = Block(arg_types=[vec]).args
    rejects(s.StoreOp(v, buf(["N"], "f32", "out"), [i]), r"sched.store: the value must be a rank-0 scalar")
    rejects(s.ForOp(f, n, "parallel"), r"sched.for: bounds must be i64 scalars")
    assert c.type == ir.TensorType.make([], "bool")
