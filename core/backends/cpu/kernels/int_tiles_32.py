"""Prompt products on the 32-value formats without a min (q4_0, q5_0, q8_0) as integer GEMM tiles whose
512-bit lanes are blocks: one float conversion, multiply and fused multiply-add per 16 blocks (512 values)
and (weight, activation) row pair, where int_tiles' 32-value tiles spend them per 2 blocks.

  * Activations (`quantize_32`): as int_tiles.quantize_i8 with 32 values a scale (ggml's Q8_0:
    d = amax / 127, round half away from zero; the same int8 values and scales), stored in the
    lane layout below, with each block's start -offset x (its values' sum).
  * Weights (`pack_rows`): a chunk of CHUNK_ROWS weight rows at a time is unpacked once per product
    into this thread's scratch: unsigned bytes ready for the byte product (q4_0 w + 8, q5_0 w + 16 with
    its fifth bits spread, q8_0 w + 128), the same lane layout, and the blocks' f16 scales as float32.
  * Lane layout: a row's blocks in groups of 16 (then one of 8, then one of 4: the row padded with
    zero blocks to a multiple of 4, and from 12 past a multiple of 16 to the next: padded_blocks),
    group of L blocks from block g as 8 vectors of 4L bytes, vector j holding values 4j...4j + 3 of
    block g + l in bytes 4l...4l + 3. So 8 byte products (vpdpbusd with AVX-512 VNNI; generic IR
    elsewhere) leave lane l the whole integer dot of block g + l, started from
    the activations' -offset x sum: the weights' offset, exact in int32 (|dot| <= 32 x 255 x 128).
    Then float(dot) x (d_w x dx) per lane into the pair's float accumulator.
  * Tiles: TILE = (weight rows, activation rows) per inner loop; the tile's weight rows stay in L1
    while the activation rows pass.

The product equals the int8 activations (dequantised) times the dequantised weights up to float32
rounding; `tile_py` (numpy, from the packed arrays) runs in the IR's place under NUMBA_DISABLE_JIT=1.
Learnt from ggml's Q8_0 prompt path and int_tiles.py; not copied. numba's on-disk cache keys a compiled
function on its own file: after editing vector_ir.py (whose helpers this inlines), touch this file.
"""
import functools

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from . import atomics, vector_ir
from .codes import entry
from .vector_ir import _const_vec, _hsum, _load, _splat, _vec

TILE = (4, 3)  # (weight rows, activation rows) per tile: best of 2-6 x 2-6 (docs/cpu-kernels.md, session 39)
CHUNK_ROWS = 16  # weight rows unpacked into the scratch at a time
FORMATS = (0, 2, 4)  # codes.FORMATS of q4_0, q5_0, q8_0
OFFSET = {0: 8, 2: 16, 4: 128}  # what pack_rows adds to each format's weights (unsigned bytes)

_I8, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
_FEATURES = vector_ir._cpu_features() if vector_ir._X86_MADD else set()
_VNNI = {"+avx512vnni", "+avx512bw", "+avx512vl"} <= _FEATURES  # vpdpbusd on 128, 256 and 512 bits



