// y (M, N) = x (M, K) . w^T with w (N, K) in a GGUF block format, dequantised
// 32 elements at a time inside the kernel. One invocation per output column
// and 4 rows of x (the dequantised block is reused for all 4).
// P: 0 M, 1 N, 2 K, 3 bytes per row of w, 4 x offset (elements).
@group(0) @binding(2) var<storage, read> x: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let col = g.x;
    let m0 = g.y * 4u;
    if (col >= nn || m0 >= m) { return; }
    let rows = min(4u, m - m0);
    let row = col * P(3u);
    var vals: array<f32, 32>;
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < kk / 32u; s = s + 1u) {
        deq32(row, s, &vals);
        for (var r = 0u; r < rows; r = r + 1u) {
            let xb = P(4u) + (m0 + r) * kk + s * 32u;
            var t = vec4<f32>(0.0);
            for (var e = 0u; e < 32u; e = e + 4u) {
                t = t + vec4<f32>(vals[e], vals[e + 1u], vals[e + 2u], vals[e + 3u]) *
                        vec4<f32>(lx(x[xb + e]), lx(x[xb + e + 1u]), lx(x[xb + e + 2u]), lx(x[xb + e + 3u]));
            }
            acc[r] = acc[r] + t.x + t.y + t.z + t.w;
        }
    }
    for (var r = 0u; r < rows; r = r + 1u) { y[(m0 + r) * nn + col] = sx(acc[r]); }
}
