"""Integer dot products on GGUF blocks written as LLVM vector IR (numba's `intrinsic`): the
inner loops of int_dot.py's quantised products.

Why IR: numba's loops cannot say "multiply 16-bit pairs and add neighbours". LLVM widened the
earlier numba loops' lanes to 32-bit multiplies (vpmulld) and converted every lane to float:
about 4.7 ns per 32-value block per row on x86, ggml's ~1. Here a block is a few vector
operations that every LLVM target lowers to its own instructions: the quants widened to int16,
multiplied by the int16 activations in even/odd pairs whose products are added (x86: vpmaddwd,
or vpdpwssd with VNNI, named directly on AVX2 hosts; arm64: the generic form, smull/smlal
pairs), the 8 int32 sums converted to float and accumulated with the block's scales into 8
float lanes, summed once per row.

A kernel takes two weight rows (rows r and r + 1, or a gate row and its up row) and one
activation row (`dot`, a decoding step) or TILE_ROWS of them (`tile_dot`: each weight
block unpacked once for all of them).

Formats: q4_0, q4_1, q5_0, q5_1, q8_0 (blocks of 32) and q4_k, q5_k, q6_k (blocks of 256, with
8 or 16 sub-block scales; the activations keep one scale per 32 values): float_rows.FORMATS
codes 0-7. The K-quants' dot loop is kquant_ir.py's (scales unpacked into vectors once per block);
their dequantisation (dequant_row) is the generators' below. Each block's integer sums are exact;
they are scaled and summed in float32.
NUMBA_DISABLE_JIT=1 cannot run IR: `dot_py` is the same product in numpy (the dequantised rows
times the dequantised activations), which the tests compare against the compiled kernels and
which runs in their place when the JIT is off.

numba's on-disk cache would key a compiled function on its own file only; numba_setup stamps
every kernel of this package with the hash of all its files, so an edit here compiles the kernels
that inline this IR again.
"""
import functools
import sys

import numpy as np
from llvmlite import ir
from numba.core import cgutils, config, types
from numba.extending import intrinsic

from . import kquant_ir  # the K-quants' block loop (it takes this module's helpers: bind, below)

QK = 32
# Byte offsets in a block: the f16 scale d is at 0; then the f16 min (q4_1, q5_1), the 32 fifth
# bits (q5_0, q5_1), the quants.
MIN_AT = {1: 2, 3: 2}
HIGH_BITS_AT = {2: 2, 3: 4}
QUANTS_AT = {0: 2, 1: 4, 2: 6, 3: 8, 4: 2}
OFFSET = {0: 8.0, 2: 16.0}  # q4_0, q5_0 values are q - 8, q - 16
OFFSET_IN_BYTES = {2}  # formats whose offset _block_quants applies (the others': a "min" term)
FORMATS = (0, 1, 2, 3, 4, 5, 6, 7)  # float_rows.FORMATS codes: q4_0 ... q8_0, q4_k, q5_k, q6_k
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


def _cpu_features():
    """The features the code numba makes may use: the host's, or the ones named with
    $NUMBA_CPU_NAME / $NUMBA_CPU_FEATURES (portable caches: an x86 instruction the target lacks
    would fail to compile)."""
    from llvmlite import binding
    if config.CPU_NAME and config.CPU_NAME != "host":
        features = config.CPU_FEATURES or ""
    else:
        features = binding.get_host_cpu_features().flatten()
    return set(features.split(","))


def _has_avx2():
    """Whether the code numba makes may use AVX2 (_cpu_features)."""
    return "+avx2" in _cpu_features()


# x86's multiply-pairs-and-add by name: LLVM did not recognise the generic form below when one
# side was widened from unsigned bytes (it split each vpmaddwd into two on zero-extended halves).
_X86_MADD = "llvm.x86.avx2.pmadd.wd" if _has_avx2() else None


