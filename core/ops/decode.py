"""Fused decode ops: the few fat ops a transformer layer decodes one token with.

    add_rms_norm(x, r, w)                   -> (x + r, rms_norm(x + r, w))
    add_layer_norm(x, r, w, b)              -> (x + r, layer_norm(x + r, w, b))
    gated_linear(x, w_gate_up, "silu")      -> silu(x @ gate.T) * (x @ up.T)
    add_norm_linear(x, r, nw, nb, w, b)     -> (x + r, linear(norm(x + r), w, b)), optionally
                                               with an activation or gated as gated_linear
    rope_kv_write(q, k, v, cos, sin, kc, vc) -> rope(q); rope(k) and v written into the cache slots
    kv_write(k, v, kc, vc)                  -> k and v written into the cache slots
    cache_attention(q, k, v, kc, vc, pos)   -> k, v (rope(k) with cos/sin) written into the cache at pos,
                                               causal attention of q (rope(q)) over the cache
    batch_cache_attention(q, k, v, kcs, vcs, positions)
                                            -> cache_attention of each row on its own cache at its own
                                               position (a batched decoding step)

Each is one backend primitive (core/backends/base.py composes it from the others for
backends without a kernel). With a gradient to record they run the same maths through
differentiable ops instead.
"""
import math

from .. import dtypes as D
from ..autograd import needs_grad
from ..backends.operand import QKV, KVCache, Operand, QuantWeight, Rotary, operand_of
from ..backends.specs import BatchCacheAttentionSpec, CacheAttentionSpec, LinearSpec, NormSpec
from ..errors import DTypeError, ShapeError, UnsupportedError
from .arguments import check_devices, float_input
from .elementwise import binary, unary
from .index import assign
from .linalg import keeps_f16_weight, linear, matmul
from .new import new_full
from .nn import attention, layer_norm, rms_norm, rotary_emb
from .shape import cat, narrow, reshape, t

# The activations a gated projection may apply to its gate half (unary op names).
GATE_ACTS = ("silu", "gelu", "gelu_tanh", "relu")
_ACTS_OR_NONE = GATE_ACTS + (None,)


def add_rms_norm(x, residual, weight=None, eps=1e-6):
    """(x + residual, rms_norm(x + residual, weight, eps)): a residual add and the norm after it."""
    x, residual = float_input(x, "add_rms_norm"), float_input(residual, "add_rms_norm")
    check_devices("add_rms_norm", x, residual, weight)
    if x.shape != residual.shape:
        raise ShapeError(f"add_rms_norm: x {x.shape} and residual {residual.shape} must have the same shape")
    if weight is not None and weight.shape != (x.shape[-1],):
        raise ShapeError(f"add_rms_norm: weight of shape {weight.shape} does not match the last dim of {x.shape}")
    dtype = D.promote(x.dtype, residual.dtype)
    x, residual = x.to(dtype), residual.to(dtype)
    w = weight.to(dtype) if weight is not None else None
    if needs_grad(x, residual, w):
        total = binary(x, residual, "add")
        return total, rms_norm(total, w, eps)
    total, normed = x.device.backend.add_rms_norm(operand_of(x), operand_of(residual), operand_of(w), dtype, eps)
    return x._new(total, x.shape, dtype), x._new(normed, x.shape, dtype)


def add_layer_norm(x, residual, weight=None, bias=None, eps=1e-5):
    """(x + residual, layer_norm(x + residual, weight, bias, eps)): a residual add and the norm after it."""
    x, residual = float_input(x, "add_layer_norm"), float_input(residual, "add_layer_norm")
    check_devices("add_layer_norm", x, residual, weight, bias)
    if x.shape != residual.shape:
        raise ShapeError(f"add_layer_norm: x {x.shape} and residual {residual.shape} must have the same shape")
    for p in (weight, bias):
        if p is not None and p.shape != (x.shape[-1],):
            raise ShapeError(f"add_layer_norm: weight/bias of shape {p.shape} does not match the last dim of {x.shape}")
    dtype = D.promote(x.dtype, residual.dtype)
    x, residual = x.to(dtype), residual.to(dtype)
    w = weight.to(dtype) if weight is not None else None
    b = bias.to(dtype) if bias is not None else None
    if needs_grad(x, residual, w, b):
        total = binary(x, residual, "add")
        return total, layer_norm(total, w, b, eps)
    total, normed = x.device.backend.add_layer_norm(operand_of(x), operand_of(residual), operand_of(w),
                                                    operand_of(b), dtype, eps)
    return x._new(total, x.shape, dtype), x._new(normed, x.shape, dtype)


