// (Log-)softmax over rows of length D = P(37), one workgroup per row, in f32.
// Also the middle of attention: scores * scale (P(38)) + an additive mask
// (operand 1, when P(39) = 1), causal masking (P(40) = 1) of key j > q + P(41)
// where q is the row's query index (row % P(43)). P(42) = 1 for log-softmax.
// P(44) is the number of rows.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> mask: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

var<workgroup> red: array<f32, 64>;

fn score(row: u32, j: u32) -> f32 {
    let i = row * P(37u) + j;
    var s = lx(x[at(i, 0u)]) * PF(38u);
    if (P(39u) == 1u) { s = s + lx(mask[at(i, 1u)]); }
    if (P(40u) == 1u && j > (row % P(43u)) + P(41u)) { s = -f32_inf(); }
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(44u)) { return; }
    let d = P(37u);
    var m = -f32_inf();
    for (var j = l; j < d; j = j + 64u) { m = max(m, score(row, j)); }
    red[l] = m;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s) { red[l] = max(red[l], red[l + s]); }
        workgroupBarrier();
    }
    m = red[0];
    workgroupBarrier();
    var total = 0.0;
    for (var j = l; j < d; j = j + 64u) { total = total + exp(score(row, j) - m); }
    red[l] = total;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s) { red[l] = red[l] + red[l + s]; }
        workgroupBarrier();
    }
    total = red[0];
    for (var j = l; j < d; j = j + 64u) {
        let z = score(row, j) - m;
        if (P(42u) == 1u) {
            y[row * d + j] = sx(z - log(total));
        } else {
            y[row * d + j] = sx(exp(z) / total);
        }
    }
}
