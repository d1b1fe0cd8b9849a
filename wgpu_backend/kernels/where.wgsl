// y = cond ? a : b, all three strided.
@group(0) @binding(1) var<storage, read> c: array<SC>;
@group(0) @binding(2) var<storage, read> a: array<SX>;
@group(0) @binding(3) var<storage, read> b: array<SX>;
@group(0) @binding(4) var<storage, read_write> y: array<SX>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let i = flat_id(w, n, l, 256u);
    if (i >= P(0u)) { return; }
    let t = lc(c[at(i, 0u)]) != CC(0);
    y[i] = select(b[at(i, 2u)], a[at(i, 1u)], t);
}
