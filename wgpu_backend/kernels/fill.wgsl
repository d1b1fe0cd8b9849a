// y[i] = start + step * i (full: step = 0). start/step are P(37), P(38) in y's compute type.
@group(0) @binding(1) var<storage, read_write> y: array<SY>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    y[i] = sy({{VALUE}});
}