def _pair_madd(builder, a, b):
    """<16 x i16> a, b -> <8 x i32>: a[2i]*b[2i] + a[2i+1]*b[2i+1]."""
    if builder.module.triple.startswith("wasm"):  # wasm/build.py: SIMD128's i32x4.dot_i16x8_s on each half
        fnty = ir.FunctionType(_vec(_I32, 4), [_vec(_I16, 8), _vec(_I16, 8)])
        dot = cgutils.get_or_insert_function(builder.module, fnty, "llvm.wasm.dot")
        halves = [builder.call(dot, [builder.shuffle_vector(a, a, _const_vec(_I32, range(h, h + 8))),
                                     builder.shuffle_vector(b, b, _const_vec(_I32, range(h, h + 8)))])
                  for h in (0, 8)]
        return builder.shuffle_vector(halves[0], halves[1], _const_vec(_I32, range(8)))
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
    """The 32 values of the block at raw + p as two <16 x i16>: values 0-15 and 16-31 (unsigned
    0-15 for q4_0 / q4_1, its offset applied by the caller; int8 for q8_0; the 5-bit formats:
    _block_quants_5)."""
    at = ir.Constant(_I64, QUANTS_AT[fmt])
    if fmt in HIGH_BITS_AT:
        return _block_quants_5(builder, fmt, raw, p)
    if fmt == 4:
        q = builder.sext(_load(builder, raw, builder.add(p, at), _vec(_I8, 32)), _vec(_I16, 32))
        lo = builder.shuffle_vector(q, q, _const_vec(_I32, range(16)))
        hi = builder.shuffle_vector(q, q, _const_vec(_I32, range(16, 32)))
        return lo, hi
    q = builder.zext(_load(builder, raw, builder.add(p, at), _vec(_I8, 16)), _vec(_I16, 16))
    return builder.and_(q, _const_vec(_I16, [15] * 16)), builder.lshr(q, _const_vec(_I16, [4] * 16))


