"""The K-quant blocks' dot products (q4_k, q5_k, q6_k: 256 values a block) as vector IR, for
the decoding-step kernels in vector_ir.py, which uses kernel_body for these formats (and
hands this module its IR helpers as it loads: bind).

Byte dots, as ggml does: the activations (int16, one scale per 32 values:
int_dot.quantize_rows) are requantised to int8 as the block is read, x8 = (127 x16 + 2^14) >> 15
(x86's pmulhrsw; |x8| <= 127, the scale dx * 32768 / 127), so each 32 weights times 32
activations is one byte dot: vpdpbusd (AVX-512 VNNI or AVX-VNNI), else vpmaddubsw + vpmaddwd
(AVX2), else (other targets, wasm) both widened to 16 bits and multiplied in pairs. Still finer
than ggml's Q8_K (one scale per 256). The weights' unsigned fields (4/5/6 bits) stay bytes.

The blocks' 6-bit (q4_k, q5_k) or 8-bit (q6_k) sub-block scales are unpacked once per block
into vectors (ggml's utmp shuffle for the packed 6-bit ones). Each 32-value sub-block's byte
dot is 8 int32 lanes; the block's 8 sub-block vectors are reduced into one vector whose lane j
is sub-block j's sum (a transposing reduction of pairwise adds), converted once and multiplied
by the 8 coefficients d * scale_j * dx_j in one fused multiply-add: one float operation per
block and row where the per-sub-block form needed 8 conversions, products and adds. q4_k /
q5_k's mins, dmin * sum_j min_j * dx_j * sum(x8_j), take the int8 block sums. q6_k's
quants are read unsigned (0...63): its offset, 32 * sum(x8) per 4 values, is one more byte dot
per sub-block that the block's weight rows share; its 16 int8 scales multiply the int32 lanes
(4 lanes a scale).

Measured: docs/cpu-kernels.md. The product is dot_py's (vector_ir): the requantised activations
times the dequantised weights, up to float32 rounding.
"""
from typing import Any

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from . import arm_ir  # aarch64's sdot, where the target has dotprod

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
# vector_ir's IR helpers, bound by vector_ir as it loads (bind below): it chooses this module's
# loop for the K-quants, so this module does not import it back (no import cycle).
_Activations: Any = None
_prefetch_ahead: Any = None
_const_vec: Any = None
_f16_scale: Any = None
_fmuladd: Any = None
_hsum: Any = None
_load: Any = None
_pair_madd: Any = None
_splat: Any = None
_vec: Any = None
_X86_PHADD: Any = None
_X86_WIDE: Any = None  # AVX-512BW: the requantisation on 32 lanes at once
_BYTE_DOT: Any = None  # "vnni", "avx2" or None (the generic form): how x86 hosts multiply bytes (bind)
_ARM_DOT = False  # the target has aarch64 dotprod: _byte_dot(..., below_128=True) is sdot (arm_ir; bind)
_BLOCK_BYTES = {5: 144, 6: 176, 7: 210}  # q4_k, q5_k, q6_k (what _prefetch_ahead asks for each block)
X8_MUL = 127  # x8 = (X8_MUL * x16 + 2^14) >> 15: int16 activations (|x16| <= 32767) to int8
X8_SCALE = 32768.0 / X8_MUL  # x8 * dx * X8_SCALE ~= x16 * dx


def requantised(qx):
    """The int8 activations the K-quant kernels compute with, from quantize_rows' int16 ones (numpy:
    the tests' and dot_py's reference). Their scale is dx * X8_SCALE."""
    return ((qx.astype(np.int32) * X8_MUL + (1 << 14)) >> 15).astype(np.int8)


