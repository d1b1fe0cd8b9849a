// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles as Q4_0; x = d * q + m.
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 20u), q_half(row + s * 20u + 2u)); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 20u + 4u + 4u * (k % 4u)) >> select(0u, 4u, k >= 4u);
    let q = vec4<f32>(f32(wd & 15u), f32((wd >> 8u) & 15u), f32((wd >> 16u) & 15u), f32((wd >> 24u) & 15u));
    return sc.x * q + sc.y;
}

// Dot of block s with xb (x's 32 elements, see qmatvec.wgsl): d * (q . x) + m * sum(x), from 5 aligned words
// (20-byte blocks keep every row and block word-aligned).
fn q_dot(row: u32, s: u32) -> f32 {
    let o = (row + s * 20u) >> 2u;
    let dm = unpack2x16float(wq[o]);
    var qx = 0.0;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let v = vec4<u32>(wq[o + 1u + j]);
        qx = qx + dot(vec4<f32>((v >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)), xb[j])
                + dot(vec4<f32>((v >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)), xb[j + 4u]);
    }
    return dm.x * qx + dm.y * xsum;
}
