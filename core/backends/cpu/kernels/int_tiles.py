"""Prompt products on GGUF blocks as integer GEMM tiles: the activations quantised to int8 once
per product, then a tile of weight rows times activation rows per inner loop (K_TILE, TILE_32), so each weight
block is unpacked once for all the tile's activation rows and each activation block loaded once for
all its weight rows.

As ggml does for prompts (its Q8_K / Q8_0 activations and byte products), learnt from, not copied:

  * `quantize_i8`: each activation row in groups of 256 values (the K-quants: one scale a
    weight block, ggml's Q8_K) or 32 (the 32-value formats: ggml's Q8_0), value round(x / d),
    d = amax / 127; with every 16 and every 32 values' integer sums (the mins' and offsets'
    share, in integers).
  * K-quants (q4_k, q5_k, q6_k): a sub-block's 32 unsigned quants times 32 int8 activations are
    16 int16 pair sums (x86: vpmaddubsw; no saturation: 2 * 63 * 127 < 2^15), multiplied by the
    sub-block's integer scale and added in pairs into 8 int32 lanes (vpmaddwd): the whole block's
    integer dot, its 8 or 16 scales included, is exact in int32, converted once and multiplied by
    d * dx in one fused multiply-add per block and (weight, activation) row pair. q4_k / q5_k's
    mins are one more multiply-add on the activations' 32-value sums, into lanes 0-7 of the same
    accumulator (two registers a pair: 2 x 8 pairs fit AVX-512's 32 without spills); q6_k's offset
    (-32) starts the block's integer sums from its 16 scales times -32 times the 16-value sums
    (one more vpdpwssd). Each 32 quant bytes become the two sub-blocks' 64 values by one
    broadcast, one variable 16-bit shift and one and.
  * 32-value formats (q4_0, q4_1, q5_0, q5_1, q8_0): a block's byte dot (kquant_ir._byte_dot:
    vpdpbusd where the CPU has VNNI, else vpmaddubsw + vpmaddwd), one multiply-add per block and
    row pair. q4_0 / q5_0's offset starts the dot from -8 / -16 times the activations' sums
    (one byte dot per activation block, shared by the weight rows); q8_0's signed weights take
    ggml's sign trick (|w| times x with w's sign); q4_1 / q5_1's min is a float term.

Other targets (arm64, wasm) get the same integers from generic IR (both sides widened to 16 bits).
The product equals the int8 activations (dequantised) times the dequantised weights up to float32
rounding (`tile_py`, which NUMBA_DISABLE_JIT=1 runs in place of the IR and the tests compare).
`tile_shared` runs over chunks of weight rows that threads.RowPool's threads take; within a
chunk, a tile's weight rows stay in L1 while the activations (X_CHUNK rows at a time) stream past.

numba's on-disk cache keys a compiled function on its own file: after editing vector_ir.py or
kquant_ir.py (whose helpers this inlines), touch this file.
"""
import functools

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from . import atomics, kquant_ir, vector_ir
from .codes import entry
from .int_dot import _roundf
from .vector_ir import _const_vec, _f16_scale, _fmuladd, _hsum, _load, _pair_madd, _splat, _vec

# (weight rows, activation rows) per tile: the K-quants (byte products of 64 values, 16 int32 lanes
# a row pair) and the 32-value formats; measured best of 1-4 x 2-8 on the AVX-512 box (docs/cpu-kernels.md)
K_TILE = (2, 8)
TILE_32 = (2, 8)
X_CHUNK = 64  # activation rows a chunk of weight rows passes over before the next chunk of them
K_GROUP = 256  # activation values per scale for the K-quants (ggml's Q8_K); 32 for the other formats
FORMATS = (0, 1, 2, 3, 4, 5, 6, 7)  # codes.FORMATS: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
_FEATURES = vector_ir._cpu_features() if vector_ir._X86_MADD else set()
_X86_512 = "+avx512bw" in _FEATURES  # 512-bit byte products (the K-quants' two sub-blocks at once)
_VNNI_512 = {"+avx512vnni", "+avx512bw"} <= _FEATURES


def group_of(fmt):
    """Activation values per scale for the format code fmt."""
    return K_GROUP if fmt >= 5 else 32