def bind(v):
    """Take vector_ir's helpers (v: the vector_ir module, calling this as it loads)."""
    global _Activations, _const_vec, _f16_scale, _fmuladd, _hsum, _load, _pair_madd, _splat, _vec, _prefetch_ahead
    _Activations, _const_vec, _f16_scale, _fmuladd = v._Activations, v._const_vec, v._f16_scale, v._fmuladd
    _prefetch_ahead = v._prefetch_ahead
    _hsum, _load, _pair_madd, _splat, _vec = v._hsum, v._load, v._pair_madd, v._splat, v._vec
    global _X86_PHADD, _BYTE_DOT
    features = v._cpu_features() if v._X86_MADD else set()
    _X86_PHADD = "llvm.x86.avx2.phadd.d" if v._X86_MADD else None
    global _ARM_DOT
    _ARM_DOT = arm_ir.has_dotprod(v._cpu_features())
    global _X86_WIDE
    _X86_WIDE = "+avx512bw" in features
    if "+avxvnni" in features or {"+avx512vnni", "+avx512vl"} <= features:
        _BYTE_DOT = "vnni"
    elif v._X86_MADD:
        _BYTE_DOT = "avx2"


def _bytes(builder, raw, p, at):
    """The 32 bytes at raw + p + at as <32 x i8>: the bit fields are cut in byte lanes (32 a
    vector op on AVX2, twice what 16-bit lanes give) and widened only for the multiplies."""
    return _load(builder, raw, builder.add(p, ir.Constant(_I64, at)), _vec(_I8, 32))


def _x86(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, name), args)


def _x86_host(builder):
    return not builder.module.triple.startswith("wasm")


def _int8_block(builder, x, a):
    """Activation block a (values 32a...32a + 31 of the weight block) requantised to <32 x i8>."""
    at = builder.add(builder.mul(x.first, ir.Constant(_I64, 32)), ir.Constant(_I64, 32 * a))
    x16 = _load(builder, builder.bitcast(builder.gep(x.xi, [at]), _I8.as_pointer()), ir.Constant(_I64, 0),
                _vec(_I16, 32))
    if _X86_WIDE and _x86_host(builder):
        scaled = _x86(builder, "llvm.x86.avx512.pmul.hr.sw.512", x16.type, [x16, _const_vec(_I16, [X8_MUL] * 32)])
    elif _BYTE_DOT and _x86_host(builder):
        v16 = _vec(_I16, 16)
        halves = [_x86(builder, "llvm.x86.avx2.pmul.hr.sw", v16,
                       [builder.shuffle_vector(x16, x16, _const_vec(_I32, range(h, h + 16))),
                        _const_vec(_I16, [X8_MUL] * 16)]) for h in (0, 16)]
        scaled = builder.shuffle_vector(halves[0], halves[1], _const_vec(_I32, range(32)))
    else:
        wide = builder.mul(builder.sext(x16, _vec(_I32, 32)), _const_vec(_I32, [X8_MUL] * 32))
        scaled = builder.ashr(builder.add(wide, _const_vec(_I32, [1 << 14] * 32)), _const_vec(_I32, [15] * 32))
    return builder.trunc(scaled, _vec(_I8, 32))


def _byte_dot(builder, u, s, acc=None, below_128=False):
    """<32 x i8> u (unsigned, <= 63) times <32 x i8> s (signed, |s| <= 127) -> <8 x i32>, lane i the
    sum of products 4i...4i + 3 (plus acc's lane i). below_128: the caller knows u <= 127 (aarch64's
    signed sdot then takes it: arm_ir; a u of 128-255 needs the other forms)."""
    i32x8 = _vec(_I32, 8)
    if _BYTE_DOT == "vnni" and _x86_host(builder):
        start = acc if acc is not None else ir.Constant(i32x8, [ir.Constant(_I32, 0)] * 8)
        return _x86(builder, "llvm.x86.avx512.vpdpbusd.256", i32x8,
                    [start, builder.bitcast(u, i32x8), builder.bitcast(s, i32x8)])
    if _BYTE_DOT == "avx2" and _x86_host(builder):  # pairs: |u s + u' s'| <= 2 * 63 * 127, no saturation
        pairs = _x86(builder, "llvm.x86.avx2.pmadd.ub.sw", _vec(_I16, 16), [u, s])
        sums = _pair_madd(builder, pairs, _const_vec(_I16, [1] * 16))
    elif _ARM_DOT and below_128 and (dot := arm_ir.byte_dot(builder, u, s, acc)) is not None:
        return dot
    else:
        lo_u, hi_u = _widen(builder, u)
        lo_s, hi_s = _widen(builder, s, signed=True)
        lo, hi = _pair_madd(builder, lo_u, lo_s), _pair_madd(builder, hi_u, hi_s)  # pairs of values 0-15, 16-31
        sums = builder.add(builder.shuffle_vector(lo, hi, _const_vec(_I32, range(0, 16, 2))),
                           builder.shuffle_vector(lo, hi, _const_vec(_I32, range(1, 16, 2))))
    return sums if acc is None else builder.add(sums, acc)


