// A residual add fused with the RMS norm after it: s = x + r, y = rms_norm(s) * w, over
// rows of length D = P(37), one workgroup per row, in f32. Operands 0..2 of the
// element-wise layout are x, r and the weight broadcast to x's shape; P(38) = 1 when
// there is a weight, P(39) is eps, P(40) the number of rows. s and y are contiguous.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> r: array<SX>;
@group(0) @binding(3) var<storage, read> wt: array<SX>;
@group(0) @binding(4) var<storage, read_write> s: array<SX>;
@group(0) @binding(5) var<storage, read_write> y: array<SX>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(40u)) { return; }
    let d = P(37u);
    let base = row * d;
    var q = 0.0;
    for (var j = l; j < d; j = j + 64u) {
        // The sum is stored in its dtype and normalised as stored, as the two ops apart would.
        let v = lx(sx(lx(x[at(base + j, 0u)]) + lx(r[at(base + j, 1u)])));
        s[base + j] = sx(v);
        q = q + v * v;
    }
    red[l] = q;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k = k >> 1u) {
        if (l < k) { red[l] = red[l] + red[l + k]; }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(d) + PF(39u));
    for (var j = l; j < d; j = j + 64u) {
        var v = lx(s[base + j]) * inv;  // this invocation's own writes above
        if (P(38u) == 1u) { v = v * lx(wt[at(base + j, 2u)]); }
        y[base + j] = sx(v);
    }
}
