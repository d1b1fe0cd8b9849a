"""tallow.Tokenizer: one interface over the `tokenizers` library and the
pure-Python tokenizer (byte-level BPE, SentencePiece BPE with byte fallback,
Unigram), loaded from tokenizer.json or GGUF metadata ('gpt2' or 'llama')."""
import os

from ..errors import DTypeError, FormatError, IndexRangeError, UnsupportedError
from ..json_file import read_json
from . import chat_template, gguf_spm, hf_backend, timestamps
from .gguf_vocab import to_tokenizer_json
from .piece_cache import PieceCache
from .python_backend import PythonTokenizer
from .stream import StreamDecoder

BACKENDS = ("tokenizers", "python")
_ROLES = ("bos", "eos", "unk", "pad")
# Used only when no tokenizer_config.json names the special tokens.
_FALLBACK_NAMES = {"bos": ("<|begin_of_text|>", "<s>"), "eos": ("<|endoftext|>", "</s>", "<|end_of_text|>")}


def _make_backend(spec, backend, source):
    if backend in (None, "auto"):
        # A SentencePiece GGUF vocabulary without stored merges: the pure-Python BPE ranks pairs as
        # it meets them, where the library must be handed every merge (Gemma 3's 262,144 tokens:
        # ~280k merges, 3-4 s to list and parse at load); the ids are the same (tests compare).
        model = spec.get("model")
        derived = isinstance(model, dict) and isinstance(model.get("merges"), gguf_spm.DerivedMerges)
        backend = "tokenizers" if hf_backend.available() and not derived else "python"
    if backend == "tokenizers":
        return hf_backend.LibraryTokenizer(spec, source)
    if backend == "python":
        return PythonTokenizer(spec, source)
    raise UnsupportedError(f"unknown tokenizer backend {backend!r} (expected one of {', '.join(BACKENDS)} or None)")


