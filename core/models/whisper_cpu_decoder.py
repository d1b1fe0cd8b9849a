"""Whisper's decoder on the numpy CPU backend as direct numpy calls on preallocated caches.

A decoding step of Whisper tiny multiplies one row by 384-wide matrices: each
product is a few microseconds, so the step's time was the per-op cost of the
tensor front end (shape checks, layouts, dispatch: about 60 ops per layer), not
the arithmetic. Measured on jfk.wav (tiny.en, 27 tokens, busy 2-core box): 22 ms
per token through the generic decoder, of which the 51,864-row output product is
5-7 ms. Here a step is the same formula (the generic Decoder is the reference,
tests/test_whisper_cpu_decoder.py) in about 25 numpy calls per layer:

* q, k and v as one product over the joined rows (the model's FusedLinear weight);
* the self-attention keys and values written into caches allocated once for the
  model's whole context (max_target_positions), attention over a view of them;
* the cross-attention keys and values computed once per window (one product over
  the joined k/v rows of each layer), shared by every beam (broadcast);
* one matrix-vector product per linear layer, with the bias added in place;
* the output head as one product over the tied embedding (no transposed copy).

Measured (jfk.wav, 27 tokens, busy shared 2-core box, best of 3): decoding went from
0.60 s (22 ms per token) to 0.22-0.28 s at one thread (8-10 ms per token, 0.22 s of
CPU). What is left is reading memory: per token the 80 MB float32 output head (2.5 ms
alone at best), 28 MB of layer weights and 18 MB of cross-attention keys and values.

Where the compiled CPU kernels run (numba installed), the step also takes each norm with
its residual add as one kernel call, GELU as one, and multiplies one to F16_MAX_ROWS rows by
f16 copies of the matrices (made once, only when every value converts exactly: Whisper's
checkpoints are stored in f16, so the products read the same values in half the bytes; 56 MB
for tiny.en). Measured on jfk.wav's 27 tokens (2 threads, shared AVX-512 box, best of 6,
interleaved): 13.7 -> 11.1 ms per token, the same tokens. A one-token step (greedy, sampling,
beams) then runs as one compiled step program (whisper_cpu_step.py): jfk.wav's whole greedy
decode 0.326 -> 0.237 s (best of 7, interleaved), the same tokens.

Float32 weights are read-only views of the model's storage. q8_0 weights
(`quantize="q8_0"`) take tallow.backends.cpu.runtime.kernel_calls's integer-dot kernels for steps and
its tiled path for the prompt. `CpuDecoder.supports(model)` says when this applies:
the numpy backend, float32, every matrix float32 or a format those kernels handle.
"""
import numpy as np

from ..errors import IndexRangeError, ShapeError

# Up to this many rows (beam search's beams, the tokens that start a window), W x^T with W as
# stored, then a transposed copy, beats x W^T: OpenBLAS packs all of W for the latter. Measured
# (2 threads, AVX-512 box): 5 rows by the 51,864-row head 14.4 -> 10.6 ms, by fc1 0.35 -> 0.20 ms;
# from about 64 rows on (a prompt, the encoder's 1,500 frames) x W^T is as fast or faster.
FEW_ROWS = 32
# Up to this many rows, a matrix stored exactly in f16 is multiplied by the f16 kernel
# (kernel_calls.f16_matmul): half the bytes of float32 read per step, each read once for all rows.
F16_MAX_ROWS = 8


def _array(t):
    """A read-only numpy view of tensor t's values (no copy)."""
    return t.device.backend.to_numpy(t._storage, t._layout, t.dtype, copy=False)


