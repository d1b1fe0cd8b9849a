// Q4_K: 144-byte super-blocks of 256 = 8 sub-blocks of 32: f16 d, f16 dmin,
// 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles (sub-block j
// uses byte (j / 2) * 32 + i, low nibble for even j); x = d*sc*q - dmin*m.
fn q_scales(row: u32, s: u32) -> vec2<f32> {
    let o = row + (s / 8u) * 144u;
    let j = s % 8u;
    var sc = 0u;
    var mn = 0u;
    if (j < 4u) {
        sc = q_byte(o + 4u + j) & 63u;
        mn = q_byte(o + 8u + j) & 63u;
    } else {
        sc = (q_byte(o + 8u + j) & 15u) | ((q_byte(o + j) >> 6u) << 4u);
        mn = (q_byte(o + 8u + j) >> 4u) | ((q_byte(o + 4u + j) >> 6u) << 4u);
    }
    return vec2<f32>(q_half(o) * f32(sc), q_half(o + 2u) * f32(mn));
}

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let j = s % 8u;
    let wd = q_word(row + (s / 8u) * 144u + 16u + (j / 2u) * 32u + 4u * k) >> ((j % 2u) * 4u);
    let q = vec4<f32>(f32(wd & 15u), f32((wd >> 8u) & 15u), f32((wd >> 16u) & 15u), f32((wd >> 24u) & 15u));
    return sc.x * q - sc.y;
}

fn q_dot(row: u32, s: u32) -> f32 {
    let sc = q_scales(row, s);
    var acc = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k = k + 1u) { acc = acc + q_quad(row, s, k, sc) * xb[k]; }
    return acc.x + acc.y + acc.z + acc.w;
}
