"""The ``opgen`` command line, run in-process: list, show, eval, build --check and reproducible
builds into a scratch directory."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

from opgen import cli, registry
from opgen.passes import pipeline
from tests.conftest import SEED_OPS
from tests.reference import assert_close_policy, rounded, t64, tt

GENERATED = registry.REPO_ROOT / "generated"
STAMP_DIR = registry.REPO_ROOT / "build"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def listing() -> str:
    """``opgen list -v`` (one run: it lowers every op for every target)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["list", "-v"]) == 0
    return buf.getvalue()


def test_list_shows_the_five_ops(listing):
    listed = [line.split()[0] for line in listing.splitlines() if line and not line.startswith(" ")]
    assert set(SEED_OPS) <= set(listed)
    # one op per file in ops_dsl/ (helpers start with "_")
    files = sorted(p.stem for p in (registry.REPO_ROOT / "ops_dsl").glob("*.py")
                   if not p.name.startswith("_"))
    assert listed == files
    assert "aclnnEmbeddingDenseBackward" in listing and "infiniopRMSNormBackward" in listing
    assert "ttnn.embedding_bw" in listing


def test_list_counts_dtypes_converted_at_the_boundary_as_supported(listing):
    """FLCE's target dtype (TI, read only as cast(t, i64)) is converted by the NPU targets' hosts,
    so every TI is supported there (not 'all but TI=i32, TI=i64')."""
    lines = listing.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("fused_linear_cross_entropy_loss_grad "))
    line = next(x for x in lines[start + 1:] if "targets:" in x)
    assert "ascendc: all; TI converted on the NPU" in line
    assert "every TI (converted on the host)" in line and "TI=i" not in line


def test_list_verbose_has_typed_signatures(listing):
    assert "grad_y: Tensor[T, Batch(N), D].contiguous_last()" in listing
    assert "num_weights: size of V" in listing


@pytest.mark.parametrize("name", SEED_OPS)
def test_show(capsys, name):
    rc, out, _ = run(capsys, "show", name)
    assert rc == 0
    assert out.startswith(name) and "parameters:" in out and "variants" in out


def test_show_reports_rejected_variants_and_aliasing(capsys):
    _, out, _ = run(capsys, "show", "fused_linear_cross_entropy_loss_grad")
    assert "rejected (null)" in out
    _, out, _ = run(capsys, "show", "rms_norm_backward")
    assert "may alias: grad_x = grad_y" in out


@pytest.mark.parametrize("name", SEED_OPS)
def test_show_ir_and_stages(capsys, name):
    rc, final, _ = run(capsys, "show", name, "--ir")
    assert rc == 0
    assert f"stage '{pipeline.stages('l0')[-1]}'" in final and '"opgen.func"' in final
    rc, traced, _ = run(capsys, "show", name, "--stage", "traced")
    assert rc == 0 and "stage 'traced'" in traced
    assert f'sym_name = "{name}' in traced
    # --ir is the last stage; the generated file holds the same module
    body = final.split("\n", 1)[1].rstrip("\n")
    assert body in (GENERATED / "ir" / f"{name}.mlir").read_text()


def test_show_errors(capsys):
    rc, _, err = run(capsys, "show", "no_such_op")
    assert rc == 2 and "unknown op 'no_such_op'" in err
    rc, _, err = run(capsys, "show", "rms_norm_backward", "--stage", "nope")
    assert rc == 2 and "unknown stage 'nope'" in err


@pytest.mark.parametrize(("name", "argv", "outputs"), [
    ("embedding_dense_backward", ["--dims", "N=6,D=4,V=5"], {"out": "(5, 4) float32"}),
    ("embedding_dense_backward", ["--dims", "N=6,D=4,V=5", "--dtype", "T=bf16,IDX=f16",
                                  "--set", "scale_grad_by_freq=true,padding_idx=1"],
     {"out": "(5, 4) bfloat16"}),
    ("embedding_backward", ["--dims", "N=6,D=4,N1=5,N2=3", "--with", "i2,dtable2",
                            "--set", "alpha2=0.5"],
     {"dtable1": "(5, 4) float16", "dtable2": "(3, 4) float16"}),
    ("rms_norm_backward", ["--dims", "N=3,D=8", "--dtype", "T=f32", "--set", "eps=1e-6"],
     {"grad_x": "(3, 8) float32", "grad_w": "(8,) float32"}),
    ("embedding_bw", ["--dims", "N=6,D=4,V=5"], {"out": "(5, 4) bfloat16"}),
    ("fused_linear_cross_entropy_loss_grad", ["--dims", "BT=4,H=8,V=128,L=1", "--with", "softmax"],
     {"input_grad": "(4, 8) float16", "weight_grad": "(128, 8) float16"}),
    ("fused_linear_cross_entropy_loss_grad", ["--dims", "BT=4,H=8,V=128,L=1",
                                              "--with", "logits_max,sum_exp_logits"],
     {"input_grad": "(4, 8) float16", "weight_grad": "(128, 8) float16"}),
])
def test_eval_runs(capsys, name, argv, outputs):
    rc, out, err = run(capsys, "eval", name, *argv)
    assert rc == 0, err
    for o, desc in outputs.items():
        assert f"output {o}: shape {desc}" in out


