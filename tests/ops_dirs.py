"""Ops written in their own ops directory, built the way a user builds them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from opgen import build, registry, runtime
from opgen.lower import to_loops

#: lower-to-loops' entry point, unpatched
LOWER_FUNC = to_loops.lower_func


@contextmanager
def built_ops(root: Path, package: str, sources: dict[str, str]) -> Iterator[dict[str, object]]:
    """``sources`` (file name -> DSL text) written into ``root/package``, built by ``opgen build
    --out root/generated`` with ``$OPGEN_OPS_DIR`` pointing there; yields the CPU library
    (``lib``), the generated tree (``out``), the ops (``ops``) and ``root``. The environment and
    the registry's cache are restored afterwards."""
    ops = root / package
    ops.mkdir()
    for name, text in sources.items():
        (ops / name).write_text(text)
    saved = os.environ.get("OPGEN_OPS_DIR")
    os.environ["OPGEN_OPS_DIR"] = str(ops)
    registry.load_all.cache_clear()
    try:
        out = root / "generated"
        assert build.main(out=str(out), verbose=False) == 0
        lib = runtime.load(str(root / "generated.build" / "cpu" / "libopgen.so"))
        yield {"lib": lib, "out": out, "ops": registry.load_all(), "root": root}
    finally:
        if saved is None:
            os.environ.pop("OPGEN_OPS_DIR", None)
        else:
            os.environ["OPGEN_OPS_DIR"] = saved
        registry.load_all.cache_clear()


@contextmanager
def built_ops_patched(root: Path, package: str, sources: dict[str, str], module: object, attr: str,
                      value: object) -> Iterator[dict[str, object]]:
    """:func:`built_ops` with ``module.attr`` set to ``value`` while it builds and runs (a pass
    turned off, to compare the library without it), restored afterwards."""
    import pytest

    mp = pytest.MonkeyPatch()
    mp.setattr(module, attr, value)
    try:
        with built_ops(root, package, sources) as b:
            yield b
    finally:
        mp.undo()


def no_fusion(func: object, aliases: object = frozenset(), fuse: bool = True, *args: object, **kw: object) -> object:
    """lower-to-loops' ``lower_func`` with ``fuse`` off (no matmul chains, no row groups: each
    materialised value its own loop nest), its other arguments as given."""
    return LOWER_FUNC(func, aliases, False, *args, **kw)


@contextmanager
def built_unfused(root: Path, package: str, sources: dict[str, str]) -> Iterator[dict[str, object]]:
    """:func:`built_ops` lowered by :func:`no_fusion` (the patch stays while the build lives)."""
    with built_ops_patched(root, package, sources, to_loops, "lower_func", no_fusion) as b:
        yield b


def top_loops(built: dict[str, object], name: str) -> list[object]:
    """The outermost ``sched.for`` loops of op ``name``'s kernel (its first variant) after the CPU
    pipeline (``built``: :func:`built_ops`'s)."""
    from opgen.lower import sched as s
    from opgen.passes import pipeline

    m = built["ops"][name].module()  # type: ignore[index]
    pipeline.run(m, "cpu")
    k = next(x for x in m.walk() if isinstance(x, s.KernelOp))
    return [o for o in k.body.block.ops if isinstance(o, s.ForOp)]
