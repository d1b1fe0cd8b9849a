"""kernels.wasm's row, conversion, gather and strided kernels: what Whisper's encoder and the wasm
device's general ops need beside the products (gemm_ir.py) and the decode kernels (decode_ir.py).
Written with kernels_ir's loop and vector helpers and vector_ir's exp, as the other IR files are.

  conv1d_f32(x, c_in, t_in, w, c_out, ksize, stride, pad, bias, out, scratch)
        torch's conv1d of one (c_in, t_in) signal by w (c_out, c_in, ksize): out (c_out, t_out),
        t_out = (t_in + 2 pad - ksize) // stride + 1; im2col into scratch (t_out, c_in * ksize), then
        gemm_f32 with the weight as A; bias (c_out) or 0. scratch: program.conv1d_scratch_floats() floats
  softmax_rows(x, rows, n, ld, scale, causal, out)
        out[r] (contiguous rows of n) = softmax(scale * x[r * ld : r * ld + n]); causal >= 0 masks
        the columns j > r + causal (a query row r after `causal` earlier keys); causal < 0: none
  layer_norm_rows(x, rows, d, w, b, eps, out)   LayerNorm of each contiguous row (w, b: 0 = none)
  f16_to_f32(src, n, dst), f32_to_f16(src, n, dst)
        exact widening; narrowing rounded to nearest even (overflow to inf, subnormals, NaN kept)
  rows_f32(table, vocab, width, ids, count, out), rows_f16(...)
        out[i] = table[ids[i]] (i32 ids, rows of width; f16 tables widened); an id outside
        [0, vocab) traps
  unary_f32(op, x, out, meta, a0, a1), binary_f32(op, a, b, out, meta), reduce_f32(op, x, meta, out)
        strided: meta is tallow.layout.kernel_meta(shape, operands, 4) (int32 words: ndim,
        the shape, then each operand's element offset and strides), as the GPU kernels read it;
        out is contiguous. unary/binary: element i of the shape. reduce: over the last dim,
        out[i] for each index of the other dims. The op codes are program.UNARY_OPS / BINARY_OPS /
        REDUCE_OPS' (the GPU kernels' numbering, kernel/host.py; "mean" added); others trap.
Rows whose innermost stride is 1 run 16 lanes at a time; other strides gather 16 values a step.
"""
from llvmlite import ir

from ..cpu.kernels import vector_ir
from .gemm_ir import _f16_widen
from .kernels_ir import (_F32, _I16, _I32, _I64, _P32, _VF, LANES, _const_vec, _full, _function, _gelu, _hsum,
                         _intrinsic, _Loop, _map, _silu, _slot, _splat, _vec, _vload, _vstore)
from .program import BINARY_OPS, REDUCE_OPS, STRIDED_DIMS, UNARY_OPS

# The strided kernels' meta dims and op codes (the GPU kernels' numbering) are program.py's, where a host
# reads them without LLVM; the device refuses the other ops before launching.
MAX_DIMS = STRIDED_DIMS
_VI = _vec(_I32, LANES)


def _c(v):
    return ir.Constant(_I64, v)


def _vc(v):
    return _const_vec(_F32, [v] * LANES)


def _address(b, ptr):
    return b.ptrtoint(ptr, _I32)


# ---- conv1d ---------------------------------------------------------------------------------

