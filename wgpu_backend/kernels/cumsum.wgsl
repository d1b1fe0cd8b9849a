// One invocation per line along the scanned dim. The layout is permuted so the
// scanned dim (length L = P(37)) is last; operand 1 holds the output's strides
// permuted the same way (the output itself is contiguous in the original order).
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read_write> y: array<SY>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let line = flat_id(w, n, l, 64u);
    let len = P(37u);
    if (line >= P(38u)) { return; }
    var acc: CY = CY(0);
    for (var j = 0u; j < len; j = j + 1u) {
        let i = line * len + j;
        acc = acc + CY(lx(x[at(i, 0u)]));
        y[at(i, 1u)] = sy(acc);
    }
}
