"""Discovery of the ops written in ``ops_dsl/`` (one op per file; ``_*.py`` files are helpers)."""

from __future__ import annotations

import importlib
import os
import re
import sys
from functools import cache
from pathlib import Path

from opgen.dsl.opdef import OpDef
from opgen.dsl.spec import DSLError

REPO_ROOT = Path(__file__).resolve().parent.parent


def ops_dir() -> Path:
    """The ops_dsl directory: ``$OPGEN_OPS_DIR`` or the one beside the opgen package."""
    return Path(os.environ.get("OPGEN_OPS_DIR", REPO_ROOT / "ops_dsl")).resolve()


#: the prefixes of an op's public C symbols per target (``opgen_<op>``, ``opgen_cuda_<op>``, ...),
#: each also with ``_workspace_size``
SYMBOL_PREFIXES = ("", "cuda_", "ascendc_", "tt_")


@cache
def runtime_symbols() -> frozenset[str]:
    """The ``opgen_*`` identifiers the generated runtimes and headers define or use (scanned
    from templates/): an op whose public symbols are among them would not compile or link."""
    words: set[str] = set()
    for f in (REPO_ROOT / "templates").rglob("*.j2"):
        words.update(re.findall(r"\bopgen_\w+", f.read_text()))
    return frozenset(words)


def public_symbols(name: str) -> set[str]:
    """The C symbols op ``name`` gets (conservatively, on every target)."""
    return {f"opgen_{p}{name}{s}" for p in SYMBOL_PREFIXES for s in ("", "_workspace_size")}


def _import(path: Path) -> object:
    pkg_dir = path.parent
    if str(pkg_dir.parent) not in sys.path:
        sys.path.insert(0, str(pkg_dir.parent))
    return importlib.import_module(f"{pkg_dir.name}.{path.stem}")


@cache
def load_all(directory: str | None = None) -> dict[str, OpDef]:
    """Import every op file and return its ops by name, sorted (the first bad file raises)."""
    ops, errors = load_each(directory)
    if errors:
        raise errors[0][1]
    return ops


def load_each(directory: str | None = None) -> tuple[dict[str, OpDef], list[tuple[Path, BaseException]]]:
    """Like :func:`load_all`, but a file that fails to import (or defines no op, or redefines
    one) is reported in the second result instead of stopping the others from loading."""
    d = Path(directory) if directory else ops_dir()
    if not d.is_dir():
        raise DSLError(f"ops directory {d} does not exist")
    found: dict[str, OpDef] = {}
    errors: list[tuple[Path, BaseException]] = []
    for f in sorted(d.glob("*.py")):
        if f.name.startswith("_"):
            continue
        try:
            mod = _import(f)
            ops = [v for v in vars(mod).values() if isinstance(v, OpDef)]
            if not ops:
                raise DSLError(f"{f}: defines no @op")
            for o in ops:
                if o.name in found:
                    raise DSLError(f"{f}: op '{o.name}' is already defined in {found[o.name].where}")
                taken = public_symbols(o.name) & runtime_symbols()
                for other in [*found.values(), *ops[:ops.index(o)]]:
                    taken |= public_symbols(o.name) & public_symbols(other.name)
                if taken:
                    raise DSLError(f"{f}: op '{o.name}' would define the C symbol(s) {', '.join(sorted(taken))}, "
                                   f"which opgen's runtime or another op already uses; rename the op")
        except Exception as e:
            errors.append((f, e))
            continue
        for o in ops:
            found[o.name] = o
    return dict(sorted(found.items())), errors


def get(name: str) -> OpDef:
    """One op by name (a clear error listing the known ops otherwise). A broken op file does not
    hide the ops of the other files; it is named when the op asked for is not found."""
    try:
        ops = load_all()
    except Exception:
        ops, errors = load_each()
        if name in ops:
            return ops[name]
        broken = "; ".join(f"{f.name}: {e}" for f, e in errors)
        raise KeyError(f"unknown op {name!r}; known: {', '.join(ops)} (files that failed to load: {broken})") \
            from None
    if name not in ops:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(ops)}")
    return ops[name]
