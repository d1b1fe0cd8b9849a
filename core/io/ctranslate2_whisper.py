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
"""

from ..errors import FormatError

_NORM = {"gamma": "weight", "beta": "bias"}


def _layer_count(ct2, side):
    n = 0
    while f"{side}/layer_{n}/ffn/linear_0/weight" in ct2:
        n += 1
    return n


def _scalar(ct2, name, default):
    return int(ct2[name].numpy().item()) if name in ct2 else default


def whisper_state_dict(ct2):
    """{transformers parameter name: numpy array} from an open CTranslate2File."""
    import numpy as np  # lazily: this module imports in Pyodide, which may lack numpy

    if ct2.spec != "WhisperSpec":
        raise FormatError(f"{ct2.path}: spec is {ct2.spec!r}, expected 'WhisperSpec'; tallow convert "
                          "handles CTranslate2 Whisper models")
    out = {}
    float_dtype = ct2["encoder/layer_norm/gamma"].numpy().dtype  # what the unquantised tensors are stored as

    def array(ct2_name):
        """The stored array; a quantised weight (int8/int16 with a `_scale`) comes back as
        floats, q / scale, as CTranslate2 computes q = round(w * scale)."""
        value = ct2[ct2_name].numpy()
        scale_name = f"{ct2_name}_scale"
        if scale_name not in ct2:
            if value.dtype.kind == "i":
                raise FormatError(f"{ct2.path}: {ct2_name} is {value.dtype} without a {scale_name}; "
                                  "not a quantisation tallow knows")
            return value
        scale = ct2[scale_name].numpy().astype(np.float32)
        scale = scale.reshape(scale.shape + (1,) * (value.ndim - scale.ndim))  # per row, or one for all
        to = float_dtype if float_dtype in (np.float16, np.float32) else np.float32  # bf16 bits: f32
        return (value.astype(np.float32) / scale).astype(to)

    def put(name, ct2_name):
        out[name] = array(ct2_name)

    def norm(prefix, ct2_prefix):
        for ct2_key, key in _NORM.items():
            put(f"{prefix}.{key}", f"{ct2_prefix}/{ct2_key}")

    def linear(prefix, ct2_prefix):
        put(f"{prefix}.weight", f"{ct2_prefix}/weight")
        put(f"{prefix}.bias", f"{ct2_prefix}/bias")

    def split(names, ct2_prefix):
        """Split a stacked projection; names[i] None for a part that is dropped
        (the key bias, which must be zero)."""
        weight, bias = array(f"{ct2_prefix}/weight"), array(f"{ct2_prefix}/bias")
        parts = len(names)
        if weight.shape[0] % parts or bias.shape[0] != weight.shape[0]:
            raise FormatError(f"{ct2.path}: {ct2_prefix} {weight.shape} does not stack {parts} projections")
        for prefix, w, b in zip(names, np.split(weight, parts), np.split(bias, parts)):
            out[f"{prefix}.weight"] = w
            if prefix.endswith("k_proj"):
                if np.any(b != 0):
                    raise FormatError(f"{ct2.path}: {ct2_prefix} has a non-zero key bias; Whisper has none")
            else:
                out[f"{prefix}.bias"] = b

    enc, dec = "model.encoder", "model.decoder"
    for conv in ("conv1", "conv2"):
        linear(f"{enc}.{conv}", f"encoder/{conv}")
    put(f"{enc}.embed_positions.weight", "encoder/position_encodings/encodings")
    for i in range(_layer_count(ct2, "encoder")):
        p, c = f"{enc}.layers.{i}", f"encoder/layer_{i}"
        norm(f"{p}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        split([f"{p}.self_attn.{x}_proj" for x in "qkv"], f"{c}/self_attention/linear_0")
        linear(f"{p}.self_attn.out_proj", f"{c}/self_attention/linear_1")
        norm(f"{p}.final_layer_norm", f"{c}/ffn/layer_norm")
        linear(f"{p}.fc1", f"{c}/ffn/linear_0")
        linear(f"{p}.fc2", f"{c}/ffn/linear_1")
    norm(f"{enc}.layer_norm", "encoder/layer_norm")

    put(f"{dec}.embed_tokens.weight", "decoder/embeddings/weight")
    put(f"{dec}.embed_positions.weight", "decoder/position_encodings/encodings")
    for i in range(_layer_count(ct2, "decoder")):
        p, c = f"{dec}.layers.{i}", f"decoder/layer_{i}"
        norm(f"{p}.self_attn_layer_norm", f"{c}/self_attention/layer_norm")
        split([f"{p}.self_attn.{x}_proj" for x in "qkv"], f"{c}/self_attention/linear_0")
        linear(f"{p}.self_attn.out_proj", f"{c}/self_attention/linear_1")
        norm(f"{p}.encoder_attn_layer_norm", f"{c}/attention/layer_norm")
        linear(f"{p}.encoder_attn.q_proj", f"{c}/attention/linear_0")
        split([f"{p}.encoder_attn.{x}_proj" for x in "kv"], f"{c}/attention/linear_1")
        linear(f"{p}.encoder_attn.out_proj", f"{c}/attention/linear_2")
        norm(f"{p}.final_layer_norm", f"{c}/ffn/layer_norm")
        linear(f"{p}.fc1", f"{c}/ffn/linear_0")
        linear(f"{p}.fc2", f"{c}/ffn/linear_1")
    norm(f"{dec}.layer_norm", "decoder/layer_norm")

    proj = ct2.aliases.get("decoder/projection/weight")
    if proj not in (None, "decoder/embeddings/weight"):
        raise FormatError(f"{ct2.path}: output projection is not tied to the token embedding; not supported")
    # bf16 travels as its uint16 bits (numpy has no bf16); the writers take it as a (dtype, shape, bytes) triple
    return {k: ("bf16", v.shape, np.ascontiguousarray(v)) if v.dtype == np.uint16 else v for k, v in out.items()}


def _token_id(tokenizer, content):
    for tok in tokenizer.get("added_tokens", []):
        if tok["content"] == content:
            return tok["id"]
    found = tokenizer.get("model", {}).get("vocab", {}).get(content)
    if found is None:
        raise FormatError(f"tokenizer.json has no token {content!r}")
    return found


def _id_list(ct2_config, key, default, vocab):
    """A token id list from CTranslate2's config.json; null or absent: `default`."""
    value = ct2_config.get(key)
    if value is None:
        return list(default)
    if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab
                                              for i in value):
        raise FormatError(f"config.json: {key!r} must be a list of token ids in [0, {vocab}), got {str(value)[:80]}")
    return list(value)


