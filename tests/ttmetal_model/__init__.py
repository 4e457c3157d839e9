"""A CPU model of the Ascend C subset opgen emits (see docs/ascendc_model.md and build.py)."""
