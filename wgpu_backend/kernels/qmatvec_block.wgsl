// Block s of input row `row` into xb (and its sum into xsum, see quant_common.wgsl) for the
// format's q_dot: shared by qmatvec.wgsl and qmatvec_glu.wgsl.
fn load_block(row: u32, s: u32) {
    var t = vec4<f32>(0.0);
    for (var j = 0u; j < 8u; j = j + 1u) {
        xb[j] = xin4(row, s * 32u + 4u * j);
        t = t + xb[j];
    }
    xsum = t.x + t.y + t.z + t.w;
}
