"""Dequantisation of GGUF blocks in pure Python (for Pyodide without numpy).

Speed comes from doing the per-element work in C: for each (sub-)block we
build a small table of its possible output values (d * q + m for every q),
then `map(table.__getitem__, index_bytes)` turns the packed bytes into floats
without a Python-level operation per element. Index bytes are produced for
the whole tensor at once with `bytes.translate` and big-integer bit tricks.
Values are computed in double (exact for these products of f16 scales and
small integers) and rounded once when stored into array('f'), which gives the
same float32 bits as ggml's float32 arithmetic.
"""
import struct
from array import array

from ..errors import FormatError
from .formats import quant_dtype

_LOW = bytes(i & 0x0F for i in range(256))
_HIGH = bytes(i >> 4 for i in range(256))
_CRUMB = [bytes((i >> s) & 3 for i in range(256)) for s in (0, 2, 4, 6)]
_BIT = [bytes((i >> s) & 1 for i in range(256)) for s in range(8)]
_RANGES = {n: range(n) for n in (4, 8, 16, 32, 64)}
_FLUSH = 8192  # floats gathered in a list before moving them into the array

_F16 = struct.Struct("<e")


def _or(a, b):
    """Byte-wise OR of two equal-length byte strings, in one C-level big-int op."""
    return (int.from_bytes(a, "little") | int.from_bytes(b, "little")).to_bytes(len(a), "little")


def _shl(a, n):
    """Every byte of `a` shifted left by n (bytes hold small values, so no carry)."""
    return (int.from_bytes(a, "little") << n).to_bytes(len(a) + 1, "little")[:len(a)]


def _gather(data, stride, start, length):
    """The `length`-byte field at `start` of every `stride`-byte block, concatenated."""
    return b"".join(data[o + start:o + start + length] for o in range(0, len(data), stride))


def _sink():
    out = array("f")
    buf = []

    def flush():
        out.fromlist(buf)
        buf.clear()
    return out, buf, flush


def _q4_0(data, nb):
    qs = _gather(data, 18, 2, 16)
    lo, hi = qs.translate(_LOW), qs.translate(_HIGH)
    out, buf, flush = _sink()
    f16 = _F16.unpack_from
    for i in range(nb):
        d = f16(data, 18 * i)[0]
        table = [d * (q - 8) for q in range(16)]
        buf += map(table.__getitem__, lo[16 * i:16 * i + 16])
        buf += map(table.__getitem__, hi[16 * i:16 * i + 16])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q4_1(data, nb):
    qs = _gather(data, 20, 4, 16)
    lo, hi = qs.translate(_LOW), qs.translate(_HIGH)
    out, buf, flush = _sink()
    dm = struct.Struct("<ee").unpack_from
    for i in range(nb):
        d, m = dm(data, 20 * i)
        table = [d * q + m for q in range(16)]
        buf += map(table.__getitem__, lo[16 * i:16 * i + 16])
        buf += map(table.__getitem__, hi[16 * i:16 * i + 16])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q5_indices(data, bb, qh_at, qs_at):
    """Per block 32 five-bit values: element e (low nibbles of qs for e < 16, high
    nibbles after) with bit e of the little-endian u32 qh on top."""
    qs = _gather(data, bb, qs_at, 16)
    qh = _gather(data, bb, qh_at, 4)
    nb = len(qs) // 16
    bits = bytearray(32 * nb)
    for s in range(8):
        plane = qh.translate(_BIT[s])  # bit s of every qh byte
        for byte in range(4):
            bits[8 * byte + s::32] = plane[byte::4]
    nibbles = bytearray(32 * nb)
    low, high = qs.translate(_LOW), qs.translate(_HIGH)
    for j in range(16):
        nibbles[j::32] = low[j::16]
        nibbles[16 + j::32] = high[j::16]
    return _or(bytes(nibbles), _shl(bytes(bits), 4))