def _conv1d(module):
    b, (x, c_in, t_in, w, c_out, ksize, stride, pad, bias, out, scratch) = _function(
        module, "conv1d_f32", [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_I32, _I64), (_I32, _I64),
                               (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32), (_P32, _F32)])
    t_out = b.add(b.sdiv(b.sub(b.add(t_in, b.mul(pad, _c(2))), ksize), stride), _c(1))
    kk = b.mul(c_in, ksize)
    cols = scratch
    with _Loop(b, t_out) as t:
        row = b.gep(cols, [b.mul(t, kk)])
        start = b.sub(b.mul(t, stride), pad)
        with _Loop(b, c_in) as c:
            src = b.gep(x, [b.mul(c, t_in)])
            with _Loop(b, ksize) as j:
                at = b.add(start, j)
                inside = b.and_(b.icmp_signed(">=", at, _c(0)), b.icmp_signed("<", at, t_in))
                safe = b.select(inside, at, _c(0))
                v = b.select(inside, b.load(b.gep(src, [safe])), ir.Constant(_F32, 0.0))
                b.store(v, b.gep(row, [b.add(b.mul(c, ksize), j)]))
    panel = b.gep(cols, [b.mul(t_out, kk)])

    def word(v):
        return b.trunc(v, _I32)
    b.call(module.globals["gemm_f32"], [_address(b, w), word(kk), _address(b, cols), word(kk), ir.Constant(_I32, 0),
                                        _address(b, out), word(t_out), word(c_out), word(t_out), word(kk),
                                        _address(b, panel)])
    has_bias = b.icmp_unsigned("!=", _address(b, bias), ir.Constant(_I32, 0))
    with b.if_then(has_bias):
        with _Loop(b, c_out) as o:
            row = b.gep(out, [b.mul(o, t_out)])
            bv = b.load(b.gep(bias, [o]))
            _map(b, row, t_out, row, lambda v: b.fadd(v, _splat(b, bv, LANES)))
    b.ret_void()


# ---- rows: softmax, layer norm ----------------------------------------------------------------

def _softmax_rows(module):
    b, (x, rows, n, ld, scale, causal, out) = _function(
        module, "softmax_rows", [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_F32, None),
                                 (_I32, None), (_P32, _F32)])
    softmax = module.globals["softmax"]
    masked = b.icmp_signed(">=", causal, ir.Constant(_I32, 0))
    ninf = ir.Constant(_F32, float("-inf"))
    sv = _splat(b, scale, LANES)
    lanes = _const_vec(_I64, range(LANES))
    with _Loop(b, rows) as r:
        src, dst = b.gep(x, [b.mul(r, ld)]), b.gep(out, [b.mul(r, n)])
        # columns past `last` are masked: last = r + causal, or n when unmasked
        last = b.select(masked, b.add(r, b.sext(causal, _I64)), n)
        lastv = _splat(b, last, LANES)
        full = _full(b, n)
        with _Loop(b, full, step=LANES) as i:
            cols = b.add(_splat(b, i, LANES), lanes)
            v = b.fmul(_vload(b, src, i), sv)
            _vstore(b, b.select(b.icmp_signed(">", cols, lastv), _splat(b, ninf, LANES), v), dst, i)
        with _Loop(b, n, start=full) as i:
            v = b.fmul(b.load(b.gep(src, [i])), scale)
            b.store(b.select(b.icmp_signed(">", i, last), ninf, v), b.gep(dst, [i]))
        b.call(softmax, [_address(b, dst), b.trunc(n, _I32)])
    b.ret_void()


def _lane_sum(b, row, n, fn):
    """sum over i < n of fn(<16 x float> of row[i:i + 16]), the tail one value at a time (fn on a
    splat, lane 0)."""
    acc = _slot(b, ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES))
    b.store(ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES), acc)
    full = _full(b, n)
    with _Loop(b, full, step=LANES) as i:
        b.store(b.fadd(b.load(acc), fn(_vload(b, row, i))), acc)
    tail = _slot(b, ir.Constant(_F32, 0.0))
    b.store(ir.Constant(_F32, 0.0), tail)
    with _Loop(b, n, start=full) as i:
        v = fn(_splat(b, b.load(b.gep(row, [i])), LANES))
        b.store(b.fadd(b.load(tail), b.extract_element(v, ir.Constant(_I32, 0))), tail)
    return b.fadd(_hsum(b, b.load(acc)), b.load(tail))


