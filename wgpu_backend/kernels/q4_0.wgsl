// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; element e < 16 is the low
// nibble of byte e, element e + 16 its high nibble; x = d * (q - 8).
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 18u), 0.0); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 18u + 2u + 4u * (k % 4u)) >> select(0u, 4u, k >= 4u);
    let q = vec4<f32>(f32(wd & 15u), f32((wd >> 8u) & 15u), f32((wd >> 16u) & 15u), f32((wd >> 24u) & 15u));
    return sc.x * (q - 8.0);
}
