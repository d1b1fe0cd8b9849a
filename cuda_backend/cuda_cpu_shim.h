// Test-only: lets g++ compile tallow's CUDA C kernels for the CPU emulator (cpu_driver.py).
// CUDA's qualifiers become nothing (__shared__ becomes static: shared by the block's
// threads, which run as fibers, see cpu_fibers.h), threadIdx/blockIdx/blockDim/gridDim
// read the emulated thread, __syncthreads and __shfl_down_sync synchronise the block's
// fibers, atomics are plain adds (one OS thread), and __half is _Float16.
// It runs the kernels' logic; it says nothing about warp divergence, memory coalescing,
// races between blocks, or the GPU's float rounding.
#pragma once
#define TALLOW_CUDA_CPU 1
#include <cmath>
#include <cstring>
#include "cpu_fibers.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct tallow_dim3 { unsigned x, y, z; };
inline tallow_dim3 tallow_thread_idx() { const TallowCtx& c = tallow_cpu::current->ctx; return {c.local[0], c.local[1], c.local[2]}; }
inline tallow_dim3 tallow_block_idx() { const TallowCtx& c = tallow_cpu::current->ctx; return {c.group[0], c.group[1], c.group[2]}; }
inline tallow_dim3 tallow_block_dim() { const TallowCtx& c = tallow_cpu::current->ctx; return {c.block[0], c.block[1], c.block[2]}; }
inline tallow_dim3 tallow_grid_dim() { const TallowCtx& c = tallow_cpu::current->ctx; return {c.grid[0], c.grid[1], c.grid[2]}; }
#define threadIdx (tallow_thread_idx())
#define blockIdx (tallow_block_idx())
#define blockDim (tallow_block_dim())
#define gridDim (tallow_grid_dim())

inline void __syncthreads() { tallow_barrier(); }

inline float __shfl_down_sync(unsigned, float v, int offset) {
    const TallowCtx& c = tallow_cpu::current->ctx;
    unsigned size = c.block[0] * c.block[1] * c.block[2];
    tallow_cpu::slots[c.flat] = v;
    tallow_barrier();
    float r = (c.flat % 32 + offset < 32 && c.flat + offset < size) ? tallow_cpu::slots[c.flat + offset] : v;
    tallow_barrier();
    return r;
}

typedef _Float16 __half;
inline __half __ushort_as_half(unsigned short u) { __half h; std::memcpy(&h, &u, 2); return h; }
inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }

template <class T> inline T atomicAdd(T* p, T v) { T old = *p; *p += v; return old; }

using std::ceil; using std::cos; using std::erf; using std::exp; using std::fabs; using std::floor; using std::log;
using std::pow; using std::rint; using std::sin; using std::sqrt; using std::tanh;
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
template <class T> inline T max(T a, T b) { return a > b ? a : b; }