def _layer_norm_rows(module):
    """Each row: (x - mean) / sqrt(var + eps) * w + b, mean and variance summed in float32 lanes."""
    b, (x, rows, d, w, bias, eps, out) = _function(
        module, "layer_norm_rows", [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32),
                                    (_F32, None), (_P32, _F32)])
    has_w = b.icmp_unsigned("!=", _address(b, w), ir.Constant(_I32, 0))
    has_b = b.icmp_unsigned("!=", _address(b, bias), ir.Constant(_I32, 0))
    nf = b.uitofp(d, _F32)
    with _Loop(b, rows) as r:
        src, dst = b.gep(x, [b.mul(r, d)]), b.gep(out, [b.mul(r, d)])
        mean = b.fdiv(_lane_sum(b, src, d, lambda v: v), nf)
        mv = _splat(b, mean, LANES)

        def square(v):
            c = b.fsub(v, mv)
            return b.fmul(c, c)
        var = b.fdiv(_lane_sum(b, src, d, square), nf)
        inv = b.fdiv(ir.Constant(_F32, 1.0), _intrinsic(b, "llvm.sqrt.f32", _F32, [b.fadd(var, eps)]))
        iv = _splat(b, inv, LANES)

        def normed(v, wv, bv):
            y = b.fmul(b.fsub(v, mv), iv)
            y = b.select(has_w, b.fmul(y, wv), y)
            return b.select(has_b, b.fadd(y, bv), y)
        full = _full(b, d)
        # w or b absent: read x in their place (never used: the selects above drop it)
        wp = b.select(has_w, w, src)
        bp = b.select(has_b, bias, src)
        with _Loop(b, full, step=LANES) as i:
            _vstore(b, normed(_vload(b, src, i), _vload(b, wp, i), _vload(b, bp, i)), dst, i)
        with _Loop(b, d, start=full) as i:
            one = [_splat(b, b.load(b.gep(p, [i])), LANES) for p in (src, wp, bp)]
            b.store(b.extract_element(normed(*one), ir.Constant(_I32, 0)), b.gep(dst, [i]))
    b.ret_void()


# ---- f16 <-> f32 rows, row lookups ------------------------------------------------------------

def _f16_to_f32(module):
    b, (src, n, dst) = _function(module, "f16_to_f32", [(_P32, _I16), (_I32, _I64), (_P32, _F32)])
    _convert(b, src, n, dst, _vec(_I16, LANES), lambda v: _f16_widen(b, v))
    b.ret_void()


def _narrow(b, v):
    """<16 x float> -> <16 x i16> f16 bits, round to nearest even (F. Giesen's float_to_half_fast3_rtne):
    |x| >= 65520 -> inf, NaN -> quiet NaN with the top payload bits (numpy's bits for numpy's NaNs),
    below 2^-14 by a float add that rounds the subnormal, else the exponent rebiased and the
    mantissa rounded by integer adds."""
    def k(value):
        return _const_vec(_I32, [value] * LANES)
    x = b.bitcast(v, _VI)
    sign = b.and_(b.lshr(x, k(16)), k(0x8000))
    a = b.and_(x, k(0x7FFFFFFF))
    nan = b.or_(k(0x7C00), b.lshr(b.and_(a, k(0x7FFFFF)), k(13)))
    nan = b.select(b.icmp_unsigned("==", nan, k(0x7C00)), k(0x7E00), nan)
    sub = b.sub(b.bitcast(b.fadd(b.bitcast(a, _VF), _vc(0.5)), _VI), k(0x3F000000))
    odd = b.and_(b.lshr(a, k(13)), k(1))
    normal = b.lshr(b.add(b.add(a, k(((15 - 127) << 23) + 0xFFF)), odd), k(13))
    h = b.select(b.icmp_unsigned("<", a, k(0x38800000)), sub, normal)
    h = b.select(b.icmp_unsigned(">=", a, k(0x477FF000)), k(0x7C00), h)
    h = b.select(b.icmp_unsigned(">", a, k(0x7F800000)), nan, h)
    return b.trunc(b.or_(h, sign), _vec(_I16, LANES))


def _f32_to_f16(module):
    b, (src, n, dst) = _function(module, "f32_to_f16", [(_P32, _F32), (_I32, _I64), (_P32, _I16)])
    _convert(b, src, n, dst, _VF, lambda v: _narrow(b, v))
    b.ret_void()


def _convert(b, src, n, dst, in_type, fn):
    full = _full(b, n)
    with _Loop(b, full, step=LANES) as i:
        v = b.load(b.bitcast(b.gep(src, [i]), in_type.as_pointer()))
        v.align = 2
        out = fn(v)
        b.store(out, b.bitcast(b.gep(dst, [i]), out.type.as_pointer())).align = 2
    with _Loop(b, n, start=full) as i:
        one = b.insert_element(ir.Constant(in_type, ir.Undefined), b.load(b.gep(src, [i])), ir.Constant(_I32, 0))
        b.store(b.extract_element(fn(one), ir.Constant(_I32, 0)), b.gep(dst, [i]))


