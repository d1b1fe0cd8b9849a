// fill_tiles for matmul_tiled.wgsl when a's rows and b's columns are contiguous along K
// and start at multiples of 4 elements, with K % 4 == 0 (x . w^T of a Linear layer,
// q . k^T of attention): 4 elements per load, consecutive threads along K.
@group(0) @binding(1) var<storage, read> a: array<vec4<SX>>;
@group(0) @binding(2) var<storage, read> b: array<vec4<SX>>;

fn fill_tiles(bi: u32, row_t: u32, col_t: u32, k0: u32, li: u32) {
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let q = BK / 4u;
    let a_base = (P(4u) + bi * P(5u)) / 4u;
    let b_base = (P(8u) + bi * P(9u)) / 4u;
    for (var e = li; e < BM * q; e = e + THREADS) {
        let r = e / q;
        let c = 4u * (e % q);
        let gr = row_t + r;
        var v = vec4<f32>(0.0);
        if (gr < m && k0 + c < kk) { v = vec4<f32>(a[a_base + (gr * P(6u) + k0 + c) / 4u]); }
        for (var j = 0u; j < 4u; j = j + 1u) { ta[(c + j) * AW + r / 4u][r % 4u] = v[j]; }
    }
    for (var e = li; e < BN * q; e = e + THREADS) {
        let n = e / q;
        let c = 4u * (e % q);
        let gn = col_t + n;
        var v = vec4<f32>(0.0);
        if (gn < nn && k0 + c < kk) { v = vec4<f32>(b[b_base + (gn * P(11u) + k0 + c) / 4u]); }
        for (var j = 0u; j < 4u; j = j + 1u) { tb[(c + j) * BW + n / 4u][n % 4u] = v[j]; }
    }
}
