// Attention for a few query rows (decoding) in one dispatch: softmax(q k^T * scale +
// mask) v straight from the KV cache, one workgroup per (batch, head, query row).
// Keys go by in chunks of 256: their scores wait in workgroup memory while a running
// max and sum rescale the output (online softmax, as flash-decoding does), so any
// number of keys fits. Invocation l owns output features l, l + 64, l + 128, l + 192.
// P: 0 rows (b * h * tq), 1 h, 2 tq, 3 tk, 4 d (<= 256), 5 dv (<= 256), 6 scale (f32),
// 7 = 1: causal (key j > i + tk - tq banned), 8 = 1: additive mask.
// Operands, offset then 4 strides (batch, head, row, feature): q at 9, k at 14,
// v at 19, the mask (batch, head, row, key) at 24.
@group(0) @binding(1) var<storage, read> q: array<SX>;
@group(0) @binding(2) var<storage, read> k: array<SX>;
@group(0) @binding(3) var<storage, read> v: array<SX>;
@group(0) @binding(4) var<storage, read> mask: array<SX>;
@group(0) @binding(5) var<storage, read_write> y: array<SX>;

const CHUNK: u32 = 256u;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 256>;
var<workgroup> red: array<f32, 64>;

fn el(w: u32, bb: u32, hh: u32, r: u32, e: u32) -> u32 {
    return u32(PI(w) + i32(bb) * PI(w + 1u) + i32(hh) * PI(w + 2u) + i32(r) * PI(w + 3u) + i32(e) * PI(w + 4u));
}

fn reduce_max(l: u32, x: f32) -> f32 {
    red[l] = x;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s) { red[l] = max(red[l], red[l + s]); }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

fn reduce_sum(l: u32, x: f32) -> f32 {
    red[l] = x;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s) { red[l] = red[l] + red[l + s]; }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    return m;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let row = w.x + w.y * n.x;
    if (row >= P(0u)) { return; }  // whole workgroups leave together
    let h = P(1u);
    let tq = P(2u);
    let tk = P(3u);
    let d = P(4u);
    let dv = P(5u);
    let i = row % tq;
    let hh = (row / tq) % h;
    let bb = row / (tq * h);
    for (var e = l; e < d; e = e + 64u) { qs[e] = lx(q[el(9u, bb, hh, i, e)]); }
    workgroupBarrier();
    let last = i + tk - tq;  // the last key a causal row sees
    var m = -f32_inf();
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < tk; c0 = c0 + CHUNK) {
        let count = min(CHUNK, tk - c0);
        var cm = -f32_inf();
        for (var jj = l; jj < count; jj = jj + 64u) {
            let j = c0 + jj;
            var sc = 0.0;
            for (var e = 0u; e < d; e = e + 1u) { sc = sc + qs[e] * lx(k[el(14u, bb, hh, j, e)]); }
            sc = sc * PF(6u);
            if (P(8u) == 1u) { sc = sc + lx(mask[el(24u, bb, hh, i, j)]); }
            if (P(7u) == 1u && j > last) { sc = -f32_inf(); }
            ps[jj] = sc;
            cm = max(cm, sc);
        }
        let new_m = max(m, reduce_max(l, cm));
        // Until some key scores above -inf there is nothing to rescale or weigh.
        let alpha = select(exp(m - new_m), 1.0, new_m == -f32_inf());
        var part = 0.0;
        for (var jj = l; jj < count; jj = jj + 64u) {
            let pj = select(exp(ps[jj] - new_m), 0.0, new_m == -f32_inf());
            ps[jj] = pj;
            part = part + pj;
        }
        total = total * alpha + reduce_sum(l, part);  // its barriers publish ps
        acc = acc * alpha;
        for (var r = 0u; r < 4u; r = r + 1u) {
            let e = l + 64u * r;
            if (e < dv) {
                var s = 0.0;
                for (var jj = 0u; jj < count; jj = jj + 1u) { s = s + ps[jj] * lx(v[el(19u, bb, hh, c0 + jj, e)]); }
                acc[r] = acc[r] + s;
            }
        }
        m = new_m;
        workgroupBarrier();  // ps is rewritten by the next chunk
    }
    let out = row * dv;
    for (var r = 0u; r < 4u; r = r + 1u) {
        let e = l + 64u * r;
        if (e < dv) { y[out + e] = sx(acc[r] / total); }
    }
}
