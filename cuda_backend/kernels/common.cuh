// Shared by every tallow CUDA kernel file: dtype tags, strided indexing, op tables.
// Compiled by NVRTC at run time (cupy.RawModule) and by nvcc -ptx in CI.
#pragma once
#ifndef TALLOW_CUDA_CPU  // the CPU emulator (cpu_driver.py) brings its own half type
#include <cuda_fp16.h>
#endif

#define MAX_DIMS 8
#define BLOCK 256

// ---- strided indexing ------------------------------------------------------
// meta (int32): [ndim, shape[MAX_DIMS], then per operand: offset, strides[MAX_DIMS]]
// (packed by tallow_cuda/host.py: pack_meta).
__device__ __forceinline__ long long strided_offset(const int* meta, int operand, long long i) {
    int nd = meta[0];
    const int* shape = meta + 1;
    const int* os = meta + 1 + MAX_DIMS + operand * (MAX_DIMS + 1);
    long long off = os[0];
    if (nd == 1) return off + i * os[1];  // the common case after merging dims: no division
    for (int d = nd - 1; d >= 0; --d) {
        long long s = shape[d];
        off += (i % s) * os[1 + d];
        i /= s;
    }
    return off;
}

// ---- f16 / bf16 bit conversions (storage is the 16-bit pattern) --------------
__device__ __forceinline__ float f16_to_f32(unsigned short h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ unsigned short f32_to_f16(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float bf16_to_f32(unsigned short h) { return __uint_as_float(((unsigned int)h) << 16); }
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    // Round to nearest even, as the numpy backend does; NaN stays a quiet NaN.
    if (f != f) return 0x7FC0;
    unsigned int u = __float_as_uint(f);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ---- dtype tags: storage type S, compute type C, load/store, kind ------------
// wide(): a double for float kinds, a long long for integer kinds (used by cast).
#define TAG_PLAIN(NAME, STYPE, CTYPE, FLOATKIND)                                   \
    struct T_##NAME {                                                            \
        typedef STYPE S; typedef CTYPE C;                                        \
        static const bool is_float = FLOATKIND;                                  \
        static __device__ __forceinline__ C load(S s) { return (C)s; }           \
        static __device__ __forceinline__ S store(C c) { return (S)c; }          \
    };
TAG_PLAIN(f32, float, float, true)
TAG_PLAIN(f64, double, double, true)
TAG_PLAIN(i64, long long, long long, false)
TAG_PLAIN(i32, int, int, false)
TAG_PLAIN(i8, signed char, int, false)
TAG_PLAIN(u32, unsigned int, unsigned int, false)
TAG_PLAIN(u8, unsigned char, unsigned int, false)
struct T_bool {
    typedef unsigned char S; typedef unsigned int C;
    static const bool is_float = false;
    static __device__ __forceinline__ C load(S s) { return s != 0; }
    static __device__ __forceinline__ S store(C c) { return c != 0; }
};
struct T_f16 {
    typedef unsigned short S; typedef float C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(S s) { return f16_to_f32(s); }
    static __device__ __forceinline__ S store(C c) { return f32_to_f16(c); }
};
struct T_bf16 {
    typedef unsigned short S; typedef float C;
    static const bool is_float = true;
    static __device__ __forceinline__ C load(S s) { return bf16_to_f32(s); }
    static __device__ __forceinline__ S store(C c) { return f32_to_bf16(c); }
};

#define FOR_EACH_DTYPE(X) X(f32) X(f16) X(bf16) X(f64) X(i64) X(i32) X(i8) X(u32) X(u8) X(bool)
#define FOR_EACH_FLOAT(X) X(f32) X(f16) X(bf16) X(f64)

// ---- unary ops (codes in tallow_cuda/host.py: UNARY_CODES) -------------------
enum { U_NEG, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_SIN, U_COS, U_TANH, U_SIGMOID, U_RELU, U_GELU,
       U_GELU_TANH, U_SILU, U_SQUARE, U_RECIPROCAL, U_FLOOR, U_CEIL, U_ROUND, U_SIGN, U_CLAMP,
       U_POW_SCALAR, U_AFFINE };

template <class F>
__device__ __forceinline__ F unary_float(int op, F v, double a0, double a1) {
    switch (op) {
    case U_NEG: return -v;
    case U_ABS: return fabs(v);
    case U_EXP: return exp(v);
    case U_LOG: return log(v);
    case U_SQRT: return sqrt(v);
    case U_RSQRT: return F(1) / sqrt(v);
    case U_SIN: return sin(v);
    case U_COS: return cos(v);
    case U_TANH: return tanh(v);
    case U_SIGMOID: return F(1) / (F(1) + exp(-v));
    case U_RELU: return v < F(0) ? F(0) : v;  // keeps NaN, as numpy
    case U_GELU: return F(0.5) * v * (F(1) + erf(v * F(0.70710678118654752)));
    case U_GELU_TANH: return F(0.5) * v * (F(1) + tanh(F(0.79788456080286536) * (v + F(0.044715) * v * v * v)));
    case U_SILU: return v / (F(1) + exp(-v));
    case U_SQUARE: return v * v;
    case U_RECIPROCAL: return F(1) / v;
    case U_FLOOR: return floor(v);
    case U_CEIL: return ceil(v);
    case U_ROUND: return rint(v);  // half to even, as numpy
    case U_SIGN: return v > F(0) ? F(1) : (v < F(0) ? F(-1) : v);  // keeps 0 and NaN
    case U_CLAMP: { F r = v < F(a0) ? F(a0) : v; return r > F(a1) ? F(a1) : r; }
    case U_POW_SCALAR: return pow(v, F(a0));
    case U_AFFINE: return v * F(a0) + F(a1);
    }
    return v;
}

template <class I>
__device__ __forceinline__ I unary_int(int op, I v, double a0, double a1) {
    switch (op) {
    case U_NEG: return (I)(0 - v);
    case U_ABS: return (long long)v < 0 ? (I)(0 - v) : v;
    case U_RELU: return v > (I)0 ? v : (I)0;
    case U_SQUARE: return v * v;
    case U_FLOOR: case U_CEIL: case U_ROUND: return v;
    case U_SIGN: return v > (I)0 ? (I)1 : ((long long)v < 0 ? (I)(0 - 1) : (I)0);
    case U_CLAMP: return (double)v < a0 ? (I)(long long)a0 : ((double)v > a1 ? (I)(long long)a1 : v);  // v exact
    case U_POW_SCALAR: { I r = 1; for (long long e = (long long)a0; e > 0; --e) r *= v; return r; }
    case U_AFFINE: return (I)(v * (I)(long long)a0 + (I)(long long)a1);  // integer arithmetic, wrapping as numpy
    }
    // Transcendental ops on integers: computed in double (the front end sends floats here).
    return (I)(long long)unary_float<double>(op, (double)v, a0, a1);
}

__device__ __forceinline__ float apply_unary(int op, float v, double a0, double a1) { return unary_float<float>(op, v, a0, a1); }
__device__ __forceinline__ double apply_unary(int op, double v, double a0, double a1) { return unary_float<double>(op, v, a0, a1); }
template <class I>
__device__ __forceinline__ I apply_unary(int op, I v, double a0, double a1) { return unary_int<I>(op, v, a0, a1); }

// ---- binary ops (codes: BINARY_CODES) ------------------------------------------
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAXIMUM, B_MINIMUM };

