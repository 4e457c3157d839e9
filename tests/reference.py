"""Helpers shared by the tests: dtype conversions and the one tolerance policy (SPEC §0).

The reference for every op is PyTorch CPU computed in float64 on the *same* input values the op
sees (inputs are generated, rounded to their storage dtype first, and those rounded values are
given to both sides). A result in a storage dtype passes when

    max|ours - ref64| <= max|torch_same_dtype - ref64| + MARGIN[dtype] * max|ref64|

where ``torch_same_dtype`` is PyTorch's own computation of the same thing in that dtype, and
NaN/Inf positions (and Inf signs) match exactly. The oracle's ``precision="f64"`` mode is held
to a much tighter bound against the float64 reference (:func:`assert_f64_close`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.cpu_cases import NP  # the torch-free dtype table (worker processes must not import torch)

#: Relative margins of SPEC §0 (f64 is the exact-math type: only summation-order noise).
MARGIN = {"f32": 1e-5, "f16": 1e-3, "bf16": 8e-3, "f64": 1e-12}

#: Tight relative bound for ``precision="f64"`` against the torch float64 reference.
F64_RTOL = 1e-10


TORCH = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}

FLOAT_NAMES = ("f16", "bf16", "f32", "f64")


def rounded(a: Any, dtype: str) -> np.ndarray:
    """``a`` rounded to storage dtype ``dtype`` (numpy array of that dtype; bf16 via ml_dtypes)."""
    return np.asarray(a, dtype=np.float64).astype(NP[dtype])


def f64(a: Any) -> np.ndarray:
    """A float64 numpy copy of a numpy array (any float dtype, bf16 included) or torch tensor."""
    if isinstance(a, torch.Tensor):
        return a.detach().to(torch.float64).cpu().numpy()
    return np.asarray(a).astype(np.float64)


def t64(a: Any, requires_grad: bool = False) -> torch.Tensor:
    """A float64 torch tensor holding exactly the values of numpy array ``a``."""
    return torch.tensor(f64(a), dtype=torch.float64, requires_grad=requires_grad)


def tt(a: Any, dtype: str, requires_grad: bool = False) -> torch.Tensor:
    """A torch tensor of float dtype ``dtype`` holding exactly the values of ``a`` (which must
    already be representable: it is built from the float64 values)."""
    t = torch.tensor(f64(a), dtype=torch.float64).to(TORCH[dtype])
    assert torch.equal(t.to(torch.float64), torch.tensor(f64(a))) or np.isnan(f64(a)).any(), \
        "value not representable in " + dtype
    return t.requires_grad_(requires_grad)


def tlong(a: Any) -> torch.Tensor:
    """Integer indices as a torch int64 tensor (unsigned 64-bit values must fit in int64)."""
    return torch.tensor(np.asarray(a).astype(np.int64))


def f32_scalar(x: float) -> float:
    """The value a C ``float`` parameter (alpha, eps, ...) really carries."""
    return float(np.float32(x))


def _nonfinite_match(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert np.array_equal(np.isnan(ours), np.isnan(ref)), (
        f"{what}: NaN positions differ: ours {np.argwhere(np.isnan(ours)).tolist()[:8]} vs "
        f"reference {np.argwhere(np.isnan(ref)).tolist()[:8]}")
    for sign in (np.inf, -np.inf):
        assert np.array_equal(ours == sign, ref == sign), f"{what}: {sign} positions differ"


def _max_err(a: np.ndarray, ref: np.ndarray, finite: np.ndarray) -> float:
    return float(np.max(np.abs(a[finite] - ref[finite]), initial=0.0))


def assert_close_policy(ours: Any, ref64: Any, torch_same: Any, dtype: str, what: str = "") -> None:
    """SPEC §0: ``ours`` (in storage dtype ``dtype``) is no worse than PyTorch's same-dtype
    result ``torch_same`` against the float64 reference ``ref64``, plus ``MARGIN[dtype]``
    relative to ``max|ref64|``. NaN/Inf must match exactly."""
    if isinstance(ours, np.ndarray):
        assert ours.dtype == NP[dtype], f"{what}: result dtype {ours.dtype}, expected {dtype}"
    o, r, t = f64(ours), f64(ref64), f64(torch_same)
    assert o.shape == r.shape == t.shape, f"{what}: shapes {o.shape} {r.shape} {t.shape}"
    _nonfinite_match(o, r, what)
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]), initial=0.0))
    err_ours = _max_err(o, r, finite)
    t_finite = finite & np.isfinite(t)
    err_torch = _max_err(t, r, t_finite)
    bound = err_torch + MARGIN[dtype] * scale
    assert err_ours <= bound, (
        f"{what} [{dtype}]: max error {err_ours:.3e} > torch's own {err_torch:.3e} + "
        f"{MARGIN[dtype]:g} * {scale:.3e} = {bound:.3e}")


def assert_f64_close(ours: Any, ref64: Any, what: str = "", rtol: float = F64_RTOL) -> None:
    """The oracle's exact-math (f64) result against torch float64 on the same inputs."""
    o, r = f64(ours), f64(ref64)
    assert isinstance(ours, np.ndarray) and ours.dtype == np.float64, f"{what}: not an f64 result"
    assert o.shape == r.shape, f"{what}: shapes {o.shape} vs {r.shape}"
    _nonfinite_match(o, r, what)
    finite = np.isfinite(r)
    scale = float(np.max(np.abs(r[finite]), initial=0.0))
    err = _max_err(o, r, finite)
    assert err <= rtol * scale, f"{what}: f64 error {err:.3e} > {rtol:g} * {scale:.3e}"


def cpu_flag(flag: str) -> bool:
    """Whether this machine's CPU lists ``flag`` (``/proc/cpuinfo``; False where there is none):
    for tests whose compiled path depends on the instruction set (``-march=native``)."""
    try:
        return any(flag in line.split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("flags"))
    except OSError:
        return False
