"""opgen's kernels from PyTorch (``pip install opgen[torch]``).

* ``torch.ops.opgen.<op>``: every op of the ops directory as a custom op with a fake
  implementation (:mod:`opgen.torch.ops`), registered when this module is imported.
* Drop-in functions whose backward runs opgen's kernels (:mod:`opgen.torch.functional`):
  :func:`embedding`, :func:`rms_norm`, :func:`fused_linear_cross_entropy`, and the vocab-parallel
  form :func:`vocab_parallel_fused_linear_cross_entropy` over ``torch.distributed``.
"""

from opgen.torch.ops import register

register()

from opgen.torch.functional import (  # noqa: E402 - after the ops they call are registered
    embedding,
    fused_linear_cross_entropy,
    rms_norm,
    vocab_parallel_fused_linear_cross_entropy,
)

__all__ = ["embedding", "fused_linear_cross_entropy", "register", "rms_norm",
           "vocab_parallel_fused_linear_cross_entropy"]
