// Q4_1: 20-byte blocks of 32: f16 d, f16 m, 16 bytes of nibbles as Q4_0; x = d * q + m.
fn deq32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let o = row + s * 20u;
    let d = q_half(o);
    let m = q_half(o + 2u);
    for (var k = 0u; k < 4u; k = k + 1u) {
        let wd = q_word(o + 4u + 4u * k);
        for (var t = 0u; t < 4u; t = t + 1u) {
            let b = (wd >> (8u * t)) & 0xffu;
            (*v)[4u * k + t] = d * f32(b & 15u) + m;
            (*v)[4u * k + t + 16u] = d * f32(b >> 4u) + m;
        }
    }
}
