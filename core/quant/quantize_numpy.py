"""Quantisation of float32 data into GGUF blocks with numpy.

Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference `quantize_row_*_ref`
step for step in float32 (bit-identical to the `gguf` package's quantizer).
Q4_K follows llama.cpp's `quantize_row_q4_K_ref`: per 32-element sub-block a
weighted least-squares search for scale and min (`make_qkx2_quants`), then
6-bit scales/mins relative to two f16 super-block scales. It runs the same
search vectorised over all sub-blocks; only the order of float additions in
its sums differs from the C loop.
"""
from ..errors import DTypeError, FormatError
from .formats import QK_K, quant_dtype


def _np():
    import numpy
    return numpy


def _f16_bytes(x):
    np = _np()
    return x.astype(np.float16).view(np.uint8).reshape(len(x), 2)


def _pack_nibbles(q, group):
    """(nb, 2*group*r) values < 16 -> bytes: each run of 2*group packs the first
    group as low nibbles and the second as high nibbles."""
    np = _np()
    q = q.reshape(len(q), -1, 2, group)
    return (q[:, :, 0] | (q[:, :, 1] << np.uint8(4))).reshape(len(q), -1)


def _inverse(d):
    np = _np()
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _round_away(x):
    """roundf(): halves away from zero."""
    np = _np()
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _q8_0(x):
    np = _np()
    d = np.abs(x).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_away(x * _inverse(d)).astype(np.int8).view(np.uint8)
    return np.concatenate([_f16_bytes(d), q], axis=1)


def _signed_max(x):
    np = _np()
    at = np.abs(x).argmax(axis=1)[:, None]
    return np.take_along_axis(x, at, axis=1)


def _q4_0(x):
    np = _np()
    d = _signed_max(x) / np.float32(-8)
    q = np.trunc(x * _inverse(d) + np.float32(8.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _pack_nibbles(q, 16)], axis=1)


def _q4_1(x):
    np = _np()
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(15)
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8).clip(0, 15)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), _pack_nibbles(q, 16)], axis=1)


def _q5_split(q):
    """32 five-bit values -> (qh: u32 of the fifth bits, qs: packed low nibbles)."""
    np = _np()
    qh = np.packbits(q >> np.uint8(4), axis=1, bitorder="little")  # (nb, 4) = little-endian u32
    return qh, _pack_nibbles(q & np.uint8(0x0F), 16)


def _q5_0(x):
    np = _np()
    d = _signed_max(x) / np.float32(-16)
    q = np.trunc(x * _inverse(d) + np.float32(16.5)).astype(np.uint8).clip(0, 31)
    qh, qs = _q5_split(q)
    return np.concatenate([_f16_bytes(d), qh, qs], axis=1)


