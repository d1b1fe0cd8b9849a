"""The wasm kernels as one LLVM IR module (triple wasm32-unknown-unknown, SIMD128), built from the
CPU device's IR generators (cpu/kernels/vector_ir.py, kquant_ir.py): the same block unpacking,
integer dots and exp polynomial as the native kernels, so the two devices cannot drift. What the
native side writes as numba loops (the row loops, activation quantisation, norms, activations)
is written here as IR loops around those generators, with the numba kernels' arithmetic.

Every export takes byte addresses into the module's (imported) memory and i32 counts:

  f16_table(out)                          out[65536] = the float32 of every f16 bit pattern
  quantize_row(x, k, qx, dx, sx)          int_dot.quantize_rows for one row, qmax 32767
  matmul_<fmt>(raw, n, blocks, m, qx, dx, sx, table, out)
                                          out[i, r] = (weight row r) . (activation row i): n rows of
                                          `blocks` GGUF blocks at raw; the m rows quantised
                                          (qx int16 (m, k), dx/sx (m, k/32)); 4 rows a tile
  dequant_<fmt>(raw, blocks, table, out)  one row of blocks -> float32 (bit-exact with ggml)
  f32_matvec(w, n, k, x, out)             out[r] = w[r, :] . x  (float32 rows)
  add_rms_norm(x, r, w, d, eps, total, normed)  fused_ops.add_rms_norm for one row (w = 0: none)
  softmax(row, n)                         in place
  silu(x, n, out), gelu(x, n, out)        elementwise (gelu: fused_ops' erf form, same constants)
"""
from llvmlite import ir
from numba.core import cgutils

from ..cpu.kernels import codes, kquant_ir, vector_ir
from ..cpu.kernels.vector_ir import _F32, _I8, _I16, _I32, _I64, _const_vec, _splat, _vec

TRIPLE = "wasm32-unknown-unknown"
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q5_0": 22, "q5_1": 24, "q8_0": 34, "q4_k": 144, "q5_k": 176, "q6_k": 210}
TILE = vector_ir.TILE_ROWS  # activation rows per tile of matmul_<fmt>
LANES = 16  # float lanes of the float loops (four SIMD128 registers)
QMAX = 32767  # the activations' integer range, as the CPU device's decode kernels use

_P32 = _I32  # wasm32: an address is an i32
_VF = _vec(_F32, LANES)


def _intrinsic(builder, name, ret, args):
    fn = builder.module.globals.get(name)
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


class _Loop:
    """for i in range(start, stop, step) as IR (i64), the body written inside `with`."""

    def __init__(self, builder, stop, start=0, step=1):
        self.b, self.stop, self.step = builder, stop, ir.Constant(_I64, step)
        self.start = start if isinstance(start, ir.Value) else ir.Constant(_I64, start)

    def __enter__(self):
        b = self.b
        self.head, self.body, self.end = (b.append_basic_block(n) for n in ("loop_head", "loop_body", "loop_end"))
        before = b.block
        b.branch(self.head)
        b.position_at_end(self.head)
        self.index = b.phi(_I64)
        self.index.add_incoming(self.start, before)
        b.cbranch(b.icmp_signed("<", self.index, self.stop), self.body, self.end)
        b.position_at_end(self.body)
        return self.index

    def __exit__(self, *exc):
        b = self.b
        self.index.add_incoming(b.add(self.index, self.step), b.block)
        b.branch(self.head)
        b.position_at_end(self.end)


def _function(module, name, params, ret=None):
    """An exported function: (its builder, its arguments with i32 counts/addresses widened to i64)."""
    fn = ir.Function(module, ir.FunctionType(ret or ir.VoidType(), [t for t, _ in params]), name)
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    args = []
    for arg, (_, kind) in zip(fn.args, params):
        if kind is None:
            args.append(arg)
        else:  # an address: a typed pointer; a count: i64
            args.append(b.inttoptr(arg, kind.as_pointer()) if kind != _I64 else b.zext(arg, _I64))
    return b, args


def _slot(b, init):
    """A variable in the function's entry block (an alloca in a loop would grow the stack each pass)."""
    return cgutils.alloca_once_value(b, init)


