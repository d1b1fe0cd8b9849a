"""A batched decoding step's attention for one layer in one call (base.py's batch_cache_attention):
row i of q, k and v belongs to a sequence with its own KV cache, of its own capacity, at its own
position. Per row it runs fused_ops.cache_attention itself, on that row and that cache (viewed
from its address, as step_loop's program rows are), so each row's rotation, cache write and
attention are the single step's arithmetic in the single step's order: the same bits. What the
batch saves is the Python between the kernels (~100 us an op), one op a layer for all the rows
instead of one a row.
"""
from numba import carray, njit

from . import fused_ops
from .codes import entry
from .step_loop import POINTER_AT

_f32_at = POINTER_AT["f32"]

# Columns of the caches table (one row a sequence).
K_ADDRESS, V_ADDRESS, CAPACITY, POSITION, KEY_START = range(5)


@entry("f32[4]", "f32[4]", "f32[4]", "f32[2]", "f32[2]", "i64[2]", "f32", "bool", "f32[4]")
@njit(cache=True)
def batch_cache_attention(q, k, v, cos, sin, caches, scale, interleaved, out):
    """For each row i: fused_ops.cache_attention of q[i], k[i], v[i] (b, heads, t, d) with rotary
    rows cos[i], sin[i] (cos (b, d/2), or (0, 0): no rotation) over the contiguous caches
    (1, hk, capacity, d/dv) at the addresses of caches[i] (K_ADDRESS ... KEY_START), into out[i].
    The caller keeps the caches alive and checks that each row fits its cache."""
    hk, d, dv = k.shape[1], k.shape[3], v.shape[3]
    for i in range(q.shape[0]):
        cap = caches[i, CAPACITY]
        kc = carray(_f32_at(caches[i, K_ADDRESS]), (1, hk, cap, d))
        vc = carray(_f32_at(caches[i, V_ADDRESS]), (1, hk, cap, dv))
        fused_ops.cache_attention(q[i:i + 1], k[i:i + 1], v[i:i + 1], cos[i:i + 1], sin[i:i + 1], kc, vc,
                                  caches[i, POSITION], caches[i, KEY_START], scale, interleaved, out[i:i + 1])
