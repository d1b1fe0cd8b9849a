    // (qmatvec_cols.wgsl, in main of qmatvec*.wgsl) the input rows, then this invocation's 4
    // output columns from col0; rb bytes per row of w.
    input_begin(w, n, l);
    let nn = P(1u);
    let kk = P(2u);
    let col0 = flat_id(w, n, l, 64u) * 4u;
    if (col0 >= nn) { return; }
    let rb = P(3u);
    // Columns past the end repeat the last one and are not written.
    let cols = min(vec4<u32>(col0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nn - 1u));