def _block_quants_5(builder, fmt, raw, p):
    """q5_0 / q5_1's 32 values (q5_0's with its offset applied: q - 16, in OFFSET_IN_BYTES), cut in
    byte lanes: bit 4 of value j is bit j of the 32-bit word before the quants, spread to the bytes
    by a byte shuffle and a mask (the 16 x 32-bit shifts this replaced made q5_0 1.6x q4_0's
    time; measured in docs/cpu-kernels.md), then widened once."""
    b = _load(builder, raw, builder.add(p, ir.Constant(_I64, QUANTS_AT[fmt])), _vec(_I8, 16))
    q = builder.shuffle_vector(builder.and_(b, _const_vec(_I8, [15] * 16)),
                               builder.lshr(b, _const_vec(_I8, [4] * 16)), _const_vec(_I32, range(32)))
    word = _load(builder, raw, builder.add(p, ir.Constant(_I64, HIGH_BITS_AT[fmt])), _vec(_I8, 4))
    spread = builder.shuffle_vector(word, word, _const_vec(_I32, [j // 8 for j in range(32)]))
    is_set = builder.icmp_unsigned("!=", builder.and_(spread, _const_vec(_I8, [1 << (j % 8) for j in range(32)])),
                                   _const_vec(_I8, [0] * 32))
    q = builder.or_(q, builder.select(is_set, _const_vec(_I8, [16] * 32), _const_vec(_I8, [0] * 32)))
    if fmt in OFFSET_IN_BYTES:  # spares the offset's float term per block and row
        q = builder.sext(builder.sub(q, _const_vec(_I8, [int(OFFSET[fmt])] * 32)), _vec(_I16, 32))
    else:
        q = builder.zext(q, _vec(_I16, 32))
    return (builder.shuffle_vector(q, q, _const_vec(_I32, range(16))),
            builder.shuffle_vector(q, q, _const_vec(_I32, range(16, 32))))


def _f16_scale(builder, raw, table, p):
    """table[the u16 at raw + p]: the f16 at p as float32 (by lookup, as the numba kernels do)."""
    bits = builder.zext(_load(builder, raw, p, _I16), _I64)
    return builder.load(builder.gep(table, [bits]))


# Bytes ahead of each weight row's reads that the product kernels ask the cache for (a
# prefetch per row and block, per 64 bytes of a K-quant block). Without it one core streamed
# the blocks of a matrix past the cache at about half numpy's read rate (q8_0 4.6-6.3 GB/s
# against 8-12, q4_k 4.2, q6_k 5.5; a ggml-style C loop on the same box 7.0): the loop's
# arithmetic and its cache misses took turns. 2-4 KB ahead: q8_0 10-11.5 GB/s, q4_k 7.8,
# q6_k 8.7-8.9; q5_0 (arithmetic-bound) 4.3 -> 5.5 at 2 KB, 6.8 at 4 KB (docs/cpu-kernels.md).
PREFETCH_AHEAD = 4096


def _prefetch_ahead(builder, raw, p, block_bytes):
    """Ask the cache for the block_bytes at raw + p + PREFETCH_AHEAD (one prefetch per 64 bytes,
    at least one: blocks of 32 values are 18-34 bytes). A hint: it never faults past the end.
    wasm has no prefetch: nothing there."""
    if builder.module.triple.startswith("wasm"):
        return
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0i8")
    for line in range(max(1, -(-block_bytes // 64))):
        at = builder.add(p, ir.Constant(_I64, PREFETCH_AHEAD + 64 * line))
        builder.call(fn, [builder.gep(raw, [at]), ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _hsum(builder, v):
    total = builder.extract_element(v, ir.Constant(_I32, 0))
    for i in range(1, 8):
        total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, i)))
    return total


class _Activations:
    """IR loads of one quantised activation row around one weight block: 16-value chunks, and
    each 32-value activation block's scale and sum (indices relative to the weight block's first)."""

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


# A weight block as the kernels use it: a generator of terms, made as they are consumed (so each
# group's quants are unpacked, used for every activation row, and dropped: fewer live registers)
#   ("group", float scale, activation block a, [(<16 x i16> quants, activation chunk c), ...])
#       contributing scale * dx[a] * sum over its chunks of quants . x[16c:16c + 16]
#   ("min", float coef, activation block a, None) contributing coef * dx[a] * (sum of x's block a)


def _weight_block_32(builder, fmt, raw, table, p):
    """q4_0 ... q8_0: one group of 32 values; q4_1/q5_1's min m, q4_0/q5_0's offset as -8d / -16d."""
    d = _f16_scale(builder, raw, table, p)
    lo, hi = _block_quants(builder, fmt, raw, p)
    yield "group", d, 0, [(lo, 0), (hi, 1)]
    if fmt in MIN_AT:
        yield "min", _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, MIN_AT[fmt]))), 0, None
    elif fmt in OFFSET and fmt not in OFFSET_IN_BYTES:
        yield "min", builder.fmul(d, ir.Constant(_F32, -OFFSET[fmt])), 0, None


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


def _weight_block_k4(builder, fmt, raw, table, p):
    """q4_k / q5_k (256 values): 8 sub-blocks of 32 with 6-bit scales and mins; value d*sc*q - dmin*m.
    Group g's 32 quant bytes hold sub-block 2g in their low nibbles and 2g + 1 in their high ones
    (q5_k: fifth bits from bits 2g and 2g + 1 of the 32 qh bytes)."""
    d = _f16_scale(builder, raw, table, p)
    dmin = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 2)))
    qh = _bytes32(builder, raw, p, 16) if fmt == 6 else None
    for g in range(4):
        q = _bytes32(builder, raw, p, (48 if fmt == 6 else 16) + 32 * g)
        parts = [builder.and_(q, _const_vec(_I16, [15] * 32)), builder.lshr(q, _const_vec(_I16, [4] * 32))]
        for h in range(2):
            j = 2 * g + h
            if qh is not None:
                bit = builder.and_(builder.lshr(qh, _const_vec(_I16, [j] * 32)), _const_vec(_I16, [1] * 32))
                parts[h] = builder.or_(parts[h], builder.shl(bit, _const_vec(_I16, [4] * 32)))
            first, second = _halves(builder, parts[h])
            sc, mn = _scale_min_k4(builder, raw, p, j)
            yield "group", builder.fmul(d, sc), j, [(first, 2 * j), (second, 2 * j + 1)]
            yield "min", builder.fneg(builder.fmul(dmin, mn)), j, None


def _weight_block_q6(builder, raw, table, p):
    """q6_k (256 values): two halves of 128; quarter t of half hf takes its low 4 bits from ql bytes
    64hf + 32(t % 2)... (low nibbles for t < 2, high for t >= 2) and its top 2 from qh byte
    128 + 32hf + l, bits 2t; value - 32, 16 values per int8 scale (bytes 192 + 8hf + 2t, + 1)."""
    d = _f16_scale(builder, raw, table, builder.add(p, ir.Constant(_I64, 208)))
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
                at = ir.Constant(_I64, 192 + 8 * hf + 2 * t + h)
                sc = builder.sitofp(_load(builder, raw, builder.add(p, at), _I8), _F32)
                yield "group", builder.fmul(d, sc), a, [(part, 2 * a + h)]


