// Dequantise rows of a GGUF block tensor, one invocation per 32 elements.
// Output row r comes from source row ids[r] (index_select of an embedding) or
// from row r itself (P(3) = 0). P: 0 output rows, 1 elements per row,
// 2 bytes per source row, 3 use ids, 4 number of source rows; with ids, the
// bound table holds source rows [P(5), P(5) + P(6)) (a table split across
// bindings) and rows whose id falls outside are left to another dispatch.
@group(0) @binding(2) var<storage, read> ids: array<SI>;
@group(0) @binding(3) var<storage, read_write> y: array<SY>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let t = flat_id(w, n, l, 64u);
    let per_row = P(1u) / 32u;
    if (t >= P(0u) * per_row) { return; }
    let r = t / per_row;
    let s = t % per_row;
    var src = r;
    if (P(3u) == 1u) {
        var id = i32(li(ids[r]));
        if (id < 0) { id = id + i32(P(4u)); }
        if (u32(id) < P(5u) || u32(id) - P(5u) >= P(6u)) { return; }
        src = u32(id) - P(5u);
    }
    let row = src * P(2u);
    let sc = q_scales(row, s);
    let out = r * P(1u) + s * 32u;
    for (var k = 0u; k < 8u; k = k + 1u) {
        let v = q_quad(row, s, k, sc);
        y[out + 4u * k] = sy(v.x);
        y[out + 4u * k + 1u] = sy(v.y);
        y[out + 4u * k + 2u] = sy(v.z);
        y[out + 4u * k + 3u] = sy(v.w);
    }
}
