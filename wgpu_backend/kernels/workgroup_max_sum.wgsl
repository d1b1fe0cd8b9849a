// The max and the sum of x over a 64-invocation workgroup, returned to every invocation, with
// two barriers each: every invocation reads all 64 partial values (CPU-emulated adapters pay
// dearly per barrier; 64 reads are cheap). l is the local invocation index.
var<workgroup> red: array<f32, 64>;

fn reduce_max(l: u32, x: f32) -> f32 {
    red[l] = x;
    workgroupBarrier();
    var m = red[0];
    for (var s = 1u; s < 64u; s = s + 1u) { m = max(m, red[s]); }
    workgroupBarrier();
    return m;
}

fn reduce_sum(l: u32, x: f32) -> f32 {
    red[l] = x;
    workgroupBarrier();
    var m = 0.0;
    for (var s = 0u; s < 64u; s = s + 1u) { m = m + red[s]; }
    workgroupBarrier();
    return m;
}
