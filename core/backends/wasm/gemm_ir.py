"""Register-blocked GEMMs for kernels.wasm (SIMD128): prompts' products and Whisper's encoder, where
the 4-row integer tiles of matmul_<fmt> save nothing per row (docs/wasm.md). Written with
kernels_ir's loop and vector helpers; the weight formats' dequantisation is the module's own
dequant_<fmt> (vector_ir._dequant_block, the CPU device's generator), called per weight row.

    C[i, j] = A[i, :] . B[j, :] (+ bias[j])       A f32 (m, k), row stride lda; B the weight (n, k)

  gemm_f32(a, lda, b, ldb, bias, out, ldc, m, n, k, scratch)
  gemm_f16(a, lda, b, ldb, bias, out, ldc, m, n, k, scratch)       b: f16 bits, ldb in elements
  gemm_q(fmt, a, lda, raw, blocks, bias, out, ldc, m, n, table, scratch)
                                    raw: n rows of `blocks` GGUF blocks of format `fmt` (codes.FORMATS'
                                    code, 0-7); k = blocks * the format's values per block
  bias = 0: none. scratch: program.gemm_scratch_floats(k) floats (f32/f16: NR * k; gemm_q: 2 * NR * k).

How: for each block of MB rows of A, for each panel of NR weight rows, the panel is packed once
as (k, NR) float32 (f32: a 4x8 transpose per 4 values; f16: widened exactly by bit arithmetic,
SIMD128 has no f16 conversion; a quantised panel: dequant_<fmt> of its NR rows, then the f32 pack),
zero past n; then every MR-row tile of the block runs the micro-kernel: MR x NR accumulators
(MR vectors of NR floats) held in registers, the K loop innermost, one packed-panel load and MR
broadcast A values per k. A tail of m % MR rows runs a 1-row kernel, a tail of n % NR columns stores
only the valid lanes. The A block (MB rows) stays in cache across the panels of its block.
"""
from llvmlite import ir
from numba.core import cgutils

from ..cpu.kernels import codes, vector_ir
from .kernels_ir import (_F32, _I8, _I16, _I32, _I64, _P32, _const_vec, _function, _intrinsic, _Loop, _slot,
                         _splat, _vec, BLOCK_BYTES)
from .program import GEMM_MB as MB, GEMM_MR as MR, GEMM_NR as NR, gemm_scratch_floats as scratch_floats  # noqa: F401

# MR x NR: the micro-tile (rows of A x weight rows); MB: rows of A a block (in cache while every panel passes)
STACK_A_FLOATS = 10240  # 40 KB of the module's 64 KiB stack: a block's A tiles, packed (the host's scratch is
#                         the panel's alone, program.gemm_scratch_floats)
PACKED_ROWS_MIN = 16  # the packed path needs blocks of at least this many rows (so k <= 640)
_VN = _vec(_F32, NR)
_V4 = _vec(_F32, 4)


def _c(v):
    return ir.Constant(_I64, v)


def _min(b, x, y):
    return b.select(b.icmp_signed("<", x, y), x, y)


def _pack_rows_f32(b, rows, valid, k, panel, vector_load):
    """panel[p * NR + c] = rows[c][p] (0 where not valid[c]) for p < k: 4 values of each of the NR
    rows a step, transposed by shuffles; then the k % 4 tail one value at a time. vector_load(row, p)
    gives row[p:p + 4] as <4 x float>, scalar_load(row, p) one value."""
    load4, load1 = vector_load
    width = len(rows)
    vt = _vec(_F32, width)
    full = b.mul(b.udiv(k, _c(4)), _c(4))
    zero4 = ir.Constant(_V4, [ir.Constant(_F32, 0.0)] * 4)
    with _Loop(b, full, step=4) as p:
        vs = [b.select(valid[c], load4(rows[c], p), zero4) for c in range(width)]
        while len(vs) > 1:  # concatenate: <width*4 x float>, row c's four values at 4c
            count = vs[0].type.count
            vs = [b.shuffle_vector(vs[i], vs[i + 1], _const_vec(_I32, range(2 * count))) for i in range(0, len(vs), 2)]
        for q in range(4):
            out = b.shuffle_vector(vs[0], vs[0], _const_vec(_I32, [4 * c + q for c in range(width)]))
            at = b.bitcast(b.gep(panel, [b.mul(b.add(p, _c(q)), _c(width))]), vt.as_pointer())
            b.store(out, at).align = 4
    with _Loop(b, k, start=full) as p:
        for c in range(width):
            v = b.select(valid[c], load1(rows[c], p), ir.Constant(_F32, 0.0))
            b.store(v, b.gep(panel, [b.add(b.mul(p, _c(width)), _c(c))]))


