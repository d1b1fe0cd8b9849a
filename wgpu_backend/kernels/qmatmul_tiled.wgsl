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
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const AW: u32 = {{AW}}u;  // BM / 4 + 1
const BW: u32 = {{BW}}u;  // BN / 4 + 1
const THREADS: u32 = {{THREADS}}u;
var<workgroup> tx: array<vec4<f32>, {{A_TILE}}>;  // 16 * AW
var<workgroup> tw: array<vec4<f32>, {{B_TILE}}>;  // 16 * BW

@compute @workgroup_size({{TX}}, {{TY}}, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let row_t = wg.y * BM;
    let col_t = wg.x * BN;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < kk; k0 = k0 + 16u) {
        let s = k0 / 32u;
        let hb = (k0 / 16u) % 2u;  // which half of block s
        // Weights: 4 quads of 4 elements per row; rows past N repeat the last (not written).
        for (var e = li; e < BN * 4u; e = e + THREADS) {
            let n = e / 4u;
            let q = e % 4u;
            let row = min(col_t + n, nn - 1u) * P(3u);
            let v = q_quad(row, s, 4u * hb + q, q_scales(row, s));
            for (var j = 0u; j < 4u; j = j + 1u) { tw[(4u * q + j) * BW + n / 4u][n % 4u] = v[j]; }
        }
        // x: consecutive threads along K (coalesced); rows past M load as 0.
        for (var e = li; e < BM * 16u; e = e + THREADS) {
            let r = e / 16u;
            let c = e % 16u;
            var v = 0.0;
            if (row_t + r < m) { v = f32(lx(x[P(4u) + (row_t + r) * kk + k0 + c])); }
            tx[c * AW + r / 4u][r % 4u] = v;
        }
        workgroupBarrier();
        for (var c = 0u; c < 16u; c = c + 1u) {
            let av = tx[c * AW + lid.y];
            let bv = tw[c * BW + lid.x];
            c0 = c0 + av.x * bv;
            c1 = c1 + av.y * bv;
            c2 = c2 + av.z * bv;
            c3 = c3 + av.w * bv;
        }
        workgroupBarrier();
    }
    let row0 = row_t + 4u * lid.y;
    let col0 = col_t + 4u * lid.x;
    if (row0 >= m || col0 >= nn) { return; }
    let rows = array<vec4<f32>, 4>(c0, c1, c2, c3);
    for (var r = 0u; r < min(4u, m - row0); r = r + 1u) {
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            y[(row0 + r) * nn + col0 + c] = sx(rows[r][c]);
        }
    }
}
