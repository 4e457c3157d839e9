"""Symbolic dims: the spelled sizes of opgen's types, as linear forms.

A dim is spelled as an integer, a name (``D``), or a function of dims (``div(D,2)``,
``sub(D,div(D,2))``, ``add(A,B)``, ``mul(H,D)``, and the lowered levels' ``cdiv``/``segs``),
optionally ``+ k`` (:func:`opgen.ir.dialect.parse_dim`). Slicing, concatenation and reshapes
derive new dims from the caller's; two spellings of the same size must compare equal, so derived
dims are kept canonical: a dim is a linear form ``sum(c_i * atom_i) + k`` over *atoms* (names,
``div(..)``, ``mul(..)`` and the lowered levels' functions) and is spelled from that form in one
fixed way (:func:`spell`). ``div(D,2) + sub(D,div(D,2))`` is then just ``D``.

Semantics at run time (the oracle's :func:`evaluate`, the loop level's size ops): ``div`` is
floor division by a positive constant, ``sub`` saturates at 0, ``add`` and ``mul`` saturate at
``2**63 - 1``. The DSL adds a run-time check wherever a derived dim must not saturate (a slice's
bounds, a reshape's element count), so a saturated size is never used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opgen.ir.dialect import SIZE_OPS, split_dim

I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Form:
    """``sum(coeff * atom) + const`` with atoms in their canonical spelling."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(terms: Mapping[str, int], const: int = 0) -> Form:
        return Form(tuple(sorted((a, c) for a, c in terms.items() if c)), const)

    def __add__(self, o: Form) -> Form:
        t = dict(self.terms)
        for a, c in o.terms:
            t[a] = t.get(a, 0) + c
        return Form.of(t, self.const + o.const)

    def __neg__(self) -> Form:
        return Form(tuple((a, -c) for a, c in self.terms), -self.const)

    def __sub__(self, o: Form) -> Form:
        return self + (-o)

    def scale(self, k: int) -> Form:
        return Form.of({a: c * k for a, c in self.terms}, self.const * k)

    @property
    def nonnegative(self) -> bool:
        """Every coefficient and the constant are >= 0 (so the dim is >= 0 for any sizes)."""
        return self.const >= 0 and all(c > 0 for _, c in self.terms)

    @property
    def provably_nonnegative(self) -> bool:
        """:attr:`nonnegative` after bounding each subtracted ``div(x,k)`` by ``x`` (so
        ``D - D // 2`` is provably >= 0)."""
        f = self
        for _ in range(8):
            if f.nonnegative:
                return True
            divs = [(a, c) for a, c in f.terms if c < 0 and a.startswith("div(")]
            if not divs:
                return False
            for a, c in divs:
                f = f - Form.of({a: c}) + form(split_dim(a)[1][0]).scale(c)
        return f.nonnegative

    @property
    def constant(self) -> int | None:
        return None if self.terms else self.const


def form(d: str) -> Form:
    """The linear form of spelled dim ``d``."""
    if d.isdigit():
        return Form(const=int(d))
    head, args, plus = split_dim(d)
    if head == "add":
        f = form(args[0]) + form(args[1])
    elif head == "sub":
        f = form(args[0]) - form(args[1])
    elif head == "mul" and args[1].isdigit():
        f = form(args[0]).scale(int(args[1]))
    else:
        f = Form.of({head if not args else f"{head}({','.join(args)})": 1})
    return f + Form(const=plus)


def _sum(atoms: Sequence[str]) -> str:
    out = atoms[0]
    for a in atoms[1:]:
        out = f"add({out},{a})"
    return out


def spell(f: Form) -> str:
    """The canonical spelling of ``f`` (raises ValueError when it may be negative)."""
    pos = [a if c == 1 else f"mul({a},{c})" for a, c in f.terms if c > 0]
    neg = [a if c == -1 else f"mul({a},{-c})" for a, c in f.terms if c < 0]
    k = f.const
    if not pos:
        if neg or k < 0:
            raise ValueError("a dim would be negative")
        return str(k)
    out = _sum(pos)
    if neg or k < 0:
        sub = neg + ([str(-k)] if k < 0 else [])
        out = f"sub({out},{_sum(sub)})"
    elif k > 0:
        out = f"{out}+{k}"
    return out


def canonical(d: str) -> str:
    """``d`` spelled canonically."""
    return spell(form(d))


def add(a: str, b: str) -> str:
    return spell(form(a) + form(b))


def sub(a: str, b: str) -> str:
    return spell(form(a) - form(b))


def floordiv(a: str, k: int) -> str:
    """``a // k`` for a positive int ``k``."""
    if k <= 0:
        raise ValueError(f"a dim can only be divided by a positive integer, got {k}")
    f = form(a)
    if f.constant is not None:
        return str(f.constant // k)
    return a if k == 1 else f"div({spell(f)},{k})"


def mul(a: str, b: str) -> str:
    """``a * b`` (an integer factor scales the form; dims multiply into a ``mul`` atom)."""
    fa, fb = form(a), form(b)
    if fb.constant is not None:
        return spell(fa.scale(fb.constant))
    if fa.constant is not None:
        return spell(fb.scale(fa.constant))
    x, y = sorted((spell(fa), spell(fb)))
    return f"mul({x},{y})"


def evaluate(d: str, sizes: Mapping[str, int]) -> int:
    """The size spelled ``d`` for the caller's dim ``sizes`` (the run-time semantics above)."""
    if d.isdigit():
        return int(d)
    head, args, plus = split_dim(d)
    v = [evaluate(a, sizes) for a in args]
    if head in SIZE_OPS:  # the size ops' own semantics (saturating, floor division)
        r = SIZE_OPS[head].EVAL(v[0], v[1])  # type: ignore[misc]
    elif head == "cdiv":
        r = -(-v[0] // v[1])
    elif head in sizes:
        r = sizes[head]
    else:
        raise KeyError(f"dim {head!r} is not bound")
    return min(r + plus, I64_MAX)


def factors(d: str) -> list[str]:
    """The factors of a product dim (``mul(D,H)`` -> ``[D, H]``; any other dim is itself)."""
    head, args, plus = split_dim(d) if not d.isdigit() else (d, [], 0)
    if head == "mul" and not plus and not args[1].isdigit():
        return factors(args[0]) + factors(args[1])
    return [d]


def reshape_groups(src: Sequence[str], dst: Sequence[str]) -> list[tuple[list[int], list[int]]]:
    """Pair consecutive source and result axes of a row-major reshape into groups of equal
    element count: ``(N, H, D) -> (N, mul(D,H))`` gives ``[([0],[0]), ([1,2],[1])]``. Axes
    match one to one where their dims are spelled alike; otherwise a group takes axes from the
    side with fewer factors until both sides hold the same factors, and when that never happens
    it takes the rest. The DSL checks each group's element counts at run time; the loop level
    maps indices group by group."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and j < len(dst) and src[i] == dst[j]:
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
            continue
        gi, gj = [], []
        fi: list[str] = []
        fj: list[str] = []
        while True:
            if i < len(src) and (len(fi) <= len(fj) or j >= len(dst)):
                gi.append(i)
                fi += [f for f in factors(src[i]) if f != "1"]
                i += 1
            elif j < len(dst):
                gj.append(j)
                fj += [f for f in factors(dst[j]) if f != "1"]
                j += 1
            else:
                break
            if gi and gj and sorted(fi) == sorted(fj):
                break
        groups.append((gi, gj))
    return groups
