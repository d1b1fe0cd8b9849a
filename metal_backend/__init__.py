"""tallow_metal: tallow's backend contract as Metal Shading Language kernels (written once
with CUDA's, in tallow/backends/gpu_kernels/; Metal-only ones in kernels/), driven through
PyObjC on macOS. Import is free of PyObjC: `tallow.Device("metal")` constructs
`tallow_metal.backend.MetalBackend`, which raises tallow.DeviceError naming what is missing
(macOS, PyObjC, a Metal device)."""
