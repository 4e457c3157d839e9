"""``tabulate`` (opgen/lower/tabulate.py): an expensive function of one bf16/f16 element is looked
up in a table of its 65536 values, built once by the same C that computes it in place.

The pass's decisions are checked on the CPU pipeline's IR; the built library is checked over
every bf16 and f16 value of the element: the looked-up instance gives exactly the bits of the
f32 instance (which computes the function in place) rounded once, and agrees with the oracle;
the tables are built once under concurrent first calls, and run clean under ASan and UBSan.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from opgen import oracle, registry, runtime
from opgen.emit import cpu
from opgen.ir import dialect as ir
from opgen.lower import sched as s
from opgen.lower.cpu_map import cpu_mapping
from opgen.lower.sched import CpuMapping
from opgen.lower.tabulate import THRESHOLD, cone, cost
from tests.ops_dirs import built_ops
from tests.test_cpu_sanitizers import assert_clean_under_sanitizers

OPS = '''
"""Functions of one 16-bit element."""
from opgen.dsl import *

N, D = dims("N D")
T = dtype_var("T", f32, bf16, f16)


@op
def gelu_grad(grad: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
    """Exact GELU backward: an erf and an exp of x (looked up in bf16 and f16)."""
    cdf = 0.5 * (1.0 + erf(x * 0.7071067811865476))
    pdf = exp(-0.5 * x * x) * 0.3989422804014327
    return {"dx": grad * (cdf + x * pdf)}


@op
def bump(x: Tensor[T, N, D], alpha: float = 1.0, *, y: Output[T, N, D], s: Output[f32, N]):
    """y = alpha * (erf(x) exp(-x^2) + tanh(x)), s = the row sums of erf(x) exp(-x^2) + tanh(x):
    the function of x is looked up, the product with the run-time alpha is not; the sums read
    the same lookups."""
    b = erf(x) * exp(-x * x) + tanh(x)
    return {"y": alpha * b, "s": sum(cast(b, f32), axis=1)}


@op
def silu_grad(grad: Tensor[T, N, D], x: Tensor[T, N, D], *, dx: Output[T, N, D]):
    """SiLU backward: one sigmoid of x, cheaper to compute than to look up."""
    sg = sigmoid(x)
    return {"dx": grad * sg * (1 + x * (1 - sg))}


@op
def gelu_grad_f32(grad: Tensor[f32, N, D], x: Tensor[f32, N, D], *, dx: Output[f32, N, D]):
    """The exact GELU backward in f32 only: no 16-bit element, no table."""
    return {"dx": grad * (0.5 * (1.0 + erf(x * 0.7071067811865476)) + x * exp(-0.5 * x * x) * 0.3989422804014327)}
'''

NP16 = {"bf16": ml_dtypes.bfloat16, "f16": np.float16}


def _load_fns(name: str) -> list[s.LoadFnOp]:
    (k,) = cpu.kernels(registry.get(name)).values()
    return [o for o in k.walk() if isinstance(o, s.LoadFnOp)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    with built_ops(tmp_path_factory.mktemp("tabulate"), "opgen_test_tabulate", {"tab_ops.py": OPS}) as b:
        yield b


def test_expensive_functions_of_one_16_bit_element_are_looked_up(built):
    """GELU's erf and exp of x become one ``sched.load_fn`` (its region: the load's element
    and constants only); ``bump``'s function of x too (once, into the row of scratch its row sums
    and y read), but not its product with the run-time ``alpha``; SiLU's sigmoid (cheaper than a
    lookup) and an op without 16-bit elements stay."""
    (g,) = _load_fns("gelu_grad")
    ops = [o for o in g.body.block.ops if not isinstance(o, s.YieldOp)]
    assert {type(o) for o in ops} >= {ir.ErfOp, ir.ExpOp} and cost(ops) >= THRESHOLD
    assert all(not isinstance(o, ir.DimOp) for o in ops)
    # (one: the row of scratch that the row sums and y read, row groups' kept rows)
    (b,) = _load_fns("bump")
    assert {type(o) for o in b.body.block.ops} >= {ir.ErfOp, ir.ExpOp, ir.TanhOp}
    (st,) = [u.operation for u in b.result.uses]
    assert isinstance(st, s.StoreOp) and s.buf_type(st.buf).role.data == "local"
    reads = [ld.result for ld in st.buf.owner.parent_op().walk() if isinstance(ld, s.LoadOp) and ld.buf is st.buf]
    summed = [c.result for r in reads for u in r.uses if isinstance(c := u.operation, ir.CastOp)]  # (cast(b, f32))
    assert any(isinstance(u.operation, s.AccumOp) for r in summed for u in r.uses)
    assert any(isinstance(u.operation, ir.MulOp) for r in reads for u in r.uses), "alpha * b: outside the table"
    assert _load_fns("silu_grad") == [] and _load_fns("gelu_grad_f32") == []
    (k,) = cpu.kernels(registry.get("silu_grad")).values()  # (the cone the pass weighed: below the threshold)
    loads = [o for o in k.walk() if isinstance(o, s.LoadOp) and k.param_names.get(o.buf) == "x"]
    assert loads and all(cost(cone(ld)) < THRESHOLD for ld in loads)


def test_only_16_bit_instances_read_tables(built):
    """The bf16 and f16 instances of GELU read a table built once (pthread_once); the f32
    instance computes the function in place."""
    src = (Path(built["out"]) / "cpu" / "gelu_grad.c").read_text()  # type: ignore[arg-type]
    for t in ("bf16", "f16"):
        assert f"static float k_gelu_grad_{t}_tab0[65536];" in src
        assert f"pthread_once(&k_gelu_grad_{t}_tab0_once, k_gelu_grad_{t}_tab0_build);" in src
    assert "k_gelu_grad_f32_tab" not in src
    f32_fn = src[src.index("k_gelu_grad_f32_u("):src.index("k_gelu_grad_bf16_tab0[65536]")]
    assert "opgen_erff(" in f32_fn and "_tab0[" not in f32_fn
    assert "pthread" not in (Path(built["out"]) / "cpu" / "silu_grad.c").read_text()  # type: ignore[arg-type]


def test_rows_are_looked_up_a_strip_at_a_time(built):
    """map-cpu staged the load of x's row (a stream loop's strip at a time) and the lookup
    replacing it stays staged: the unit-stride 16-bit instances look a strip up at once
    (opgen_table_load_strip, scalar loads: faster than the vectorised loop's gather) and
    read it from the strip's array; the general-stride flavour looks up element by element."""
    (g,) = _load_fns("gelu_grad")
    assert cpu_mapping(g) == CpuMapping.STAGED
    src = (Path(built["out"]) / "cpu" / "gelu_grad.c").read_text()  # type: ignore[arg-type]
    for t in ("bf16", "f16"):
        unit = src[src.index(f"k_gelu_grad_{t}_u("):]
        unit = unit[:unit.index("return OPGEN_SUCCESS")]
        assert "opgen_table_load_strip(ld" in unit and f", k_gelu_grad_{t}_tab0, &p_x[" in unit
        general = src[src.index(f"k_gelu_grad_{t}_g("):]
        general = general[:general.index("return OPGEN_SUCCESS")]
        assert "opgen_table_load_strip" not in general and f"k_gelu_grad_{t}_tab0[p_x[" in general


def _every_value(t: str, rows: int = 64) -> np.ndarray:
    """Every bit pattern of a 16-bit float, as (rows, 65536 / rows)."""
    return np.arange(65536, dtype=np.uint16).view(NP16[t]).reshape(rows, -1)


@pytest.mark.parametrize("t", ["bf16", "f16"])
def test_lookups_give_the_bits_of_the_function_computed_in_place(built, rng, t):
    """Over every value of x (NaNs and infinities included): the 16-bit instance's dx is
    exactly the f32 instance's dx (the function computed in place, on the same values) rounded
    to the 16-bit dtype, and close to the oracle's; in both stride flavours (a column view
    takes the general-stride kernel)."""
    x = _every_value(t)
    g = rng.standard_normal(x.shape).astype(NP16[t])
    lib = built["lib"]
    got = runtime.call("gelu_grad", lib=lib, grad=g, x=x)["dx"]
    wide = runtime.call("gelu_grad", lib=lib, grad=g.astype(np.float32), x=x.astype(np.float32))["dx"]
    nan = np.isnan(got.astype(np.float32))
    assert np.array_equal(nan, np.isnan(wide)) and nan.sum() > 0  # (NaN payloads: not compared)
    assert np.array_equal(got.view(np.uint16)[~nan], wide.astype(NP16[t]).view(np.uint16)[~nan])
    ref = oracle.run(built["ops"]["gelu_grad"], grad=g, x=x)["dx"]  # type: ignore[index]
    a, b = got.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    ok = ~np.isnan(a)
    assert np.allclose(a[ok], b[ok], rtol=1e-2, atol=1e-5)
    xs, gs = np.asfortranarray(x), np.asfortranarray(g)  # (last dim strided: the general flavour)
    strided = runtime.call("gelu_grad", lib=lib, grad=gs, x=xs)["dx"]
    assert np.array_equal(np.asarray(strided).view(np.uint16), got.view(np.uint16))
    for lo, hi in ((3, 1000), (1, 66), (0, 63), (5, 36)):  # (rows of odd lengths and starts: strips, peels, tails)
        part = runtime.call("gelu_grad", lib=lib, grad=g[:, lo:hi], x=x[:, lo:hi])["dx"]
        assert np.array_equal(np.asarray(part).view(np.uint16)[~nan[:, lo:hi]],
                              got[:, lo:hi].view(np.uint16)[~nan[:, lo:hi]])


def test_runtime_scalars_and_row_sums_around_a_lookup(built, rng):
    """``bump`` in bf16: y and the row sums against the oracle, alpha applied after the lookup."""
    x = _every_value("bf16", 256)
    for alpha in (1.0, -2.5):
        got = runtime.call("bump", lib=built["lib"], x=x, alpha=alpha)
        ref = oracle.run(built["ops"]["bump"], x=x, alpha=alpha)  # type: ignore[index]
        for name in ("y", "s"):
            a, b = np.asarray(got[name], np.float64), np.asarray(ref[name], np.float64)
            assert np.array_equal(np.isnan(a), np.isnan(b)), name
            ok = ~np.isnan(a)
            assert np.allclose(a[ok], b[ok], rtol=1e-2, atol=1e-4), name


FIRST_USE = textwrap.dedent("""
    import sys, threading, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    x = np.arange(65536, dtype=np.uint16).view(ml_dtypes.bfloat16).reshape(64, 1024)
    g = np.ones_like(x)
    out, go = [None] * 8, threading.Barrier(8)
    def call(i):
        go.wait()
        out[i] = runtime.call("gelu_grad", lib=lib, grad=g, x=x)["dx"].view(np.uint16)
    ts = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    last = runtime.call("gelu_grad", lib=lib, grad=g, x=x)["dx"].view(np.uint16)
    print(all(np.array_equal(o, last) for o in out))
""")


def test_tables_are_built_once_under_concurrent_first_calls(built):
    """Eight threads make the first calls at once (a fresh process: no table built yet); every
    result is the same as a later call's."""
    lib = Path(built["root"]) / "generated.build" / "cpu" / "libopgen.so"  # type: ignore[arg-type]
    r = subprocess.run([sys.executable, "-c", FIRST_USE, str(lib)], capture_output=True, text=True, timeout=300,
                       cwd=registry.REPO_ROOT, env={**os.environ, "OPGEN_OPS_DIR": os.environ["OPGEN_OPS_DIR"]})
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr[-3000:]


SANITIZED = textwrap.dedent("""
    import sys, numpy as np, ml_dtypes
    from opgen import runtime
    lib = runtime.load(sys.argv[1])
    for dt in (ml_dtypes.bfloat16, np.float16):
        x = np.arange(65536, dtype=np.uint16).view(dt).reshape(256, 256)
        for xs in (x, x[:, 1:], np.asfortranarray(x[:7, :33])):
            g = np.ones(xs.shape, dt)
            runtime.call("gelu_grad", lib=lib, grad=g, x=xs)
            runtime.call("bump", lib=lib, x=xs, alpha=0.5)
    print("done")
""")


def test_lookups_are_clean_under_asan_and_ubsan(built):
    """The tables' builders and lookups under AddressSanitizer and UndefinedBehaviorSanitizer
    (every bit pattern, a row offset, a general-stride view)."""
    assert_clean_under_sanitizers(built, SANITIZED)
