// Shared by every kernel module, in both languages. The kernels are written once, in a small
// dialect that cuda.h and msl.h spell out (the driver puts one of them before this file):
//   KERNEL(name, BUF(type, name, i), META(name, i), ARG(type, name, i), ...)  a kernel; i is
//       Metal's [[buffer(i)]] and must count 0, 1, 2, ... (CUDA passes arguments in order)
//   THREAD                       the thread's ThreadPos, inside a KERNEL body
//   DEVICE                       a helper function
//   GLOBAL / CONSTANT / SHARED   pointer qualifiers: device memory, meta arrays, shared memory
//   SHARED_ARRAY(type, name, n)  shared (threadgroup) memory, declared in a KERNEL body
//   BARRIER()                    the block's threads wait for each other
//   warp_sum(v), atomic_add(p, v), ERF(x), REAL(literal)
//   uchar schar ushort uint llong ullong, real_t (double on CUDA, float on Metal)
//   HAS_F64, HAS_ATOMIC64: what the language has (the dtype lists below follow them)
// Names, codes and argument order are what tallow.backends.kernel.host packs, for both languages.

#define MAX_DIMS 8
#define BLOCK 256

// ---- the dtypes kernels are instantiated for: all of them where the language has them ----
#if HAS_F64
#define IF_F64(x) x
#else
#define IF_F64(x)
#endif
#if HAS_ATOMIC64
#define IF_ATOMIC64(x) x
#else
#define IF_ATOMIC64(x)
#endif
#define FOR_EACH_FLOAT(X) X(f32) X(f16) X(bf16) IF_F64(X(f64))
#define FOR_EACH_DTYPE(X) FOR_EACH_FLOAT(X) X(i64) X(i32) X(i8) X(u32) X(u8) X(bool)
// X(A, dtype) for every dtype but bool (cast_<A>_bool has its own kernel)
#define FOR_EACH_NUMBER_WITH(X, A) X(A, f32) X(A, f16) X(A, bf16) IF_F64(X(A, f64)) X(A, i64) X(A, i32) X(A, i8) X(A, u32) X(A, u8)
// X(dtype, element type) for the dtypes scatter_add adds atomically
#define FOR_EACH_ATOMIC(X) X(f32, float) IF_F64(IF_ATOMIC64(X(f64, double))) X(i32, int) X(u32, uint) IF_ATOMIC64(X(i64, llong))

// Where a thread is: one-dimensional blocks (threadgroups), grid.y only for qmatvec.
struct ThreadPos {
    uint group, group_y;  // the block's index (x, y)
    uint tid, block;      // the thread's index in its block, and the block's size
    uint lane, warp;      // the thread's lane in its warp (simdgroup) of 32, and that warp's index
    llong gid, grid;      // the thread's index in the grid (x), and the grid's thread count (x)
};

// One thread per element of [0, n), looping when the grid is smaller than n.
#define GRID_LOOP(i, n, th) for (llong i = (th).gid; i < (n); i += (th).grid)

// ---- strided indexing ------------------------------------------------------
// meta (int32): [ndim, shape[MAX_DIMS], then per operand: offset, strides[MAX_DIMS]]
// (packed by tallow.backends.kernel.host: pack_meta).
DEVICE llong strided_offset(CONSTANT int* meta, int operand, llong i) {
    int nd = meta[0];
    CONSTANT int* shape = meta + 1;
    CONSTANT int* os = meta + 1 + MAX_DIMS + operand * (MAX_DIMS + 1);
    llong off = os[0];
    if (nd == 1) return off + i * os[1];  // the common case after merging dims: no division
    for (int d = nd - 1; d >= 0; --d) {
        llong s = shape[d];
        off += (i % s) * os[1 + d];
        i /= s;
    }
    return off;
}

