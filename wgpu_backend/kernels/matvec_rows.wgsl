// y (batch, 1, N) = act(x (batch, 1, K) . b + bias) where b's columns are contiguous rows
// of K elements (b = w^T of a Linear weight w (N, K)), read as vec4s; K % 4 == 0 and b's
// offsets are multiples of 4. The input row comes from an include: input_strided.wgsl
// (operand a, strided) or norm_input.wgsl (a residual add and norm fused in). One
// invocation per 4 columns: each vec4 of x is loaded once for all 4. Parameters as
// matmul.wgsl, then a Linear layer's bias: P(12) = 1 adds bias[P(13) + c * P(14)] to column c.
// #include "matvec_rows_head.wgsl"
@group(0) @binding(4) var<storage, read> bias: array<SX>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    // #include "matvec_rows_cols.wgsl"
    let bi = w.z;
    let rows = (vec4<u32>(P(8u) + bi * P(9u)) + cols * P(11u)) / 4u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let av = xin4(0u, 4u * k);
        acc0 = acc0 + av * bv(rows.x + k);
        acc1 = acc1 + av * bv(rows.y + k);
        acc2 = acc2 + av * bv(rows.z + k);
        acc3 = acc3 + av * bv(rows.w + k);
    }
    let out = bi * nn;
    let sums = vec4<f32>(dot(acc0, vec4<f32>(1.0)), dot(acc1, vec4<f32>(1.0)), dot(acc2, vec4<f32>(1.0)),
                         dot(acc3, vec4<f32>(1.0)));
    for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
        var v = sums[c];
        // Rounded to the dtype before the bias and the activation, as the ops apart would.
        if (P(12u) == 1u) { v = lx(sx(v)) + lx(bias[P(13u) + (col0 + c) * P(14u)]); }
        y[out + col0 + c] = sx(act(lx(sx(v))));
    }
}
