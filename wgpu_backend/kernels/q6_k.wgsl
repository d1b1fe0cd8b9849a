// Q6_K: 210-byte super-blocks of 256: 128 bytes ql (low nibbles), 64 bytes qh
// (2 high bits), 16 x i8 scales (one per 16 elements), f16 d. For element
// e = 128h + r: low bits from ql[64h + r % 64] >> 4*(r / 64), high bits from
// qh[32h + r % 32] >> 2*(r / 32); x = d * scale[e / 16] * (q - 32).
fn deq32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let o = row + (s / 8u) * 210u;
    let j = s % 8u;
    let h = j / 4u;
    let jr = j % 4u;
    let d = q_half(o + 208u);
    let ql = o + h * 64u + (jr % 2u) * 32u;
    let ql_shift = (jr / 2u) * 4u;
    let qh = o + 128u + h * 32u;
    let qh_shift = jr * 2u;
    let s0 = d * sext8(q_byte(o + 192u + 2u * j));
    let s1 = d * sext8(q_byte(o + 193u + 2u * j));
    for (var k = 0u; k < 8u; k = k + 1u) {
        let wl = q_word(ql + 4u * k);
        let wh = q_word(qh + 4u * k);
        let sc = select(s1, s0, k < 4u);
        for (var t = 0u; t < 4u; t = t + 1u) {
            let lo = (wl >> (8u * t + ql_shift)) & 15u;
            let hi = (wh >> (8u * t + qh_shift)) & 3u;
            (*v)[4u * k + t] = sc * (f32(lo | (hi << 4u)) - 32.0);
        }
    }
}
