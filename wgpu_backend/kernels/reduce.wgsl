// One workgroup per output element (P(38) outputs). The input layout is permuted so that the
// kept dims come first and the R = P(37) reduced elements of output o are the
// flat elements o*R .. o*R+R-1. Threads stride over them, then a tree combine.
// argmax/argmin keep the first index of the extreme value (as numpy does).
@group(0) @binding(1) var<storage, read> x: array<SX>;
@group(0) @binding(2) var<storage, read_write> y: array<SY>;

alias CA = {{CA}};
var<workgroup> sv: array<CA, 64>;
var<workgroup> si: array<u32, 64>;

// Is (v2, i2) a better candidate than (v, i)?
fn better(v2: CA, i2: u32, v: CA, i: u32) -> bool {
    return {{BETTER}};
}

fn combine(acc: CA, v: CA) -> CA {
    return {{COMBINE}};
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>,
        @builtin(local_invocation_index) l: u32) {
    let o = w.x + w.y * n.x;
    if (o >= P(38u)) { return; }
    let r_count = P(37u);
    var acc: CA = {{INIT}};
    var idx: u32 = 0xffffffffu;
    for (var r = l; r < r_count; r = r + 64u) {
        let v = CA(lx(x[at(o * r_count + r, 0u)]));
        if ({{ARG}}) {
            if (better(v, r, acc, idx)) { acc = v; idx = r; }
        } else {
            acc = combine(acc, v);
        }
    }
    sv[l] = acc;
    si[l] = idx;
    workgroupBarrier();
    for (var s = 32u; s > 0u; s = s >> 1u) {
        if (l < s) {
            if ({{ARG}}) {
                if (better(sv[l + s], si[l + s], sv[l], si[l])) { sv[l] = sv[l + s]; si[l] = si[l + s]; }
            } else {
                sv[l] = combine(sv[l], sv[l + s]);
            }
        }
        workgroupBarrier();
    }
    if (l == 0u) {
        {{WRITE}}
    }
}
