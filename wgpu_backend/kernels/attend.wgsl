// Attention for a few query rows (decoding) in one dispatch: softmax(q k^T * scale +
// mask) v straight from the KV cache, one workgroup per (batch, head, query row).
// Keys go by in chunks of 1024: their scores wait in workgroup memory while a running
// max and sum rescale the output (online softmax, as flash-decoding does), so any
// number of keys fits. k and v are read as vec4s (features contiguous, d and dv
// multiples of 4). For the weighted sum invocation l owns the 4 output features of
// quad l % (dv / 4) over every splits-th key from l / (dv / 4), so all 64 lanes work
// when dv is small; the splits' sums are added at the end.
// P: 0 rows (b * h * tq), 1 h, 2 tq, 3 tk, 4 d (<= 256), 5 dv (<= 256), 6 scale (f32),
// 7 = 1: causal (key j > i + tk - tq banned), 8 = 1: additive mask.
// Operands, offset then 4 strides (batch, head, row, feature), in elements: q at 9,
// k at 14, v at 19, the mask (batch, head, row, key) at 24.
// step_keys(tk): tk eagerly; position + tokens from the step buffer in a captured step
// (wgpu_backend/recording.py), so one recorded launch serves every cache length.
@group(0) @binding(1) var<storage, read> q: array<SX>;
@group(0) @binding(2) var<storage, read> k: array<vec4<SX>>;
@group(0) @binding(3) var<storage, read> v: array<vec4<SX>>;
@group(0) @binding(4) var<storage, read> mask: array<SX>;
@group(0) @binding(5) var<storage, read_write> y: array<SX>;

// #include "attend_head.wgsl"

// Element offset of (bb, hh, r, 0) in the operand whose offset and strides start at word w.
fn row_at(w: u32, bb: u32, hh: u32, r: u32) -> u32 {
    return P(w) + bb * P(w + 1u) + hh * P(w + 2u) + r * P(w + 3u);
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(0u)) { return; }  // whole workgroups leave together
    let h = P(1u);
    let tq = P(2u);
    let tk = step_keys(P(3u));  // a captured step over its KV cache reads it from the step buffer
    let d4 = P(4u) / 4u;
    let dv4 = P(5u) / 4u;
    let i = row % tq;
    let hh = (row / tq) % h;
    let bb = row / (tq * h);
    let q0 = row_at(9u, bb, hh, i);
    let qe = P(13u);
    if (l < d4) {
        let e = q0 + 4u * l * qe;
        qs[l] = vec4<f32>(lx(q[e]), lx(q[e + qe]), lx(q[e + 2u * qe]), lx(q[e + 3u * qe]));
    }
    workgroupBarrier();
    let k0 = row_at(14u, bb, hh, 0u) / 4u;
    let ks = P(17u) / 4u;
    let v0 = row_at(19u, bb, hh, 0u) / 4u;
    let vs = P(22u) / 4u;
    let m0 = row_at(24u, bb, hh, i);
    let ms = P(28u);
    let scale = PF(6u);
    let has_mask = P(8u) == 1u;
    let causal = P(7u) == 1u;
    let last = i + tk - tq;  // the last key a causal row sees
    let splits = 64u / dv4;
    let quad = l % dv4;
    let split = l / dv4;
    var m = -f32_inf();
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < tk; c0 = c0 + CHUNK) {
        let count = min(CHUNK, tk - c0);
        var cm = -f32_inf();
        for (var jj = l; jj < count; jj = jj + 64u) {
            let j = c0 + jj;
            let kj = k0 + j * ks;
            var dot4 = vec4<f32>(0.0);
            for (var e = 0u; e < d4; e = e + 1u) { dot4 = dot4 + qs[e] * vec4<f32>(k[kj + e]); }
            var sc = (dot4.x + dot4.y + dot4.z + dot4.w) * scale;
            if (has_mask) { sc = sc + lx(mask[m0 + j * ms]); }
            if (causal && j > last) { sc = -f32_inf(); }
            ps[jj] = sc;
            cm = max(cm, sc);
        }
        // #include "attend_rescale.wgsl"
        if (split < splits) {
            let vq = v0 + c0 * vs + quad;
            for (var jj = split; jj < count; jj = jj + splits) { acc = acc + ps[jj] * vec4<f32>(v[vq + jj * vs]); }
        }
        m = new_m;
        workgroupBarrier();  // ps is rewritten by the next chunk
    }
    parts[l] = acc;
    workgroupBarrier();
    if (l < dv4) {
        var sum = vec4<f32>(0.0);
        for (var s = 0u; s < splits; s = s + 1u) { sum = sum + parts[s * dv4 + l]; }
        let out = row * P(5u) + 4u * l;
        for (var c = 0u; c < 4u; c = c + 1u) { y[out + c] = sx(sum[c] / total); }
    }
}