def _vload(b, ptr, i, ty=_VF):
    v = b.load(b.bitcast(b.gep(ptr, [i]), ty.as_pointer()))
    v.align = 4
    return v


def _vstore(b, value, ptr, i):
    b.store(value, b.bitcast(b.gep(ptr, [i]), value.type.as_pointer())).align = 4


def _hsum(b, v, n=LANES):
    total = b.extract_element(v, ir.Constant(_I32, 0))
    for lane in range(1, n):
        total = b.fadd(total, b.extract_element(v, ir.Constant(_I32, lane)))
    return total


def _full(b, n):
    """n rounded down to whole vectors."""
    return b.mul(b.udiv(n, ir.Constant(_I64, LANES)), ir.Constant(_I64, LANES))


def _dot(b, x, y, n):
    """x[:n] . y[:n] in float32: 16 lanes of fused multiply-adds, then the tail."""
    full = _full(b, n)
    acc = _slot(b, ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES))
    b.store(ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES), acc)
    with _Loop(b, full, step=LANES) as j:
        b.store(_intrinsic(b, "llvm.fmuladd.v16f32", _VF, [_vload(b, x, j), _vload(b, y, j), b.load(acc)]), acc)
    tail = _slot(b, ir.Constant(_F32, 0.0))
    b.store(_hsum(b, b.load(acc)), tail)
    with _Loop(b, n, start=full) as j:
        b.store(b.fadd(b.load(tail), b.fmul(b.load(b.gep(x, [j])), b.load(b.gep(y, [j])))), tail)
    return b.load(tail)


def _f16_table(module):
    """The f16 -> f32 table that the block kernels look scales up in, computed from the bits
    (wasm has no f16 conversion): normal, subnormal (m * 2^-24, exact), inf/NaN, zero."""
    b, (out,) = _function(module, "f16_table", [(_P32, _F32)])
    with _Loop(b, ir.Constant(_I64, 65536)) as i:
        h = b.trunc(i, _I32)
        sign = b.shl(b.and_(h, ir.Constant(_I32, 0x8000)), ir.Constant(_I32, 16))
        e = b.and_(b.lshr(h, ir.Constant(_I32, 10)), ir.Constant(_I32, 31))
        m = b.and_(h, ir.Constant(_I32, 0x3FF))
        normal = b.or_(b.shl(b.add(e, ir.Constant(_I32, 112)), ir.Constant(_I32, 23)),
                       b.shl(m, ir.Constant(_I32, 13)))
        special = b.or_(ir.Constant(_I32, 0x7F800000), b.shl(m, ir.Constant(_I32, 13)))
        sub = b.bitcast(b.fmul(b.uitofp(m, _F32), ir.Constant(_F32, 2.0 ** -24)), _I32)
        bits = b.select(b.icmp_unsigned("==", e, ir.Constant(_I32, 31)), special, normal)
        bits = b.select(b.icmp_unsigned("==", e, ir.Constant(_I32, 0)), sub, bits)
        b.store(b.bitcast(b.or_(bits, sign), _F32), b.gep(out, [i]))
    b.ret_void()


