// Shared by every tallow MSL kernel file (the driver prepends it to each file's source):
// dtype tags, strided indexing, op tables. Same names, codes and argument order as
// tallow_cuda's common.cuh, so one host (tallow_cuda/kernel_backend.py) drives both.
// Metal has no double: there is no f64, and float scalars arrive as float.
#ifndef TALLOW_MSL_SHIM
#include <metal_stdlib>
using namespace metal;
#endif

#define MAX_DIMS 8
#define BLOCK 256

// Threadgroup arrays are declared in kernels with TG_SHARED (threadgroup on a GPU; the
// CPU emulator in cpu_driver.py makes them static, shared by the emulated threads).
#ifndef TG_SHARED
#define TG_SHARED threadgroup
#endif

// meta (int32): [ndim, shape[MAX_DIMS], then per operand: offset, strides[MAX_DIMS]]
inline long strided_offset(constant int* meta, int operand, long i) {
    int nd = meta[0];
    constant int* shape = meta + 1;
    constant int* os = meta + 1 + MAX_DIMS + operand * (MAX_DIMS + 1);
    long off = os[0];
    if (nd == 1) return off + i * os[1];  // the common case after merging dims: no division
    for (int d = nd - 1; d >= 0; --d) {
        long s = shape[d];
        off += (i % s) * os[1 + d];
        i /= s;
    }
    return off;
}