class _Linear:
    """y = x W^T + b for x (rows, k): BLAS on a float32 view, or the integer-dot kernels on blocks."""

    def __init__(self, weight, bias, steps=True):
        """steps: the layer multiplies decoding steps' few rows (False: only a window's frames,
        which BLAS multiplies in float32, so no f16 copy)."""
        self.n, self.k = weight.shape
        self.bias = None if bias is None else _array(bias)
        self.blocks = weight.dtype.is_quantized
        self.f16 = None
        if self.blocks:
            self.raw, self.qtype = weight._storage, weight.dtype
        else:
            self.w = _array(weight)
            self.f16 = _exact_f16(self.w) if steps else None  # where the kernels run: half the bytes per step

    def __call__(self, x):
        if self.blocks:
            from ..backends.cpu.runtime import kernel_calls
            if x.shape[0] <= kernel_calls.FUSED_MAX_ROWS and self.bias is not None:
                return kernel_calls.qmatmul_bias(x, self.raw, self.qtype, self.n, self.k, self.bias)
            y = kernel_calls.qmatmul(x, self.raw, self.qtype, self.n, self.k)
        elif self.f16 is not None and x.shape[0] <= F16_MAX_ROWS:
            from ..backends.cpu.runtime import kernel_calls
            return kernel_calls.f16_matmul(x, self.f16, self.bias)
        elif x.shape[0] == 1:  # one row: BLAS's matrix-vector product on W as stored
            y = np.matmul(self.w, x[0])[None]
        elif x.shape[0] <= FEW_ROWS:  # beams, a window's first tokens: W as stored, then the transpose
            y = np.ascontiguousarray(np.matmul(self.w, x.T).T)
        else:
            y = np.matmul(x, self.w.T)  # BLAS reads the transpose in place
        if self.bias is not None:
            y += self.bias
        return y

    @staticmethod
    def quantized_ok(weight):
        if not weight.dtype.is_quantized:
            return weight.dtype.name == "f32"
        from ..backends.cpu.runtime import kernel_calls
        return kernel_calls.supports(weight.dtype)


def _exact_f16(w):
    """w (float32) as f16 bit patterns when every value converts exactly (a checkpoint stored in
    f16, as Whisper's are), else None; only where the compiled kernels run."""
    from ..backends.cpu.runtime import kernel_calls
    if kernel_calls.kernels() is None:
        return None
    h = w.astype(np.float16)
    return h.view(np.uint16) if np.array_equal(h, w) else None


def _layer_norm(x, norm):
    """LayerNorm over the last axis of x (rows, d), as the backend's (population variance)."""
    c = x - x.mean(axis=-1, keepdims=True)
    var = np.einsum("ij,ij->i", c, c)[:, None]
    var *= np.float32(1.0 / x.shape[-1])
    var += np.float32(norm.eps)
    c /= np.sqrt(var)
    c *= norm.w
    c += norm.b
    return c


def _add_norm(x, residual, norm):
    """x += residual (unless None), in place; returns LayerNorm(x) as numpy passes."""
    if residual is not None:
        x += residual
    return _layer_norm(x, norm)


class _Norm:
    def __init__(self, norm):
        self.w, self.b, self.eps = _array(norm.weight), _array(norm.bias), norm.eps


def _softmax_rows(s):
    """softmax over the last axis, in place."""
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


class _Layer:
    def __init__(self, layer):
        sa, ca = layer.self_attn, layer.encoder_attn
        self.heads, self.head_dim = sa.heads, sa.head_dim
        if sa.qkv_proj.separate is not None:
            raise ShapeError("whisper cpu decoder: q/k/v weights did not join")
        self.qkv = _Linear(sa.qkv_proj.weight, sa.qkv_proj.bias)
        self.out = _Linear(sa.out_proj.weight, sa.out_proj.bias)
        self.cross_q = _Linear(ca.q_proj.weight, ca.q_proj.bias)
        self.cross_k = _Linear(ca.k_proj.weight, ca.k_proj.bias, steps=False)
        self.cross_v = _Linear(ca.v_proj.weight, ca.v_proj.bias, steps=False)
        self.cross_out = _Linear(ca.out_proj.weight, ca.out_proj.bias)
        self.fc1, self.fc2 = _Linear(layer.fc1.weight, layer.fc1.bias), _Linear(layer.fc2.weight, layer.fc2.bias)
        self.norm1, self.norm2 = _Norm(layer.self_attn_layer_norm), _Norm(layer.encoder_attn_layer_norm)
        self.norm3 = _Norm(layer.final_layer_norm)
        self.act = layer.act

    def heads_of(self, y, b, t):
        """(b * t, d) rows -> (b, heads, t, head_dim) view."""
        return y.reshape(b, t, self.heads, self.head_dim).transpose(0, 2, 1, 3)

    def merge(self, y, b, t):
        """(b, heads, t, head_dim) -> (b * t, d) rows."""
        return y.transpose(0, 2, 1, 3).reshape(b * t, self.heads * self.head_dim)


