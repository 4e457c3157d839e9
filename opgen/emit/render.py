"""Jinja2 rendering of the files under templates/ (C ABI headers, runtime, vendor facades)."""

from __future__ import annotations

from functools import cache
from typing import Any

import jinja2

from opgen import dtypes, registry

#: The plain ABI's status codes (value, C name, meaning) and the abstract statuses they carry.
STATUSES = [
    {"c": "OPGEN_SUCCESS", "value": 0, "doc": "success"},
    {"c": "OPGEN_ERR_NULL", "value": 1, "doc": "a required pointer is NULL", "abstract": "null"},
    {"c": "OPGEN_ERR_PARAM", "value": 2, "doc": "a scalar parameter is invalid", "abstract": "param"},
    {"c": "OPGEN_ERR_SHAPE", "value": 3, "doc": "tensor shapes disagree", "abstract": "shape"},
    {"c": "OPGEN_ERR_DTYPE", "value": 4, "doc": "unsupported dtype", "abstract": "dtype"},
    {"c": "OPGEN_ERR_STRIDES", "value": 5, "doc": "unsupported strides", "abstract": "strides"},
    {"c": "OPGEN_ERR_INDEX", "value": 6, "doc": "an index is out of range", "abstract": "index"},
    {"c": "OPGEN_ERR_WORKSPACE", "value": 7, "doc": "workspace too small"},
    {"c": "OPGEN_ERR_ALLOC", "value": 8, "doc": "out of memory"},
    {"c": "OPGEN_ERR_INTERNAL", "value": 9, "doc": "internal error"},
]
#: an abstract status (``opgen.check``, a rejected variant) -> its C name
STATUS_C = {s["abstract"]: s["c"] for s in STATUSES if "abstract" in s}


@cache
def env() -> jinja2.Environment:
    from opgen import vmath

    e = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(registry.REPO_ROOT / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=False,
        lstrip_blocks=False)
    e.globals["vm"] = vmath  # (a global: templates that import macros from another see it too)
    return e


def render(name: str, **ctx: Any) -> str:
    """Render ``templates/<name>`` with the common context (statuses, dtypes, the GEMM's k block;
    the global ``vm``: the shared vector-math coefficients, opgen/vmath.py) added."""
    from opgen.lower.sched import GEMM_KC

    return env().get_template(name).render(statuses=STATUSES, dtypes=dtypes.ALL, gemm_kc=GEMM_KC, **ctx)
