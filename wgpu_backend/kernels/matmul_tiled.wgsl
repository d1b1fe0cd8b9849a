// Workgroup-tiled batched matmul y (batch, M, N) = a (batch, M, K) . b (batch, K, N),
// for GPUs with fast shared memory (CPU-emulated adapters run matmul.wgsl and
// matmul_rows.wgsl faster; tuning.py measures which). Each workgroup computes a
// BM x BN tile of y; per step of BK along K its threads copy a BM x BK tile of a
// and a BK x BN tile of b into workgroup memory once (fill_tiles: strided or vec4
// loads, an extra file), then each thread multiplies them into a 4x4 register
// block. Tiles are stored K-major as vec4s of 4 rows (4 columns) so the inner loop
// reads one vec4 of each per 16 multiply-adds; rows are padded by one vec4 so the
// transposing stores of fill_tiles hit different banks. Out-of-range elements load
// as 0 and are not written. Same parameters as matmul.wgsl.
// #include "tile_head.wgsl"

@compute @workgroup_size({{TX}}, {{TY}}, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    // #include "tile_begin.wgsl"
    for (var k0 = 0u; k0 < kk; k0 = k0 + BK) {
        fill_tiles(wg.z, row_t, col_t, k0, li);
        // #include "tile_multiply.wgsl"
    }
    let out = wg.z * m * nn;
    // #include "tile_store.wgsl"
}
