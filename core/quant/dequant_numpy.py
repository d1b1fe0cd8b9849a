"""Vectorised dequantisation of GGUF blocks with numpy.

Each decoder takes the blocks as a (n_blocks, block_bytes) uint8 array and
returns (n_blocks, block_size) float32. The arithmetic is done in float32 in
the same order as ggml's reference (`dequantize_row_*`), so results are
bit-identical to the `gguf` package's and to llama.cpp's.
"""
from ..errors import FormatError
from .formats import QK_K, quant_dtype


def _np():
    import numpy
    return numpy


def _f16(blocks, start):
    np = _np()
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)  # (nb, 1)


def _nibbles(qs, group):
    """Split packed bytes (nb, n*group) into (nb, 2n, group): low nibbles of each
    `group`-byte run first, then its high nibbles (ggml's q4 packing)."""
    np = _np()
    nb = qs.shape[0]
    q = qs.reshape(nb, -1, 1, group) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(nb, -1, group)


def _bits(packed, count):
    """(nb, 32) bytes -> (nb, count, 32): plane i holds bit i of each byte."""
    np = _np()
    shifts = np.arange(count, dtype=np.uint8).reshape(1, count, 1)
    return (packed[:, None, :] >> shifts) & np.uint8(1)


def _q4_0(b):
    np = _np()
    q = _nibbles(b[:, 2:], 16).reshape(len(b), 32).astype(np.int8) - np.int8(8)
    return _f16(b, 0) * q.astype(np.float32)


def _q4_1(b):
    np = _np()
    q = _nibbles(b[:, 4:], 16).reshape(len(b), 32).astype(np.float32)
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_high(b, at):
    np = _np()
    qh = b[:, at:at + 4].copy().view(np.uint32)  # (nb, 1)
    return ((qh >> np.arange(32, dtype=np.uint32).reshape(1, 32)) & np.uint32(1)).astype(np.uint8)


def _q5_0(b):
    np = _np()
    q = _nibbles(b[:, 6:], 16).reshape(len(b), 32) | (_q5_high(b, 2) << np.uint8(4))
    return _f16(b, 0) * (q.astype(np.int8) - np.int8(16)).astype(np.float32)


def _q5_1(b):
    np = _np()
    q = _nibbles(b[:, 8:], 16).reshape(len(b), 32) | (_q5_high(b, 4) << np.uint8(4))
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _q8_0(b):
    np = _np()
    return _f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _crumbs(qs):
    """(nb, 64) bytes of 2-bit values -> (nb, 16, 16) in ggml's q2/q3 order."""
    np = _np()
    nb = qs.shape[0]
    q = qs.reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
    return (q & np.uint8(3)).reshape(nb, 16, 16)


def _q2_k(b):
    np = _np()
    nb = len(b)
    scales = b[:, :16]
    d, dmin = _f16(b, 80), _f16(b, 82)
    dl = (d * (scales & np.uint8(0x0F)).astype(np.float32)).reshape(nb, 16, 1)
    ml = (dmin * (scales >> np.uint8(4)).astype(np.float32)).reshape(nb, 16, 1)
    return (dl * _crumbs(b[:, 16:80]).astype(np.float32) - ml).reshape(nb, QK_K)


def _q3_k_scales(s):
    """12 bytes -> 16 signed 6-bit scales (low 4 bits from bytes 0-7, high 2 from 8-11)."""
    np = _np()
    nb = s.shape[0]
    low = (s[:, None, :8] >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)).reshape(nb, 16) & np.uint8(0x0F)
    high = (s[:, None, 8:12] >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 4, 1)).reshape(nb, 16) & np.uint8(3)
    return ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).astype(np.float32)


def _q3_k(b):
    np = _np()
    nb = len(b)
    dl = (_f16(b, 108) * _q3_k_scales(b[:, 96:108])).reshape(nb, 16, 1)
    low = _crumbs(b[:, 32:96])
    high = _bits(b[:, :32], 8).reshape(nb, 16, 16) ^ np.uint8(1)  # a clear bit means "subtract 4"
    q = (low.astype(np.int8) - (high << np.uint8(2)).astype(np.int8)).astype(np.float32)
    return (dl * q).reshape(nb, QK_K)


def k4_scales_mins(s):
    """The 8 six-bit scales and 8 mins packed in 12 bytes (ggml's get_scale_min_k4)."""
    np = _np()
    nb = s.shape[0]
    s = s.reshape(nb, 3, 4)
    a, m, hi = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([a & np.uint8(0x3F), (hi & np.uint8(0x0F)) | ((a >> np.uint8(2)) & np.uint8(0x30))], axis=1)
    mn = np.concatenate([m & np.uint8(0x3F), (hi >> np.uint8(4)) | ((m >> np.uint8(2)) & np.uint8(0x30))], axis=1)
    return sc, mn


