"""Malformed op definitions raise DSLError naming the op file and the offending line.

Each case is a real .py file in a fresh ops directory, loaded through the registry the way the
CLI loads ops_dsl/. The offending line carries the marker ``# <- HERE``; the test finds its line
number from the text, so the expectation is not produced by opgen itself.
"""

from __future__ import annotations

import re
import textwrap

import pytest

from opgen.dsl import DSLError

HEADER = """\
from opgen.dsl import *

N, D, V = dims("N D V")
T = dtype_var("T", f16, bf16, f32)
"""

CASES = {
    "dim_mismatch": """
@op
def dim_mismatch(x: Tensor[f32, N, D], w: Tensor[f32, V, D], *, y: Output[f32, N, D]):
    s = x * 2.0
    return {"y": s + w}  # <- HERE
""",
    "int_result_for_float_output": """
@op
def int_result_for_float_output(x: Tensor[i32, N, D], *, y: Output[f32, N, D]):
    z = x + 1
    return {"y": z}  # <- HERE
""",
    "matmul_of_ints": """
@op
def matmul_of_ints(a: Tensor[i32, N, D], b: Tensor[i32, V, D], *, y: Output[f32, N, V]):
    c = a @ b.T  # <- HERE
    return {"y": c}
""",
    "ambiguous_promotion": """
@op
def ambiguous_promotion(a: Tensor[T, N, D], b: Tensor[f16, N, D], *, y: Output[f32, N, D]):
    c = a + b  # <- HERE
    return {"y": cast(c, f32)}
""",
    "integer_indexing": """
@op
def integer_indexing(x: Tensor[f32, N, D], *, y: Output[f32, D]):
    first = x[0]  # <- HERE
    return {"y": first}
""",
    "python_if_on_tensor": """
@op
def python_if_on_tensor(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    if x > 0:  # <- HERE
        return {"y": x}
    return {"y": -x}
""",
    "iterating_a_tensor": """
@op
def iterating_a_tensor(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    rows = [r for r in x]  # <- HERE
    return {"y": rows[0]}
""",
    "missing_output": """
@op
def missing_output(x: Tensor[f32, N, D], *, y: Output[f32, N, D], z: Output[f32, N, D]):
    y2 = x * x
    return {"y": y2}  # <- HERE
""",
    "undeclared_output": """
@op
def undeclared_output(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    return {"y": x, "extra": x}  # <- HERE
""",
    "output_shape_mismatch": """
@op
def output_shape_mismatch(x: Tensor[f32, N, D], *, y: Output[f32, V, D]):
    z = x * 3.0
    return {"y": z}  # <- HERE
""",
    "output_rank_mismatch": """
@op
def output_rank_mismatch(x: Tensor[f32, N, D], *, y: Output[f32, D]):
    z = x * 3.0
    return {"y": z}  # <- HERE
""",
    "bad_axis": """
@op
def bad_axis(x: Tensor[f32, N, D], *, y: Output[f32, N]):
    s = x.sum(axis=2)  # <- HERE
    return {"y": s}
""",
    "where_needs_bool": """
@op
def where_needs_bool(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    return {"y": where(x, x, 0.0)}  # <- HERE
""",
    "gather_float_indices": """
@op
def gather_float_indices(t: Tensor[f32, V, D], i: Tensor[f32, N], *, y: Output[f32, N, D]):
    rows = gather(t, i)  # <- HERE
    return {"y": rows}
""",
    "matmul_inner_dims": """
@op
def matmul_inner_dims(a: Tensor[f32, N, D], b: Tensor[f32, V, D], *, y: Output[f32, N, V]):
    return {"y": a @ b}  # <- HERE
""",
    # signature errors are found when the file is imported; they name the op's definition
    "parameter_without_annotation": """
@op  # <- HERE
def parameter_without_annotation(x: Tensor[f32, N, D], scale, *, y: Output[f32, N, D]):
    return {"y": x}
""",
    "no_output": """
@op  # <- HERE
def no_output(x: Tensor[f32, N, D]):
    return {}
""",
    "tensor_default": """
@op  # <- HERE
def tensor_default(x: Tensor[f32, N, D] = 1.0, *, y: Output[f32, N, D]):
    return {"y": x}
""",
    "batch_and_plain": """
@op  # <- HERE
def batch_and_plain(x: Tensor[f32, Batch(N), D], i: Tensor[i32, N], *, y: Output[f32, N, D]):
    return {"y": x}
""",
}

MESSAGES = {
    "dim_mismatch": r"shapes \('N', 'D'\) and \('V', 'D'\) do not broadcast",
    "int_result_for_float_output": r"output 'y' is f32 but the op returns i32",
    "matmul_of_ints": r"matmul needs floating operands",
    "ambiguous_promotion": r"cannot promote T and f16",
    "integer_indexing": r"indexing supports ':', bounded slices 'a:b' and None \(got 0\)",
    "python_if_on_tensor": r"no Python truth value",
    "iterating_a_tensor": r"cannot be iterated",
    "missing_output": r"does not return output\(s\) \['z'\]",
    "undeclared_output": r"returns \['extra'\], which are not declared",
    "output_shape_mismatch": r"output 'y' has shape \('V', 'D'\) but the op returns \('N', 'D'\)",
    "output_rank_mismatch": r"output 'y' has shape \('D',\) but the op returns \('N', 'D'\)",
    "bad_axis": r"axis 2 out of range",
    "where_needs_bool": r"condition must be bool",
    "gather_float_indices": r"indices must be integers",
    "matmul_inner_dims": r"matmul inner dims differ",
    "parameter_without_annotation": r"parameter 'scale' needs an annotation",
    "no_output": r"declares no Output",
    "tensor_default": r"tensor 'x' has a default",
    "batch_and_plain": r"dim N is plain in 'i' but Batch elsewhere",
}


