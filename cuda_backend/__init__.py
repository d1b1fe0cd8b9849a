"""CUDA backend for tallow (not yet implemented)."""