def test_eval_reports_a_rejected_call(capsys):
    rc, _, err = run(capsys, "eval", "fused_linear_cross_entropy_loss_grad", "--dims",
                     "BT=4,H=8,V=128,L=1", "--with", "softmax", "--set", "label_smoothing=0.1")
    assert rc == 2 and "[param]" in err and "labelSmoothing" in err


def test_eval_inputs_file_against_torch(capsys, tmp_path, rng):
    """``--inputs`` / ``--save`` round trip, checked against torch on the same inputs."""
    grad = rounded(rng.standard_normal((2, 3, 4)), "f32")
    indices = np.array([[0, 4, 4], [1, 2, 4]])
    inputs, saved = tmp_path / "in.npz", tmp_path / "out.npz"
    np.savez(inputs, grad=grad, indices=indices, num_weights=np.int64(5))
    rc, _, err = run(capsys, "eval", "embedding_dense_backward", "--inputs", str(inputs),
                       "--set", "padding_idx=2,scale_grad_by_freq=true", "--save", str(saved))
    assert rc == 0, err
    with np.load(saved) as z:
        got = z["out"]
    ref = torch.ops.aten.embedding_dense_backward(t64(grad), torch.tensor(indices), 5, 2, True)
    same = torch.ops.aten.embedding_dense_backward(tt(grad, "f32"), torch.tensor(indices), 5, 2, True)
    assert_close_policy(got, ref, same, "f32")


def test_eval_bad_option(capsys):
    with pytest.raises(SystemExit):
        cli.main(["eval", "embedding_bw", "--dims", "N6"])


# ------------------------------------------------------------------------------- build


