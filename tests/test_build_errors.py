"""``opgen build`` with broken ops: every error names the op (or file), the target and the stage
and says what to do; one op's or one target's failure does not stop the others from being
generated and built; the command still exits 1 and lists what failed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from opgen import cli, registry, runtime
from opgen.emit import cuda

GOOD = '''
from opgen.dsl import *
(N,) = dims("N")


@op
def twice(x: Tensor[f32, N], *, y: Output[f32, N]):
    """y = 2x"""
    return {"y": x * 2.0}


@op
def thrice(x: Tensor[f32, N], *, y: Output[f32, N]):
    """y = 3x (its CUDA generator is made to fail below)"""
    return {"y": x * 3.0}
'''

BAD_TRACE = '''
from opgen.dsl import *
N, D = dims("N D")


@op
def wrong_shape(x: Tensor[f32, N, D], *, y: Output[f32, N]):
    """returns the wrong shape"""
    return {"y": x}
'''

BAD_IMPORT = '''
from opgen.dsl import *
(N,) = dims("N")


@op
def bad_signature(x: Tensor[f32, (N,)], *, y: Output[f32, N]):
    return {"y": x}
'''


@pytest.fixture
def broken_ops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "opgen_test_broken_ops"
    d.mkdir()
    (d / "good.py").write_text(GOOD)
    (d / "bad_trace.py").write_text(BAD_TRACE)
    (d / "bad_import.py").write_text(BAD_IMPORT)
    monkeypatch.setenv("OPGEN_OPS_DIR", str(d))
    registry.load_all.cache_clear()
    real = cuda.op_source

    def failing(o, fuse=True):  # an internal error of one target for one op
        if o.name == "thrice":
            raise KeyError("<OpResult[!sched.buf<[], f32, local>] ...>")
        return real(o, fuse)

    monkeypatch.setattr(cuda, "op_source", failing)
    yield tmp_path
    registry.load_all.cache_clear()


def test_failures_are_isolated_named_and_listed(broken_ops: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = broken_ops / "gen"
    rc = cli.main(["build", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 1
    assert "ops file" in err and "bad_import.py" in err and "target load, stage import" in err
    assert "op 'wrong_shape'" in err and "target ir, stage trace" in err and "output 'y' has shape" in err
    assert "op 'thrice'" in err and "target cuda, stage emit-cuda" in err and "KeyError" in err
    assert "internal compiler error" in err and "--traceback" in err
    assert "what to do: fix the op's definition" in err
    assert "3 failure(s), everything else was generated and built" in err
    # everything else was generated ...
    assert (out / "cpu" / "twice.c").is_file() and (out / "cuda" / "twice.cu").is_file()
    assert (out / "cpu" / "thrice.c").is_file() and not (out / "cuda" / "thrice.cu").exists()
    assert not (out / "cpu" / "wrong_shape.c").exists()
    assert "opgen_thrice(" in (out / "include" / "opgen.h").read_text()
    assert "opgen_cuda_thrice(" not in (out / "include" / "opgen_cuda.h").read_text()
    assert "opgen_cuda_twice(" in (out / "include" / "opgen_cuda.h").read_text()
    # ... and built: both good ops run
    lib = runtime.load(str(broken_ops / "gen.build" / "cpu" / "libopgen.so"))
    x = np.arange(5, dtype=np.float32)
    assert np.array_equal(runtime.call("twice", lib=lib, x=x)["y"], 2 * x)
    assert np.array_equal(runtime.call("thrice", lib=lib, x=x)["y"], 3 * x)
    # a failed build leaves no up-to-date stamp: the next build reports the failures again
    assert cli.main(["build", "--out", str(out), "-q", "--no-compile"]) == 1
    assert "3 failure(s)" in capsys.readouterr().err


def test_traceback_flag(broken_ops: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "--out", str(broken_ops / "gen"), "-q", "--no-compile", "--traceback"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in failing" in err
    assert cli.main(["build", "--out", str(broken_ops / "gen"), "-q", "--no-compile"]) == 1
    assert "Traceback" not in capsys.readouterr().err


def test_check_reports_failures_too(broken_ops: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = broken_ops / "gen"
    cli.main(["build", "--out", str(out), "-q", "--no-compile"])
    capsys.readouterr()
    assert cli.main(["build", "--check", "--out", str(out), "-q"]) == 1
    assert "op 'thrice'" in capsys.readouterr().err


def test_show_names_the_op_and_the_stage(broken_ops: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from opgen.lower import to_loops

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("lowering exploded")

    monkeypatch.setattr(to_loops, "lower_func", broken)
    assert cli.main(["show", "twice", "--target", "cpu", "--ir"]) == 2
    err = capsys.readouterr().err
    assert "op 'twice'" in err and "stage 'lower-to-loops' of pipeline 'cpu'" in err and "lowering exploded" in err


def test_out_dir_builds_never_touch_the_repository_build(broken_ops: Path) -> None:
    """--out compiles beside the output directory (OUT.build), not into <repo>/build."""
    repo_lib = registry.REPO_ROOT / "build" / "cpu" / "libopgen.so"
    before = repo_lib.stat().st_mtime_ns if repo_lib.exists() else None
    cli.main(["build", "--out", str(broken_ops / "other"), "-q"])
    assert (broken_ops / "other.build" / "cpu" / "libopgen.so").is_file()
    assert (repo_lib.stat().st_mtime_ns if repo_lib.exists() else None) == before
    # its CMake package and pkg-config file point at that library and headers
    config = (broken_ops / "other.build" / "cpu" / "opgenConfig.cmake").read_text()
    assert str(broken_ops / "other.build" / "cpu" / "libopgen.so") in config
    assert str(broken_ops / "other" / "include") in config
    pc = (broken_ops / "other.build" / "cpu" / "opgen.pc").read_text()
    assert f"libdir={broken_ops / 'other.build' / 'cpu'}" in pc


def test_concurrent_compiles_of_one_object_all_succeed(tmp_path: Path) -> None:
    """Builds sharing an object directory (test workers, two ``opgen build`` runs) may compile the
    same source at the same time: each writes its own scratch file and renames it into place, so
    every one succeeds and the object is whole (a fixed ``<obj>.tmp`` name let one build rename
    away the file another was about to rename: FileNotFoundError)."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from opgen.compile import compile_cached, compiler

    src = tmp_path / "k.c"
    src.write_text("".join(f"int f{i}(int x) {{ return x * {i} + {i * i}; }}\n" for i in range(400)))
    obj_dir = tmp_path / "obj"
    obj_dir.mkdir()
    cc = compiler()
    with ThreadPoolExecutor(max_workers=8) as ex:
        results = list(ex.map(lambda _: compile_cached(cc, cc, ["-O1"], [], src, obj_dir, b""), range(8)))
    (obj,) = {o for o, _ in results}
    assert sorted(p.name for p in obj_dir.iterdir()) == [obj.name]  # no scratch file left behind
    nm = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout
    assert "T f399" in nm and "T f0" in nm