@entry("f32[2]", "i64", "u8[2]", "f32[2]", "i32[2]", "i32[2]")
@njit(cache=True, nogil=True)
def quantize_i8(x, group, qx, dx, s32, s16):
    """x (m, k) float32 -> qx (m, k) int8 values (stored as uint8) round(x / d) with d = amax / 127
    per `group` values (dx (m, k / group)), and the values' sums per 32 (s32 (m, k / 32)) and per
    16 (s16 (m, k / 16))."""
    m, k = x.shape
    for i in range(m):
        for g in range(k // group):
            amax = np.float32(0.0)
            for j in range(group):
                amax = max(amax, abs(x[i, g * group + j]))
            dx[i, g] = amax / np.float32(127.0)
        for c in range(k // 16):
            d = dx[i, (c * 16) // group]
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            s = np.int32(0)
            for j in range(16):
                q = np.int32(_roundf(x[i, c * 16 + j] * inv))
                qx[i, c * 16 + j] = np.uint8(q & 255)
                s += q
            s16[i, c] = s
        for c in range(k // 32):
            s32[i, c] = s16[i, 2 * c] + s16[i, 2 * c + 1]


def _x86(builder):
    return kquant_ir._BYTE_DOT is not None and not builder.module.triple.startswith("wasm")


def _prod16(builder, u, s):
    """<32 x i8> u (unsigned, <= 63) times <32 x i8> s (signed, |s| <= 127) -> <16 x i16>, lane i
    u[2i] s[2i] + u[2i+1] s[2i+1] (x86: vpmaddubsw; elsewhere both widened)."""
    v16 = _vec(_I16, 16)
    if _x86(builder):
        return kquant_ir._x86(builder, "llvm.x86.avx2.pmadd.ub.sw", v16, [u, s])
    prod = builder.mul(builder.zext(u, _vec(_I16, 32)), builder.sext(s, _vec(_I16, 32)))
    return builder.add(builder.shuffle_vector(prod, prod, _const_vec(_I32, range(0, 32, 2))),
                       builder.shuffle_vector(prod, prod, _const_vec(_I32, range(1, 32, 2))))


def _scaled_add(builder, p16, scale, acc):
    """acc (<8 x i32>) + the pairs of p16 (<16 x i16>) times scale (<16 x i16>) added in pairs
    (VNNI: one vpdpwssd; else vpmaddwd and an add)."""
    if kquant_ir._BYTE_DOT == "vnni" and _x86(builder):
        i32x8 = _vec(_I32, 8)
        return kquant_ir._x86(builder, "llvm.x86.avx512.vpdpwssd.256", i32x8,
                              [acc, builder.bitcast(p16, i32x8), builder.bitcast(scale, i32x8)])
    return builder.add(acc, _pair_madd(builder, p16, scale))


def _i8s(v):
    return _const_vec(_I8, [v] * 32)


class _Rows:
    """One call's activation rows: their int8 values, scales and sums (pointers), loaded per block."""

    def __init__(self, builder, x, dx, s32, s16):
        self.builder, self.x, self.dx, self.s32, self.s16 = builder, x, dx, s32, s16

    def block(self, at, j):
        """The 32 int8 values at value at + 32 j."""
        b = self.builder
        return _load(b, self.x, b.add(at, ir.Constant(_I64, 32 * j)), _vec(_I8, 32))

    def scale(self, g):
        return self.builder.load(self.builder.gep(self.dx, [g]))

    def sums32(self, c, lanes):
        """`lanes` int32 32-value sums from sum c."""
        b = self.builder
        return _load(b, b.bitcast(self.s32, _I8.as_pointer()), b.mul(c, ir.Constant(_I64, 4)), _vec(_I32, lanes)) \
            if lanes > 1 else b.load(b.gep(self.s32, [c]))

    def sums16(self, c):
        b = self.builder
        return _load(b, b.bitcast(self.s16, _I8.as_pointer()), b.mul(c, ir.Constant(_I64, 4)), _vec(_I32, 16))


def _q4_bytes(builder, raw, p, at):
    """q4_0 / q4_1's 16 quant bytes at p + at as the block's 32 values in order (low nibbles 0-15)."""
    b = _load(builder, raw, builder.add(p, ir.Constant(_I64, at)), _vec(_I8, 16))
    return builder.shuffle_vector(builder.and_(b, _const_vec(_I8, [15] * 16)),
                                  builder.lshr(b, _const_vec(_I8, [4] * 16)), _const_vec(_I32, range(32)))


def _q5_bytes(builder, raw, p, high_at, quants_at):
    """q5_0 / q5_1's 32 values (0...31): bit 4 of value j is bit j of the 32-bit word at high_at."""
    q = _q4_bytes(builder, raw, p, quants_at)
    word = _load(builder, raw, builder.add(p, ir.Constant(_I64, high_at)), _vec(_I8, 4))
    spread = builder.shuffle_vector(word, word, _const_vec(_I32, [j // 8 for j in range(32)]))
    is_set = builder.icmp_unsigned("!=", builder.and_(spread, _const_vec(_I8, [1 << (j % 8) for j in range(32)])),
                                   _i8s(0))
    return builder.or_(q, builder.select(is_set, _i8s(16), _i8s(0)))


def _body_32(builder, code, raw, table, ps, rows, b, accs, extras):
    """One block of a 32-value format for every (weight, activation) row pair."""
    at = builder.mul(b, ir.Constant(_I64, 32))
    xs = [r.block(at, 0) for r in rows]
    dxs = [r.scale(b) for r in rows]
    offset = {0: 8, 2: 16}.get(code)
    starts = [kquant_ir._byte_dot(builder, _i8s(offset), builder.neg(x)) if offset else None for x in xs]
    for w, p in enumerate(ps):
        d = _f16_scale(builder, raw, table, p)
        if code == 4:
            w8 = _load(builder, raw, builder.add(p, ir.Constant(_I64, 2)), _vec(_I8, 32))
            negative = builder.icmp_signed("<", w8, _i8s(0))
            u = builder.select(negative, builder.neg(w8), w8)  # |w| (-128 -> 128 unsigned)
        elif code in (0, 1):
            u = _q4_bytes(builder, raw, p, 2 if code == 0 else 4)
        else:
            u = _q5_bytes(builder, raw, p, 2 if code == 2 else 4, 6 if code == 2 else 8)
        mn = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 2))) if code in (1, 3) else None
        for r, (x, dx, start) in enumerate(zip(xs, dxs, starts)):
            s = builder.select(negative, builder.neg(x), x) if code == 4 else x
            dot = kquant_ir._byte_dot(builder, u, s, start)
            acc = builder.load(accs[w][r])
            acc = _fmuladd(builder, builder.sitofp(dot, _vec(_F32, 8)), _splat(builder, builder.fmul(d, dx), 8), acc)
            builder.store(acc, accs[w][r])
            if mn is not None:
                total = builder.sitofp(rows[r].sums32(b, 1), _F32)
                builder.store(builder.fadd(builder.load(extras[w][r]), builder.fmul(builder.fmul(mn, dx), total)),
                              extras[w][r])


def _wide(builder):
    """Whether this build names AVX-512BW's 512-bit byte products (else two 256-bit halves)."""
    return _X86_512 and _x86(builder)


def _concat(builder, a, b):
    n = a.type.count
    return builder.shuffle_vector(a, b, _const_vec(_I32, range(2 * n)))


def _half(builder, v, h):
    n = v.type.count // 2
    return builder.shuffle_vector(v, v, _const_vec(_I32, range(h * n, h * n + n)))


def _prod16_64(builder, u, s):
    """_prod16 on <64 x i8> -> <32 x i16> (two sub-blocks: vpmaddubsw on 512 bits where the CPU has it)."""
    if _wide(builder):
        return kquant_ir._x86(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), [u, s])
    return _concat(builder, *[_prod16(builder, _half(builder, u, h), _half(builder, s, h)) for h in (0, 1)])


def _scaled_add_64(builder, p32, scale, acc):
    """_scaled_add on <32 x i16> pairs and scales into <16 x i32> acc (vpdpwssd on 512 bits with
    AVX-512 VNNI, vpmaddwd + add with AVX-512BW alone, else halves)."""
    i32x16 = _vec(_I32, 16)
    if _wide(builder) and _VNNI_512:
        return kquant_ir._x86(builder, "llvm.x86.avx512.vpdpwssd.512", i32x16,
                              [acc, builder.bitcast(p32, i32x16), builder.bitcast(scale, i32x16)])
    if _wide(builder):
        return builder.add(acc, kquant_ir._x86(builder, "llvm.x86.avx512.pmaddw.d.512", i32x16, [p32, scale]))
    return _concat(builder, *[_scaled_add(builder, _half(builder, p32, h), _half(builder, scale, h),
                                          _half(builder, acc, h)) for h in (0, 1)])


def _zero_i32x16():
    return ir.Constant(_vec(_I32, 16), [ir.Constant(_I32, 0)] * 16)


def _fma16(builder, a, b, c):
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.fmuladd.v16f32"), [a, b, c])


def _c8(v, n=64):
    return _const_vec(_I8, [v - 256 if v > 127 else v] * n)


def _dup32(builder, v):
    """<32 x i8> -> <64 x i8> (v, v): one 256-bit broadcast on x86."""
    return builder.shuffle_vector(v, v, _const_vec(_I32, list(range(32)) * 2))


def _nibbles64(builder, v32, low_shift, high_shift):
    """<32 x i8> v -> <64 x i8>: (v >> low_shift) & 15, then (v >> high_shift) & 15 (byte lanes; one
    broadcast, one variable 16-bit shift and one and on AVX-512BW)."""
    w = builder.bitcast(_dup32(builder, v32), _vec(_I16, 32))
    w = builder.lshr(w, _const_vec(_I16, [low_shift] * 16 + [high_shift] * 16))
    return builder.and_(builder.bitcast(w, _vec(_I8, 64)), _c8(15))


def _lanes16(builder, v8):
    """<8 x float> -> <16 x float> with zeros in lanes 8-15."""
    zero = ir.Constant(_vec(_F32, 8), [ir.Constant(_F32, 0.0)] * 8)
    return builder.shuffle_vector(v8, zero, _const_vec(_I32, range(16)))


def _finish(builder, isum, d, dxv, acc):
    """acc + float(isum) * d * dx (dxv: dx splat over 16 lanes)."""
    t = builder.fmul(builder.sitofp(isum, _vec(_F32, 16)), _splat(builder, d, 16))
    return _fma16(builder, t, dxv, acc)


def _body_k4(builder, code, raw, table, ps, rows, b, accs):
    """One q4_k / q5_k block (256 values: 8 sub-blocks of 32, 6-bit scales and mins) for every pair,
    two sub-blocks (group g's 32 quant bytes: low nibbles 2g, high 2g + 1) per 64-byte product. The
    mins' term (-dmin mn_j times dx S32_j, 8 lanes) goes into lanes 0-7 of the pair's one 16-lane
    float accumulator, so a pair holds two registers (its block's int32 sums and that), not three:
    2 x 8 pairs then fit AVX-512's 32 registers without the spills of a separate mins accumulator."""
    at = builder.mul(b, ir.Constant(_I64, 256))
    f8 = _vec(_F32, 8)
    dxv = []
    sums = []
    for row in rows:
        dx = row.scale(b)
        dxv.append(_splat(builder, dx, 16))
        s32 = builder.sitofp(row.sums32(builder.mul(b, ir.Constant(_I64, 8)), 8), f8)
        s = builder.fmul(s32, _splat(builder, dx, 8))
        sums.append(_lanes16(builder, s))
    weights = []
    for p in ps:
        d = _f16_scale(builder, raw, table, p)
        dmin = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 2)))
        sc, mn = kquant_ir._scales_mins_k4(builder, raw, p)
        sb = builder.trunc(builder.fptosi(sc, _vec(_I32, 8)), _vec(_I8, 8))
        neg_mins = _lanes16(builder, builder.fmul(_splat(builder, builder.fneg(dmin), 8), mn))
        qh = kquant_ir._bytes(builder, raw, p, 16) if code == 6 else None
        weights.append((d, sb, neg_mins, qh))
    isums = [[_zero_i32x16() for _ in rows] for _ in ps]
    for g in range(4):
        parts, scales = [], []
        for p, (_d, sb, _m, qh) in zip(ps, weights):
            q = kquant_ir._bytes(builder, raw, p, (48 if code == 6 else 16) + 32 * g)
            u = _nibbles64(builder, q, 0, 4)
            if qh is not None:
                hw = builder.bitcast(_dup32(builder, qh), _vec(_I16, 32))
                hw = builder.lshr(hw, _const_vec(_I16, [2 * g] * 16 + [2 * g + 1] * 16))
                hb = builder.and_(builder.bitcast(hw, _vec(_I8, 64)), _c8(1))
                u = builder.or_(u, builder.shl(hb, _c8(4)))
            parts.append(u)
            sc = builder.shuffle_vector(sb, sb, _const_vec(_I32, [2 * g] * 16 + [2 * g + 1] * 16))
            scales.append(builder.zext(sc, _vec(_I16, 32)))
        for r, row in enumerate(rows):
            x = _load(builder, row.x, builder.add(at, ir.Constant(_I64, 64 * g)), _vec(_I8, 64))
            for w in range(len(ps)):
                isums[w][r] = _scaled_add_64(builder, _prod16_64(builder, parts[w], x), scales[w], isums[w][r])
    for w, (d, _sb, neg_mins, _qh) in enumerate(weights):
        for r in range(len(rows)):
            acc = _finish(builder, isums[w][r], d, dxv[r], builder.load(accs[w][r]))
            builder.store(_fma16(builder, neg_mins, sums[r], acc), accs[w][r])


