"""Worker of tests/test_fuzz_abi.py: hypothesis fuzzing of one C ABI of one op against the oracle,
in a process that has the sanitized library loaded (``$OPGEN_LIB``, libasan + libubsan preloaded).

``python -m tests.fuzz_worker list``                      the targets, one per line
``python -m tests.fuzz_worker TARGET [LAST_CASE_FILE]``   fuzz TARGET (``plain:<op>``, ``infiniop:<Name>``,
                                                          ``aclnn:<Name>``); prints ``... examples OK``
``python -m tests.fuzz_worker replay TARGET 'SPEC'``      run one drawn case again (SPEC: the dict printed
                                                          for a falsifying example)

Before every call the drawn case is written to LAST_CASE_FILE, so a crash (which ends the process
before hypothesis can report) still names its input. Environment: ``OPGEN_FUZZ_EXAMPLES`` (examples per
target), ``OPGEN_FUZZ_RANDOM=1`` (random exploration instead of the derandomized CI sequence),
``OPGEN_FUZZ_SEED`` (with RANDOM: a fixed seed), ``OPGEN_FUZZ_FAULTS`` (comma list: draw only these
fault kinds; default all, see :data:`FAULTS`). See tests/test_fuzz_abi.py for what is drawn.

No torch is imported for the plain ABI; the facade targets import tests/test_facades_c.py for its
ctypes wrappers (``Infini``, ``Acl``), which brings torch in (a few seconds, harmless under ASan).
"""

from __future__ import annotations

import ast
import os
import sys
import traceback
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from opgen import binding, dtypes, registry, runtime
from opgen.abi import Aclnn, Infiniop
from opgen.binding import OpError
from opgen.dsl.spec import TensorSpec
from opgen.emit import facades, render
from tests.cpu_cases import (
    FLCE,
    NP,
    assert_c_close,
    bf16_products,
    c_call,
    eb_args,
    ebw_args,
    edb_args,
    flce_args,
    oracle_outputs,
    rms_args,
    set_shape,
    softmax_inputs,
)

EB, EDB, EBW, RMS = "embedding_backward", "embedding_dense_backward", "embedding_bw", "rms_norm_backward"

#: every fault kind a case may carry (at most one per case; ``None``: a valid call)
FAULTS = ("index", "dtype", "dtype_code", "shape", "missing", "data_null", "misalign", "last_stride",
          "out_layout", "alias", "scalar", "py_int", "huge_rows", "acl_offset", "workspace")

#: index tensors of each op and the tensor whose first dim is their range
INDEX_RANGE = {EB: {"i1": "dtable1", "i2": "dtable2"}, EDB: {"indices": "out"}, EBW: {"indices": "out"},
               FLCE: {"masked_target": "weight"}, RMS: {}}

GAP = 0xA5  # byte pattern of every buffer around (and between) a tensor's elements


def fval(x: Any) -> Any:
    """A spec scalar: floats that repr cannot round-trip through literal_eval are strings."""
    return float(x) if isinstance(x, str) else x


# =============================================================================== targets and statuses


@dataclass(frozen=True)
class Target:
    kind: str  # "plain", "infiniop", "aclnn"
    op: str
    facade: str | None = None  # the vendor name

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.facade or self.op}"


def targets() -> list[Target]:
    """The plain ABI of every seed op, then every infiniop / aclnn facade it declares. (The case
    builders below know each seed op's math; other ops share the same generated entry points,
    argument checks and facades, so fuzzing the seeds covers that code.)"""
    out = []
    for name, o in sorted(registry.load_all().items()):
        if name not in (EB, EDB, EBW, FLCE, RMS):
            continue
        out.append(Target("plain", name))
        out += [Target(f.kind, name, f.name) for f in o.abis if isinstance(f, (Infiniop, Aclnn))]
    return out


def target(name: str) -> Target:
    for t in targets():
        if t.name == name:
            return t
    raise KeyError(f"unknown target {name!r}; known: {[t.name for t in targets()]}")


def facade_decl(t: Target) -> Any:
    return next(f for f in registry.get(t.op).abis if getattr(f, "name", None) == t.facade)


def status_codes(t: Target) -> dict[str, int]:
    """Abstract status (``ok`` for success) -> this ABI's code: the plain codes from
    ``runtime.STATUS``, the facades' from the generated status mapping (``status_cases``) and the
    vendor enums of opgen.emit.facades."""
    if t.kind == "plain":
        return {"ok": 0, **{v: k for k, v in runtime.STATUS.items()}}
    o = registry.get(t.op)
    f = facade_decl(t)
    model = facades.infiniop_model(o, f) if t.kind == "infiniop" else facades.aclnn_model(o, f)
    vendor = facades.INFINI_STATUS if t.kind == "infiniop" else facades.ACLNN_STATUS
    abstract = {s["c"]: s.get("abstract") or s["c"].removeprefix("OPGEN_ERR_").lower() for s in render.STATUSES}
    abstract["OPGEN_SUCCESS"] = "ok"
    return {abstract[c]: vendor[v] for c, v in model.status_cases}


# =============================================================================== drawing a case

def dim(hi: int) -> st.SearchStrategy[int]:
    """0, 1 and small odd sizes first; anything up to ``hi`` now and then."""
    return st.one_of(st.sampled_from([0, 1, 2, 3, 5, 7]), st.integers(0, hi))


SPECIAL_F = ["nan", "inf", "-inf", 0.0, -0.0, 3e38, -3e38, 1e-45, 1e30]
FLOAT_S = st.one_of(st.floats(-4, 4, width=32), st.sampled_from(SPECIAL_F))


def members(op: str, var: str) -> list[str]:
    return [str(m) for m in registry.get(op).signature.dtype_vars()[var].members]