def _weight_block(builder, fmt, raw, table, p):
    if fmt <= 4:
        return _weight_block_32(builder, fmt, raw, table, p)
    if fmt <= 6:
        return _weight_block_k4(builder, fmt, raw, table, p)
    return _weight_block_q6(builder, raw, table, p)


def _kernel_body(builder, code, rows, raw_p, table_p, x_rows, oa, ob, blocks, block_bytes):
    """The IR of one format's kernel: [the row at oa times each activation row, then ob's]."""
    per_block = ACTIVATION_BLOCKS[code]
    zero8 = ir.Constant(_vec(_F32, 8), [ir.Constant(_F32, 0.0)] * 8)
    accs = [cgutils.alloca_once_value(builder, zero8) for _ in range(2 * rows)]
    extras = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(2 * rows)]
    with cgutils.for_range(builder, blocks) as loop:
        b = loop.index
        first = builder.mul(b, ir.Constant(_I64, per_block))
        xs = [_Activations(builder, *x_row, first) for x_row in x_rows]
        step = builder.mul(b, block_bytes)
        for w, base in enumerate((oa, ob)):
            mine = range(w * rows, (w + 1) * rows)
            totals = [builder.load(accs[i]) for i in mine]
            more = [builder.load(extras[i]) for i in mine]
            _prefetch_ahead(builder, raw_p, builder.add(base, step), 1)
            for kind, scale, a, chunks in _weight_block(builder, code, raw_p, table_p, builder.add(base, step)):
                for r, x in enumerate(xs):  # the unpacked group serves every activation row
                    if kind == "min":
                        more[r] = builder.fadd(more[r], builder.fmul(builder.fmul(scale, x.scale(a)), x.total(a)))
                        continue
                    isum = None
                    for quants, c in chunks:
                        part = _pair_madd(builder, quants, x.chunk(c))
                        isum = part if isum is None else builder.add(isum, part)
                    totals[r] = _fmuladd(builder, builder.sitofp(isum, _vec(_F32, 8)),
                                         _splat(builder, builder.fmul(scale, x.scale(a)), 8), totals[r])
            for i, total, extra in zip(mine, totals, more):
                builder.store(total, accs[i])
                builder.store(extra, extras[i])
    return [builder.fadd(builder.load(e), _hsum(builder, builder.load(a))) for a, e in zip(accs, extras)]


kquant_ir.bind(sys.modules[__name__])


def _make_kernel(rows):
    """The kernel that multiplies two weight rows by `rows` activation rows."""
    @intrinsic
    def dot(typingctx, fmt, raw, oa, ob, blocks, block_bytes, qx, dx, sx, table, i0):
        """(the weight row at byte oa of raw times activation rows i0 ... i0 + rows - 1, then the
        row at ob times the same): fmt a FORMATS code (the IR holds every format's loop and
        branches once per call), raw uint8, qx int16 (m, k), dx float32 (m, k/32), sx int32
        (m, k/32), table float32 f16 values; blocks: weight blocks per row."""
        arrays = (raw, qx, dx, sx, table)
        dtypes = (types.uint8, types.int16, types.float32, types.int32, types.float32)
        if any(not isinstance(a, types.Array) or a.ndim != d[1] or a.layout != "C" or a.dtype != d[0]
               for a, d in zip(arrays, zip(dtypes, (1, 2, 2, 2, 1)))):
            return None  # the IR reads raw memory: only contiguous arrays of these dtypes and ranks
        sig = types.UniTuple(types.float32, 2 * rows)(fmt, raw, oa, ob, blocks, block_bytes, qx, dx, sx, table, i0)

        def codegen(context, builder, signature, args):
            t = signature.args
            arys = {i: context.make_array(t[i])(context, builder, args[i]) for i in (1, 6, 7, 8, 9)}

            def i64(i):
                return context.cast(builder, args[i], t[i], types.int64)
            raw_p = builder.bitcast(arys[1].data, _I8.as_pointer())
            k = builder.extract_value(arys[6].shape, 1)
            kb = builder.extract_value(arys[7].shape, 1)
            x_rows = []  # (int16 row, its scales, its sums) of each activation row
            for r in range(rows):
                i = builder.add(i64(10), ir.Constant(_I64, r))
                x_rows.append((builder.gep(arys[6].data, [builder.mul(i, k)]),
                               builder.gep(arys[7].data, [builder.mul(i, kb)]),
                               builder.gep(arys[8].data, [builder.mul(i, kb)])))
            results = [cgutils.alloca_once(builder, _F32) for _ in range(2 * rows)]
            done = builder.append_basic_block("format_done")
            cases = {code: builder.append_basic_block(f"format_{code}") for code in FORMATS}
            switch = builder.switch(i64(0), cases[FORMATS[-1]])  # callers check fmt (kernel_calls)
            for code, block in cases.items():
                switch.add_case(ir.Constant(_I64, code), block)
                builder.position_at_end(block)
                body = kquant_ir.kernel_body if code >= 5 else _kernel_body
                values = body(builder, code, rows, raw_p, arys[9].data, x_rows, i64(2), i64(3), i64(4), i64(5))
                for slot, value in zip(results, values):
                    builder.store(value, slot)
                builder.branch(done)
            builder.position_at_end(done)
            return context.make_tuple(builder, signature.return_type, [builder.load(r) for r in results])
        return sig, codegen
    return dot


