"""Prompt products on GGUF blocks as integer GEMM tiles: the activations quantised to int8 once
per product, then a tile of weight rows times activation rows per inner loop (K_TILE, TILE_32), so each weight
block is unpacked once for all the tile's activation rows and each activation block loaded once for
all its weight rows.

As ggml does for prompts (its Q8_K / Q8_0 activations and byte products), learnt from, not copied:

  * `quantize_i8`: each activation row in groups of 256 values (the K-quants: one scale a
    weight block, ggml's Q8_K) or 32 (the 32-value formats: ggml's Q8_0), value round(x / d),
    d = amax / 127; with every 16 and every 32 values' integer sums (the mins' and offsets'
    share, in integers).
  * K-quants (q4_k, q5_k, q6_k): `quantize_k` stores each 256-value block's int8 values in the
    K order (K_ORDER: value 16 s + 4 t + j at byte 64 t + 4 s + j), and each weight block's
    unsigned quants are permuted alike (one dword permute, one variable 16-bit shift and one and
    per 64 values), so the block's four 64-byte byte products (vpdpbusd with AVX-512 VNNI: one
    multiply instruction per 64 values and row pair) add into one 16-lane int32 accumulator
    whose lane s holds the 16-value group s's dot, inside one sub-block (q6_k's 16 values, q4_k
    / q5_k's 32), exact. Then float(lanes) times the weight row's 16 scales d sc, times dx, in
    one multiply and one fused multiply-add per block and pair; q4_k / q5_k's mins one more
    (-dmin mn times the activations' 16-value sums times dx), q6_k's -32 offset starts the
    integer dot from -32 times those sums (shared by the weight rows). `unpack_k` writes a tile's
    weight rows in that form (K_UNPACKED bytes a block: permuted quants, scales, mins) once per
    chunk of activation rows, into a scratch the tile only loads from.
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
from .vector_ir import _const_vec, _f16_scale, _fmuladd, _hsum, _load, _splat, _vec

# (weight rows, activation rows) per tile: the K-quants (byte products of 64 values, 16 int32 lanes
# a row pair) and the 32-value formats; measured best of 1-4 x 2-8 on the AVX-512 box (docs/cpu-kernels.md;
# session 39's K-quant tiles again: 2x8 no worse than 1x16, 2x4, 2x6, 3x4, 3x8, 4x4, 4x6 within the noise)
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


@entry("f32[2]", "u8[2]", "f32[2]", "i32[2]", "i32[2]")
@njit(cache=True, nogil=True)
def quantize_k(x, qx, dx, s32, s16):
    """quantize_i8(x, 256, ...) for the K-quant tiles: the same values, scales and sums, each
    256-value block's values stored in the K order (K_ORDER: value 16 s + 4 t + j at byte
    64 t + 4 s + j, i.e. 4-byte word 16 t + s holds the natural word 4 s + t). In loops LLVM
    vectorises: amax as the largest of the values' bit patterns without the sign (their order is
    the floats' order), the values into a natural-order buffer, then the words transposed."""
    m, k = x.shape
    bits = x.view(np.int32)
    top = np.empty(1, np.int32)
    top_f = top.view(np.float32)
    q = np.empty(256, np.int32)
    q8 = np.empty(256, np.uint8)
    words = q8.view(np.int32)
    for i in range(m):
        row = qx[i].view(np.int32)
        for g in range(k // 256):
            at = g * 256
            t = np.int32(0)
            for j in range(256):
                t = max(t, bits[i, at + j] & np.int32(0x7FFFFFFF))
            top[0] = t
            d = top_f[0] / np.float32(127.0)
            dx[i, g] = d
            inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
            for j in range(256):
                q[j] = np.int32(_roundf(x[i, at + j] * inv))
            for j in range(256):
                q8[j] = np.uint8(q[j] & 255)
            for c in range(16):
                total = np.int32(0)
                for j in range(16):
                    total += q[16 * c + j]
                s16[i, g * 16 + c] = total
            for t4 in range(4):
                for c in range(16):
                    row[g * 64 + 16 * t4 + c] = words[4 * c + t4]
        for c in range(k // 32):
            s32[i, c] = s16[i, 2 * c] + s16[i, 2 * c + 1]


def _x86(builder):
    return kquant_ir._BYTE_DOT is not None and not builder.module.triple.startswith("wasm")


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


def _zero_i32x16():
    return ir.Constant(_vec(_I32, 16), [ir.Constant(_I32, 0)] * 16)


def _fma16(builder, a, b, c):
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.fmuladd.v16f32"), [a, b, c])


def _c8(v, n=64):
    return _const_vec(_I8, [v - 256 if v > 127 else v] * n)


# The K-quants' activation order (quantize_k): within each 256-value block, byte 64 t + 4 s + j holds
# value 16 s + 4 t + j (t 0-3, s 0-15, j 0-3), so int32 lane s of every 64-byte step's byte product
# sums values of one 16-value group s only: the whole block's dot stays in one accumulator per pair,
# each lane within one sub-block (q6_k's 16 values, q4_k / q5_k's 32: lanes 2c and 2c + 1)
K_ORDER = np.array([16 * s + 4 * t + j for t in range(4) for s in range(16) for j in range(4)], dtype=np.int64)


def _natural(t, pos):
    """The block's value index at byte pos of step t of the K order."""
    return 16 * (pos // 4) + 4 * t + pos % 4


def _weights_k(builder, code, raw, p, t):
    """Step t of a q4_k / q5_k / q6_k block's unsigned quants in the K order (<64 x i8>): one permute
    of the quant bytes (vpermt2b with AVX-512 VBMI), one variable 16-bit shift (the nibble: a 4-byte
    lane keeps one sub-block, so both bytes of a word shift alike) and one and; q5_k / q6_k's high
    bits the same way from their 32 / 64 bytes."""
    v = [_natural(t, pos) for pos in range(64)]
    i16x32 = _vec(_I16, 32)

    def shifted(vec, shifts, mask):
        w = builder.lshr(builder.bitcast(vec, i16x32), _const_vec(_I16, shifts[::2]))
        return builder.and_(builder.bitcast(w, _vec(_I8, 64)), _c8(mask))
    if code == 7:  # q6_k: ql at 0 (128 bytes), qh at 128 (64), value v: half h, quarter qq, l
        ql = [_load(builder, raw, builder.add(p, ir.Constant(_I64, 64 * i)), _vec(_I8, 64)) for i in (0, 1)]
        qh = _load(builder, raw, builder.add(p, ir.Constant(_I64, 128)), _vec(_I8, 64))
        low = builder.shuffle_vector(ql[0], ql[1], _const_vec(
            _I32, [64 * (x // 128) + 32 * ((x % 128) // 32 % 2) + x % 32 for x in v]))
        low = shifted(low, [4 * ((x % 128) // 64) for x in v], 15)
        high = builder.shuffle_vector(qh, qh, _const_vec(_I32, [32 * (x // 128) + x % 32 for x in v]))
        high = shifted(high, [2 * ((x % 128) // 32) for x in v], 3)
        return builder.or_(low, builder.shl(high, _c8(4)))
    at = 16 if code == 5 else 48  # q4_k / q5_k: quant byte 32 (v // 64) + v % 32, nibble (v // 32) % 2
    qs = [_load(builder, raw, builder.add(p, ir.Constant(_I64, at + 64 * i)), _vec(_I8, 64)) for i in (0, 1)]
    u = builder.shuffle_vector(qs[0], qs[1], _const_vec(_I32, [32 * (x // 64) + x % 32 for x in v]))
    u = shifted(u, [4 * ((x // 32) % 2) for x in v], 15)
    if code == 6:  # q5_k: bit v // 32 of qh byte v % 32 (at 16) is the value's bit 4
        qh = kquant_ir._bytes(builder, raw, p, 16)
        hb = builder.shuffle_vector(qh, qh, _const_vec(_I32, [x % 32 for x in v]))
        hb = shifted(hb, [x // 32 for x in v], 1)
        u = builder.or_(u, builder.shl(hb, _c8(4)))
    return u


def _unpacked_k(builder, code, raw, table, p):
    """A q4_k / q5_k / q6_k block at raw + p as the tiles use it: its quants in the K order (four
    <64 x i8>), the 16 lanes' scales d sc (<16 x float>) and q4_k / q5_k's -dmin mn (else None)."""
    f16 = _vec(_F32, 16)
    if code == 7:
        d = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 208)))
        sc8 = _load(builder, raw, builder.add(p, ir.Constant(_I64, 192)), _vec(_I8, 16))
        wsc = builder.fmul(builder.sitofp(sc8, f16), _splat(builder, d, 16))
        neg_mins = None
    else:
        d = _f16_scale(builder, raw, table, p)
        dmin = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 2)))
        sc, mn = kquant_ir._scales_mins_k4(builder, raw, p)
        pairs = _const_vec(_I32, [s // 2 for s in range(16)])
        wsc = builder.fmul(builder.shuffle_vector(sc, sc, pairs), _splat(builder, d, 16))
        neg_mins = builder.fmul(builder.shuffle_vector(mn, mn, pairs), _splat(builder, builder.fneg(dmin), 16))
    return [_weights_k(builder, code, raw, p, t) for t in range(4)], wsc, neg_mins


K_UNPACKED = 384  # bytes of a block unpacked (unpack_k): 256 quants in the K order, 16 scales, 16 mins


def _load_unpacked(builder, code, wk, p):
    """_unpacked_k's values as unpack_k stored them at wk + p."""
    def at(off, ty):
        return _load(builder, wk, builder.add(p, ir.Constant(_I64, off)), ty)
    f16 = _vec(_F32, 16)
    return ([at(64 * t, _vec(_I8, 64)) for t in range(4)], at(256, f16),
            at(320, f16) if code != 7 else None)


def _body_k(builder, code, weights, rows, b, accs):
    """One q4_k / q5_k / q6_k block for every (weight, activation) row pair, the activations in the
    K order (quantize_k), weights [(quants, scales, mins)] as _unpacked_k gives them: four 64-byte
    byte products (vpdpbusd: unsigned quants times int8 activations, exact in int32) into one
    16-lane accumulator a pair, lane s the 16-value group s's dot; then float(lanes) times the
    weight row's 16 scales d sc (sub-block of lane s), times dx, added to the pair's float
    accumulator. q4_k / q5_k's mins: -dmin mn times the activations' 16-value sums times dx (one
    more fused multiply-add a pair); q6_k's -32 offset starts the dot from -32 times those sums
    (integers, shared by the weight rows)."""
    at = builder.mul(b, ir.Constant(_I64, 256))
    f16 = _vec(_F32, 16)
    for r, row in enumerate(rows):  # (a row at a time: its values live only while its pairs are made)
        xs = [_load(builder, row.x, builder.add(at, ir.Constant(_I64, 64 * t)), _vec(_I8, 64)) for t in range(4)]
        dxv = _splat(builder, row.scale(b), 16)
        s16 = row.sums16(builder.mul(b, ir.Constant(_I64, 16)))
        if code == 7:
            extra = builder.mul(s16, _const_vec(_I32, [-32] * 16))
        else:
            extra = builder.fmul(builder.sitofp(s16, f16), dxv)
        for w, (us, wsc, neg_mins) in enumerate(weights):
            isum = extra if code == 7 else None
            for t in range(4):
                isum = _byte_dot_64(builder, us[t], xs[t], isum)
            acc = _fma16(builder, builder.fmul(builder.sitofp(isum, f16), wsc), dxv, builder.load(accs[w][r]))
            if neg_mins is not None:
                acc = _fma16(builder, neg_mins, extra, acc)
            builder.store(acc, accs[w][r])


def _format_loop(builder, code, raw, table, offsets, rows, blocks, block_bytes, scratch=False):
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
            assert scratch, "the K-quant tiles read unpack_k's rows"  # (raw: K_UNPACKED bytes a block)
            _body_k(builder, code, [_load_unpacked(builder, code, raw, p) for p in ps], rows, b, accs)
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

    if code >= 5 and len(offsets) * len(rows) == 16:  # (the K-quants: 16 lanes each, nothing else)
        sums = _sums16(builder, [builder.load(a) for ar in accs for a in ar])
        return [sums[w * len(rows):(w + 1) * len(rows)] for w in range(len(offsets))]

    def total(a, a8, e):
        v = builder.load(a)
        v = builder.fadd(builder.fadd(_half(builder, v, 0), _half(builder, v, 1)), builder.load(a8))
        return builder.fadd(_hsum(builder, v), builder.load(e))
    return [[total(a, a8, e) for a, a8, e in zip(ar, mr, er)] for ar, mr, er in zip(accs, acc8, extras)]


def _sums16(builder, vecs):
    """The lane sums of 16 <16 x float> vectors (as 16 floats), by a tree of 15 steps of two
    shuffles and an add (each step halves the lanes every vector has in the result; about a
    third of 16 separate horizontal sums' operations)."""
    level = [(v, [i] * 16) for i, v in enumerate(vecs)]  # (vector, which vector's sum each lane holds)
    while len(level) > 1:
        nxt = []
        for (a, oa), (b_, ob) in zip(level[::2], level[1::2]):
            owners = oa + ob
            groups = {}
            for lane, o in enumerate(owners):
                groups.setdefault(o, []).append(lane)
            lo = [lane for lanes in groups.values() for lane in lanes[:len(lanes) // 2]]
            hi = [lane for lanes in groups.values() for lane in lanes[len(lanes) // 2:]]
            v = builder.fadd(builder.shuffle_vector(a, b_, _const_vec(_I32, lo)),
                             builder.shuffle_vector(a, b_, _const_vec(_I32, hi)))
            nxt.append((v, [owners[lane] for lane in lo]))
        level = nxt
    v, owners = level[0]
    return [builder.extract_element(v, ir.Constant(_I32, owners.index(i))) for i in range(16)]


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


def _make_tile(tile_w, tile_x, formats, scratch=False):
    """The tile kernel of tile_w weight rows times tile_x activation rows for the format codes `formats`.
    scratch (K-quants): raw holds unpack_k's tile_w rows (K_UNPACKED bytes a block; block_bytes is
    not read), r0 and nw name their columns of out."""
    @intrinsic
    def tile(typingctx, fmt, raw, r0, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i0):
        """out[i, r] for the tile_x activation rows i from i0 and the tile_w weight rows r from r0 (each
        `blocks` blocks of `block_bytes` in raw, uint8): rows past the last one (i0 + ... >= m, or
        r0 + w >= r0 + nw) are clamped to it and store its own value again. qx (m, k) uint8 int8
        values, dx (m, k / group_of(fmt)) float32, s32 (m, k / 32) and s16 (m, k / 16) int32 (from
        quantize_i8; K-quants: quantize_k), table float32 f16 values, out (m, n) float32; fmt a FORMATS code."""
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
            if scratch:
                unpacked = builder.mul(i64(4), ir.Constant(_I64, K_UNPACKED))
                offsets = [builder.mul(ir.Constant(_I64, w), unpacked) for w in range(tile_w)]
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
                values = _format_loop(builder, code, raw_p, arys[10].data, offsets, rows, i64(4),
                                      ir.Constant(_I64, K_UNPACKED) if scratch else i64(5), scratch)
                for wr, by_x in zip(weight_rows, values):
                    for xr, v in zip(x_rows, by_x):
                        builder.store(v, builder.gep(arys[11].data, [builder.add(builder.mul(xr, n_out), wr)]))
                builder.branch(done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return tile


def _make_unpack(tile_w):
    """unpack_k for tiles of tile_w weight rows."""
    @intrinsic
    def unpack(typingctx, fmt, raw, r0, nw, blocks, block_bytes, table, wk):
        """wk (uint8, at least tile_w * blocks * K_UNPACKED bytes) = weight rows r0...r0 + tile_w - 1
        (each `blocks` K-quant blocks of `block_bytes` in raw; rows from r0 + nw clamped to the last)
        as _unpacked_k gives them: per row and block, 256 quant bytes in the K order, then 16 float32
        scales d sc and 16 mins -dmin mn (q6_k: not written). fmt 5, 6 or 7."""
        if not _arrays_fit((raw, table, wk), (types.uint8, types.float32, types.uint8), (1, 1, 1)):
            return None
        sig = types.void(fmt, raw, r0, nw, blocks, block_bytes, table, wk)

        def codegen(context, builder, signature, args):
            t = signature.args
            arys = {i: context.make_array(t[i])(context, builder, args[i]) for i in (1, 6, 7)}

            def i64(i):
                return context.cast(builder, args[i], t[i], types.int64)
            raw_p = builder.bitcast(arys[1].data, _I8.as_pointer())
            wk_p = builder.bitcast(arys[7].data, _I8.as_pointer())
            blocks_, block_bytes_ = i64(4), i64(5)
            last_w = builder.sub(i64(3), ir.Constant(_I64, 1))
            done = builder.append_basic_block("unpack_done")
            cases = {code: builder.append_basic_block(f"unpack_{code}") for code in (5, 6, 7)}
            switch = builder.switch(i64(0), cases[7])
            for code, block in cases.items():
                switch.add_case(ir.Constant(_I64, code), block)
                builder.position_at_end(block)
                for w in range(tile_w):
                    row = builder.add(i64(2), builder.select(builder.icmp_signed("<", ir.Constant(_I64, w), last_w),
                                                             ir.Constant(_I64, w), last_w))
                    first = builder.mul(row, builder.mul(blocks_, block_bytes_))
                    dst0 = builder.mul(builder.mul(ir.Constant(_I64, w), blocks_), ir.Constant(_I64, K_UNPACKED))
                    with cgutils.for_range(builder, blocks_) as loop:
                        b = loop.index
                        us, wsc, neg_mins = _unpacked_k(builder, code, raw_p, arys[6].data,
                                                        builder.add(first, builder.mul(b, block_bytes_)))
                        dst = builder.add(dst0, builder.mul(b, ir.Constant(_I64, K_UNPACKED)))
                        for off, v in [(64 * t_, u) for t_, u in enumerate(us)] + [(256, wsc), (320, neg_mins)]:
                            if v is not None:
                                ptr = builder.bitcast(builder.gep(wk_p, [builder.add(dst, ir.Constant(_I64, off))]),
                                                      v.type.as_pointer())
                                builder.store(v, ptr).align = 1
                builder.branch(done)
            builder.position_at_end(done)
            return context.get_dummy_value()
        return sig, codegen
    return unpack


tile_k = _make_tile(*K_TILE, (5, 6, 7), scratch=True)  # (reads unpack_k's rows)
unpack_k = _make_unpack(K_TILE[0])
_SCRATCH = not config.DISABLE_JIT  # type: ignore[attr-defined]
tile_32 = _make_tile(*TILE_32, (0, 1, 2, 3, 4))


NAMES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def activations(qx, dx, group):
    """The int8 activations quantize_i8 made, dequantised (float64 (m, k))."""
    m, k = qx.shape
    x = qx.view(np.int8).astype(np.float64).reshape(m, k // group, group)
    return (x * dx.astype(np.float64)[..., None]).reshape(m, k)


def natural_order(qx):
    """quantize_k's int8 values (m, k) in the K order back in the natural order (a copy)."""
    m, k = qx.shape
    out = np.empty_like(qx)
    out.reshape(m, k // 256, 256)[:, :, K_ORDER] = qx.reshape(m, k // 256, 256)
    return out


def tile_py(fmt, raw, r0, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i0, tile_x):
    """tile in numpy, for NUMBA_DISABLE_JIT=1 and as the tests' reference: the weight rows
    dequantised (dequant_numpy, bit-exact with ggml) times the int8 activations dequantised."""
    from ....quant.dequant_numpy import dequantize_numpy
    m = qx.shape[0]
    rows = list(range(i0, min(m, i0 + tile_x)))
    k = qx.shape[1]
    x = activations(natural_order(qx[rows]) if fmt >= 5 else qx[rows], dx[rows], group_of(fmt))
    row_bytes = blocks * block_bytes
    for r in range(r0, r0 + nw):
        w = dequantize_numpy(raw[r * row_bytes:(r + 1) * row_bytes], NAMES[fmt], k).astype(np.float64)
        out[rows, r] = (x @ w).astype(np.float32)


if config.DISABLE_JIT:  # type: ignore[attr-defined]  # (set at import) IR cannot run as Python: numpy instead
    tile_k = functools.partial(tile_py, tile_x=K_TILE[1])  # (raw itself: tile_rows unpacks nothing)
    tile_32 = functools.partial(tile_py, tile_x=TILE_32[1])


@njit(cache=True, nogil=True)
def tile_rows(fmt, block_bytes, raw, qx, dx, s32, s16, table, out, start, stop):
    """Columns start...stop-1 of out (m, n) = the int8 activations (quantize_k on K-quant
    matrices, else quantize_i8) times the transpose of the (n, k) block matrix in raw: X_CHUNK
    activation rows at a time, over which each tile's weight rows pass (K-quants: unpacked once
    for them), a tile's activation rows at a time."""
    m = qx.shape[0]
    blocks = qx.shape[1] // (K_GROUP if fmt >= 5 else 32)
    size = K_TILE[0] * blocks * K_UNPACKED if fmt >= 5 and _SCRATCH else 0
    wk = np.empty(size + 64, dtype=np.uint8)  # (its 64-byte loads each on one cache line)
    at = (64 - wk.ctypes.data % 64) % 64
    wk = wk[at:at + size]
    for x0 in range(0, m, X_CHUNK):
        x1 = min(m, x0 + X_CHUNK)
        if fmt >= 5:
            for r in range(start, stop, K_TILE[0]):
                nw = min(K_TILE[0], stop - r)
                if _SCRATCH:  # the tile's weight rows unpacked once for all the chunk's activation rows
                    unpack_k(fmt, raw, r, nw, blocks, block_bytes, table, wk)
                    for i in range(x0, x1, K_TILE[1]):
                        tile_k(fmt, wk, r, nw, blocks, block_bytes, qx, dx, s32, s16, table, out, i)
                else:
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
