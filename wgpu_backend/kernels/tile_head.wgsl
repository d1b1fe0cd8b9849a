// Included by matmul_tiled.wgsl and qmatmul_tiled.wgsl: the output, the tile configuration
// (tuning.tile_subs) and the two tiles in workgroup memory, K-major vec4s padded by one vec4
// per K-row: ta (BM rows of the left operand), tb (BN columns of the right one or rows of w).
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

const BM: u32 = {{BM}}u;
const BN: u32 = {{BN}}u;
const BK: u32 = {{BK}}u;
const AW: u32 = {{AW}}u;  // vec4s per K-row of the a tile: BM / 4 + 1 (padding)
const BW: u32 = {{BW}}u;  // vec4s per K-row of the b tile: BN / 4 + 1
const THREADS: u32 = {{THREADS}}u;  // (BN / 4) * (BM / 4)
var<workgroup> ta: array<vec4<f32>, {{A_TILE}}>;  // BK * AW
var<workgroup> tb: array<vec4<f32>, {{B_TILE}}>;  // BK * BW