def draw_build(draw: Any, t: Target, fault: str | None) -> dict[str, Any]:
    """The builder parameters (tests/cpu_cases.py builders) and the scalars of one case."""
    op = t.op
    b: dict[str, Any] = {"seed": draw(st.integers(0, 2**16))}
    if op == EB:
        b.update(T=draw(st.sampled_from(members(op, "T"))), IT=draw(st.sampled_from(members(op, "I"))),
                 N=draw(dim(300)), D=draw(dim(16)), N1=draw(st.integers(1, 9)), N2=draw(st.integers(1, 9)))
        b["variant"] = draw(st.sampled_from(["one", "dtable2_only"] if fault == "scalar"
                                            else ["both", "one", "i2_only", "dtable2_only"]))
        acc = st.sampled_from([0, 1, 2, -1, 127, -128]) if t.kind == "infiniop" else st.booleans()
        b["dtable1_acc"], b["dtable2_acc"] = draw(acc), draw(acc)
        b["alpha1"] = draw(FLOAT_S)
        if b["variant"] in ("both", "i2_only"):
            b["alpha2"] = draw(FLOAT_S)
        elif fault == "scalar":
            b["alpha2"] = draw(st.sampled_from(["nan", "inf", -1.0, 1e-30, 2.5]))
    elif op == EDB:
        b.update(T=draw(st.sampled_from(members(op, "T"))), IDX=draw(st.sampled_from(members(op, "IDX"))),
                 D=draw(dim(12)), V=draw(st.integers(1, 9)), scale_grad_by_freq=draw(st.booleans()))
        if fault == "huge_rows":
            b.update(lead=(draw(st.integers(0, 1)),), D=draw(st.integers(0, 1)),
                     huge=draw(st.sampled_from([2**62, 2**63 - 1])))
        else:
            b["lead"] = tuple(draw(st.lists(dim(6), min_size=1, max_size=3)))
        V = 2 if b["IDX"] == "bool" else b["V"]
        b["padding_idx"] = draw(st.one_of(st.integers(-3, V + 2),
                                          st.sampled_from([2**63 - 1, -(2**63), 2**63, 2**64 - 1])))
        if fault == "scalar":
            b["num_weights"] = draw(st.sampled_from([-1, -(2**63), V + 1, V - 1, 2**63 - 1]))
        elif fault == "py_int":
            which = draw(st.sampled_from(["padding_idx", "num_weights"]))
            b[which] = draw(st.sampled_from([2**64 + 2, -(2**63) - 1, 2**70, -(2**64)]))
    elif op == EBW:
        b.update(IT=draw(st.sampled_from(members(op, "I"))), W=draw(st.sampled_from(members(op, "W"))),
                 T=draw(st.sampled_from(members(op, "T"))), N=draw(dim(300)), D=draw(dim(16)),
                 V=draw(st.integers(1, 9)))
    elif op == RMS:
        b.update(T=draw(st.sampled_from(members(op, "T"))), lead=tuple(draw(st.lists(dim(9), min_size=1, max_size=2))),
                 D=draw(dim(40)))
        # D = 1 cancels exactly (grad_x = w*gy*eps/r^3 from two O(1) terms): only eps large enough
        # for the result to stand above the f32 noise of its terms is meaningful to compare there
        eps = (st.sampled_from([0.5, 1.0, 4.0, "inf", "nan"]) if b["D"] == 1 else
               st.sampled_from([0.0, 1e-6, 1e-3, 1.0, -1e-3, -1e30, 1e30, "inf", "nan", 1e-45]))
        b["eps"] = draw(eps)
        if t.kind == "infiniop":
            b["ext"] = "WithEpsilon" if b["D"] == 1 else draw(st.sampled_from(["", "WithEpsilon"]))
            if not b["ext"]:
                b["eps"] = 0.0
    elif op == FLCE:
        b.update(T=draw(st.sampled_from(members(op, "T"))), M=draw(st.sampled_from(members(op, "M"))),
                 TI=draw(st.sampled_from(members(op, "TI"))),
                 mode=draw(st.sampled_from(["softmax", "memory_saving", "both"])),
                 BT=draw(st.one_of(dim(20), st.sampled_from([64, 65, 70]))), H=draw(dim(12)),
                 V=draw(st.sampled_from([128, 129, 131, 200, 257])), mask_p=draw(st.sampled_from([0.0, 0.4, 1.0])),
                 mask_extra=draw(st.integers(0, 2)))
        if fault == "scalar":
            if draw(st.booleans()):
                b["V"] = draw(st.sampled_from([127, 1]))
            else:
                b["label_smoothing"] = draw(st.sampled_from([0.1, -1e-3, "nan", "inf", 1e-45]))
    return b


def build(op: str, b: dict[str, Any]) -> dict[str, Any]:
    """The logical arguments of a case (contiguous arrays and scalars) from its builder parameters."""
    rng = np.random.default_rng(b["seed"])
    if op == EB:
        v = b["variant"]
        a = eb_args(rng, b["T"], b["IT"], N=b["N"], D=b["D"], N1=b["N1"], N2=b["N2"],
                    i2=v in ("both", "i2_only"), dtable2=v in ("both", "dtable2_only"),
                    acc=(bool(b["dtable1_acc"]), bool(b["dtable2_acc"])))
        a["alpha1"] = fval(b["alpha1"])
        a.pop("alpha2", None)
        if "alpha2" in b:
            a["alpha2"] = fval(b["alpha2"])
        a["dtable1_acc"], a["dtable2_acc"] = b["dtable1_acc"], b["dtable2_acc"]
        return a
    if op == EDB:
        a = edb_args(rng, b["T"], b["IDX"], lead=b["lead"], D=b["D"], V=b["V"], scale=b["scale_grad_by_freq"])
        a["padding_idx"] = b["padding_idx"]
        if "num_weights" in b:
            a["num_weights"] = b["num_weights"]
        return a
    if op == EBW:
        return ebw_args(rng, b["IT"], b["W"], b["T"], N=b["N"], D=b["D"], V=b["V"])
    if op == RMS:
        return rms_args(rng, b["T"], (*b["lead"], b["D"]), fval(b["eps"]))
    mode = "memory_saving" if b["mode"] == "both" else b["mode"]
    a = flce_args(rng, b["T"], b["M"], b["TI"], mode, BT=b["BT"], H=b["H"], V=b["V"], mask_p=b["mask_p"],
                  mask_extra=b["mask_extra"])
    if b["mode"] == "both":  # softmax given: the stats are ignored
        a["softmax"] = softmax_inputs(a["input"], a["weight"])[0]
    if "label_smoothing" in b:
        a["label_smoothing"] = fval(b["label_smoothing"])
    return a


