"""``@op``: turns a Python function into an :class:`OpDef` that can be traced into IR."""

from __future__ import annotations

import inspect
import itertools
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, ModuleOp, StringAttr
from xdsl.ir import Block
from xdsl.utils.exceptions import VerifyException

from opgen import dtypes
from opgen.dsl.spec import (
    AttrSpec,
    Batch,
    Dim,
    DSLError,
    Param,
    Signature,
    SizeSpec,
    TensorSpec,
)
from opgen.dsl.trace import Tracer, Value, Variant, as_value, broadcast_to, cast, size
from opgen.ir import dialect as ir

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ATTR_TYPES = {float: dtypes.F32, int: dtypes.I64, bool: dtypes.BOOL}


@dataclass(frozen=True)
class Rejected:
    """An optional-tensor combination the op does not support."""

    present: tuple[str, ...]
    message: str
    status: str  # "null" or "param"


@dataclass
class OpDef:
    """An operator written in the DSL: its signature, source, ABIs and traced IR variants."""

    name: str
    fn: Callable[..., Any]
    signature: Signature
    abis: list[Any] = field(default_factory=list)
    doc: str = ""
    file: str = ""
    line: int = 0
    may_alias: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        """``file:line`` of the definition; relative to the repository when inside it, so that
        generated files do not depend on the directory ``opgen`` runs from."""
        path = os.path.abspath(self.file)
        if path.startswith(_REPO + os.sep):
            return f"{os.path.relpath(path, _REPO)}:{self.line}"
        return f"{path}:{self.line}"

    # ------------------------------------------------------------------ variants
    def presence_sets(self) -> list[tuple[str, ...]]:
        """Every combination of present optional tensors, all-absent first."""
        opts = [p.name for p in self.signature.optionals]
        out: list[tuple[str, ...]] = []
        for r in range(len(opts) + 1):
            out.extend(itertools.combinations(opts, r))
        return out

    def variant_name(self, present: Sequence[str]) -> str:
        return self.name if not present else self.name + "__" + "_".join(present)

    @cached_property
    def traced(self) -> tuple[dict[tuple[str, ...], ir.FuncOp], dict[tuple[str, ...], Rejected]]:
        funcs: dict[tuple[str, ...], ir.FuncOp] = {}
        rejected: dict[tuple[str, ...], Rejected] = {}
        for present in self.presence_sets():
            try:
                funcs[present] = self._trace(present)
            except Variant as v:
                rejected[present] = Rejected(present, str(v), v.status)
        if not funcs:
            raise DSLError(f"{self.where}: op '{self.name}' rejects every combination of optional "
                           f"tensors")
        return funcs, rejected

    @property
    def variants(self) -> dict[tuple[str, ...], ir.FuncOp]:
        return self.traced[0]

    @property
    def rejected(self) -> dict[tuple[str, ...], Rejected]:
        return self.traced[1]

    def module(self) -> ModuleOp:
        """All valid variants in one module (fresh copies, safe to transform)."""
        m = ModuleOp([f.clone() for f in self.variants.values()])
        m.verify()
        return m

    def variant_for(self, present: Sequence[str]) -> ir.FuncOp | Rejected:
        key = tuple(p.name for p in self.signature.optionals if p.name in present)
        return self.variants.get(key) or self.rejected[key]

    # ------------------------------------------------------------------ tracing
    def _trace(self, present: tuple[str, ...]) -> ir.FuncOp:
        sig = self.signature
        params = [p for p in sig.params if not p.optional or p.name in present]
        arg_types = []
        for p in params:
            if isinstance(p.spec, TensorSpec):
                arg_types.append(ir.TensorType.make(p.spec.logical_shape, p.spec.dtype.name))
            elif isinstance(p.spec, AttrSpec):
                arg_types.append(ir.TensorType.make([], p.spec.dtype.name))
            else:
                arg_types.append(ir.TensorType.make([], "i64"))
        dvars = sig.dtype_vars()
        func = ir.FuncOp(self.variant_name(present), [p.name for p in params], arg_types,
                         {k: [m.name for m in v.members] for k, v in dvars.items()})
        names = {p.name for p in params}
        aliased = {o: StringAttr(i) for o, i in self.may_alias if o in names}
        if aliased:
            func.properties["may_alias"] = DictionaryAttr(aliased)
        batched = [p.name for p in params if isinstance(p.spec, TensorSpec) and isinstance(p.spec.batch, Batch)]
        if batched:
            func.properties["batched"] = ArrayAttr([StringAttr(n) for n in batched])
        sizes = {p.name: StringAttr(p.spec.dim.name) for p in params if isinstance(p.spec, SizeSpec)}
        if sizes:
            func.properties["sizes"] = DictionaryAttr(sizes)
        rank0 = [p.name for p in params if isinstance(p.spec, TensorSpec) and not p.spec.shape]
        if rank0:
            func.properties["rank0_tensors"] = ArrayAttr([StringAttr(n) for n in rank0])
        block: Block = func.body.block
        with Tracer(self.name, block, dvars) as t:
            kwargs: dict[str, Any] = {}
            args = dict(zip([p.name for p in params], block.args, strict=True))
            for p in sig.params:
                if p.name not in args:
                    kwargs[p.name] = None
                elif isinstance(p.spec, SizeSpec):
                    kwargs[p.name] = size(p.spec.dim)
                    # the block argument still carries the value at the ABI (binding checks it)
                else:
                    kwargs[p.name] = Value(args[p.name], weak=isinstance(p.spec, AttrSpec))
            result, t.location = _call_noting_return(self.fn, kwargs)
            outs = sig.outputs
            if isinstance(result, Value) and len(outs) == 1:
                result = {outs[0].name: result}
            if not isinstance(result, dict):
                raise DSLError(f"{self.where}: op '{self.name}' must return a dict of its outputs "
                               f"{[o.name for o in outs]} (or one value for one output)")
            missing = [o.name for o in outs if o.name in args and not o.optional
                       and result.get(o.name) is None]
            extra = [k for k in result if k not in {o.name for o in outs}]
            if missing:
                raise DSLError(f"{t.location}: op '{self.name}' does not return output(s) "
                               f"{missing}")
            if extra:
                raise DSLError(f"{t.location}: op '{self.name}' returns {extra}, which are not "
                               f"declared Output[...] parameters")
            values, names = [], []
            for o in outs:
                if o.name not in args:
                    if result.get(o.name) is not None:
                        raise DSLError(f"{self.where}: op '{self.name}' returns a value for "
                                       f"absent optional output '{o.name}'")
                    continue
                if result.get(o.name) is None:  # an optional output the variant leaves as is
                    continue
                values.append(self._store(t, o, result[o.name]).ssa)
                names.append(o.name)
            block.add_op(ir.ReturnOp(values, names))
        try:
            func.verify()
        except VerifyException as e:
            raise DSLError(f"{self.where}: op '{self.name}': {e}") from None
        return func

    def _store(self, t: Tracer, o: Param, value: Any) -> Value:
        spec = o.spec
        assert isinstance(spec, TensorSpec)
        v = as_value(value)
        want = spec.logical_shape
        try:
            v = broadcast_to(v, want)
        except DSLError:
            raise t.error(f"output '{o.name}' has shape {tuple(want)} but the op returns "
                          f"{v.shape}") from None
        if list(v.shape) != list(want):
            raise t.error(f"output '{o.name}' has shape {tuple(want)} but the op returns "
                          f"{v.shape}")
        if v.dtype != spec.dtype.name:
            if t.kinds(v.dtype) != t.kinds(spec.dtype.name):
                raise t.error(f"output '{o.name}' is {spec.dtype.name} but the op returns "
                              f"{v.dtype}; cast explicitly")
            v = cast(v, spec.dtype)
        return v


