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
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const AW: u32 = {{AW}}u;  // vec4s per K-row of the a tile: BM / 4 + 1 (padding)
const BW: u32 = {{BW}}u;  // vec4s per K-row of the b tile: BN / 4 + 1
const THREADS: u32 = {{THREADS}}u;  // (BN / 4) * (BM / 4)
var<workgroup> ta: array<vec4<f32>, {{A_TILE}}>;  // BK * AW
var<workgroup> tb: array<vec4<f32>, {{B_TILE}}>;  // BK * BW

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
    for (var k0 = 0u; k0 < kk; k0 = k0 + BK) {
        fill_tiles(wg.z, row_t, col_t, k0, li);
        workgroupBarrier();
        for (var c = 0u; c < BK; c = c + 1u) {
            let av = ta[c * AW + lid.y];
            let bv = tb[c * BW + lid.x];
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
    let out = wg.z * m * nn;
    let rows = array<vec4<f32>, 4>(c0, c1, c2, c3);
    for (var r = 0u; r < min(4u, m - row0); r = r + 1u) {
        for (var c = 0u; c < min(4u, nn - col0); c = c + 1u) {
            y[out + (row0 + r) * nn + col0 + c] = sx(rows[r][c]);
        }
    }
}