def tensor_params(op: str) -> dict[str, Any]:
    return {p.name: p for p in registry.get(op).signature.params if isinstance(p.spec, TensorSpec)}


def draw_layout(draw: Any, shape: tuple[int, ...], last_contig: bool, output: bool, itemsize: int,
                fault: str | None = None) -> dict[str, Any]:
    """A memory layout for a tensor of ``shape``: axis order (outermost first), per-axis stride
    multiplier and additive gap, reversed axes; inputs may also get a broadcast (0) axis or an
    axis whose stride makes elements overlap. ``fault`` ("last_stride", "out_layout", "misalign")
    forces a layout the ABI must refuse (or, for an overlap that does not collide, may accept)."""
    nd = len(shape)
    lay: dict[str, Any] = {"perm": list(range(nd)), "mul": [1] * nd, "add": [0] * nd, "neg": [False] * nd}
    if nd == 0:
        return lay
    kind = draw(st.sampled_from(["contig", "reversed", "gapped", "permuted", "mixed", "bcast", "overlap"]
                                if not output else ["contig", "reversed", "gapped", "permuted", "mixed"]))
    if fault == "out_layout":
        kind = draw(st.sampled_from(["bcast", "overlap"]))
    keep_last = last_contig and fault != "last_stride"
    if kind in ("permuted", "mixed"):
        perm = draw(st.permutations(range(nd - 1) if keep_last else range(nd)))
        lay["perm"] = [*perm, nd - 1] if keep_last else list(perm)
    if kind in ("gapped", "mixed"):
        lay["mul"] = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(nd)]
        lay["add"] = [draw(st.sampled_from([0, 0, 1, 3])) for _ in range(nd)]
    if kind in ("reversed", "mixed"):
        lay["neg"] = [draw(st.booleans()) for _ in range(nd)]
    if keep_last:
        inner = lay["perm"][-1]
        lay["mul"][inner], lay["add"][inner] = 1, 0
        lay["neg"][nd - 1] = False if shape[-1] > 1 else lay["neg"][nd - 1]
    if fault == "last_stride":
        how = draw(st.sampled_from(["gap", "reverse", "transpose"]))
        if how == "gap" or nd == 1:
            lay["mul"][nd - 1] = 2
            lay["neg"][nd - 1] = how == "reverse"
        elif how == "reverse":
            lay["neg"][nd - 1] = True
        else:
            lay["perm"] = [nd - 1, *range(nd - 1)]
    big = [ax for ax in range(nd) if shape[ax] > 1]
    if kind == "bcast" and big:
        choices = [ax for ax in big if not (keep_last and ax == nd - 1)] if not output else big
        if choices:
            lay["bcast"] = draw(st.sampled_from(choices))
    if kind == "overlap" and big:
        choices = [ax for ax in big if ax != nd - 1 or not keep_last]
        if choices:
            lay["ovl"] = [draw(st.sampled_from(choices)), draw(st.sampled_from([1, 2, 3]))]
    if fault == "misalign":
        lay["mis"] = draw(st.integers(1, itemsize - 1))
    return lay


