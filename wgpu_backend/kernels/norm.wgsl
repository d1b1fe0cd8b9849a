// Layer norm (P(38) = 1: subtract the mean) or RMS norm over rows of length
// D = P(37), one workgroup per row, in f32. eps = P(39). Operands 1 and 2 are
// the weight and bias broadcast to x's shape; P(40) / P(41) = 1 when present.
// P(42) is the number of rows.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> wt: array<SX>;
@group(0) @binding(3) var<storage, read> bias: array<SX>;
@group(0) @binding(4) var<storage, read_write> y: array<SX>;

// row_sum: row_sum.wgsl

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(42u)) { return; }
    let d = P(37u);
    let base = row * d;
    var mean = 0.0;
    if (P(38u) == 1u) {
        var s = 0.0;
        for (var j = l; j < d; j = j + 64u) { s = s + lx(x[at(base + j, 0u)]); }
        mean = row_sum(l, s) / f32(d);
    }
    var q = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        let c = lx(x[at(base + j, 0u)]) - mean;
        q = q + c * c;
    }
    let inv = 1.0 / sqrt(row_sum(l, q) / f32(d) + PF(39u));
    for (var j = l; j < d; j = j + 64u) {
        var v = (lx(x[at(base + j, 0u)]) - mean) * inv;
        if (P(40u) == 1u) { v = v * lx(wt[at(base + j, 1u)]); }
        if (P(41u) == 1u) { v = v + lx(bias[at(base + j, 2u)]); }
        y[base + j] = sx(v);
    }
}
