"""Whisper speech recognition (any size, English-only or multilingual) on the
public tensor / functional / nn API, so one implementation runs on every device.

    model = tallow.models.whisper.load("whisper-tiny.en")      # or a HF-layout directory
    result = model.transcribe("speech.wav")                     # .text, .segments, .language

Weights use transformers' WhisperForConditionalGeneration names
(model.encoder.conv1.weight, model.decoder.layers.0.encoder_attn.k_proj.weight, ...),
the config transformers' WhisperConfig fields. The architecture:
encoder = conv1 + GELU, conv2 (stride 2) + GELU, + positions, pre-LN blocks, LN;
decoder = tokens + learned positions, pre-LN blocks of causal self-attention
(KV cache) and cross-attention (encoder K/V computed once per audio), LN,
logits through the tied token embedding.
"""
import math
import os
from pathlib import Path

from .. import dtypes as D
from .. import functional as F
from ..config_fields import MAX_COUNT, Fields
from ..creation import tensor
from ..device import Device, default_device
from ..errors import Error, FormatError, IndexRangeError, ShapeError
from ..json_file import read_json
from ..nn import Conv1d, Embedding, FusedLinear, KVCache, LayerNorm, Linear, Module, VarBuilder
from ..step_capture import StepReplays

_ACTIVATIONS = {
    "gelu": lambda x: x.gelu(),
    "gelu_new": lambda x: x.gelu("tanh"),
    "gelu_pytorch_tanh": lambda x: x.gelu("tanh"),
    "relu": lambda x: x.relu(),
}
# The same activations as unary op names, for the decoder's fc1 fused with its norm.
_ACTIVATION_OPS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


class WhisperConfig:
    """The fields of transformers' WhisperConfig that inference needs."""

    def __init__(self, d, source="config.json"):
        if not isinstance(d, dict):
            raise FormatError(f"{source}: a config must be a JSON object")
        f = Fields(d, source)
        self.d_model = f.int("d_model", lo=1, hi=MAX_COUNT)
        self.encoder_layers = f.int("encoder_layers", lo=1, hi=MAX_COUNT)
        self.decoder_layers = f.int("decoder_layers", lo=1, hi=MAX_COUNT)
        self.encoder_heads = f.int("encoder_attention_heads", lo=1, hi=self.d_model)
        self.decoder_heads = f.int("decoder_attention_heads", lo=1, hi=self.d_model)
        self.encoder_ffn_dim = f.int("encoder_ffn_dim", 4 * self.d_model, lo=1, hi=MAX_COUNT)
        self.decoder_ffn_dim = f.int("decoder_ffn_dim", 4 * self.d_model, lo=1, hi=MAX_COUNT)
        self.num_mel_bins = f.int("num_mel_bins", 80, lo=1, hi=MAX_COUNT)
        self.max_source_positions = f.int("max_source_positions", 1500, lo=1, hi=MAX_COUNT)
        self.max_target_positions = f.int("max_target_positions", 448, lo=1, hi=MAX_COUNT)
        self.vocab_size = f.int("vocab_size", lo=1, hi=MAX_COUNT)
        self.activation = f.str("activation_function", "gelu", choices=_ACTIVATIONS)
        for key, heads in (("encoder_attention_heads", self.encoder_heads),
                           ("decoder_attention_heads", self.decoder_heads)):
            if self.d_model % heads:
                f.fail(key, heads, f"a divisor of d_model ({self.d_model})")
        # suppress lists may name ids past the vocabulary (decoding drops those), but must be ids
        self.suppress_tokens = self._id_list(f, "suppress_tokens")
        self.begin_suppress_tokens = self._id_list(f, "begin_suppress_tokens")
        self.decoder_start_token_id = f.token_id("decoder_start_token_id", self.vocab_size)
        self.eos_token_id = f.token_id("eos_token_id", self.vocab_size)
        self.raw = dict(d)

    @staticmethod
    def _id_list(f, key):
        value = f.get(key, None)
        if value is not None and not (isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)):
            f.fail(key, value, "a list of token ids (integers >= 0)")
        return value

    @classmethod
    def from_file(cls, path):
        path = os.fspath(path)
        d = read_json(path)
        if not isinstance(d, dict):
            raise FormatError(f"{path}: a config must be a JSON object")
        if d.get("model_type", "whisper") != "whisper":
            raise FormatError(f"{path}: model_type is {d.get('model_type')!r}, not 'whisper'")
        return cls(d, path)