def _body_q6(builder, raw, table, ps, rows, b, accs):
    """One q6_k block (256 values, 16 int8 scales of 16 values, quants 0...63 less 32) for every pair:
    two 32-value quarters (the same 64 ql bytes' low or high nibbles) per 64-byte product; the -32
    offset is the block's int32 sums started from sum_j (-32 sc_j) S16_j (one vpdpwssd a pair:
    |S16| <= 16 x 127 and |32 sc| <= 4096 fit int16)."""
    at = builder.mul(b, ir.Constant(_I64, 256))
    dxv = [_splat(builder, r.scale(b), 16) for r in rows]
    weights = []
    for p in ps:
        d = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 208)))
        sc8 = _load(builder, raw, builder.add(p, ir.Constant(_I64, 192)), _vec(_I8, 16))
        sc16 = builder.sext(sc8, _vec(_I16, 16))
        neg32 = builder.mul(sc16, _const_vec(_I16, [-32] * 16))
        zero16 = ir.Constant(_vec(_I16, 16), [ir.Constant(_I16, 0)] * 16)
        weights.append((d, sc8, builder.shuffle_vector(neg32, zero16, _const_vec(_I32, range(32)))))
    # the -32 offset: sum_j (-32 sc_j) S16_j as one vpdpwssd (S16 <= 16 * 127 fits int16; 32 * 128 too)
    s16s = []
    for row in rows:
        s = builder.trunc(row.sums16(builder.mul(b, ir.Constant(_I64, 16))), _vec(_I16, 16))
        zero16 = ir.Constant(_vec(_I16, 16), [ir.Constant(_I16, 0)] * 16)
        s16s.append(builder.shuffle_vector(s, zero16, _const_vec(_I32, range(32))))
    isums = [[_scaled_add_64(builder, weights[w][2], s16s[r], _zero_i32x16()) for r in range(len(rows))]
             for w in range(len(ps))]
    for hf in range(2):
        qhs = [kquant_ir._bytes(builder, raw, p, 128 + 32 * hf) for p in ps]
        qls = [_load(builder, raw, builder.add(p, ir.Constant(_I64, 64 * hf)), _vec(_I8, 64)) for p in ps]
        for t in (0, 2):
            a = 4 * hf + t
            qs, scales = [], []
            for w, qh in enumerate(qhs):
                ql = builder.bitcast(qls[w], _vec(_I16, 32))
                low = builder.and_(builder.bitcast(builder.lshr(ql, _const_vec(_I16, [2 * t] * 32)), _vec(_I8, 64)),
                                   _c8(15))
                hw = builder.bitcast(_dup32(builder, qh), _vec(_I16, 32))
                hw = builder.lshr(hw, _const_vec(_I16, [2 * t] * 16 + [2 * t + 2] * 16))
                high = builder.and_(builder.bitcast(hw, _vec(_I8, 64)), _c8(3))
                qs.append(builder.or_(low, builder.shl(high, _c8(4))))
                sc = builder.shuffle_vector(weights[w][1], weights[w][1],
                                            _const_vec(_I32, [s for j in range(2 * a, 2 * a + 4) for s in [j] * 8]))
                scales.append(builder.sext(sc, _vec(_I16, 32)))
            for r, row in enumerate(rows):
                x = _load(builder, row.x, builder.add(at, ir.Constant(_I64, 32 * a)), _vec(_I8, 64))
                for w in range(len(ps)):
                    isums[w][r] = _scaled_add_64(builder, _prod16_64(builder, qs[w], x), scales[w], isums[w][r])
    for w, (d, _s, _n) in enumerate(weights):
        for r in range(len(rows)):
            builder.store(_finish(builder, isums[w][r], d, dxv[r], builder.load(accs[w][r])), accs[w][r])


