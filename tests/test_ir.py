"""The opgen dialect: modules verify and round-trip through xDSL's parser, the L0 pipeline keeps
oracle results bit for bit, and the verifiers reject ill-typed IR with clear messages."""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Block
from xdsl.parser import Parser
from xdsl.utils.exceptions import VerifyException

from opgen import oracle
from opgen.binding import bind
from opgen.ir import dialect as ir
from opgen.passes import pipeline
from tests.conftest import SEED_OPS


def parse(text: str) -> ModuleOp:
    return Parser(pipeline.context(), text).parse_module()


@pytest.mark.parametrize("name", SEED_OPS)
def test_module_verifies_and_round_trips(ops, name):
    texts: dict[str, str] = {}
    m = ops[name].module()
    m.verify()
    pipeline.run(m, "l0", observe=lambda stage, mod: texts.setdefault(stage, str(mod)))
    assert list(texts) == pipeline.stages("l0")
    for stage, text in texts.items():
        again = parse(text)
        again.verify()
        assert str(again) == text, f"{name}: stage {stage} does not round-trip"
    assert len(list(m.ops)) == len(ops[name].variants)


@pytest.mark.parametrize("name", SEED_OPS)
def test_parsed_module_runs_in_the_oracle(ops, name, rng):
    """The printed-and-parsed IR is executable and gives the same bits as the traced IR."""
    o = ops[name]
    parsed = {f.sym_name.data: f for f in parse(str(o.module())).ops}
    for args in variant_args(name, rng):
        b = bind(o, args)
        same_bits(oracle.run_bound(b), oracle.run_bound(
            dataclasses.replace(b, func=parsed[b.func.sym_name.data])))


def test_pipeline_stages_and_errors(ops):
    stages = pipeline.stages("l0")
    assert stages[0] == "traced" and len(stages) > 1
    m = ops["rms_norm_backward"].module()
    before = str(m)
    assert str(pipeline.run(m, "l0", until="traced")) == before
    with pytest.raises(KeyError, match="unknown stage"):
        pipeline.run(ops["rms_norm_backward"].module(), "l0", until="nope")
    with pytest.raises(KeyError, match="unknown pipeline"):
        pipeline.run(ops["rms_norm_backward"].module(), "nope")


@pytest.mark.parametrize("target", ["cpu", "ttmetal"])
def test_stage_names_are_unique_and_the_last_one_is_the_end(ops, target):
    """A pass that runs twice (cse, canonicalize) gets ``NAME-2``: ``--stage`` names each run
    and ``--ir`` (the last stage) shows the end of the pipeline, not the first run's output."""
    names = pipeline.stages(target)
    assert len(set(names)) == len(names) and "cse-2" in names
    seen: list[str] = []
    m = ops["rms_norm_backward"].module()
    pipeline.run(m, target, until=names[-1], observe=lambda stage, mod: seen.append(stage))
    assert seen == names
    m1 = ops["rms_norm_backward"].module()
    pipeline.run(m1, target, until="cse")
    assert '"opgen.func"' in str(m1)  # the first cse is still L0


@pytest.mark.parametrize("target", [t for t in pipeline.PIPELINES if t != "l0"])
def test_every_pass_leaves_valid_ir(ops, target):
    """Builds verify the IR once, after the last pass; here every pass of every pipeline is
    followed by a verification, for every seed op."""
    for name in SEED_OPS:
        pipeline.run(ops[name].module(), target, verify_each=True)


def test_invalid_ir_names_the_pass_that_made_it(ops, monkeypatch):
    """A pass leaving ill-typed IR fails its stage: at once with ``verify_each`` (even when a
    later pass would delete the op), and by the final verification when it is the last pass."""
    from xdsl.passes import ModulePass

    class BreakIr(ModulePass):
        name = "break-ir"

        def apply(self, ctx, m):
            blk = next(iter(m.ops)).body.block
            a, b = ir.ConstantOp(1.0, "f32"), ir.ConstantOp(1, "i64")
            blk.insert_ops_before([a, b, ir.AddOp(a.results[0], b.results[0])], blk.first_op)

    l0 = pipeline.PIPELINES["l0"]
    monkeypatch.setitem(pipeline.PIPELINES, "broken-first", [BreakIr(), *l0])
    monkeypatch.setitem(pipeline.PIPELINES, "broken-last", [*l0, BreakIr()])
    for target, each in (("broken-first", True), ("broken-last", False)):
        with pytest.raises(pipeline.StageFailed,
                           match=r"(?s)stage 'break-ir'.*f32> expected from variable 'T', but got .*i64>") as e:
            pipeline.run(ops["rms_norm_backward"].module(), target, verify_each=each)
        assert ("OPGEN_VERIFY_EACH=1" in str(e.value)) is not each, e.value