def sinusoids(length, channels, max_timescale=10000.0):
    """Whisper's sinusoidal encoder positions (sin half, cos half), for checkpoints that omit them."""
    half = channels // 2
    step = math.log(max_timescale) / (half - 1)
    inv = [math.exp(-step * i) for i in range(half)]
    return [[math.sin(p * f) for f in inv] + [math.cos(p * f) for f in inv] for p in range(length)]


def _rows(layer, x):
    """layer(x) computed on x flattened to 2-D rows: one plain matrix product per layer
    (a batched product with a broadcast weight is far slower in numpy for one row)."""
    shape = x.shape
    return layer(x.reshape(-1, shape[-1])).reshape(*shape[:-1], -1)


class Attention(Module):
    """Multi-head attention with Whisper's projections (no bias on k_proj): the decoder's
    cross-attention, keys and values from the audio features (key_values) once per audio."""

    def __init__(self, vb, d, heads):
        self.heads, self.head_dim = heads, d // heads
        self.q_proj = Linear(vb.pp("q_proj"), d, d)
        self.k_proj = Linear(vb.pp("k_proj"), d, d, bias=vb.contains("k_proj.bias"))
        self.v_proj = Linear(vb.pp("v_proj"), d, d)
        self.out_proj = Linear(vb.pp("out_proj"), d, d)

    def split_heads(self, x):
        b, t, _ = x.shape
        return x.reshape(b, t, self.heads, self.head_dim).transpose(1, 2)

    def key_values(self, x):
        """(k, v) of shape (b, heads, t, head_dim) for the keys/values source x (b, t, d)."""
        return self.split_heads(_rows(self.k_proj, x)), self.split_heads(_rows(self.v_proj, x))

    def attend(self, x, k, v):
        return self.attend_q(_rows(self.q_proj, x), k, v)

    def attend_q(self, q, k, v):
        """The attention output for the q projection q (b, t, d) over keys k and values v."""
        b, t, d = q.shape
        y = F.scaled_dot_product_attention(self.split_heads(q), k, v)
        return _rows(self.out_proj, y.transpose(1, 2).reshape(b, t, d))


class SelfAttention(Attention):
    """Attention over its own input: q, k and v as one matmul over their joined rows."""

    def __init__(self, vb, d, heads):
        self.heads, self.head_dim = heads, d // heads
        self.qkv_proj = FusedLinear(vb, ["q_proj", "k_proj", "v_proj"], d, [d, d, d],
                                    bias=[True, vb.contains("k_proj.bias"), True])
        self.out_proj = Linear(vb.pp("out_proj"), d, d)

    def forward(self, x, cache=None):
        return self.attend_qkv(self.qkv_proj.parts(x), cache)

    def attend_qkv(self, qkv, cache=None):
        """The attention output for the q, k and v projections qkv, each (b, t, d)."""
        b, t, d = qkv[0].shape
        q, k, v = (self.split_heads(p) for p in qkv)
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v)
        else:  # the new keys and values go into the cache inside the attention op
            cache.reserve(k, v)
            y = F.cache_attention(q, k, v, cache.k, cache.v, cache.length)
            cache.advance(t)
        return _rows(self.out_proj, y.transpose(1, 2).reshape(b, t, d))


class EncoderLayer(Module):
    def __init__(self, vb, cfg):
        d = cfg.d_model
        self.self_attn_layer_norm = LayerNorm(vb.pp("self_attn_layer_norm"), d)
        self.self_attn = SelfAttention(vb.pp("self_attn"), d, cfg.encoder_heads)
        self.final_layer_norm = LayerNorm(vb.pp("final_layer_norm"), d)
        self.fc1 = Linear(vb.pp("fc1"), d, cfg.encoder_ffn_dim)
        self.fc2 = Linear(vb.pp("fc2"), cfg.encoder_ffn_dim, d)
        self.act = _ACTIVATIONS[cfg.activation]

    def forward(self, x):
        x = x + self.self_attn(self.self_attn_layer_norm(x))
        return x + _rows(self.fc2, self.act(_rows(self.fc1, self.final_layer_norm(x))))


