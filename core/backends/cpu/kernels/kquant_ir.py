"""The K-quant blocks' dot products (q4_k, q5_k, q6_k: 256 values a block) as vector IR, for
the decoding-step kernels in vector_ir.py, which uses kernel_body for these formats (and
hands this module its IR helpers as it loads: bind).

The blocks' 6-bit (q4_k, q5_k) or 8-bit (q6_k) sub-block scales are unpacked once per block
into vectors (ggml's utmp shuffle for the packed 6-bit ones), and everything a sub-block needs
beyond its integer dots is one vector lane: per activation row, the 8 coefficients
d * scale_j * dx_j of a block are one <8 x float> product, and the mins' whole share of the
block, dmin * sum_j min_j * dx_j * sum(x_j), is one fused multiply-add of three <8 x float>
vectors. q6_k's 16 scales of 16 values multiply its quants as 16-bit integers (|q * scale| <=
32 * 128 fits), so its two halves of a 32-value activation block add as integers before
their one conversion to float. The bit fields are cut in byte lanes (32 values an AVX2 op) and
widened to 16 bits only for the multiplies, and a block's 8 float terms are summed as a tree.
The activations are unchanged (int16, one scale per 32 values: cpu int_dot.quantize_rows).

Measured (one core of the 2-core AMD EPYC box, AVX-512, load 5-7; one activation row times a
2048 x 2048 matrix, best of 15), ns per 256 values and row: q4_k 16.3 -> 11.6-11.9, q5_k
19.3 -> 12.9-13.9, q6_k 21.1 -> 16.6-17.3 (q4_1, the formats' reference: 11.6-11.8). The
per-sub-block form it replaces (generators in vector_ir.py, still used to dequantise) did a
float scale product, scalar loads and a scalar min term for every 32 values.

The result is the same product as before (dot_py's statement), up to float32 rounding.
"""
from typing import Any

from llvmlite import ir
from numba.core import cgutils

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
# vector_ir's IR helpers, bound by vector_ir as it loads (bind below): it chooses this module's
# loop for the K-quants, so this module does not import it back (no import cycle).
_Activations: Any = None
_const_vec: Any = None
_f16_scale: Any = None
_fmuladd: Any = None
_hsum: Any = None
_load: Any = None
_pair_madd: Any = None
_splat: Any = None
_vec: Any = None


def bind(v):
    """Take vector_ir's helpers (v: the vector_ir module, calling this as it loads)."""
    global _Activations, _const_vec, _f16_scale, _fmuladd, _hsum, _load, _pair_madd, _splat, _vec
    _Activations, _const_vec, _f16_scale, _fmuladd = v._Activations, v._const_vec, v._f16_scale, v._fmuladd
    _hsum, _load, _pair_madd, _splat, _vec = v._hsum, v._load, v._pair_madd, v._splat, v._vec


def _bytes(builder, raw, p, at):
    """The 32 bytes at raw + p + at as <32 x i8>: the bit fields are cut in byte lanes (32 a
    vector op on AVX2, twice what 16-bit lanes give) and widened only for the multiplies."""
    return _load(builder, raw, builder.add(p, ir.Constant(_I64, at)), _vec(_I8, 32))


def _i8s(v):
    return _const_vec(_I8, [v] * 32)


def _widen(builder, v, signed=False):
    """<32 x i8> -> its two halves as <16 x i16> (zero- or sign-extended)."""
    lo = builder.shuffle_vector(v, v, _const_vec(_I32, range(16)))
    hi = builder.shuffle_vector(v, v, _const_vec(_I32, range(16, 32)))
    ext = builder.sext if signed else builder.zext
    return ext(lo, _vec(_I16, 16)), ext(hi, _vec(_I16, 16))


def _tree_sum(builder, terms):
    """The terms' sum as a balanced tree: one long chain of fused multiply-adds into an
    accumulator waited ~4 cycles on each (8 a block: the whole budget of a memory-bound block)."""
    while len(terms) > 1:
        terms = [builder.fadd(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def _lane(builder, v, j):
    """<8 x float> of v's lane j."""
    return builder.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), _const_vec(_I32, [j] * 8))


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