def _rows(module, name, elem, widen):
    b, (table, vocab, width, ids, count, out) = _function(
        module, name, [(_P32, elem), (_I32, _I64), (_I32, _I64), (_P32, _I32), (_I32, _I64), (_P32, _F32)])
    with _Loop(b, count) as i:
        row = b.sext(b.load(b.gep(ids, [i])), _I64)
        bad = b.or_(b.icmp_signed("<", row, _c(0)), b.icmp_signed(">=", row, vocab))
        with b.if_then(bad):
            _intrinsic(b, "llvm.trap", ir.VoidType(), [])
        src, dst = b.gep(table, [b.mul(row, width)]), b.gep(out, [b.mul(i, width)])
        _convert(b, src, width, dst, _vec(elem, LANES), lambda v: widen(b, v))
    b.ret_void()


# ---- strided element-wise ops and last-dim reductions --------------------------------------------

class _Meta:
    """The words of tallow.layout.kernel_meta(shape, operands, MAX_DIMS) at `meta`."""

    def __init__(self, b, meta):
        self.b, self.meta = b, meta

    def word(self, i):
        b = self.b
        if not isinstance(i, ir.Value):
            i = _c(i)
        return b.sext(b.load(b.gep(self.meta, [i])), _I64)

    def ndim(self):
        return self.word(0)

    def size(self, d):
        return self.word(b_add(self.b, d, 1))

    def offset(self, op):
        return self.word(1 + MAX_DIMS + op * (MAX_DIMS + 1))

    def stride(self, op, d):
        return self.word(b_add(self.b, d, 2 + MAX_DIMS + op * (MAX_DIMS + 1)))


def b_add(b, d, k):
    return b.add(d, _c(k)) if isinstance(d, ir.Value) else d + k


def _rows_of(b, m, operands, body):
    """For each index of the dims before the last: body(row, [each operand's element offset of the
    row], inner length, [each operand's inner stride]). A 0-d shape is one row of one element."""
    nd = m.ndim()
    last = b.sub(b.select(b.icmp_signed("<", nd, _c(1)), _c(1), nd), _c(1))
    inner = b.select(b.icmp_signed("<", nd, _c(1)), _c(1), m.size(last))
    strides = [b.select(b.icmp_signed("<", nd, _c(1)), _c(0), m.stride(op, last)) for op in range(operands)]
    outer = _slot(b, _c(1))
    b.store(_c(1), outer)
    with _Loop(b, last) as d:
        b.store(b.mul(b.load(outer), m.size(d)), outer)
    offs = [_slot(b, _c(0)) for _ in range(operands)]
    rem = _slot(b, _c(0))
    with _Loop(b, b.load(outer)) as row:
        for op in range(operands):
            b.store(m.offset(op), offs[op])
        b.store(row, rem)
        with _Loop(b, last) as e:  # dims last - 1 down to 0
            d = b.sub(b.sub(last, _c(1)), e)
            size = m.size(d)
            idx = b.srem(b.load(rem), size)
            b.store(b.sdiv(b.load(rem), size), rem)
            for op in range(operands):
                b.store(b.add(b.load(offs[op]), b.mul(idx, m.stride(op, d))), offs[op])
        body(row, [b.load(o) for o in offs], inner, strides)


def _gather(b, base, at, stride):
    """16 floats base[at + stride * j], j < 16 (contiguous when stride is 1: one load)."""
    contiguous = b.icmp_signed("==", stride, _c(1))
    v = _slot(b, ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES))
    with b.if_else(contiguous) as (then, otherwise):
        with then:
            b.store(_vload(b, base, at), v)
        with otherwise:
            g = ir.Constant(_VF, ir.Undefined)
            for j in range(LANES):
                g = b.insert_element(g, b.load(b.gep(base, [b.add(at, b.mul(stride, _c(j)))])), ir.Constant(_I32, j))
            b.store(g, v)
    return b.load(v)