def test_module_returns_fresh_copies(ops):
    o = ops["embedding_dense_backward"]
    traced = str(o.module())
    pipeline.run(o.module(), "l0")
    assert str(o.module()) == traced


# ------------------------------------------------------------ the pipeline keeps the bits


def variant_args(name: str, rng: np.random.Generator) -> list[dict]:
    """Arguments exercising every valid variant of a seed op (small, awkward values)."""
    f = lambda shape, dt=np.float32: rng.standard_normal(shape).astype(dt)
    bf = ml_dtypes.bfloat16
    if name == "embedding_backward":
        dy, i1, i2 = f((6, 4), np.float16), rng.integers(0, 3, 6), rng.integers(0, 5, 6)
        t1, t2 = f((3, 4), np.float16), f((5, 4), np.float16)
        return [
            {"dy": dy, "i1": i1, "dtable1": t1, "alpha1": 0.3, "dtable1_acc": True},
            {"dy": dy, "i1": i1, "i2": i2, "dtable1": t1, "alpha2": 2.0},
            {"dy": dy, "i1": i1, "dtable1": t1, "dtable2": t2},
            {"dy": dy, "i1": i1, "i2": i2, "dtable1": t1, "dtable2": t2, "alpha1": -1.5,
             "alpha2": 0.7, "dtable1_acc": True, "dtable2_acc": False},
        ]
    if name == "embedding_bw":
        return [{"indices": rng.integers(0, 4, 9).astype(np.uint32), "weight": f((4, 3)),
                 "grad": f((9, 3), bf)}]
    if name == "embedding_dense_backward":
        idx = (rng.integers(0, 5, (2, 3)) + 0.6).astype(np.float16)
        return [{"grad": f((2, 3, 4), bf), "indices": idx, "num_weights": 5, "padding_idx": p,
                 "scale_grad_by_freq": s} for p in (2, -1) for s in (False, True)]
    if name == "rms_norm_backward":
        return [{"grad_y": f((2, 3, 8), np.float16), "x": f((2, 3, 8), np.float16),
                 "w": f(8, np.float16), "eps": eps} for eps in (0.0, 1e-6)]
    if name == "fused_linear_cross_entropy_loss_grad":
        BT, H, V = 5, 4, 128
        base = {"grad": f(BT), "input": f((BT, H), bf), "weight": f((V, H), bf),
                "target_mask": np.array([0b10101], np.uint8),
                "masked_target": rng.integers(0, V, BT).astype(np.int32)}
        sm = rng.random((BT, V)).astype(np.float32)
        lm, se = f(BT), (rng.random(BT) + 1).astype(np.float32)
        return [{**base, **extra} for extra in (
            {"softmax": sm}, {"logits_max": lm, "sum_exp_logits": se},
            {"softmax": sm, "logits_max": lm}, {"softmax": sm, "sum_exp_logits": se},
            {"softmax": sm, "logits_max": lm, "sum_exp_logits": se})]
    raise AssertionError(name)


def same_bits(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), f"{k}: results differ in bits"


@pytest.mark.parametrize("precision", ["native", "f64"])
@pytest.mark.parametrize("name", SEED_OPS)
def test_l0_pipeline_preserves_oracle_results_bitwise(ops, name, precision, rng):
    o = ops[name]
    m = o.module()
    pipeline.run(m, "l0")
    optimized = {f.sym_name.data: f for f in m.ops}
    assert set(optimized) == {o.variant_name(p) for p in o.variants}
    seen = set()
    for args in variant_args(name, rng):
        b = bind(o, args)
        seen.add(b.func.sym_name.data)
        traced = oracle.run_bound(b, precision)
        opt = oracle.run_bound(dataclasses.replace(b, func=optimized[b.func.sym_name.data]), precision)
        same_bits(traced, opt)
    assert seen == set(optimized), "every variant is exercised"


