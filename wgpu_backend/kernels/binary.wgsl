// y = op(a, b) element-wise; a and b are strided (broadcast dims have stride 0).
// Also compare ops (CY = u32 bool) and the fill of `where`.
@group(0) @binding(1) var<storage, read> a: array<SX>;
@group(0) @binding(2) var<storage, read> b: array<SX>;
@group(0) @binding(3) var<storage, read_write> y: array<SY>;

fn op(p: CX, q: CX) -> CY {
    return {{OP}};
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    y[i] = sy(op(lx(a[at(i, 0u)]), lx(b[at(i, 1u)])));
}