// ---- bf16 (storage is the 16-bit pattern; f16's conversions are the language's) ------
DEVICE float bf16_to_f32(ushort h) { return uint_bits_as_float(((uint)h) << 16); }
DEVICE ushort f32_to_bf16(float f) {
    // Round to nearest even, as the numpy backend does; NaN stays a quiet NaN.
    if (f != f) return 0x7FC0;
    uint u = float_bits_as_uint(f);
    return (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// ---- dtype tags: storage type S, compute type C, load/store, kind ------------
#define TAG_PLAIN(NAME, STYPE, CTYPE, FLOATKIND)                                   \
    struct T_##NAME {                                                            \
        typedef STYPE S; typedef CTYPE C;                                        \
        enum { is_float = FLOATKIND };                                           \
        static DEVICE C load(S s) { return (C)s; }                               \
        static DEVICE S store(C c) { return (S)c; }                              \
    };
TAG_PLAIN(f32, float, float, 1)
#if HAS_F64
TAG_PLAIN(f64, double, double, 1)
#endif
TAG_PLAIN(i64, llong, llong, 0)
TAG_PLAIN(i32, int, int, 0)
TAG_PLAIN(i8, schar, int, 0)
TAG_PLAIN(u32, uint, uint, 0)
TAG_PLAIN(u8, uchar, uint, 0)
struct T_bool {
    typedef uchar S; typedef uint C;
    enum { is_float = 0 };
    static DEVICE C load(S s) { return s != 0; }
    static DEVICE S store(C c) { return c != 0; }
};
struct T_f16 {
    typedef ushort S; typedef float C;
    enum { is_float = 1 };
    static DEVICE C load(S s) { return f16_to_f32(s); }
    static DEVICE S store(C c) { return f32_to_f16(c); }
};
struct T_bf16 {
    typedef ushort S; typedef float C;
    enum { is_float = 1 };
    static DEVICE C load(S s) { return bf16_to_f32(s); }
    static DEVICE S store(C c) { return f32_to_bf16(c); }
};

// ---- unary ops (codes in tallow.backends.kernel.host: UNARY_CODES) -------------------
enum { U_NEG, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_SIN, U_COS, U_TANH, U_SIGMOID, U_RELU, U_GELU,
       U_GELU_TANH, U_SILU, U_SQUARE, U_RECIPROCAL, U_FLOOR, U_CEIL, U_ROUND, U_SIGN, U_CLAMP,
       U_POW_SCALAR, U_AFFINE, U_EXPM1 };

// expm1 in both languages (MSL has none): a Taylor polynomial below |v| = 0.5, where
// exp(v) - 1 loses digits; 14 terms keep double's error near 1e-16.
template <class F>
DEVICE F expm1_(F v) {
    if (fabs(v) < F(REAL(0.5))) {
        F term = v, sum = v;
        for (int i = 2; i <= 14; ++i) { term *= v / F(i); sum += term; }
        return sum;
    }
    return exp(v) - F(1);
}

template <class F>
DEVICE F unary_float(int op, F v, real_t a0, real_t a1) {
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
    case U_GELU: return F(REAL(0.5)) * v * (F(1) + ERF(v * F(REAL(0.70710678118654752))));
    case U_GELU_TANH:
        return F(REAL(0.5)) * v * (F(1) + tanh(F(REAL(0.79788456080286536)) * (v + F(REAL(0.044715)) * v * v * v)));
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
    case U_EXPM1: return expm1_(v);
    }
    return v;
}

template <class I>
DEVICE I unary_int(int op, I v, real_t a0, real_t a1) {
    switch (op) {
    case U_NEG: return (I)(0 - v);
    case U_ABS: return (llong)v < 0 ? (I)(0 - v) : v;
    case U_RELU: return v > (I)0 ? v : (I)0;
    case U_SQUARE: return v * v;
    case U_FLOOR: case U_CEIL: case U_ROUND: return v;
    case U_SIGN: return v > (I)0 ? (I)1 : ((llong)v < 0 ? (I)(0 - 1) : (I)0);
    case U_CLAMP: return (real_t)v < a0 ? (I)(llong)a0 : ((real_t)v > a1 ? (I)(llong)a1 : v);  // v exact
    case U_POW_SCALAR: { I r = 1; for (llong e = (llong)a0; e > 0; --e) r *= v; return r; }
    case U_AFFINE: return (I)(v * (I)(llong)a0 + (I)(llong)a1);  // integer arithmetic, wrapping as numpy
    }
    // Transcendental ops on integers: computed in real_t (the front end sends floats here).
    return (I)(llong)unary_float<real_t>(op, (real_t)v, a0, a1);
}

DEVICE float apply_unary(int op, float v, real_t a0, real_t a1) { return unary_float<float>(op, v, a0, a1); }
#if HAS_F64
DEVICE double apply_unary(int op, double v, real_t a0, real_t a1) { return unary_float<double>(op, v, a0, a1); }
#endif
template <class I>
DEVICE I apply_unary(int op, I v, real_t a0, real_t a1) { return unary_int<I>(op, v, a0, a1); }

// ---- binary ops (codes: BINARY_CODES) ------------------------------------------
enum { B_ADD, B_SUB, B_MUL, B_DIV, B_POW, B_MAXIMUM, B_MINIMUM };

template <class F>
DEVICE F binary_float(int op, F a, F b) {
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
DEVICE I binary_int(int op, I a, I b) {
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

DEVICE float apply_binary(int op, float a, float b) { return binary_float<float>(op, a, b); }
#if HAS_F64
DEVICE double apply_binary(int op, double a, double b) { return binary_float<double>(op, a, b); }
#endif
template <class I>
DEVICE I apply_binary(int op, I a, I b) { return binary_int<I>(op, a, b); }

// ---- comparisons (codes: COMPARE_CODES) ----------------------------------------
enum { C_EQ, C_NE, C_LT, C_LE, C_GT, C_GE };

template <class C>
DEVICE uchar apply_compare(int op, C a, C b) {
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

// ---- block reductions over th.block threads; shm is declared by the kernel ----------
template <class A>
DEVICE A block_sum(A v, SHARED A* shm, ThreadPos th) {
    shm[th.tid] = v;
    BARRIER();
    for (uint s = th.block / 2; s > 0; s >>= 1) {
        if (th.tid < s) shm[th.tid] += shm[th.tid + s];
        BARRIER();
    }
    A r = shm[0];
    BARRIER();
    return r;
}

template <class A>
DEVICE A block_max(A v, SHARED A* shm, ThreadPos th) {
    shm[th.tid] = v;
    BARRIER();
    for (uint s = th.block / 2; s > 0; s >>= 1) {
        if (th.tid < s && shm[th.tid + s] > shm[th.tid]) shm[th.tid] = shm[th.tid + s];
        BARRIER();
    }
    A r = shm[0];
    BARRIER();
    return r;
}
