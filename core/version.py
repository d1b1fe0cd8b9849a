"""tallow's version, on its own so the command line can print it without the package facade."""
__version__ = "0.1.0"
