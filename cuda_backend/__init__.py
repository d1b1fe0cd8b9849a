"""tallow_cuda: tallow's backend contract as CUDA C kernels (written once with Metal's, in
tallow/backends/gpu_kernels/), driven through CuPy (cupy.RawModule; cuBLAS for dense
matmul). Import is free of cupy: `tallow.Device("cuda")` constructs
`tallow_cuda.backend.CudaBackend`, which raises tallow.DeviceError naming what is missing
(cupy, a CUDA device)."""
