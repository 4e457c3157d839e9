"""C identifiers for names that come from the DSL (parameters, dims).

The DSL accepts any Python identifier; the generated C, C++ and CUDA must compile whatever it is.
Two spellings:

* :func:`local` — inside generated function bodies every parameter is ``p_<name>`` (strides
  ``st_<name>_<axis>``, row tables ``ro_<name>``, dims ``d_<dim>``). Printer-made names never
  start with those prefixes, so nothing a user writes can shadow a local, a helper function or
  a macro (``exp``, ``a``, ``sc``, ``NULL`` all stay distinct).
* :func:`public` — parameter names in public prototypes (``opgen.h``) stay the DSL's names for
  readability, except names that C, C++ or CUDA reserve, that the headers we include define as
  macros, that start with ``opgen_``/``_``, or that the entry points use themselves
  (``workspace``, ``size``, ...); those get a trailing ``_`` — as does every name already ending
  in ``_``, which keeps the mapping one-to-one (``int`` -> ``int_``, ``int_`` -> ``int__``).
"""

from __future__ import annotations

import re

#: C11, C++20 and CUDA keywords and alternative tokens
KEYWORDS = frozenset("""
auto break case char const continue default do double else enum extern float for goto if inline int long
register restrict return short signed sizeof static struct switch typedef union unsigned void volatile while
_Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert _Thread_local
alignas alignof and and_eq asm bitand bitor bool catch char8_t char16_t char32_t class compl concept consteval
constexpr constinit const_cast co_await co_return co_yield decltype delete dynamic_cast explicit export false
friend mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public
reinterpret_cast requires static_assert static_cast template this thread_local throw true try typeid typename
using virtual wchar_t xor xor_eq
__global__ __device__ __host__ __shared__ __constant__ __managed__ __restrict__ __forceinline__
""".split())

#: object-like macros and typedef names of the headers the generated code includes
#: (stdint.h, stddef.h, stdbool.h, string.h, math.h, omp.h, cuda_runtime.h's common ones)
MACROS = frozenset("""
NULL EOF NAN INFINITY HUGE_VAL HUGE_VALF HUGE_VALL MATH_ERRNO MATH_ERREXCEPT math_errhandling errno
SIZE_MAX PTRDIFF_MIN PTRDIFF_MAX SIG_ATOMIC_MIN SIG_ATOMIC_MAX WCHAR_MIN WCHAR_MAX WINT_MIN WINT_MAX
stdin stdout stderr size_t ptrdiff_t intptr_t uintptr_t intmax_t uintmax_t max_align_t nullptr_t wint_t
float_t double_t offsetof static_assert assert
""".split())

#: the parameters every generated entry point adds after the op's own
ENTRY_PARAMS = frozenset(("workspace", "workspace_size", "size", "stream"))

_RESERVED_PATTERNS = re.compile(
    r"_.*"  # leading underscore: reserved to the implementation (C11 7.1.3)
    r"|u?int(_least|_fast)?\d+_t|u?intptr_t"
    r"|U?INT(_LEAST|_FAST)?\d+_(MIN|MAX|C)|U?INT(PTR|MAX)_(MIN|MAX|C)"
    r"|M_[A-Z0-9_]+|FP_[A-Z_]+|OPGEN_\w*|opgen_\w*|CUDA\w*|cuda\w*"
)


def reserved(name: str) -> bool:
    """``name`` cannot be used as is in a generated public prototype."""
    return (name in KEYWORDS or name in MACROS or name in ENTRY_PARAMS or name.endswith("_")
            or bool(_RESERVED_PATTERNS.fullmatch(name)))


def public(name: str) -> str:
    """The parameter's name in public C prototypes (one-to-one; see the module docstring)."""
    return name + "_" if reserved(name) else name


def local(name: str) -> str:
    """The parameter's identifier inside generated function bodies."""
    return "p_" + name


def dtype_enum(name: str) -> str:
    """The ``opgen_dtype_t`` enumerator of a dtype (``i64`` -> ``OPGEN_I64``)."""
    return "OPGEN_" + name.upper()
