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

Formats: q4_0, q4_1, q5_0, q5_1, q8_0 (FORMATS codes 0-4). The result is the same integer
arithmetic as cpu_int_kernels.py's numba loops (exact per block), scaled and summed in float32
in another order. NUMBA_DISABLE_JIT=1 cannot run IR: `pair_dot_py` is the same computation in
numpy, which the tests compare against the compiled one, and which cpu_int_kernels.py calls
when the JIT is off.
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
FORMATS = (0, 1, 2, 3, 4)

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


def _make_pair_dot(fmt):
    @intrinsic
    def pair_dot(typingctx, raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table):
        """(dot of the weight row at byte oa of raw with the activations, the same for ob):
        raw uint8, xi int16 (k,), dxi float32 (k/32,), sxi int32 (k/32,), table float32 f16 values."""
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
            acc_a = cgutils.alloca_once_value(builder, zero8)
            acc_b = cgutils.alloca_once_value(builder, zero8)
            c_a = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
            c_b = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
            with cgutils.for_range(builder, blocks_v) as loop:
                b = loop.index
                xo = builder.mul(b, ir.Constant(_I64, QK))
                x_lo = _load(builder, builder.bitcast(builder.gep(xi_p, [xo]), _I8.as_pointer()),
                             ir.Constant(_I64, 0), _vec(_I16, 16))
                x_hi = _load(builder, builder.bitcast(builder.gep(xi_p, [xo]), _I8.as_pointer()),
                             ir.Constant(_I64, 32), _vec(_I16, 16))
                dx = builder.load(builder.gep(dxi_p, [b]))
                xsum = builder.sitofp(builder.load(builder.gep(sxi_p, [b])), _F32)
                step = builder.mul(b, bb_v)
                for base, acc, c in ((oa_v, acc_a, c_a), (ob_v, acc_b, c_b)):
                    p = builder.add(base, step)
                    scale = builder.fmul(_f16_scale(builder, raw_p, table_p, p), dx)
                    lo, hi = _block_quants(builder, fmt, raw_p, p)
                    isum = builder.add(_pair_madd(builder, lo, x_lo), _pair_madd(builder, hi, x_hi))
                    builder.store(_fmuladd(builder, builder.sitofp(isum, _vec(_F32, 8)), _splat(builder, scale, 8),
                                           builder.load(acc)), acc)
                    if fmt in MIN_AT:  # + m * sum x
                        m = _f16_scale(builder, raw_p, table_p, builder.add(p, ir.Constant(_I64, MIN_AT[fmt])))
                        extra = builder.fmul(builder.fmul(m, dx), xsum)
                        builder.store(builder.fadd(builder.load(c), extra), c)
                    elif fmt in OFFSET:  # - offset * d * sum x
                        extra = builder.fmul(builder.fmul(scale, ir.Constant(_F32, OFFSET[fmt])), xsum)
                        builder.store(builder.fsub(builder.load(c), extra), c)
            ra = builder.fadd(builder.load(c_a), _hsum(builder, builder.load(acc_a)))
            rb = builder.fadd(builder.load(c_b), _hsum(builder, builder.load(acc_b)))
            return context.make_tuple(builder, signature.return_type, [ra, rb])
        return sig, codegen
    return pair_dot


PAIR_DOTS = tuple(_make_pair_dot(fmt) for fmt in FORMATS)


def _quants_py(fmt, block):
    """The 32 quant values of one block (uint8 bytes) as int32, as _block_quants makes them."""
    q = block[QUANTS_AT[fmt]:]
    if fmt == 4:
        return q[:32].view(np.int8).astype(np.int32)
    q = q[:16].astype(np.int32)
    values = np.concatenate([q & 15, q >> 4])
    if fmt in HIGH_BITS_AT:
        qh = int(block[HIGH_BITS_AT[fmt]:HIGH_BITS_AT[fmt] + 4].view(np.uint32)[0])
        values |= ((qh >> np.arange(32)) & 1).astype(np.int32) << 4
    return values


def pair_dot_py(fmt, raw, oa, ob, blocks, block_bytes, xi, dxi, sxi, table):
    """pair_dot's computation in numpy (for NUMBA_DISABLE_JIT=1 and as the tests' reference)."""
    out = []
    for o in (oa, ob):
        acc = np.float32(0.0)
        for b in range(blocks):
            blk = raw[o + b * block_bytes:o + (b + 1) * block_bytes]
            isum = np.int64(np.dot(_quants_py(fmt, blk), xi[b * QK:(b + 1) * QK].astype(np.int32)))
            d = table[int(blk[0]) | int(blk[1]) << 8]
            acc += d * dxi[b] * np.float32(isum)
            if fmt in MIN_AT:
                acc += table[int(blk[2]) | int(blk[3]) << 8] * dxi[b] * np.float32(sxi[b])
            elif fmt in OFFSET:
                acc -= d * dxi[b] * np.float32(OFFSET[fmt]) * np.float32(sxi[b])
        out.append(np.float32(acc))
    return out[0], out[1]


if config.DISABLE_JIT:  # IR cannot run as Python: the same computation in numpy
    PAIR_DOTS = tuple(functools.partial(pair_dot_py, fmt) for fmt in FORMATS)
pair_dot_q4_0, pair_dot_q4_1, pair_dot_q5_0, pair_dot_q5_1, pair_dot_q8_0 = PAIR_DOTS