def _elementwise(b, m, inputs, out, fn):
    """out[i] = fn(<16 x float> of each input at element i) over the meta's shape."""
    def body(row, offs, inner, strides):
        dst = b.gep(out, [b.mul(row, inner)])
        full = _full(b, inner)
        with _Loop(b, full, step=LANES) as j:
            vs = [_gather(b, x, b.add(o, b.mul(j, s)), s) for x, o, s in zip(inputs, offs, strides)]
            _vstore(b, fn(*vs), dst, j)
        with _Loop(b, inner, start=full) as j:
            vs = [_splat(b, b.load(b.gep(x, [b.add(o, b.mul(j, s))])), LANES) for x, o, s in zip(inputs, offs, strides)]
            b.store(b.extract_element(fn(*vs), ir.Constant(_I32, 0)), b.gep(dst, [j]))
    _rows_of(b, m, len(inputs), body)


def _switch(b, op, cases, module_name):
    """One block per op code (cases: {code: emit()}); an unknown code traps."""
    done = b.append_basic_block(f"{module_name}_done")
    bad = b.append_basic_block(f"{module_name}_bad_op")
    switch = b.switch(op, bad)
    for code, emit in cases.items():
        block = b.append_basic_block(f"{module_name}_{code}")
        switch.add_case(ir.Constant(_I32, code), block)
        b.position_at_end(block)
        emit()
        b.branch(done)
    b.position_at_end(bad)
    _intrinsic(b, "llvm.trap", ir.VoidType(), [])
    b.unreachable()
    b.position_at_end(done)


def _exp(b, v):
    return vector_ir._vector_exp(b, v)


def _unary_fns(b, a0, a1):
    zero, one = _vc(0.0), _vc(1.0)

    def vf(name, v):
        return _intrinsic(b, f"llvm.{name}.v{LANES}f32", _VF, [v])

    def sigmoid(v):
        return b.fdiv(one, b.fadd(one, _exp(b, b.fsub(zero, v))))

    def tanh(v):  # 1 - 2 / (e^2x + 1): exact limits (+-1) where e^2x overflows or vanishes
        return b.fsub(one, b.fdiv(_vc(2.0), b.fadd(_exp(b, b.fmul(v, _vc(2.0))), one)))

    def gelu_tanh(v):
        inner = b.fmul(_vc(0.7978845608028654), b.fadd(v, b.fmul(_vc(0.044715), b.fmul(v, b.fmul(v, v)))))
        return b.fmul(b.fmul(_vc(0.5), v), b.fadd(one, tanh(inner)))

    def sign(v):
        pos = b.select(b.fcmp_ordered(">", v, zero), one, zero)
        s = b.select(b.fcmp_ordered("<", v, zero), _vc(-1.0), pos)
        return b.select(b.fcmp_unordered("uno", v, v), v, s)

    def clamp(v):
        low = b.select(b.fcmp_ordered("<", v, _splat(b, a0, LANES)), _splat(b, a0, LANES), v)
        return b.select(b.fcmp_ordered(">", low, _splat(b, a1, LANES)), _splat(b, a1, LANES), low)
    return {
        "neg": lambda v: b.fsub(_vc(-0.0), v),
        "abs": lambda v: vf("fabs", v),
        "exp": lambda v: _exp(b, v),
        "sqrt": lambda v: vf("sqrt", v),
        "rsqrt": lambda v: b.fdiv(one, vf("sqrt", v)),
        "tanh": tanh,
        "sigmoid": sigmoid,
        "relu": lambda v: b.select(b.fcmp_ordered(">", v, zero), v, b.select(b.fcmp_unordered("uno", v, v), v, zero)),
        "gelu": lambda v: _gelu(b, v),
        "gelu_tanh": gelu_tanh,
        "silu": lambda v: _silu(b, v),
        "square": lambda v: b.fmul(v, v),
        "reciprocal": lambda v: b.fdiv(one, v),
        "floor": lambda v: vf("floor", v),
        "ceil": lambda v: vf("ceil", v),
        "round": lambda v: vf("roundeven", v),
        "sign": sign,
        "clamp": clamp,
        "affine": lambda v: b.fadd(b.fmul(v, _splat(b, a0, LANES)), _splat(b, a1, LANES)),
    }