def gated_linear(x, weight, act="silu"):
    """act(x @ gate.T) * (x @ up.T) where weight is [gate; up] (2n, k) rows, float or quantised:
    a GLU MLP's gate and up projections as one. x (..., k) -> (..., n)."""
    if act not in GATE_ACTS:
        raise UnsupportedError(f"gated_linear: activation {act!r} is not supported ({', '.join(GATE_ACTS)})")
    x = float_input(x, "gated_linear")
    check_devices("gated_linear", x, weight)
    if weight.ndim != 2 or weight.shape[0] % 2:
        raise ShapeError(f"gated_linear: weight must be (2 * out, in) rows [gate; up], got shape {weight.shape}")
    n2, k = weight.shape
    n = n2 // 2
    if x.ndim == 0 or x.shape[-1] != k:
        raise ShapeError(f"gated_linear: input {x.shape} has {x.shape[-1] if x.ndim else 0} features, "
                         f"weight {weight.shape} expects {k}")
    lead = x.shape[:-1]
    if weight.dtype.is_quantized:
        if not weight._layout.is_contiguous() or weight._layout.offset:
            raise UnsupportedError("gated_linear: a quantised weight must be the whole stored (2 * out, in) matrix")
        dtype = x.dtype
        if needs_grad(x):
            return _gate_composed(matmul(x, t(weight)), n, act)
        st = x.device.backend.gated_qmatmul(operand_of(x), QuantWeight(weight._storage, weight.dtype, n2, k), dtype,
                                            act)
        return x._new(st, lead + (n,), dtype)
    if not weight.dtype.is_float:
        raise DTypeError(f"gated_linear: weight dtype {weight.dtype.name} is not a float or GGUF block type")
    dtype = D.promote(x.dtype, weight.dtype)
    x2, wt = reshape(x.to(dtype), (-1, k)), t(weight.to(dtype))
    if needs_grad(x2, wt):
        return reshape(_gate_composed(matmul(x2, wt), n, act), lead + (n,))
    st = x.device.backend.gated_matmul(operand_of(x2), operand_of(wt), dtype, act)
    return x._new(st, lead + (n,), dtype)


def _gate_composed(y, n, act):
    return binary(unary(narrow(y, -1, 0, n), act), narrow(y, -1, n, n), "mul")


def kv_write(k, v, k_slot, v_slot):
    """Write k into k_slot and v into v_slot in place (views of a preallocated KV cache at the
    new positions), as one op. All (b, heads, t, d); each slot has its tensor's shape."""
    check_devices("kv_write", k, v, k_slot, v_slot)
    if k.ndim != 4 or v.ndim != 4 or k_slot.shape != k.shape or v_slot.shape != v.shape:
        raise ShapeError(f"kv_write: k {k.shape} and v {v.shape} must be (batch, heads, seq, head_dim) and fit their "
                         f"cache slots {k_slot.shape} and {v_slot.shape}")
    if k_slot.dtype is not v_slot.dtype or not k_slot.dtype.is_float:
        raise DTypeError(f"kv_write: the key and value caches must share one float dtype, got "
                         f"{k_slot.dtype.name} and {v_slot.dtype.name}")
    dtype = k_slot.dtype
    k, v = float_input(k, "kv_write").to(dtype), float_input(v, "kv_write").to(dtype)
    if k_slot.numel() or v_slot.numel():
        k.device.backend.kv_write(operand_of(k), operand_of(v), KVCache(operand_of(k_slot), operand_of(v_slot)),
                                  dtype)