def _q5_0(data, nb):
    idx = _q5_indices(data, 22, 2, 6)
    out, buf, flush = _sink()
    f16 = _F16.unpack_from
    for i in range(nb):
        d = f16(data, 22 * i)[0]
        table = [d * (q - 16) for q in range(32)]
        buf += map(table.__getitem__, idx[32 * i:32 * i + 32])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q5_1(data, nb):
    idx = _q5_indices(data, 24, 4, 8)
    out, buf, flush = _sink()
    dm = struct.Struct("<ee").unpack_from
    for i in range(nb):
        d, m = dm(data, 24 * i)
        table = [d * q + m for q in range(32)]
        buf += map(table.__getitem__, idx[32 * i:32 * i + 32])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q8_0(data, nb):
    qs = memoryview(_gather(data, 34, 2, 32)).cast("b")
    out, buf, flush = _sink()
    f16 = _F16.unpack_from
    for i in range(nb):
        d = f16(data, 34 * i)[0]
        buf += [d * q for q in qs[32 * i:32 * i + 32]]
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _crumbs(qs64):
    """64 bytes of 2-bit values -> 256 values in ggml order (per 32-byte half: shifts 0, 2, 4, 6)."""
    return b"".join(qs64[h:h + 32].translate(_CRUMB[s]) for h in (0, 32) for s in range(4))


