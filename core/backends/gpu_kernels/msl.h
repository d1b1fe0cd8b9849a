// Metal Shading Language's spelling of the kernel dialect (see common.h). The driver puts
// this first in every module's source; Metal compiles it at run time (fast math off), and
// the tests check it as C++ against tallow_metal/msl_shim.h.
#ifndef TALLOW_MSL_SHIM
#include <metal_stdlib>
using namespace metal;
#endif

// ---- capabilities: Metal has no double and no 64-bit atomic add -------------------------
#define HAS_F64 0
#define HAS_ATOMIC64 0

// ---- types (uchar, ushort, uint are Metal's own); float scalars arrive as float -------------
typedef char schar;
typedef long llong;
typedef ulong ullong;
typedef float real_t;
#define REAL(x) x##f  // a real_t literal (no double literals in MSL)

// ---- qualifiers: Metal's address spaces ---------------------------------------------------
// Threadgroup arrays are declared in kernels (an MSL rule) with TG_SHARED: `threadgroup` on
// a GPU; the CPU emulator (tallow_metal/msl_cpu_runtime.h) makes them static.
#ifndef TG_SHARED
#define TG_SHARED threadgroup
#endif
#define DEVICE inline
#define GLOBAL device
#define CONSTANT constant
#define SHARED threadgroup
#define SHARED_ARRAY(TYPE, NAME, N) TG_SHARED TYPE NAME[N]
#define BARRIER() threadgroup_barrier(mem_flags::mem_threadgroup)

// ---- kernel signatures: buffers and scalars bound by index (setBuffer / setBytes) ---------
// Every kernel also takes the thread-position builtins, read by THREAD.
#define KERNEL(NAME, ...)                                                                        \
    kernel void NAME(__VA_ARGS__, uint3 tallow_group [[threadgroup_position_in_grid]],           \
                     uint3 tallow_local [[thread_position_in_threadgroup]],                      \
                     uint3 tallow_block [[threads_per_threadgroup]],                             \
                     uint3 tallow_grid [[threads_per_grid]], uint tallow_lane [[thread_index_in_simdgroup]], \
                     uint tallow_warp [[simdgroup_index_in_threadgroup]])
#define BUF(TYPE, NAME, INDEX) device TYPE* NAME [[buffer(INDEX)]]
#define META(NAME, INDEX) constant int* NAME [[buffer(INDEX)]]
#define ARG(TYPE, NAME, INDEX) constant TYPE& NAME [[buffer(INDEX)]]

// ---- where a thread is (common.h: ThreadPos), from the builtins KERNEL declares -------------
#define THREAD ThreadPos{tallow_group.x, tallow_group.y, tallow_local.x, tallow_block.x, tallow_lane, tallow_warp, \
                         long(tallow_group.x) * tallow_block.x + tallow_local.x, long(tallow_grid.x)}

// ---- bits, halves, erf, atomics, simdgroup sums ----------------------------------------
DEVICE float uint_bits_as_float(uint u) { return as_type<float>(u); }
DEVICE uint float_bits_as_uint(float f) { return as_type<uint>(f); }
DEVICE float f16_to_f32(ushort h) { return float(as_type<half>(h)); }
DEVICE ushort f32_to_f16(float f) { return as_type<ushort>(half(f)); }

// erf is not in Metal's standard library: Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
DEVICE float erf_approx(float x) {
    float t = 1.0f / (1.0f + 0.3275911f * fabs(x));
    float y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t * exp(-x * x);
    return x < 0.0f ? -y : y;
}
#define ERF(x) erf_approx(x)

DEVICE void atomic_add(device float* p, float v) { atomic_fetch_add_explicit((device atomic_float*)p, v, memory_order_relaxed); }
DEVICE void atomic_add(device int* p, int v) { atomic_fetch_add_explicit((device atomic_int*)p, v, memory_order_relaxed); }
DEVICE void atomic_add(device uint* p, uint v) { atomic_fetch_add_explicit((device atomic_uint*)p, v, memory_order_relaxed); }

// The sum over the 32 lanes of a simdgroup (in every lane).
DEVICE float warp_sum(float v) { return simd_sum(v); }
