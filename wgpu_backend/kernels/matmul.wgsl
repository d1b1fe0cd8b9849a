// Batched strided matmul y (batch, M, N) = a (batch, M, K) . b (batch, K, N).
// Each invocation computes a 4x4 block of y in registers (no shared memory, no
// barriers: on CPU-emulated adapters barrier tiling is ~10x slower).
// P(0..3) M N K batch; a: P(4..7) offset, batch/row/col strides; b: P(8..11).
@group(0) @binding(1) var<storage, read> a: array<SX>;
@group(0) @binding(2) var<storage, read> b: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(8, 8, 1)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let row0 = g.y * 4u;
    let col0 = g.x * 4u;
    if (row0 >= m || col0 >= nn) { return; }
    let bi = i32(g.z);
    let a_base = PI(4u) + bi * PI(5u);
    let a_rs = PI(6u);
    let a_cs = PI(7u);
    let b_base = PI(8u) + bi * PI(9u);
    let b_rs = PI(10u);
    let b_cs = PI(11u);
    // Edge blocks clamp their loads and drop the extra results at the end.
    let ar = vec4<i32>(a_base) + vec4<i32>(min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(m - 1u))) * a_rs;
    let bc = vec4<i32>(b_base) + vec4<i32>(min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u))) * b_cs;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0; k < i32(kk); k = k + 1) {
        let bo = bc + vec4<i32>(k * b_rs);
        // f32(...) makes integer operands explicit: WGSL has no implicit int -> float conversion.
        let bv = vec4<f32>(f32(lx(b[bo.x])), f32(lx(b[bo.y])), f32(lx(b[bo.z])), f32(lx(b[bo.w])));
        let ao = ar + vec4<i32>(k * a_cs);
        acc0 = acc0 + f32(lx(a[ao.x])) * bv;
        acc1 = acc1 + f32(lx(a[ao.y])) * bv;
        acc2 = acc2 + f32(lx(a[ao.z])) * bv;
        acc3 = acc3 + f32(lx(a[ao.w])) * bv;
    }
    let out = u32(bi) * m * nn;
    let rows = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var r = 0u; r < 4u; r = r + 1u) {
        if (row0 + r < m) {
            for (var c = 0u; c < 4u; c = c + 1u) {
                if (col0 + c < nn) { y[out + (row0 + r) * nn + col0 + c] = sx(CX(rows[r][c])); }
            }
        }
    }
}