class DecoderLayer(Module):
    def __init__(self, vb, cfg):
        d = cfg.d_model
        self.self_attn_layer_norm = LayerNorm(vb.pp("self_attn_layer_norm"), d)
        self.self_attn = SelfAttention(vb.pp("self_attn"), d, cfg.decoder_heads)
        self.encoder_attn_layer_norm = LayerNorm(vb.pp("encoder_attn_layer_norm"), d)
        self.encoder_attn = Attention(vb.pp("encoder_attn"), d, cfg.decoder_heads)
        self.final_layer_norm = LayerNorm(vb.pp("final_layer_norm"), d)
        self.fc1 = Linear(vb.pp("fc1"), d, cfg.decoder_ffn_dim)
        self.fc2 = Linear(vb.pp("fc2"), cfg.decoder_ffn_dim, d)
        self.act = _ACTIVATION_OPS[cfg.activation]

    def forward(self, x, cache, cross_k, cross_v):
        hidden, pending = self.forward_fused(x, None, cache, cross_k, cross_v)
        return hidden + pending

    def forward_fused(self, x, pending, cache, cross_k, cross_v):
        """(hidden, addend) with the layer's output hidden + addend: each residual add runs fused
        with the layer norm after it and the projection that reads it (functional.add_norm_linear:
        q/k/v, the cross-attention's q, fc1 with its activation), the last add in the next layer."""
        hidden, qkv = self.self_attn.qkv_proj.add_norm_parts(x, pending, self.self_attn_layer_norm)
        attn = self.self_attn.attend_qkv(qkv, cache)
        hidden, q = self.encoder_attn.q_proj.add_norm(hidden, attn, self.encoder_attn_layer_norm)
        attn = self.encoder_attn.attend_q(q, cross_k, cross_v)
        hidden, h = self.fc1.add_norm(hidden, attn, self.final_layer_norm, self.act)
        return hidden, _rows(self.fc2, h)