def _q5_1(x):
    np = _np()
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    d = (hi - lo) / np.float32(31)
    q = np.trunc((x - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8).clip(0, 31)
    qh, qs = _q5_split(q)
    return np.concatenate([_f16_bytes(d), _f16_bytes(lo), qh, qs], axis=1)


def _make_qkx2_quants(x, w, nmax, rmin, rdelta, nstep):
    """llama.cpp's make_qkx2_quants over rows of x (m, n) with weights w:
    returns (scale (m,), min (m,) as a positive offset, L (m, n) uint8)."""
    np = _np()
    f32 = np.float32
    lo = np.minimum(x.min(axis=1), f32(0))
    hi = x.max(axis=1)
    sum_w = w.sum(axis=1, dtype=f32)
    sum_x = (w * x).sum(axis=1, dtype=f32)
    span = hi - lo
    flat = span == 0
    span = np.where(flat, f32(1), span)
    iscale = f32(nmax) / span
    scale = f32(1) / iscale
    L = np.clip(np.rint(iscale[:, None] * (x - lo[:, None])), 0, nmax).astype(f32)
    diff = scale[:, None] * L + lo[:, None] - x
    best = (w * diff * diff).sum(axis=1, dtype=f32)
    best_min = lo.copy()
    for step in range(nstep + 1):
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / span
        laux = np.clip(np.rint(iscale[:, None] * (x - lo[:, None])), 0, nmax).astype(f32)
        sum_l = (w * laux).sum(axis=1, dtype=f32)
        sum_l2 = (w * laux * laux).sum(axis=1, dtype=f32)
        sum_xl = (w * laux * x).sum(axis=1, dtype=f32)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            positive = this_min > 0
            this_scale = np.where(positive, sum_xl / sum_l2, this_scale)
        this_min = np.where(positive, f32(0), this_min)
        diff = this_scale[:, None] * laux + this_min[:, None] - x
        mad = (w * diff * diff).sum(axis=1, dtype=f32)
        better = ok & (mad < best)
        L = np.where(better[:, None], laux, L)
        best = np.where(better, mad, best)
        scale = np.where(better, this_scale, scale)
        best_min = np.where(better, this_min, best_min)
    scale = np.where(flat, f32(0), scale)
    L = np.where(flat[:, None], f32(0), L)
    return scale.astype(f32), (-best_min).astype(f32), L.astype(np.uint8)


def _q4_k(x):
    np = _np()
    f32 = np.float32
    nb = len(x)
    sub = x.reshape(nb * 8, 32)
    av = np.sqrt((sub * sub).sum(axis=1, dtype=f32) / f32(32))
    weights = av[:, None] + np.abs(sub)
    scales, mins, L = _make_qkx2_quants(sub, weights, 15, -1.0, 0.1, 20)
    scales, mins, L = scales.reshape(nb, 8), mins.reshape(nb, 8), L.reshape(nb, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), f32(0))
    max_min = np.maximum(mins.max(axis=1), f32(0))
    inv_scale = np.where(max_scale > 0, f32(63) / np.where(max_scale > 0, max_scale, f32(1)), f32(0))
    inv_min = np.where(max_min > 0, f32(63) / np.where(max_min > 0, max_min, f32(1)), f32(0))
    ls = np.minimum(np.rint(inv_scale[:, None] * scales), 63).astype(np.uint8)
    lm = np.minimum(np.rint(inv_min[:, None] * mins), 63).astype(np.uint8)
    packed = np.zeros((nb, 12), dtype=np.uint8)
    packed[:, 0:4] = ls[:, :4] | ((ls[:, 4:] >> 4) << 6)
    packed[:, 4:8] = lm[:, :4] | ((lm[:, 4:] >> 4) << 6)
    packed[:, 8:12] = (ls[:, 4:] & 0x0F) | ((lm[:, 4:] & 0x0F) << 4)
    d16 = (max_scale / f32(63)).astype(np.float16)
    dmin16 = (max_min / f32(63)).astype(np.float16)
    # requantise against the scales as they will be decoded
    d = (d16.astype(f32)[:, None] * ls.astype(f32))[:, :, None]
    dm = (dmin16.astype(f32)[:, None] * lm.astype(f32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        requant = np.clip(np.rint((x.reshape(nb, 8, 32) + dm) / d), 0, 15)
    L = np.where(d != 0, requant, L).astype(np.uint8)
    qs = _pack_nibbles(L.reshape(nb, QK_K), 32)
    head = np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2)], axis=1)
    return np.concatenate([head, packed, qs], axis=1)


ENCODERS = {"q8_0": _q8_0, "q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q4_k": _q4_k}
_CHUNK_BLOCKS = 1 << 14  # bounds the float32 temporaries of the Q4_K search


def quantize_numpy(x, qtype):
    """GGUF blocks (uint8 ndarray, shape (n_blocks, block_bytes)) for float data `x`
    (any shape; its size must be a whole number of blocks)."""
    np = _np()
    d = quant_dtype(qtype)
    if d.name not in ENCODERS:
        raise DTypeError(f"quantising to {d.name} is not implemented; can quantise to {', '.join(ENCODERS)}")
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if x.size % d.block_size:
        raise FormatError(f"{d.name}: {x.size} elements is not a whole number of {d.block_size}-element blocks")
    blocks = x.reshape(-1, d.block_size)
    encode = ENCODERS[d.name]
    out = np.empty((len(blocks), d.block_bytes), dtype=np.uint8)
    for start in range(0, len(blocks), _CHUNK_BLOCKS):
        out[start:start + _CHUNK_BLOCKS] = encode(blocks[start:start + _CHUNK_BLOCKS])
    return out