def _dequant_block(builder, code, raw_p, table_p, p, out_p):
    """Store the block at raw + p as float32 at out_p (element pointer), value for value as
    ggml's dequantize_row_* (dequant_numpy.py): the same float operations in the same order,
    unfused, so the result is bit-identical. The quants come from _weight_block: each
    16-value chunk is converted, scaled, and given its block's min (q4_1, q5_1, the K-quants) or,
    for q4_0 / q5_0, its offset subtracted as an integer first ((q - 8) * d, as ggml)."""
    f16 = _vec(_F32, 16)
    values = {}  # chunk -> <16 x float>, stored once the block's terms are all in
    for kind, scale, a, chunks in _weight_block(builder, code, raw_p, table_p, p):
        if kind == "min":
            if code in OFFSET:  # applied to the integers below
                continue
            for c in (2 * a, 2 * a + 1):
                values[c] = builder.fadd(values[c], _splat(builder, scale, 16))
            continue
        for quants, c in chunks:
            if code in OFFSET and code not in OFFSET_IN_BYTES:
                quants = builder.sub(quants, _const_vec(_I16, [int(OFFSET[code])] * 16))
            values[c] = builder.fmul(builder.sitofp(quants, f16), _splat(builder, scale, 16))
    for c, v in values.items():
        ptr = builder.bitcast(builder.gep(out_p, [ir.Constant(_I64, 16 * c)]), f16.as_pointer())
        builder.store(v, ptr).align = 4