def _f32_loads(b):
    def load4(row, p):
        v = b.load(b.bitcast(b.gep(row, [p]), _V4.as_pointer()))
        v.align = 4
        return v
    return load4, lambda row, p: b.load(b.gep(row, [p]))


def _f16_widen(b, h):
    """<N x i16> f16 bits -> <N x float>, exact for every pattern: the magnitude's bits shifted into
    float32's places and multiplied by 2^112 (normal and subnormal f16 alike), inf/NaN's exponent
    set to all ones, the sign or-ed back."""
    n = h.type.count
    v32 = _vec(_I32, n)
    x = b.zext(h, v32)
    mag = b.and_(x, _const_vec(_I32, [0x7FFF] * n))
    scaled = b.fmul(b.bitcast(b.shl(mag, _const_vec(_I32, [13] * n)), _vec(_F32, n)),
                    _const_vec(_F32, [2.0 ** 112] * n))
    special = b.or_(b.shl(mag, _const_vec(_I32, [13] * n)), _const_vec(_I32, [0x7F800000] * n))
    is_special = b.icmp_unsigned(">=", mag, _const_vec(_I32, [0x7C00] * n))
    bits = b.select(is_special, special, b.bitcast(scaled, v32))
    sign = b.shl(b.and_(x, _const_vec(_I32, [0x8000] * n)), _const_vec(_I32, [16] * n))
    return b.bitcast(b.or_(bits, sign), _vec(_F32, n))


def _f16_loads(b):
    def load4(row, p):
        v = b.load(b.bitcast(b.gep(row, [p]), _vec(_I16, 4).as_pointer()))
        v.align = 2
        return _f16_widen(b, v)

    def load1(row, p):
        v = b.insert_element(ir.Constant(_vec(_I16, 4), ir.Undefined), b.load(b.gep(row, [p])), ir.Constant(_I32, 0))
        return b.extract_element(_f16_widen(b, v), ir.Constant(_I32, 0))
    return load4, load1


def _tile(b, a, lda, i0, rows, panel, k, accs):
    """The micro-kernel: accs[r] (<NR x float>) = A[i0 + r, :k] times the packed panel, r < rows."""
    zero = ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR)
    a_rows = [b.gep(a, [b.mul(b.add(i0, _c(r)), lda)]) for r in range(rows)]
    for r in range(rows):
        b.store(zero, accs[r])
    with _Loop(b, k) as p:
        w = b.load(b.bitcast(b.gep(panel, [b.mul(p, _c(NR))]), _VN.as_pointer()))
        w.align = 4
        for r in range(rows):
            x = _splat(b, b.load(b.gep(a_rows[r], [p])), NR)
            b.store(_intrinsic(b, f"llvm.fmuladd.v{NR}f32", _VN, [x, w, b.load(accs[r])]), accs[r])


def _packed_tile(b, packed, panel, k, accs):
    """The micro-kernel on a packed A tile ((k, MR) floats): per k one load of the MR rows' values,
    each row's lane broadcast by a shuffle (pshufd under wasmtime; a scalar splat load per row took
    3 instructions each), one panel load, MR x NR multiply-adds."""
    zero = ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR)
    for r in range(MR):
        b.store(zero, accs[r])
    with _Loop(b, k) as p:
        w = b.load(b.bitcast(b.gep(panel, [b.mul(p, _c(NR))], inbounds=True), _VN.as_pointer()))
        w.align = 4
        av = b.load(b.bitcast(b.gep(packed, [b.mul(p, _c(MR))], inbounds=True), _vec(_F32, MR).as_pointer()))
        av.align = 4
        for r in range(MR):
            x = b.shuffle_vector(av, av, _const_vec(_I32, [r] * NR))
            b.store(_intrinsic(b, f"llvm.fmuladd.v{NR}f32", _VN, [x, w, b.load(accs[r])]), accs[r])


class _StepLoop(_Loop):
    """_Loop with a step computed at run time."""

    def __init__(self, builder, stop, start, step):
        super().__init__(builder, stop, start)
        self.step = step


