// fill_tiles for matmul_tiled.wgsl with any strides: one element per load. Consecutive
// threads take consecutive elements along whichever of a tile's two axes has stride 1
// in memory, so their loads coalesce on GPUs.
@group(0) @binding(1) var<storage, read> a: array<SX>;
@group(0) @binding(2) var<storage, read> b: array<SX>;

fn fill_tiles(bi: u32, row_t: u32, col_t: u32, k0: u32, li: u32) {
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let a_base = PI(4u) + i32(bi) * PI(5u);
    let a_rs = PI(6u);
    let a_cs = PI(7u);
    let b_base = PI(8u) + i32(bi) * PI(9u);
    let b_rs = PI(10u);
    let b_cs = PI(11u);
    for (var e = li; e < BM * BK; e = e + THREADS) {
        var r = e % BM;
        var c = e / BM;
        if (a_cs == 1) { r = e / BK; c = e % BK; }
        let gr = row_t + r;
        let gk = k0 + c;
        var v = 0.0;
        if (gr < m && gk < kk) { v = f32(lx(a[a_base + i32(gr) * a_rs + i32(gk) * a_cs])); }
        ta[c * AW + r / 4u][r % 4u] = v;
    }
    for (var e = li; e < BN * BK; e = e + THREADS) {
        var n = e % BN;
        var c = e / BN;
        if (b_rs == 1) { n = e / BK; c = e % BK; }
        let gn = col_t + n;
        let gk = k0 + c;
        var v = 0.0;
        if (gn < nn && gk < kk) { v = f32(lx(b[b_base + i32(gk) * b_rs + i32(gn) * b_cs])); }
        tb[c * BW + n / 4u][n % 4u] = v;
    }
}
