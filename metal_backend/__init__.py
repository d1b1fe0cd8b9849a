"""Metal backend for tallow (not yet implemented)."""
