"""The wasm kernels a decoder layer needs besides the products and the norms (kernels_ir.py):
rotary embedding, the KV-cache write (a copy), attention of new tokens over the cache (one, or
a prompt's t), LayerNorm, the gated activation of a GLU, a residual add. Written with kernels_ir's loop and vector
helpers, in the arithmetic of the CPU device's fused_ops (rope_kv_write, cache_attention).

  rope(x, rows, d, cos, sin, interleaved)   in place: each of `rows` rows of d rotated by cos/sin
                                            (d/2 each); half-split pairs (j, j + d/2), or
                                            interleaved pairs (2j, 2j + 1)
  copy_f32(src, n, dst)                     dst[:n] = src[:n] (a KV-cache slot)
  cache_attention(q, heads, kv_heads, d, kc, vc, capacity, keys, scale, scores, out)
                                            one query row per head over the first `keys` slots of
                                            caches laid out (kv_heads, capacity, d); head h reads
                                            kv head h // (heads / kv_heads) (GQA); scores: `keys`
                                            floats of scratch; out (heads, d)
  rope_seq(x, heads, t, d, cos, sin, interleaved)
                                            rope over (heads, t, d): token i takes cos/sin row i
  cache_attention_rows(q, heads, kv_heads, t, d, kc, vc, capacity, first, scale, scores, out)
                                            t new tokens (a prompt), q and out (heads, t, d): token i
                                            sees the first first + i + 1 slots (causal)
  add_layer_norm(x, r, w, b, d, eps, total, normed)
                                            total = x + r; normed = LayerNorm(total) * w + b for one
                                            row (w or b = 0: none): Whisper's norms
  silu_mul(g, u, n, out)                    out = silu(g) * u (SwiGLU)
  add_f32(a, b, n, out)                     out = a + b
"""
from llvmlite import ir

from .kernels_ir import (_F32, _I32, _I64, _P32, _VF, LANES, _dot, _full, _function, _intrinsic, _Loop, _silu,
                         _slot, _splat, _vload, _vstore)


def _map2(b, x, y, n, dst, fn):
    """dst[i] = fn(x, y) over 16 lanes, the tail through the same function one lane at a time."""
    full = _full(b, n)
    with _Loop(b, full, step=LANES) as i:
        _vstore(b, fn(_vload(b, x, i), _vload(b, y, i)), dst, i)
    with _Loop(b, n, start=full) as i:
        v = fn(_splat(b, b.load(b.gep(x, [i])), LANES), _splat(b, b.load(b.gep(y, [i])), LANES))
        b.store(b.extract_element(v, ir.Constant(_I32, 0)), b.gep(dst, [i]))


def _rope(module):
    b, (x, rows, d, cos, sin, interleaved) = _function(
        module, "rope", [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32), (_I32, _I64)])
    half = b.udiv(d, ir.Constant(_I64, 2))
    one = ir.Constant(_I64, 1)
    paired = b.icmp_unsigned("!=", interleaved, ir.Constant(_I64, 0))
    with _Loop(b, rows) as r:
        row = b.gep(x, [b.mul(r, d)])
        with _Loop(b, half) as j:
            ia = b.select(paired, b.mul(j, ir.Constant(_I64, 2)), j)
            ib = b.select(paired, b.add(b.mul(j, ir.Constant(_I64, 2)), one), b.add(j, half))
            pa, pb = b.gep(row, [ia]), b.gep(row, [ib])
            xa, xb = b.load(pa), b.load(pb)
            c, s = b.load(b.gep(cos, [j])), b.load(b.gep(sin, [j]))
            b.store(b.fsub(b.fmul(xa, c), b.fmul(xb, s)), pa)
            b.store(b.fadd(b.fmul(xb, c), b.fmul(xa, s)), pb)
    b.ret_void()


