"""Tokenizers: `Tokenizer` wraps the `tokenizers` library when it imports and
otherwise runs a pure-Python BPE / Unigram giving the same ids (Pyodide)."""
from .chat_template import ChatTemplateError
from .stream import StreamDecoder
from .tokenizer import Tokenizer

__all__ = ["Tokenizer", "StreamDecoder", "ChatTemplateError"]
