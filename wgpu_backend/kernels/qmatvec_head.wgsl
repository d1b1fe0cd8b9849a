// Included by qmatvec.wgsl and qmatvec_glu.wgsl: the output and the activation.
@group(0) @binding(3) var<storage, read_write> y: array<SX>;

fn act(v: f32) -> f32 { return {{ACT}}; }