def _copy(module):
    b, (src, n, dst) = _function(module, "copy_f32", [(_P32, _F32), (_I32, _I64), (_P32, _F32)])
    full = _full(b, n)
    with _Loop(b, full, step=LANES) as i:
        _vstore(b, _vload(b, src, i), dst, i)
    with _Loop(b, n, start=full) as i:
        b.store(b.load(b.gep(src, [i])), b.gep(dst, [i]))
    b.ret_void()


def _cache_attention(module):
    b, (q, heads, kv_heads, d, kc, vc, capacity, keys, scale, scores, out) = _function(
        module, "cache_attention",
        [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32), (_I32, _I64),
         (_I32, _I64), (ir.FloatType(), None), (_P32, _F32), (_P32, _F32)])
    softmax = module.globals["softmax"]
    group = b.udiv(heads, kv_heads)
    full = _full(b, d)
    with _Loop(b, heads) as h:
        base = b.mul(b.mul(b.udiv(h, group), capacity), d)
        keys_h, values_h = b.gep(kc, [base]), b.gep(vc, [base])
        qh, oh = b.gep(q, [b.mul(h, d)]), b.gep(out, [b.mul(h, d)])
        with _Loop(b, keys) as j:
            b.store(b.fmul(_dot(b, qh, b.gep(keys_h, [b.mul(j, d)]), d), scale), b.gep(scores, [j]))
        b.call(softmax, [b.ptrtoint(scores, _I32), b.trunc(keys, _I32)])
        zero_v = ir.Constant(_VF, [ir.Constant(_F32, 0.0)] * LANES)
        with _Loop(b, full, step=LANES) as i:
            _vstore(b, zero_v, oh, i)
        with _Loop(b, d, start=full) as i:
            b.store(ir.Constant(_F32, 0.0), b.gep(oh, [i]))
        with _Loop(b, keys) as j:
            p = b.load(b.gep(scores, [j]))
            row = b.gep(values_h, [b.mul(j, d)])
            pv = _splat(b, p, LANES)
            with _Loop(b, full, step=LANES) as i:
                _vstore(b, _intrinsic(b, "llvm.fmuladd.v16f32", _VF, [pv, _vload(b, row, i), _vload(b, oh, i)]), oh, i)
            with _Loop(b, d, start=full) as i:
                at = b.gep(oh, [i])
                b.store(b.fadd(b.load(at), b.fmul(p, b.load(b.gep(row, [i])))), at)
    b.ret_void()


def _rope_seq(module):
    """rope over (heads, t, d) rows whose token i takes cos/sin row i: a prompt's t tokens."""
    b, (x, heads, t, d, cos, sin, interleaved) = _function(
        module, "rope_seq", [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32),
                             (_I32, _I64)])
    rope = module.globals["rope"]
    half_bytes = b.mul(b.udiv(d, ir.Constant(_I64, 2)), ir.Constant(_I64, 4))
    with _Loop(b, heads) as h:
        with _Loop(b, t) as i:
            row = b.gep(x, [b.mul(b.add(b.mul(h, t), i), d)])
            at = b.mul(i, half_bytes)
            b.call(rope, [b.ptrtoint(row, _I32), ir.Constant(_I32, 1), b.trunc(d, _I32),
                          b.trunc(b.add(b.zext(b.ptrtoint(cos, _I32), _I64), at), _I32),
                          b.trunc(b.add(b.zext(b.ptrtoint(sin, _I32), _I64), at), _I32), b.trunc(interleaved, _I32)])
    b.ret_void()


