"""Ready models: llama (Llama 2/3/3.2, SmolLM2, Qwen2, Qwen3), phi, phi3, gemma3_text, whisper.
`load_model` picks the implementation from the config or GGUF metadata."""


def load_model(name_or_path, device=None, dtype=None):
    """See tallow.models.loader.load_model."""
    from .loader import load_model as _load
    return _load(name_or_path, device=device, dtype=dtype)


__all__ = ["load_model"]