def test_the_object_cache_shares_objects_of_one_preprocessed_source(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """$OPGEN_OBJECT_CACHE: a source whose preprocessed text, name, compiler and flags match an
    object in the cache is not compiled but copied from it (libraries of different ops share their
    runtime's objects); a different text, other flags, another CPU under -march=native, or a debug
    build (-g: objects name their source's path) compile on their own; a compile error is still
    reported."""
    from opgen import compile as compile_mod
    from opgen.compile import CompileError, compile_cached, compiler

    cache = tmp_path / "cache"
    monkeypatch.setenv("OPGEN_OBJECT_CACHE", str(cache))
    cc = compiler()

    def lib(name: str, header: str, flags: tuple[str, ...] = ("-O1",)) -> tuple[Path, bool]:
        d = tmp_path / name
        (d / "obj").mkdir(parents=True)
        (d / "h.h").write_text(header)
        (d / "rt.c").write_text('#include "h.h"\nint f(int x) { return x * K; }\n')
        return compile_cached(cc, cc, list(flags), [f"-I{d}"], d / "rt.c", d / "obj", header.encode(), share=True)

    first, fresh = lib("a", "#define K 3 /* library a */\n")
    assert fresh and len(list(cache.iterdir())) == 1
    (shared,) = cache.iterdir()
    assert shared.read_bytes() == first.read_bytes()
    shared.write_bytes(b"stand-in object")  # (what the next library gets is this file, not a compile)
    # another library: its header differs (a comment, another op's declarations), its preprocessed text does not
    second, fresh = lib("b", "#define K 3 /* library b, with other ops */\n")
    assert fresh and second.read_bytes() == b"stand-in object"
    third, _ = lib("c", "#define K 4\n")
    fourth, _ = lib("d", "#define K 3 /* library d */\n", ("-O2",))
    debug, _ = lib("e", "#define K 3 /* library e */\n", ("-O1", "-g"))
    for obj in (third, fourth, debug):
        assert obj.read_bytes().startswith(b"\x7fELF")
    assert len(list(cache.iterdir())) == 3  # (a's, c's and d's; not the -g one)
    with pytest.raises(CompileError, match="undeclared"):
        lib("f", "#define K undeclared_name\n")
    # -march=native: what it means on this machine is part of the key (a cache two CPUs share)
    before = set(cache.iterdir())
    lib("g", "#define K 3 /* library g */\n", ("-O1", "-march=native"))
    (entry,) = set(cache.iterdir()) - before
    entry.write_bytes(b"stand-in object")
    again, _ = lib("h", "#define K 3 /* library h */\n", ("-O1", "-march=native"))
    assert again.read_bytes() == b"stand-in object"
    monkeypatch.setattr(compile_mod, "native_target", lambda tool: "another CPU")
    other, _ = lib("i", "#define K 3 /* library i */\n", ("-O1", "-march=native"))
    assert other.read_bytes().startswith(b"\x7fELF")


def test_generated_files_are_read_back_only_while_the_stamp_holds(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A build's stamp holds while the compiler's and ops' sources have its digest and every file
    it wrote is unchanged; tests then read generated/ back instead of generating it again, and
    generate when it does not hold."""
    import hashlib
    import json

    from opgen import build

    out = tmp_path / "gen"
    (out / "cpu").mkdir(parents=True)
    (out / "cpu" / "a.c").write_text("int a;\n")
    stamp = tmp_path / "generate.stamp"
    stamp.write_text(json.dumps({"digest": "d1", "out": str(out),
                                 "files": {"cpu/a.c": hashlib.sha256(b"int a;\n").hexdigest()}}))
    assert build._up_to_date(out, stamp, "d1") == {"cpu/a.c": b"int a;\n"}
    assert build._up_to_date(out, stamp, "d2") is None  # the compiler or an op changed
    assert build._up_to_date(tmp_path / "elsewhere", stamp, "d1") is None
    (out / "cpu" / "a.c").write_text("int b;\n")  # a generated file edited
    assert build._up_to_date(out, stamp, "d1") is None
    (out / "cpu" / "a.c").unlink()
    assert build._up_to_date(out, stamp, "d1") is None
    stamp.write_text("{not json")
    assert build._up_to_date(out, stamp, "d1") is None
    monkeypatch.setattr(build, "_up_to_date", lambda *a: None)
    monkeypatch.setattr(build, "generate_all", lambda verbose=True: {"cpu/x.c": "fresh"})
    assert build.generated_files() == {"cpu/x.c": "fresh"}
