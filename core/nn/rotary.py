"""Rotary position embeddings: inverse frequencies (with the scaled variants
the checkpoints use) and cached cos/sin tables."""
import math

from ..creation import tensor


def inv_frequencies(dim, base=10000.0, scaling=None, seq_len=None):
    """Inverse frequencies for a rotary dim, and the attention factor cos/sin are scaled by.
    scaling is a config's rope_scaling dict: linear, llama3, longrope/su (Phi-3.5, Phi-4-mini), or None."""
    inv = [1.0 / base ** (i / dim) for i in range(0, dim, 2)]
    factor_out = 1.0
    if not scaling:
        return inv, factor_out
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return inv, factor_out
    if kind == "linear":
        return [f / scaling["factor"] for f in inv], factor_out
    if kind == "freq_factors":  # llama.cpp's rope_freqs tensor: one divisor per frequency
        factors = scaling["factors"]
        if len(factors) != len(inv):
            raise ValueError(f"rope freq factors have {len(factors)} entries, the rotary dim needs {len(inv)}")
        return [f / e for f, e in zip(inv, factors)], factor_out
    if kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        out = []
        for f in inv:
            wl = 2 * math.pi / f
            if wl < high_wl:
                out.append(f)
            elif wl > low_wl:
                out.append(f / factor)
            else:
                smooth = (old / wl - low) / (high - low)
                out.append((1 - smooth) * f / factor + smooth * f)
        return out, factor_out
    if kind in ("longrope", "su"):
        original = scaling["original_max_position_embeddings"]
        ext = scaling["long_factor"] if seq_len is not None and seq_len > original else scaling["short_factor"]
        if len(ext) != len(inv):
            raise ValueError(f"rope_scaling factors have {len(ext)} entries, the rotary dim needs {len(inv)}")
        factor = scaling.get("factor") or scaling["max_position_embeddings"] / original
        attn = scaling.get("attention_factor")
        if attn is None:
            attn = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        return [f / e for f, e in zip(inv, ext)], attn
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3, longrope)")


class RotaryEmbedding:
    """cos/sin tables of shape (positions, dim/2), grown on demand."""

    def __init__(self, dim, base=10000.0, scaling=None, device=None, dtype=None):
        self.dim, self.base, self.scaling = dim, base, scaling
        self.device, self.dtype = device, dtype
        self._key = None
        self._cos = self._sin = None

    def tables(self, start, length):
        end = start + length
        # longrope switches factors once the sequence passes the original context.
        inv, attn = inv_frequencies(self.dim, self.base, self.scaling, seq_len=end)
        key = (tuple(inv), attn)
        if self._cos is None or self._key != key or self._cos.shape[0] < end:
            # grown like KVCache (from 256, doubling): a captured decode step binds both, so they
            # change buffers at the same step and a sequence captures again only once per doubling
            n = max(end, 2 * (self._cos.shape[0] if self._cos is not None and self._key == key else 0), 256)
            # flat lists, then a view of shape (n, dim/2): nested lists cost a nested flatten per row
            ang = [p * f for p in range(n) for f in inv]
            self._cos = tensor([math.cos(a) * attn for a in ang], self.dtype, self.device).reshape(n, len(inv))
            self._sin = tensor([math.sin(a) * attn for a in ang], self.dtype, self.device).reshape(n, len(inv))
            self._key = key
        return self._cos.narrow(0, start, length), self._sin.narrow(0, start, length)
