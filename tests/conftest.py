"""Shared fixtures: the registered ops, a seeded RNG, and loading op files from a scratch dir."""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from opgen import registry
from opgen.dsl.opdef import OpDef

#: the libraries the tests build (dozens, of different ops) share one object cache
#: (opgen.compile.object_cache): their runtime and facade files compile once, not once a library
os.environ.setdefault("OPGEN_OBJECT_CACHE", str(registry.REPO_ROOT / "build" / "object-cache"))

SEED_OPS = (
    "embedding_backward",
    "embedding_bw",
    "embedding_dense_backward",
    "fused_linear_cross_entropy_loss_grad",
    "rms_norm_backward",
)


#: The test files that take longest (each one to several minutes on CI's 2-core machine, most of it
#: compiling), longest first: they run before the others. pytest-xdist (``--dist loadfile
#: --no-loadscope-reorder``, pyproject.toml) hands each worker one file at a time in this order, so
#: the workers finish together instead of one running a long file alone at the end (its default
#: order, by number of tests, left these few-test files last). Cold (an empty build/), CI's
#: 2-core machine: test_ttmetal.py 8.3 minutes of one worker, test_cuda_emulated.py 4.4,
#: test_new_op_backends.py 4, test_dim_names.py 1.9, the others at most about 1.5 each.
LONGEST_FIRST = ("test_ttmetal.py", "test_new_op_backends.py", "test_cuda_emulated.py", "test_cli.py",
                 "test_mlir.py", "test_ascendc.py", "test_dim_names.py", "test_interleave.py", "test_ir.py",
                 "test_fuzz_abi.py", "test_gemm.py", "test_jam_rows.py", "test_shapes_dsl.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of :data:`LONGEST_FIRST` first, in its order; the others after, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id, so each case is reproducible on its own
    (``OPGEN_TEST_SALT=...`` in the environment draws other inputs, for stress runs)."""
    key = request.node.nodeid + os.environ.get("OPGEN_TEST_SALT", "")
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def ops() -> dict[str, OpDef]:
    return registry.load_all()


@pytest.fixture
def op_files(tmp_path: Path) -> Iterator[Callable[..., dict[str, OpDef]]]:
    """``op_files({"name.py": source, ...})`` writes op files into a fresh, uniquely named ops
    directory and loads it with ``registry.load_all`` (errors propagate). The directory is
    imported as a package of that name; ``package_placeholder`` in a source is replaced by it.
    ``sys.path`` and the imported modules are restored afterwards."""
    saved_path = list(sys.path)
    saved_modules = set(sys.modules)

    def load(files: dict[str, str], package_placeholder: str | None = None) -> dict[str, OpDef]:
        d = tmp_path / f"opgen_test_ops_{uuid.uuid4().hex[:10]}"
        d.mkdir()
        for name, text in files.items():
            if package_placeholder:
                text = text.replace(package_placeholder, d.name)
            (d / name).write_text(text)
        return registry.load_all(str(d))

    yield load
    sys.path[:] = saved_path
    for m in set(sys.modules) - saved_modules:
        if m.startswith("opgen_test_ops_"):
            del sys.modules[m]


@pytest.fixture(scope="session")
def seed_lib() -> Path:
    """The Ascend library of the seed ops (what ``opgen build`` generates now), built against the
    CPU model of Ascend C under build/ascendc-model/ (needs g++; incremental between runs)."""
    from opgen import build
    from opgen.compile import dir_lock
    from tests.ascendc_model import build as model

    out = registry.REPO_ROOT / "build" / "ascendc-model"
    gen = out / "generated"
    with dir_lock(out):  # (parallel test workers share build/)
        for p, text in build.generated_files().items():
            if p.startswith(("ascendc/", "include/")):
                dst = gen / p
                if not dst.is_file() or dst.read_text() != text:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    dst.write_text(text)
        sources = {p.name: p.read_text() for p in (gen / "ascendc").iterdir() if p.is_file()}
        return model.build(sources, out / "seeds", include_dirs=[gen / "include"])