def _format_loop(builder, code, raw, table, offsets, rows, blocks, block_bytes):
    """[[weight row w times activation row r, for r] for w] of one format, as float32 values. The
    32-value formats take two blocks per 64-byte product (_body_32_pair), a last odd block alone."""
    zero16 = ir.Constant(_vec(_F32, 16), [ir.Constant(_F32, 0.0)] * 16)
    zero8 = ir.Constant(_vec(_F32, 8), [ir.Constant(_F32, 0.0)] * 8)
    accs = [[cgutils.alloca_once_value(builder, zero16) for _ in rows] for _ in offsets]
    acc8 = [[cgutils.alloca_once_value(builder, zero8) for _ in rows] for _ in offsets]  # (mins; a lone block)
    extras = [[cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in rows] for _ in offsets]
    two = ir.Constant(_I64, 2)
    with cgutils.for_range(builder, blocks if code >= 5 else builder.udiv(blocks, two)) as loop:
        b = loop.index
        if code >= 5:
            step = builder.mul(b, block_bytes)
            ps = [builder.add(o, step) for o in offsets]
            if code == 7:
                _body_q6(builder, raw, table, ps, rows, b, accs)
            else:
                _body_k4(builder, code, raw, table, ps, rows, b, accs)
        else:
            b2 = builder.mul(b, two)
            step = builder.mul(b2, block_bytes)
            _body_32_pair(builder, code, raw, table, [builder.add(o, step) for o in offsets], block_bytes, rows, b2,
                          accs, extras)
    if code < 5:
        with builder.if_then(builder.icmp_unsigned("!=", builder.urem(blocks, two), ir.Constant(_I64, 0))):
            b = builder.sub(blocks, ir.Constant(_I64, 1))
            step = builder.mul(b, block_bytes)
            _body_32(builder, code, raw, table, [builder.add(o, step) for o in offsets], rows, b, acc8, extras)

    def total(a, a8, e):
        v = builder.load(a)
        v = builder.fadd(builder.fadd(_half(builder, v, 0), _half(builder, v, 1)), builder.load(a8))
        return builder.fadd(_hsum(builder, v), builder.load(e))
    return [[total(a, a8, e) for a, a8, e in zip(ar, mr, er)] for ar, mr, er in zip(accs, acc8, extras)]


