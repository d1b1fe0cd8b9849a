// Q4_K: 144-byte super-blocks of 256 = 8 sub-blocks of 32: f16 d, f16 dmin,
// 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles (sub-block j
// uses byte (j / 2) * 32 + i, low nibble for even j); x = d*sc*q - dmin*m.
fn deq32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let o = row + (s / 8u) * 144u;
    let j = s % 8u;
    let d = q_half(o);
    let dmin = q_half(o + 2u);
    var sc = 0u;
    var mn = 0u;
    if (j < 4u) {
        sc = q_byte(o + 4u + j) & 63u;
        mn = q_byte(o + 8u + j) & 63u;
    } else {
        sc = (q_byte(o + 8u + j) & 15u) | ((q_byte(o + j) >> 6u) << 4u);
        mn = (q_byte(o + 8u + j) >> 4u) | ((q_byte(o + 4u + j) >> 6u) << 4u);
    }
    let scale = d * f32(sc);
    let shift = dmin * f32(mn);
    let qs = o + 16u + (j / 2u) * 32u;
    let nib = (j % 2u) * 4u;
    for (var k = 0u; k < 8u; k = k + 1u) {
        let wd = q_word(qs + 4u * k);
        for (var t = 0u; t < 4u; t = t + 1u) {
            (*v)[4u * k + t] = scale * f32((wd >> (8u * t + nib)) & 15u) - shift;
        }
    }
}
