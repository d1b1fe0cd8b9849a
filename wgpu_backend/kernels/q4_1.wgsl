// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles as Q4_0; x = d * q + m.
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 20u), q_half(row + s * 20u + 2u)); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 20u + 4u + 4u * (k % 4u)) >> select(0u, 4u, k >= 4u);
    let q = vec4<f32>(f32(wd & 15u), f32((wd >> 8u) & 15u), f32((wd >> 16u) & 15u), f32((wd >> 24u) & 15u));
    return sc.x * q + sc.y;
}