class CpuDecoder:
    """The numpy views of one model's decoder weights, built once (Whisper.start uses it)."""

    def __init__(self, model):
        dec = model.decoder
        self.cfg = model.config
        emb = dec.embed_tokens.weight
        self.embed_blocks = emb.dtype.is_quantized
        self.embed = emb if self.embed_blocks else _array(emb)
        self.head = _Linear(emb, None)  # logits through the tied token embedding
        self.positions = _array(dec.embed_positions.weight)
        self.layers = [_Layer(layer) for layer in dec.layers]
        self.final = _Norm(dec.layer_norm)
        from ..backends.cpu.backend import _UNARY
        self.acts = {layer.act: _UNARY[layer.act] for layer in dec.layers}  # the backend's own functions
        from ..backends.cpu.runtime import kernel_calls
        # The compiled CPU kernels where numba is installed (loaded once, ~60 ms): the norms with
        # their residual add, attention and GELU as one call each instead of several numpy passes.
        self.kernels = kernel_calls.decode_kernels() if kernel_calls.kernels() is not None else None

    def add_norm(self, x, residual, norm):
        """x += residual (unless None), in place; returns LayerNorm(x): one kernel call."""
        out = np.empty_like(x)
        self.kernels.add_layer_norm(x, np.zeros_like(x) if residual is None else residual, norm.w, norm.b,
                                    norm.eps, x, out)
        return out

    @staticmethod
    def attend(layer, q, kc, vc, keys, causal):
        """softmax(q k^T / sqrt(head_dim)) v over the first `keys` rows of the caches kc, vc
        (batch or 1, heads, capacity, head_dim); q (b, heads, t, head_dim) -> the same shape.
        numpy's batched products (BLAS): a compiled loop over the keys was slower here (0.48 vs
        0.5-0.6 ms for a cross-attention layer's 6 x 1,500 keys, read from L3 at ~10 GB/s)."""
        s = np.matmul(q * np.float32(layer.head_dim ** -0.5), kc[:, :, :keys].transpose(0, 1, 3, 2))
        if causal:  # query i (the cache's row keys - t + i) sees keys up to its own row
            t = q.shape[2]
            s[..., np.arange(keys)[None, :] > np.arange(keys - t, keys)[:, None]] = -np.inf
        return np.matmul(_softmax_rows(s), vc[:, :, :keys])

    @staticmethod
    def supports(model):
        """Whether this decoder runs `model`: numpy backend, float32, weights it can read."""
        if model.device.backend.name != "cpu" or model.dtype.name != "f32":
            return False
        dec = model.decoder
        mats = [dec.embed_tokens.weight]
        for layer in dec.layers:
            if layer.self_attn.qkv_proj.separate is not None:
                return False
            mats += [layer.self_attn.qkv_proj.weight, layer.self_attn.out_proj.weight, layer.fc1.weight,
                     layer.fc2.weight] + [getattr(layer.encoder_attn, p).weight
                                          for p in ("q_proj", "k_proj", "v_proj", "out_proj")]
        return all(_Linear.quantized_ok(w) for w in mats)

    def start(self, audio_features):
        return CpuDecoderState(self, audio_features)

    def embed_rows(self, ids):
        if self.embed_blocks:
            from ..backends.cpu.runtime import kernel_calls
            return kernel_calls.dequant_rows(self.embed._storage, self.embed.dtype, self.embed.shape[1], ids)
        return self.embed[ids]