def rope_kv_write(q, k, v, cos, sin, k_slot, v_slot, interleaved=False):
    """Rotary embedding fused with the KV-cache write. Returns rope(q); writes rope(k) into
    k_slot and v into v_slot in place (views of a preallocated cache at the new positions).
    q (b, h, t, d), k and v (b, hk, t, d) with k_slot/v_slot of k's/v's shape, cos/sin (t, d/2)."""
    q, k, v = (float_input(a, "rope_kv_write") for a in (q, k, v))
    check_devices("rope_kv_write", q, k, v, cos, sin, k_slot, v_slot)
    if q.ndim != 4 or k.ndim != 4 or q.shape[-1] % 2:
        raise ShapeError(f"rope_kv_write: q and k must be (batch, heads, seq, even head_dim), got {q.shape} and "
                         f"{k.shape}")
    b, _, tl, d = q.shape
    if k.shape[0] != b or k.shape[2:] != (tl, d) or v.shape != k.shape:
        raise ShapeError(f"rope_kv_write: q {q.shape}, k {k.shape} and v {v.shape} do not fit "
                         "(same batch, seq and head_dim; k and v the same shape)")
    if k_slot.shape != k.shape or v_slot.shape != v.shape:
        raise ShapeError(f"rope_kv_write: cache slots {k_slot.shape} and {v_slot.shape} must have k's shape {k.shape}")
    if k_slot.dtype is not v_slot.dtype or not k_slot.dtype.is_float:
        raise DTypeError(f"rope_kv_write: the key and value caches must share one float dtype, got "
                         f"{k_slot.dtype.name} and {v_slot.dtype.name}")
    want = (tl, d // 2)
    if cos.shape != want or sin.shape != want:
        raise ShapeError(f"rope_kv_write: cos/sin must have shape {want} for q {q.shape}, got {cos.shape} and "
                         f"{sin.shape}")
    dtype = k_slot.dtype
    q, k, v, c, s = (a.to(dtype) for a in (q, k, v, cos, sin))
    if needs_grad(q, k, v, c, s):
        assign(k_slot, k_slot._layout, rotary_emb(k, c, s, interleaved))
        assign(v_slot, v_slot._layout, v)
        return rotary_emb(q, c, s, interleaved)
    st = q.device.backend.rope_kv_write(_qkv(q, k, v), Rotary(operand_of(c), operand_of(s), interleaved),
                                        KVCache(operand_of(k_slot), operand_of(v_slot)), dtype)
    return q._new(st, q.shape, dtype)


def cache_attention(q, k, v, k_cache, v_cache, position, cos=None, sin=None, interleaved=False, scale=None,
                    key_start=0, mask=None, window=None):
    """Append the new keys and values to a preallocated KV cache and attend over it, as one op.

    Writes k (rotated, when cos and sin are given) and v into k_cache and v_cache at positions
    [position, position + t), and returns causal attention of q (rotated likewise) over the
    cache's keys [key_start, position + t): query i, at position + i, sees the keys up to its
    own. q (b, h, t, d); k (b, hk, t, d) and v (b, hk, t, dv) with h a multiple of hk (GQA);
    k_cache (b, hk, capacity, d), v_cache (b, hk, capacity, dv); cos/sin (t, d/2), full-width
    rotary (half-split, or GPT-J pairs with interleaved). scale: of the scores (default
    d**-0.5). mask: bool (True: may attend) or additive, broadcast to (b, h, t, keys), for a
    sliding window's earlier queries. window: a one-query step of a sliding-window layer says its
    window, key_start then being max(0, position + 1 - window), so that a captured step slides it
    at later positions (CacheAttentionSpec). Returns (b, h, t, dv) in the cache's dtype."""
    q, k, v = float_input(q, "cache_attention"), float_input(k, "cache_attention"), float_input(v, "cache_attention")
    check_devices("cache_attention", q, k, v, k_cache, v_cache, cos, sin, mask)
    kc_shape, vc_shape = k_cache.shape, v_cache.shape
    if not len(q.shape) == len(k.shape) == len(v.shape) == len(kc_shape) == len(vc_shape) == 4:
        raise ShapeError(f"cache_attention: q {q.shape}, k {k.shape}, v {v.shape} and the caches {kc_shape}, "
                         f"{vc_shape} must all be (batch, heads, positions, head_dim)")
    b, h, t, d = q.shape
    hk, dv = k.shape[1], v.shape[3]
    if k.shape != (b, hk, t, d) or v.shape != (b, hk, t, dv) or hk == 0 or h % hk:
        raise ShapeError(f"cache_attention: q {q.shape}, k {k.shape} and v {v.shape} do not fit (same batch and "
                         "positions, k with q's head_dim, q's heads a multiple of k's)")
    cap = kc_shape[2]
    if kc_shape != (b, hk, cap, d) or vc_shape != (b, hk, cap, dv):
        raise ShapeError(f"cache_attention: caches {k_cache.shape} and {v_cache.shape} must be (batch, kv heads, "
                         f"capacity, head_dim) for k {k.shape} and v {v.shape}")
    if not 0 <= key_start <= position or position + t > cap:
        raise ShapeError(f"cache_attention: positions {position}..{position + t - 1} (keys from {key_start}) do not "
                         f"fit a cache of capacity {cap}: grow the cache first (nn.KVCache.reserve does)")
    if k_cache.dtype is not v_cache.dtype or not k_cache.dtype.is_float:
        raise DTypeError(f"cache_attention: the key and value caches must share one float dtype, got "
                         f"{k_cache.dtype.name} and {v_cache.dtype.name}")
    if (cos is None) != (sin is None):
        raise ShapeError("cache_attention: give both cos and sin (rotary) or neither")
    if cos is not None and (d % 2 or cos.shape != (t, d // 2) or sin.shape != (t, d // 2)):
        raise ShapeError(f"cache_attention: cos/sin must have shape {(t, d // 2)} for q {q.shape} (an even head_dim), "
                         f"got {cos.shape} and {sin.shape}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1 or t != 1
                               or mask is not None or key_start != max(0, position + 1 - window)):
        raise ShapeError(f"cache_attention: window={window!r} is for one query without a mask whose key_start is "
                         f"max(0, position + 1 - window); got {t} queries, key_start {key_start} at position "
                         f"{position}")
    tk = position + t - key_start
    dtype = k_cache.dtype
    q, k, v, cos, sin = _cast(dtype, q, k, v, cos, sin)
    if mask is not None:
        if mask.dtype is D.bool_:
            mask = new_full(q, (), 0.0, dtype).where(mask, float("-inf"))
        mask = mask.to(dtype)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if needs_grad(q, k, v, cos, sin, mask):
        k_slot, v_slot = narrow(k_cache, 2, position, t), narrow(v_cache, 2, position, t)
        if cos is None:
            kv_write(k, v, k_slot, v_slot)
        else:
            q = rope_kv_write(q, k, v, cos, sin, k_slot, v_slot, interleaved)
        return attention(q, narrow(k_cache, 2, key_start, tk), narrow(v_cache, 2, key_start, tk), mask, True, scale)
    lmask = None if mask is None else mask._layout.broadcast_to((b, h, t, tk), "cache_attention mask")
    st = q.device.backend.cache_attention(_qkv(q, k, v), KVCache(operand_of(k_cache), operand_of(v_cache)),
                                          _rotary(cos, sin, interleaved),
                                          None if mask is None else Operand(mask._storage, lmask), dtype,
                                          CacheAttentionSpec(position, key_start, scale, window))
    return q._new(st, (b, h, t, dv), dtype)



def batch_cache_attention(q, k, v, k_caches, v_caches, positions, cos=None, sin=None, interleaved=False, scale=None,
                          key_starts=None):
    """cache_attention of a batch of sequences, one new position each, every row with its own KV
    cache, as one op (a batched decoding step's attention for one layer).

    Row i of q (b, h, 1, d), k (b, hk, 1, d) and v (b, hk, 1, dv) is written into k_caches[i] and
    v_caches[i] (1, hk, capacity, d/dv; each its own capacity) at positions[i] (k rotated by row
    i of cos/sin (b, d/2) when given) and attends over that cache's keys [key_starts[i],
    positions[i] + 1) (default 0). Returns (b, h, 1, dv); row i equals cache_attention of that
    row alone."""
    what = "batch_cache_attention"
    q, k, v = float_input(q, what), float_input(k, what), float_input(v, what)
    b = len(k_caches)
    key_starts = [0] * b if key_starts is None else list(key_starts)
    positions = list(positions)
    if not b or not len(v_caches) == len(positions) == len(key_starts) == b:
        raise ShapeError(f"{what}: {len(k_caches)} key caches, {len(v_caches)} value caches, {len(positions)} "
                         f"positions and {len(key_starts)} key starts: give one of each per sequence (at least one)")
    check_devices(what, q, k, v, cos, sin, *k_caches, *v_caches)
    if not len(q.shape) == len(k.shape) == len(v.shape) == 4 or q.shape[0] != b or q.shape[2] != 1:
        raise ShapeError(f"{what}: q {q.shape}, k {k.shape} and v {v.shape} must be (batch, heads, 1, head_dim) "
                         f"with one row per cache ({b})")
    h, d = q.shape[1], q.shape[3]
    hk, dv = k.shape[1], v.shape[3]
    if k.shape != (b, hk, 1, d) or v.shape != (b, hk, 1, dv) or hk == 0 or h % hk:
        raise ShapeError(f"{what}: q {q.shape}, k {k.shape} and v {v.shape} do not fit (same batch, one position, "
                         "k with q's head_dim, q's heads a multiple of k's)")
    dtype = k_caches[0].dtype
    if not dtype.is_float:
        raise DTypeError(f"{what}: the caches must have a float dtype, got {dtype.name}")
    for i, (kc, vc) in enumerate(zip(k_caches, v_caches)):
        cap = kc.shape[2] if len(kc.shape) == 4 else -1
        if kc.shape != (1, hk, cap, d) or vc.shape != (1, hk, cap, dv):
            raise ShapeError(f"{what}: caches {kc.shape} and {vc.shape} of row {i} must be (1, kv heads, capacity, "
                             f"head_dim) for k {k.shape} and v {v.shape}")
        if kc.dtype is not dtype or vc.dtype is not dtype:
            raise DTypeError(f"{what}: every key and value cache must have one float dtype ({dtype.name}), got "
                             f"{kc.dtype.name} and {vc.dtype.name} in row {i}")
        if not 0 <= key_starts[i] <= positions[i] < cap:
            raise ShapeError(f"{what}: position {positions[i]} (keys from {key_starts[i]}) of row {i} does not fit "
                             f"a cache of capacity {cap}: grow the cache first (nn.KVCache.reserve does)")
    if (cos is None) != (sin is None):
        raise ShapeError(f"{what}: give both cos and sin (rotary) or neither")
    if cos is not None and (d % 2 or cos.shape != (b, d // 2) or sin.shape != (b, d // 2)):
        raise ShapeError(f"{what}: cos/sin must have shape {(b, d // 2)} (one rotary row per sequence) for q "
                         f"{q.shape} (an even head_dim), got {cos.shape} and {sin.shape}")
    q, k, v, cos, sin = _cast(dtype, q, k, v, cos, sin)
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    if needs_grad(q, k, v, cos, sin):
        rows = [cache_attention(narrow(q, 0, i, 1), narrow(k, 0, i, 1), narrow(v, 0, i, 1), k_caches[i], v_caches[i],
                                positions[i], None if cos is None else narrow(cos, 0, i, 1),
                                None if sin is None else narrow(sin, 0, i, 1), interleaved, scale, key_starts[i])
                for i in range(b)]
        return cat(rows, 0)
    caches = [KVCache(operand_of(kc), operand_of(vc)) for kc, vc in zip(k_caches, v_caches)]
    st = q.device.backend.batch_cache_attention(_qkv(q, k, v), caches, _rotary(cos, sin, interleaved), dtype,
                                                BatchCacheAttentionSpec(tuple(positions), tuple(key_starts), scale))
    return q._new(st, (b, h, 1, dv), dtype)

NORM_KINDS = ("rms", "layer")


def add_norm_linear(x, residual, norm_weight, norm_bias, weight, bias=None, kind="rms", eps=1e-6, act=None,
                    gated=False):
    """(hidden, y): a residual add, the norm after it and the projection that reads it, as one op
    (on wgpu one kernel when decoding one row). hidden = x + residual (x itself when residual is
    None); normed = rms_norm(hidden, norm_weight) (kind "rms"; norm_bias must be None) or
    layer_norm(hidden, norm_weight, norm_bias) ("layer"), either weight may be None; then
    y = linear(normed, weight, bias), with act (a unary op name) applied to it, or with gated,
    act(gate) * up for weight rows [gate; up] as gated_linear (no bias). weight (n, k) float or
    GGUF blocks; x (..., k) -> y (..., n), or (..., n / 2) gated."""
    what = "add_norm_linear"
    if kind not in NORM_KINDS:
        raise UnsupportedError(f"{what}: norm kind {kind!r} is not one of {', '.join(NORM_KINDS)}")
    if kind == "rms" and norm_bias is not None:
        raise UnsupportedError(f"{what}: an RMS norm has no bias; pass norm_bias=None or kind='layer'")
    if act not in (GATE_ACTS if gated else _ACTS_OR_NONE):
        raise UnsupportedError(f"{what}: activation {act!r} is not supported "
                               f"({', '.join(GATE_ACTS)}{'' if gated else ' or None'})")
    if gated and bias is not None:
        raise UnsupportedError(f"{what}: a gated projection takes no bias (use linear and the gate apart)")
    x = float_input(x, what)
    if residual is not None:
        residual = float_input(residual, what)
    check_devices(what, x, residual, norm_weight, norm_bias, weight, bias)
    shape = x.shape
    if not shape or (residual is not None and residual.shape != shape):
        raise ShapeError(f"{what}: x {shape} and residual {None if residual is None else residual.shape} must "
                         "have the same shape, with at least one dim")
    k = shape[-1]
    for name, p in (("norm_weight", norm_weight), ("norm_bias", norm_bias)):
        if p is not None and p.shape != (k,):
            raise ShapeError(f"{what}: {name} of shape {p.shape} does not match the last dim of x {shape}")
    wshape = weight.shape
    if len(wshape) != 2 or wshape[1] != k or (gated and wshape[0] % 2):
        raise ShapeError(f"{what}: weight {wshape} must be ({'2 * out' if gated else 'out'}, {k}) rows for "
                         f"x {shape}" + (" ([gate; up])" if gated else ""))
    rows = wshape[0]
    if bias is not None and bias.shape != (rows,):
        raise ShapeError(f"{what}: bias of shape {bias.shape} does not match weight {wshape}")
    quantised = weight.dtype.is_quantized
    if not quantised and not weight.dtype.is_float:
        raise DTypeError(f"{what}: weight dtype {weight.dtype.name} is not a float or GGUF block type")
    dtype = D.promote(x.dtype, residual.dtype) if residual is not None else x.dtype
    if not quantised:
        dtype = D.promote(dtype, weight.dtype)
    elif not weight._layout.is_contiguous() or weight._layout.offset:
        raise UnsupportedError(f"{what}: a quantised weight must be the whole stored (out, in) matrix")
    x, r, nw, nb, b = _cast(dtype, x, residual, norm_weight, norm_bias, bias)
    w = weight if quantised or keeps_f16_weight(x, weight, dtype, residual, norm_weight, norm_bias, bias) \
        else weight.to(dtype)
    if needs_grad(x, r, nw, nb, w, b):
        # The same maths through differentiable ops.
        hidden = x if r is None else binary(x, r, "add")
        normed = layer_norm(hidden, nw, nb, eps) if kind == "layer" else rms_norm(hidden, nw, eps)
        if gated:
            return hidden, gated_linear(normed, w, act)
        y = linear(normed, w, b)
        return hidden, y if act is None else unary(y, act)
    weight_op = QuantWeight(w._storage, w.dtype, *w.shape) if quantised else operand_of(w)
    total, y = x.device.backend.add_norm_linear(
        operand_of(x), operand_of(r), NormSpec(operand_of(nw), operand_of(nb), eps, kind == "layer"),
        LinearSpec(weight_op, operand_of(b), act, gated), dtype)
    hidden = x if total is None else x._new(total, shape, dtype)
    return hidden, x._new(y, shape[:-1] + (rows // 2 if gated else rows,), dtype)


def _qkv(q, k, v):
    return QKV(operand_of(q), operand_of(k), operand_of(v))


def _rotary(cos, sin, interleaved):
    return None if cos is None else Rotary(operand_of(cos), operand_of(sin), interleaved)


def _cast(dtype, *tensors):
    """The tensors in dtype (None stays None): one call, no conversion for those already in it."""
    return [t if t is None or t.dtype is dtype else t.to(dtype) for t in tensors]
