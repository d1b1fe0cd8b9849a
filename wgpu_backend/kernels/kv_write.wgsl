// A KV-cache write in one dispatch: k into its cache slot kc, v into vc. One invocation
// per element of k, then of v. P: 0 elements of k, 1 elements of v, 2..5 k's shape
// (batch, heads, positions, features), 6..9 v's. Operands, offset then 4 strides in
// elements: k at 10, v at 15, the key cache slot at 20, the value cache slot at 25.
// The slots are step_position() positions further on: 0 eagerly; in a captured step
// (wgpu_backend/recording.py) the step's position, read from the step buffer.
@group(0) @binding(1) var<storage, read> k: array<SX>;
@group(0) @binding(2) var<storage, read> v: array<SX>;
@group(0) @binding(3) var<storage, read_write> kc: array<SX>;
@group(0) @binding(4) var<storage, read_write> vc: array<SX>;

// Storage offset of element i (row-major over the shape at word sh) of the operand at word w.
fn el(i: u32, sh: u32, w: u32) -> u32 {
    var rem = i;
    var off = PI(w);
    for (var j = 0u; j < 4u; j = j + 1u) {
        let d = 3u - j;  // the last dim first
        let s = P(sh + d);
        off = off + i32(rem % s) * PI(w + 1u + d);
        rem = rem / s;
    }
    return u32(off);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i < P(0u)) {
        kc[el(i, 2u, 20u) + step_position() * u32(PI(23u))] = k[el(i, 2u, 10u)];
    } else if (i < P(0u) + P(1u)) {
        let j = i - P(0u);
        vc[el(j, 6u, 25u) + step_position() * u32(PI(28u))] = v[el(j, 6u, 15u)];
    }
}
