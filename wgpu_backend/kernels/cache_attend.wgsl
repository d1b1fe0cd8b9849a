// One-token decode attention that appends to the KV cache itself: rope(q) (when rotary),
// then softmax(q K^T * scale) V over the cache's keys [key_start, pos], where key pos is
// the new one, taken from the q/k/v projection (rotated) rather than from the cache:
// several workgroups (the query heads of one KV head, the splits) read it, and exactly one
// of them (its head's first query head, split 0) writes rope(k) and v into the cache at
// pos, which nobody reads in this dispatch: no race between workgroups.
// Workgroup (row, split) for row = (batch, query head) and split < splits covers keys
// [key_start + split * per_split, ...) with the online softmax of attend.wgsl. One split
// writes the normalised output; more write (max, sum, acc[dv]) per split in f32 for
// attend_combine.wgsl (flash-decoding), and an empty split writes (-inf, 0, 0).
// P: 0 rows (b * h), 1 h, 2 query heads per KV head, 3 d (<= 256), 4 dv (<= 256), 5 scale
// (f32), 6 pos (0 in a captured step: step_position() adds the step's), 7 key_start,
// 8 = 1: rotary, 9 = 1: interleaved pairs, 10 splits, 11 keys per split.
// Operands, offset then 4 strides (batch, head, position, feature) in elements: q at 12,
// the new k at 17, the new v at 22, the key cache at 27, the value cache at 32 (caches:
// features contiguous, offsets and strides multiples of 4); cos and sin (positions, d/2):
// offset and 2 strides at 37 and 40, their row step_position().
@group(0) @binding(1) var<storage, read> q: array<SX>;
@group(0) @binding(2) var<storage, read> kn: array<SX>;
@group(0) @binding(3) var<storage, read> vn: array<SX>;
@group(0) @binding(4) var<storage, read> cs: array<SX>;
@group(0) @binding(5) var<storage, read> sn: array<SX>;
@group(0) @binding(6) var<storage, read_write> kc: array<vec4<SX>>;
@group(0) @binding(7) var<storage, read_write> vc: array<vec4<SX>>;
@group(0) @binding(8) var<storage, read_write> y: array<SY>;

// #include "attend_head.wgsl"
var<workgroup> k_new: array<vec4<f32>, 64>;
var<workgroup> v_new: array<vec4<f32>, 64>;

// Element (bb, hh, tt, e) of the operand whose offset and strides start at word w.
fn el(w: u32, bb: u32, hh: u32, tt: u32, e: u32) -> u32 {
    return u32(PI(w) + i32(bb) * PI(w + 1u) + i32(hh) * PI(w + 2u) + i32(tt) * PI(w + 3u) + i32(e) * PI(w + 4u));
}

// Feature e of x (the new q or k row at word w), rotated when rotary: (x1, x2) -> (x1 c - x2 s,
// x1 s + x2 c) over the pairs (i, i + d/2), or (2i, 2i + 1) when interleaved.
fn rotated_q(bb: u32, hh: u32, e: u32, d: u32) -> f32 {
    let x = lx(q[el(12u, bb, hh, 0u, e)]);
    if (P(8u) == 0u) { return x; }
    return rotate(x, lx(q[el(12u, bb, hh, 0u, partner(e, d))]), e, d);
}

fn rotated_k(bb: u32, hh: u32, e: u32, d: u32) -> f32 {
    let x = lx(kn[el(17u, bb, hh, 0u, e)]);
    if (P(8u) == 0u) { return x; }
    return rotate(x, lx(kn[el(17u, bb, hh, 0u, partner(e, d))]), e, d);
}

fn pair_index(e: u32, d: u32) -> u32 {
    if (P(9u) == 1u) { return e / 2u; }
    return e % (d / 2u);
}

fn is_second(e: u32, d: u32) -> bool {
    if (P(9u) == 1u) { return e % 2u == 1u; }
    return e >= d / 2u;
}

fn partner(e: u32, d: u32) -> u32 {
    if (P(9u) == 1u) { return e ^ 1u; }
    return select(e + d / 2u, e - d / 2u, e >= d / 2u);
}

fn rotate(x: f32, other: f32, e: u32, d: u32) -> f32 {
    let i = pair_index(e, d);
    let at = i32(step_position());
    let c = lx(cs[u32(PI(37u) + at * PI(38u) + i32(i) * PI(39u))]);
    let s = lx(sn[u32(PI(40u) + at * PI(41u) + i32(i) * PI(42u))]);
    if (is_second(e, d)) { return other * s + x * c; }  // x2' = x1 s + x2 c
    return x * c - other * s;                           // x1' = x1 c - x2 s
}

