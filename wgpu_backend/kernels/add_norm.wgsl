// A residual add fused with the norm after it: s = x + r, y = norm(s) * w + b, over
// rows of length D = P(37), one workgroup per row, in f32: RMS norm, or layer norm
// (mean subtracted) when P(41) = 1. Operands 0 and 1 of the element-wise layout are x
// and r; P(38) = 1 when there is a weight w[P(43) + j * P(44)], P(42) = 1 when there is
// a bias b[P(45) + j * P(46)]. P(39) is eps, P(40) the number of rows. s and y are
// contiguous.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> r: array<SX>;
@group(0) @binding(3) var<storage, read> wt: array<SX>;
@group(0) @binding(4) var<storage, read> bs: array<SX>;
@group(0) @binding(5) var<storage, read_write> s: array<SX>;
@group(0) @binding(6) var<storage, read_write> y: array<SX>;

// row_sum: row_sum.wgsl

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(40u)) { return; }
    let d = P(37u);
    let base = row * d;
    var sum = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        // The sum is stored in its dtype and normalised as stored, as the two ops apart would.
        let v = lx(sx(lx(x[at(base + j, 0u)]) + lx(r[at(base + j, 1u)])));
        s[base + j] = sx(v);
        sum = sum + v;
    }
    var mean = 0.0;
    if (P(41u) == 1u) { mean = row_sum(l, sum) / f32(d); }
    var q = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        let c = lx(s[base + j]) - mean;  // this invocation's own writes above
        q = q + c * c;
    }
    let inv = 1.0 / sqrt(row_sum(l, q) / f32(d) + PF(39u));
    for (var j = l; j < d; j = j + 64u) {
        var v = (lx(s[base + j]) - mean) * inv;
        if (P(38u) == 1u) { v = v * lx(wt[P(43u) + j * P(44u)]); }
        if (P(42u) == 1u) { v = v + lx(bs[P(45u) + j * P(46u)]); }
        y[base + j] = sx(v);
    }
}
