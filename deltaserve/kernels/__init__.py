"""Kernels: plain functions over tensors. Each op holds its pure-PyTorch reference (the CPU path) and, for the
GPU path, its Triton kernel beside it."""
