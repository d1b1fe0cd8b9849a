// A gate/up projection with its GLU, for one row x: y (1, N) = act(x . g) * (x . u)
// where b = [g | u] holds 2N columns, each a contiguous row of K elements (b = w^T of
// the [gate; up] rows w (2N, K)), read as vec4s; K % 4 == 0 and b's offsets are
// multiples of 4. The input row comes from an include, as in matvec_rows.wgsl. One
// invocation per 4 output columns: 4 gate and 4 up dot products share each vec4 of x.
// Parameters as matmul.wgsl, N being the output columns.
// #include "matvec_rows_head.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    // #include "matvec_rows_cols.wgsl"
    let g = (vec4<u32>(P(8u)) + cols * P(11u)) / 4u;
    let u = (vec4<u32>(P(8u)) + (cols + vec4<u32>(nn)) * P(11u)) / 4u;
    var g0 = vec4<f32>(0.0);
    var g1 = vec4<f32>(0.0);
    var g2 = vec4<f32>(0.0);
    var g3 = vec4<f32>(0.0);
    var u0 = vec4<f32>(0.0);
    var u1 = vec4<f32>(0.0);
    var u2 = vec4<f32>(0.0);
    var u3 = vec4<f32>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let av = xin4(0u, 4u * k);
        g0 = g0 + av * bv(g.x + k);
        g1 = g1 + av * bv(g.y + k);
        g2 = g2 + av * bv(g.z + k);
        g3 = g3 + av * bv(g.w + k);
        u0 = u0 + av * bv(u.x + k);
        u1 = u1 + av * bv(u.y + k);
        u2 = u2 + av * bv(u.z + k);
        u3 = u3 + av * bv(u.w + k);
    }
    let one = vec4<f32>(1.0);
    let gs = vec4<f32>(dot(g0, one), dot(g1, one), dot(g2, one), dot(g3, one));
    let us = vec4<f32>(dot(u0, one), dot(u1, one), dot(u2, one), dot(u3, one));
    // Each projection rounds to the dtype before the product, as the ops apart would.
    for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
        y[col0 + c] = sx(lx(sx(act(lx(sx(gs[c]))))) * lx(sx(us[c])));
    }
}