def _build_option(name: str) -> list[str]:
    """``[name]`` if ``opgen build`` has that option (e.g. --no-compile), else ``[]``."""
    sub = next(a for a in cli.make_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [name] if name in sub.choices["build"].format_help() else []


#: Builds here check generated files only; compiling the C library is not this module's job
#: (and would write into the shared build/ directory).
NO_COMPILE = _build_option("--no-compile")


@pytest.fixture
def keep_stamps():
    """A build into a scratch directory records a stamp under build/: remove it afterwards and
    put back any stamp that existed before."""
    before = {p: p.read_bytes() for p in STAMP_DIR.glob("generate*.stamp")}
    yield
    for p in STAMP_DIR.glob("generate*.stamp"):
        if p not in before:
            p.unlink(missing_ok=True)
    for p, data in before.items():
        if not p.exists() or p.read_bytes() != data:
            p.write_bytes(data)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fresh_builds_are_reproducible_and_match_generated(tmp_path, keep_stamps, capsys):
    """A fresh build, run from another working directory, writes exactly the committed generated/
    (written by another process, from the repository: reproducible, and no file records where
    opgen ran); an unchanged rebuild rewrites nothing; ``--check`` names an edited file and one
    the build does not produce, exits 1 and writes nothing. (One test: each full generation
    lowers every op for every target, about a minute on CI's machine.)"""
    import shutil
    import subprocess
    import sys

    a, b = tmp_path / "a", tmp_path / "b"
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    before = tree(GENERATED)
    r = subprocess.run([sys.executable, "-m", "opgen.cli", "build", "--out", str(a), "-q", *NO_COMPILE],
                       cwd=elsewhere, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    ta = tree(a)
    assert ta, "the build produced no files"
    assert ta == before
    assert tree(GENERATED) == before and not any(elsewhere.iterdir()), "a build into --out writes only there"
    shutil.copytree(a, b)
    # an unchanged rebuild into the same directory rewrites nothing
    mtimes = {p: (a / p).stat().st_mtime_ns for p in ta}
    assert cli.main(["build", "--out", str(a), "-q", *NO_COMPILE]) == 0
    assert {p: (a / p).stat().st_mtime_ns for p in ta} == mtimes
    # --check notices an edited file and a file the build does not produce, and nothing else (checked
    # on the mlir/ folder alone: the same comparison as a full --check, without another full generation)
    victim = sorted((b / "mlir").rglob("*.mlir"))[0]
    victim.write_text(victim.read_text() + "// edited\n")
    (b / "mlir" / "leftover.txt").write_text("x")
    capsys.readouterr()
    tb = tree(b)
    rc, stdout, err = run(capsys, "build", "--check", "--target", "mlir", "--out", str(b), "-q")
    assert rc == 1
    assert stdout.splitlines() == [f"stale: {victim.relative_to(b)}", "not produced by the build: mlir/leftover.txt"]
    assert "is stale (1 changed, 1 extra)" in err, err
    assert tree(b) == tb, "--check must not write"


def test_ttmetal_report_on_the_command_line(capsys):
    """``show --target ttmetal --report``: per program the cores, L1 and DRAM bytes against the
    minimum; a scatter-add's says which indices its traffic assumes."""
    rc, out, _ = run(capsys, "show", "embedding_bw", "--target", "ttmetal", "--report", "--dims", "N=100,D=64,V=300",
                     "--platform", "grid_x=2,grid_y=2")
    assert rc == 0
    assert "grid 2x2" in out and "uniform random indices (seed 0)" in out
    totals = [line for line in out.splitlines() if "| all |" in line]
    assert len(totals) == 2 and all("/ minimum " in line for line in totals), out
    assert "| embedding_bw.f32 | 0 | 4 / 4 (" in out, out
    rc, out, _ = run(capsys, "show", "rms_norm_backward", "--target", "ttmetal", "--report", "--dims", "N=64,D=4100")
    assert rc == 0 and "uniform random" not in out
    assert "rms_norm_backward.f32.cached | all |" in out and "refused: the CBs of launch 0" in out, out
    with pytest.raises(SystemExit):
        cli.main(["show", "rms_norm_backward", "--target", "ttmetal", "--report", "--platform", "cores=4"])
    # one program by --variant, with progress on stderr; FLCE's one block of rows takes 2 cores
    # (V's two spans), its partial sums added by a second launch of one unit
    flce = "fused_linear_cross_entropy_loss_grad"
    rc, out, err = run(capsys, "show", flce, "--target", "ttmetal", "--report", "--dims", "BT=40,H=16,V=3000",
                       "--variant", "__softmax.bf16.u8")
    assert rc == 0 and len([line for line in out.splitlines() if "| all |" in line]) == 1, out
    row0 = next(line for line in out.splitlines() if f"| {flce}__softmax.bf16.u8 | 0 | 2 / 64 (2) |" in line)
    assert ":256 " in row0, row0  # the panel CB: G's 4 x 64 tiles resident for G @ W
    assert f"| {flce}__softmax.bf16.u8 | 1 | 1 / 64 (1) |" in out, out
    assert f"report 1/1 {flce}__softmax.bf16.u8" in err, err
    rc, out, err = run(capsys, "show", "embedding_bw", "--target", "ttmetal", "--report", "--variant", "f64")
    assert rc != 0 and "--variant 'f64' selects none" in err, err


def test_list_names_every_target_when_ascendc_lacks_the_op(op_files):
    """An op Ascend C refuses still gets TT-Metal's verdict on the line (before, the line stopped
    at Ascend C's refusal); exact GELU (erf, now a polynomial kernel on the tile level) is listed
    with its dtypes on both NPU targets."""
    from opgen.cli import _targets_line
    from tests.test_new_op_backends import GELU

    ops = op_files({"gelu.py": GELU, "odd.py": """
from opgen.dsl import *
N, D = dims("N D")

@op
def half_rows(x: Tensor[f32, N, D], *, y: Output[f32, N, D]):
    return {"y": concat([x[:, D // 2:], x[:, :D // 2]], axis=1)}
"""})
    line = _targets_line(ops["half_rows"])
    assert "ascendc: not supported (slicing with bounds)" in line, line
    assert "ttmetal: not supported (slicing with bounds)" in line, line
    line = _targets_line(ops["gelu_backward"])
    assert "ascendc: all" in line and "ttmetal: T=bf16; T=f32" in line, line