def padded_blocks(k):
    """Blocks a row of k values takes in the lane layout: k / 32 rounded up to a multiple of 4, and
    from 12 past a multiple of 16 to the next one (a group of 16 takes the 8 byte products that the
    8 and 4 left would take twice: Qwen2.5-0.5B's rows of 28 blocks ran at 0.65x the others' speed)."""
    nbp = (k // 32 + 3) // 4 * 4
    return nbp + 4 if nbp % 16 == 12 else nbp


@njit(cache=True, nogil=True, inline="always")
def _word_at(nbp, b):
    """The uint32 word index of values 0...3 of block b in a row of nbp (padded) blocks, and its
    group's width L (word j of the block: that + j L)."""
    n16 = nbp // 16 * 16
    if b < n16:
        g0, lanes = b - b % 16, 16
    elif nbp - n16 >= 8 and b < n16 + 8:
        g0, lanes = n16, 8
    else:
        base = n16 + (8 if nbp - n16 >= 8 else 0)
        g0, lanes = base + (b - base) // 4 * 4, 4
    return g0 * 8 + (b - g0), lanes


def _store_words(builder, base, word, lanes, u):
    """<32 x i8> u's 8 words (values 4j...4j + 3) at the i32 words base + word + j lanes."""
    words = builder.bitcast(u, _vec(_I32, 8))
    p = builder.bitcast(base, _I32.as_pointer())
    for j in range(8):
        at = builder.add(word, builder.mul(lanes, ir.Constant(_I64, j)))
        store = builder.store(builder.extract_element(words, ir.Constant(_I32, j)), builder.gep(p, [at]))
        store.align = 4


def _splat_i8(v, n=32):
    return _const_vec(_I8, [v - 256 if v > 127 else v] * n)


def _unsigned_quants(builder, fmt, raw, p):
    """Block p's 32 quants as unsigned bytes in value order: q4_0 w + 8 (its nibbles), q5_0 w + 16 (bit 4
    of value j: bit j of the 32-bit word after the scale), q8_0 w + 128."""
    if fmt == 4:
        return builder.xor(_load(builder, raw, builder.add(p, ir.Constant(_I64, 2)), _vec(_I8, 32)), _splat_i8(128))
    qs = _load(builder, raw, builder.add(p, ir.Constant(_I64, 2 if fmt == 0 else 6)), _vec(_I8, 16))
    u = builder.shuffle_vector(builder.and_(qs, _splat_i8(15, 16)), builder.lshr(qs, _splat_i8(4, 16)),
                               _const_vec(_I32, range(32)))
    if fmt == 0:
        return u
    word = _load(builder, raw, builder.add(p, ir.Constant(_I64, 2)), _vec(_I8, 4))
    spread = builder.shuffle_vector(word, word, _const_vec(_I32, [j // 8 for j in range(32)]))
    bit = builder.and_(spread, _const_vec(_I8, [1 << (j % 8) for j in range(32)]))
    return builder.or_(u, builder.select(builder.icmp_unsigned("!=", bit, _splat_i8(0)), _splat_i8(16), _splat_i8(0)))


def _make_pack_block(fmt):
    @intrinsic
    def pack_block(typingctx, raw, p, wp, word, lanes):
        """Block at byte p of raw (uint8) -> its unsigned quants (_unsigned_quants) as the 8 uint32 words
        word + j lanes of wp (uint8)."""
        if not _fits((raw, wp), (types.uint8, types.uint8), (1, 1)):
            return None
        sig = types.void(raw, p, wp, word, lanes)

        def codegen(context, builder, signature, args):
            t = signature.args
            raw_a = context.make_array(t[0])(context, builder, args[0])
            wp_a = context.make_array(t[2])(context, builder, args[2])
            p_, word_, lanes_ = (context.cast(builder, args[i], t[i], types.int64) for i in (1, 3, 4))
            u = _unsigned_quants(builder, fmt, builder.bitcast(raw_a.data, _I8.as_pointer()), p_)
            _store_words(builder, wp_a.data, word_, lanes_, u)
            return context.get_dummy_value()
        return sig, codegen
    return pack_block


_pack_q4, _pack_q5, _pack_q8 = (_make_pack_block(f) for f in FORMATS)


@intrinsic
def _quantize_block(typingctx, x, i, b, xp, word, lanes, dx, st, off):
    """x[i, 32 b...32 b + 31] (float32) -> round(x / d), d = amax / 127 (0 for an all-zero block),
    rounded half away from zero as int_dot._roundf, as 8 uint32 words word + j lanes of row i of xp;
    dx[i, b] = d, st[i, b] = -off x the values' sum."""
    if not _fits((x, xp, dx, st), (types.float32, types.uint8, types.float32, types.int32), (2, 2, 2, 2)):
        return None
    sig = types.void(x, i, b, xp, word, lanes, dx, st, off)

    def codegen(context, builder, signature, args):
        t = signature.args
        xa, xpa, dxa, sta = (context.make_array(t[j])(context, builder, args[j]) for j in (0, 3, 6, 7))
        i_, b_, word_, lanes_, off_ = (context.cast(builder, args[j], t[j], types.int64) for j in (1, 2, 4, 5, 8))
        k = builder.extract_value(xa.shape, 1)
        nbp = builder.extract_value(dxa.shape, 1)
        f32v = _vec(_F32, 32)
        xrow = builder.bitcast(builder.gep(xa.data, [builder.mul(i_, k)]), _I8.as_pointer())
        v = _load(builder, xrow, builder.mul(b_, ir.Constant(_I64, 128)), f32v)

        def call(name, ret, *a):
            fnty = ir.FunctionType(ret, [x_.type for x_ in a])
            return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), list(a))
        fabs = call("llvm.fabs.v32f32", f32v, v)
        amax = call("llvm.vector.reduce.fmax.v32f32", _F32, fabs)
        d = builder.fdiv(amax, ir.Constant(_F32, 127.0))
        inv = builder.select(builder.fcmp_ordered("!=", d, ir.Constant(_F32, 0.0)),
                             builder.fdiv(ir.Constant(_F32, 1.0), d), ir.Constant(_F32, 0.0))
        y = builder.fmul(v, _splat(builder, inv, 32))
        a = call("llvm.fabs.v32f32", f32v, y)
        f = call("llvm.floor.v32f32", f32v, a)
        two = ir.Constant(f32v, [ir.Constant(_F32, 2.0)] * 32)
        r = builder.fadd(f, call("llvm.floor.v32f32", f32v, builder.fmul(two, builder.fsub(a, f))))
        neg = builder.fcmp_ordered("<", y, ir.Constant(f32v, [ir.Constant(_F32, 0.0)] * 32))
        q = builder.fptosi(builder.select(neg, builder.fneg(r), r), _vec(_I32, 32))
        total = call("llvm.vector.reduce.add.v32i32", _I32, q)
        row = builder.mul(i_, nbp)
        builder.store(d, builder.gep(dxa.data, [builder.add(row, b_)]))
        builder.store(builder.mul(builder.trunc(builder.neg(off_), _I32), total),
                      builder.gep(sta.data, [builder.add(row, b_)]))
        xp_row = builder.gep(xpa.data, [builder.mul(row, ir.Constant(_I64, 32))])
        _store_words(builder, xp_row, word_, lanes_, builder.trunc(q, _vec(_I8, 32)))
        return context.get_dummy_value()
    return sig, codegen


def _words_py(buf, word, lanes, u):
    w32 = buf.view(np.uint32)
    for j, v in enumerate(np.ascontiguousarray(u).view(np.uint32)):
        w32[word + j * lanes] = v


def _pack_py(fmt, raw, p, wp, word, lanes):
    """_make_pack_block's kernel in numpy (NUMBA_DISABLE_JIT=1)."""
    if fmt == 4:
        u = raw[p + 2:p + 34] ^ np.uint8(128)
    else:
        qs = raw[p + (2 if fmt == 0 else 6):][:16]
        u = np.concatenate([qs & 15, qs >> 4]).astype(np.uint8)
        if fmt == 2:
            qh = int(raw[p + 2:p + 6].copy().view(np.uint32)[0])
            u |= (((qh >> np.arange(32)) & 1) << 4).astype(np.uint8)
    _words_py(wp, word, lanes, u)


def _quantize_block_py(x, i, b, xp, word, lanes, dx, st, off):
    """_quantize_block in numpy (NUMBA_DISABLE_JIT=1): int_dot._roundf's rounding."""
    v = x[i, 32 * b:32 * b + 32]
    d = np.float32(np.abs(v).max() / np.float32(127.0))
    inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
    y = (v * inv).astype(np.float32)
    a = np.abs(y)
    f = np.floor(a)
    r = f + np.floor(np.float32(2.0) * (a - f))
    q = np.where(y < 0, -r, r).astype(np.int32)
    dx[i, b], st[i, b] = d, -off * int(q.sum())
    _words_py(xp[i], word, lanes, q.astype(np.int8))


if config.DISABLE_JIT:  # type: ignore[attr-defined]  # IR cannot run as Python: numpy instead
    _pack_q4, _pack_q5, _pack_q8 = (functools.partial(_pack_py, f) for f in FORMATS)
    _quantize_block = _quantize_block_py  # type: ignore[assignment]


@entry("f32[2]", "i64", "u8[2]", "f32[2]", "i32[2]")
@njit(cache=True, nogil=True)
def quantize_32(x, fmt, xp, dx, st):
    """x (m, k) float32 -> xp (m, 32 nbp) int8 values (as uint8) round(x / d), d = amax / 127 per 32
    values (dx (m, nbp)), in the lane layout, and st (m, nbp) = -OFFSET[fmt] x each block's values'
    sum; nbp = padded_blocks(k), the padding blocks all zero."""
    m, k = x.shape
    nb = k // 32
    nbp = dx.shape[1]
    off = 8 if fmt == 0 else (16 if fmt == 2 else 128)
    w32 = xp.reshape(-1).view(np.uint32)
    for i in range(m):
        for b in range(nbp):
            word, lanes = _word_at(nbp, b)
            if b < nb:
                _quantize_block(x, i, b, xp, word, lanes, dx, st, off)
            else:
                dx[i, b] = np.float32(0.0)
                st[i, b] = np.int32(0)
                for j in range(8):
                    w32[i * nbp * 8 + word + j * lanes] = np.uint32(0)


@njit(cache=True, nogil=True)
def pack_rows(fmt, block_bytes, raw, r0, r1, nb, table, wp, ws):
    """Weight rows r0...r1-1 of raw (rows of nb blocks) -> wp (rows of 32 nbp bytes, nbp =
    padded_blocks(32 nb)) unsigned quants in the lane layout, ws (rows of nbp float32) the blocks'
    scales; padding blocks zero."""
    nbp = (nb + 3) // 4 * 4
    if nbp % 16 == 12:  # (padded_blocks)
        nbp += 4
    w32 = wp.view(np.uint32)
    row_bytes = nb * block_bytes
    for r in range(r0, r1):
        wrow = (r - r0) * nbp * 8
        for b in range(nbp):
            word, lanes = _word_at(nbp, b)
            if b >= nb:
                ws[(r - r0) * nbp + b] = np.float32(0.0)
                for j in range(8):
                    w32[wrow + word + j * lanes] = np.uint32(0)
                continue
            p = r * row_bytes + b * block_bytes
            ws[(r - r0) * nbp + b] = table[np.int64(raw[p]) | (np.int64(raw[p + 1]) << 8)]
            if fmt == 4:
                _pack_q8(raw, p, wp, wrow + word, lanes)
            elif fmt == 0:
                _pack_q4(raw, p, wp, wrow + word, lanes)
            else:
                _pack_q5(raw, p, wp, wrow + word, lanes)


def _dot(builder, acc, u, s):
    """acc (<L x i32>) + for each lane l: the 4 products u[4l + t] (unsigned) x s[4l + t] (signed)
    (vpdpbusd where the CPU has AVX-512 VNNI, else generic IR: both widened to 32 bits)."""
    lanes = acc.type.count
    i32v = _vec(_I32, lanes)
    if _VNNI and not builder.module.triple.startswith("wasm"):
        fnty = ir.FunctionType(i32v, [i32v] * 3)
        name = f"llvm.x86.avx512.vpdpbusd.{32 * lanes}"
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        return builder.call(fn, [acc, builder.bitcast(u, i32v), builder.bitcast(s, i32v)])
    wide = _vec(_I32, 4 * lanes)
    prod = builder.mul(builder.zext(u, wide), builder.sext(s, wide))
    for t in range(4):
        acc = builder.add(acc, builder.shuffle_vector(prod, prod, _const_vec(_I32, range(t, 4 * lanes, 4))))
    return acc


def _fma(builder, a, b, c):
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    name = f"llvm.fmuladd.v{a.type.count}f32"
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), [a, b, c])