@intrinsic
def dequant_row(typingctx, fmt, raw, row_offset, blocks, block_bytes, table, out, out_offset):
    """Dequantise the row of `blocks` blocks at byte row_offset of raw (uint8) into out (float32,
    1-d, C) from element out_offset: a loop of vector IR per format (fmt a FORMATS code; callers
    check it). table: the f16 values (float32)."""
    arrays = (raw, table, out)
    dtypes = (types.uint8, types.float32, types.float32)
    if any(not isinstance(a, types.Array) or a.ndim != 1 or a.layout != "C" or a.dtype != d
           for a, d in zip(arrays, dtypes)):
        return None  # the IR reads and writes raw memory: only contiguous 1-d arrays of these dtypes
    sig = types.void(fmt, raw, row_offset, blocks, block_bytes, table, out, out_offset)

    def codegen(context, builder, signature, args):
        t = signature.args
        arys = {i: context.make_array(t[i])(context, builder, args[i]) for i in (1, 5, 6)}

        def i64(i):
            return context.cast(builder, args[i], t[i], types.int64)
        raw_p = builder.bitcast(arys[1].data, _I8.as_pointer())
        done = builder.append_basic_block("dequant_done")
        cases = {code: builder.append_basic_block(f"dequant_{code}") for code in FORMATS}
        switch = builder.switch(i64(0), cases[FORMATS[-1]])
        for code, block in cases.items():
            switch.add_case(ir.Constant(_I64, code), block)
            builder.position_at_end(block)
            per_block = ir.Constant(_I64, ACTIVATION_BLOCKS[code] * QK)
            with cgutils.for_range(builder, i64(3)) as loop:
                b = loop.index
                p = builder.add(i64(2), builder.mul(b, i64(4)))
                out_p = builder.gep(arys[6].data, [builder.add(i64(7), builder.mul(b, per_block))])
                _dequant_block(builder, code, raw_p, arys[5].data, p, out_p)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask the cache for arr's element i (1-d, C) ahead of its use: loops that stream from L3 or
    memory without BLAS's own prefetching ran at 8-10 GB/s on one core of the AVX-512 box
    (Whisper's cross-attention keys: 25-40% faster with it, measured). A hint only: it never
    faults, even past the array's end."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and isinstance(i, types.Integer)):
        return None
    sig = types.void(arr, i)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        at = context.cast(builder, args[1], signature.args[1], types.int64)
        ptr = builder.bitcast(builder.gep(a.data, [at]), _I8.as_pointer())
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return sig, codegen


def prefetch_py(arr, i):
    """prefetch under NUMBA_DISABLE_JIT=1: nothing to do."""


EXP_LANES = 16
# expf as Cephes computes it: x = n ln2 + r (|r| <= ln2 / 2, ln2 in two parts), e^r by a
# degree-6 polynomial, 2^n built in the exponent bits. Max error about 1 ulp on [-87.3, 88.7].
_EXP_LO, _EXP_HI = -87.33654, 88.72283
_LOG2E, _LN2_HI, _LN2_LO = 1.44269504088896341, 0.693359375, -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def _vector_exp(builder, x):
    """e^x of a <16 x float> (0 below -87.3, where expf gives subnormals; NaN stays NaN)."""
    vf, vi = _vec(_F32, EXP_LANES), _vec(_I32, EXP_LANES)

    def c(v):
        return _const_vec(_F32, [v] * EXP_LANES)
    # (wasm: minnum would be a libm call per lane; SIMD128's min/max are `minimum`, NaN handled below either way)
    kind = "imum" if builder.module.triple.startswith("wasm") else "num"
    fmin = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf]), f"llvm.min{kind}.v16f32")
    fmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf]), f"llvm.max{kind}.v16f32")
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf]), "llvm.rint.v16f32")
    low = builder.fcmp_ordered("<", x, c(_EXP_LO))
    nan = builder.fcmp_unordered("uno", x, x)
    given = x
    x = builder.call(fmax, [builder.call(fmin, [x, c(_EXP_HI)]), c(_EXP_LO)])
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf, vf]), "llvm.fmuladd.v16f32")
    n = builder.call(rint, [builder.fmul(x, c(_LOG2E))])
    r = builder.call(fma, [n, c(-_LN2_HI), x])
    r = builder.call(fma, [n, c(-_LN2_LO), r])
    p = c(_EXP_POLY[0])
    for coef in _EXP_POLY[1:]:
        p = builder.call(fma, [p, r, c(coef)])
    p = builder.fadd(builder.call(fma, [builder.fmul(p, r), r, r]), c(1.0))
    bits = builder.shl(builder.add(builder.fptosi(n, vi), _const_vec(_I32, [127] * EXP_LANES)),
                       _const_vec(_I32, [23] * EXP_LANES))
    y = builder.fmul(p, builder.bitcast(bits, vf))
    return builder.select(nan, given, builder.select(low, c(0.0), y))


