    // (tile_begin.wgsl, in main of the tiled kernels) sizes, this workgroup's tile, and the
    // thread's 4x4 register block.
    let m = P(0u);
    let nn = P(1u);
    let kk = P(2u);
    let row_t = wg.y * BM;
    let col_t = wg.x * BN;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
