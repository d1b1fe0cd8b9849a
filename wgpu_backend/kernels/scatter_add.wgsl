// scatter_add without atomics (WGSL has no float atomics): one invocation per
// element of the output (dst's shape) adds every src element whose id along
// dim P(37) points at it. Operand 0: dst strides, 1: ids strides, 2: src
// strides; P(38..45) is the ids/src shape. Deterministic (fixed order).
@group(0) @binding(1) var<storage, read> dst: array<SX>;
@group(0) @binding(2) var<storage, read> ids: array<SI>;
@group(0) @binding(3) var<storage, read> src: array<SX>;
@group(0) @binding(4) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    let dim = P(37u);
    let nd = P(1u);
    var coord: array<u32, 8>;
    var rem = i;
    for (var d = nd; d > 0u; d = d - 1u) {
        let s = P(1u + d);
        coord[d - 1u] = rem % s;
        rem = rem / s;
    }
    // Outside the ids/src extent in another dim: nothing scatters here.
    var inside = true;
    var id_base = PI(19u);
    var src_base = PI(28u);
    for (var d = 0u; d < nd; d = d + 1u) {
        if (d != dim) {
            if (coord[d] >= P(38u + d)) { inside = false; }
            id_base = id_base + i32(coord[d]) * PI(20u + d);
            src_base = src_base + i32(coord[d]) * PI(29u + d);
        }
    }
    var acc = lx(dst[at(i, 0u)]);
    if (inside) {
        let target_id = i32(coord[dim]);
        for (var s = 0u; s < P(38u + dim); s = s + 1u) {
            if (i32(li(ids[u32(id_base + i32(s) * PI(20u + dim))])) == target_id) {
                acc = acc + lx(src[u32(src_base + i32(s) * PI(29u + dim))]);
            }
        }
    }
    y[i] = sx(acc);
}
