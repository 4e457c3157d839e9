"""Pass pipelines, one per target: see :mod:`opgen.passes.pipeline`."""