class CpuDecoderState:
    """One decoding run (as DecoderState): the per-layer self-attention caches, allocated for
    the whole context at the first step, and the audio's cross-attention keys and values."""

    def __init__(self, decoder, audio_features):
        self.decoder = decoder
        feats = np.ascontiguousarray(_array(audio_features), dtype=np.float32)
        if feats.ndim != 3 or feats.shape[2] != decoder.cfg.d_model:
            raise ShapeError(f"whisper decoder: audio features of shape {feats.shape}, expected "
                             f"(batch, frames, {decoder.cfg.d_model})")
        b, frames, _ = feats.shape
        rows = feats.reshape(b * frames, -1)
        # (b, heads, frames, head_dim), contiguous per head so each score product streams its rows
        self.cross = [(np.ascontiguousarray(layer.heads_of(layer.cross_k(rows), b, frames)),
                       np.ascontiguousarray(layer.heads_of(layer.cross_v(rows), b, frames)))
                      for layer in decoder.layers]
        self.k = self.v = None  # per layer (batch, heads, max_target_positions, head_dim)
        self.length = 0
        self.program_key = self.program = None  # the one-token step program (_program)

    def _caches(self, batch):
        d = self.decoder
        shape = (batch, d.layers[0].heads, d.cfg.max_target_positions, d.layers[0].head_dim)
        self.k = [np.empty(shape, np.float32) for _ in d.layers]
        self.v = [np.empty(shape, np.float32) for _ in d.layers]

    def reorder(self, rows):
        """Keep cache rows `rows` (beam search: each new beam continues some old one)."""
        rows = list(rows)
        if self.k is None or rows == list(range(self.k[0].shape[0])):
            return
        have = self.k[0].shape[0]
        bad = [r for r in rows if not (isinstance(r, (int, np.integer)) and 0 <= r < have)]
        if bad:
            raise IndexRangeError(f"whisper decoder: reorder row {bad[0]!r} is not one of the {have} rows "
                                  f"(0 to {have - 1})")
        n = self.length
        if len(rows) != self.k[0].shape[0]:
            old_k, old_v = self.k, self.v
            self._caches(len(rows))
            for new, old in zip(self.k + self.v, old_k + old_v):
                new[:, :, :n] = old[rows, :, :n]
            return
        for c in self.k + self.v:
            c[:, :, :n] = c[rows, :, :n]  # fancy indexing copies first, so in place is safe

    def _program(self, b):
        """The one-token step program for these caches (built at the first such step; again when
        beam search changes the batch, which makes new caches), or None where it cannot run."""
        key = (b, id(self.k[0]))
        if self.program_key != key:
            from . import whisper_cpu_step
            self.program_key, self.program = key, whisper_cpu_step.build(self.decoder, self, b)
        return self.program

    def step(self, ids, positions):
        """ids (b, t) int array continuing the sequences -> logits (b, len(positions) or t, vocab)."""
        d = self.decoder
        b, t = ids.shape
        start = self.length
        if start + t > d.cfg.max_target_positions:
            raise ShapeError(f"whisper decoder: {start + t} tokens is more than the model's "
                             f"{d.cfg.max_target_positions} positions")
        vocab = d.cfg.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise IndexRangeError(f"whisper decoder: token id {bad} is out of range for the vocabulary "
                                  f"of {vocab} (valid: 0 to {vocab - 1})")
        if self.k is None or self.k[0].shape[0] != b:
            if self.length:
                raise ShapeError(f"whisper decoder: {b} rows continue a run of {self.k[0].shape[0]} "
                                 "(reorder the state first)")
            self._caches(b)
        if self.cross[0][0].shape[0] not in (1, b):
            raise ShapeError(f"whisper decoder: {b} rows over audio features of batch {self.cross[0][0].shape[0]} "
                             "(one audio for every row, or one per row)")
        if t == 1 and (positions is None or list(positions) in ([0], [-1])) and d.kernels is not None:
            program = self._program(b)
            if program is not None:  # the whole step as one compiled program (whisper_cpu_step.py)
                logits = program.run(ids.reshape(-1), start)
                self.length = start + 1
                return logits.reshape(b, 1, -1)
        x = d.embed_rows(ids.reshape(-1)) + np.tile(d.positions[start:start + t], (b, 1))
        end = start + t
        norm = d.add_norm if d.kernels is not None else _add_norm
        residual = None  # what the next norm adds to x first
        for layer, kc, vc, (ck, cv) in zip(d.layers, self.k, self.v, self.cross):
            hd = layer.heads * layer.head_dim
            qkv = layer.qkv(norm(x, residual, layer.norm1))
            kc[:, :, start:end] = layer.heads_of(qkv[:, hd:2 * hd], b, t)
            vc[:, :, start:end] = layer.heads_of(qkv[:, 2 * hd:], b, t)
            y = d.attend(layer, layer.heads_of(qkv[:, :hd], b, t), kc, vc, end, t > 1)
            residual = layer.out(layer.merge(y, b, t))
            q = layer.heads_of(layer.cross_q(norm(x, residual, layer.norm2)), b, t)
            residual = layer.cross_out(layer.merge(d.attend(layer, q, ck, cv, ck.shape[2], False), b, t))
            residual = layer.fc2(d.acts[layer.act](layer.fc1(norm(x, residual, layer.norm3))))
        self.length = end
        h = norm(x, residual, d.final)
        h = h.reshape(b, t, -1)
        if positions is not None:
            h = h[:, [p % t for p in positions]]
        keep = h.shape[1]
        return d.head(np.ascontiguousarray(h).reshape(b * keep, -1)).reshape(b, keep, -1)
