"""Convert a CTranslate2 Whisper model (model.bin, "WhisperSpec") to the
Hugging Face layout: model.safetensors with the parameter names and shapes of
`transformers.WhisperForConditionalGeneration`, plus config.json.

CTranslate2 stacks the self-attention q/k/v (3d x d) in `linear_0` and the
cross-attention k/v (2d x d) in `linear_1`; Whisper has no key bias, so the
stored zero key biases are dropped. Weights keep their stored dtype (f16 for
the faster-whisper models; bf16 stays bf16); int8/int16-quantised weights are
dequantised to the model's float dtype. The output projection is tied to the decoder
token embedding, as in transformers, so it is not written separately.
Native only (needs numpy). tallow.convert (io/ctranslate2_convert.py) writes the folder.

Every tensor, config.json field and tokenizer.json entry read here is checked first
(present, rank, shape, dtype, scale): a damaged folder is one FormatError naming the
file and the field, not a KeyError or a broadcast error from numpy.
"""

from ..errors import FormatError

_NORM = {"gamma": "weight", "beta": "bias"}
_FLOATS = ("f32", "f16", "bf16")


def _fail(ct2, name, problem):
    raise FormatError(f"{ct2.path}: tensor {name!r} {problem}; the file is damaged or is not a Whisper model")


def _entry(ct2, name):
    if name not in ct2:
        _fail(ct2, name, "is missing")
    return ct2[name]


def _ranked(ct2, name, rank):
    shape = _entry(ct2, name).shape
    if len(shape) != rank or 0 in shape:
        _fail(ct2, name, f"has shape {list(shape)}; expected {rank} non-zero dimensions")
    return shape


def _layer_count(ct2, side):
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in ct2:
        n += 1
    if n == 0:
        _fail(ct2, f"{side}/layer_0/ffn/linear_0/weight", "is missing (the model has no layers)")
    return n


