"""Two weight rows' integer dot products on GGUF blocks, written as LLVM vector IR (numba's
`intrinsic`), for the decoding-step kernels of cpu_int_kernels.py.

Why IR: numba's loops cannot say "multiply 16-bit pairs and add neighbours". LLVM widened
cpu_int_kernels.py's lanes to 32-bit multiplies (vpmulld) and converted every lane to float:
about 4.7 ns per 32-value block per row on x86, ggml's ~1. Here a block is a few vector
operations that every LLVM target lowers to its own instructions: the quants widened to
int16, multiplied by the int16 activations in even/odd pairs whose products are added (x86:
vpmaddwd, or vpdpwssd with VNNI; arm64: smull/smlal pairs), the 8 int32 sums converted to
float and accumulated with the block's scale into 8 float lanes, summed once per row. It is
generic IR (no target intrinsics), so the same code serves x86-64 and aarch64.

Formats: q4_0, q4_1, q5_0, q5_1, q8_0 (blocks of 32) and q4_k, q5_k, q6_k (blocks of 256, with
8 or 16 sub-block scales; the activations keep one scale per 32 values): cpu_kernels.FORMATS
codes 0-7. Each block's integer sums are exact; they are scaled and summed in float32.
NUMBA_DISABLE_JIT=1 cannot run IR: `pair_dot_py` is the same product in numpy (the dequantised
rows times the dequantised activations), which the tests compare against the compiled one and
cpu_int_kernels.py calls when the JIT is off.
"""
import functools

import numpy as np
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.extending import intrinsic

QK = 32
# Byte offsets in a block: the f16 scale d is at 0; then the f16 min (q4_1, q5_1), the 32 fifth
# bits (q5_0, q5_1), the quants.
MIN_AT = {1: 2, 3: 2}
HIGH_BITS_AT = {2: 2, 3: 4}
QUANTS_AT = {0: 2, 1: 4, 2: 6, 3: 8, 4: 2}
OFFSET = {0: 8.0, 2: 16.0}  # q4_0, q5_0 values are q - 8, q - 16
FORMATS = (0, 1, 2, 3, 4, 5, 6, 7)  # cpu_kernels.FORMATS codes: q4_0 ... q8_0, q4_k, q5_k, q6_k
ACTIVATION_BLOCKS = (1, 1, 1, 1, 1, 8, 8, 8)  # 32-value activation blocks per weight block

_I8, _I16, _I32, _I64, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()


def _vec(t, n):
    return ir.VectorType(t, n)


def _const_vec(t, values):
    return ir.Constant(_vec(t, len(values)), [ir.Constant(t, v) for v in values])