def marked_line(text: str) -> int:
    (n,) = [i for i, line in enumerate(text.splitlines(), 1) if "# <- HERE" in line]
    return n


@pytest.mark.parametrize("case", sorted(CASES))
def test_error_names_file_and_line(op_files, case):
    text = HEADER + textwrap.dedent(CASES[case])
    fname = f"{case}_op.py"
    with pytest.raises(DSLError) as e:
        for o in op_files({fname: text}).values():
            o.variants  # noqa: B018 - tracing happens here
    msg = str(e.value)
    assert re.search(rf"(^|/){re.escape(fname)}:{marked_line(text)}:", msg), msg
    assert re.search(MESSAGES[case], msg), msg


def test_error_inside_a_helper_module_names_the_helper(op_files):
    """A mistake in a shared helper (``_*.py``, like ops_dsl/_embedding.py) names the helper."""
    helper = textwrap.dedent("""\
        from opgen.dsl import matmul


        def project(a, b):
            return matmul(a, b)  # <- HERE
        """)
    pkg = "{pkg}"
    user = HEADER + textwrap.dedent(f"""
        from {pkg}._helpers import project


        @op
        def uses_helper(a: Tensor[f32, N, D], b: Tensor[f32, V, D], *, y: Output[f32, N, V]):
            return {{"y": project(a, b)}}
        """)
    with pytest.raises(DSLError) as e:
        ops = op_files({"_helpers.py": helper, "uses_helper.py": user, "__init__.py": ""},
                       package_placeholder=pkg)
        ops["uses_helper"].variants  # noqa: B018
    assert f"_helpers.py:{marked_line(helper)}:" in str(e.value)


def test_directory_without_ops_is_an_error(op_files):
    with pytest.raises(DSLError, match=r"helpers_only\.py: defines no @op"):
        op_files({"helpers_only.py": "X = 1\n"})


def test_duplicate_op_names_are_an_error(op_files):
    one = HEADER + textwrap.dedent("""
        @op
        def twin(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
            return {"y": x}
        """)
    with pytest.raises(DSLError, match=r"op 'twin' is already defined in .*a_twin\.py"):
        op_files({"a_twin.py": one, "b_twin.py": one})


@pytest.mark.parametrize(("name", "symbol"), [("fail", "opgen_fail"), ("expf", "opgen_expf"),
                                            ("run", "opgen_cuda_run"), ("seg_words", "opgen_seg_words")])
def test_op_names_clashing_with_runtime_symbols_are_an_error(op_files, name, symbol):
    """An op's C entry points are opgen_<op> (and opgen_cuda_<op>, ...): a name the runtime
    already uses would not compile or link, so it is refused when the op is loaded."""
    text = HEADER + textwrap.dedent(f"""
        @op
        def {name}(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
            return {{"y": x}}
        """)
    with pytest.raises(DSLError, match=rf"op .{name}. would define the C symbol\(s\) .*\b{symbol}\b.*rename the op"):
        op_files({"clash.py": text})


def test_op_names_whose_symbols_clash_with_each_other_are_an_error(op_files):
    text = HEADER + textwrap.dedent("""
        @op
        def norm(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
            return {"y": x}

        @op
        def norm_workspace_size(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
            return {"y": x}
        """)
    with pytest.raises(DSLError, match=r"op 'norm_workspace_size' would define the C symbol\(s\) "
                                        r".*\bopgen_norm_workspace_size\b"):
        op_files({"two.py": text})


def test_primitives_outside_an_op_body():
    from opgen.dsl import exp

    with pytest.raises(DSLError, match=r"test_dsl_errors\.py:\d+: DSL primitives can only be used"):
        exp(1.0)


def test_tracing_under_a_profiler_keeps_the_profiler(op_files):
    """Tracing notes the line an op body returned from with a profile function; under cProfile
    (a profile function already set) it leaves the profiler alone: the op traces, the profiler
    goes on recording after it, and an output error names the op's first line (its decorator)
    instead."""
    import cProfile
    import pstats
    import sys

    good = HEADER + textwrap.dedent("""
        @op
        def twice(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
            return {"y": x * 2.0}
        """)
    bad = HEADER + textwrap.dedent("""
        @op  # <- HERE
        def wrong_shape(x: Tensor[f32, N, D], *, y: Output[f32, V, D]):
            return {"y": x}
        """)

    def after_tracing() -> int:
        return 7

    prof = cProfile.Profile()
    prof.enable()
    try:
        ops = op_files({"good_op.py": good})
        assert ops["twice"].variants  # traced (an IR module per dtype binding)
        with pytest.raises(DSLError) as e:
            op_files({"bad_op.py": bad})["wrong_shape"].variants  # noqa: B018
        assert after_tracing() == 7
        still_set = sys.getprofile() is not None
    finally:
        prof.disable()
    assert still_set, "tracing removed the profiler"
    names = {fn for (_file, _line, fn) in pstats.Stats(prof).stats}  # type: ignore[attr-defined]
    assert "after_tracing" in names, "the profiler stopped recording after tracing"
    assert re.search(rf"bad_op.py:{marked_line(bad)}:", str(e.value)), str(e.value)
    assert "output 'y' has shape" in str(e.value)
