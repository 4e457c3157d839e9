"""Run the generated Ascend C kernels on the CPU model (tests/ascendc_model) against the oracle.

Used as a subprocess by tests/test_ascendc.py, since the model aborts the process on a broken
hardware rule:

    python -m tests.ascendc_worker LIB CASES.pkl OUT.npz

``CASES.pkl`` holds a list of (case name, op name, arguments); every case runs through
``opgen_ascendc_<op>`` (the plain ABI's Ascend twin) and the oracle; the worker prints one line
per failure and writes the Ascend outputs and every call's status (``status.<case>``) to
``OUT.npz`` (so that runs with different core counts can be compared bit for bit, and refusals of
cases named ``bad-*`` with the CPU library's). The core count comes from ``$OPGEN_ASCEND_AIV_CORES``.
"""

from __future__ import annotations

import ctypes
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from opgen import oracle, registry, runtime  # noqa: E402
from opgen.binding import OpError  # noqa: E402
from tests.cpu_cases import assert_c_close, copied, snapshot  # noqa: E402


class AscendAbi:
    """Presents ``opgen_ascendc_<op>(..., stream)`` as the plain ABI's ``opgen_<op>(...)`` for
    ``opgen.runtime.call`` (in the model, device memory is host memory; the stream is NULL)."""

    def __init__(self, path: str | Path):
        # the acl runtime calls (aclrtMemcpy, aclrtMalloc) resolve to the CPU library's host-memory ones
        ctypes.CDLL(str(runtime.library_path()), mode=ctypes.RTLD_GLOBAL)
        self.lib = ctypes.CDLL(str(path))
        self.lib.opgen_ascendc_last_error.restype = ctypes.c_char_p

    def __getattr__(self, name: str) -> Any:
        if name == "opgen_last_error":
            return self.lib.opgen_ascendc_last_error
        fn = getattr(self.lib, "opgen_ascendc_" + name.removeprefix("opgen_"))
        return lambda *a: fn(*a, None)


def infiniop_rms(lib: AscendAbi, a: dict[str, Any]) -> dict[str, np.ndarray]:
    """RMSNorm backward through the Ascend library's infiniop facade (a handle of device ASCEND)."""
    from tests.test_abi_hardening import Infini

    e = Infini(lib.lib)
    dev = ctypes.c_int(-1)
    e.lib.infiniopGetDescriptorDeviceType.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    st, desc = e.rms_create(a)
    if st != 0:
        raise OpError("param", f"infiniopCreateRMSNormBackwardDescriptor: {st}")
    assert e.lib.infiniopGetDescriptorDeviceType(desc, ctypes.byref(dev)) == 0 and dev.value == 3  # ASCEND
    need = e.rms_ws(desc)
    ws = np.zeros(need + 1, np.uint8)
    st = e.rms_run(desc, a, ws.ctypes.data, need)
    if st != 0:
        raise OpError("param", f"infiniopRMSNormBackward: {st}")
    return {"grad_x": a["grad_x"], "grad_w": a["grad_w"]}


def infiniop_eb(lib: AscendAbi, a: dict[str, Any]) -> dict[str, np.ndarray]:
    """EmbeddingBackward (one table, alpha1 = 1, no accumulation) through the Ascend library's
    infiniop facade: its call has no workspace, so the library allocates its own."""
    from tests.test_abi_hardening import Infini

    e = Infini(lib.lib)
    st, desc = e.eb_create(e.tensor(a["dtable1"]), e.tensor(a["dy"]), e.tensor(a["i1"]))
    if st != 0:
        raise OpError("param", f"infiniopCreateEmbeddingBackwardDescriptor: {st}")
    st = e.eb_run(desc, a["dtable1"], a["dy"], a["i1"])
    if st != 0:
        raise OpError("index" if st == 3 else "param", f"infiniopEmbeddingBackward: {st}")
    return {"dtable1": a["dtable1"]}


INFINIOP = {"rms_norm_backward": infiniop_rms, "embedding_backward": infiniop_eb}


def run(lib: AscendAbi, cases: list[tuple[str, str, dict[str, Any]]]) -> tuple[list[str], dict[str, np.ndarray]]:
    failures: list[str] = []
    outs: dict[str, np.ndarray] = {}
    for case, op_name, args in cases:
        facade, _, op = op_name.rpartition(":")  # "infiniop:<op>": through the facade
        o = registry.get(op)
        try:
            ref: dict[str, np.ndarray] | OpError = oracle.run(o, **copied(args))
        except OpError as e:
            ref = e
        before = snapshot(args)
        try:
            got = INFINIOP[op](lib, args) if facade == "infiniop" else runtime.call(op, lib=lib, **args)
        except OpError as e:
            outs[f"status.{case}"] = np.array(e.status)
            if snapshot(args) != before:
                failures.append(f"{case}: refused with {e.status} but wrote to its arguments")
            if case.startswith("bad-"):  # refusals: the caller compares them with the CPU library's
                continue
            if not isinstance(ref, OpError) or ref.status != e.status:
                failures.append(f"{case}: ascendc status {e.status} ({e.message}); oracle: {ref}")
            continue
        outs[f"status.{case}"] = np.array("ok")
        if isinstance(ref, OpError):
            failures.append(f"{case}: ascendc succeeded; oracle: {ref}")
            continue
        for k, v in ref.items():
            try:
                assert_c_close(got[k], v, f"{case}.{k}")
            except AssertionError as e:
                failures.append(str(e))
            outs[f"{case}.{k}"] = got[k]
    return failures, outs


def main() -> None:
    lib_path, cases_path, out_path = sys.argv[1:4]
    cases = pickle.loads(Path(cases_path).read_bytes())
    failures, outs = run(AscendAbi(lib_path), cases)
    np.savez(out_path, **outs)
    for f in failures:
        print("FAIL", f)
    print(f"{len(cases)} case(s), {len(failures)} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