def _store_tile(b, out, ldc, i0, rows, j0, n, bias_v, accs, spill):
    """C rows i0 .. i0 + rows, columns j0 .. min(j0 + NR, n): whole vectors, or the valid lanes."""
    whole = b.icmp_signed("<=", b.add(j0, _c(NR)), n)
    for r in range(rows):
        v = b.fadd(b.load(accs[r]), bias_v)
        dst = b.gep(out, [b.add(b.mul(b.add(i0, _c(r)), ldc), j0)])
        with b.if_else(whole) as (then, otherwise):
            with then:
                b.store(v, b.bitcast(dst, _VN.as_pointer())).align = 4
            with otherwise:
                b.store(v, spill)
                lanes = b.bitcast(spill, _F32.as_pointer())
                with _Loop(b, b.sub(n, j0)) as c:
                    b.store(b.load(b.gep(lanes, [c])), b.gep(dst, [c]))


def _blocked(b, a, lda, bias, out, ldc, m, n, k, panel, pack):
    """The block / panel / tile loops around `pack(j0)` (fills the panel for weight rows j0..j0+NR).
    Where PACKED_ROWS_MIN rows of k fit STACK_A_FLOATS, each block's whole tiles are packed first on
    the stack as (tile, k, MR) for _packed_tile, the block as many rows as fit (at most MB); otherwise
    (k > 640) blocks of MB rows run _tile on A where it lies: blocks of a few rows would pack every
    panel again for each (measured: 0.65x at k = 1536 with 4-row blocks)."""
    accs = [_slot(b, ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR)) for _ in range(MR)]
    spill = _slot(b, ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR))
    bias_slot = _slot(b, ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR))
    packed_a = cgutils.alloca_once(b, _F32, size=STACK_A_FLOATS)  # (an array type made LLVM's -O3 take ~45 s)
    has_bias = b.icmp_unsigned("!=", b.ptrtoint(bias, _I32), ir.Constant(_I32, 0))
    fits = b.icmp_unsigned("<=", b.mul(k, _c(PACKED_ROWS_MIN)), _c(STACK_A_FLOATS))
    rows_fit = b.mul(b.udiv(b.udiv(_c(STACK_A_FLOATS), b.select(fits, k, _c(1))), _c(MR)), _c(MR))
    block = b.select(fits, _min(b, rows_fit, _c(MB)), _c(MB))
    with _StepLoop(b, m, _c(0), block) as i_block:
        i_end = _min(b, b.add(i_block, block), m)
        tiles = b.add(i_block, b.mul(b.udiv(b.sub(i_end, i_block), _c(MR)), _c(MR)))
        with b.if_then(fits):
            with _Loop(b, tiles, start=i_block, step=MR) as i0:
                rows = [b.gep(a, [b.mul(b.add(i0, _c(r)), lda)]) for r in range(MR)]
                at = b.gep(packed_a, [b.mul(b.sub(i0, i_block), k)])
                _pack_rows_f32(b, rows, [ir.Constant(ir.IntType(1), 1)] * MR, k, at, _f32_loads(b))
        with _Loop(b, n, step=NR) as j0:
            pack(j0)
            b.store(ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR), bias_slot)
            with b.if_then(has_bias):
                v = ir.Constant(_VN, [ir.Constant(_F32, 0.0)] * NR)
                for c in range(NR):
                    j = _min(b, b.add(j0, _c(c)), b.sub(n, _c(1)))
                    value = b.select(b.icmp_signed("<", b.add(j0, _c(c)), n), b.load(b.gep(bias, [j])),
                                     ir.Constant(_F32, 0.0))
                    v = b.insert_element(v, value, ir.Constant(_I32, c))
                b.store(v, bias_slot)
            with _Loop(b, tiles, start=i_block, step=MR) as i0:
                with b.if_else(fits) as (then, otherwise):
                    with then:
                        _packed_tile(b, b.gep(packed_a, [b.mul(b.sub(i0, i_block), k)]), panel, k, accs)
                    with otherwise:
                        _tile(b, a, lda, i0, MR, panel, k, accs)
                _store_tile(b, out, ldc, i0, MR, j0, n, b.load(bias_slot), accs, spill)
            with _Loop(b, i_end, start=tiles) as i0:
                _tile(b, a, lda, i0, 1, panel, k, accs)
                _store_tile(b, out, ldc, i0, 1, j0, n, b.load(bias_slot), accs, spill)