template <class F>
__device__ __forceinline__ F binary_float(int op, F a, F b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_POW: return pow(a, b);
    case B_MAXIMUM: return (a != a || a > b) ? a : b;  // NaN propagates, as numpy
    case B_MINIMUM: return (a != a || a < b) ? a : b;
    }
    return a;
}

template <class I>
__device__ __forceinline__ I binary_int(int op, I a, I b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return b == (I)0 ? (I)0 : a / b;
    case B_POW: { I r = 1; for (I e = b; e > (I)0; --e) r *= a; return r; }
    case B_MAXIMUM: return a > b ? a : b;
    case B_MINIMUM: return a < b ? a : b;
    }
    return a;
}

__device__ __forceinline__ float apply_binary(int op, float a, float b) { return binary_float<float>(op, a, b); }
__device__ __forceinline__ double apply_binary(int op, double a, double b) { return binary_float<double>(op, a, b); }
template <class I>
__device__ __forceinline__ I apply_binary(int op, I a, I b) { return binary_int<I>(op, a, b); }

// ---- comparisons (codes: COMPARE_CODES) ----------------------------------------
enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE };

template <class C>
__device__ __forceinline__ unsigned char apply_compare(int op, C a, C b) {
    switch (op) {
    case C_EQ: return a == b;
    case C_NE: return a != b;
    case C_LT: return a < b;
    case C_LE: return a <= b;
    case C_GT: return a > b;
    case C_GE: return a >= b;
    }
    return 0;
}

// ---- block reductions (blockDim.x == BLOCK) ---------------------------------------
template <class A>
__device__ __forceinline__ A block_sum(A v, A* shm) {
    shm[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shm[threadIdx.x] += shm[threadIdx.x + s];
        __syncthreads();
    }
    A r = shm[0];
    __syncthreads();
    return r;
}

template <class A>
__device__ __forceinline__ A block_max(A v, A* shm) {
    shm[threadIdx.x] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            A o = shm[threadIdx.x + s];
            if (o > shm[threadIdx.x]) shm[threadIdx.x] = o;
        }
        __syncthreads();
    }
    A r = shm[0];
    __syncthreads();
    return r;
}