// A value rounded to the cache's dtype, as the composed path reads it back from the cache.
fn stored(x: f32) -> f32 { return lx(sx(x)); }

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let splits = P(10u);
    let wid = w.x + w.y * n.x;
    let row = wid / splits;
    if (row >= P(0u)) { return; }  // whole workgroups leave together
    let split = wid % splits;
    let h = P(1u);
    let rep = P(2u);
    let d = P(3u);
    let dv = P(4u);
    let d4 = d / 4u;
    let dv4 = dv / 4u;
    let hh = row % h;
    let bb = row / h;
    let kvh = hh / rep;
    let pos = P(6u) + step_position();
    if (l < d4) {
        let e = 4u * l;
        qs[l] = vec4<f32>(rotated_q(bb, hh, e, d), rotated_q(bb, hh, e + 1u, d), rotated_q(bb, hh, e + 2u, d),
                          rotated_q(bb, hh, e + 3u, d));
        k_new[l] = vec4<f32>(stored(rotated_k(bb, kvh, e, d)), stored(rotated_k(bb, kvh, e + 1u, d)),
                             stored(rotated_k(bb, kvh, e + 2u, d)), stored(rotated_k(bb, kvh, e + 3u, d)));
    }
    if (l < dv4) {
        let e = 4u * l;
        v_new[l] = vec4<f32>(stored(lx(vn[el(22u, bb, kvh, 0u, e)])), stored(lx(vn[el(22u, bb, kvh, 0u, e + 1u)])),
                             stored(lx(vn[el(22u, bb, kvh, 0u, e + 2u)])), stored(lx(vn[el(22u, bb, kvh, 0u, e + 3u)])));
    }
    workgroupBarrier();
    let k0 = el(27u, bb, kvh, 0u, 0u) / 4u;
    let ks = P(30u) / 4u;
    let v0 = el(32u, bb, kvh, 0u, 0u) / 4u;
    let vs = P(35u) / 4u;
    if (hh % rep == 0u && split == 0u) {  // the one writer of this KV head's new position
        if (l < d4) {
            let a = k_new[l];
            kc[k0 + pos * ks + l] = vec4<SX>(sx(a.x), sx(a.y), sx(a.z), sx(a.w));
        }
        if (l < dv4) {
            let a = v_new[l];
            vc[v0 + pos * vs + l] = vec4<SX>(sx(a.x), sx(a.y), sx(a.z), sx(a.w));
        }
    }
    let scale = PF(5u);
    let lo = min(P(7u) + split * P(11u), pos + 1u);
    let hi = min(lo + P(11u), pos + 1u);
    let lanes = 64u / dv4;
    let quad = l % dv4;
    let lane = l / dv4;
    var m = -f32_inf();
    var total = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = lo; c0 < hi; c0 = c0 + CHUNK) {
        let count = min(CHUNK, hi - c0);
        var cm = -f32_inf();
        for (var jj = l; jj < count; jj = jj + 64u) {
            let j = c0 + jj;
            var dot4 = vec4<f32>(0.0);
            if (j == pos) {
                for (var e = 0u; e < d4; e = e + 1u) { dot4 = dot4 + qs[e] * k_new[e]; }
            } else {
                let kj = k0 + j * ks;
                for (var e = 0u; e < d4; e = e + 1u) { dot4 = dot4 + qs[e] * vec4<f32>(kc[kj + e]); }
            }
            let sc = (dot4.x + dot4.y + dot4.z + dot4.w) * scale;
            ps[jj] = sc;
            cm = max(cm, sc);
        }
        // #include "attend_rescale.wgsl"
        if (lane < lanes) {
            for (var jj = lane; jj < count; jj = jj + lanes) {
                let j = c0 + jj;
                var vj = v_new[quad];
                if (j != pos) { vj = vec4<f32>(vc[v0 + j * vs + quad]); }
                acc = acc + ps[jj] * vj;
            }
        }
        m = new_m;
        workgroupBarrier();  // ps is rewritten by the next chunk
    }
    parts[l] = acc;
    workgroupBarrier();
    if (l < dv4) {
        var sum = vec4<f32>(0.0);
        for (var s = 0u; s < lanes; s = s + 1u) { sum = sum + parts[s * dv4 + l]; }
        if (splits == 1u) {
            let out = row * dv + 4u * l;
            for (var c = 0u; c < 4u; c = c + 1u) { y[out + c] = sy(sum[c] / total); }
        } else {  // this split's (max, sum, acc) for attend_combine.wgsl
            let base = wid * (dv + 2u);
            if (l == 0u) {
                y[base] = sy(m);
                y[base + 1u] = sy(total);
            }
            for (var c = 0u; c < 4u; c = c + 1u) { y[base + 2u + 4u * l + c] = sy(sum[c]); }
        }
    }
}
