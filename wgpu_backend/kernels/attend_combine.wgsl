// Second pass of split-K (flash-decoding) attention: joins the splits' partial results of
// cache_attend.wgsl, (max m_s, sum l_s, acc_s[dv]) in f32 per (row, split), into
// sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s with M the largest m_s. An empty split
// (m_s = -inf) weighs nothing. One workgroup per row.
// P: 0 rows, 1 splits, 2 dv.
@group(0) @binding(1) var<storage, read> parts: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(0u)) { return; }
    let splits = P(1u);
    let dv = P(2u);
    let width = dv + 2u;
    let base = row * splits * width;
    var big = -f32_inf();
    for (var s = 0u; s < splits; s = s + 1u) { big = max(big, parts[base + s * width]); }
    var total = 0.0;
    for (var s = 0u; s < splits; s = s + 1u) {
        let ms = parts[base + s * width];
        total = total + select(exp(ms - big), 0.0, ms == -f32_inf()) * parts[base + s * width + 1u];
    }
    for (var e = l; e < dv; e = e + 64u) {
        var acc = 0.0;
        for (var s = 0u; s < splits; s = s + 1u) {
            let ms = parts[base + s * width];
            acc = acc + select(exp(ms - big), 0.0, ms == -f32_inf()) * parts[base + s * width + 2u + e];
        }
        y[row * dv + e] = sx(acc / total);
    }
}
