// Workgroup-tiled y (M, N) = x (M, K) . w^T with w (N, K) in a GGUF block format, for
// prefills longer than QMATVEC_MAX_ROWS on GPUs with fast shared memory (qmatmul.wgsl
// is faster on CPU-emulated adapters; tuning.py measures which). Each workgroup
// computes a BM x BN tile of y. Per half block (16 of K) its threads dequantise the
// BN weight rows' 16 elements into workgroup memory once (one q_quad each: 4 elements)
// and copy x's BM x 16 tile next to them; every row of the tile then reuses the
// dequantised weights. Each thread multiplies them into a 4x4 register block. Tiles
// are K-major vec4s padded by one vec4 per K-row (as matmul_tiled.wgsl).
// P: 0 M, 1 N, 2 K, 3 bytes per row of w, 4 x offset (elements).
@group(0) @binding(2) var<storage, read> x: array<SX>;
// #include "tile_head.wgsl"

@compute @workgroup_size({{TX}}, {{TY}}, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    // #include "tile_begin.wgsl"
    for (var k0 = 0u; k0 < kk; k0 = k0 + BK) {  // BK = 16: half a block
        let s = k0 / 32u;
        let hb = (k0 / 16u) % 2u;  // which half of block s
        // Weights: 4 quads of 4 elements per row; rows past N repeat the last (not written).
        for (var e = li; e < BN * 4u; e = e + THREADS) {
            let n = e / 4u;
            let q = e % 4u;
            let row = min(col_t + n, nn - 1u) * P(3u);
            let v = q_quad(row, s, 4u * hb + q, q_scales(row, s));
            for (var j = 0u; j < 4u; j = j + 1u) { tb[(4u * q + j) * BW + n / 4u][n % 4u] = v[j]; }
        }
        // x: consecutive threads along K (coalesced); rows past M load as 0.
        for (var e = li; e < BM * 16u; e = e + THREADS) {
            let r = e / 16u;
            let c = e % 16u;
            var v = 0.0;
            if (row_t + r < m) { v = f32(lx(x[P(4u) + (row_t + r) * kk + k0 + c])); }
            ta[c * AW + r / 4u][r % 4u] = v;
        }
        // #include "tile_multiply.wgsl"
    }
    let out = 0u;  // one batch
    // #include "tile_store.wgsl"
}
