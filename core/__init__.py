"""tallow: a minimalist ML framework for the browser and edge boxes."""
__version__ = "0.1.0"