def _byte_dot_64(builder, u, s, acc=None):
    """kquant_ir._byte_dot on <64 x i8> -> <16 x i32> (two 32-value blocks: vpdpbusd on 512 bits with
    AVX-512 VNNI, vpmaddubsw + vpmaddwd with AVX-512BW, else halves)."""
    i32x16 = _vec(_I32, 16)
    if _wide(builder) and _VNNI_512:
        start = acc if acc is not None else _zero_i32x16()
        return kquant_ir._x86(builder, "llvm.x86.avx512.vpdpbusd.512", i32x16,
                              [start, builder.bitcast(u, i32x16), builder.bitcast(s, i32x16)])
    if _wide(builder):
        pairs = kquant_ir._x86(builder, "llvm.x86.avx512.pmaddubs.w.512", _vec(_I16, 32), [u, s])
        sums = kquant_ir._x86(builder, "llvm.x86.avx512.pmaddw.d.512", i32x16, [pairs, _const_vec(_I16, [1] * 32)])
        return sums if acc is None else builder.add(sums, acc)
    return _concat(builder, *[kquant_ir._byte_dot(builder, _half(builder, u, h), _half(builder, s, h),
                                                  None if acc is None else _half(builder, acc, h)) for h in (0, 1)])


def _two(builder, a, b_):
    """<16 x float>: a in lanes 0-7, b_ in lanes 8-15."""
    return _concat(builder, _splat(builder, a, 8), _splat(builder, b_, 8))