def _panel_rows(b, base, ld, j0, n):
    """The NR weight rows from j0 (clamped to the last row) and whether each is < n."""
    last = b.sub(n, _c(1))
    rows, valid = [], []
    for c in range(NR):
        j = b.add(j0, _c(c))
        rows.append(b.gep(base, [b.mul(_min(b, j, last), ld)]))
        valid.append(b.icmp_signed("<", j, n))
    return rows, valid


def _gemm_float(module, name, wtype, loads):
    b, (a, lda, w, ldb, bias, out, ldc, m, n, k, scratch) = _function(
        module, name, [(_P32, _F32), (_I32, _I64), (_P32, wtype), (_I32, _I64), (_P32, _F32), (_P32, _F32),
                       (_I32, _I64), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _F32)])

    def pack(j0):
        rows, valid = _panel_rows(b, w, ldb, j0, n)
        _pack_rows_f32(b, rows, valid, k, scratch, loads(b))
    _blocked(b, a, lda, bias, out, ldc, m, n, k, scratch, pack)
    b.ret_void()


def _gemm_q(module):
    """gemm_q: a quantised weight's panel dequantised row by row (the module's dequant_<fmt>, a call
    each), then packed as f32; fmt picks the format at run time (an unknown code traps)."""
    b, (fmt, a, lda, raw, blocks, bias, out, ldc, m, n, table, scratch) = _function(
        module, "gemm_q", [(_I32, None), (_P32, _F32), (_I32, _I64), (_P32, _I8), (_I32, _I64), (_P32, _F32),
                           (_P32, _F32), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32)])
    per_block = [vector_ir.ACTIVATION_BLOCKS[code] * 32 for code in range(len(codes.FORMATS))]
    sizes = [BLOCK_BYTES[name] for name in codes.FORMATS]
    names = list(codes.FORMATS)
    # k and a row's bytes for the format: a select chain over the codes (the table is 8 entries)
    k, row_bytes = _c(0), _c(0)
    for code in range(len(names)):
        is_it = b.icmp_unsigned("==", fmt, ir.Constant(_I32, code))
        k = b.select(is_it, b.mul(blocks, _c(per_block[code])), k)
        row_bytes = b.select(is_it, b.mul(blocks, _c(sizes[code])), row_bytes)
    known = b.icmp_unsigned("<", fmt, ir.Constant(_I32, len(names)))
    with b.if_then(b.not_(known)):
        _intrinsic(b, "llvm.trap", ir.VoidType(), [])
    panel = scratch
    dequantised = b.gep(scratch, [b.mul(k, _c(NR))])

    def pack(j0):
        last = b.sub(n, _c(1))
        for c in range(NR):
            j = _min(b, b.add(j0, _c(c)), last)
            src = b.ptrtoint(b.gep(raw, [b.mul(j, row_bytes)]), _I32)
            dst = b.ptrtoint(b.gep(dequantised, [b.mul(_c(c), k)]), _I32)
            done = b.append_basic_block("dequantised")
            switch = b.switch(fmt, done)
            for code, name in enumerate(names):
                case = b.append_basic_block(f"dequant_{name}")
                switch.add_case(ir.Constant(_I32, code), case)
                b.position_at_end(case)
                b.call(module.globals[f"dequant_{name}"],
                       [src, b.trunc(blocks, _I32), b.ptrtoint(table, _I32), dst])
                b.branch(done)
            b.position_at_end(done)
        rows = [b.gep(dequantised, [b.mul(_c(c), k)]) for c in range(NR)]
        valid = [b.icmp_signed("<", b.add(j0, _c(c)), n) for c in range(NR)]
        _pack_rows_f32(b, rows, valid, k, panel, _f32_loads(b))
    _blocked(b, a, lda, bias, out, ldc, m, n, k, panel, pack)
    b.ret_void()


def add_kernels(module):
    """Add the GEMMs (the module's dequant_<fmt> must be in it already: gemm_q calls them)."""
    for name in codes.FORMATS:
        module.globals[f"dequant_{name}"].attributes.add("noinline")
    _gemm_float(module, "gemm_f32", _F32, _f32_loads)
    _gemm_float(module, "gemm_f16", _I16, _f16_loads)
    _gemm_q(module)
