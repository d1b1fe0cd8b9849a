"""Text generation over any causal language model: a model with forward(ids, cache),
new_cache(), context_window, eos_token_ids and a tokenizer. It knows no model class,
so the models (CausalLM.generate/stream/chat) build on it and it never imports them.

    from tallow.generation import chat, generate, stream, generate_ids
    from tallow.generation import sequence, step   # continuous batching (batching.py)
"""
from .batching import sequence, step
from .chat_history import chat_prompt_ids, fit_history
from .decoding import (HISTORY_POLICIES, Sampler, Sequence, StopText, TextStream, chat, check_prompt_fits,
                       generate, generate_ids, stream)

__all__ = ["HISTORY_POLICIES", "Sampler", "Sequence", "StopText", "TextStream", "chat", "chat_prompt_ids",
           "check_prompt_fits", "fit_history", "generate", "generate_ids", "sequence", "step", "stream"]
