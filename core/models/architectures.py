"""The decoder architectures tallow runs, by config.json model_type: the module and
class that implement each, and the switches a model_type implies that its config
does not spell out. A Llama-like architecture is one entry here (and its GGUF
names in gguf_names.py)."""
import importlib

from ..errors import UnsupportedError

DECODERS = {
    # model_type: (module in tallow.models, class, implied switches)
    "llama": ("llama", "LlamaForCausalLM", {}),
    "qwen2": ("llama", "LlamaForCausalLM", {"qkv_bias": True}),
    "qwen3": ("llama", "LlamaForCausalLM", {"qk_norm": True}),
    "phi": ("phi", "PhiForCausalLM", {}),
    "phi3": ("phi3", "Phi3ForCausalLM", {}),
    "gemma3_text": ("gemma3", "Gemma3ForCausalLM", {}),
}


def traits(model_type):
    """The switches a model_type implies (e.g. Qwen2's q/k/v biases)."""
    return DECODERS.get(model_type, (None, None, {}))[2]


def decoder_class(model_type, source):
    if model_type not in DECODERS:
        hint = ""
        if model_type == "gemma3":  # Gemma3ForConditionalGeneration (4B+ with vision)
            hint = " (multimodal Gemma 3: tallow runs the text-only gemma3_text checkpoints)"
        raise UnsupportedError(f"{source}: model_type {model_type!r} is not supported{hint} "
                               f"(supported: {', '.join(sorted(DECODERS))}, whisper)")
    module, name, _ = DECODERS[model_type]
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)