class Encoder(Module):
    def __init__(self, vb, cfg):
        d = cfg.d_model
        self.cfg = cfg
        self.conv1 = Conv1d(vb.pp("conv1"), cfg.num_mel_bins, d, 3, padding=1)
        self.conv2 = Conv1d(vb.pp("conv2"), d, d, 3, stride=2, padding=1)
        if vb.contains("embed_positions.weight"):
            self.embed_positions = Embedding(vb.pp("embed_positions"), cfg.max_source_positions, d)
        else:  # the positions are fixed sinusoids; some exports leave them out
            self.embed_positions = Module()
            self.embed_positions.weight = tensor(sinusoids(cfg.max_source_positions, d), vb.dtype, vb.device)
        self.layers = [EncoderLayer(vb.pp(f"layers.{i}"), cfg) for i in range(cfg.encoder_layers)]
        self.layer_norm = LayerNorm(vb.pp("layer_norm"), d)
        self.act = _ACTIVATIONS[cfg.activation]

    def check_input(self, mel):
        cfg = self.cfg
        if mel.ndim != 3 or mel.shape[1] != cfg.num_mel_bins:
            raise ShapeError(f"whisper encoder: expected mel of shape (batch, {cfg.num_mel_bins}, frames), "
                             f"got {mel.shape}")
        if mel.shape[2] > 2 * cfg.max_source_positions:
            raise ShapeError(f"whisper encoder: {mel.shape[2]} mel frames is more than the model's "
                             f"{2 * cfg.max_source_positions} (30 s); split long audio into windows")

    def forward(self, mel):
        """mel (b, n_mels, frames) -> audio features (b, frames / 2, d_model)."""
        self.check_input(mel)
        x = self.act(self.conv1(mel))
        x = self.act(self.conv2(x)).transpose(1, 2)
        x = x + self.embed_positions.weight.narrow(0, 0, x.shape[1])
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class Decoder(Module):
    def __init__(self, vb, cfg):
        d = cfg.d_model
        self.cfg = cfg
        self.embed_tokens = Embedding(vb.pp("embed_tokens"), cfg.vocab_size, d)
        self.embed_positions = Embedding(vb.pp("embed_positions"), cfg.max_target_positions, d)
        self.layers = [DecoderLayer(vb.pp(f"layers.{i}"), cfg) for i in range(cfg.decoder_layers)]
        self.layer_norm = LayerNorm(vb.pp("layer_norm"), d)

    def check_fits(self, offset, t):
        if offset + t > self.cfg.max_target_positions:
            raise ShapeError(f"whisper decoder: {offset + t} tokens is more than the model's "
                             f"{self.cfg.max_target_positions} positions")

    def forward(self, ids, state, positions=None, position_ids=None):
        """ids (b, t) continuing state's sequences -> logits (b, t, vocab); with `positions`
        (indices into the t new tokens) only those: (b, len(positions), vocab). position_ids
        (1, t): the positions of the new tokens as a tensor (a captured step reads them from
        its input, not from a view at the position); default: from state.length."""
        b, t = ids.shape
        offset = state.length
        self.check_fits(offset, t)
        # the position rows are the first layer's pending addend: its norm adds them (one op)
        x = self.embed_tokens(ids).to(self.embed_positions.weight.dtype)  # an f16 table's rows widened
        if position_ids is None:
            pending = self.embed_positions.weight.narrow(0, offset, t).expand(b, t, x.shape[-1])
        else:
            pending = self.embed_positions(position_ids).expand(b, t, x.shape[-1])
        cross = state.cross_for(b)
        for layer, cache, (ck, cv) in zip(self.layers, state.caches, cross):
            x, pending = layer.forward_fused(x, pending, cache, ck, cv)
        norm = self.layer_norm  # every layer leaves an addend (pending) for this add
        x = F.add_layer_norm(x, pending, norm.weight, norm.bias, norm.eps)[1]
        rows = None if positions is None else [p % t for p in positions]
        if rows is not None and rows != list(range(t)):
            # the vocabulary projection is the biggest matmul: skip the positions nobody reads
            x = x.index_select(1, tensor(rows, device=x.device))
        return _rows(lambda h: F.linear(h, self.embed_tokens.weight), x)


class DecoderState:
    """One decoding run: the self-attention KV caches and the encoder's K/V per layer
    (computed once from the audio features, shared by every beam), and the run's captured
    one-token step (a new window is a new state, so its cross-attention K/V are fixed
    buffers for every replay)."""

    def __init__(self, decoder, audio_features):
        self.caches = [KVCache(initial_capacity=64) for _ in decoder.layers]
        # contiguous per head: each query row streams its head's keys (the attention kernels read them so)
        self.cross = [tuple(x.contiguous() for x in layer.encoder_attn.key_values(audio_features))
                      for layer in decoder.layers]
        self.replays = StepReplays()

    @property
    def length(self):
        return self.caches[0].length

    def advance(self, t):
        """Count t positions a replayed step wrote into every layer's cache."""
        for c in self.caches:
            c.length += t

    def bound(self):
        """The buffers a captured step binds that a replay needs unchanged: the KV caches (a
        cache that grows gets new ones) and the cross-attention K/V."""
        return ([c.k._storage for c in self.caches if c.k is not None]
                + [c.v._storage for c in self.caches if c.v is not None]
                + [x._storage for kv in self.cross for x in kv])

    def has_room(self, batch):
        """Whether a one-token step of `batch` rows writes into the caches as they are (no growth)."""
        k = self.caches[0].k
        return k is not None and k.shape[0] == batch and self.length < k.shape[2]

    def cross_for(self, batch):
        if self.cross[0][0].shape[0] == batch:
            return self.cross
        # one audio, several beams: broadcast its K/V (a stride-0 view, no copy)
        return [(k.expand(batch, *k.shape[1:]), v.expand(batch, *v.shape[1:])) for k, v in self.cross]

    def reorder(self, rows):
        """Keep cache rows `rows` (beam search: each new beam continues some old one). With the
        batch unchanged the rows are rewritten in place, so a captured step's buffers stay."""
        rows = list(rows)
        if rows == list(range(self.caches[0].k.shape[0])):
            return
        ids = tensor(rows, device=self.caches[0].k.device)
        for c in self.caches:
            if c.k.shape[0] != len(rows):  # a new batch (the prompt's row copied per beam): new buffers
                c.k, c.v = c.k.index_select(0, ids), c.v.index_select(0, ids)
                continue
            n = c.length
            keys, values = c.k.narrow(2, 0, n).index_select(0, ids), c.v.narrow(2, 0, n).index_select(0, ids)
            c.k[:, :, :n] = keys
            c.v[:, :, :n] = values