def _quantize_row(module):
    """int_dot.quantize_rows for one row: per 32 values d = amax / qmax, q = roundf(x / d) (its
    _roundf: floor(a) + floor(2 (a - floor(a))), signed), the block's sum of q."""
    b, (x, k, qx, dx, sx) = _function(module, "quantize_row",
                                      [(_P32, _F32), (_I32, _I64), (_P32, _I16), (_P32, _F32), (_P32, _I32)])
    v32 = _vec(_F32, 32)
    with _Loop(b, b.udiv(k, ir.Constant(_I64, 32))) as blk:
        at = b.mul(blk, ir.Constant(_I64, 32))
        v = _vload(b, x, at, v32)
        a = _intrinsic(b, "llvm.fabs.v32f32", v32, [v])
        amax = _intrinsic(b, "llvm.vector.reduce.fmaximum.v32f32", _F32, [a])
        d = b.fdiv(amax, ir.Constant(_F32, float(QMAX)))
        zero = ir.Constant(_F32, 0.0)
        inv = b.select(b.fcmp_ordered("!=", d, zero), b.fdiv(ir.Constant(_F32, 1.0), d), zero)
        y = b.fmul(v, _splat(b, inv, 32))
        ya = _intrinsic(b, "llvm.fabs.v32f32", v32, [y])
        f = _intrinsic(b, "llvm.floor.v32f32", v32, [ya])
        r = b.fadd(f, _intrinsic(b, "llvm.floor.v32f32", v32,
                                 [b.fmul(_const_vec(_F32, [2.0] * 32), b.fsub(ya, f))]))
        r = b.select(b.fcmp_ordered(">=", y, _const_vec(_F32, [0.0] * 32)), r, b.fsub(_const_vec(_F32, [0.0] * 32), r))
        q = b.fptosi(r, _vec(_I32, 32))
        _vstore(b, b.trunc(q, _vec(_I16, 32)), qx, at)
        b.store(d, b.gep(dx, [blk]))
        b.store(_intrinsic(b, "llvm.vector.reduce.add.v32i32", _I32, [q]), b.gep(sx, [blk]))
    b.ret_void()


def _matmul(module, name):
    """matmul_<name>: the CPU decode kernel (vector_ir._kernel_body, or kquant_ir.kernel_body for
    the K-quants) over weight-row pairs, for TILE activation rows at a time and then one."""
    code = codes.FORMATS[name]
    per_block = vector_ir.ACTIVATION_BLOCKS[code]
    body = kquant_ir.kernel_body if code >= 5 else vector_ir._kernel_body
    b, (raw, n, blocks, m, qx, dx, sx, table, out) = _function(
        module, f"matmul_{name}", [(_P32, _I8), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _I16),
                                   (_P32, _F32), (_P32, _I32), (_P32, _F32), (_P32, _F32)])
    row_bytes = b.mul(blocks, ir.Constant(_I64, BLOCK_BYTES[name]))
    k = b.mul(blocks, ir.Constant(_I64, per_block * 32))
    kb = b.mul(blocks, ir.Constant(_I64, per_block))
    one = ir.Constant(_I64, 1)
    tiles = b.mul(b.udiv(m, ir.Constant(_I64, TILE)), ir.Constant(_I64, TILE))

    def rows_from(i0, count):
        with _Loop(b, n, step=2) as r:
            r1 = b.add(r, one)
            has_second = b.icmp_signed("<", r1, n)
            oa = b.mul(r, row_bytes)
            ob = b.mul(b.select(has_second, r1, r), row_bytes)  # an odd last row: computed twice, stored once
            x_rows = []
            for j in range(count):
                i = b.add(i0, ir.Constant(_I64, j))
                x_rows.append((b.gep(qx, [b.mul(i, k)]), b.gep(dx, [b.mul(i, kb)]), b.gep(sx, [b.mul(i, kb)])))
            values = body(b, code, count, raw, table, x_rows, oa, ob, blocks, ir.Constant(_I64, BLOCK_BYTES[name]))
            for j in range(count):
                b.store(values[j], b.gep(out, [b.add(b.mul(b.add(i0, ir.Constant(_I64, j)), n), r)]))
            second = b.append_basic_block("second_row")
            done = b.append_basic_block("rows_done")
            b.cbranch(has_second, second, done)
            b.position_at_end(second)
            for j in range(count):
                b.store(values[count + j], b.gep(out, [b.add(b.mul(b.add(i0, ir.Constant(_I64, j)), n), r1)]))
            b.branch(done)
            b.position_at_end(done)

    with _Loop(b, tiles, step=TILE) as i0:
        rows_from(i0, TILE)
    with _Loop(b, m, start=tiles) as i0:
        rows_from(i0, 1)
    b.ret_void()


def _dequant(module, name):
    code = codes.FORMATS[name]
    b, (raw, blocks, table, out) = _function(
        module, f"dequant_{name}", [(_P32, _I8), (_I32, _I64), (_P32, _F32), (_P32, _F32)])
    with _Loop(b, blocks) as i:
        p = b.mul(i, ir.Constant(_I64, BLOCK_BYTES[name]))
        out_p = b.gep(out, [b.mul(i, ir.Constant(_I64, vector_ir.ACTIVATION_BLOCKS[code] * 32))])
        vector_ir._dequant_block(b, code, raw, table, p, out_p)
    b.ret_void()


