// Q8_0: 34-byte blocks of 32: f16 d, 32 x i8 q; x = d * q.
// Each format gives the scales of sub-block s (32 elements) of a row starting
// at byte `row`, and elements 4k .. 4k+3 of it (k < 8) as a vec4.
fn q_scales(row: u32, s: u32) -> vec2<f32> { return vec2<f32>(q_half(row + s * 34u), 0.0); }

fn q_quad(row: u32, s: u32, k: u32, sc: vec2<f32>) -> vec4<f32> {
    let wd = q_word(row + s * 34u + 2u + 4u * k);
    return sc.x * vec4<f32>(sext8(wd & 0xffu), sext8((wd >> 8u) & 0xffu), sext8((wd >> 16u) & 0xffu), sext8(wd >> 24u));
}

// Dot of block s with xb (x's 32 elements, see qmatvec.wgsl). The 34-byte block starts 0 or 2 mod 4: load the 9
// words covering it and shift the byte words into place.
fn q_dot(row: u32, s: u32) -> f32 {
    let b = row + s * 34u;
    let o = b >> 2u;
    let odd = (b & 2u) != 0u;
    let d = unpack2x16float(select(wq[o], wq[o] >> 16u, odd)).x;
    var acc = vec4<f32>(0.0);
    var lo = wq[o];
    for (var j = 0u; j < 8u; j = j + 1u) {
        let hi = wq[o + 1u + j];
        let v = vec4<u32>(select((lo >> 16u) | (hi << 16u), hi, odd));
        acc = acc + vec4<f32>(bitcast<vec4<i32>>(v << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)) * xb[j];
        lo = hi;
    }
    return d * (acc.x + acc.y + acc.z + acc.w);
}
