"""Ready models: llama (Llama, SmolLM2, Qwen2), phi, phi3, whisper.
`load_model` picks the implementation from the config or GGUF metadata."""


def load_model(name_or_path, device=None, dtype=None):
    """See tallow.models.loader.load_model."""
    from .loader import load_model as _load
    return _load(name_or_path, device=device, dtype=dtype)


__all__ = ["load_model"]
