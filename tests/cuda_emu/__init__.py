"""A CPU model of the CUDA subset the generated kernels use (see cuda_emu.h)."""