def _splat(builder, value, n):
    undef = ir.Constant(_vec(value.type, n), ir.Undefined)
    first = builder.insert_element(undef, value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(first, undef, ir.Constant(_vec(_I32, n), [ir.Constant(_I32, 0)] * n))


def _load(builder, base, byte_offset, ty):
    """A value of type ty at base (i8*) + byte_offset, unaligned."""
    ptr = builder.bitcast(builder.gep(base, [byte_offset]), ty.as_pointer())
    value = builder.load(ptr)
    value.align = 1
    return value


def _has_avx2():
    from llvmlite import binding
    return "+avx2" in binding.get_host_cpu_features().flatten().split(",")


# x86's multiply-pairs-and-add by name: LLVM did not recognise the generic form below when one
# side was widened from unsigned bytes (it split each vpmaddwd into two on zero-extended halves).
_X86_MADD = "llvm.x86.avx2.pmadd.wd" if _has_avx2() else None


def _pair_madd(builder, a, b):
    """<16 x i16> a, b -> <8 x i32>: a[2i]*b[2i] + a[2i+1]*b[2i+1]."""
    if _X86_MADD:
        fnty = ir.FunctionType(_vec(_I32, 8), [_vec(_I16, 16), _vec(_I16, 16)])
        return builder.call(cgutils.get_or_insert_function(builder.module, fnty, _X86_MADD), [a, b])
    even = ir.Constant(_vec(_I32, 8), [ir.Constant(_I32, 2 * i) for i in range(8)])
    odd = ir.Constant(_vec(_I32, 8), [ir.Constant(_I32, 2 * i + 1) for i in range(8)])
    w32 = _vec(_I32, 8)

    def half(mask):
        x = builder.sext(builder.shuffle_vector(a, a, mask), w32)
        y = builder.sext(builder.shuffle_vector(b, b, mask), w32)
        return builder.mul(x, y)
    return builder.add(half(even), half(odd))


def _fmuladd(builder, a, b, c):
    """a * b + c, fused where the target has FMA."""
    fnty = ir.FunctionType(a.type, [a.type] * 3)
    return builder.call(cgutils.get_or_insert_function(builder.module, fnty, "llvm.fmuladd.v8f32"), [a, b, c])


def _block_quants(builder, fmt, raw, p):
    """The 32 values of the block at raw + p as two <16 x i16>: values 0-15 and 16-31
    (unsigned 0-15 / 0-31 for the 4/5-bit formats, the offset applied by the caller; int8 for q8_0)."""
    at = ir.Constant(_I64, QUANTS_AT[fmt])
    if fmt == 4:
        q = builder.sext(_load(builder, raw, builder.add(p, at), _vec(_I8, 32)), _vec(_I16, 32))
        lo = builder.shuffle_vector(q, q, _const_vec(_I32, range(16)))
        hi = builder.shuffle_vector(q, q, _const_vec(_I32, range(16, 32)))
        return lo, hi
    q = builder.zext(_load(builder, raw, builder.add(p, at), _vec(_I8, 16)), _vec(_I16, 16))
    lo = builder.and_(q, _const_vec(_I16, [15] * 16))
    hi = builder.lshr(q, _const_vec(_I16, [4] * 16))
    if fmt in HIGH_BITS_AT:  # bit 4 of value j is bit j of the 32-bit word before the quants
        qh = _splat(builder, _load(builder, raw, builder.add(p, ir.Constant(_I64, HIGH_BITS_AT[fmt])), _I32), 16)
        one = _const_vec(_I32, [1] * 16)
        for_lo = builder.lshr(qh, _const_vec(_I32, range(16)))
        for_hi = builder.lshr(qh, _const_vec(_I32, range(16, 32)))
        four = _const_vec(_I16, [4] * 16)
        lo = builder.or_(lo, builder.shl(builder.trunc(builder.and_(for_lo, one), _vec(_I16, 16)), four))
        hi = builder.or_(hi, builder.shl(builder.trunc(builder.and_(for_hi, one), _vec(_I16, 16)), four))
    return lo, hi


def _f16_scale(builder, raw, table, p):
    """table[the u16 at raw + p]: the f16 at p as float32 (by lookup, as the numba kernels do)."""
    bits = builder.zext(_load(builder, raw, p, _I16), _I64)
    return builder.load(builder.gep(table, [bits]))


def _hsum(builder, v):
    total = builder.extract_element(v, ir.Constant(_I32, 0))
    for i in range(1, 8):
        total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, i)))
    return total


class _Activations:
    """IR loads of one weight block's quantised activations: 16-value chunks, and each 32-value
    activation block's scale and sum (index relative to the weight block's first)."""

    def __init__(self, builder, xi, dxi, sxi, first_block):
        self.builder, self.xi, self.dxi, self.sxi, self.first = builder, xi, dxi, sxi, first_block

    def chunk(self, i):
        b = self.builder
        at = b.add(b.mul(self.first, ir.Constant(_I64, QK)), ir.Constant(_I64, 16 * i))
        return _load(b, b.bitcast(b.gep(self.xi, [at]), _I8.as_pointer()), ir.Constant(_I64, 0), _vec(_I16, 16))

    def scale(self, a):
        return self.builder.load(self.builder.gep(self.dxi, [self.builder.add(self.first, ir.Constant(_I64, a))]))

    def total(self, a):
        b = self.builder
        return b.sitofp(b.load(b.gep(self.sxi, [b.add(self.first, ir.Constant(_I64, a))])), _F32)


def _block_terms_32(builder, fmt, raw, table, p, x):
    """q4_0 ... q8_0: ([(int32 pair sums, their float scale)], the float to add) for the block at p."""
    scale = builder.fmul(_f16_scale(builder, raw, table, p), x.scale(0))
    lo, hi = _block_quants(builder, fmt, raw, p)
    isum = builder.add(_pair_madd(builder, lo, x.chunk(0)), _pair_madd(builder, hi, x.chunk(1)))
    extra = ir.Constant(_F32, 0.0)
    if fmt in MIN_AT:  # + m * sum x
        m = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, MIN_AT[fmt])))
        extra = builder.fmul(builder.fmul(m, x.scale(0)), x.total(0))
    elif fmt in OFFSET:  # - offset * d * sum x
        extra = builder.fneg(builder.fmul(builder.fmul(scale, ir.Constant(_F32, OFFSET[fmt])), x.total(0)))
    return [(isum, scale)], extra


def _byte(builder, raw, p, at):
    """The byte at raw + p + at as i32 (unsigned)."""
    return builder.zext(_load(builder, raw, builder.add(p, ir.Constant(_I64, at)), _I8), _I32)