def _quants_32(builder, code, raw, p):
    """A 32-value block's quants as <32 x i8>: unsigned (q4_0 / q4_1 0...15, q5_0 / q5_1 0...31) or
    q8_0's signed values."""
    if code == 4:
        return _load(builder, raw, builder.add(p, ir.Constant(_I64, 2)), _vec(_I8, 32))
    if code in (0, 1):
        return _q4_bytes(builder, raw, p, 2 if code == 0 else 4)
    return _q5_bytes(builder, raw, p, 2 if code == 2 else 4, 6 if code == 2 else 8)


def _body_32_pair(builder, code, raw, table, ps, block_bytes, rows, b, accs, extras):
    """Blocks b and b + 1 of a 32-value format for every pair: their 64 quants (concatenated) times the
    64 activations in one byte product, 16 int32 lanes scaled by [d_b dx_b] x 8, [d_b+1 dx_b+1] x 8."""
    at = builder.mul(b, ir.Constant(_I64, 32))
    b1 = builder.add(b, ir.Constant(_I64, 1))
    xs = [_load(builder, r.x, at, _vec(_I8, 64)) for r in rows]
    dxs = [(r.scale(b), r.scale(b1)) for r in rows]
    dxv = [_two(builder, *d) for d in dxs]
    # q4_0 / q5_0: the dot starts from -8 / -16 times the activations' 4-value sums; q8_0 with VNNI on
    # 512 bits: its weights offset to unsigned (w + 128, one xor a weight block) and the dot from -128 times
    # them (vpdpbusd does not saturate), else ggml's sign trick (two more operations a row pair)
    unsigned_q8 = code == 4 and _wide(builder) and _VNNI_512
    offset = {0: 8, 2: 16, 4: 128 if unsigned_q8 else None}.get(code)
    c64 = (lambda v: _const_vec(_I8, [v - 256 if v > 127 else v] * 64))
    starts = [_byte_dot_64(builder, c64(offset), builder.neg(x)) if offset else None for x in xs]
    for w, p in enumerate(ps):
        p1 = builder.add(p, block_bytes)
        d0, d1 = _f16_scale(builder, raw, table, p), _f16_scale(builder, raw, table, p1)
        dv = _two(builder, d0, d1)
        u = _concat(builder, _quants_32(builder, code, raw, p), _quants_32(builder, code, raw, p1))
        negative = None
        if unsigned_q8:
            u = builder.xor(u, c64(128))
        elif code == 4:
            negative = builder.icmp_signed("<", u, c64(0))
            u = builder.select(negative, builder.neg(u), u)  # |w| (-128 -> 128 unsigned)
        mins = None
        if code in (1, 3):
            mins = [_f16_scale(builder, raw, table, builder.add(q, ir.Constant(_I64, 2))) for q in (p, p1)]
        for r, (x, start) in enumerate(zip(xs, starts)):
            s = builder.select(negative, builder.neg(x), x) if negative is not None else x
            dot = _byte_dot_64(builder, u, s, start)
            acc = _fma16(builder, builder.sitofp(dot, _vec(_F32, 16)), builder.fmul(dv, dxv[r]),
                         builder.load(accs[w][r]))
            builder.store(acc, accs[w][r])
            if mins is not None:
                e = builder.load(extras[w][r])
                for mn, dx, blk in zip(mins, dxs[r], (b, b1)):
                    total = builder.sitofp(rows[r].sums32(blk, 1), _F32)
                    e = builder.fadd(e, builder.fmul(builder.fmul(mn, dx), total))
                builder.store(e, extras[w][r])