@intrinsic
def softmax_numerator(typingctx, row):
    """row[i] = e^(row[i] - max(row)) in place for a 1-d C float32 row; returns their sum
    (float32): a softmax's numerator in two vector passes (the max; then _vector_exp and the sum),
    16 lanes at a time, the tail by libm. numpy's max, subtract, exp and sum took four passes and
    twice as long on a 128 x 1,500 block of Whisper tiny's encoder scores (measured). A NaN
    in the row, or a max that is not finite, makes the sum NaN (the caller fills the row)."""
    if not (isinstance(row, types.Array) and row.ndim == 1 and row.layout == "C" and row.dtype == types.float32):
        return None
    sig = types.float32(row)

    def codegen(context, builder, signature, args):
        a = context.make_array(signature.args[0])(context, builder, args[0])
        n = builder.extract_value(a.shape, 0)
        lanes = ir.Constant(_I64, EXP_LANES)
        vf = _vec(_F32, EXP_LANES)
        full = builder.udiv(n, lanes)
        first_tail = builder.mul(full, lanes)

        def vector_at(i):
            ptr = builder.bitcast(builder.gep(a.data, [builder.mul(i, lanes)]), vf.as_pointer())
            v = builder.load(ptr)
            v.align = 4
            return ptr, v
        fmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf, vf]), "llvm.maxnum.v16f32")
        smax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32, _F32]), "llvm.maxnum.f32")
        ninf = float("-inf")
        top_v = cgutils.alloca_once_value(builder, ir.Constant(vf, [ir.Constant(_F32, ninf)] * EXP_LANES))
        with cgutils.for_range(builder, full) as loop:
            builder.store(builder.call(fmax, [builder.load(top_v), vector_at(loop.index)[1]]), top_v)
        top = cgutils.alloca_once_value(builder, ir.Constant(_F32, ninf))
        with cgutils.for_range(builder, builder.urem(n, lanes)) as loop:
            value = builder.load(builder.gep(a.data, [builder.add(first_tail, loop.index)]))
            builder.store(builder.call(smax, [builder.load(top), value]), top)
        v = builder.load(top_v)
        t = builder.load(top)
        for lane in range(EXP_LANES):
            t = builder.call(smax, [t, builder.extract_element(v, ir.Constant(_I32, lane))])
        shift = _splat(builder, t, EXP_LANES)
        acc = cgutils.alloca_once_value(builder, ir.Constant(vf, [ir.Constant(_F32, 0.0)] * EXP_LANES))
        with cgutils.for_range(builder, full) as loop:
            ptr, v = vector_at(loop.index)
            e = _vector_exp(builder, builder.fsub(v, shift))
            builder.store(e, ptr).align = 4
            builder.store(builder.fadd(builder.load(acc), e), acc)
        tail = cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0))
        exp1 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_F32, [_F32]), "llvm.exp.f32")
        with cgutils.for_range(builder, builder.urem(n, lanes)) as loop:
            ptr = builder.gep(a.data, [builder.add(first_tail, loop.index)])
            e = builder.call(exp1, [builder.fsub(builder.load(ptr), t)])
            builder.store(e, ptr)
            builder.store(builder.fadd(builder.load(tail), e), tail)
        v = builder.load(acc)
        total = builder.extract_element(v, ir.Constant(_I32, 0))
        for lane in range(1, EXP_LANES):
            total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, lane)))
        return builder.fadd(total, builder.load(tail))
    return sig, codegen


def softmax_numerator_py(row):
    """softmax_numerator in numpy, for NUMBA_DISABLE_JIT=1."""
    np.exp(row - row.max(), out=row)
    return np.float32(row.sum(dtype=np.float64))


F16_LANES = 16  # f16 values per vector step of f16_dot
F16_PREFETCH = 1024  # bytes ahead of a row's loads that f16_dot asks the cache for


