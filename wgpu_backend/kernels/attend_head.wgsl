// Included by attend.wgsl and cache_attend.wgsl: keys go by in chunks of CHUNK, their
// scores (then weights) waiting in ps; qs holds the query row, parts the lanes' partial sums.
const CHUNK: u32 = 1024u;
var<workgroup> qs: array<vec4<f32>, 64>;
var<workgroup> ps: array<f32, 1024>;
var<workgroup> parts: array<vec4<f32>, 64>;