def _scale_min_k4(builder, raw, p, j):
    """ggml's get_scale_min_k4: the j-th 6-bit scale and min of the 12 bytes at p + 4, as float."""
    def q(i):
        return _byte(builder, raw, p, 4 + i)
    c63, c15 = ir.Constant(_I32, 63), ir.Constant(_I32, 15)
    six, four = ir.Constant(_I32, 6), ir.Constant(_I32, 4)
    if j < 4:
        sc, mn = builder.and_(q(j), c63), builder.and_(q(j + 4), c63)
    else:
        sc = builder.or_(builder.and_(q(j + 4), c15), builder.shl(builder.lshr(q(j - 4), six), four))
        mn = builder.or_(builder.lshr(q(j + 4), four), builder.shl(builder.lshr(q(j), six), four))
    return builder.uitofp(sc, _F32), builder.uitofp(mn, _F32)


def _halves(builder, v):
    """<32 x i16> -> its two <16 x i16> halves."""
    return (builder.shuffle_vector(v, v, _const_vec(_I32, range(16))),
            builder.shuffle_vector(v, v, _const_vec(_I32, range(16, 32))))


def _bytes32(builder, raw, p, at):
    return builder.zext(_load(builder, raw, builder.add(p, ir.Constant(_I64, at)), _vec(_I8, 32)), _vec(_I16, 32))


def _block_terms_k4(builder, fmt, raw, table, p, x):
    """q4_k / q5_k (256 values): 8 sub-blocks of 32 with 6-bit scales and mins; value d*sc*q - dmin*m.
    Group g's 32 quant bytes hold sub-block 2g in their low nibbles and 2g + 1 in their high ones
    (q5_k: fifth bits from bits 2g and 2g + 1 of the 32 qh bytes)."""
    d = _f16_scale(builder, raw, table, p)
    dmin = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 2)))
    qh = _bytes32(builder, raw, p, 16) if fmt == 6 else None
    terms, extra = [], ir.Constant(_F32, 0.0)
    for g in range(4):
        q = _bytes32(builder, raw, p, (48 if fmt == 6 else 16) + 32 * g)
        parts = [builder.and_(q, _const_vec(_I16, [15] * 32)), builder.lshr(q, _const_vec(_I16, [4] * 32))]
        for h in range(2):
            j = 2 * g + h
            if qh is not None:
                bit = builder.and_(builder.lshr(qh, _const_vec(_I16, [j] * 32)), _const_vec(_I16, [1] * 32))
                parts[h] = builder.or_(parts[h], builder.shl(bit, _const_vec(_I16, [4] * 32)))
            first, second = _halves(builder, parts[h])
            isum = builder.add(_pair_madd(builder, first, x.chunk(2 * j)), _pair_madd(builder, second, x.chunk(2 * j + 1)))
            sc, mn = _scale_min_k4(builder, raw, p, j)
            terms.append((isum, builder.fmul(builder.fmul(d, sc), x.scale(j))))
            extra = builder.fsub(extra, builder.fmul(builder.fmul(builder.fmul(dmin, mn), x.scale(j)), x.total(j)))
    return terms, extra


def _block_terms_q6(builder, raw, table, p, x):
    """q6_k (256 values): two halves of 128; quarter t of half hf takes its low 4 bits from ql bytes
    64hf + 32(t % 2)... (low nibbles for t < 2, high for t >= 2) and its top 2 from qh byte
    128 + 32hf + l, bits 2t; value - 32, 16 values per int8 scale (bytes 192 + 8hf + 2t, + 1)."""
    d = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 208)))
    terms = []
    for hf in range(2):
        qh = _bytes32(builder, raw, p, 128 + 32 * hf)
        for t in range(4):
            ql = _bytes32(builder, raw, p, 64 * hf + 32 * (t & 1))
            low = builder.and_(builder.lshr(ql, _const_vec(_I16, [4 * (t >> 1)] * 32)), _const_vec(_I16, [15] * 32))
            high = builder.and_(builder.lshr(qh, _const_vec(_I16, [2 * t] * 32)), _const_vec(_I16, [3] * 32))
            q = builder.sub(builder.or_(low, builder.shl(high, _const_vec(_I16, [4] * 32))),
                            _const_vec(_I16, [32] * 32))
            a = 4 * hf + t
            for h, part in enumerate(_halves(builder, q)):
                sc = builder.sitofp(_load(builder, raw, builder.add(p, ir.Constant(_I64, 192 + 8 * hf + 2 * t + h)), _I8),
                                    _F32)
                terms.append((_pair_madd(builder, part, x.chunk(2 * a + h)),
                              builder.fmul(builder.fmul(d, sc), x.scale(a))))
    return terms, ir.Constant(_F32, 0.0)


