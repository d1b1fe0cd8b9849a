"""Runnable examples: `python -m tallow.examples.digits_mlp`."""
