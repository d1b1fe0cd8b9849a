"""WebGPU backend for tallow (WGSL kernels; native and browser drivers)."""
