// Q8_0: 34-byte blocks of 32: f16 d, 32 x i8 q; x = d * q.
// Each format gives the scales of sub-block s (32 elements) of a row starting
// at byte `row`, and elements 4k .. 4k+3 of it (k < 8) as a vec4.
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 34u), 0.0); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 34u + 2u + 4u * k);
    return sc.x * vec4<f32>(sext8(wd & 0xffu), sext8((wd >> 8u) & 0xffu), sext8((wd >> 16u) & 0xffu), sext8(wd >> 24u));
}