def _f32_matvec(module):
    b, (w, n, k, x, out) = _function(module, "f32_matvec",
                                     [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32)])
    with _Loop(b, n) as r:
        b.store(_dot(b, b.gep(w, [b.mul(r, k)]), x, k), b.gep(out, [r]))
    b.ret_void()


def _map(b, src, n, dst, fn):
    """dst[i] = fn(<16 x float>) for i < n, the tail through the same vector function one lane at a time."""
    full = b.mul(b.udiv(n, ir.Constant(_I64, LANES)), ir.Constant(_I64, LANES))
    with _Loop(b, full, step=LANES) as i:
        _vstore(b, fn(_vload(b, src, i)), dst, i)
    with _Loop(b, n, start=full) as i:
        v = fn(_splat(b, b.load(b.gep(src, [i])), LANES))
        b.store(b.extract_element(v, ir.Constant(_I32, 0)), b.gep(dst, [i]))


def _add_rms_norm(module):
    """fused_ops.add_rms_norm for one row of d: total = x + r; normed = total / sqrt(mean(total^2) + eps) * w
    (the squares summed in float32 lanes here, float64 there)."""
    b, (x, r, w, d, eps, total, normed) = _function(
        module, "add_rms_norm", [(_P32, _F32), (_P32, _F32), (_P32, _F32), (_I32, _I64), (_F32, None),
                                 (_P32, _F32), (_P32, _F32)])
    acc = b.alloca(_VF)
    b.store(ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES), acc)

    def add(v_x, v_r):
        s = b.fadd(v_x, v_r)
        b.store(b.fadd(b.load(acc), b.fmul(s, s)), acc)
        return s
    full = b.mul(b.udiv(d, ir.Constant(_I64, LANES)), ir.Constant(_I64, LANES))
    with _Loop(b, full, step=LANES) as i:
        _vstore(b, add(_vload(b, x, i), _vload(b, r, i)), total, i)
    ss = b.alloca(_F32)
    b.store(ir.Constant(_F32, 0.0), ss)
    with _Loop(b, d, start=full) as i:
        s = b.fadd(b.load(b.gep(x, [i])), b.load(b.gep(r, [i])))
        b.store(s, b.gep(total, [i]))
        b.store(b.fadd(b.load(ss), b.fmul(s, s)), ss)
    mean = b.fdiv(b.fadd(_hsum(b, b.load(acc)), b.load(ss)), b.uitofp(d, _F32))
    inv = b.fdiv(ir.Constant(_F32, 1.0), _intrinsic(b, "llvm.sqrt.f32", _F32, [b.fadd(mean, eps)]))
    has_w = b.icmp_unsigned("!=", b.ptrtoint(w, _I32), ir.Constant(_I32, 0))
    inv_v = _splat(b, inv, LANES)
    with _Loop(b, full, step=LANES) as i:
        y = b.fmul(_vload(b, total, i), inv_v)
        _vstore(b, b.select(has_w, b.fmul(y, _vload(b, w, i)), y), normed, i)
    with _Loop(b, d, start=full) as i:
        y = b.fmul(b.load(b.gep(total, [i])), inv)
        with b.if_else(has_w) as (then, otherwise):
            with then:
                b.store(b.fmul(y, b.load(b.gep(w, [i]))), b.gep(normed, [i]))
            with otherwise:
                b.store(y, b.gep(normed, [i]))
    b.ret_void()