def whisper_config(ct2, tokenizer, ct2_config=None):
    """transformers' WhisperConfig (as a dict) for the model in `ct2`, with the
    special token ids looked up in the tokenizer.json dict `tokenizer`."""
    ct2_config = ct2_config or {}
    vocab, d_model = ct2["decoder/embeddings/weight"].shape
    eot = _token_id(tokenizer, "<|endoftext|>")
    sot = _token_id(tokenizer, "<|startoftranscript|>")
    no_ts = _token_id(tokenizer, "<|notimestamps|>")
    multilingual = vocab >= 51865  # the English-only models have one token fewer
    return {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "activation_function": "gelu",
        "d_model": int(d_model),
        "vocab_size": int(vocab),
        "num_mel_bins": int(ct2["encoder/conv1/weight"].shape[1]),
        "encoder_layers": _layer_count(ct2, "encoder"),
        "decoder_layers": _layer_count(ct2, "decoder"),
        "num_hidden_layers": _layer_count(ct2, "encoder"),
        "encoder_attention_heads": _scalar(ct2, "encoder/num_heads", d_model // 64),
        "decoder_attention_heads": _scalar(ct2, "decoder/num_heads", d_model // 64),
        "encoder_ffn_dim": int(ct2["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "decoder_ffn_dim": int(ct2["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
        "max_source_positions": int(ct2["encoder/position_encodings/encodings"].shape[0]),
        "max_target_positions": int(ct2["decoder/position_encodings/encodings"].shape[0]),
        "max_length": int(ct2["decoder/position_encodings/encodings"].shape[0]),
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
        "suppress_tokens": _id_list(ct2_config, "suppress_ids", [], vocab),
        "begin_suppress_tokens": _id_list(ct2_config, "suppress_ids_begin", [220, eot], vocab),
        "torch_dtype": {"f16": "float16", "bf16": "bfloat16"}.get(ct2["encoder/layer_norm/gamma"].dtype, "float32"),
    }


def _optional_id(tokenizer, content):
    try:
        return _token_id(tokenizer, content)
    except FormatError:
        return None


def _language_ids(tokenizer, sot, translate):
    """{"<|en|>": id, ...}: the tokens between <|startoftranscript|> and <|translate|>,
    where every Whisper vocabulary keeps its languages (large-v3 has one more)."""
    found = {t["content"]: t["id"] for t in tokenizer.get("added_tokens", []) if sot < t["id"] < translate}
    if not found:
        raise FormatError(f"tokenizer.json has no language tokens between <|startoftranscript|> ({sot}) "
                          f"and <|translate|> ({translate}); it does not match a multilingual Whisper model")
    return dict(sorted(found.items(), key=lambda kv: kv[1]))


def whisper_generation_config(config, tokenizer, ct2_config=None):
    """generation_config.json for transformers' Whisper generate(), with the fields
    openai/whisper-* ship: without lang_to_id/task_to_id transformers refuses
    generate(language=..., task=...) ("generation config is outdated")."""
    ct2_config = ct2_config or {}
    multilingual = config["vocab_size"] >= 51865
    gen = {
        "decoder_start_token_id": config["decoder_start_token_id"],
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": config["eos_token_id"],
        "pad_token_id": config["pad_token_id"],
        "max_length": config["max_target_positions"],
        "suppress_tokens": config["suppress_tokens"],
        "begin_suppress_tokens": config["begin_suppress_tokens"],
        "no_timestamps_token_id": _token_id(tokenizer, "<|notimestamps|>"),
        "is_multilingual": multilingual,
        "max_initial_timestamp_index": 50,  # openai-whisper's 1.0 s limit on the first timestamp
        "return_timestamps": False,
    }
    prev_sot = _optional_id(tokenizer, "<|startofprev|>")
    if prev_sot is not None:
        gen["prev_sot_token_id"] = prev_sot
    # unknown: left out, transformers then uses its own default
    if isinstance(ct2_config.get("alignment_heads"), list) and ct2_config["alignment_heads"]:
        gen["alignment_heads"] = [list(pair) for pair in ct2_config["alignment_heads"]]
    if multilingual:
        translate, transcribe = _token_id(tokenizer, "<|translate|>"), _token_id(tokenizer, "<|transcribe|>")
        gen["lang_to_id"] = _language_ids(tokenizer, config["decoder_start_token_id"], translate)
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