def _heads(ct2, side, d_model):
    """The head count stored in `{side}/num_heads` (one positive integer dividing d_model);
    absent, Whisper's 64-wide heads."""
    import numpy as np

    name = f"{side}/num_heads"
    if name not in ct2:
        return max(d_model // 64, 1)
    value = ct2[name].numpy()
    if value.size != 1 or value.dtype.kind not in "iu" or not 0 < int(value.reshape(-1)[0]) <= d_model \
            or d_model % int(value.reshape(-1)[0]):
        shown = np.array2string(value.reshape(-1)[:8], separator=", ")
        _fail(ct2, name, f"holds {shown} ({ct2[name].dtype}); expected one integer head count dividing "
                         f"d_model {d_model}")
    return int(value.reshape(-1)[0])


class WhisperDims:
    """The sizes of the Whisper model in an open CTranslate2File, read from its anchor tensors
    and checked against each other; every other tensor is checked against them."""

    def __init__(self, ct2):
        if ct2.spec != "WhisperSpec":
            raise FormatError(f"{ct2.path}: spec is {ct2.spec!r}, expected 'WhisperSpec'; tallow convert "
                              "handles CTranslate2 Whisper models")
        self.d_model, self.n_mels, width = _ranked(ct2, "encoder/conv1/weight", 3)
        if width != 3:
            _fail(ct2, "encoder/conv1/weight", f"has kernel width {width}; Whisper's convolutions are 3 wide")
        self.vocab, d_dec = _ranked(ct2, "decoder/embeddings/weight", 2)
        if d_dec != self.d_model:
            _fail(ct2, "decoder/embeddings/weight", f"is {d_dec} wide; the encoder is {self.d_model} wide")
        self.n_source = _ranked(ct2, "encoder/position_encodings/encodings", 2)[0]
        self.n_target = _ranked(ct2, "decoder/position_encodings/encodings", 2)[0]
        self.encoder_ffn = _ranked(ct2, "encoder/layer_0/ffn/linear_0/weight", 2)[0]
        self.decoder_ffn = _ranked(ct2, "decoder/layer_0/ffn/linear_0/weight", 2)[0]
        self.encoder_layers, self.decoder_layers = _layer_count(ct2, "encoder"), _layer_count(ct2, "decoder")
        self.encoder_heads = _heads(ct2, "encoder", self.d_model)
        self.decoder_heads = _heads(ct2, "decoder", self.d_model)
        self.float_dtype = _entry(ct2, "encoder/layer_norm/gamma").dtype  # what unquantised tensors are
        if self.float_dtype not in _FLOATS:
            _fail(ct2, "encoder/layer_norm/gamma", f"is {self.float_dtype}; expected f32, f16 or bf16")


def _check_scale(ct2, name, value, scale):
    """A quantisation scale as CTranslate2 writes it: f32, one per row (int8) or one for
    the tensor (int16), finite and > 0 (q = round(w * scale))."""
    import numpy as np

    scale_name = f"{name}_scale"
    if scale.dtype.kind != "f":
        _fail(ct2, scale_name, f"is {ct2[scale_name].dtype}; a scale is floating point")
    if scale.shape not in ((), (1,), value.shape[:1]):
        _fail(ct2, scale_name, f"has shape {list(scale.shape)}; expected one scale per row of {name} "
                               f"({value.shape[0]}) or one for all of it")
    if not np.all(np.isfinite(scale) & (scale > 0)):
        _fail(ct2, scale_name, "holds a scale that is not a finite number > 0")


def whisper_state_dict(ct2):
    """{transformers parameter name: numpy array} from an open CTranslate2File."""
    import numpy as np  # lazily: this module imports in Pyodide, which may lack numpy

    dims = WhisperDims(ct2)
    d = dims.d_model
    out = {}
    to = {"f16": np.float16, "f32": np.float32}.get(dims.float_dtype, np.float32)  # bf16 bits: f32

    def array(ct2_name, shape):
        """The stored array, checked to be `shape`; a quantised weight (int8/int16 with a `_scale`)
        comes back as floats, q / scale, as CTranslate2 computes q = round(w * scale)."""
        entry = _entry(ct2, ct2_name)
        if entry.shape != tuple(shape):
            _fail(ct2, ct2_name, f"has shape {list(entry.shape)}; expected {list(shape)} for this model "
                                 f"(d_model {d})")
        value = entry.numpy()
        scale_name = f"{ct2_name}_scale"
        if scale_name not in ct2:
            if entry.dtype not in _FLOATS:
                _fail(ct2, ct2_name, f"is {entry.dtype} without a {scale_name}; not a quantisation tallow knows")
            return value
        scale = ct2[scale_name].numpy()
        _check_scale(ct2, ct2_name, value, scale)
        scale = scale.astype(np.float32)
        scale = scale.reshape(scale.shape + (1,) * (value.ndim - scale.ndim))  # per row, or one for all
        return (value.astype(np.float32) / scale).astype(to)

    def put(name, ct2_name, shape):
        out[name] = array(ct2_name, shape)

    def norm(prefix, ct2_prefix):
        for ct2_key, key in _NORM.items():
            put(f"{prefix}.{key}", f"{ct2_prefix}/{ct2_key}", (d,))

    def linear(prefix, ct2_prefix, rows, cols):
        put(f"{prefix}.weight", f"{ct2_prefix}/weight", (rows, cols))
        put(f"{prefix}.bias", f"{ct2_prefix}/bias", (rows,))

    def split(names, ct2_prefix):
        """Split a stacked projection; the key bias is dropped (it must be zero)."""
        parts = len(names)
        weight = array(f"{ct2_prefix}/weight", (parts * d, d))
        bias = array(f"{ct2_prefix}/bias", (parts * d,))
        for prefix, w, b in zip(names, np.split(weight, parts), np.split(bias, parts)):
            out[f"{prefix}.weight"] = w
            if prefix.endswith("k_proj"):
                if np.any(b != 0):
                    _fail(ct2, f"{ct2_prefix}/bias", "has a non-zero key bias; Whisper has none")
            else:
                out[f"{prefix}.bias"] = b

    def ffn(p, c, width):
        norm(f"{p}.final_layer_norm", f"{c}/ffn/layer_norm")
        linear(f"{p}.fc1", f"{c}/ffn/linear_0", width, d)
        linear(f"{p}.fc2", f"{c}/ffn/linear_1", d, width)

    enc, dec = "model.encoder", "model.decoder"
    put(f"{enc}.conv1.weight", "encoder/conv1/weight", (d, dims.n_mels, 3))
    put(f"{enc}.conv1.bias", "encoder/conv1/bias", (d,))
    put(f"{enc}.conv2.weight", "encoder/conv2/weight", (d, d, 3))
    put(f"{enc}.conv2.bias", "encoder/conv2/bias", (d,))
    put(f"{enc}.embed_positions.weight", "encoder/position_encodings/encodings", (dims.n_source, d))
    for i in range(dims.encoder_layers):
        p, c = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        norm(f"{p}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        split([f"{p}.self_attn.{x}_proj" for x in "qkv"], f"{c}/self_attention/linear_0")
        linear(f"{p}.self_attn.out_proj", f"{c}/self_attention/linear_1", d, d)
        ffn(p, c, dims.encoder_ffn)
    norm(f"{enc}.layer_norm", "encoder/layer_norm")

    put(f"{dec}.embed_tokens.weight", "decoder/embeddings/weight", (dims.vocab, d))
    put(f"{dec}.embed_positions.weight", "decoder/position_encodings/encodings", (dims.n_target, d))
    for i in range(dims.decoder_layers):
        p, c = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        norm(f"{p}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        split([f"{p}.self_attn.{x}_proj" for x in "qkv"], f"{c}/self_attention/linear_0")
        linear(f"{p}.self_attn.out_proj", f"{c}/self_attention/linear_1", d, d)
        norm(f"{p}.encoder_attn_layer_norm", f"{c}/attention/layer_norm")
        linear(f"{p}.encoder_attn.q_proj", f"{c}/attention/linear_0", d, d)
        split([f"{p}.encoder_attn.{x}_proj" for x in "kv"], f"{c}/attention/linear_1")
        linear(f"{p}.encoder_attn.out_proj", f"{c}/attention/linear_2", d, d)
        ffn(p, c, dims.decoder_ffn)
    norm(f"{dec}.layer_norm", "decoder/layer_norm")

    proj = ct2.aliases.get("decoder/projection/weight")
    if proj not in (None, "decoder/embeddings/weight"):
        raise FormatError(f"{ct2.path}: output projection is not tied to the token embedding; not supported")
    # bf16 travels as its uint16 bits (numpy has no bf16); the writers take it as a (dtype, shape, bytes) triple
    return {k: ("bf16", v.shape, np.ascontiguousarray(v)) if v.dtype == np.uint16 else v for k, v in out.items()}


class WhisperTokens:
    """The special tokens of a tokenizer.json dict, looked up with every entry the lookup
    reads checked: `added_tokens` a list of {"content": str, "id": int}, `model.vocab` an
    object of str -> int, every id found inside the model's vocabulary [0, vocab_size)."""

    def __init__(self, tokenizer, path="tokenizer.json", vocab_size=None):
        self.path, self.vocab_size = path, vocab_size
        added = tokenizer.get("added_tokens", [])
        if not isinstance(added, list):
            self._fail(f"added_tokens = {added!r:.80}: must be a list of {{\"content\": ..., \"id\": ...}} objects")
        self.added = []
        for i, tok in enumerate(added):
            if not (isinstance(tok, dict) and isinstance(tok.get("content"), str) and _is_id(tok.get("id"))):
                self._fail(f"added_tokens[{i}] = {tok!r:.80}: must be an object with a string \"content\" "
                           "and an integer \"id\" >= 0")
            self.added.append((tok["content"], tok["id"]))
        model = tokenizer.get("model", {})
        if not isinstance(model, dict):
            self._fail(f"model = {model!r:.80}: must be an object (the BPE model, with its \"vocab\")")
        self.vocab = model.get("vocab", {})
        if not isinstance(self.vocab, dict):
            self._fail(f"model.vocab = {self.vocab!r:.80}: must be an object of token -> id")

    def _fail(self, problem):
        raise FormatError(f"{self.path}: {problem}")

    def optional_id(self, content):
        for text, tid in self.added:
            if text == content:
                return self._checked(content, tid, "added_tokens")
        if content in self.vocab:
            tid = self.vocab[content]
            if not _is_id(tid):
                self._fail(f"model.vocab[{content!r}] = {tid!r:.80}: must be an integer id >= 0")
            return self._checked(content, tid, "model.vocab")
        return None

    def id(self, content):
        found = self.optional_id(content)
        if found is None:
            self._fail(f"has no token {content!r} (in added_tokens or model.vocab); it is not a Whisper tokenizer")
        return found

    def _checked(self, content, tid, where):
        if self.vocab_size is not None and tid >= self.vocab_size:
            self._fail(f"{where}: {content!r} has id {tid}, outside the model's vocabulary "
                       f"(decoder/embeddings/weight has {self.vocab_size} rows)")
        return tid


def _is_id(value):
    return type(value) is int and value >= 0


def _id_list(ct2_config, key, default, vocab, path):
    """A token id list from CTranslate2's config.json; null or absent: `default`."""
    value = ct2_config.get(key)
    if value is None:
        return list(default)
    if not isinstance(value, list) or not all(_is_id(i) and i < vocab for i in value):
        raise FormatError(f"{path}: {key!r} must be a list of token ids in [0, {vocab}), got {str(value)[:80]}")
    return list(value)


def _alignment_heads(ct2_config, layers, heads, path):
    """CTranslate2's alignment_heads: [[decoder layer, head], ...] within the model; absent: None."""
    value = ct2_config.get("alignment_heads")
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(
            isinstance(p, list) and len(p) == 2 and _is_id(p[0]) and _is_id(p[1]) and p[0] < layers and p[1] < heads
            for p in value):
        raise FormatError(f"{path}: 'alignment_heads' must be a list of [decoder layer, head] pairs within "
                          f"{layers} layers and {heads} heads, got {str(value)[:80]}")
    return [list(p) for p in value]


def whisper_config(ct2, tokenizer, ct2_config=None, tokenizer_path="tokenizer.json", config_path="config.json"):
    """transformers' WhisperConfig (as a dict) for the model in `ct2`, with the
    special token ids looked up in the tokenizer.json dict `tokenizer`. The paths name
    the files in error messages."""
    ct2_config = ct2_config or {}
    dims = WhisperDims(ct2)
    vocab, d_model = dims.vocab, dims.d_model
    tokens = WhisperTokens(tokenizer, tokenizer_path, vocab)
    eot = tokens.id("<|endoftext|>")
    sot = tokens.id("<|startoftranscript|>")
    no_ts = tokens.id("<|notimestamps|>")
    multilingual = vocab >= 51865  # the English-only models have one token fewer
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "activation_function": "gelu",
        "d_model": int(d_model),
        "vocab_size": int(vocab),
        "num_mel_bins": int(dims.n_mels),
        "encoder_layers": dims.encoder_layers,
        "decoder_layers": dims.decoder_layers,
        "num_hidden_layers": dims.encoder_layers,
        "encoder_attention_heads": dims.encoder_heads,
        "decoder_attention_heads": dims.decoder_heads,
        "encoder_ffn_dim": int(dims.encoder_ffn),
        "decoder_ffn_dim": int(dims.decoder_ffn),
        "max_source_positions": int(dims.n_source),
        "max_target_positions": int(dims.n_target),
        "max_length": int(dims.n_target),
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "use_cache": True,
        "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0,
        "encoder_layerdrop": 0.0, "decoder_layerdrop": 0.0, "init_std": 0.02,
        "bos_token_id": eot if multilingual else sot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "forced_decoder_ids": None if multilingual else [[1, no_ts]],
        "suppress_tokens": _id_list(ct2_config, "suppress_ids", [], vocab, config_path),
        "begin_suppress_tokens": _id_list(ct2_config, "suppress_ids_begin", [220, eot], vocab, config_path),
        "torch_dtype": {"f16": "float16", "bf16": "bfloat16"}.get(dims.float_dtype, "float32"),
    }


def _language_ids(tokens, sot, translate):
    """{"<|en|>": id, ...}: the tokens between <|startoftranscript|> and <|translate|>,
    where every Whisper vocabulary keeps its languages (large-v3 has one more)."""
    found = {text: tid for text, tid in tokens.added if sot < tid < translate}
    if not found:
        raise FormatError(f"{tokens.path}: has no language tokens between <|startoftranscript|> ({sot}) "
                          f"and <|translate|> ({translate}); it does not match a multilingual Whisper model")
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


def whisper_generation_config(config, tokenizer, ct2_config=None, tokenizer_path="tokenizer.json",
                              config_path="config.json"):
    """generation_config.json for transformers' Whisper generate(), with the fields
    openai/whisper-* ship: without lang_to_id/task_to_id transformers refuses
    generate(language=..., task=...) ("generation config is outdated")."""
    ct2_config = ct2_config or {}
    tokens = WhisperTokens(tokenizer, tokenizer_path, config["vocab_size"])
    multilingual = config["vocab_size"] >= 51865
    gen = {
        "decoder_start_token_id": config["decoder_start_token_id"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "max_length": config["max_target_positions"],
        "suppress_tokens": config["suppress_tokens"],
        "begin_suppress_tokens": config["begin_suppress_tokens"],
        "no_timestamps_token_id": tokens.id("<|notimestamps|>"),
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": 50,  # openai-whisper's 1.0 s limit on the first timestamp
        "return_timestamps": False,
    }
    prev_sot = tokens.optional_id("<|startofprev|>")
    if prev_sot is not None:
        gen["prev_sot_token_id"] = prev_sot
    # unknown: left out, transformers then uses its own default
    heads = _alignment_heads(ct2_config, config["decoder_layers"], config["decoder_attention_heads"], config_path)
    if heads:
        gen["alignment_heads"] = heads
    if multilingual:
        translate, transcribe = tokens.id("<|translate|>"), tokens.id("<|transcribe|>")
        gen["lang_to_id"] = _language_ids(tokens, config["decoder_start_token_id"], translate)
        gen["task_to_id"] = {"translate": translate, "transcribe": transcribe}
        gen["forced_decoder_ids"] = [[1, None], [2, transcribe]]  # language detected, transcribe
    elif config["forced_decoder_ids"]:
        gen["forced_decoder_ids"] = config["forced_decoder_ids"]
    return gen


PREPROCESSOR_CONFIG = {
    "feature_extractor_type": "WhisperFeatureExtractor",
    "processor_class": "WhisperProcessor",
    "feature_size": 80, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30,
    "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000,
    "padding_side": "right", "padding_value": 0.0, "return_attention_mask": False,
}