def _arrays_fit(arrays, dtypes, ndims):
    return all(isinstance(a, types.Array) and a.ndim == n and a.layout == "C" and a.dtype == d
               for a, d, n in zip(arrays, dtypes, ndims))


def _make_tile(tile_w, tile_x, formats):
    """The tile kernel of tile_w weight rows times tile_x activation rows for the format codes `formats`."""
    @intrinsic
    def tile(typingctx, fmt, raw, r0, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i0):
        """out[i, r] for the tile_x activation rows i from i0 and the tile_w weight rows r from r0 (each
        `blocks` blocks of `block_bytes` in raw, uint8): rows past the last one (i0 + ... >= m, or
        r0 + w >= r0 + nw) are clamped to it and store its own value again. qx (m, k) uint8 int8
        values, dx (m, k / group_of(fmt)) float32, s32 (m, k / 32) and s16 (m, k / 16) int32 (from
        quantize_i8), table float32 f16 values, out (m, n) float32; fmt a FORMATS code."""
        if not _arrays_fit((raw, qx, dx, s32, s16, table, out),
                           (types.uint8, types.uint8, types.float32, types.int32, types.int32, types.float32,
                            types.float32), (1, 2, 2, 2, 2, 1, 2)):
            return None  # the IR reads and writes raw memory: only contiguous arrays of these dtypes and ranks
        sig = types.void(fmt, raw, r0, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i0)

        def codegen(context, builder, signature, args):
            t = signature.args
            arys = {i: context.make_array(t[i])(context, builder, args[i]) for i in (1, 6, 7, 8, 9, 10, 11)}

            def i64(i):
                return context.cast(builder, args[i], t[i], types.int64)

            def smin(a, b_):
                return builder.select(builder.icmp_signed("<", a, b_), a, b_)
            raw_p = builder.bitcast(arys[1].data, _I8.as_pointer())
            m = builder.extract_value(arys[6].shape, 0)
            k = builder.extract_value(arys[6].shape, 1)
            n_out = builder.extract_value(arys[11].shape, 1)
            row_bytes = builder.mul(i64(4), i64(5))
            last_w = builder.sub(i64(3), ir.Constant(_I64, 1))
            weight_rows = [builder.add(i64(2), smin(ir.Constant(_I64, w), last_w)) for w in range(tile_w)]
            offsets = [builder.mul(r, row_bytes) for r in weight_rows]
            last_x = builder.sub(m, ir.Constant(_I64, 1))
            x_rows = [smin(builder.add(i64(12), ir.Constant(_I64, r)), last_x) for r in range(tile_x)]
            widths = [builder.extract_value(arys[i].shape, 1) for i in (7, 8, 9)]
            rows = [_Rows(builder, builder.bitcast(builder.gep(arys[6].data, [builder.mul(i, k)]), _I8.as_pointer()),
                          builder.gep(arys[7].data, [builder.mul(i, widths[0])]),
                          builder.gep(arys[8].data, [builder.mul(i, widths[1])]),
                          builder.gep(arys[9].data, [builder.mul(i, widths[2])])) for i in x_rows]
            done = builder.append_basic_block("tile_done")
            cases = {code: builder.append_basic_block(f"tile_{code}") for code in formats}
            switch = builder.switch(i64(0), cases[formats[-1]])  # callers check fmt (kernel_calls)
            for code, block in cases.items():
                switch.add_case(ir.Constant(_I64, code), block)
                builder.position_at_end(block)
                values = _format_loop(builder, code, raw_p, arys[10].data, offsets, rows, i64(4), i64(5))
                for wr, by_x in zip(weight_rows, values):
                    for xr, v in zip(x_rows, by_x):
                        builder.store(v, builder.gep(arys[11].data, [builder.add(builder.mul(xr, n_out), wr)]))
                builder.branch(done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return tile


tile_k = _make_tile(*K_TILE, (5, 6, 7))
tile_32 = _make_tile(*TILE_32, (0, 1, 2, 3, 4))


NAMES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def activations(qx, dx, group):
    """The int8 activations quantize_i8 made, dequantised (float64 (m, k))."""
    m, k = qx.shape
    x = qx.view(np.int8).astype(np.float64).reshape(m, k // group, group)
    return (x * dx.astype(np.float64)[..., None]).reshape(m, k)


def tile_py(fmt, raw, r0, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i0, tile_x):
    """tile in numpy, for NUMBA_DISABLE_JIT=1 and as the tests' reference: the weight rows
    dequantised (dequant_numpy, bit-exact with ggml) times the int8 activations dequantised."""
    from ....quant.dequant_numpy import dequantize_numpy
    m = qx.shape[0]
    rows = list(range(i0, min(m, i0 + tile_x)))
    k = qx.shape[1]
    x = activations(qx[rows], dx[rows], group_of(fmt))
    row_bytes = blocks * block_bytes
    for r in range(r0, r0 + nw):
        w = dequantize_numpy(raw[r * row_bytes:(r + 1) * row_bytes], NAMES[fmt], k).astype(np.float64)
        out[rows, r] = (x @ w).astype(np.float32)


if config.DISABLE_JIT:  # type: ignore[attr-defined]  # (set at import) IR cannot run as Python: numpy instead
    tile_k = functools.partial(tile_py, tile_x=K_TILE[1])
    tile_32 = functools.partial(tile_py, tile_x=TILE_32[1])


@njit(cache=True, nogil=True)
def tile_rows(fmt, block_bytes, raw, qx, dx, s32, s16, table, out, start, stop):
    """Columns start...stop-1 of out (m, n) = the int8 activations (quantize_i8) times the
    transpose of the (n, k) block matrix in raw: X_CHUNK activation rows at a time, over which
    each tile's weight rows pass, a tile's activation rows at a time."""
    m = qx.shape[0]
    blocks = qx.shape[1] // (K_GROUP if fmt >= 5 else 32)
    for x0 in range(0, m, X_CHUNK):
        x1 = min(m, x0 + X_CHUNK)
        if fmt >= 5:
            for r in range(start, stop, K_TILE[0]):
                nw = min(K_TILE[0], stop - r)
                for i in range(x0, x1, K_TILE[1]):
                    tile_k(fmt, raw, r, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i)
        else:
            for r in range(start, stop, TILE_32[0]):
                nw = min(TILE_32[0], stop - r)
                for i in range(x0, x1, TILE_32[1]):
                    tile_32(fmt, raw, r, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i)


@entry("i64", "i64", "u8[1]", "u8[2]", "f32[2]", "i32[2]", "i32[2]", "f32[1]", "f32[2]", "i64", "i64", "i64[1]",
       returns="bool")
@njit(cache=True, nogil=True)
def tile_shared(fmt, block_bytes, raw, qx, dx, s32, s16, table, out, n_rows, chunks, state):
    """tile_rows over chunks of range(n_rows) that every thread calling this takes from state[0];
    state[1] counts finished chunks. True in the thread that finished the last one (threads.RowPool)."""
    last = False
    while True:
        c = atomics.fetch_add(state, 0, 1)
        if c >= chunks:
            return last
        tile_rows(fmt, block_bytes, raw, qx, dx, s32, s16, table, out, n_rows * c // chunks,
                  n_rows * (c + 1) // chunks)
        if atomics.fetch_add(state, 1, 1) == chunks - 1:
            last = True
