// Rotary embedding fused with the KV-cache write (one decoding step's q, k, v):
// out = rope(q) (contiguous), kc slot = rope(k), vc slot = v. One invocation per pair
// of elements (i, partner) of one head of q, k or v at one position.
// P: 0 pairs in all, 1 batch, 2 q heads, 3 kv heads, 4 positions t, 5 d/2,
// 6 = 1: interleaved pairs (2i, 2i+1), else half-split (i, i + d/2).
// Operands, offset then 4 strides (batch, head, position, feature) in elements:
// q at 7, k at 12, v at 17, the key cache slot at 22, the value cache slot at 27;
// cos and sin (positions, d/2): offset and 2 strides at 32 and 35.
// The cache slots and cos/sin rows are offset by step_position() more positions: 0 eagerly;
// in a captured step (wgpu_backend/recording.py) the step's position, read from the step buffer.
@group(0) @binding(1) var<storage, read> q: array<SX>;
@group(0) @binding(2) var<storage, read> k: array<SX>;
@group(0) @binding(3) var<storage, read> v: array<SX>;
@group(0) @binding(4) var<storage, read> cs: array<SX>;
@group(0) @binding(5) var<storage, read> sn: array<SX>;
@group(0) @binding(6) var<storage, read_write> kc: array<SX>;
@group(0) @binding(7) var<storage, read_write> vc: array<SX>;
@group(0) @binding(8) var<storage, read_write> y: array<SX>;

// Element (bb, hh, tt, e) of the operand whose offset and strides start at word w.
fn el(w: u32, bb: u32, hh: u32, tt: u32, e: u32) -> u32 {
    return u32(PI(w) + i32(bb) * PI(w + 1u) + i32(hh) * PI(w + 2u) + i32(tt) * PI(w + 3u) + i32(e) * PI(w + 4u));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let p = flat_id(w, n, l, 256u);
    if (p >= P(0u)) { return; }
    let half = P(5u);
    let t = P(4u);
    let hq = P(2u);
    let hk = P(3u);
    let i = p % half;
    var rest = p / half;
    let tt = rest % t;
    let at = tt + step_position();  // the position in the cache and the rotary tables
    rest = rest / t;
    let head = rest % (hq + 2u * hk);
    let bb = rest / (hq + 2u * hk);
    var e1 = i;
    var e2 = i + half;
    if (P(6u) == 1u) {
        e1 = 2u * i;
        e2 = e1 + 1u;
    }
    if (head >= hq + hk) {  // v: copied into its cache slot
        let hh = head - hq - hk;
        vc[el(27u, bb, hh, at, e1)] = v[el(17u, bb, hh, tt, e1)];
        vc[el(27u, bb, hh, at, e2)] = v[el(17u, bb, hh, tt, e2)];
        return;
    }
    let c = lx(cs[u32(PI(32u) + i32(at) * PI(33u) + i32(i) * PI(34u))]);
    let s = lx(sn[u32(PI(35u) + i32(at) * PI(36u) + i32(i) * PI(37u))]);
    if (head < hq) {  // q: rotated into the contiguous output
        let x1 = lx(q[el(7u, bb, head, tt, e1)]);
        let x2 = lx(q[el(7u, bb, head, tt, e2)]);
        let row = ((bb * hq + head) * t + tt) * 2u * half;
        y[row + e1] = sx(x1 * c - x2 * s);
        y[row + e2] = sx(x1 * s + x2 * c);
        return;
    }
    let hh = head - hq;  // k: rotated into its cache slot
    let x1 = lx(k[el(12u, bb, hh, tt, e1)]);
    let x2 = lx(k[el(12u, bb, hh, tt, e2)]);
    kc[el(22u, bb, hh, at, e1)] = sx(x1 * c - x2 * s);
    kc[el(22u, bb, hh, at, e2)] = sx(x1 * s + x2 * c);
}
