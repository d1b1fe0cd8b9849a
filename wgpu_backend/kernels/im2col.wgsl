// Unfold for convolution as a matmul: col (B, Cin, KH, KW, OH, OW) holds, for
// every output position, the input element each kernel tap multiplies (0 in
// the padding). Then y (B, groups, Cout/groups, OH*OW) = w (groups,
// Cout/groups, Cin/groups*KH*KW) . col, through the register-blocked matmul:
// ~20x the direct conv kernel on lavapipe. x (B, Cin, H, W) is contiguous;
// parameters as conv.wgsl, P(0) is the element count of col.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read_write> col: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    let hh = i32(P(3u)); let ww = i32(P(4u));
    let kh = P(7u); let kw = P(8u); let oh = P(9u); let ow = P(10u);
    let ox = i % ow;
    let oy = (i / ow) % oh;
    let kx = (i / (ow * oh)) % kw;
    let ky = (i / (ow * oh * kw)) % kh;
    let plane = i / (ow * oh * kw * kh);  // b * Cin + ci
    let iy = i32(oy * P(11u) + ky * P(15u)) - i32(P(13u));
    let ix = i32(ox * P(12u) + kx * P(16u)) - i32(P(14u));
    var v = SX(0);
    if (iy >= 0 && iy < hh && ix >= 0 && ix < ww) { v = x[plane * u32(hh * ww) + u32(iy * ww + ix)]; }
    col[i] = v;
}
