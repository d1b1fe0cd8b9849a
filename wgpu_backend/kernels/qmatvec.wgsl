// y (M, N) = act(x (M, K) . w^T + bias) for a few rows of x (decoding: M = 1), with w
// (N, K) in a GGUF block format. The input rows come from an include: input_strided.wgsl
// or norm_input.wgsl (one row with a residual add and norm fused in). One invocation per
// 4 output columns walks their weight rows block by block: x's 32 elements of a block are
// loaded once into xb (qmatvec_block.wgsl) and the format's q_dot gives each column's dot
// product with them. On CPU-emulated adapters every load costs about the same per lane, so
// sharing x between 4 columns saves most of them.
// P: 0 M, 1 N, 2 K, 3 bytes per row of w, then x's layout as matmul.wgsl's a: 4 offset,
// 5 batch stride (0), 6 row stride, 7 column stride; a Linear layer's bias: P(12) = 1 adds
// bias[P(13) + c * P(14)] to column c.
// #include "qmatvec_head.wgsl"
@group(0) @binding(4) var<storage, read> bias: array<SX>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    // #include "qmatvec_cols.wgsl"
    let rows = cols * rb;
    for (var r = 0u; r < P(0u); r = r + 1u) {
        var acc = vec4<f32>(0.0);
        for (var s = 0u; s < kk / 32u; s = s + 1u) {
            load_block(r, s);
            acc = acc + vec4<f32>(q_dot(rows.x, s), q_dot(rows.y, s), q_dot(rows.z, s), q_dot(rows.w, s));
        }
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            var v = acc[c];
            // Rounded to the dtype before the bias and the activation, as the ops apart would.
            if (P(12u) == 1u) { v = lx(sx(v)) + lx(bias[P(13u) + (col0 + c) * P(14u)]); }
            y[r * nn + col0 + c] = sx(act(lx(sx(v))));
        }
    }
}
