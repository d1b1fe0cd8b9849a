// Shared by every kernel: the per-dispatch parameters and strided indexing.
//
// Parameters are 64 u32 words in a uniform slice. Kernels that walk a strided
// layout use the "element-wise layout": P(0) element count, P(1) ndim (<= 8),
// P(2..9) the shape, then for operand j (0..2) at 10 + 9j: its offset and its
// 8 strides (in elements, as i32). Kernel-specific scalars start at P(37).
@group(0) @binding(0) var<uniform> params: array<vec4<u32>, 16>;

fn P(i: u32) -> u32 { return params[i >> 2u][i & 3u]; }
fn PI(i: u32) -> i32 { return bitcast<i32>(P(i)); }
fn PF(i: u32) -> f32 { return bitcast<f32>(P(i)); }

// Flat index of this invocation in a 1-D or (beyond 65535 workgroups) 2-D grid.
fn flat_id(w: vec3<u32>, n: vec3<u32>, l: u32, size: u32) -> u32 {
    return (w.x + w.y * n.x) * size + l;
}

// Storage offset of element i (row-major over the shape) of operand j.
fn at(i: u32, j: u32) -> u32 {
    let base = 10u + 9u * j;
    var rem = i;
    var off = PI(base);
    for (var d = P(1u); d > 0u; d = d - 1u) {
        let s = P(1u + d);
        off = off + i32(rem % s) * PI(base + d);
        rem = rem / s;
    }
    return u32(off);
}

// Read from private variables: Chromium's compiler (Tint) rejects a NaN/inf constant expression.
var<private> NAN_BITS: u32 = 0x7fc00000u;
var<private> INF_BITS: u32 = 0x7f800000u;
fn f32_nan() -> f32 { return bitcast<f32>(NAN_BITS); }
fn f32_inf() -> f32 { return bitcast<f32>(INF_BITS); }

// bf16 values live on the GPU as f32 rounded (nearest-even) to bf16 precision.
fn round_bf16(v: f32) -> f32 {
    if (v != v) { return v; }
    let u = bitcast<u32>(v);
    return bitcast<f32>((u + 0x7fffu + ((u >> 16u) & 1u)) & 0xffff0000u);
}

// f16 values on an adapter without shader-f16 live as f32 rounded to f16. Beyond f16's range
// pack2x16float is the driver's choice (SwiftShader: NaN for 1e5); numpy gives +-inf from 65520 up.
fn round_f16(v: f32) -> f32 {
    if (abs(v) >= 65520.0) { return sign(v) * f32_inf(); }
    return unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
}