def _unary(module):
    b, (op, x, out, meta, a0, a1) = _function(
        module, "unary_f32", [(_I32, None), (_P32, _F32), (_P32, _F32), (_P32, _I32), (_F32, None), (_F32, None)])
    m = _Meta(b, meta)
    fns = _unary_fns(b, a0, a1)
    _switch(b, op, {code: (lambda f=fns[name]: _elementwise(b, m, [x], out, f)) for name, code in UNARY_OPS.items()},
            "unary")
    b.ret_void()


def _binary(module):
    b, (op, x, y, out, meta) = _function(
        module, "binary_f32", [(_I32, None), (_P32, _F32), (_P32, _F32), (_P32, _F32), (_P32, _I32)])
    m = _Meta(b, meta)

    def maximum(u, v):  # numpy's: a NaN on either side wins
        return _intrinsic(b, f"llvm.maximum.v{LANES}f32", _VF, [u, v])

    def minimum(u, v):
        return _intrinsic(b, f"llvm.minimum.v{LANES}f32", _VF, [u, v])
    fns = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv, "maximum": maximum, "minimum": minimum}
    _switch(b, op, {code: (lambda f=fns[name]: _elementwise(b, m, [x, y], out, f))
                    for name, code in BINARY_OPS.items()}, "binary")
    b.ret_void()


def _reduce(module):
    """Over the last dim: sum (and mean: sum / n) in 16 float32 lanes, then the lanes summed;
    prod likewise; max and min by llvm.maximum / minimum (a NaN wins, as numpy's)."""
    b, (op, x, meta, out) = _function(module, "reduce_f32", [(_I32, None), (_P32, _F32), (_P32, _I32), (_P32, _F32)])
    m = _Meta(b, meta)
    inf = float("inf")
    kinds = {  # name: (lane identity, combine, final lane reduction)
        "sum": (0.0, b.fadd, "fadd"), "mean": (0.0, b.fadd, "fadd"), "prod": (1.0, b.fmul, "fmul"),
        "max": (-inf, lambda u, v: _intrinsic(b, f"llvm.maximum.v{LANES}f32", _VF, [u, v]), "fmaximum"),
        "min": (inf, lambda u, v: _intrinsic(b, f"llvm.minimum.v{LANES}f32", _VF, [u, v]), "fminimum"),
    }

    def emit(name):
        identity, combine, final = kinds[name]
        acc = _slot(b, _vc(identity))

        def body(row, offs, inner, strides):
            b.store(_vc(identity), acc)
            full = _full(b, inner)
            with _Loop(b, full, step=LANES) as j:
                b.store(combine(b.load(acc), _gather(b, x, b.add(offs[0], b.mul(j, strides[0])), strides[0])), acc)
            with _Loop(b, inner, start=full) as j:
                v = b.load(b.gep(x, [b.add(offs[0], b.mul(j, strides[0]))]))
                lane0 = b.insert_element(_vc(identity), v, ir.Constant(_I32, 0))
                b.store(combine(b.load(acc), lane0), acc)
            v = b.load(acc)
            if final in ("fadd", "fmul"):
                total = b.extract_element(v, ir.Constant(_I32, 0))
                for lane in range(1, LANES):
                    total = getattr(b, final)(total, b.extract_element(v, ir.Constant(_I32, lane)))
            else:
                total = _intrinsic(b, f"llvm.vector.reduce.{final}.v{LANES}f32", _F32, [v])
            if name == "mean":
                total = b.fdiv(total, b.sitofp(inner, _F32))
            b.store(total, b.gep(out, [row]))
        _rows_of(b, m, 1, body)
    _switch(b, op, {code: (lambda name=name: emit(name)) for name, code in REDUCE_OPS.items()}, "reduce")
    b.ret_void()


def add_kernels(module):
    """Add this file's kernels (softmax and gemm_f32 must be in the module already: they call them)."""
    module.globals["gemm_f32"].attributes.add("noinline")
    module.globals["softmax"].attributes.add("noinline")
    _conv1d(module)
    _softmax_rows(module)
    _layer_norm_rows(module)
    _f16_to_f32(module)
    _f32_to_f16(module)
    _rows(module, "rows_f32", _F32, lambda b, v: v)
    _rows(module, "rows_f16", _I16, _f16_widen)
    _unary(module)
    _binary(module)
    _reduce(module)