def _call_noting_return(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[Any, str]:
    """Call the op body; also return the ``file:line`` it returned from, which messages about
    its outputs name (they are checked once the body's frame is gone). Under a profiler
    (``cProfile``, ``yappi``: a profile function already set) the line is the op's first (its
    decorator's): a profile function of ours would displace the profiler for good (a C-level
    one, once displaced, cannot be set back from Python)."""
    code = fn.__code__
    line = [code.co_firstlineno]
    if sys.getprofile() is not None:
        return fn(**kwargs), f"{os.path.relpath(code.co_filename)}:{line[0]}"

    def note(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            line[0] = frame.f_lineno

    old = sys.getprofile()
    sys.setprofile(note)
    try:
        result = fn(**kwargs)
    finally:
        sys.setprofile(old)
    return result, f"{os.path.relpath(code.co_filename)}:{line[0]}"


def _read_signature(fn: Callable[..., Any], where: str) -> Signature:
    try:
        ann = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:
        raise DSLError(f"{where}: cannot evaluate annotations of '{fn.__name__}': {e}") from None
    sig = Signature()
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise DSLError(f"{where}: op '{fn.__name__}': *args/**kwargs are not allowed")
        a = ann.get(name, inspect.Parameter.empty)
        if a is inspect.Parameter.empty:
            raise DSLError(f"{where}: op '{fn.__name__}': parameter '{name}' needs an annotation "
                           f"(Tensor[...], Output[...], float, int, bool or a Dim)")
        if isinstance(a, TensorSpec):
            if a.optional and p.default is not None:
                raise DSLError(f"{where}: optional tensor '{name}' must default to None")
            if not a.optional and p.default is not p.empty:
                raise DSLError(f"{where}: tensor '{name}' has a default; write "
                               f"Tensor[...] | None = None for an optional tensor")
            sig.params.append(Param(name, a))
        elif a in _ATTR_TYPES:
            has = p.default is not p.empty
            if has and not isinstance(p.default, a if a is not float else (int, float)):
                raise DSLError(f"{where}: default of '{name}' is not a {a.__name__}")
            sig.params.append(Param(name, AttrSpec(_ATTR_TYPES[a], p.default if has else None, has)))
        elif isinstance(a, Dim):
            sig.params.append(Param(name, SizeSpec(a)))
        else:
            raise DSLError(f"{where}: op '{fn.__name__}': parameter '{name}' has annotation "
                           f"{a!r}; expected Tensor[...], Output[...], float, int, bool or a Dim")
    if not sig.outputs:
        raise DSLError(f"{where}: op '{fn.__name__}' declares no Output[...] parameter")
    _check_dims(sig, where, fn.__name__)
    return sig


def _check_dims(sig: Signature, where: str, name: str) -> None:
    """Batch dims must be used consistently (always as Batch or never)."""
    batch: dict[str, bool] = {}
    for p in sig.params:
        if isinstance(p.spec, TensorSpec):
            for d in p.spec.shape:
                if isinstance(d, int):
                    continue
                is_b = isinstance(d, Batch)
                if batch.setdefault(d.name, is_b) != is_b:
                    here, there = ("Batch", "plain") if is_b else ("plain", "Batch")
                    raise DSLError(f"{where}: op '{name}': dim {d.name} is {here} in '{p.name}' "
                                   f"but {there} elsewhere")


def op(fn: Callable[..., Any] | None = None, *, abi: Sequence[Any] = (), name: str | None = None,
       may_alias: Sequence[tuple[str, str]] = ()) -> Any:
    """Declare an operator. Use as ``@op`` or ``@op(abi=[...])``.

    Parameters are read from the annotations: ``Tensor[...]`` inputs, ``Output[...]`` outputs
    (caller-allocated; readable for in-place accumulation), ``float``/``int``/``bool`` scalar
    attributes (f32/i64/bool), and a ``Dim`` for an integer giving a dim's size. The body returns
    ``{output_name: value}`` (``None`` for an optional output left untouched).
    ``may_alias`` lists (output, input) pairs the caller may pass as the same buffer.
    """

    def wrap(f: Callable[..., Any]) -> OpDef:
        code = f.__code__
        where = f"{os.path.relpath(code.co_filename)}:{code.co_firstlineno}"
        sig = _read_signature(f, where)
        for o, i in may_alias:
            if o not in {p.name for p in sig.outputs} or i not in {p.name for p in sig.inputs}:
                raise DSLError(f"{where}: may_alias pair ({o!r}, {i!r}) must name an output and "
                               f"an input")
        return OpDef(name or f.__name__, f, sig, list(abi), inspect.getdoc(f) or "",
                     code.co_filename, code.co_firstlineno, tuple(may_alias))

    return wrap(fn) if fn is not None else wrap
