// Row kernels over contiguous (rows, L) data, one threadgroup of BLOCK threads per row
// (same names and arguments as tallow_cuda's reduce.cu). Threadgroup memory is declared
// in each kernel (an MSL rule) and handed to the shared code.

#define ROW_ARGS uint row [[threadgroup_position_in_grid]], uint tid [[thread_index_in_threadgroup]]

enum { R_SUM, R_PROD, R_MAX, R_MIN };

template <class A>
inline A combine(int op, A a, A b) {
    switch (op) {
    case R_SUM: return a + b;
    case R_PROD: return a * b;
    case R_MAX: return (a != a || a > b) ? a : b;
    case R_MIN: return (a != a || a < b) ? a : b;
    }
    return a;
}

template <class T, class A>
inline A reduce_row(device const typename T::S* x, long L, int op, A init, threadgroup A* shm, uint tid) {
    A acc = init;
    for (long j = tid; j < L; j += BLOCK) acc = combine<A>(op, acc, A(T::load(x[j])));
    shm[tid] = acc;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) shm[tid] = combine<A>(op, shm[tid], shm[tid + s]);
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    return shm[0];
}

template <class T>
inline void argreduce_impl(device const typename T::S* x, device long* out, long L, int is_max,
                           threadgroup float* sv, threadgroup long* si, uint row, uint tid) {
    device const typename T::S* r = x + long(row) * L;
    float best = 0.0f;  // compared in float (int magnitudes beyond 2**24 may tie early)
    long bi = -1;
    for (long j = tid; j < L; j += BLOCK) {
        float v = float(T::load(r[j]));
        bool better = bi < 0 || (isnan(v) && !isnan(best)) || (!isnan(best) && (is_max ? v > best : v < best));
        if (better) { best = v; bi = j; }
    }
    sv[tid] = best;
    si[tid] = bi;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = BLOCK / 2; s > 0; s >>= 1) {
        if (tid < s) {
            float a = sv[tid], b = sv[tid + s];
            long ia = si[tid], ib = si[tid + s];
            bool take_b;
            if (ib < 0) take_b = false;
            else if (ia < 0) take_b = true;
            else if (isnan(a)) take_b = isnan(b) && ib < ia;
            else if (isnan(b)) take_b = true;
            else if (a == b) take_b = ib < ia;
            else take_b = is_max ? b > a : b < a;
            if (take_b) { sv[tid] = b; si[tid] = ib; }
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (tid == 0) out[row] = si[0];
}

template <class T>
inline void softmax_impl(device const typename T::S* x, device typename T::S* out, long L, int log_out,
                         threadgroup float* shm, uint row, uint tid) {
    device const typename T::S* r = x + long(row) * L;
    device typename T::S* o = out + long(row) * L;
    float m = -INFINITY;
    for (long j = tid; j < L; j += BLOCK) { float v = T::load(r[j]); m = (v > m || isnan(v)) ? v : m; }
    m = group_max<float>(m, shm, tid);
    float s = 0.0f;
    for (long j = tid; j < L; j += BLOCK) s += exp(T::load(r[j]) - m);
    s = group_sum<float>(s, shm, tid);
    float ls = log(s);
    for (long j = tid; j < L; j += BLOCK) {
        float z = T::load(r[j]) - m;
        o[j] = T::store(log_out ? z - ls : exp(z) / s);
    }
}

template <class T>
inline void layer_norm_impl(device const typename T::S* x, device const typename T::S* w, device const typename T::S* b,
                            device typename T::S* out, long L, float eps, int has_w, int has_b,
                            threadgroup float* shm, uint row, uint tid) {
    device const typename T::S* r = x + long(row) * L;
    device typename T::S* o = out + long(row) * L;
    float s = 0.0f;
    for (long j = tid; j < L; j += BLOCK) s += T::load(r[j]);
    float mean = group_sum<float>(s, shm, tid) / float(L);
    float v = 0.0f;
    for (long j = tid; j < L; j += BLOCK) { float c = T::load(r[j]) - mean; v += c * c; }
    float inv = 1.0f / sqrt(group_sum<float>(v, shm, tid) / float(L) + eps);
    for (long j = tid; j < L; j += BLOCK) {
        float y = (T::load(r[j]) - mean) * inv;
        if (has_w) y *= T::load(w[j]);
        if (has_b) y += T::load(b[j]);
        o[j] = T::store(y);
    }
}

template <class T>
inline void rms_norm_impl(device const typename T::S* x, device const typename T::S* w, device typename T::S* out,
                          long L, float eps, int has_w, threadgroup float* shm, uint row, uint tid) {
    device const typename T::S* r = x + long(row) * L;
    device typename T::S* o = out + long(row) * L;
    float s = 0.0f;
    for (long j = tid; j < L; j += BLOCK) { float v = T::load(r[j]); s += v * v; }
    float inv = 1.0f / sqrt(group_sum<float>(s, shm, tid) / float(L) + eps);
    for (long j = tid; j < L; j += BLOCK) {
        float y = T::load(r[j]) * inv;
        if (has_w) y *= T::load(w[j]);
        o[j] = T::store(y);
    }
}

#define ROW_FLOAT(NAME)                                                                                              \
    kernel void reduce_##NAME(device const T_##NAME::S* x [[buffer(0)]], device T_##NAME::S* out [[buffer(1)]],       \
                              constant long& L [[buffer(2)]], constant int& op [[buffer(3)]], ROW_ARGS) {            \
        TG_SHARED float shm[BLOCK];                                                                                \
        device const T_##NAME::S* r = x + long(row) * L;                                                             \
        float init = op == R_SUM ? 0.0f : (op == R_PROD ? 1.0f : T_##NAME::load(r[0]));                              \
        float v = reduce_row<T_##NAME, float>(r, L, op, init, shm, tid);                                             \
        if (tid == 0) out[row] = T_##NAME::store(v);                                                                 \
    }                                                                                                                \
    kernel void cumsum_##NAME(device const T_##NAME::S* x [[buffer(0)]], device T_##NAME::S* out [[buffer(1)]],       \
                              constant long& rows [[buffer(2)]], constant long& L [[buffer(3)]],                     \
                              uint gid [[thread_position_in_grid]]) {                                                \
        if (long(gid) >= rows) return;                                                                               \
        float acc = 0.0f;                                                                                            \
        for (long j = 0; j < L; ++j) { acc += T_##NAME::load(x[long(gid) * L + j]); out[long(gid) * L + j] = T_##NAME::store(acc); } \
    }                                                                                                                \
    kernel void softmax_##NAME(device const T_##NAME::S* x [[buffer(0)]], device T_##NAME::S* out [[buffer(1)]],      \
                               constant long& L [[buffer(2)]], constant int& log_out [[buffer(3)]], ROW_ARGS) {      \
        TG_SHARED float shm[BLOCK];                                                                                \
        softmax_impl<T_##NAME>(x, out, L, log_out, shm, row, tid);                                                   \
    }                                                                                                                \
    kernel void layer_norm_##NAME(device const T_##NAME::S* x [[buffer(0)]], device const T_##NAME::S* w [[buffer(1)]], \
                                  device const T_##NAME::S* b [[buffer(2)]], device T_##NAME::S* out [[buffer(3)]],   \
                                  constant long& L [[buffer(4)]], constant float& eps [[buffer(5)]],                 \
                                  constant int& has_w [[buffer(6)]], constant int& has_b [[buffer(7)]], ROW_ARGS) {  \
        TG_SHARED float shm[BLOCK];                                                                                \
        layer_norm_impl<T_##NAME>(x, w, b, out, L, eps, has_w, has_b, shm, row, tid);                                \
    }                                                                                                                \
    kernel void rms_norm_##NAME(device const T_##NAME::S* x [[buffer(0)]], device const T_##NAME::S* w [[buffer(1)]], \
                                device T_##NAME::S* out [[buffer(2)]], constant long& L [[buffer(3)]],               \
                                constant float& eps [[buffer(4)]], constant int& has_w [[buffer(5)]], ROW_ARGS) {    \
        TG_SHARED float shm[BLOCK];                                                                                \
        rms_norm_impl<T_##NAME>(x, w, out, L, eps, has_w, shm, row, tid);                                            \
    }