@st.composite
def cases(draw: Any, t: Target) -> dict[str, Any]:
    """One fuzz case of target ``t`` as a plain dict (repr-able: ``replay`` takes it back)."""
    allowed = FAULTS
    if os.environ.get("OPGEN_FUZZ_FAULTS"):
        allowed = tuple(f for f in os.environ["OPGEN_FUZZ_FAULTS"].split(",") if f)
    applicable = [f for f in allowed if fault_applies(t, f)]
    fault = draw(st.one_of(st.none(), st.sampled_from(applicable))) if applicable else None
    b = draw_build(draw, t, fault)
    args = build(t.op, b)
    tp = tensor_params(t.op)
    present = [n for n in tp if isinstance(args.get(n), np.ndarray)]
    spec: dict[str, Any] = {"b": b, "fault": None, "layouts": {}, "inject": [], "ws": ["none", 0, 0]}
    nonempty = [n for n in present if args[n].size]
    # fault details (a fault that finds nothing to act on leaves a valid call)
    fd: list[Any] | None = None
    if fault == "index":
        cands = [n for n in INDEX_RANGE[t.op] if n in present and args[n].size]
        if cands:
            n = draw(st.sampled_from(cands))
            fd = [n, draw(st.integers(0, args[n].size - 1)),
                  draw(st.sampled_from(["-1", "R", "R+1", "max", "min", "R+0.5", "-1.5", "nan", "inf", "1e30"]))]
    elif fault == "dtype":
        n = draw(st.sampled_from(present))
        fd = [n, draw(st.sampled_from([d.name for d in dtypes.ALL if d.np_dtype != args[n].dtype]))]
    elif fault == "dtype_code":
        fd = [draw(st.sampled_from(present)), draw(st.sampled_from(bad_dtype_codes(t.kind)))]
    elif fault == "shape":
        n = draw(st.sampled_from(present))
        fd = [n, draw(st.sampled_from(["grow", "lead1", "drop"])), draw(st.integers(0, max(args[n].ndim - 1, 0)))]
    elif fault == "missing":
        fd = [draw(st.sampled_from([n for n in present if not tp[n].optional]))]
    elif fault == "data_null" and nonempty:
        fd = [draw(st.sampled_from(nonempty))]
    elif fault == "misalign":
        cands = [n for n in nonempty if args[n].itemsize > 1]
        if cands:
            fd = [draw(st.sampled_from(cands))]
    elif fault == "last_stride":
        cands = [n for n in nonempty if tp[n].spec.last_contiguous and args[n].shape[-1] > 1]
        if cands:
            fd = [draw(st.sampled_from(cands))]
    elif fault == "out_layout":
        cands = [n for n in nonempty if tp[n].is_output and max(args[n].shape) > 1]
        if cands:
            fd = [draw(st.sampled_from(cands))]
    elif fault == "alias":
        outs = [n for n in nonempty if tp[n].is_output]
        if outs:
            o = draw(st.sampled_from(outs))
            others = [n for n in nonempty if n != o and (o, n) not in registry.get(t.op).may_alias]
            if others:
                fd = [o, draw(st.sampled_from(others))]
    elif fault == "acl_offset":
        fd = [draw(st.sampled_from(present)), draw(st.sampled_from([-1, 2**62, -(2**62), -(2**31)]))]
    elif fault == "workspace":
        fd = [draw(st.sampled_from(["small", "null_nonzero", "zero_nonnull"] if t.kind != "infiniop"
                                   else ["small", "null_nonzero"]))]
    elif fault in ("scalar", "py_int", "huge_rows"):
        fd = []
    if fd is not None:
        spec["fault"] = [fault, *fd]
    # layouts: every present tensor; the faulted one gets the layout its fault needs
    lay_fault = {n: None for n in present}
    if spec["fault"] and spec["fault"][0] in ("last_stride", "out_layout", "misalign"):
        lay_fault[spec["fault"][1]] = spec["fault"][0]
    for n in present:
        p = tp[n]
        out_like = p.is_output or (t.op == RMS and n == "grad_y")  # grad_y may become grad_x's buffer
        lay = draw_layout(draw, args[n].shape, p.spec.last_contiguous, out_like, args[n].itemsize, lay_fault[n])
        if t.op == FLCE and n == "weight" and lay.get("bcast") == 0:
            del lay["bcast"]  # identical rows: dX = grad*w*(sum softmax - 1) cancels to f32 noise
        if t.kind == "infiniop":  # NULL strides for a C-contiguous tensor (decided at the call)
            lay["null_strides"] = draw(st.booleans())
        spec["layouts"][n] = lay
    # one tensor may share another's memory where that is allowed: a declared (output, input)
    # pair (RMSNorm's in-place grad_x over grad_y), or two inputs of one dtype and shape (not
    # RMSNorm's grad_y = x: with a constant w and eps = 0, grad_x = w*x*eps/r^3 cancels exactly)
    pairs = [list(pr) for pr in registry.get(t.op).may_alias if pr[0] in present and pr[1] in present]
    pairs += [[m, n] for n in present for m in present if n < m and not tp[n].is_output and t.op != RMS and
              not tp[m].is_output and args[n].dtype == args[m].dtype and args[n].shape == args[m].shape]
    if pairs and not spec["fault"] and draw(st.booleans()):
        m, n = draw(st.sampled_from(pairs))
        spec["layouts"][m] = {"alias_of": n}
    # NaN / Inf in float data (inputs, and outputs' prior contents)
    floats = [n for n in nonempty if args[n].dtype.kind == "f" or args[n].dtype == NP["bf16"]]
    floats = [n for n in floats if n not in INDEX_RANGE[t.op]]
    if floats:
        for _ in range(draw(st.integers(0, 3))):
            n = draw(st.sampled_from(floats))
            spec["inject"].append([n, draw(st.integers(0, args[n].size - 1)),
                                   draw(st.sampled_from(["nan", "inf", "-inf"]))])
    # workspace
    has_ws = t.kind != "infiniop" or facade_decl(t).workspace
    if spec["fault"] and spec["fault"][0] == "workspace":
        spec["ws"] = [spec["fault"][1], draw(st.integers(0, 63)), 0]
    elif has_ws:
        modes = ["none", "exact", "generous"] if t.kind == "plain" else ["exact", "generous"]
        spec["ws"] = [draw(st.sampled_from(modes)), draw(st.integers(0, 63)), draw(st.sampled_from([1, 7, 64, 4096]))]
    return spec


def fault_applies(t: Target, fault: str) -> bool:
    if fault == "py_int":
        return t.kind == "plain" and t.op == EDB
    if fault == "huge_rows":
        return t.op == EDB and t.kind in ("plain", "aclnn")
    if fault == "acl_offset":
        return t.kind == "aclnn"
    if fault == "scalar":
        return t.op in (EB, EDB, FLCE)
    if fault == "index":
        return bool(INDEX_RANGE[t.op])
    if fault == "workspace":
        return t.kind != "infiniop" or facade_decl(t).workspace
    return True


def bad_dtype_codes(kind: str) -> list[int]:
    """Dtype codes the ABI's tensor description can carry but opgen does not know."""
    if kind == "plain":
        return [len(dtypes.ALL), 99, -1]
    if kind == "infiniop":
        known = {d.infini for d in dtypes.ALL}
        return [i for i in range(len(facades.INFINI_DTYPES)) if i not in known]
    known = {d.acl for d in dtypes.ALL}
    return sorted({v for v in facades.ACL_DTYPES.values() if v not in known} | {42, 1000})


# =============================================================================== materializing a case