def _group(builder, lanes, g0, wbases, ws_rows, xbases, dx_rows, st_rows, accs):
    """One group of `lanes` blocks from block g0 for every (weight, activation) row pair."""
    i8v, i32v, f32v = _vec(_I8, 4 * lanes), _vec(_I32, lanes), _vec(_F32, lanes)
    at = builder.mul(g0, ir.Constant(_I64, 32))
    at4 = builder.mul(g0, ir.Constant(_I64, 4))
    start = [_load(builder, s, at4, i32v) for s in st_rows]
    isums = [list(start) for _ in wbases]
    for j in range(8):
        step = builder.add(at, ir.Constant(_I64, 4 * lanes * j))
        us = [_load(builder, w, step, i8v) for w in wbases]
        xs = [_load(builder, x, step, i8v) for x in xbases]
        for w, u in enumerate(us):
            for r, x in enumerate(xs):
                isums[w][r] = _dot(builder, isums[w][r], u, x)
    dws = [_load(builder, s, at4, f32v) for s in ws_rows]
    dxs = [_load(builder, s, at4, f32v) for s in dx_rows]
    for w, dw in enumerate(dws):
        for r, dxv in enumerate(dxs):
            acc = builder.load(accs[w][r])
            v = builder.sitofp(isums[w][r], f32v)
            if lanes == 16:
                acc = _fma(builder, v, builder.fmul(dw, dxv), acc)
            else:
                t = builder.fmul(v, builder.fmul(dw, dxv))
                while t.type.count < 16:  # zeros above
                    n = t.type.count
                    t = builder.shuffle_vector(t, ir.Constant(t.type, [ir.Constant(_F32, 0.0)] * n),
                                               _const_vec(_I32, range(2 * n)))
                acc = builder.fadd(acc, t)
            builder.store(acc, accs[w][r])