FOR_EACH_FLOAT(ROW_FLOAT)

// Integer reductions accumulate in long and store i64 (the host casts max/min back).
#define ROW_INT(NAME)                                                                                                \
    kernel void reduce_##NAME(device const T_##NAME::S* x [[buffer(0)]], device long* out [[buffer(1)]],             \
                              constant long& L [[buffer(2)]], constant int& op [[buffer(3)]], ROW_ARGS) {            \
        TG_SHARED long shm[BLOCK];                                                                                 \
        device const T_##NAME::S* r = x + long(row) * L;                                                             \
        long init = op == R_SUM ? 0 : (op == R_PROD ? 1 : long(T_##NAME::load(r[0])));                               \
        long v = reduce_row<T_##NAME, long>(r, L, op, init, shm, tid);                                               \
        if (tid == 0) out[row] = v;                                                                                  \
    }                                                                                                                \
    kernel void cumsum_##NAME(device const T_##NAME::S* x [[buffer(0)]], device long* out [[buffer(1)]],             \
                              constant long& rows [[buffer(2)]], constant long& L [[buffer(3)]],                     \
                              uint gid [[thread_position_in_grid]]) {                                                \
        if (long(gid) >= rows) return;                                                                               \
        long acc = 0;                                                                                                \
        for (long j = 0; j < L; ++j) { acc += long(T_##NAME::load(x[long(gid) * L + j])); out[long(gid) * L + j] = acc; } \
    }
ROW_INT(i64) ROW_INT(i32) ROW_INT(i8) ROW_INT(u32) ROW_INT(u8) ROW_INT(bool)

#define ARG(NAME)                                                                                                    \
    kernel void argreduce_##NAME(device const T_##NAME::S* x [[buffer(0)]], device long* out [[buffer(1)]],          \
                                 constant long& L [[buffer(2)]], constant int& is_max [[buffer(3)]], ROW_ARGS) {     \
        TG_SHARED float sv[BLOCK];                                                                                 \
        TG_SHARED long si[BLOCK];                                                                                  \
        argreduce_impl<T_##NAME>(x, out, L, is_max, sv, si, row, tid);                                               \
    }
FOR_EACH_DTYPE(ARG)