def _i8s(v):
    return _const_vec(_I8, [v] * 32)


def _widen(builder, v, signed=False):
    """<32 x i8> -> its two halves as <16 x i16> (zero- or sign-extended)."""
    lo = builder.shuffle_vector(v, v, _const_vec(_I32, range(16)))
    hi = builder.shuffle_vector(v, v, _const_vec(_I32, range(16, 32)))
    ext = builder.sext if signed else builder.zext
    return ext(lo, _vec(_I16, 16)), ext(hi, _vec(_I16, 16))


def _pair_sums(builder, a, b):
    """<8 x i32> a, b -> [a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, a6+a7, b4+b5, b6+b7]: x86's horizontal
    add within 128-bit halves (named on AVX2 hosts: vphaddd), elsewhere two shuffles and an add."""
    if _X86_PHADD and _x86_host(builder):
        return _x86(builder, _X86_PHADD, a.type, [a, b])
    even = builder.shuffle_vector(a, b, _const_vec(_I32, [0, 2, 8, 10, 4, 6, 12, 14]))
    odd = builder.shuffle_vector(a, b, _const_vec(_I32, [1, 3, 9, 11, 5, 7, 13, 15]))
    return builder.add(even, odd)


def _sums_by_lane(builder, sums):
    """Eight <8 x i32> vectors -> <8 x float> whose lane j is the sum of vector j's lanes: a
    transposing reduction, 6 pairwise adds within 128-bit halves, then the halves' sum."""
    level = list(sums)
    for _ in range(2):
        level = [_pair_sums(builder, level[i], level[i + 1]) for i in range(0, len(level), 2)]
    # level[0]: vectors 0-3's sums over their first halves, then over their second; level[1]: 4-7's
    first = builder.shuffle_vector(level[0], level[1], _const_vec(_I32, [0, 1, 2, 3, 8, 9, 10, 11]))
    second = builder.shuffle_vector(level[0], level[1], _const_vec(_I32, [4, 5, 6, 7, 12, 13, 14, 15]))
    return builder.sitofp(builder.add(first, second), _vec(_F32, 8))


def _scales_mins_k4(builder, raw, p):
    """(8 scales, 8 mins) of a q4_k / q5_k block as <8 x float>: ggml's unpacking of the 12
    bytes at p + 4 (get_scale_min_k4 for all eight at once, on 32-bit words)."""
    def word(i):
        return _load(builder, raw, builder.add(p, ir.Constant(_I64, 4 + 4 * i)), _I32)

    def c(v):
        return ir.Constant(_I32, v)
    u0, u1, u2 = word(0), word(1), word(2)
    m1, m2, m3 = c(0x3F3F3F3F), c(0x0F0F0F0F), c(0x03030303)
    def top2(u):  # bits 6-7 of each byte, moved to bits 4-5
        return builder.shl(builder.and_(builder.lshr(u, c(6)), m3), c(4))
    u3 = builder.or_(builder.and_(builder.lshr(u2, c(4)), m2), top2(u1))
    mins_lo = builder.and_(u1, m1)
    u1 = builder.or_(builder.and_(u2, m2), top2(u0))
    u0 = builder.and_(u0, m1)
    words = ir.Constant(_vec(_I32, 4), ir.Undefined)
    for i, w in enumerate((u0, u1, mins_lo, u3)):
        words = builder.insert_element(words, w, c(i))
    b = builder.bitcast(words, _vec(_I8, 16))
    f8 = _vec(_F32, 8)
    scales = builder.uitofp(builder.shuffle_vector(b, b, _const_vec(_I32, range(8))), f8)
    mins = builder.uitofp(builder.shuffle_vector(b, b, _const_vec(_I32, range(8, 16))), f8)
    return scales, mins


