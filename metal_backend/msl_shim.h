// Test-only: lets g++ -fsyntax-only -std=c++17 check tallow's MSL sources as C++.
// Metal's address-space qualifiers become nothing, its attributes [[buffer(0)]] become
// empty attribute lists, and the types and library functions the kernels use are
// declared here with Metal's signatures. It catches syntax errors, undeclared names,
// type mismatches and wrong argument counts; it does not catch Metal-only rules
// (address-space mismatches, threadgroup declarations outside kernels, MSL's exact
// overload set, resource limits) -- only newLibraryWithSource on a Mac does.
#pragma once
#define TALLOW_MSL_SHIM 1
#include <cmath>
#include <cstdint>
#include <cstring>

// address spaces and function qualifiers
#define kernel extern "C"  // unmangled, so the tests can list the kernels
#define device
#define constant
#define threadgroup
#define thread

// attributes: [[buffer(3)]] -> [[]] (kept as written when the CPU emulator lists kernel parameters)
#ifndef TALLOW_MSL_KEEP_ATTRIBUTES
#define buffer(i)
#define thread_position_in_grid
#define threads_per_grid
#define thread_position_in_threadgroup
#define thread_index_in_threadgroup
#define threadgroup_position_in_grid
#define threads_per_threadgroup
#define thread_index_in_simdgroup
#define simdgroup_index_in_threadgroup
#endif

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

struct uint2 { uint x, y; };
struct uint3 { uint x, y, z; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };

template <class To, class From>
inline To as_type(From v) {
    static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
    To r;
    std::memcpy(&r, &v, sizeof(To));
    return r;
}

using std::abs; using std::ceil; using std::cos; using std::exp; using std::fabs; using std::floor;
using std::isnan; using std::log; using std::pow; using std::rint; using std::sin; using std::sqrt; using std::tanh;
template <class T> inline T min(T a, T b) { return a < b ? a : b; }
template <class T> inline T max(T a, T b) { return a > b ? a : b; }

namespace metal {}  // a user's kernel (a CustomOp) says `using namespace metal;`
namespace mem_flags { enum flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 }; }
void threadgroup_barrier(mem_flags::flags);
float simd_sum(float);

enum memory_order { memory_order_relaxed };
struct atomic_float { float v; };
struct atomic_int { int v; };
struct atomic_uint { uint v; };
float atomic_fetch_add_explicit(atomic_float*, float, memory_order);
int atomic_fetch_add_explicit(atomic_int*, int, memory_order);
uint atomic_fetch_add_explicit(atomic_uint*, uint, memory_order);