# ---------------------------------------------------------------------- verifier messages


def values(*types: tuple[tuple[str, ...], str]):
    block = Block(arg_types=[ir.TensorType.make(shape, dt) for shape, dt in types])
    return block.args


def rejects(op, pattern: str) -> None:
    with pytest.raises(VerifyException, match=pattern):
        op.verify()


def test_add_shape_mismatch():
    a, b = values((("N", "D"), "f32"), (("V", "D"), "f32"))
    rejects(ir.AddOp(a, b), r"(?s)operand 'rhs'.*\[N, D\], f32> expected from variable 'T', but got .*\[V, D\], f32>")
    c = values((("V", "D"), "f32"))[0]  # a result of another shape: the elementwise shape rule
    lt = {"predicate": ir.CmpPredicateAttr(ir.CmpPredicate.LT)}
    rejects(ir.CmpOp.create(operands=[c, c], result_types=[ir.TensorType.make(["N", "D"], "bool")], properties=lt),
            r"shapes differ.*broadcast explicitly")


def test_add_dtype_mismatch():
    a, b = values((("N",), "f32"), (("N",), "f16"))
    rejects(ir.AddOp(a, b), r"(?s)operand 'rhs'.*\[N\], f32> expected from variable 'T', but got .*\[N\], f16>")


def test_logical_op_on_floats():
    a, b = values((("N",), "f32"), (("N",), "f32"))
    rejects(ir.AndOp(a, b), r"opgen.and: operands of type f32 not allowed")


def test_float_only_unary_on_int():
    (a,) = values((("N",), "i32"))
    rejects(ir.ExpOp(a), r"opgen.exp: operand must be a floating type, got i32")


def test_matmul_inner_dim_mismatch():
    a, b = values((("M", "K"), "f32"), (("J", "N"), "f32"))
    rejects(ir.MatmulOp(a, b), r"inner dims differ \(K vs J\)")


def test_matmul_of_ints():
    a, b = values((("M", "K"), "i32"), (("K", "N"), "i32"))
    rejects(ir.MatmulOp(a, b), r"operands must be a floating type")


def test_matmul_rank():
    a, b = values((("B", "M", "K"), "f32"), (("K", "N"), "f32"))
    rejects(ir.MatmulOp(a, b), r"must be 2-D")


@pytest.mark.parametrize(("axes", "kind", "dtype", "pattern"), [
    ([2], "sum", "f32", r"bad axes \[2\] for rank 2"),
    ([], "sum", "f32", r"bad axes \[\]"),
    ([0, 0], "max", "f32", r"bad axes"),
])
def test_reduce_rejections(axes, kind, dtype, pattern):
    (x,) = values((("N", "D"), dtype))
    op = ir.ReduceOp(x, kind, [0])
    op.properties["axes"] = ir._i64s(axes)
    rejects(op, pattern)


def test_kinds_predicates_and_statuses_are_enum_attributes():
    """An unknown kind, predicate or status cannot be built, set as a plain string, or parsed."""
    (x,) = values((("N", "D"), "f32"))
    (c,) = values(((), "bool"))
    with pytest.raises(ValueError, match=r"unknown kind 'prod'"):
        ir.ReduceOp(x, "prod", [0])
    with pytest.raises(ValueError, match=r"unknown predicate 'approx'"):
        ir.CmpOp("approx", x, x)
    with pytest.raises(ValueError, match=r"status must be one of \('param', 'shape', 'index'\)"):
        ir.CheckOp(c, "msg", "strides")
    op = ir.ReduceOp(x, "sum", [0])
    op.properties["kind"] = ir.StringAttr("sum")
    rejects(op, r"should be of base attribute opgen.reduce_kind")
    assert ir.CmpOp("lt", x, x).predicate.data == ir.CmpPredicate.LT == "lt"
    text = 'builtin.module {{\n^bb0(%c: !opgen.tensor<[], bool>):\n"opgen.check"(%c) <{{message = "m", ' \
           'status = #opgen<status {}>}}> : (!opgen.tensor<[], bool>) -> ()\n}}'
    parse(text.format("index")).verify()
    from xdsl.utils.exceptions import ParseError

    with pytest.raises(ParseError):
        parse(text.format("strides"))


