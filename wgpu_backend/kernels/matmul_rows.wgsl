// y (batch, M, N) = a (batch, M, K) . b when a's rows and b's columns are both
// contiguous along K (x . w^T of a Linear layer, q . k^T of attention), read
// as vec4s; K % 4 == 0 and every row start is a multiple of 4. Each
// invocation computes a 4x4 block of y: 8 vec4 loads per 64 multiply-adds.
// Same parameters as matmul.wgsl.
@group(0) @binding(1) var<storage, read> a: array<vec4<SX>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<SX>>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

fn av(i: u32) -> vec4<f32> { return vec4<f32>(a[i]); }
fn bv(i: u32) -> vec4<f32> { return vec4<f32>(b[i]); }

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let m = P(0u);
    let nn = P(1u);
    let k4 = P(2u) / 4u;
    let row0 = g.y * 4u;
    let col0 = g.x * 4u;
    if (row0 >= m || col0 >= nn) { return; }
    let bi = g.z;
    // Edge blocks clamp their loads and drop the extra results at the end.
    let rows = min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(m - 1u));
    let cols = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u));
    let ar = (vec4<u32>(P(4u) + bi * P(5u)) + rows * P(6u)) / 4u;
    let bc = (vec4<u32>(P(8u) + bi * P(9u)) + cols * P(11u)) / 4u;
    // 16 named accumulators: an indexed array would live in memory, not registers.
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0); var c02 = vec4<f32>(0.0); var c03 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0); var c12 = vec4<f32>(0.0); var c13 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0); var c22 = vec4<f32>(0.0); var c23 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0); var c32 = vec4<f32>(0.0); var c33 = vec4<f32>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let b0 = bv(bc.x + k); let b1 = bv(bc.y + k); let b2 = bv(bc.z + k); let b3 = bv(bc.w + k);
        let a0 = av(ar.x + k);
        c00 += a0 * b0; c01 += a0 * b1; c02 += a0 * b2; c03 += a0 * b3;
        let a1 = av(ar.y + k);
        c10 += a1 * b0; c11 += a1 * b1; c12 += a1 * b2; c13 += a1 * b3;
        let a2 = av(ar.z + k);
        c20 += a2 * b0; c21 += a2 * b1; c22 += a2 * b2; c23 += a2 * b3;
        let a3 = av(ar.w + k);
        c30 += a3 * b0; c31 += a3 * b1; c32 += a3 * b2; c33 += a3 * b3;
    }
    let one = vec4<f32>(1.0);
    let sums = array<vec4<f32>, 4>(
        vec4<f32>(dot(c00, one), dot(c01, one), dot(c02, one), dot(c03, one)),
        vec4<f32>(dot(c10, one), dot(c11, one), dot(c12, one), dot(c13, one)),
        vec4<f32>(dot(c20, one), dot(c21, one), dot(c22, one), dot(c23, one)),
        vec4<f32>(dot(c30, one), dot(c31, one), dot(c32, one), dot(c33, one)));
    let out = bi * m * nn;
    for (var r = 0u; r < min(4u, m - row0); r = r + 1u) {
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            y[out + (row0 + r) * nn + col0 + c] = sx(sums[r][c]);
        }
    }
}
