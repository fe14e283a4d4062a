"""Oceanus: an inference server that speaks NVIDIA Triton's protocols."""

__version__ = "0.1.0"
