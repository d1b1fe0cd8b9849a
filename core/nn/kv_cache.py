"""A preallocated key/value cache. Appending writes in place; when full it
grows by doubling, so the whole cache is copied O(log n) times, not per token."""
from .. import functional as F
from ..creation import zeros


class KVCache:
    def __init__(self, initial_capacity=256, max_len=None):
        self.initial_capacity = initial_capacity
        self.max_len = max_len  # a sliding window keeps only the last max_len positions
        self.k = self.v = None
        self.length = 0

    def reset(self):
        """Forget every position. The buffers stay for the next sequence, as llama.cpp keeps its
        context: a decode step captured on them (tallow.capture) replays again without a new capture."""
        self.length = 0

    def truncate(self, length):
        """Forget positions from `length` on (their slots are overwritten by later appends)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.truncate: {length} is outside [0, {self.length}]")
        self.length = length

    def _grow(self, like_k, like_v, need):
        cap = self.k.shape[2] if self.k is not None else 0
        new_cap = max(need, 2 * cap, self.initial_capacity)
        b, h, _, dk = like_k.shape
        k = zeros(b, h, new_cap, dk, dtype=like_k.dtype, device=like_k.device)
        v = zeros(b, h, new_cap, like_v.shape[3], dtype=like_v.dtype, device=like_v.device)
        if self.length:
            k[:, :, :self.length] = self.k.narrow(2, 0, self.length)
            v[:, :, :self.length] = self.v.narrow(2, 0, self.length)
        self.k, self.v = k, v

    def reserve(self, k, v):
        """Grow the cache, if needed, so k, v (b, heads, t, d) fit at self.length: then write them
        (functional.cache_attention into self.k and self.v at self.length) and advance(t)."""
        need = self.length + k.shape[2]
        if self.k is None or need > self.k.shape[2]:
            self._grow(k, v, need)
        elif not self.length and not self._holds(k, v):  # a reset cache, then another batch or dtype
            self.k = self.v = None
            self._grow(k, v, need)

    def _holds(self, k, v):
        return (self.k.shape[:2] + self.k.shape[3:] == k.shape[:2] + k.shape[3:] and self.v.shape[3:] == v.shape[3:]
                and self.k.dtype == k.dtype and self.v.dtype == v.dtype and self.k.device is k.device)

    def advance(self, t):
        """Count t written positions (no views made: a decoding step's hot path)."""
        self.length += t

    def slots(self, k, v):
        """Views of the cache where k, v (b, heads, t, d) go next, grown if needed: write them
        (functional.kv_write), then commit(t)."""
        self.reserve(k, v)
        t = k.shape[2]
        return self.k.narrow(2, self.length, t), self.v.narrow(2, self.length, t)

    def commit(self, t):
        """Count t written positions; return views of all cached keys and values."""
        self.advance(t)
        need = self.length
        start = 0 if self.max_len is None else max(0, need - self.max_len)
        return self.k.narrow(2, start, need - start), self.v.narrow(2, start, need - start)

    def append(self, k, v):
        """Add k, v of shape (b, heads, t, d); return views of all cached keys and values."""
        k_slot, v_slot = self.slots(k, v)
        F.kv_write(k, v, k_slot, v_slot)
        return self.commit(k.shape[2])