inline float f16_to_f32(ushort h) { return float(as_type<half>(h)); }
inline ushort f32_to_f16(float f) { return as_type<ushort>(half(f)); }
inline float bf16_to_f32(ushort h) { return as_type<float>(uint(h) << 16); }
inline ushort f32_to_bf16(float f) {
    if (isnan(f)) return 0x7FC0;  // round to nearest even, NaN stays a quiet NaN
    uint u = as_type<uint>(f);
    return ushort((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

#define TAG_PLAIN(NAME, STYPE, CTYPE, FLOATKIND)                     \
    struct T_##NAME {                                              \
        typedef STYPE S; typedef CTYPE C;                          \
        enum { is_float = FLOATKIND };                             \
        static inline C load(S s) { return C(s); }                 \
        static inline S store(C c) { return S(c); }                \
    };
TAG_PLAIN(f32, float, float, 1)
TAG_PLAIN(i64, long, long, 0)
TAG_PLAIN(i32, int, int, 0)
TAG_PLAIN(i8, char, int, 0)
TAG_PLAIN(u32, uint, uint, 0)
TAG_PLAIN(u8, uchar, uint, 0)
struct T_bool {
    typedef uchar S; typedef uint C;
    enum { is_float = 0 };
    static inline C load(S s) { return s != 0; }
    static inline S store(C c) { return c != 0; }
};
struct T_f16 {
    typedef ushort S; typedef float C;
    enum { is_float = 1 };
    static inline C load(S s) { return f16_to_f32(s); }
    static inline S store(C c) { return f32_to_f16(c); }
};
struct T_bf16 {
    typedef ushort S; typedef float C;
    enum { is_float = 1 };
    static inline C load(S s) { return bf16_to_f32(s); }
    static inline S store(C c) { return f32_to_bf16(c); }
};

#define FOR_EACH_DTYPE(X) X(f32) X(f16) X(bf16) X(i64) X(i32) X(i8) X(u32) X(u8) X(bool)
#define FOR_EACH_FLOAT(X) X(f32) X(f16) X(bf16)

// erf is not in the Metal standard library: Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7).
inline float erf_(float x) {
    float t = 1.0f / (1.0f + 0.3275911f * fabs(x));
    float y = 1.0f - (((((1.061405429f * t - 1.453152027f) * t) + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t * exp(-x * x);
    return x < 0.0f ? -y : y;
}

enum { U_NEG, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_SIN, U_COS, U_TANH, U_SIGMOID, U_RELU, U_GELU,
       U_GELU_TANH, U_SILU, U_SQUARE, U_RECIPROCAL, U_FLOOR, U_CEIL, U_ROUND, U_SIGN, U_CLAMP,
       U_POW_SCALAR, U_AFFINE };

inline float apply_unary(int op, float v, float a0, float a1) {
    switch (op) {
    case U_NEG: return -v;
    case U_ABS: return fabs(v);
    case U_EXP: return exp(v);
    case U_LOG: return log(v);
    case U_SQRT: return sqrt(v);
    case U_RSQRT: return 1.0f / sqrt(v);
    case U_SIN: return sin(v);
    case U_COS: return cos(v);
    case U_TANH: return tanh(v);
    case U_SIGMOID: return 1.0f / (1.0f + exp(-v));
    case U_RELU: return v < 0.0f ? 0.0f : v;  // keeps NaN, as numpy
    case U_GELU: return 0.5f * v * (1.0f + erf_(v * 0.70710678118654752f));
    case U_GELU_TANH: return 0.5f * v * (1.0f + tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    case U_SILU: return v / (1.0f + exp(-v));
    case U_SQUARE: return v * v;
    case U_RECIPROCAL: return 1.0f / v;
    case U_FLOOR: return floor(v);
    case U_CEIL: return ceil(v);
    case U_ROUND: return rint(v);
    case U_SIGN: return v > 0.0f ? 1.0f : (v < 0.0f ? -1.0f : v);
    case U_CLAMP: { float r = v < a0 ? a0 : v; return r > a1 ? a1 : r; }
    case U_POW_SCALAR: return pow(v, a0);
    case U_AFFINE: return v * a0 + a1;
    }
    return v;
}

template <class I>
inline I apply_unary_int(int op, I v, float a0, float a1) {
    switch (op) {
    case U_NEG: return I(0 - v);
    case U_ABS: return long(v) < 0 ? I(0 - v) : v;
    case U_RELU: return v > I(0) ? v : I(0);
    case U_SQUARE: return v * v;
    case U_FLOOR: case U_CEIL: case U_ROUND: return v;
    case U_SIGN: return v > I(0) ? I(1) : (long(v) < 0 ? I(0 - 1) : I(0));
    case U_CLAMP: return float(v) < a0 ? I(long(a0)) : (float(v) > a1 ? I(long(a1)) : v);  // v exact
    case U_POW_SCALAR: { I r = 1; for (long e = long(a0); e > 0; --e) r *= v; return r; }
    case U_AFFINE: return I(v * I(long(a0)) + I(long(a1)));  // integer arithmetic, wrapping as numpy
    }
    return I(long(apply_unary(op, float(v), a0, a1)));
}
inline long apply_unary(int op, long v, float a0, float a1) { return apply_unary_int<long>(op, v, a0, a1); }
inline int apply_unary(int op, int v, float a0, float a1) { return apply_unary_int<int>(op, v, a0, a1); }
inline uint apply_unary(int op, uint v, float a0, float a1) { return apply_unary_int<uint>(op, v, a0, a1); }

enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAXIMUM, B_MINIMUM };

inline float apply_binary(int op, float a, float b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_POW: return pow(a, b);
    case B_MAXIMUM: return (isnan(a) || a > b) ? a : b;
    case B_MINIMUM: return (isnan(a) || a < b) ? a : b;
    }
    return a;
}

template <class I>
inline I apply_binary_int(int op, I a, I b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return b == I(0) ? I(0) : a / b;
    case B_POW: { I r = 1; for (I e = b; e > I(0); --e) r *= a; return r; }
    case B_MAXIMUM: return a > b ? a : b;
    case B_MINIMUM: return a < b ? a : b;
    }
    return a;
}
inline long apply_binary(int op, long a, long b) { return apply_binary_int<long>(op, a, b); }
inline int apply_binary(int op, int a, int b) { return apply_binary_int<int>(op, a, b); }
inline uint apply_binary(int op, uint a, uint b) { return apply_binary_int<uint>(op, a, b); }

enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE };

template <class C>
inline uchar apply_compare(int op, C a, C b) {
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

// Threadgroup reductions over BLOCK threads; shm is declared by the kernel (MSL rule).
template <class A>
inline A group_sum(A v, threadgroup A* shm, uint tid) {
    shm[tid] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) shm[tid] += shm[tid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    A r = shm[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}

template <class A>
inline A group_max(A v, threadgroup A* shm, uint tid) {
    shm[tid] = v;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s && shm[tid + s] > shm[tid]) shm[tid] = shm[tid + s];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    A r = shm[0];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    return r;
}