def _one_token_rows(ids):
    """The token ids when ids is a list of rows of one Python int each ([[t], [u]]), else None."""
    if not isinstance(ids, (list, tuple)) or not ids:
        return None
    tokens = []
    for row in ids:
        if not (isinstance(row, (list, tuple)) and len(row) == 1 and isinstance(row[0], int)
                and not isinstance(row[0], bool)):
            return None
        tokens.append(row[0])
    return tokens


class Whisper(Module):
    """The model, its tokenizer and its mel filters. Call `transcribe` (whisper_transcribe.py).
    One-token decoder steps on a device that captures (the CPU with its kernels, wgpu, CUDA,
    Metal) replay a captured step; `model.capture_decode = False` decodes eagerly."""
    kind = "whisper"  # what the model does (see CausalLM.kind)
    capture_decode = True

    def __init__(self, vb, cfg, tokenizer=None, mel_filters=None, name="whisper"):
        self.config = cfg
        self.encoder = Encoder(vb.pp("model.encoder"), cfg)
        self.decoder = Decoder(vb.pp("model.decoder"), cfg)
        self.device = vb.device
        self.dtype = vb.dtype
        self.tokenizer = tokenizer
        self.mel_filters = mel_filters
        self.name = name
        self._tokens = None

    @property
    def tokens(self):
        """WhisperTokens: the special token ids from the tokenizer."""
        if self._tokens is None:
            if self.tokenizer is None:
                raise Error(f"{self.name}: no tokenizer was loaded with this model (tokenizer.json)")
            from .whisper_tokens import WhisperTokens
            self._tokens = WhisperTokens(self.tokenizer, self.config.vocab_size, self.tokenizer.source)
        return self._tokens

    @property
    def is_multilingual(self):
        return self.config.vocab_size >= 51865

    def encode(self, mel):
        """Audio features (b, frames/2, d) from a mel spectrogram (b, n_mels, frames) tensor."""
        return self.encoder(mel.to(self.device).to(self.dtype))

    def start(self, audio_features):
        """A fresh DecoderState for these audio features."""
        return DecoderState(self.decoder, audio_features)

    def decode_step(self, ids, state, positions=(-1,)):
        """Feed ids (list of lists or (b, t) tensor) through the decoder, appending to state's
        caches; the logits (b, len(positions), vocab) at those positions (None: all).
        One Python token id per row on a device that captures: a replay of the state's
        captured step where it fits (see _decode_one)."""
        tokens = _one_token_rows(ids)
        if (tokens is not None and (positions is None or len(positions) == 1) and self.capture_decode
                and self.device.backend.can_capture()):
            return self._decode_one(tokens, state)
        if not hasattr(ids, "shape"):
            ids = tensor(ids, device=self.device)
        return self.decoder(ids, state, positions)

    def _decode_one(self, tokens, state):
        """Logits (b, 1, vocab) of one token per row, as CausalLM decodes (tallow.step_capture):
        the first two steps that fit the state's caches run eagerly while recording, later
        ones replay with the new ids and position. A new batch (beams), a cache that grows
        or a new window (a new state) captures again."""
        vocab = self.config.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise IndexRangeError(f"whisper decoder: token id {bad[0]} is out of range for the vocabulary "
                                  f"of {vocab} (valid: 0 to {vocab - 1})")
        position = state.length
        self.decoder.check_fits(position, 1)
        (logits,), replayed = state.replays.run(
            self.device, position, [([[t] for t in tokens], D.i64), ([[position]], D.i64)],
            lambda ids, pos: [self.decoder(ids, state, position_ids=pos)],
            state.bound, state.has_room(len(tokens)))
        if replayed:
            state.advance(1)
        return logits

    def forward(self, mel, ids):
        """Full-sequence logits (b, t, vocab) for mel (b, n_mels, frames) and ids (b, t)."""
        return self.decode_step(ids, self.start(self.encode(mel)), positions=None)

    def transcribe(self, audio, **options):
        """Text and timed segments of `audio` (a path, file bytes, or 16 kHz float samples);
        see tallow.models.whisper_transcribe.transcribe for the options."""
        from .whisper_transcribe import transcribe
        return transcribe(self, audio, **options)

    def detect_language(self, audio):
        """{language code: probability} for the first 30 s of `audio` (multilingual models)."""
        from .whisper_transcribe import detect_language
        return detect_language(self, audio)


