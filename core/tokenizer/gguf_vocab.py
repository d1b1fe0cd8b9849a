"""GGUF tokenizer metadata -> the equivalent tokenizer.json description.

Both backends then run the same description: the `tokenizers` library via
`Tokenizer.from_str`, the pure-Python one directly. The pre-tokenizer is
chosen by `tokenizer.ggml.pre`, following llama.cpp's table (llama-vocab.cpp)
written as the tokenizer.json components the original Hugging Face
tokenizers use.
"""
from ..config_fields import Fields
from ..errors import FormatError, UnsupportedError
from . import gguf_spm

_LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex):
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _split_then_bytes(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        _byte_level(False),
    ]}


_GPT2 = _byte_level(True)
_DIGITS_GPT2 = {"type": "Sequence", "pretokenizers": [
    {"type": "Digits", "individual_digits": True}, _byte_level(True)]}
_LLAMA3 = _split_then_bytes(_LLAMA3_PATTERN)
_QWEN2 = _split_then_bytes(_QWEN2_PATTERN)

# tokenizer.ggml.pre -> (pre_tokenizer, normalizer, ignore_merges, default add_bos)
PRE_TOKENIZERS = {
    "gpt2": (_GPT2, None, False, False),
    "gpt-2": (_GPT2, None, False, False),
    "phi-2": (_GPT2, None, False, False),  # what llama.cpp writes for Phi-2 (GPT-2's pre-tokenizer)
    "mpt": (_GPT2, None, False, False),
    "olmo": (_GPT2, None, False, False),
    "jais": (_GPT2, None, False, False),
    "smollm": (_DIGITS_GPT2, None, False, False),
    "starcoder": (_DIGITS_GPT2, None, False, False),
    "refact": (_DIGITS_GPT2, None, False, False),
    "codeshell": (_DIGITS_GPT2, None, False, False),
    "llama-bpe": (_LLAMA3, None, True, True),
    "llama3": (_LLAMA3, None, True, True),
    "llama-v3": (_LLAMA3, None, True, True),
    "qwen2": (_QWEN2, {"type": "NFC"}, False, False),
}

_SPECIAL_KEYS = ("bos", "eos", "unknown", "padding", "eot", "eom", "sep", "cls", "mask")
_CONTROL, _USER_DEFINED, _UNKNOWN = 3, 4, 2


def special_token_ids(meta, source="GGUF metadata"):
    """{"bos": id, "eos": id, "unk": id, "pad": id, ...} from GGUF keys that are present,
    each checked to be an id of the vocabulary (tokenizer.ggml.tokens)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    fields = Fields(meta, source, "tokenizer.ggml.")
    out = {}
    for key in _SPECIAL_KEYS:
        tid = fields.token_id(f"{key}_token_id", len(tokens) if isinstance(tokens, list) else 0)
        if tid is not None:
            out[{"unknown": "unk", "padding": "pad"}.get(key, key)] = tid
    return out


def _all_strings(values):
    """Whether every value is a str (the exact type checked at C speed: 100k-entry vocabularies)."""
    return set(map(type, values)) <= {str} or all(isinstance(v, str) for v in values)


def _string_list(meta, key, source, allow_empty=False):
    value = meta.get(key)
    if not isinstance(value, list) or not _all_strings(value) or not (value or allow_empty):
        raise FormatError(f"{source}: {key} = {value!r:.80}: must be a{'' if allow_empty else ' non-empty'} "
                          f"array of strings")
    return value


def to_tokenizer_json(meta, source="GGUF metadata"):
    """GGUF metadata dict -> (tokenizer.json dict, {"bos": id, ...}, chat_template or None)."""
    model = meta.get("tokenizer.ggml.model")
    if model is None:
        raise FormatError(f"{source}: no tokenizer.ggml.model key, so it holds no tokenizer")
    if model not in ("gpt2", "llama"):
        raise UnsupportedError(f"{source}: GGUF tokenizer model {model!r} is not supported "
                               f"(byte-level BPE 'gpt2' and SentencePiece 'llama' are)")
    tokens = _string_list(meta, "tokenizer.ggml.tokens", source)
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not isinstance(types, list) or not set(map(type, types)) <= {int}:
        raise FormatError(f"{source}: tokenizer.ggml.token_type = {types!r:.80}: must be an array of integers")
    if len(types) != len(tokens):
        raise FormatError(f"{source}: {len(types)} token types for {len(tokens)} tokens")

    vocab = dict(zip(tokens, range(len(tokens))))  # at C speed: 262,144-token vocabularies
    if len(vocab) != len(tokens):
        vocab = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)  # a duplicated string keeps its first id, like llama.cpp
    if model == "llama":
        model_spec, normalizer, pre_tokenizer, decoder = gguf_spm.components(meta, tokens, vocab, source)
        default_bos = True  # llama.cpp adds bos to SentencePiece text unless the file says not to
    else:
        model_spec, normalizer, pre_tokenizer, decoder, default_bos = _byte_level_components(meta, vocab, source)
    added = [
        {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": ty != _USER_DEFINED}
        for i, t, ty in ((i, tokens[i], types[i]) for i, ty in enumerate(types)
                         if ty == _CONTROL or ty == _USER_DEFINED or ty == _UNKNOWN)
    ]
    special = special_token_ids(meta, source)
    template = []
    if meta.get("tokenizer.ggml.add_bos_token", default_bos) and "bos" in special:
        template.append({"SpecialToken": {"id": tokens[special["bos"]], "type_id": 0}})
    template.append({"Sequence": {"id": "A", "type_id": 0}})
    if meta.get("tokenizer.ggml.add_eos_token", False) and "eos" in special:
        template.append({"SpecialToken": {"id": tokens[special["eos"]], "type_id": 0}})
    special_map = {
        tokens[special[k]]: {"id": tokens[special[k]], "ids": [special[k]], "tokens": [tokens[special[k]]]}
        for k in ("bos", "eos") if k in special
    }
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "TemplateProcessing", "single": template,
                           "pair": template + [{"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": special_map},
        "decoder": decoder,
        "model": model_spec,
    }
    chat = meta.get("tokenizer.chat_template")
    if chat is not None and not isinstance(chat, str):
        raise FormatError(f"{source}: tokenizer.chat_template = {chat!r:.80}: must be a string")
    return spec, special, chat


def _byte_level_components(meta, vocab, source):
    """(model, normalizer, pre_tokenizer, decoder, default add_bos) of a byte-level BPE vocabulary."""
    merges = _string_list(meta, "tokenizer.ggml.merges", source, allow_empty=True)
    pre = meta.get("tokenizer.ggml.pre", "gpt2")
    if not isinstance(pre, str) or pre not in PRE_TOKENIZERS:
        raise UnsupportedError(f"{source}: pre-tokenizer {pre!r} is not supported "
                               f"(known: {', '.join(sorted(PRE_TOKENIZERS))})")
    pre_tokenizer, normalizer, ignore_merges, default_bos = PRE_TOKENIZERS[pre]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
             "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}
    decoder = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    return model, normalizer, pre_tokenizer, decoder, default_bos
