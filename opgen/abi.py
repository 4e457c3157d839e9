"""Declarations of the vendor-style C ABIs an op exposes (data only; templates render them).

An op lists its facades in ``@op(abi=[...])``. Each facade names the vendor entry point and maps
the vendor's parameters, in the vendor's order, onto the op's DSL parameters, so templates need
no per-op code. Status codes per facade map the abstract statuses of :mod:`opgen.binding`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Arg:
    """One vendor parameter: its C name, the DSL parameter it carries and (scalars) its C type.

    ``param=None`` with a ``default`` passes a constant (the vendor API lacks that parameter).
    """

    c_name: str
    param: str
    c_type: str | None = None


def args(*items: str | Arg) -> tuple[Arg, ...]:
    """``args("grad", "indices=idx", Arg("numWeights", "num_weights", "uint64_t"))``: a plain
    string ``c=p`` maps C name ``c`` to DSL parameter ``p`` (``c`` alone when both are equal)."""
    out = []
    for it in items:
        if isinstance(it, Arg):
            out.append(it)
        else:
            c, _, p = it.partition("=")
            out.append(Arg(c, p or c))
    return tuple(out)


INFINIOP_STATUS = {"null": "INFINI_STATUS_NULL_POINTER", "param": "INFINI_STATUS_BAD_PARAM",
                   "shape": "INFINI_STATUS_BAD_TENSOR_SHAPE", "dtype": "INFINI_STATUS_BAD_TENSOR_DTYPE",
                   "strides": "INFINI_STATUS_BAD_TENSOR_STRIDES", "index": "INFINI_STATUS_BAD_PARAM"}
ACLNN_STATUS = {"null": "ACLNN_ERR_PARAM_NULLPTR", "param": "ACLNN_ERR_PARAM_INVALID",
                "shape": "ACLNN_ERR_PARAM_INVALID", "dtype": "ACLNN_ERR_PARAM_INVALID",
                "strides": "ACLNN_ERR_PARAM_INVALID", "index": "ACLNN_ERR_PARAM_INVALID"}


@dataclass(frozen=True)
class Infiniop:
    """An InfiniCore ``infiniop`` descriptor API: ``infiniopCreate<name>Descriptor(handle, &desc,
    <descriptors...>, <scalars...>)``, optional ``infiniopGet<name>WorkspaceSize``,
    ``infiniop<name>(desc, [workspace, size,] <data...>, stream)`` and Destroy.

    ``extensions`` adds Create variants: suffix -> extra trailing scalar args (e.g.
    ``{"WithEpsilon": args(Arg("epsilon", "eps", "float"))}``); the plain Create passes defaults.
    """

    name: str
    descriptors: tuple[Arg, ...]
    data: tuple[Arg, ...]
    scalars: tuple[Arg, ...] = ()
    workspace: bool = False
    extensions: dict[str, tuple[Arg, ...]] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=lambda: dict(INFINIOP_STATUS))
    kind: str = "infiniop"


@dataclass(frozen=True)
class Aclnn:
    """A CANN two-phase API: ``aclnn<name>GetWorkspaceSize(<args...>, &wsSize, &executor)`` then
    ``aclnn<name>(workspace, wsSize, executor, stream)``. Tensor args are ``aclTensor *``."""

    name: str
    header: str
    args: tuple[Arg, ...]
    const_stream: bool = False
    const_outputs: bool = False
    status: dict[str, str] = field(default_factory=lambda: dict(ACLNN_STATUS))
    kind: str = "aclnn"


@dataclass(frozen=True)
class Ttnn:
    """A ttnn-style Python function ``name(*positional, *, dtype=None, output_tensor=None, ...)``
    over the op; ``flatten`` lists tensors reshaped to the op's logical rank before the call, and
    ``output_shape`` the leading unit dims the returned output carries (e.g. (1, 1))."""

    name: str
    positional: tuple[Arg, ...]
    output: str
    output_lead: tuple[int, ...] = ()
    kind: str = "ttnn"


Facade = Infiniop | Aclnn | Ttnn