# ---- loading -------------------------------------------------------------------------------
def _weights_source(folder):
    """A lazy tallow.io reader over the directory's model.safetensors (or its shards)."""
    from .. import io as tio
    return tio.open(folder)


def resolve(path_or_name, progress=True):
    """A local HF-layout directory for a directory, a config.json path or a known hub name."""
    p = Path(os.fspath(path_or_name))
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if p.is_dir():
        from ..io.ctranslate2_convert import is_ctranslate2_dir, not_converted_error
        if is_ctranslate2_dir(p):
            raise not_converted_error(p)
        return p
    if p.exists():
        from ..io.ctranslate2_convert import is_ctranslate2_model, not_converted_error
        if is_ctranslate2_model(p):
            raise not_converted_error(p)
        raise FormatError(f"{p}: expected a Whisper model directory (config.json, model.safetensors, tokenizer.json)")
    from .. import hub
    if str(path_or_name) in hub.KNOWN:
        return Path(hub.fetch(str(path_or_name), progress=progress))
    raise Error(f"{path_or_name}: no such model directory, and not a known model name "
                f"(known: {', '.join(k for k in hub.KNOWN if k.startswith('whisper-') and k != 'whisper-assets')}); "
                "`tallow fetch whisper-tiny.en` downloads one")


def _keeps_f16(name):
    """The weights a device whose products read f16 weights (backend.f16_weight_products: the wasm
    device) keeps as the checkpoint's f16: the projections' and the token embedding's (the tied
    output projection's) rows, 97% of the file. The position tables (added, not multiplied), the
    convolutions, norms and biases are small and go to f32 as elsewhere."""
    return name.endswith(".weight") and "embed_positions" not in name


def load(path_or_dir, device=None, dtype=None, weights=None, progress=True, quantize=None):
    """A Whisper model from a Hugging Face-layout directory (config.json,
    model.safetensors, tokenizer.json, optional mel_filters.npz) or a known name
    such as "whisper-tiny.en" (fetched on first use). `weights`: an optional
    {name: Tensor} dict used instead of the directory's safetensors. quantize="q8_0":
    the linear weights quantised at load (whisper_quantize.py), None keeps them float."""
    from .whisper_quantize import QuantizedWeights, check_choice
    check_choice(quantize)  # before the model is fetched or read
    folder = resolve(path_or_dir, progress)
    cfg = WhisperConfig.from_file(folder / "config.json")
    device = default_device() if device is None else Device(device)
    from ..backends.cpu.runtime.kernel_calls import load_ahead
    load_ahead(device, use=True)  # the CPU's decoding steps run the kernels: a cold cache compiles here, saying so
    source = weights if weights is not None else _weights_source(folder)
    if quantize is not None:
        source = QuantizedWeights(source, quantize)
    keep = _keeps_f16 if dtype is None and getattr(device.backend, "f16_weight_products", False) else None
    vb = VarBuilder(source, device, dtype, keep_f16=keep)
    tokenizer = None
    if (folder / "tokenizer.json").is_file():
        from ..tokenizer import Tokenizer
        tokenizer = Tokenizer.from_file(folder / "tokenizer.json")
    filters = folder / "mel_filters.npz"
    return Whisper(vb, cfg, tokenizer, str(filters) if filters.is_file() else None, name=str(folder))
