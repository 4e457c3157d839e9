"""f32 erf and tanh as polynomial kernels, shared by every target whose vector unit lacks them.

One table of coefficients, fitted for opgen (docs/backend_cpu.md, "Vector math"), serves two
evaluations of the same piecewise approximations:

* the CPU runtime's branch-free C functions ``opgen_erff``/``opgen_tanhf`` (templates/cpu/
  opgen_rt.h.j2 renders these tables: fused multiply-adds, range clamps on the float's bits);
* the *steps* below — a sequence of elementwise operations (add, multiply, divide, min/max,
  compare, select, exp) that any vector unit has. ``expand-math`` (opgen/lower/expand_math.py)
  builds them as L0 ops for a target without hardware erf/tanh (Ascend C: its A2 vector API has
  ``Exp`` but neither; TT-Metal's SFPU and CUDA have both), and :func:`evaluate` runs them in
  numpy float32, every step rounded as a vector unit rounds it, which is how their error bound is
  measured (tests/test_vmath.py).

erf:  |x| <= 0.875: ``x (c0 + t Q(t))``, ``t = x^2``; 0.875 < |x|: ``erf(|x|)`` as a degree-14
      polynomial in ``u = (a - 2.4) / 1.525`` of ``a = |x|`` clamped to [0.875, 3.925] (exactly 1
      at 3.925, so every larger |x| gives 1), with x's sign; NaN takes the first branch.
tanh: |x| < 0.55: ``x (1 + t Q(t))`` (the C function: ``x + x t Q(t)``); else
      ``1 - 2 / (exp(2|x|) + 1)`` with x's sign (exactly 1 from |x| = 9.0109); NaN through exp.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

#: erf(x) / x near 0: c0 + t Q(t), Q's coefficients highest degree first (a least-squares fit)
ERF_C0 = "1.1283791583388356"
ERF_SMALL_Q = ("-0.000621850333703725", "0.005035122163087297", "-0.02679345258632669", "0.11282510452903068",
               "-0.3761255583914355")
#: where the small branch ends, and where erf(|x|) is 1 in f32
ERF_SMALL_MAX = "0.875"
ERF_ONE_FROM = "3.925"
#: u = a * ERF_U_SCALE + ERF_U_SHIFT = (a - 2.4) / 1.525
ERF_U_SCALE = "0.655737698"
ERF_U_SHIFT = "-1.57377052"
#: erf(|x|) as a polynomial in u, highest degree first (Chebyshev interpolation)
ERF_BIG = ("0.000506156648", "-0.000278549502", "-0.00300504407", "0.00407216279", "0.0041298815", "-0.0153747909",
           "0.0152648911", "0.00487277936", "-0.0387865752", "0.0650214553", "-0.0655373856", "0.0442272201",
           "-0.019845888", "0.00542218378", "0.999311507")
#: tanh(x) = x + x^3 Q(x^2) near 0, Q highest degree first (a least-squares fit)
TANH_SMALL_MAX = "0.55"
TANH_Q = ("0.0025284624216840666", "-0.008527901334843942", "0.021818864535928895", "-0.05396474530547813",
          "0.1333332436867869", "-0.3333333329599166")


def f32(text: str) -> float:
    """The f32 value a C compiler gives the literal ``text`` + ``f`` (round to nearest; checked
    against the C compiler for every coefficient by tests/test_vmath.py)."""
    return float(np.float32(text))


def f32_bits(text: str) -> str:
    """The bits of f32(text), as a C hex literal (the C functions clamp on a float's bits)."""
    return f"0x{int(np.float32(text).view(np.uint32)):08x}"


V = TypeVar("V")


class Steps(Protocol[V]):
    """What the algorithms below need of a vector unit (values of one shape, f32 arithmetic,
    every step rounded; masks from comparisons)."""

    def const(self, c: str) -> V: ...
    def abs(self, x: V) -> V: ...
    def neg(self, x: V) -> V: ...
    def exp(self, x: V) -> V: ...
    def add(self, a: V, b: V) -> V: ...
    def mul(self, a: V, b: V) -> V: ...
    def div(self, a: V, b: V) -> V: ...
    def max(self, a: V, b: V) -> V: ...
    def min(self, a: V, b: V) -> V: ...
    def lt(self, a: V, b: V) -> V: ...
    def gt(self, a: V, b: V) -> V: ...
    def select(self, mask: V, a: V, b: V) -> V: ...


def horner(s: Steps[V], x: V, coefficients: tuple[str, ...]) -> V:
    """The polynomial (coefficients highest degree first) at x: a multiply and an add a term."""
    p = s.const(coefficients[0])
    for c in coefficients[1:]:
        p = s.add(s.mul(p, x), s.const(c))
    return p


def with_sign_of(s: Steps[V], r: V, x: V) -> V:
    """r (non-negative) with the sign of x (x = -0 and NaN never reach it)."""
    return s.select(s.lt(x, s.const("0")), s.neg(r), r)


def erf(s: Steps[V], x: V) -> V:
    """erf(x) as elementwise steps (module docstring)."""
    ax, t = s.abs(x), s.mul(x, x)
    small = s.mul(x, s.add(s.const(ERF_C0), s.mul(t, horner(s, t, ERF_SMALL_Q))))  # (-0 stays -0)
    a = s.min(s.max(ax, s.const(ERF_SMALL_MAX)), s.const(ERF_ONE_FROM))
    u = s.add(s.mul(a, s.const(ERF_U_SCALE)), s.const(ERF_U_SHIFT))
    big = with_sign_of(s, horner(s, u, ERF_BIG), x)
    return s.select(s.gt(ax, s.const(ERF_SMALL_MAX)), big, small)


def tanh(s: Steps[V], x: V) -> V:
    """tanh(x) as elementwise steps (module docstring)."""
    ax, t = s.abs(x), s.mul(x, x)
    small = s.mul(x, s.add(s.const("1"), s.mul(t, horner(s, t, TANH_Q))))  # (-0 stays -0)
    e = s.exp(s.add(ax, ax))
    big = with_sign_of(s, s.add(s.const("1"), s.neg(s.div(s.const("2"), s.add(e, s.const("1"))))), x)
    return s.select(s.lt(ax, s.const(TANH_SMALL_MAX)), small, big)


#: the functions expand-math can build, by the name of the L0 op they replace
FUNCTIONS = {"erf": erf, "tanh": tanh}


class NumpySteps:
    """The steps on numpy float32 arrays, each rounded to f32 (exp: numpy's float32 exp, within
    an ulp; a vector unit's own exp may differ)."""

    def const(self, c: str) -> np.ndarray:
        return np.float32(c)

    def abs(self, x: np.ndarray) -> np.ndarray:
        return np.abs(x)

    def neg(self, x: np.ndarray) -> np.ndarray:
        return np.negative(x)

    def exp(self, x: np.ndarray) -> np.ndarray:
        return np.exp(x)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=np.float32)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.multiply(a, b, dtype=np.float32)

    def div(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.divide(a, b, dtype=np.float32)

    def max(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.maximum(a, b)

    def min(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.minimum(a, b)

    def lt(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.less(a, b)

    def gt(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.greater(a, b)

    def select(self, mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(mask, a, b).astype(np.float32)


def evaluate(fn: str, x: np.ndarray) -> np.ndarray:
    """The steps of ``fn`` ('erf' or 'tanh') on f32 ``x``, in numpy (each step rounded to f32)."""
    with np.errstate(all="ignore"):
        return np.asarray(FUNCTIONS[fn](NumpySteps(), np.asarray(x, np.float32)), np.float32)