def _activation_vectors(builder, x, with_sums):
    """x's 8 activation-block scales of this weight block as <8 x float>, and their value sums."""
    f8 = _vec(_F32, 8)
    dx = _load(builder, builder.bitcast(builder.gep(x.dxi, [x.first]), _I8.as_pointer()), ir.Constant(_I64, 0), f8)
    if not with_sums:
        return dx, None
    sx = _load(builder, builder.bitcast(builder.gep(x.sxi, [x.first]), _I8.as_pointer()), ir.Constant(_I64, 0),
               _vec(_I32, 8))
    return dx, builder.sitofp(sx, f8)


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
        xv = [_activation_vectors(builder, x, code != 7) for x in xs]
        step = builder.mul(b, block_bytes)
        for w, base in enumerate((oa, ob)):
            p = builder.add(base, step)
            mine = range(w * rows, (w + 1) * rows)
            totals = [builder.load(accs[i]) for i in mine]
            if code == 7:
                d = _splat(builder, _f16_scale(builder, raw_p, table_p, builder.add(p, ir.Constant(_I64, 208))), 8)
                coefs = [builder.fmul(d, dx) for dx, _ in xv]
                for i, term in zip(mine, _q6_terms(builder, raw_p, p, xs, coefs, totals)):
                    builder.store(term, accs[i])
                continue
            d = _splat(builder, _f16_scale(builder, raw_p, table_p, p), 8)
            dmin = _splat(builder, _f16_scale(builder, raw_p, table_p, builder.add(p, ir.Constant(_I64, 2))), 8)
            sc, mn = _scales_mins_k4(builder, raw_p, p)
            dsc, dmn = builder.fmul(d, sc), builder.fmul(dmin, mn)
            coefs = [builder.fmul(dsc, dx) for dx, _ in xv]
            for i, (dx, sums) in zip(mine, xv):
                builder.store(_fmuladd(builder, builder.fmul(dmn, dx), sums, builder.load(mins[i])), mins[i])
            qh = _bytes(builder, raw_p, p, 16) if code == 6 else None
            terms = [[] for _ in xs]
            for g in range(4):
                q = _bytes(builder, raw_p, p, (48 if code == 6 else 16) + 32 * g)
                parts = [builder.and_(q, _i8s(15)), builder.lshr(q, _i8s(4))]
                for h in range(2):
                    j = 2 * g + h
                    if qh is not None:  # q5_k's fifth bits: bit j of each qh byte
                        bit = builder.and_(builder.lshr(qh, _i8s(j)), _i8s(1))
                        parts[h] = builder.or_(parts[h], builder.shl(bit, _i8s(4)))
                    lo, hi = _widen(builder, parts[h])
                    for r, x in enumerate(xs):
                        isum = builder.add(_pair_madd(builder, lo, x.chunk(2 * j)),
                                           _pair_madd(builder, hi, x.chunk(2 * j + 1)))
                        terms[r].append(builder.fmul(builder.sitofp(isum, f8), _lane(builder, coefs[r], j)))
            totals = [builder.fadd(total, _tree_sum(builder, ts)) for total, ts in zip(totals, terms)]
            for i, total in zip(mine, totals):
                builder.store(total, accs[i])
    return [builder.fsub(_hsum(builder, builder.load(a)), _hsum(builder, builder.load(m))) for a, m in zip(accs, mins)]


def _q6_terms(builder, raw, p, xs, coefs, totals):
    """q6_k's block added to each row's total: quarter t of half hf takes its low 4 bits from ql
    bytes 64hf + 32(t % 2) (low nibbles for t < 2, high for t >= 2) and its top 2 from qh byte
    128 + 32hf + l, bits 2t; value - 32, times the int8 scale of its 16 (bytes 192...207)."""
    sc16 = builder.sext(_load(builder, raw, builder.add(p, ir.Constant(_I64, 192)), _vec(_I8, 16)), _vec(_I16, 16))
    f8 = _vec(_F32, 8)
    terms = [[] for _ in xs]
    for hf in range(2):
        qh = _bytes(builder, raw, p, 128 + 32 * hf)
        for t in range(4):
            ql = _bytes(builder, raw, p, 64 * hf + 32 * (t & 1))
            low = builder.and_(builder.lshr(ql, _i8s(4 * (t >> 1))), _i8s(15))
            high = builder.and_(builder.lshr(qh, _i8s(2 * t)), _i8s(3))
            q = builder.sub(builder.or_(low, builder.shl(high, _i8s(4))), _i8s(32))  # -32...31: fits i8
            a = 4 * hf + t
            scaled = []
            for h, part in enumerate(_widen(builder, q, signed=True)):
                s = 8 * hf + 2 * t + h
                scale = builder.shuffle_vector(sc16, sc16, _const_vec(_I32, [s] * 16))
                scaled.append(builder.mul(part, scale))
            for r, x in enumerate(xs):
                isum = builder.add(_pair_madd(builder, scaled[0], x.chunk(2 * a)),
                                   _pair_madd(builder, scaled[1], x.chunk(2 * a + 1)))
                terms[r].append(builder.fmul(builder.sitofp(isum, f8), _lane(builder, coefs[r], a)))
    return [builder.fadd(total, _tree_sum(builder, ts)) for total, ts in zip(totals, terms)]
