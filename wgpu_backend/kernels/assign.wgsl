// In-place strided write: y[layout 1][i] = x[layout 0][i] (cat, pad, KV caches).
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    y[at(i, 1u)] = x[at(i, 0u)];
}
