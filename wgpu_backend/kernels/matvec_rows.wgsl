// y (batch, 1, N) = a (batch, 1, K) . b where b's columns are contiguous rows
// of K elements (b = w^T of a Linear weight w (N, K)), read as vec4s; K % 4 == 0
// and b's offsets are multiples of 4. One invocation per 4 columns: each vec4
// of a is loaded once for all 4. Same parameters as matmul.wgsl, then a Linear
// layer's bias: P(12) = 1 adds bias[P(13) + c * P(14)] to column c.
@group(0) @binding(1) var<storage, read> a: array<SX>;
@group(0) @binding(2) var<storage, read> b: array<vec4<SX>>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;
@group(0) @binding(4) var<storage, read> bias: array<SX>;

fn bv(i: u32) -> vec4<f32> { return vec4<f32>(b[i]); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let nn = P(1u);
    let k4 = P(2u) / 4u;
    let col0 = (w.x + w.y * n.x) * 256u + l * 4u;
    if (col0 >= nn) { return; }
    let bi = w.z;
    let a_base = P(4u) + bi * P(5u);
    let a_cs = P(7u);
    // Columns past the end repeat the last one and are not written.
    let cols = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u));
    let rows = (vec4<u32>(P(8u) + bi * P(9u)) + cols * P(11u)) / 4u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k = 0u; k < k4; k = k + 1u) {
        let ai = a_base + 4u * k * a_cs;
        let av = vec4<f32>(lx(a[ai]), lx(a[ai + a_cs]), lx(a[ai + 2u * a_cs]), lx(a[ai + 3u * a_cs]));
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
        // Rounded to the dtype before the bias, as a matmul and an add apart would.
        if (P(12u) == 1u) { v = lx(sx(v)) + lx(bias[P(13u) + (col0 + c) * P(14u)]); }
        y[out + col0 + c] = sx(v);
    }
}