def _k_scale_pair(b):
    np = _np()
    nb = len(b)
    sc, mn = k4_scales_mins(b[:, 4:16])
    d = (_f16(b, 0) * sc.astype(np.float32)).reshape(nb, 8, 1)
    dm = (_f16(b, 2) * mn.astype(np.float32)).reshape(nb, 8, 1)
    return d, dm


def _q4_k(b):
    np = _np()
    d, dm = _k_scale_pair(b)
    return (d * _nibbles(b[:, 16:], 32).astype(np.float32) - dm).reshape(len(b), QK_K)


def _q5_k(b):
    np = _np()
    d, dm = _k_scale_pair(b)
    q = _nibbles(b[:, 48:], 32) | (_bits(b[:, 16:48], 8) << np.uint8(4))
    return (d * q.astype(np.float32) - dm).reshape(len(b), QK_K)


def _q6_k(b):
    np = _np()
    nb = len(b)
    low = _nibbles(b[:, :128], 64).reshape(nb, 8, 32)
    high = (b[:, 128:192].reshape(nb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1))
    high = (high & np.uint8(3)).reshape(nb, 8, 32)
    q = ((low | (high << np.uint8(4))).astype(np.int8) - np.int8(32)).reshape(nb, 16, 16).astype(np.float32)
    d = (_f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)).reshape(nb, 16, 1)
    return (d * q).reshape(nb, QK_K)


def _q8_k(b):
    np = _np()
    d = b[:, :4].copy().view(np.float32)
    return d * b[:, 4:260].view(np.int8).astype(np.float32)


DECODERS = {"q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q8_0": _q8_0, "q2_k": _q2_k,
            "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "q8_k": _q8_k}


def as_blocks(raw, qtype, numel):
    """View raw bytes (any buffer or uint8 array) as (n_blocks, block_bytes) uint8,
    checking that they hold exactly `numel` elements of `qtype`."""
    np = _np()
    d = quant_dtype(qtype)
    if numel % d.block_size:
        raise FormatError(f"{d.name}: {numel} elements is not a whole number of {d.block_size}-element blocks")
    nblocks = numel // d.block_size
    arr = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    arr = arr.reshape(-1).view(np.uint8)
    if arr.size != nblocks * d.block_bytes:
        raise FormatError(f"{d.name}: {numel} elements need {nblocks * d.block_bytes} bytes, got {arr.size}")
    return d, arr.reshape(nblocks, d.block_bytes)


def dequantize_numpy(raw, qtype, numel):
    """float32 array of `numel` elements from the GGUF blocks in `raw` (uint8 ndarray or bytes-like)."""
    np = _np()
    d, blocks = as_blocks(raw, qtype, numel)
    with np.errstate(all="ignore"):  # corrupt scales may be inf/nan; the result says so
        return DECODERS[d.name](blocks).reshape(numel)


def block_rows(raw, qtype, k, row_ids):
    """Checked inputs of a row lookup in a block matrix of rows of k elements: (dtype info,
    rows as a (n, row_bytes) uint8 array, the row ids as int64). Shared by the numpy and
    numba embedding lookups."""
    np = _np()
    d = quant_dtype(qtype)
    if k % d.block_size:
        raise FormatError(f"{d.name}: row length {k} is not a whole number of {d.block_size}-element blocks")
    arr = raw if isinstance(raw, np.ndarray) else np.frombuffer(raw, dtype=np.uint8)
    row_bytes = k // d.block_size * d.block_bytes
    arr = arr.reshape(-1).view(np.uint8)
    if arr.size % row_bytes:
        raise FormatError(f"{d.name}: {arr.size} bytes is not a whole number of {row_bytes}-byte rows of {k}")
    rows = arr.reshape(-1, row_bytes)
    ids = np.asarray(row_ids, dtype=np.int64).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= rows.shape[0]):
        raise FormatError(f"{d.name}: row index out of range for {rows.shape[0]} rows")
    return d, rows, ids


def dequantize_rows_numpy(raw, qtype, k, row_ids):
    """(len(row_ids), k) float32: the listed rows of a matrix of rows of k elements (an embedding lookup)."""
    np = _np()
    d, rows, ids = block_rows(raw, qtype, k, row_ids)
    picked = rows[ids].reshape(-1, d.block_bytes)
    with np.errstate(all="ignore"):
        return DECODERS[d.name](picked).reshape(ids.size, k)