def element_strides(shape: tuple[int, ...], lay: dict[str, Any]) -> list[int]:
    nd = len(shape)
    stv = [0] * nd
    run = 1
    for ax in reversed(lay["perm"]):
        stv[ax] = run * lay["mul"][ax] + lay["add"][ax]
        run = abs(stv[ax]) * max(shape[ax], 1)
    if lay.get("ovl"):
        stv[lay["ovl"][0]] = lay["ovl"][1]
    if lay.get("bcast") is not None:
        stv[lay["bcast"]] = 0
    return [-s if lay["neg"][ax] else s for ax, s in enumerate(stv)]


def offsets(shape: tuple[int, ...], stv: list[int]) -> np.ndarray:
    """Element offsets (elements, relative to element [0, ...]) of every element."""
    off = np.zeros((), np.int64)
    for n, s in zip(shape, stv, strict=True):
        off = off[..., None] + np.arange(n, dtype=np.int64) * s
    return off.reshape(-1)


@dataclass
class Buf:
    """One allocation: bytes, the aligned start a typed base (aclnn storage) begins at."""

    root: np.ndarray
    start: int


@dataclass
class Case:
    t: Target
    spec: dict[str, Any]
    args: dict[str, Any]  # what the call gets: views (or None) and scalars
    bufs: dict[str, Buf] = field(default_factory=dict)  # tensor -> its allocation
    fault: list[Any] | None = None
    need: int | None = None  # the workspace size the ABI reported (set by the call)


def _new_buf(nbytes: int, mis: int = 0) -> Buf:
    root = np.full(nbytes + 32 + mis, GAP, np.uint8)
    return Buf(root, (-root.ctypes.data) % 16 + mis)


def extent_bytes(shape: tuple[int, ...], itemsize: int, lay: dict[str, Any]) -> int:
    """Bytes a tensor of ``shape`` stored with ``lay`` spans, padding included (see :func:`place`)."""
    stv = element_strides(shape, lay) if len(shape) == len(lay["perm"]) else [0] * len(shape)
    return (sum(abs(n - 1) * abs(s) for n, s in zip(shape, stv, strict=True)) + 1 + 4) * itemsize + \
        int(np.prod(shape)) * itemsize


def plain_layout(nd: int) -> dict[str, Any]:
    return {"perm": list(range(nd)), "mul": [1] * nd, "add": [0] * nd, "neg": [False] * nd}


def place(values: np.ndarray, lay: dict[str, Any], buf: Buf | None = None, pad: int = 2) -> tuple[np.ndarray, Buf]:
    """``values`` stored with layout ``lay`` in a fresh buffer (or from ``buf.start`` on), ``pad``
    elements of the gap pattern before and after its extent."""
    shape, isz = values.shape, values.itemsize
    stv = element_strides(shape, lay)
    if values.size:
        lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, stv, strict=True))
        hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, stv, strict=True))
    else:
        lo = hi = 0
    need = (hi - lo + 1 + 2 * pad) * isz
    if buf is None or buf.root.nbytes - buf.start < need + 16:
        buf = _new_buf(need, lay.get("mis", 0))
    view = np.ndarray(shape, values.dtype, buffer=buf.root, offset=buf.start + (pad - lo) * isz,
                      strides=tuple(s * isz for s in stv))
    if values.size:
        view[...] = values
    return view, buf


def materialize(t: Target, spec: dict[str, Any]) -> Case:
    args = build(t.op, spec["b"])
    tp = tensor_params(t.op)
    fault = spec["fault"]
    kind = fault[0] if fault else None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n, pos, what in spec["inject"]:
            args[n].reshape(-1)[pos] = float(what)
        if kind == "index":
            n, pos, what = fault[1:]
            table = args.get(INDEX_RANGE[t.op][n])  # (embedding_backward's i2 may come without dtable2)
            args[n].reshape(-1)[pos] = index_value(args[n].dtype, what, table.shape[0] if table is not None else 0)
        if kind == "dtype":
            n, to = fault[1:]
            args[n] = args[n].astype(NP[to])
        if kind == "shape":
            n, how, ax = fault[1:]
            a = args[n]
            if how == "lead1":
                args[n] = a[None]
            elif how == "drop" and a.ndim:
                args[n] = np.asarray(np.take(a, 0, axis=ax) if a.shape[ax] else a.sum(axis=ax), a.dtype)
            elif a.ndim:
                args[n] = np.concatenate([a, np.take(a, [0] * 1, axis=ax) if a.shape[ax] else
                                          np.zeros_like(a, shape=(*a.shape[:ax], 1, *a.shape[ax + 1:]))], axis=ax)
    case = Case(t, spec, dict(args), fault=fault)
    for n in tp:
        if not isinstance(args.get(n), np.ndarray):
            continue
        lay = spec["layouts"].get(n)
        if lay is None or "alias_of" in lay:
            continue
        if args[n].ndim != len(lay["perm"]):  # a shape fault changed the rank: plain layout
            lay = plain_layout(args[n].ndim)
        case.args[n], case.bufs[n] = place(args[n], lay)
    for n, lay in spec["layouts"].items():
        if "alias_of" in lay and n in case.args:
            case.args[n], case.bufs[n] = case.args[lay["alias_of"]], case.bufs[lay["alias_of"]]
    if kind == "alias":  # both in one buffer: the output's first element on the other tensor's first
        o, other = fault[1:]
        x = case.args[other]
        buf = _new_buf(extent_bytes(x.shape, x.itemsize, spec["layouts"][other]) +
                       extent_bytes(args[o].shape, args[o].itemsize, spec["layouts"][o]) + 64)
        vx, buf = place(np.array(x), spec["layouts"][other] if x.ndim == len(spec["layouts"][other]["perm"])
                        else plain_layout(x.ndim), buf)
        first = vx.ctypes.data - buf.root.ctypes.data
        first -= vx.ctypes.data % args[o].itemsize  # keep the output aligned (one fault at a time)
        lay = plain_layout(args[o].ndim) if args[o].ndim != len(spec["layouts"][o]["perm"]) else \
            {**spec["layouts"][o], "neg": [False] * args[o].ndim}
        vo, same = place(args[o], lay, Buf(buf.root, first), pad=0)
        assert same.root is buf.root and vo.ctypes.data <= vx.ctypes.data < vo.ctypes.data + vo.itemsize
        case.args[other], case.args[o] = vx, vo
        case.bufs[other] = case.bufs[o] = buf
    if kind == "missing":
        case.args[fault[1]] = None
    return case


