// Q4_0: 18-byte blocks of 32: f16 d, 16 bytes; element e < 16 is the low
// nibble of byte e, element e + 16 its high nibble; x = d * (q - 8).
fn deq32(row: u32, s: u32, v: ptr<function, array<f32, 32>>) {
    let o = row + s * 18u;
    let d = q_half(o);
    for (var k = 0u; k < 4u; k = k + 1u) {
        let wd = q_word(o + 2u + 4u * k);
        for (var t = 0u; t < 4u; t = t + 1u) {
            let b = (wd >> (8u * t)) & 0xffu;
            (*v)[4u * k + t] = d * (f32(b & 15u) - 8.0);
            (*v)[4u * k + t + 16u] = d * (f32(b >> 4u) - 8.0);
        }
    }
}
