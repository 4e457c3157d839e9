"""The seed ops write every element of every output they do not read (tests/outputs_written.py):
the Python API allocates such outputs uninitialised. The ops written only in DSL files are checked
beside their builds (tests/test_new_op_backends.py, test_shapes_dsl.py, test_segments.py,
test_mlir.py)."""

from __future__ import annotations

import numpy as np

from opgen import registry, runtime
from tests.cpu_cases import eb_args, flce_args
from tests.outputs_written import assert_every_output_written, random_calls


def test_seed_ops_write_every_output_element() -> None:
    """Every seed op, random inputs for up to four dtype bindings at dims 16 and 37; FLCE on
    valid inputs in both modes (its random inputs lack the memory-saving statistics), and
    embedding_backward with its tables given (it accumulates into them when asked: read, so
    allocated zeroed and not compared)."""
    ops = registry.load_all()
    rng = np.random.default_rng(0)
    flce = "fused_linear_cross_entropy_loss_grad"
    calls = {flce: [flce_args(rng, T, M, "i64", mode) for T in ("f32", "bf16") for M in ("u8", "bool")
                    for mode in ("softmax", "memory_saving")],
             "embedding_backward": [eb_args(rng, T, "i32") for T in ("f32", "bf16")]}
    assert flce in ops and len(ops) >= 6
    assert_every_output_written(ops, runtime.load(), calls)
    assert all(random_calls(o) for o in ops.values())
