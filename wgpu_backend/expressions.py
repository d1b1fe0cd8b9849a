"""The WGSL expressions of wgpu's element-wise kernels: its kernel table for unary, binary and
compare ops (CUDA C / MSL pick the same ops by code: tallow/backends/kernel/host.py). An op is
an expression over the compute values (v for a unary op; p, q for a binary one) that
wgsl.build() specialises into the kernel's text, with the helper functions some need (MATH,
IPOW, F16_BITS) prepended where used.
"""
from tallow.dtypes import bool_

from . import wgsl


def is_nan(x):
    """WGSL: is the f32 x a NaN? By its bits: WGSL's min/max/clamp/sign leave NaN unspecified, and
    drivers may fold `x != x` away. Ops below keep NaN where numpy does."""
    return f"((bitcast<u32>({x}) & 0x7fffffffu) > 0x7f800000u)"


FLOAT_UNARY = {
    "neg": "-v", "abs": "abs(v)", "exp": "exp(v)", "expm1": "expm1_(v)", "log": "log(v)", "sqrt": "sqrt(v)",
    "rsqrt": "1.0 / sqrt(v)", "sin": "sin(v)", "cos": "cos(v)",
    "tanh": f"select(tanh(clamp(v, -15.0, 15.0)), v, {is_nan('v')})", "sigmoid": "1.0 / (1.0 + exp(-v))",
    "relu": f"select(max(v, 0.0), v, {is_nan('v')})", "gelu": "0.5 * v * erfc_(-v * 0.70710678118654752)",
    "gelu_tanh": "0.5 * v * (1.0 + tanh(clamp(0.79788456080286536 * (v + 0.044715 * v * v * v), -15.0, 15.0)))",
    "silu": "v / (1.0 + exp(-v))", "square": "v * v", "reciprocal": "1.0 / v", "floor": "floor(v)",
    "ceil": "ceil(v)", "round": "round(v)", "sign": f"select(sign(v), v, {is_nan('v')})",
    "logical_not": "select(0u, 1u, v == 0.0)",
    "clamp_lo": f"select(max(v, PF(37u)), v, {is_nan('v')})", "clamp_hi": f"select(min(v, PF(38u)), v, {is_nan('v')})",
    "clamp": f"select(min(max(v, PF(37u)), PF(38u)), v, {is_nan('v')})",
    "pow_scalar": "powf(v, PF(37u))", "affine": "v * PF(37u) + PF(38u)", "identity": "v",
}
INT_UNARY = {
    "neg": "CX(0) - v", "abs": "abs(v)", "relu": "max(v, CX(0))", "square": "v * v", "floor": "v", "ceil": "v",
    "round": "v", "sign": "select(select(CX(0), CX(1), v > CX(0)), CX(-1), v < CX(0))",
    "logical_not": "select(0u, 1u, v == CX(0))", "identity": "v",
    "clamp_lo": "max(v, CX(PI(37u)))", "clamp_hi": "min(v, CX(PI(38u)))",
    "clamp": "min(max(v, CX(PI(37u))), CX(PI(38u)))", "pow_scalar": "ipow(v, CX(PI(37u)))",
    "affine": "v * CX(PI(37u)) + CX(PI(38u))",
}
FLOAT_BINARY = {"add": "p + q", "sub": "p - q", "mul": "p * q", "div": "p / q", "pow": "powf(p, q)",
                 "maximum": f"select(max(p, q), p + q, {is_nan('p')} || {is_nan('q')})",
                 "minimum": f"select(min(p, q), p + q, {is_nan('p')} || {is_nan('q')})"}
INT_BINARY = {"add": "p + q", "sub": "p - q", "mul": "p * q", "div": "p / q", "pow": "ipow(p, q)",
               "maximum": "max(p, q)", "minimum": "min(p, q)"}
