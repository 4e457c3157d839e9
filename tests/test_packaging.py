"""The CPU library from a C project's build: its CMake package and pkg-config file.

``opgen build`` writes ``opgenConfig.cmake``, ``opgenConfigVersion.cmake`` and ``opgen.pc`` beside
``build/cpu/libopgen.so``. A plain C program (tests/c/rms_user.c, which only includes opgen.h) is
built with CMake (``find_package(opgen)``, target ``opgen::opgen``) and with pkg-config, then
run; its results are checked against the oracle.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from opgen import build, oracle, registry

C_DIR = Path(__file__).parent / "c"
LIB_DIR = registry.REPO_ROOT / "build" / "cpu"


@pytest.fixture(scope="module")
def package() -> Path:
    """build/cpu with the library and its package files (``opgen build`` makes them; the
    incremental build here only recompiles what changed)."""
    build.compile_cpu(registry.REPO_ROOT / "generated", registry.REPO_ROOT / "build", verbose=False)
    return LIB_DIR


def _run_and_check(exe: Path, tmp_path: Path, rng: np.random.Generator) -> None:
    n, d, eps = 5, 37, 1e-5
    gy, x = (rng.standard_normal((n, d)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(d).astype(np.float32)
    inp, out = tmp_path / "in.bin", tmp_path / "out.bin"
    inp.write_bytes(np.array([n, d], np.int64).tobytes() + np.float32(eps).tobytes()
                    + gy.tobytes() + x.tobytes() + w.tobytes())
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # (found through its rpath)
    r = subprocess.run([str(exe), str(inp), str(out)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    got = np.frombuffer(out.read_bytes(), np.float32)
    ref = oracle.run(registry.get("rms_norm_backward"), grad_y=gy, x=x, w=w, eps=eps)
    np.testing.assert_allclose(got[:n * d].reshape(n, d), ref["grad_x"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[n * d:], ref["grad_w"], rtol=1e-5, atol=1e-5)


def test_package_files_point_at_this_build(package: Path) -> None:
    config = (package / "opgenConfig.cmake").read_text()
    assert f'IMPORTED_LOCATION "{package / "libopgen.so"}"' in config
    assert f'INTERFACE_INCLUDE_DIRECTORIES "{registry.REPO_ROOT / "generated" / "include"}"' in config
    pc = (package / "opgen.pc").read_text()
    assert f"libdir={package}" in pc and "-lopgen" in pc
    assert 'set(PACKAGE_VERSION "' in (package / "opgenConfigVersion.cmake").read_text()


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_a_cmake_project_finds_and_links_the_library(package: Path, tmp_path: Path, rng: np.random.Generator) -> None:
    bdir = tmp_path / "cmake-build"
    for cmd in (["cmake", "-S", str(C_DIR / "cmake_user"), "-B", str(bdir), f"-Dopgen_DIR={package}",
                 "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror"],
                ["cmake", "--build", str(bdir)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    _run_and_check(bdir / "rms_user", tmp_path, rng)


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_refuses_a_newer_major_version(package: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.16)\nproject(p C)\n"
                                        "find_package(opgen 99 REQUIRED)\n")
    r = subprocess.run(["cmake", "-S", str(src), "-B", str(tmp_path / "b"), f"-Dopgen_DIR={package}"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "opgen" in r.stderr


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="pkg-config is not installed")
def test_pkg_config_builds_and_links_a_c_program(package: Path, tmp_path: Path, rng: np.random.Generator) -> None:
    env = {**os.environ, "PKG_CONFIG_PATH": str(package)}
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "opgen"], capture_output=True, text=True, env=env)
    assert flags.returncode == 0, flags.stderr
    exe = tmp_path / "rms_user"
    r = subprocess.run([os.environ.get("CC", "cc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                        str(C_DIR / "rms_user.c"), "-o", str(exe), *flags.stdout.split()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    _run_and_check(exe, tmp_path, rng)
