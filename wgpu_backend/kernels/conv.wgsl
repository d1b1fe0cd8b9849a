// Direct 2-D convolution (conv1d runs as H = 1), zero padding, groups.
// x (B, Cin, H, W) and w (Cout, Cin/groups, KH, KW) contiguous; one invocation
// per output element. P: 0 count, 1 B, 2 Cin, 3 H, 4 W, 5 Cout, 6 Cin/groups,
// 7 KH, 8 KW, 9 OH, 10 OW, 11-12 stride, 13-14 padding, 15-16 dilation, 17 Cout/groups.
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read> wt: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    let cin = P(2u); let hh = i32(P(3u)); let ww = i32(P(4u)); let cout = P(5u);
    let cin_g = P(6u); let kh = P(7u); let kw = P(8u); let oh = P(9u); let ow = P(10u);
    let ox = i % ow;
    let oy = (i / ow) % oh;
    let co = (i / (ow * oh)) % cout;
    let bi = i / (ow * oh * cout);
    let g = co / P(17u);
    var acc = 0.0;
    for (var ci = 0u; ci < cin_g; ci = ci + 1u) {
        let xc = (bi * cin + g * cin_g + ci) * u32(hh) * u32(ww);
        let wc = (co * cin_g + ci) * kh * kw;
        for (var ky = 0u; ky < kh; ky = ky + 1u) {
            let iy = i32(oy * P(11u) + ky * P(15u)) - i32(P(13u));
            if (iy < 0 || iy >= hh) { continue; }
            for (var kx = 0u; kx < kw; kx = kx + 1u) {
                let ix = i32(ox * P(12u) + kx * P(16u)) - i32(P(14u));
                if (ix < 0 || ix >= ww) { continue; }
                acc = acc + lx(x[xc + u32(iy * ww + ix)]) * lx(wt[wc + ky * kw + kx]);
            }
        }
    }
    y[i] = sx(acc);
}
