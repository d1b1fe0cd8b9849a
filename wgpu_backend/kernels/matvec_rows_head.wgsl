// Included by matvec_rows.wgsl and matvec_rows_glu.wgsl: w's rows (b's columns) as vec4s, the
// output, the activation.
@group(0) @binding(1) var<storage, read> b: array<vec4<SX>>;
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

fn bv(i: u32) -> vec4<f32> { return vec4<f32>(b[i]); }

fn act(v: f32) -> f32 { return {{ACT}}; }
