// Rotary embedding, one invocation per rotated pair. The layout shape is
// x's shape with the last dim halved (..., t, d/2): operand 0 walks the first
// element of each pair, P(37) is the (signed) step to its partner; operands
// 1 and 2 are cos and sin broadcast to that shape. P(38) = 1: interleaved
// pairs (2c, 2c+1), else half-split (c, c + d/2); P(39) is d/2.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> cs: array<SX>;
@group(0) @binding(3) var<storage, read> sn: array<SX>;
@group(0) @binding(4) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let p = flat_id(w, n, l, 256u);
    if (p >= P(0u)) { return; }
    let o0 = at(p, 0u);
    let x1 = lx(x[o0]);
    let x2 = lx(x[u32(i32(o0) + PI(37u))]);
    let c = lx(cs[at(p, 1u)]);
    let s = lx(sn[at(p, 2u)]);
    let h = P(39u);
    let row = p / h;
    let k = p % h;
    var i1 = row * 2u * h + k;
    var i2 = i1 + h;
    if (P(38u) == 1u) {
        i1 = row * 2u * h + 2u * k;
        i2 = i1 + 1u;
    }
    y[i1] = sx(x1 * c - x2 * s);
    y[i2] = sx(x1 * s + x2 * c);
}
