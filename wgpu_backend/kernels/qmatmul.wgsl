// y (M, N) = x (M, K) . w^T with w (N, K) in a GGUF block format, dequantised
// 4 elements at a time inside the kernel. One invocation per output column
// and 4 rows of x (the dequantised block is reused for all 4).
// P: 0 M, 1 N, 2 K, 3 bytes per row of w, 4 x offset (elements).
@group(0) @binding(2) var<storage, read> x: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

fn xq(i: u32) -> vec4<f32> { return vec4<f32>(lx(x[i]), lx(x[i + 1u]), lx(x[i + 2u]), lx(x[i + 3u])); }

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
    let x0 = P(4u) + m0 * kk;
    // Rows past the end reuse the last row's x and are not written.
    let xr = vec4<u32>(x0, x0 + min(1u, rows - 1u) * kk, x0 + min(2u, rows - 1u) * kk, x0 + min(3u, rows - 1u) * kk);
    var acc = vec4<f32>(0.0);
    for (var s = 0u; s < kk / 32u; s = s + 1u) {
        let sc = q_scales(row, s);
        for (var k = 0u; k < 8u; k = k + 1u) {
            let wv = q_quad(row, s, k, sc);
            let e = s * 32u + 4u * k;
            acc.x = acc.x + dot(wv, xq(xr.x + e));
            acc.y = acc.y + dot(wv, xq(xr.y + e));
            acc.z = acc.z + dot(wv, xq(xr.z + e));
            acc.w = acc.w + dot(wv, xq(xr.w + e));
        }
    }
    for (var r = 0u; r < rows; r = r + 1u) { y[(m0 + r) * nn + col] = sx(acc[r]); }
}