def _q2_k(data, nb):
    out, buf, flush = _sink()
    dm = struct.Struct("<ee").unpack_from
    for i in range(nb):
        o = 84 * i
        scales = data[o:o + 16]
        q = _crumbs(data[o + 16:o + 80])
        d, dmin = dm(data, o + 80)
        for g in range(16):
            sc = scales[g]
            dl, ml = d * (sc & 15), dmin * (sc >> 4)
            table = [dl * v - ml for v in range(4)]
            buf += map(table.__getitem__, q[16 * g:16 * g + 16])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q3_k(data, nb):
    out, buf, flush = _sink()
    f16 = _F16.unpack_from
    for i in range(nb):
        o = 110 * i
        hmask = data[o:o + 32]
        low = _crumbs(data[o + 32:o + 96])
        s = data[o + 96:o + 108]
        d = f16(data, o + 108)[0]
        high = b"".join(hmask.translate(_BIT[b]) for b in range(8))
        idx = _or(low, _shl(high, 2))  # q + 4 * hbit, in 0..7; value = that - 4
        for g in range(16):
            lo4 = (s[g] if g < 8 else s[g - 8] >> 4) & 15
            hi2 = (s[8 + g % 4] >> (2 * (g // 4))) & 3
            dl = d * ((lo4 | (hi2 << 4)) - 32)
            table = [dl * (v - 4) for v in range(8)]
            buf += map(table.__getitem__, idx[16 * g:16 * g + 16])
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _k4_scales_mins(s):
    sc = [s[j] & 63 for j in range(4)] + [(s[j + 4] & 15) | ((s[j - 4] >> 6) << 4) for j in range(4, 8)]
    mn = [s[j + 4] & 63 for j in range(4)] + [(s[j + 4] >> 4) | ((s[j] >> 6) << 4) for j in range(4, 8)]
    return sc, mn


def _q4_k(data, nb):
    out, buf, flush = _sink()
    dm = struct.Struct("<ee").unpack_from
    for i in range(nb):
        o = 144 * i
        d, dmin = dm(data, o)
        sc, mn = _k4_scales_mins(data[o + 4:o + 16])
        qs = data[o + 16:o + 144]
        for j in range(8):
            dl, ml = d * sc[j], dmin * mn[j]
            table = [dl * v - ml for v in range(16)]
            run = qs[32 * (j >> 1):32 * (j >> 1) + 32]
            buf += map(table.__getitem__, run.translate(_HIGH if j & 1 else _LOW))
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q5_k(data, nb):
    out, buf, flush = _sink()
    dm = struct.Struct("<ee").unpack_from
    for i in range(nb):
        o = 176 * i
        d, dmin = dm(data, o)
        sc, mn = _k4_scales_mins(data[o + 4:o + 16])
        qh = data[o + 16:o + 48]
        qs = data[o + 48:o + 176]
        for j in range(8):
            dl, ml = d * sc[j], dmin * mn[j]
            table = [dl * v - ml for v in range(32)]
            run = qs[32 * (j >> 1):32 * (j >> 1) + 32].translate(_HIGH if j & 1 else _LOW)
            idx = _or(run, _shl(qh.translate(_BIT[j]), 4))
            buf += map(table.__getitem__, idx)
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


_MINUS32 = bytes((i - 32) & 0xFF for i in range(256))


def _q6_k(data, nb):
    out, buf, flush = _sink()
    f16 = _F16.unpack_from
    for i in range(nb):
        o = 210 * i
        ql = data[o:o + 128]
        qh = data[o + 128:o + 192]
        scales = memoryview(data[o + 192:o + 208]).cast("b")
        d = f16(data, o + 208)[0]
        # 8 runs of 32: run r = half h (64 ql bytes, 32 qh bytes), part p (low/high nibble, crumb p)
        parts = []
        for h in range(2):
            lq, hq = ql[64 * h:64 * h + 64], qh[32 * h:32 * h + 32]
            for p in range(4):
                low = lq[32 * (p & 1):32 * (p & 1) + 32].translate(_HIGH if p >= 2 else _LOW)
                parts.append(_or(low, _shl(hq.translate(_CRUMB[p]), 4)))
        q = memoryview(b"".join(parts).translate(_MINUS32)).cast("b")
        for g in range(16):
            dl = d * scales[g]
            buf += [dl * v for v in q[16 * g:16 * g + 16]]
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


def _q8_k(data, nb):
    out, buf, flush = _sink()
    f32 = struct.Struct("<f").unpack_from
    for i in range(nb):
        o = 292 * i
        d = f32(data, o)[0]
        buf += [d * q for q in memoryview(data[o + 4:o + 260]).cast("b")]
        if len(buf) >= _FLUSH:
            flush()
    flush()
    return out


DECODERS = {"q4_0": _q4_0, "q4_1": _q4_1, "q5_0": _q5_0, "q5_1": _q5_1, "q8_0": _q8_0, "q2_k": _q2_k,
            "q3_k": _q3_k, "q4_k": _q4_k, "q5_k": _q5_k, "q6_k": _q6_k, "q8_k": _q8_k}


def _as_bytes(raw):
    if isinstance(raw, bytes):
        return raw
    mv = memoryview(raw)
    return mv.cast("B").tobytes() if mv.format != "B" or mv.ndim != 1 else mv.tobytes()


def dequantize_python(raw, qtype, numel):
    """array('f') of `numel` elements from the GGUF blocks in `raw` (any bytes-like)."""
    d = quant_dtype(qtype)
    if numel % d.block_size:
        raise FormatError(f"{d.name}: {numel} elements is not a whole number of {d.block_size}-element blocks")
    data = _as_bytes(raw)
    nb = numel // d.block_size
    if len(data) != nb * d.block_bytes:
        raise FormatError(f"{d.name}: {numel} elements need {nb * d.block_bytes} bytes, got {len(data)}")
    return DECODERS[d.name](data, nb)


def dequantize_rows_python(raw, qtype, k, row_ids):
    """array('f') of len(row_ids) * k: the listed rows (of k elements each), dequantised."""
    d = quant_dtype(qtype)
    if k % d.block_size:
        raise FormatError(f"{d.name}: row length {k} is not a whole number of {d.block_size}-element blocks")
    mv = memoryview(raw).cast("B") if not isinstance(raw, (bytes, bytearray)) else memoryview(raw)
    row_bytes = k // d.block_size * d.block_bytes
    if len(mv) % row_bytes:
        raise FormatError(f"{d.name}: {len(mv)} bytes is not a whole number of {row_bytes}-byte rows of {k}")
    nrows = len(mv) // row_bytes
    out = array("f")
    decode = DECODERS[d.name]
    for r in row_ids:
        r = int(r)
        if not 0 <= r < nrows:
            raise FormatError(f"{d.name}: row index {r} out of range for {nrows} rows")
        out += decode(mv[r * row_bytes:(r + 1) * row_bytes].tobytes(), k // d.block_size)
    return out