def _activation_vectors(builder, x, x8, with_sums):
    """x's 8 activation-block scales of this weight block as <8 x float>, for its int8 values x8
    (dx times X8_SCALE), and (with_sums) each block's int8 sum times its scale: the mins' share
    takes the same int8 values as the quants' (a block's min and scale terms often nearly cancel:
    the 16-bit sums there left the int8 error of the larger terms, 3x llama.cpp's logit error on
    Llama-shaped Q4_K files; measured in docs/cpu-kernels.md)."""
    f8 = _vec(_F32, 8)
    dx = _load(builder, builder.bitcast(builder.gep(x.dxi, [x.first]), _I8.as_pointer()), ir.Constant(_I64, 0), f8)
    dx8 = builder.fmul(dx, _const_vec(_F32, [X8_SCALE] * 8))
    if not with_sums:
        return dx8, None
    sums = _sums_by_lane(builder, [_byte_dot(builder, _i8s(1), v, below_128=True) for v in x8])
    return dx8, builder.fmul(dx8, sums)


def kernel_body(builder, code, rows, raw_p, table_p, x_rows, oa, ob, blocks, block_bytes):
    """vector_ir._kernel_body for code 5 (q4_k), 6 (q5_k) or 7 (q6_k): [the row at oa times
    each activation row, then ob's]."""
    f8 = _vec(_F32, 8)
    zero8 = ir.Constant(f8, [ir.Constant(_F32, 0.0)] * 8)
    accs = [cgutils.alloca_once_value(builder, zero8) for _ in range(2 * rows)]
    mins = [cgutils.alloca_once_value(builder, zero8) for _ in range(2 * rows)]
    with cgutils.for_range(builder, blocks) as loop:
        b = loop.index
        first = builder.mul(b, ir.Constant(_I64, 8))
        xs = [_Activations(builder, *x_row, first) for x_row in x_rows]
        x8 = [[_int8_block(builder, x, a) for a in range(8)] for x in xs]  # shared by the two weight rows
        xv = [_activation_vectors(builder, x, row, code != 7) for x, row in zip(xs, x8)]
        offsets = None
        if code == 7:  # -32 * (sums of 4 values), q6_k's offset: also shared (each dot starts from it)
            offsets = [[_byte_dot(builder, _i8s(32), builder.neg(v), below_128=True) for v in row] for row in x8]
        step = builder.mul(b, block_bytes)
        for w, base in enumerate((oa, ob)):
            p = builder.add(base, step)
            _prefetch_ahead(builder, raw_p, p, _BLOCK_BYTES[code])
            mine = range(w * rows, (w + 1) * rows)
            totals = [builder.load(accs[i]) for i in mine]
            if code == 7:
                d = _splat(builder, _f16_scale(builder, raw_p, table_p, builder.add(p, ir.Constant(_I64, 208))), 8)
                for i, total, (dx, _), row in zip(mine, totals, xv, _q6_sums(builder, raw_p, p, x8, offsets)):
                    builder.store(_q6_total(builder, raw_p, p, d, dx, row, total), accs[i])
                continue
            else:
                d = _splat(builder, _f16_scale(builder, raw_p, table_p, p), 8)
                dmin = _splat(builder, _f16_scale(builder, raw_p, table_p, builder.add(p, ir.Constant(_I64, 2))), 8)
                sc, mn = _scales_mins_k4(builder, raw_p, p)
                dsc, dmn = builder.fmul(d, sc), builder.fmul(dmin, mn)
                coefs = [builder.fmul(dsc, dx) for dx, _ in xv]
                for i, (_, xsum) in zip(mine, xv):
                    builder.store(_fmuladd(builder, dmn, xsum, builder.load(mins[i])), mins[i])
            for i, total, coef, s in zip(mine, totals, coefs, _k4_sums(builder, code, raw_p, p, x8)):
                builder.store(_fmuladd(builder, _sums_by_lane(builder, s), coef, total), accs[i])
    return [builder.fsub(_hsum(builder, builder.load(a)), _hsum(builder, builder.load(m))) for a, m in zip(accs, mins)]