def test_reduce_sum_of_bool():
    (x,) = values((("N", "D"), "bool"))
    rejects(ir.ReduceOp(x, "sum", [1]), r"cannot sum bool \(cast first\)")
    ir.ReduceOp(x, "max", [1]).verify()


def test_gather_float_indices():
    t, i = values((("V", "D"), "f32"), (("N",), "f32"))
    rejects(ir.GatherOp(t, i), r"indices must be integers, got f32")


def test_scatter_add_leading_dim():
    v, i = values((("N", "D"), "f32"), (("M",), "i64"))
    rejects(ir.ScatterAddOp(v, i, "V"), r"disagree on the leading dim")


def test_broadcast_incompatible_dim():
    (x,) = values((("N", "D"), "f32"))
    rejects(ir.BroadcastOp(x, [0, 1], ir.TensorType.make(["V", "D"], "f32")),
            r"operand dim N cannot broadcast to V")


def test_transpose_not_a_permutation():
    (x,) = values((("N", "D"), "f32"))
    rejects(ir.TransposeOp(x, [0, 0]), r"not a permutation")


def test_select_condition_not_bool():
    c, a, b = values((("N",), "i32"), (("N",), "f32"), (("N",), "f32"))
    rejects(ir.SelectOp(c, a, b), r"condition must be bool")


def test_check_condition_and_status():
    c, s, t = values(((), "i64"), ((), "bool"), (("N",), "bool"))
    rejects(ir.CheckOp(c, "msg"), r"condition must be a bool tensor")
    ir.CheckOp(s, "a scalar condition", "shape").verify()
    ir.CheckOp(t, "every element must hold", "index").verify()  # a check on a bool tensor


def test_unpack_bits_dtype():
    (p,) = values((("L",), "i32"))
    rejects(ir.UnpackBitsOp(p, "N"), r"must be u8 or bool, got i32")


def test_unknown_dtype_variable():
    (a,) = values((("N",), "Q"))
    rejects(ir.ExpOp(a), r"unknown element type 'Q'")


def test_func_without_return():
    f = ir.FuncOp("f", ["x"], [ir.TensorType.make(["N"], "f32")], {})
    f.body.block.add_op(ir.NegOp(f.body.block.args[0]))
    rejects(f, r"opgen.neg terminates block .* not a terminator")


def test_return_names_mismatch():
    f = ir.FuncOp("f", ["x"], [ir.TensorType.make(["N"], "f32")], {})
    f.body.block.add_op(ir.ReturnOp([f.body.block.args[0]], ["y", "z"]))
    rejects(f, r"one name per returned value")


def test_return_must_name_a_parameter_of_the_same_type():
    t = ir.TensorType.make(["N"], "f32")
    f = ir.FuncOp("f", ["x", "out"], [t, t], {})
    f.body.block.add_op(ir.ReturnOp([f.body.block.args[0]], ["y"]))
    rejects(f, r"returns 'y', which is not a parameter")
    g = ir.FuncOp("g", ["x", "out"], [t, ir.TensorType.make(["N"], "f16")], {})
    g.body.block.add_op(ir.ReturnOp([g.body.block.args[0]], ["out"]))
    rejects(g, r"output 'out' is .* returned")


def test_boundary_casts_must_name_a_parameter_of_that_dtype():
    from xdsl.dialects.builtin import DictionaryAttr, StringAttr

    t = ir.TensorType.make(["N"], "f32")
    for casts, msg in (({"y": "i64"}, r"names 'y', not a parameter"), ({"x": "i64"}, r"gives 'x' dtype i64")):
        f = ir.FuncOp("f", ["x", "out"], [t, t], {})
        f.body.block.add_op(ir.ReturnOp([f.body.block.args[0]], ["out"]))
        f.boundary_casts = DictionaryAttr({k: StringAttr(v) for k, v in casts.items()})
        rejects(f, msg)


