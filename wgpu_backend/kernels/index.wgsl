// index_select and gather: y[i] = x[the coords of output element i, with the
// coord along dim P(37) replaced by ids]. The element-wise layout's shape is
// the output's; operand 0 holds x's strides, operand 1 the ids' strides over
// the output shape (for index_select: 0 except along dim). Negative ids count
// from the end of x's dim (length P(38)).
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> ids: array<SI>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    var id = i32(li(ids[at(i, 1u)]));
    if (id < 0) { id = id + i32(P(38u)); }
    let dim = P(37u);
    var rem = i;
    var off = PI(10u);
    for (var d = P(1u); d > 0u; d = d - 1u) {
        let s = P(1u + d);
        var c = i32(rem % s);
        rem = rem / s;
        if (d - 1u == dim) { c = id; }
        off = off + c * PI(10u + d);
    }
    y[i] = x[u32(off)];
}
