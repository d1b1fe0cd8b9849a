// CUDA C's spelling of the kernel dialect (see common.h). The driver puts this first in
// every module's source; NVRTC (cupy.RawModule) and nvcc -ptx in CI compile the result.
#ifndef TALLOW_CUDA_CPU  // the CPU emulator (tallow_cuda/cpu_driver.py) brings its own half type
#include <cuda_fp16.h>
#endif

// ---- capabilities: CUDA has doubles and 64-bit atomic adds --------------------------
#define HAS_F64 1
#define HAS_ATOMIC64 1

// ---- types: MSL's short names, and real_t for float scalars (the host's F64 is a double) ----
typedef unsigned char uchar;
typedef signed char schar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef long long llong;
typedef unsigned long long ullong;
typedef double real_t;
#define REAL(x) x  // a real_t literal

// ---- qualifiers: CUDA needs none on pointers ---------------------------------------
#define DEVICE __device__ __forceinline__
#define GLOBAL
#define CONSTANT const
#define SHARED
#define SHARED_ARRAY(TYPE, NAME, N) __shared__ TYPE NAME[N]
#define BARRIER() __syncthreads()

// ---- kernel signatures: buffer indices are MSL's; CUDA passes arguments in order -------
#define KERNEL(NAME, ...) extern "C" __global__ void NAME(__VA_ARGS__)
#define BUF(TYPE, NAME, INDEX) TYPE* NAME
#define META(NAME, INDEX) const int* NAME
#define ARG(TYPE, NAME, INDEX) TYPE NAME

// ---- where a thread is (common.h: ThreadPos), from CUDA's builtins ---------------------
#define THREAD ThreadPos{blockIdx.x, blockIdx.y, threadIdx.x, blockDim.x, threadIdx.x % 32, threadIdx.x / 32, \
                         (llong)blockIdx.x * blockDim.x + threadIdx.x, (llong)gridDim.x * blockDim.x}

// ---- bits, halves, erf, atomics, warp sums --------------------------------------------
DEVICE float uint_bits_as_float(uint u) { return __uint_as_float(u); }
DEVICE uint float_bits_as_uint(float f) { return __float_as_uint(f); }
DEVICE float f16_to_f32(ushort h) { return __half2float(__ushort_as_half(h)); }
DEVICE ushort f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
#define ERF(x) erf(x)

DEVICE void atomic_add(float* p, float v) { atomicAdd(p, v); }
DEVICE void atomic_add(double* p, double v) { atomicAdd(p, v); }
DEVICE void atomic_add(int* p, int v) { atomicAdd(p, v); }
DEVICE void atomic_add(uint* p, uint v) { atomicAdd(p, v); }
DEVICE void atomic_add(llong* p, llong v) { atomicAdd((ullong*)p, (ullong)v); }  // two's complement: same bits

// The sum over the 32 lanes of a warp, in lane 0.
DEVICE float warp_sum(float v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}