#: what convert-at-boundary converts in each seed op (independent of the variant), and the
#: dtype variables its kernels are instantiated over
CONVERTED = {
    "embedding_backward": ({"i1": "i64", "i2": "i64"}, ["T"]),
    "embedding_dense_backward": ({"indices": "i64"}, ["T"]),
    "embedding_bw": ({"indices": "i64"}, ["T"]),  # W types only the weight, which gives sizes
    "fused_linear_cross_entropy_loss_grad": ({"masked_target": "i64"}, ["T", "M"]),  # unpack_bits reads M
    "rms_norm_backward": ({}, ["T"]),
}


@pytest.mark.parametrize("name", SEED_OPS)
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_convert_at_boundary_on_the_seed_ops(ops, name, target):
    m = ops[name].module()
    pipeline.run(m, target, until="convert-at-boundary")
    want, dvars = CONVERTED[name]
    for f in m.body.block.ops:
        assert isinstance(f, ir.FuncOp)
        names = [a.data for a in f.arg_names.data]
        read = {n for n, a in zip(names, f.body.block.args, strict=True) if a.uses}  # (i2 without dtable2: unread)
        assert f.converted == {k: v for k, v in want.items() if k in read}
        assert sorted(f.dtype_var_map()) == sorted(dvars)
        for n, d in f.converted.items():  # read as that dtype, no cast left on the parameter
            arg = f.body.block.args[names.index(n)]
            assert ir.tensor_type(arg).dtype == d
            assert not any(isinstance(u.operation, ir.CastOp) for u in arg.uses)


def test_textual_ir_with_type_error_fails_verification():
    nd, dk, nk = ("!opgen.tensor<[N, D], f32>", "!opgen.tensor<[D, K], f32>",
                  "!opgen.tensor<[N, K], f32>")

    def module(rhs: str, rhs_t: str, res_t: str) -> str:
        return f"""builtin.module {{
  "opgen.func"() <{{sym_name = "bad", arg_names = ["a", "b", "y"], dtype_vars = {{}}}}> ({{
  ^bb0(%a: {nd}, %b: {dk}, %y: {res_t}):
    %0 = "opgen.matmul"(%a, {rhs}) : ({nd}, {rhs_t}) -> {res_t}
    "opgen.return"(%0) <{{names = ["y"]}}> : ({res_t}) -> ()
  }}) : () -> ()
}}"""

    m = parse(module("%a", nd, nd))
    with pytest.raises(VerifyException, match=r"inner dims differ \(D vs N\)"):
        m.verify()
    parse(module("%b", dk, nk)).verify()


def test_tensor_type_syntax_round_trips():
    t = ir.TensorType.make(["1", "N", "D"], "T")
    assert str(t) == "!opgen.tensor<[1, N, D], T>"
    scalar = ir.TensorType.make([], "bool")
    assert str(scalar) == "!opgen.tensor<[], bool>"


def _folded(build, arg_types=()):
    """Run the L0 pipeline (canonicalize folds) on a function returning ``build(args)``'s value
    into an output ``out``; returns (the returned value's defining op, the function)."""
    from xdsl.dialects.builtin import ModuleOp

    probe = ir.FuncOp("probe", [f"a{i}" for i in range(len(arg_types))],
                      [ir.TensorType.make([], d) for d in arg_types], {})
    ops: list = []

    def emit(op):
        ops.append(op)
        return op.results[0]

    v = build(emit, probe.body.block.args)
    f = ir.FuncOp("f", [*(f"a{i}" for i in range(len(arg_types))), "out"],
                  [*(ir.TensorType.make([], d) for d in arg_types), v.type], {})
    mapping = dict(zip(probe.body.block.args, f.body.block.args, strict=False))
    for op in ops:
        for i, x in enumerate(op.operands):
            if x in mapping:
                op.operands[i] = mapping[x]
        f.body.block.add_op(op)
    f.body.block.add_op(ir.ReturnOp([v], ["out"]))
    m = ModuleOp([f])
    m.verify()
    pipeline.run(m, "l0")
    ret = f.body.block.last_op
    return ret.operands[0], f


