// Matmul with M == 1 (one token decoding): y (batch, 1, N), one invocation per
// output column walking K. Same parameters as matmul.wgsl.
@group(0) @binding(1) var<storage, read> a: array<SX>;
@group(0) @binding(2) var<storage, read> b: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let nn = P(1u);
    let kk = i32(P(2u));
    let col = g.x;
    if (col >= nn) { return; }
    let bi = i32(g.z);
    let a_base = PI(4u) + bi * PI(5u);
    let a_cs = PI(7u);
    let b_base = PI(8u) + bi * PI(9u) + i32(col) * PI(11u);
    let b_rs = PI(10u);
    // Four partial sums break the add dependency chain.
    var acc = vec4<f32>(0.0);
    var k = 0;
    for (; k + 4 <= kk; k = k + 4) {
        let av = vec4<f32>(lx(a[a_base + k * a_cs]), lx(a[a_base + (k + 1) * a_cs]),
                           lx(a[a_base + (k + 2) * a_cs]), lx(a[a_base + (k + 3) * a_cs]));
        let bv = vec4<f32>(lx(b[b_base + k * b_rs]), lx(b[b_base + (k + 1) * b_rs]),
                           lx(b[b_base + (k + 2) * b_rs]), lx(b[b_base + (k + 3) * b_rs]));
        acc = acc + av * bv;
    }
    var total = acc.x + acc.y + acc.z + acc.w;
    for (; k < kk; k = k + 1) { total = total + lx(a[a_base + k * a_cs]) * lx(b[b_base + k * b_rs]); }
    y[u32(bi) * nn + col] = sx(total);
}