@intrinsic
def f16_dot(typingctx, raw, oa, ob, k, x, i):
    """(the f16 row at byte oa of raw times row i of x, then the row at ob times it): raw uint8
    (1-d, C), x float32 (m, k, C). Each 16 weights are widened to float32 by the target's own
    instruction (x86 F16C vcvtph2ps, arm64 fcvtl: exact) and multiplied into 16 float lanes,
    summed once per row; a tail of k % 16 runs one value at a time."""
    if not (isinstance(raw, types.Array) and raw.ndim == 1 and raw.layout == "C" and raw.dtype == types.uint8
            and isinstance(x, types.Array) and x.ndim == 2 and x.layout == "C" and x.dtype == types.float32):
        return None  # the IR reads raw memory: only contiguous arrays of these dtypes and ranks
    sig = types.UniTuple(types.float32, 2)(raw, oa, ob, k, x, i)

    def codegen(context, builder, signature, args):
        t = signature.args
        raw_a = context.make_array(t[0])(context, builder, args[0])
        x_a = context.make_array(t[4])(context, builder, args[4])

        def i64(j):
            return context.cast(builder, args[j], t[j], types.int64)
        raw_p = builder.bitcast(raw_a.data, _I8.as_pointer())
        k_ = i64(3)
        x_row = builder.gep(x_a.data, [builder.mul(i64(5), k_)])
        lanes = ir.Constant(_I64, F16_LANES)
        vf = _vec(_F32, F16_LANES)
        half_v = _vec(ir.HalfType(), F16_LANES)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vf, [vf] * 3),
                                             f"llvm.fmuladd.v{F16_LANES}f32")
        prefetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32]), "llvm.prefetch.p0i8")
        zero = ir.Constant(vf, [ir.Constant(_F32, 0.0)] * F16_LANES)
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(2)]
        tails = [cgutils.alloca_once_value(builder, ir.Constant(_F32, 0.0)) for _ in range(2)]
        bases = (i64(1), i64(2))
        with cgutils.for_range(builder, builder.udiv(k_, lanes)) as loop:
            j = builder.mul(loop.index, lanes)
            xp = builder.bitcast(builder.gep(x_row, [j]), vf.as_pointer())
            xv = builder.load(xp)
            xv.align = 4
            for acc, base in zip(accs, bases):
                at = builder.add(base, builder.mul(j, ir.Constant(_I64, 2)))
                builder.call(prefetch, [builder.gep(raw_p, [builder.add(at, ir.Constant(_I64, F16_PREFETCH))]),
                                        ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
                w = _load(builder, raw_p, at, half_v)
                builder.store(builder.call(fma, [builder.fpext(w, vf), xv, builder.load(acc)]), acc)
        with cgutils.for_range(builder, builder.urem(k_, lanes)) as loop:  # the tail
            j = builder.add(builder.mul(builder.udiv(k_, lanes), lanes), loop.index)
            xj = builder.load(builder.gep(x_row, [j]))
            for tail, base in zip(tails, bases):
                w = _load(builder, raw_p, builder.add(base, builder.mul(j, ir.Constant(_I64, 2))), ir.HalfType())
                builder.store(builder.fadd(builder.load(tail), builder.fmul(builder.fpext(w, _F32), xj)), tail)
        sums = []
        for acc, tail in zip(accs, tails):
            v = builder.load(acc)
            total = builder.extract_element(v, ir.Constant(_I32, 0))
            for lane in range(1, F16_LANES):
                total = builder.fadd(total, builder.extract_element(v, ir.Constant(_I32, lane)))
            sums.append(builder.fadd(total, builder.load(tail)))
        return context.make_tuple(builder, signature.return_type, sums)
    return sig, codegen


def f16_dot_py(raw, oa, ob, k, x, i):
    """f16_dot in numpy, for NUMBA_DISABLE_JIT=1 and as the tests' reference."""
    w = np.stack([raw[o:o + 2 * k].view(np.float16) for o in (oa, ob)]).astype(np.float64)
    return tuple(np.float32(v) for v in w @ x[i].astype(np.float64))


def dequant_row_py(fmt, raw, row_offset, blocks, block_bytes, table, out, out_offset):
    """dequant_row in numpy (dequant_numpy, bit-exact with ggml), for NUMBA_DISABLE_JIT=1."""
    from ....quant.dequant_numpy import dequantize_numpy
    n = blocks * ACTIVATION_BLOCKS[fmt] * QK
    out[out_offset:out_offset + n] = dequantize_numpy(raw[row_offset:row_offset + blocks * block_bytes],
                                                      NAMES[fmt], n)


TILE_ROWS = 4  # activation rows per call of the many-row kernels (a prompt's tokens)
NAMES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q5_k", "q6_k")


def dot_py(fmt, raw, oa, ob, blocks, block_bytes, qx, dx, sx, table, i0, rows):
    """The kernels' product in numpy, for NUMBA_DISABLE_JIT=1 and as the tests' reference: the two
    weight rows dequantised (dequant_numpy, bit-exact with ggml) times the dequantised activations
    (the K-quants: kquant_ir's int8 ones)."""
    from ....quant.dequant_numpy import dequantize_numpy
    k = blocks * ACTIVATION_BLOCKS[fmt] * QK
    x = qx[i0:i0 + rows, :k]
    scale = dx[i0:i0 + rows, :k // QK, None].astype(np.float64)
    if fmt >= 5:
        x, scale = kquant_ir.requantised(x), scale * kquant_ir.X8_SCALE
    x = (x.astype(np.float64).reshape(rows, -1, QK) * scale).reshape(rows, k)
    w = np.stack([dequantize_numpy(raw[o:o + blocks * block_bytes], NAMES[fmt], k) for o in (oa, ob)])
    return tuple(np.float32(v) for v in (w.astype(np.float64) @ x.T).reshape(-1))


# dot: two weight rows times one activation row; tile_dot: times TILE_ROWS rows.
dot = _make_kernel(1)
tile_dot = _make_kernel(TILE_ROWS)
if config.DISABLE_JIT:  # type: ignore[attr-defined]  # (set at import) IR cannot run as Python: numpy instead
    dot = functools.partial(dot_py, rows=1)
    tile_dot = functools.partial(dot_py, rows=TILE_ROWS)
    dequant_row = dequant_row_py  # type: ignore[assignment]
    f16_dot = f16_dot_py  # type: ignore[assignment]
    prefetch = prefetch_py  # type: ignore[assignment]
    softmax_numerator = softmax_numerator_py  # type: ignore[assignment]