def _fits(arrays, dtypes, ndims):
    return all(isinstance(a, types.Array) and a.ndim == n and a.layout == "C" and a.dtype == d
               for a, d, n in zip(arrays, dtypes, ndims))


def _make_tile(tile_w, tile_x):
    @intrinsic
    def tile(typingctx, wp, ws, w0, nw, col0, xp, dx, st, out, i0):
        """out[i, col0 + w] for the tile_x activation rows i from i0 and the tile_w packed weight rows w
        from w0 (wp uint8 rows of 32 nbp bytes, ws float32 rows of nbp scales: pack_rows) times the
        packed activations (xp (m, 32 nbp) uint8, dx (m, nbp) float32, st (m, nbp) int32: quantize_32).
        Rows past the last (w0 + nw, m) are clamped to it and store its value again."""
        if not _fits((wp, ws, xp, dx, st, out), (types.uint8, types.float32, types.uint8, types.float32,
                                                 types.int32, types.float32), (1, 1, 2, 2, 2, 2)):
            return None  # the IR reads and writes raw memory: only contiguous arrays of these dtypes and ranks
        sig = types.void(wp, ws, w0, nw, col0, xp, dx, st, out, i0)

        def codegen(context, builder, signature, args):
            t = signature.args
            arys = {i: context.make_array(t[i])(context, builder, args[i]) for i in (0, 1, 5, 6, 7, 8)}

            def i64(i):
                return context.cast(builder, args[i], t[i], types.int64)

            def smin(a, b_):
                return builder.select(builder.icmp_signed("<", a, b_), a, b_)
            one = ir.Constant(_I64, 1)
            m = builder.extract_value(arys[5].shape, 0)
            nbp = builder.extract_value(arys[6].shape, 1)
            n_out = builder.extract_value(arys[8].shape, 1)
            row_bytes = builder.mul(nbp, ir.Constant(_I64, 32))
            wrows = [builder.add(i64(2), smin(ir.Constant(_I64, w), builder.sub(i64(3), one))) for w in range(tile_w)]
            xrows = [smin(builder.add(i64(9), ir.Constant(_I64, r)), builder.sub(m, one)) for r in range(tile_x)]
            wp_p = builder.bitcast(arys[0].data, _I8.as_pointer())
            ws_p = builder.bitcast(arys[1].data, _I8.as_pointer())
            wbases = [builder.gep(wp_p, [builder.mul(r, row_bytes)]) for r in wrows]
            ws_rows = [builder.gep(ws_p, [builder.mul(r, builder.mul(nbp, ir.Constant(_I64, 4)))]) for r in wrows]

            def row_ptr(a, i, width):
                return builder.bitcast(builder.gep(arys[a].data, [builder.mul(i, width)]), _I8.as_pointer())
            xbases = [row_ptr(5, i, row_bytes) for i in xrows]
            dx_rows = [row_ptr(6, i, nbp) for i in xrows]
            st_rows = [row_ptr(7, i, nbp) for i in xrows]
            zero16 = ir.Constant(_vec(_F32, 16), [ir.Constant(_F32, 0.0)] * 16)
            accs = [[cgutils.alloca_once_value(builder, zero16) for _ in xrows] for _ in wrows]
            n16 = builder.udiv(nbp, ir.Constant(_I64, 16))
            with cgutils.for_range(builder, n16) as loop:
                _group(builder, 16, builder.mul(loop.index, ir.Constant(_I64, 16)), wbases, ws_rows, xbases,
                       dx_rows, st_rows, accs)
            g = builder.mul(n16, ir.Constant(_I64, 16))
            rest = builder.sub(nbp, g)
            with builder.if_then(builder.icmp_unsigned(">=", rest, ir.Constant(_I64, 8))):
                _group(builder, 8, g, wbases, ws_rows, xbases, dx_rows, st_rows, accs)
            with builder.if_then(builder.icmp_unsigned("!=", builder.and_(rest, ir.Constant(_I64, 4)),
                                                       ir.Constant(_I64, 0))):
                _group(builder, 4, builder.sub(nbp, ir.Constant(_I64, 4)), wbases, ws_rows, xbases, dx_rows,
                       st_rows, accs)
            for w, wr in enumerate(wrows):
                col = builder.add(i64(4), wr)
                for r, xr in enumerate(xrows):
                    v = builder.load(accs[w][r])
                    value = _hsum(builder, builder.fadd(builder.shuffle_vector(v, v, _const_vec(_I32, range(8))),
                                                        builder.shuffle_vector(v, v, _const_vec(_I32, range(8, 16)))))
                    builder.store(value, builder.gep(arys[8].data, [builder.add(builder.mul(xr, n_out), col)]))
            return context.get_dummy_value()
        return sig, codegen
    return tile


