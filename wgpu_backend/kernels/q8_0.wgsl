// Q8_0: 34-byte blocks of 32: f16 d, 32 x i8 q; x = d * q.
fn deq32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let o = row + s * 34u;
    let d = q_half(o);
    for (var k = 0u; k < 8u; k = k + 1u) {
        let wd = q_word(o + 2u + 4u * k);
        for (var t = 0u; t < 4u; t = t + 1u) { (*v)[4u * k + t] = d * sext8((wd >> (8u * t)) & 0xffu); }
    }
}