# i64 is kept as i32 on the GPU: these ops can carry an i64 result past the i32 range, so they run
# exactly on the host (WgpuBackend._exact_i64), as do integer sums/cumsums of 32-bit inputs (their
# result is i64) and integer products. Sums of fewer than SMALL_INT_SUMS 8/16-bit values always fit.
I64_MAY_OVERFLOW = frozenset({"neg", "abs", "square", "pow_scalar", "affine", "add", "sub", "mul", "div", "pow"})
SMALL_INT_SUMS = 1 << 23
# ne as !(p == q): true for a NaN operand on every driver (lavapipe's p != q is the ordered compare).
COMPARE = {"eq": "p == q", "ne": "!(p == q)", "lt": "p < q", "le": "p <= q", "gt": "p > q", "ge": "p >= q"}

# Helpers some ops need, prepended to the kernel when used.
MATH = """
// erfc with fractional error < 1.2e-7 everywhere (Numerical Recipes' erfcc),
// so gelu stays accurate in its far negative tail; WGSL has no erf.
fn erfc_(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
            t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
            t * (-0.82215223 + t * 0.17087277)))))))));
    return select(2.0 - r, r, x >= 0.0);
}
// expm1: a Taylor polynomial below |v| = 0.5, where exp(v) - 1 loses digits (f32 error < 1 ulp;
// not Kahan's um1 * v / log(u): adapters' log near 1 is too coarse for it).
fn expm1_(v: f32) -> f32 {
    if (abs(v) < 0.5) {
        return v * (1.0 + v * (0.5 + v * (1.0 / 6.0 + v * (1.0 / 24.0 + v * (1.0 / 120.0 + v * (1.0 / 720.0
               + v * (1.0 / 5040.0 + v * (1.0 / 40320.0 + v / 362880.0))))))));
    }
    return exp(v) - 1.0;
}
// pow as numpy: negative bases only with integral exponents.
fn powf(a: f32, b: f32) -> f32 {
    if (b == 0.0 || a == 1.0) { return 1.0; }
    if ((bitcast<u32>(a) & 0x7fffffffu) > 0x7f800000u || (bitcast<u32>(b) & 0x7fffffffu) > 0x7f800000u) {
        return f32_nan();
    }
    if (a > 0.0) { return pow(a, b); }
    if (a == 0.0) { return select(f32_inf(), 0.0, b > 0.0); }
    if (floor(b) != b) { return f32_nan(); }
    let r = pow(-a, b);
    return select(r, -r, fract(b * 0.5) != 0.0);
}
"""
# The f16 bits of v, which holds an f16 value exactly (f16 lives as f32 on an adapter without
# shader-f16). Not pack2x16float: SwiftShader (Chrome without a GPU) makes inf a NaN there.
F16_BITS = """
fn f16_bits(v: f32) -> u32 {
    let u = bitcast<u32>(v);
    let sign = (u >> 16u) & 0x8000u;
    let a = u & 0x7fffffffu;
    if (a > 0x7f800000u) { return sign | 0x7e00u; }  // NaN
    if (a >= 0x47800000u) { return sign | 0x7c00u; }  // beyond f16: infinity
    if (a < 0x38800000u) { return sign | u32(bitcast<f32>(a) * 16777216.0); }  // subnormal: a multiple of 2**-24
    return sign | (((a >> 23u) - 112u) << 10u) | ((a >> 13u) & 0x3ffu);
}
"""
IPOW = """
fn ipow(a: CX, e: CX) -> CX {
    var r = CX(1);
    var base = a;
    var k = e;
    if (k < CX(0)) { return CX(0); }
    loop {
        if (k == CX(0)) { break; }
        if ((k & CX(1)) == CX(1)) { r = r * base; }
        base = base * base;
        k = k >> 1u;
    }
    return r;
}
"""


def convert_expr(src, dst):
    """WGSL turning a compute value v of dtype src into dst's compute type."""
    if dst is bool_:
        return "select(0u, 1u, v != CX(0))"
    cs, cd = wgsl.compute_type(src), wgsl.compute_type(dst)
    if cs == cd:
        return "v"
    if cs == "f32":
        if cd == "i32":
            return "i32(trunc(v))"
        return "select(u32(trunc(v)), bitcast<u32>(i32(trunc(v))), v < 0.0)"  # negative -> two's complement
    if cd == "f32":
        return "f32(v)"
    return f"bitcast<{cd}>(v)"