def _token_id(value, op):
    """A token id as an int >= 0; anything else is a tallow error rather than a wrapped index."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise DTypeError(f"{op}: token ids must be integers, got {value!r:.40}")
    value = value.__index__()
    if value < 0:
        raise IndexRangeError(f"{op}: token id {value} is negative (ids run from 0 to the vocabulary size - 1)")
    return value


def _config_token(value):
    """tokenizer_config.json stores a token as a string or an AddedToken dict; anything
    else names no token (the fallback names are tried)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Text <-> token ids. Build with `from_file`, `from_gguf` or `from_dict`."""

    def __init__(self, spec, backend=None, special_ids=None, chat_template=None, source="tokenizer.json"):
        self.source = source
        self._impl = _make_backend(spec, backend, source)
        self.special_tokens = {d["content"]: self._impl.token_to_id(d["content"])
                               for d in spec.get("added_tokens") or [] if d.get("special")}
        self._special_ids = dict(special_ids or {})
        self.chat_template = chat_template
        self._timestamp_begin = timestamps.timestamp_begin(self._impl)
        self._pieces = PieceCache(self._impl, spec.get("added_tokens") or [])

    # construction -------------------------------------------------------

    @classmethod
    def from_dict(cls, spec, backend=None, config=None, source="tokenizer.json"):
        """A parsed tokenizer.json; `config` is an optional parsed tokenizer_config.json."""
        if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
            raise FormatError(f"{source}: not a tokenizer.json (no 'model' object)")
        config = config or {}
        vocab = spec["model"].get("vocab") or {}
        added_list = spec.get("added_tokens") or []
        if not isinstance(added_list, list) or not all(
                isinstance(d, dict) and isinstance(d.get("content"), str) and type(d.get("id")) is int and d["id"] >= 0
                for d in added_list):
            raise FormatError(f"{source}: added_tokens must be a list of {{'id': int >= 0, 'content': str, ...}}")
        added = {d["content"]: d["id"] for d in added_list}

        def lookup(token):
            return added.get(token, vocab.get(token) if isinstance(vocab, dict) else None)

        special_ids = {}
        for role in _ROLES:
            name = _config_token(config.get(f"{role}_token"))
            candidates = (name,) if name else _FALLBACK_NAMES.get(role, ())
            for c in candidates:
                tid = lookup(c)
                if tid is not None:
                    special_ids[role] = tid
                    break
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        if template is not None and not isinstance(template, str):
            raise FormatError(f"{source}: chat_template = {template!r:.80}: must be a string "
                              f"(or a list of {{'name', 'template'}})")
        return cls(spec, backend, special_ids, template, source)

    @classmethod
    def from_file(cls, path, backend=None):
        """tokenizer.json (or a folder holding one); a tokenizer_config.json
        beside it supplies the chat template and bos/eos/pad names."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        if not os.path.exists(path):
            raise FormatError(f"{path}: no such tokenizer file")
        spec = read_json(path)
        config = None
        config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        if os.path.exists(config_path):
            config = read_json(config_path)
            if not isinstance(config, dict):
                raise FormatError(f"{config_path}: must be a JSON object")
        return cls.from_dict(spec, backend, config, source=path)

    @classmethod
    def from_gguf(cls, gguf, backend=None):
        """A .gguf path, a file opened with tallow.io.open, or its metadata as a
        dict (key -> value, arrays as lists)."""
        return cls.gguf_builder(gguf, backend)()

    @classmethod
    def gguf_builder(cls, gguf, backend=None):
        """from_gguf in two halves: the metadata read and checked now (a bad vocabulary is refused
        here, ~0.05 s for 151k tokens), and a function that builds the tokenizer (the backend's
        merge and vocabulary maps, ~0.4 s) when called (load_model calls it on first use)."""
        if isinstance(gguf, dict):
            meta, source = gguf, "GGUF metadata"
        elif hasattr(gguf, "metadata"):
            meta, source = gguf.metadata, getattr(gguf, "path", "GGUF file")
        else:
            from .. import io
            source = os.fspath(gguf)
            with io.open(source, format="gguf") as f:
                meta = f.metadata
        spec, special_ids, template = to_tokenizer_json(meta, source)
        return lambda: cls(spec, backend, special_ids, template, source)

    # the interface ------------------------------------------------------

    @property
    def backend(self):
        """'tokenizers' or 'python': which implementation runs."""
        return self._impl.name

    @property
    def vocab_size(self):
        return self._impl.size

    def encode(self, text, add_special_tokens=True, limit=None):
        """Token ids of `text`. With `limit`, None when there would be more than `limit`
        ids: the work stops soon after the limit, not at the end of a huge text."""
        if not isinstance(text, str):
            raise FormatError(f"encode expects a str, got {type(text).__name__}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise DTypeError(f"encode: limit must be an int >= 0 or None, got {limit!r:.40}")
        return self._impl.encode(text, add_special_tokens, limit)

    def encode_reusing(self, text, limit=None):
        """encode(text, add_special_tokens=False, limit), reusing the ids of the pieces between
        added tokens that earlier calls met: a chat history re-rendered every turn costs only
        its new text (see piece_cache.py)."""
        if not isinstance(text, str):
            raise FormatError(f"encode expects a str, got {type(text).__name__}")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
            raise DTypeError(f"encode: limit must be an int >= 0 or None, got {limit!r:.40}")
        return self._pieces.encode(text, limit)

    def decode(self, ids, skip_special_tokens=False, decode_with_timestamps=False):
        """Text of token ids. Whisper's timestamp ids are dropped, or written as "<|1.02|>"
        with decode_with_timestamps=True (see timestamps.py)."""
        ids = [_token_id(i, "decode") for i in ids]
        begin = self._timestamp_begin
        if begin is None or not any(i >= begin for i in ids):
            return self._impl.decode(ids, skip_special_tokens)
        return timestamps.decode(lambda run: self._impl.decode(run, skip_special_tokens), ids, begin,
                                 decode_with_timestamps)

    def token_to_id(self, token):
        """The id of a token string, or None."""
        return self._impl.token_to_id(token)

    def id_to_token(self, token_id):
        """The token string of an id, or None."""
        return self._impl.id_to_token(_token_id(token_id, "id_to_token"))

    def stream_decoder(self, skip_special_tokens=False):
        """A StreamDecoder: `.step(id) -> str` of newly completed text, `.flush()`."""
        return StreamDecoder(self, skip_special_tokens)

    def _role_token(self, role):
        tid = self._special_ids.get(role)
        return None if tid is None else self.id_to_token(tid)

    bos_id = property(lambda self: self._special_ids.get("bos"))
    eos_id = property(lambda self: self._special_ids.get("eos"))
    pad_id = property(lambda self: self._special_ids.get("pad"))
    unk_id = property(lambda self: self._special_ids.get("unk"))
    bos_token = property(lambda self: self._role_token("bos"))
    eos_token = property(lambda self: self._role_token("eos"))
    pad_token = property(lambda self: self._role_token("pad"))
    unk_token = property(lambda self: self._role_token("unk"))

    def apply_chat_template(self, messages, add_generation_prompt=True, template=None, **kwargs):
        """Render the conversation with the model's chat template (jinja2)."""
        source = template or self.chat_template
        if source is None:
            raise FormatError(f"{self.source}: has no chat template; pass template=...")
        names = {f"{role}_token": self._role_token(role) for role in _ROLES}
        names = {k: v for k, v in names.items() if v is not None}
        return chat_template.render(source, messages, add_generation_prompt, names, origin=self.source, **kwargs)

    def __repr__(self):
        return f"Tokenizer({self.source!r}, backend={self.backend!r}, vocab_size={self.vocab_size})"