def _block_terms(builder, fmt, raw, table, p, x):
    if fmt <= 4:
        return _block_terms_32(builder, fmt, raw, table, p, x)
    if fmt <= 6:
        return _block_terms_k4(builder, fmt, raw, table, p, x)
    return _block_terms_q6(builder, raw, table, p, x)


def _make_pair_dot(fmt):
    per_block = ACTIVATION_BLOCKS[fmt]

    @intrinsic
    def pair_dot(typingctx, raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table):
        """(dot of the weight row at byte oa of raw with the activations, the same for ob):
        raw uint8, xi int16 (k,), dxi float32 (k/32,), sxi int32 (k/32,), table float32 f16 values;
        blocks: weight blocks per row."""
        arrays = (raw, xi, dxi, sxi, table)
        dtypes = (types.uint8, types.int16, types.float32, types.int32, types.float32)
        if any(not isinstance(a, types.Array) or a.ndim != 1 or a.layout != "C" or a.dtype != d
               for a, d in zip(arrays, dtypes)):
            return None  # the IR reads raw memory: only 1-D contiguous arrays of these dtypes
        sig = types.UniTuple(types.float32, 2)(raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table)

        def codegen(context, builder, signature, args):
            a_raw, a_oa, a_ob, a_blocks, a_bb, a_xi, a_dxi, a_sxi, a_table = args
            t = signature.args

            def data(i, value):
                return context.make_array(t[i])(context, builder, value).data

            def i64(i, value):
                return context.cast(builder, value, t[i], types.int64)
            raw_p = builder.bitcast(data(0, a_raw), _I8.as_pointer())
            xi_p, dxi_p, sxi_p, table_p = data(5, a_xi), data(6, a_dxi), data(7, a_sxi), data(8, a_table)
            oa_v, ob_v, blocks_v, bb_v = i64(1, a_oa), i64(2, a_ob), i64(3, a_blocks), i64(4, a_bb)
            zero8 = ir.Constant(_vec(_F32, 8), [ir.Constant(_F32, 0.0)] * 8)
            accs = [cgutils.alloca_once_value(builder, zero8) for _ in range(2)]
            extras = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(2)]
            with cgutils.for_range(builder, blocks_v) as loop:
                b = loop.index
                x = _Activations(builder, xi_p, dxi_p, sxi_p, builder.mul(b, ir.Constant(_I64, per_block)))
                step = builder.mul(b, bb_v)
                for base, acc, extra in zip((oa_v, ob_v), accs, extras):
                    terms, more = _block_terms(builder, fmt, raw_p, table_p, builder.add(base, step), x)
                    total = builder.load(acc)
                    for isum, scale in terms:
                        total = _fmuladd(builder, builder.sitofp(isum, _vec(_F32, 8)), _splat(builder, scale, 8), total)
                    builder.store(total, acc)
                    builder.store(builder.fadd(builder.load(extra), more), extra)
            results = [builder.fadd(builder.load(e), _hsum(builder, builder.load(a))) for a, e in zip(accs, extras)]
            return context.make_tuple(builder, signature.return_type, results)
        return sig, codegen
    return pair_dot


PAIR_DOTS = tuple(_make_pair_dot(fmt) for fmt in FORMATS)


NAMES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def pair_dot_py(fmt, raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table):
    """pair_dot's product in numpy, for NUMBA_DISABLE_JIT=1 and as the tests' reference: the two
    rows dequantised (dequant_numpy, bit-exact with ggml) times the dequantised activations."""
    from .dequant_numpy import dequantize_numpy
    k = blocks * ACTIVATION_BLOCKS[fmt] * QK
    x = (xi[:k].astype(np.float64).reshape(-1, QK) * dxi[:k // QK, None]).reshape(-1)
    rows = [dequantize_numpy(raw[o:o + blocks * block_bytes], NAMES[fmt], k) for o in (oa, ob)]
    return np.float32(np.dot(rows[0], x)), np.float32(np.dot(rows[1], x))


if config.DISABLE_JIT:  # IR cannot run as Python: the same computation in numpy
    PAIR_DOTS = tuple(functools.partial(pair_dot_py, fmt) for fmt in FORMATS)
(pair_dot_q4_0, pair_dot_q4_1, pair_dot_q5_0, pair_dot_q5_1, pair_dot_q8_0, pair_dot_q4_k, pair_dot_q5_k,
 pair_dot_q6_k) = PAIR_DOTS