def _softmax(module):
    """softmax in place: vector_ir's numerator passes (the max; e^(x - max) by _vector_exp, the
    polynomial the native softmax_numerator uses; the sum), then one multiply by 1/sum."""
    b, (row, n) = _function(module, "softmax", [(_P32, _F32), (_I32, _I64)])
    full = b.mul(b.udiv(n, ir.Constant(_I64, LANES)), ir.Constant(_I64, LANES))
    ninf = ir.Constant(_F32, float("-inf"))
    top_v = b.alloca(_VF)
    b.store(ir.Constant(_VF, [ninf] * LANES), top_v)
    with _Loop(b, full, step=LANES) as i:
        b.store(_intrinsic(b, "llvm.maximum.v16f32", _VF, [b.load(top_v), _vload(b, row, i)]), top_v)
    top = b.alloca(_F32)
    b.store(_intrinsic(b, "llvm.vector.reduce.fmaximum.v16f32", _F32, [b.load(top_v)]), top)
    with _Loop(b, n, start=full) as i:
        b.store(_intrinsic(b, "llvm.maximum.f32", _F32, [b.load(top), b.load(b.gep(row, [i]))]), top)
    shift = _splat(b, b.load(top), LANES)
    acc = b.alloca(_VF)
    b.store(ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES), acc)

    def numerator(v):
        e = vector_ir._vector_exp(b, b.fsub(v, shift))
        return e
    with _Loop(b, full, step=LANES) as i:
        e = numerator(_vload(b, row, i))
        _vstore(b, e, row, i)
        b.store(b.fadd(b.load(acc), e), acc)
    tail = b.alloca(_F32)
    b.store(ir.Constant(_F32, 0.0), tail)
    with _Loop(b, n, start=full) as i:
        e = b.extract_element(numerator(_splat(b, b.load(b.gep(row, [i])), LANES)), ir.Constant(_I32, 0))
        b.store(e, b.gep(row, [i]))
        b.store(b.fadd(b.load(tail), e), tail)
    inv = b.fdiv(ir.Constant(_F32, 1.0), b.fadd(_hsum(b, b.load(acc)), b.load(tail)))
    _map(b, row, n, row, lambda v: b.fmul(v, _splat(b, inv, LANES)))
    b.ret_void()


def _unary(module, name, fn):
    b, (x, n, out) = _function(module, name, [(_P32, _F32), (_I32, _I64), (_P32, _F32)])
    _map(b, x, n, out, lambda v: fn(b, v))
    b.ret_void()


def _silu(b, v):
    """x / (1 + e^-x), as int_dot._act's silu."""
    one = _const_vec(_F32, [1.0] * LANES)
    return b.fdiv(v, b.fadd(one, vector_ir._vector_exp(b, b.fsub(_const_vec(_F32, [0.0] * LANES), v))))


def _gelu(b, v):
    """fused_ops._gelu_one: the erf form by Eigen's rational polynomial, in its operation order."""
    def c(value):
        return _const_vec(_F32, [value] * LANES)
    z = b.fmul(v, c(codes.INV_SQRT2))
    z = b.select(b.fcmp_ordered(">", z, c(codes.GELU_CLAMP)), c(codes.GELU_CLAMP), z)
    z = b.select(b.fcmp_ordered("<", z, c(-codes.GELU_CLAMP)), c(-codes.GELU_CLAMP), z)
    z2 = b.fmul(z, z)
    p = c(codes.ERF_P[0])
    for coef in codes.ERF_P[1:]:
        p = b.fadd(b.fmul(p, z2), c(coef))
    p = b.fmul(p, z)
    q = c(codes.ERF_Q[0])
    for coef in codes.ERF_Q[1:]:
        q = b.fadd(b.fmul(q, z2), c(coef))
    return b.fmul(b.fmul(b.fadd(b.fdiv(p, q), c(1.0)), c(0.5)), v)


def module():
    """This file's kernels as an llvmlite IR module (module_ir.module() adds the rest)."""
    m = ir.Module("tallow_wasm_kernels")
    m.triple = TRIPLE  # vector_ir._pair_madd then names SIMD128's dot instruction
    _f16_table(m)
    _quantize_row(m)
    for name in codes.FORMATS:
        _matmul(m, name)
        _dequant(m, name)
    _f32_matvec(m)
    _add_rms_norm(m)
    _softmax(m)
    _unary(m, "silu", _silu)
    _unary(m, "gelu", _gelu)
    return m


def exports(m):
    """The names of the module's functions that the .wasm exports (all but LLVM's intrinsics)."""
    return [f.name for f in m.functions if not f.is_declaration]
