// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; element e < 16 is the low
// nibble of byte e, element e + 16 its high nibble; x = d * (q - 8).
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 18u), 0.0); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 18u + 2u + 4u * (k % 4u)) >> select(0u, 4u, k >= 4u);
    let q = vec4<f32>(f32(wd & 15u), f32((wd >> 8u) & 15u), f32((wd >> 16u) & 15u), f32((wd >> 24u) & 15u));
    return sc.x * (q - 8.0);
}

// Dot of block s with xb (x's 32 elements, see qmatvec.wgsl). The 18-byte block starts at a byte offset that is
// 0 or 2 mod 4: load the 5 words covering it and shift the nibble words into
// place (one select per word, the same for every lane of an aligned row).
fn q_dot(row: u32, s: u32) -> f32 {
    let b = row + s * 18u;
    let o = b >> 2u;
    let odd = (b & 2u) != 0u;
    let d = unpack2x16float(select(wq[o], wq[o] >> 16u, odd)).x;
    var qx = 0.0;
    for (var j = 0u; j < 4u; j = j + 1u) {
        let hi = wq[o + 1u + j];
        let v = vec4<u32>(select((wq[o + j] >> 16u) | (hi << 16u), hi, odd));
        qx = qx + dot(vec4<f32>((v >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(15u)), xb[j])
                + dot(vec4<f32>((v >> vec4<u32>(4u, 12u, 20u, 28u)) & vec4<u32>(15u)), xb[j + 4u]);
    }
    return d * (qx - 8.0 * xsum);
}
