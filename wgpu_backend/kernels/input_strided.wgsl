// The input rows of the matvec kernels (matvec_rows*, qmatvec*) read straight from operand a at
// binding 2: element i of row `row` at a[P(4) + batch * P(5) + row * P(6) + i * P(7)], the
// batch being the workgroup's z (the matmul words). norm_input.wgsl is the other source.
@group(0) @binding(2) var<storage, read> a: array<SX>;

var<private> in_base: u32;

fn input_begin(w: vec3<u32>, n: vec3<u32>, l: u32) { in_base = P(4u) + w.z * P(5u); }

fn xin4(row: u32, i: u32) -> vec4<f32> {
    let cs = P(7u);
    let o = in_base + row * P(6u) + i * cs;
    return vec4<f32>(lx(a[o]), lx(a[o + cs]), lx(a[o + 2u * cs]), lx(a[o + 3u * cs]));
}
