// Q6_K: 210-byte super-blocks of 256: 128 bytes ql (low nibbles), 64 bytes qh
// (2 high bits), 16 x i8 scales (one per 16 elements), f16 d. For element
// e = 128h + r: low bits from ql[64h + r % 64] >> 4*(r / 64), high bits from
// qh[32h + r % 32] >> 2*(r / 32); x = d * scale[e / 16] * (q - 32).
fn q_scales(row: u32, s: u32) -> vec2<f32> {
    let o = row + (s / 8u) * 210u;
    let j = s % 8u;
    let d = q_half(o + 208u);
    return vec2<f32>(d * sext8(q_byte(o + 192u + 2u * j)), d * sext8(q_byte(o + 193u + 2u * j)));
}

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let o = row + (s / 8u) * 210u;
    let j = s % 8u;
    let h = j / 4u;
    let jr = j % 4u;
    let wl = q_word(o + h * 64u + (jr % 2u) * 32u + 4u * k) >> ((jr / 2u) * 4u);
    let wh = q_word(o + 128u + h * 32u + 4u * k) >> (jr * 2u);
    let lo = vec4<u32>(wl & 15u, (wl >> 8u) & 15u, (wl >> 16u) & 15u, (wl >> 24u) & 15u);
    let hi = vec4<u32>(wh & 3u, (wh >> 8u) & 3u, (wh >> 16u) & 3u, (wh >> 24u) & 3u);
    return select(sc.y, sc.x, k < 4u) * (vec4<f32>(lo | (hi << vec4<u32>(4u))) - 32.0);
}

fn q_dot(row: u32, s: u32) -> f32 {
    let sc = q_scales(row, s);
    var acc = vec4<f32>(0.0);
    for (var k = 0u; k < 8u; k = k + 1u) { acc = acc + q_quad(row, s, k, sc) * xb[k]; }
    return acc.x + acc.y + acc.z + acc.w;
}