def layout_rows(packed, nbp):
    """Rows in the lane layout (..., 32 nbp) -> the same values in block order (numpy; tests, tile_py)."""
    lead = packed.shape[:-1]
    out = np.empty(lead + (nbp, 32), dtype=packed.dtype)
    g, n16 = 0, nbp // 16 * 16
    groups = [16] * (n16 // 16) + ([8] if nbp - n16 >= 8 else []) + [4] * (((nbp - n16) % 8) // 4)
    for lanes in groups:
        part = packed[..., g * 32:(g + lanes) * 32].reshape(lead + (8, lanes, 4))
        out[..., g:g + lanes, :] = np.moveaxis(part, -3, -2).reshape(lead + (lanes, 32))
        g += lanes
    return out.reshape(lead + (nbp * 32,))


def tile_py(wp, ws, w0, nw, col0, xp, dx, st, out, i0, tile_x):
    """tile in numpy from the packed arrays (NUMBA_DISABLE_JIT=1): the weights' offset taken off with
    the starts, float64 products."""
    m, nbp = dx.shape
    rows = list(range(i0, min(m, i0 + tile_x)))
    x = layout_rows(xp[rows], nbp).view(np.int8).astype(np.float64).reshape(len(rows), nbp, 32)
    for w in range(w0, w0 + nw):
        u = layout_rows(wp[w * nbp * 32:(w + 1) * nbp * 32], nbp).astype(np.float64).reshape(nbp, 32)
        dots = np.einsum("rbj,bj->rb", x, u) + st[rows].astype(np.float64)
        out[rows, col0 + w] = (dots * dx[rows].astype(np.float64) * ws[w * nbp:(w + 1) * nbp]).sum(axis=1)


tile = _make_tile(*TILE)
if config.DISABLE_JIT:  # type: ignore[attr-defined]  # IR cannot run as Python: numpy instead
    tile = functools.partial(tile_py, tile_x=TILE[1])


@njit(cache=True, nogil=True)
def tile_rows(fmt, block_bytes, raw, xp, dx, st, table, out, start, stop):
    """Columns start...stop-1 of out (m, n) = the packed activations (quantize_32) times the transpose
    of the (n, k) block matrix in raw, CHUNK_ROWS weight rows unpacked (pack_rows) at a time."""
    m, nbp = dx.shape
    n = out.shape[1]
    nb = raw.size // (n * block_bytes)
    size = CHUNK_ROWS * nbp * 32
    buf = np.empty(size + 64, dtype=np.uint8)  # 64-byte aligned: each 64-byte load on one cache line
    at = (64 - buf.ctypes.data % 64) % 64
    wp = buf[at:at + size]
    ws = np.empty(CHUNK_ROWS * nbp, dtype=np.float32)
    for c0 in range(start, stop, CHUNK_ROWS):
        c1 = min(stop, c0 + CHUNK_ROWS)
        pack_rows(fmt, block_bytes, raw, c0, c1, nb, table, wp, ws)
        for w in range(0, c1 - c0, TILE[0]):
            nw = min(TILE[0], c1 - c0 - w)
            for i in range(0, m, TILE[1]):
                tile(wp, ws, w, nw, c0, xp, dx, st, out, i)


@entry("i64", "i64", "u8[1]", "u8[2]", "f32[2]", "i32[2]", "f32[1]", "f32[2]", "i64", "i64", "i64[1]",
       returns="bool")
@njit(cache=True, nogil=True)
def tile32_shared(fmt, block_bytes, raw, xp, dx, st, table, out, n_rows, chunks, state):
    """tile_rows over chunks of range(n_rows) that every thread calling this takes from state[0];
    state[1] counts finished chunks. True in the thread that finished the last one (threads.RowPool)."""
    last = False
    while True:
        c = atomics.fetch_add(state, 0, 1)
        if c >= chunks:
            return last
        tile_rows(fmt, block_bytes, raw, xp, dx, st, table, out, n_rows * c // chunks, n_rows * (c + 1) // chunks)
        if atomics.fetch_add(state, 1, 1) == chunks - 1:
            last = True
