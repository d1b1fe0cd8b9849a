// A gate/up projection with its GLU for a few rows of x (decoding): y (M, N) =
// act(x . gate^T) * (x . up^T) where w = [gate; up] holds 2N rows of K in a GGUF block
// format. As qmatvec.wgsl (same input includes and parameters, N the output columns), one
// invocation per 4 output columns, now 4 gate and 4 up rows sharing each block of x.
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

fn act(v: f32) -> f32 { return {{ACT}}; }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    input_begin(w, n, l);
    let nn = P(1u);
    let kk = P(2u);
    let col0 = flat_id(w, n, l, 64u) * 4u;
    if (col0 >= nn) { return; }
    let rb = P(3u);
    // Columns past the end repeat the last one and are not written.
    let cols = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u));
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
