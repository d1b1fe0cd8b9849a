// A gate/up projection with its GLU for a few rows of x (decoding): y (M, N) =
// act(x . gate^T) * (x . up^T) where w = [gate; up] holds 2N rows of K in a GGUF block
// format. As qmatvec.wgsl (same input includes and parameters, N the output columns), one
// invocation per 4 output columns, now 4 gate and 4 up rows sharing each block of x.
// #include "qmatvec_head.wgsl"

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    // #include "qmatvec_cols.wgsl"
    let gates = cols * rb;
    let ups = (cols + vec4<u32>(nn)) * rb;
    for (var r = 0u; r < P(0u); r = r + 1u) {
        var ga = vec4<f32>(0.0);
        var ua = vec4<f32>(0.0);
        for (var s = 0u; s < kk / 32u; s = s + 1u) {
            load_block(r, s);
            ga = ga + vec4<f32>(q_dot(gates.x, s), q_dot(gates.y, s), q_dot(gates.z, s), q_dot(gates.w, s));
            ua = ua + vec4<f32>(q_dot(ups.x, s), q_dot(ups.y, s), q_dot(ups.z, s), q_dot(ups.w, s));
        }
        // Each projection rounds to the dtype before the product, as the ops apart would.
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            y[r * nn + col0 + c] = sx(lx(sx(act(lx(sx(ga[c]))))) * lx(sx(ua[c])));
        }
    }
}