def index_value(dt: np.dtype, what: str, rows: int) -> Any:
    """An index value of kind ``what`` for a tensor of dtype ``dt`` indexing ``rows`` rows (out of
    range, except where the dtype cannot express it: then whatever the dtype makes of it)."""
    if dt.kind == "f" or dt == NP["bf16"]:
        return {"-1": -1.0, "R": float(rows), "R+1": rows + 1.0, "max": 1e30, "min": -1e30, "R+0.5": rows + 0.5,
                "-1.5": -1.5, "nan": np.nan, "inf": np.inf, "1e30": 1e30}[what]
    if dt == np.bool_:
        return True
    info = np.iinfo(dt)
    v = {"-1": -1, "R": rows, "R+1": rows + 1, "max": info.max, "min": info.min, "R+0.5": rows,
         "-1.5": -2, "nan": info.max, "inf": info.max, "1e30": info.max}[what]
    return v if info.min <= v <= info.max else info.max


# =============================================================================== the expected outcome


def covered_bytes(view: np.ndarray, buf: Buf) -> np.ndarray:
    """Byte positions (in ``buf.root``) that ``view``'s elements occupy."""
    if not view.size:
        return np.zeros(0, np.int64)
    first = view.ctypes.data - buf.root.ctypes.data
    off = first + offsets(view.shape, [s // view.itemsize for s in view.strides]) * view.itemsize
    return (off[:, None] + np.arange(view.itemsize)).reshape(-1)


def layout_verdict(view: np.ndarray) -> str:
    """"ok": no two elements share memory and the axes nest; "clash": two elements share memory
    (or an axis of size > 1 has stride 0); "either": disjoint but interleaved axes (a checker may
    refuse it conservatively)."""
    if view.size <= 1:
        return "ok"
    stv = [s // view.itemsize for s, n in zip(view.strides, view.shape, strict=True)]
    if len(np.unique(offsets(view.shape, stv))) < view.size:
        return "clash"
    axes = sorted((abs(s), n) for s, n in zip(stv, view.shape, strict=True) if n > 1)
    extent = 1
    for s, n in axes:
        if s < extent:
            return "either"
        extent = s * (n - 1) + extent
    return "ok"


def flce_target_outside(a: dict[str, Any]) -> bool:
    """An unmasked row whose target is outside [0, V) (the index status, SPEC §4)."""
    tgt, mask, V = np.array(a["masked_target"]), np.array(a["target_mask"]), a["weight"].shape[0]
    BT = tgt.shape[0]
    outside = np.unpackbits(mask, bitorder="little")[:BT].astype(bool) if mask.dtype == np.uint8 else mask[:BT]
    if outside.shape[0] < BT:
        return False
    return bool(np.any(~outside & ((tgt < 0) | (tgt >= V))))


FIXED = {"missing": "null", "data_null": "null", "misalign": "param", "dtype_code": "dtype", "alias": "param",
         "py_int": "param"}


def oracle_args(case: Case) -> dict[str, Any]:
    """The call's arguments as the oracle takes them (facade scalars converted as the facade does)."""
    a = {k: v for k, v in case.args.items() if v is not None}
    if case.t.kind != "plain":
        o = registry.get(case.t.op)
        m = (facades.infiniop_model if case.t.kind == "infiniop" else facades.aclnn_model)(o, facade_decl(case.t))
        for s in m.scalars:
            if s.c_type in ("uint64_t", "size_t") and s.param in a:
                v = int(a[s.param]) % 2**64
                a[s.param] = v - 2**64 if v >= 2**63 else v
            elif s.c_type == "char" and s.param in a:
                a[s.param] = bool(a[s.param])
    return a


def expected(case: Case) -> tuple[set[str], dict[str, np.ndarray] | None]:
    """The statuses the call may return and, when it must succeed, the oracle's outputs."""
    kind = case.fault[0] if case.fault else None
    if kind == "huge_rows":  # an empty (2^62, 0) table: nothing to write, no workspace for its rows;
        # (2^62, 1): more bytes than int64 counts (aclCreateTensor already refuses such a view)
        return ({"ok"}, {}) if case.spec["b"]["D"] == 0 else ({"shape", "refused"}, None)
    if kind in FIXED:
        return {FIXED[kind]}, None
    if kind == "acl_offset":
        return {"param", "refused"}, None
    a = oracle_args(case)
    op = registry.get(case.t.op)
    try:
        binding.bind(op, a)  # on the real views: dtypes, shapes, contiguous_last
    except OpError as e:
        return {e.status}, None
    ok = {"ok"}
    for p in op.signature.outputs:
        v = case.args.get(p.name)
        if isinstance(v, np.ndarray):
            verdict = layout_verdict(v)
            if verdict == "clash":
                return {"strides"}, None
            if verdict == "either":
                ok = {"ok", "strides"}
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ref = oracle_outputs(case.t.op, a)
    except OpError as e:
        return {e.status}, None
    except MemoryError:
        return {"shape"}, None
    if case.t.op == FLCE and flce_target_outside(a):
        return {"index"}, None
    if kind == "workspace":  # (one byte too small / size 0 is no fault when nothing is needed: see run_case)
        return {"null" if case.spec["ws"][0] == "null_nonzero" else "workspace"}, ref
    return ok, ref


# =============================================================================== calling the ABIs


def workspace_for(mode: str, off: int, extra: int, need: int | None) -> tuple[Any, int | None]:
    """(workspace array or None, size) for a workspace mode, given the reported size ``need``."""
    need = need or 0
    if mode == "none":
        return None, 0
    if mode == "null_nonzero":
        return None, max(need, 1)
    if mode == "small":
        if need == 0:
            return None, 0
        return np.zeros(need + 64, np.uint8)[off:], need - 1
    if mode == "zero_nonnull":
        return np.zeros(64, np.uint8)[off:], 0
    size = need + (extra if mode == "generous" else 0)
    return np.zeros(size + 64, np.uint8)[off:], size


def call_plain(case: Case) -> tuple[int | str, str]:
    t, fault = case.t, case.fault or [None]
    lib = runtime.load()
    if fault[0] == "py_int":  # through the Python runtime: the value cannot reach C
        try:
            runtime.call(t.op, **{k: v for k, v in case.args.items() if v is not None})
        except OpError as e:
            return {v: k for k, v in runtime.STATUS.items()}[e.status], e.message
        return 0, ""
    tamper: dict[str, Any] = {}
    if fault[0] == "dtype_code":
        tamper[fault[1]] = lambda desc, hold, c=fault[2]: setattr(desc, "dtype", c)
    elif fault[0] == "data_null":
        tamper[fault[1]] = lambda desc, hold: setattr(desc, "data", None)
    elif fault[0] == "huge_rows":
        V, D = case.spec["b"]["huge"], case.spec["b"]["D"]
        case.args["num_weights"] = V
        tamper["out"] = lambda desc, hold: set_shape(desc, hold, (V, D), (D, 1))
    st_, need = c_call(t.op, case.args, tamper, lib=lib, size_query=True)
    case.need = need if st_ == 0 else None
    ws, size = workspace_for(*case.spec["ws"], case.need)
    return c_call(t.op, case.args, tamper, workspace=ws, workspace_size=size, lib=lib)


_FACADES: dict[str, Any] = {}


def call_infiniop(case: Case) -> tuple[int | str, str]:
    from tests.test_facades_c import Infini

    t, fault = case.t, case.fault or [None]
    lib = runtime.load()
    e = _FACADES.get(t.name) or _FACADES.setdefault(t.name, Infini(lib, t.op))
    descs = {}
    for n, v in case.args.items():
        if isinstance(v, np.ndarray) and n in tensor_params(t.op):
            code = fault[2] if fault[0] == "dtype_code" and fault[1] == n else None
            null_strides = case.spec["layouts"].get(n, {}).get("null_strides", False) and v.flags.c_contiguous
            descs[n] = e.tensor(v, dtype=code, contiguous_null=null_strides)
    scalars = {k: v for k, v in case.args.items() if not isinstance(v, np.ndarray) and v is not None}
    try:
        st_, desc = e.create(descs, scalars, case.spec["b"].get("ext", ""))
    finally:  # the op descriptor copies them: destroy the tensor descriptors right away
        for d in descs.values():
            assert lib.infiniopDestroyTensorDescriptor(d) == 0
            e.keep.remove(d)
    if st_:
        return st_, lib.opgen_last_error().decode()
    ws, size = None, None
    if e.m.workspace:
        case.need = e.workspace_size(desc)
        ws, size = workspace_for(*case.spec["ws"], case.need)
        ws = 0 if ws is None else ws
    null = (fault[1],) if fault[0] == "data_null" else ()
    st_ = e.run(desc, case.args, workspace=ws, workspace_size=size, null=null)
    assert e.destroy(desc) == 0
    return st_, lib.opgen_last_error().decode()


def call_aclnn(case: Case) -> tuple[int | str, str]:
    from ctypes import c_int64

    from tests.test_facades_c import ACL_FORMAT_ND, Acl

    t, fault = case.t, case.fault or [None]
    lib = runtime.load()
    a = _FACADES.get(t.name) or _FACADES.setdefault(t.name, Acl(lib, t.op))
    ts: dict[str, Any] = {}
    try:
        for n, v in case.args.items():
            if not isinstance(v, np.ndarray) or n not in tensor_params(t.op):
                continue
            buf = case.bufs[n]
            base = np.ndarray(((buf.root.nbytes - buf.start) // v.itemsize,), v.dtype, buffer=buf.root,
                              offset=buf.start)
            raw = (fault[0] in ("acl_offset", "data_null") and fault[1] == n) or \
                (fault[0] == "huge_rows" and n == "out")
            if raw:  # an aclTensor Acl.tensor cannot make
                shape, stv = list(v.shape), [s // v.itemsize for s in v.strides]
                storage = [base.size]
                offset = (v.ctypes.data - base.ctypes.data) // v.itemsize
                data = base.ctypes.data
                if fault[0] == "acl_offset":
                    offset = fault[2]
                elif fault[0] == "data_null":
                    data = None
                else:  # numWeights rows of D, storage to match: only the op can refuse it
                    V, D = case.spec["b"]["huge"], case.spec["b"]["D"]
                    shape, stv, storage, offset = [V, D], [D, 1], [V, D], 0
                nd = len(shape)
                h = lib.aclCreateTensor((c_int64 * max(nd, 1))(*shape), nd, dtypes.from_numpy(v.dtype).acl,
                                        (c_int64 * max(nd, 1))(*stv), offset, ACL_FORMAT_ND,
                                        (c_int64 * len(storage))(*storage), len(storage), data)
                if not h:
                    return "refused", "aclCreateTensor returned NULL"
                a.tensors.append(h)
                ts[n] = h
            else:
                code = fault[2] if fault[0] == "dtype_code" and fault[1] == n else None
                ts[n] = a.tensor(v, base=base, dtype=code)
        scalars = {k: v for k, v in case.args.items() if not isinstance(v, np.ndarray) and v is not None}
        if fault[0] == "huge_rows":
            scalars["num_weights"] = case.spec["b"]["huge"]
        st_, need, ex = a.phase1(ts, scalars)
        if st_:
            return st_, lib.opgen_last_error().decode()
        case.need = need
        ws, size = workspace_for(*case.spec["ws"], need)
        return a.phase2(ex, size, 0 if ws is None else ws), lib.opgen_last_error().decode()
    finally:
        a.close()
        a.tensors.clear()


CALL = {"plain": call_plain, "infiniop": call_infiniop, "aclnn": call_aclnn}


# =============================================================================== one case, checked

STATS: Counter[str] = Counter()


def describe_case(case: Case) -> str:
    lines = [f"target {case.t.name}, fault {case.fault}, workspace {case.spec['ws']}"]
    for k, v in case.args.items():
        if isinstance(v, np.ndarray):
            lines.append(f"  {k}: {v.dtype} {v.shape} strides(el) {[s // v.itemsize for s in v.strides]} "
                         f"addr%16={v.ctypes.data % 16}")
        else:
            lines.append(f"  {k} = {v!r}")
    return "\n".join(lines)


def run_case(t: Target, spec: dict[str, Any], last: Path | None = None) -> None:
    """Materialize, predict, call, check. Raises AssertionError on any disagreement."""
    if last is not None:
        last.write_text(f"{t.name}\n{spec!r}\n")
    case = materialize(t, spec)
    want, ref = expected(case)
    codes = status_codes(t)
    roots = {id(b.root): b for b in case.bufs.values()}
    before = {k: b.root.copy() for k, b in roots.items()}
    got, msg = CALL[t.kind](case)
    if case.fault and case.fault[0] == "workspace" and case.fault[1] != "null_nonzero" and not case.need:
        want = {"ok"}  # nothing needed: one byte less / size 0 is no fault (ref is the oracle's result)
    got_name = got if isinstance(got, str) else "/".join(k for k, v in codes.items() if v == got) or f"code {got}"
    STATS[f"{case.fault[0] if case.fault else 'valid'} -> {got_name}"] += 1
    ok_codes = {codes[s] for s in want if s in codes} | ({"refused"} & want)
    assert got in ok_codes, (f"{t.name}: status {got_name} ({got}, {msg!r}); expected "
                             f"{' or '.join(sorted(want))} ({sorted(map(str, ok_codes))})\n{describe_case(case)}")
    if got != 0:
        for k, b in roots.items():
            changed = np.flatnonzero(b.root != before[k])
            assert not changed.size, (f"{t.name}: a failing call ({got_name}) wrote {changed.size} byte(s) of a "
                                      f"buffer\n{describe_case(case)}")
        return
    assert ref is not None
    writable: dict[int, list[np.ndarray]] = {}
    for k, v in ref.items():
        out = case.args[k]
        assert_c_close(np.array(out), v, f"{t.name}.{k}", bf16_products(t.op))
        writable.setdefault(id(case.bufs[k].root), []).append(covered_bytes(out, case.bufs[k]))
    for k, b in roots.items():
        changed = b.root != before[k]
        for cov in writable.get(k, []):
            changed[cov] = False
        pos = np.flatnonzero(changed)
        owners = [n for n, bb in case.bufs.items() if id(bb.root) == k]
        assert not pos.size, (f"{t.name}: {pos.size} byte(s) of the buffer of {owners} outside the elements "
                              f"of the outputs written were modified (first at byte {pos[0]})\n{describe_case(case)}")


# =============================================================================== hypothesis driver


def fuzz_settings() -> settings:
    """The hypothesis profile: ``opgen-fuzz-ci`` (derandomized: every run draws the same examples)
    or, with ``OPGEN_FUZZ_RANDOM=1``, ``opgen-fuzz-random``; no deadline, no example database, no
    health checks (drawing builds arrays), no explain phase (slow under the sanitizers)."""
    common = {"max_examples": int(os.environ.get("OPGEN_FUZZ_EXAMPLES", "200")), "deadline": None,
              "database": None, "print_blob": False, "phases": [p for p in Phase if p != Phase.explain],
              "suppress_health_check": list(HealthCheck)}
    settings.register_profile("opgen-fuzz-ci", derandomize=True, **common)
    settings.register_profile("opgen-fuzz-random", derandomize=False, **common)
    random = os.environ.get("OPGEN_FUZZ_RANDOM", "") not in ("", "0")
    return settings.get_profile("opgen-fuzz-random" if random else "opgen-fuzz-ci")


def fuzz(t: Target, last: Path | None) -> None:
    @fuzz_settings()
    @given(spec=cases(t))
    def check(spec: dict[str, Any]) -> None:
        run_case(t, spec, last)

    if os.environ.get("OPGEN_FUZZ_RANDOM", "") not in ("", "0") and os.environ.get("OPGEN_FUZZ_SEED"):
        check = seed(int(os.environ["OPGEN_FUZZ_SEED"]))(check)
    check()


def main(argv: list[str]) -> int:
    if argv == ["list"]:
        print("\n".join(t.name for t in targets()))
        return 0
    if argv[:1] == ["replay"] and len(argv) == 3:
        t = target(argv[1])
        spec = ast.literal_eval(argv[2])
        case = materialize(t, spec)
        print(describe_case(case))
        run_case(t, spec)
        print("replay: OK")
        return 0
    if len(argv) in (1, 2) and argv[0] != "replay":
        t = target(argv[0])
        last = Path(argv[1]) if len(argv) == 2 else None
        try:
            fuzz(t, last)
        except BaseException:  # report whatever hypothesis raises, then fail
            traceback.print_exc()
            print(f"fuzz-worker: {t.name} FAILED; outcomes so far: {dict(STATS)}")
            return 1
        n = sum(STATS.values())
        print(f"fuzz-worker: {t.name}: {n} examples OK; outcomes: {dict(sorted(STATS.items()))}")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