def _cache_attention_rows(module):
    """t new tokens at once (a prompt): q and out (heads, t, d); token i of the t sees the first
    `first` + i + 1 cache slots (causal), each row through cache_attention's one-token loop."""
    b, (q, heads, kv_heads, t, d, kc, vc, capacity, first, scale, scores, out) = _function(
        module, "cache_attention_rows",
        [(_P32, _F32), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_I32, _I64), (_P32, _F32), (_P32, _F32),
         (_I32, _I64), (_I32, _I64), (ir.FloatType(), None), (_P32, _F32), (_P32, _F32)])
    one_token = module.globals["cache_attention"]
    group = b.udiv(heads, kv_heads)

    def word(v):
        return b.trunc(v, _I32)

    def address(ptr, elements):
        return b.trunc(b.add(b.zext(b.ptrtoint(ptr, _I32), _I64), b.mul(elements, ir.Constant(_I64, 4))), _I32)
    with _Loop(b, heads) as h:
        g = b.udiv(h, group)
        cache = b.mul(b.mul(g, capacity), d)
        with _Loop(b, t) as i:
            row = b.mul(b.add(b.mul(h, t), i), d)
            b.call(one_token, [address(q, row), ir.Constant(_I32, 1), ir.Constant(_I32, 1), word(d),
                               address(kc, cache), address(vc, cache), word(capacity),
                               word(b.add(first, b.add(i, ir.Constant(_I64, 1)))), scale, b.ptrtoint(scores, _I32),
                               address(out, row)])
    b.ret_void()


def _add_layer_norm(module):
    """fused_ops' add + LayerNorm for one row of d: total = x + r; normed = (total - mean) /
    sqrt(var + eps) * w + b (w = 0: no weight; b = 0: no bias); mean and variance in float32 lanes."""
    b, (x, r, w, bias, d, eps, total, normed) = _function(
        module, "add_layer_norm", [(_P32, _F32), (_P32, _F32), (_P32, _F32), (_P32, _F32), (_I32, _I64),
                                   (ir.FloatType(), None), (_P32, _F32), (_P32, _F32)])
    n = b.uitofp(d, _F32)
    _map2(b, x, r, d, total, lambda u, v: b.fadd(u, v))
    acc = _slot(b, ir.Constant(_F32, 0.0))
    with _Loop(b, d) as i:
        b.store(b.fadd(b.load(acc), b.load(b.gep(total, [i]))), acc)
    mean = b.fdiv(b.load(acc), n)
    b.store(ir.Constant(_F32, 0.0), acc)
    with _Loop(b, d) as i:
        c = b.fsub(b.load(b.gep(total, [i])), mean)
        b.store(b.fadd(b.load(acc), b.fmul(c, c)), acc)
    inv = b.fdiv(ir.Constant(_F32, 1.0), _intrinsic(b, "llvm.sqrt.f32", _F32, [b.fadd(b.fdiv(b.load(acc), n), eps)]))
    has_w = b.icmp_unsigned("!=", b.ptrtoint(w, _I32), ir.Constant(_I32, 0))
    has_b = b.icmp_unsigned("!=", b.ptrtoint(bias, _I32), ir.Constant(_I32, 0))
    with _Loop(b, d) as i:
        y = b.fmul(b.fsub(b.load(b.gep(total, [i])), mean), inv)
        out = b.gep(normed, [i])
        b.store(y, out)
        with b.if_then(has_w):
            b.store(b.fmul(b.load(out), b.load(b.gep(w, [i]))), out)
        with b.if_then(has_b):
            b.store(b.fadd(b.load(out), b.load(b.gep(bias, [i]))), out)
    b.ret_void()


def _binary(module, name, fn):
    b, (x, y, n, out) = _function(module, name, [(_P32, _F32), (_P32, _F32), (_I32, _I64), (_P32, _F32)])
    _map2(b, x, y, n, out, lambda u, v: fn(b, u, v))
    b.ret_void()


def add_kernels(module):
    """Add this file's kernels to the module (softmax must be in it already: attention calls it)."""
    _rope(module)
    _copy(module)
    _cache_attention(module)
    _rope_seq(module)
    _cache_attention_rows(module)
    _add_layer_norm(module)
    _binary(module, "silu_mul", lambda b, g, u: b.fmul(_silu(b, g), u))
    _binary(module, "add_f32", lambda b, x, y: b.fadd(x, y))