def test_integer_and_bool_scalar_constants_fold():
    def c(emit, x, d):
        return emit(ir.ConstantOp(x, d))

    v, _ = _folded(lambda e, a: e(ir.AddOp(c(e, 40, "i64"), c(e, 2, "i64"))))
    assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == 42
    v, _ = _folded(lambda e, a: e(ir.CmpOp("lt", c(e, 3, "i64"), c(e, 7, "i64"))))
    assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == 1 and ir.tensor_type(v).dtype == "bool"
    v, _ = _folded(lambda e, a: e(ir.NotOp(e(ir.AndOp(c(e, True, "bool"), c(e, False, "bool"))))))
    assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == 1
    v, f = _folded(lambda e, a: e(ir.SelectOp(c(e, False, "bool"), a[0], a[1])), ("f32", "f32"))
    assert v is f.body.block.args[1]  # the false branch, a parameter
    v, f = _folded(lambda e, a: e(ir.AndOp(a[0], a[0])), ("bool",))
    assert v is f.body.block.args[0]  # x && x is x
    for x, y, q in ((7, 2, 3), (-7, 2, -3), (7, -2, -3), (-7, -2, 3)):  # C's division: toward zero
        v, _ = _folded(lambda e, a, x=x, y=y: e(ir.DivOp(c(e, x, "i64"), c(e, y, "i64"))))
        assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == q, (x, y)
    v, _ = _folded(lambda e, a: e(ir.CastOp(c(e, True, "bool"), "i64")))
    assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == 1 and ir.tensor_type(v).dtype == "i64"
    v, _ = _folded(lambda e, a: e(ir.CastOp(c(e, -5, "i64"), "bool")))
    assert isinstance(v.owner, ir.ConstantOp) and v.owner.number == 1 and ir.tensor_type(v).dtype == "bool"


def test_folding_keeps_what_it_cannot_compute_exactly():
    def c(emit, x, d):
        return emit(ir.ConstantOp(x, d))

    v, _ = _folded(lambda e, a: e(ir.AddOp(c(e, 100, "i8"), c(e, 100, "i8"))))  # wraps: not folded
    assert isinstance(v.owner, ir.AddOp)
    v, _ = _folded(lambda e, a: e(ir.AddOp(c(e, 0.1, "f32"), c(e, 0.2, "f32"))))  # float rounding: the targets'
    assert isinstance(v.owner, ir.AddOp)
    v, _ = _folded(lambda e, a: e(ir.DivOp(c(e, 7, "i64"), c(e, 0, "i64"))))  # by zero: the targets' guard
    assert isinstance(v.owner, ir.DivOp)
    v, _ = _folded(lambda e, a: e(ir.CastOp(c(e, 300, "i64"), "u8")))  # wraps: not folded
    assert isinstance(v.owner, ir.CastOp)
    v, _ = _folded(lambda e, a: e(ir.CastOp(c(e, 3, "i64"), "f32")))  # to a float: the targets' rounding
    assert isinstance(v.owner, ir.CastOp)


def test_repeated_and_true_checks_are_dropped():
    """A check repeating an earlier one (same condition, status, message) or of a true constant
    can never fail first: canonicalize drops it; a different message or status is kept."""
    from xdsl.dialects.builtin import ModuleOp

    f = ir.FuncOp("f", ["c", "x", "out"], [ir.TensorType.make([], "bool"), *[ir.TensorType.make([], "f32")] * 2], {})
    c, x, _ = f.body.block.args
    yes, no = ir.ConstantOp(True, "bool"), ir.ConstantOp(False, "bool")
    f.body.block.add_ops([
        yes, no,
        ir.CheckOp(c, "first", "shape"),
        ir.CheckOp(c, "first", "shape"),  # repeated: dropped
        ir.CheckOp(c, "first", "param"),  # another status: kept
        ir.CheckOp(c, "second", "shape"),  # another message: kept
        ir.CheckOp(yes.results[0], "always", "shape"),  # true: dropped
        ir.CheckOp(no.results[0], "never", "shape"),  # false: kept
        ir.ReturnOp([x], ["out"])])
    m = ModuleOp([f])
    m.verify()
    pipeline.run(m, "l0")
    checks = [(op.message.data, op.status.data) for op in f.body.block.ops if isinstance(op, ir.CheckOp)]
    assert checks == [("first", "shape"), ("first", "param"), ("second", "shape"), ("never", "shape")]