def _k4_sums(builder, code, raw, p, x8):
    """q4_k / q5_k: per activation row, the 8 sub-blocks' byte dots (<8 x i32> each). Group g's 32
    quant bytes hold sub-block 2g in their low nibbles and 2g + 1 in their high ones (q5_k: fifth
    bits from bits 2g and 2g + 1 of the 32 qh bytes)."""
    qh = _bytes(builder, raw, p, 16) if code == 6 else None
    sums = [[] for _ in x8]
    for g in range(4):
        q = _bytes(builder, raw, p, (48 if code == 6 else 16) + 32 * g)
        parts = [builder.and_(q, _i8s(15)), builder.lshr(q, _i8s(4))]
        for h in range(2):
            j = 2 * g + h
            if qh is not None:
                bit = builder.and_(builder.lshr(qh, _i8s(j)), _i8s(1))
                parts[h] = builder.or_(parts[h], builder.shl(bit, _i8s(4)))
            for r, row in enumerate(x8):
                sums[r].append(_byte_dot(builder, parts[h], row[j], below_128=True))
    return sums


def _q6_sums(builder, raw, p, x8, offsets):
    """q6_k: per activation row, the 8 32-value quarters' byte dots (<8 x i32>; lanes 0-3 values
    0-15, 4-7 values 16-31: one int8 scale each). Quarter t of half hf takes its low 4 bits from ql
    bytes 64hf + 32(t % 2) (low nibbles for t < 2, high for t >= 2) and its top 2 from qh byte
    128 + 32hf + l, bits 2t; value - 32 (the dots start from the offsets)."""
    sums = [[] for _ in x8]
    for hf in range(2):
        qh = _bytes(builder, raw, p, 128 + 32 * hf)
        for t in range(4):
            ql = _bytes(builder, raw, p, 64 * hf + 32 * (t & 1))
            low = builder.and_(builder.lshr(ql, _i8s(4 * (t >> 1))), _i8s(15))
            high = builder.and_(builder.lshr(qh, _i8s(2 * t)), _i8s(3))
            q = builder.or_(low, builder.shl(high, _i8s(4)))  # 0...63
            a = 4 * hf + t
            for r, row in enumerate(x8):
                sums[r].append(_byte_dot(builder, q, row[a], offsets[r][a], below_128=True))
    return sums


# the 16 scales' order after two levels of _pair_sums on the 8 quarters' dots
_Q6_GROUPS = ([0, 2, 4, 6, 1, 3, 5, 7], [8, 10, 12, 14, 9, 11, 13, 15])


def _q6_total(builder, raw, p, d, dx, sums, total):
    """total + q6_k's block for one activation row: the quarters' dots reduced to the 16 groups of
    16 values (two levels of pairwise adds: <= 16 * 32 * 127, exact), then each group times d, its
    int8 scale (bytes 192...207) and its activation block's scale dx[g / 2], in two fused
    multiply-adds."""
    pairs = [_pair_sums(builder, sums[i], sums[i + 1]) for i in range(0, 8, 2)]
    groups = [_pair_sums(builder, pairs[0], pairs[1]), _pair_sums(builder, pairs[2], pairs[3])]
    scales = _load(builder, raw, builder.add(p, ir.Constant(_I64, 192)), _vec(_I8, 16))
    f8 = _vec(_F32, 8)
    for v, order in zip(groups, _Q6_GROUPS):
        sc = builder.sitofp(builder.shuffle_vector(scales, scales, _const_vec(_I32, order)), f8)
        dxg = builder.shuffle_vector(dx, dx, _const_vec(_I32, [g // 2 for g in order]))
        total = _fmuladd(builder, builder.sitofp(v, f8), builder.fmul(builder.fmul(d, sc), dxg), total)
    return total
