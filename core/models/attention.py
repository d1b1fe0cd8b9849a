"""Pieces every decoder's self-attention shares: head reshapes, (partial)
rotary embedding, and causal attention through a KV cache with an optional
sliding window. Only public tensor/functional ops, so every device runs them."""
from .. import functional as F
from ..creation import cat, tensor


def split_heads(x, heads, head_dim):
    """(b, t, heads * head_dim) -> (b, heads, t, head_dim)."""
    b, t, _ = x.shape
    return x.reshape(b, t, heads, head_dim).transpose(1, 2)


def merge_heads(x):
    """(b, heads, t, head_dim) -> (b, t, heads * head_dim)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b, t, h * d)


def apply_rotary(x, cos, sin, rotary_dim, interleaved=False):
    """Rotate the first rotary_dim features of each head; the rest pass through
    (Phi's partial rotary)."""
    d = x.shape[-1]
    if rotary_dim == d:
        return F.rotary_emb(x, cos, sin, interleaved)
    rotated = F.rotary_emb(x.narrow(-1, 0, rotary_dim), cos, sin, interleaved)
    return cat([rotated, x.narrow(-1, rotary_dim, d - rotary_dim)], -1)


# A config's hidden_act -> the unary op (core/backends/base.py) that computes it.
_ACTIVATION_OPS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                   "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def activation_op(name):
    """The unary op name of the MLP non-linearity a config's hidden_act names."""
    op = _ACTIVATION_OPS.get(name)
    if op is None:
        from ..errors import UnsupportedError
        raise UnsupportedError(f"hidden_act {name!r} is not supported (silu, gelu, gelu_new, gelu_pytorch_tanh, relu)")
    return op


def activation(name):
    """The MLP non-linearity a config's hidden_act names, as a function."""
    op = activation_op(name)
    if op == "gelu_tanh":
        return lambda x: x.gelu("tanh")
    return {"silu": F.silu, "gelu": lambda x: x.gelu(), "relu": F.relu}[op]


class Step:
    """What one forward call shares across layers: where the new tokens sit,
    their rotary tables and the attention window over the cache."""

    def __init__(self, offset, length, rotary, window=None, device=None):
        self.offset, self.length, self.window = offset, length, window
        self.cos, self.sin = rotary.tables(offset, length)
        total = offset + length
        self.key_start, self.mask = 0, None
        if window is not None and total > window:
            # Keys older than every query's window are dropped from the view; within
            # the view, a bool mask bans keys that fall out of an earlier query's window
            # (key p may be seen by query q when q - window < p <= q, as in transformers).
            self.key_start = max(0, offset + 1 - window)
            if offset + length - 1 - window >= self.key_start:
                keys = range(self.key_start, total)
                self.mask = tensor([[p > q - window for p in keys] for q in range(offset, total)], device=device)

    def rotate(self, x, rotary_dim, interleaved=False):
        """x (b, heads, t, head_dim) with its first rotary_dim features rotated at these positions
        (a partial rotary applied before attend(); full-width rotary goes through attend_rotary)."""
        return apply_rotary(x, self.cos, self.sin, rotary_dim, interleaved)

    def attend(self, q, k, v, kv_cache, scale=None):
        """Append k, v to the layer's cache and attend causally over everything it holds, as one
        op (functional.cache_attention). scale: of the scores (default head_dim**-0.5; Gemma 3:
        query_pre_attn_scalar**-0.5)."""
        return self._cache_attention(q, k, v, kv_cache, scale)

    def attend_rotary(self, q, k, v, kv_cache, interleaved=False, scale=None):
        """attend() for q and k not yet rotated (full-width rotary): the same one op rotates q and
        k, writes k and v into the cache and attends."""
        return self._cache_attention(q, k, v, kv_cache, scale, self.cos, self.sin, interleaved)

    def _cache_attention(self, q, k, v, kv_cache, scale, cos=None, sin=None, interleaved=False):
        kv_cache.reserve(k, v)  # grows the cache when the new positions do not fit
        key_start, mask, window = self.key_start, self.mask, self.window
        if kv_cache.max_len is not None:  # a cache that keeps only its last max_len positions
            dropped = max(key_start, kv_cache.length + k.shape[2] - kv_cache.max_len) - key_start
            key_start += dropped
            if mask is not None and dropped:
                mask = mask.narrow(-1, dropped, mask.shape[-1] - dropped)
            window = kv_cache.max_len if window is None else min(window, kv_cache.max_len)
        # one query with a window: key_start is max(0, position + 1 - window); saying the window lets
        # a captured step slide it (CacheAttentionSpec)
        window = window if k.shape[2] == 1 and mask is None else None
        out = F.cache_attention(q, k, v, kv_cache.k, kv_cache.v, kv_cache.length, cos, sin, interleaved, scale,
                                key_start, mask, window)
        kv_cache.advance(k.shape[2])
        return out


class BatchStep:
    """One decode step of several sequences, one new token each, as one batch: row i of q, k
    and v (batch, heads, 1, head_dim) belongs to the sequence whose KV cache is kv_caches[i],
    at its own position offsets[i]. Each row is rotated, written into its own cache and
    attended over it exactly as that sequence's Step alone does: the rotation, cache writes and
    attention of all the rows are one op a layer (functional.batch_cache_attention, which gives
    each row what cache_attention gives it alone); the products around attention run on all
    the rows at once."""

    def __init__(self, offsets, rotary, window=None, device=None):
        self.steps = [Step(offset, 1, rotary, window, device) for offset in offsets]
        self._rows = None

    def rotate(self, x, rotary_dim, interleaved=False):
        return cat([s.rotate(x.narrow(0, i, 1), rotary_dim, interleaved) for i, s in enumerate(self.steps)], 0)

    def attend(self, q, k, v, kv_caches, scale=None):
        return self._attend(q, k, v, kv_caches, scale)

    def attend_rotary(self, q, k, v, kv_caches, interleaved=False, scale=None):
        if self._rows is None:  # each row's rotary row, once a step (the layers share them)
            self._rows = (cat([s.cos for s in self.steps], 0), cat([s.sin for s in self.steps], 0))
        return self._attend(q, k, v, kv_caches, scale, *self._rows, interleaved)

    def _attend(self, q, k, v, kv_caches, scale, cos=None, sin=None, interleaved=False):
        positions, key_starts = [], []
        for i, (s, c) in enumerate(zip(self.steps, kv_caches)):
            if c.k is None or not c.length or c.length >= c.k.shape[2]:  # no room (or a reset cache): Step's reserve
                c.reserve(k.narrow(0, i, 1), v.narrow(0, i, 1))
            key_start = s.key_start  # (one query: never a mask, Step's window is its key_start)
            if c.max_len is not None:  # a cache that keeps only its last max_len positions
                key_start = max(key_start, c.length + 1 - c.max_len)
            positions.append(c.length)
            key_starts.append(key_start)
        out = F.batch_cache_attention(q, k, v, [c.k for c in kv_caches], [c.v for c in kv_caches], positions, cos,
                                      sin, interleaved, scale, key_starts)
        for c in kv_caches:
            c.advance(1)
        return out
