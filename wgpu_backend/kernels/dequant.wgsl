// Dequantise rows of a GGUF block tensor, one invocation per 32 elements.
// Output row r comes from source row ids[r] (index_select of an embedding) or
// from row r itself (P(3) = 0). P: 0 output rows, 1 elements per row,
// 2 bytes per source row, 3 use ids, 4 number of source rows.
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
        src = u32(id);
    }
    var vals: array<f32, 32>;
    deq32(src * P(2u), s, &vals);
    for (var e = 0u; e < 32u; e = e + 1u) { y[r * P(1u) + s * 32u + e] = sy(vals[e]); }
}
