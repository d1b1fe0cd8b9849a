// Indexing and layout kernels (same names and arguments as tallow_cuda's index.cu):
// index_select, gather, scatter_add (Metal 3 atomics: f32, i32, u32), rotary embedding,
// im2col.

#define GRID_ARGS uint gid [[thread_position_in_grid]], uint gsize [[threads_per_grid]]
#define GRID_LOOP(i, n) for (long i = gid; i < (n); i += gsize)

inline long wrap_index(long id, long size) { return id < 0 ? id + size : id; }

#define INDEX_BY_WIDTH(W, TYPE)                                                                                      \
    kernel void index_select_w##W(device const TYPE* src [[buffer(0)]], device const long* ids [[buffer(1)]],         \
                                  device TYPE* out [[buffer(2)]], constant int* meta [[buffer(3)]],                  \
                                  constant long& n [[buffer(4)]], constant long& inner [[buffer(5)]],                \
                                  constant long& J [[buffer(6)]], constant long& dim_stride [[buffer(7)]],           \
                                  constant long& dim_size [[buffer(8)]], GRID_ARGS) {                                \
        GRID_LOOP(i, n) {                                                                                            \
            long id = wrap_index(ids[(i / inner) % J], dim_size);                                                    \
            out[i] = src[strided_offset(meta, 0, i) + id * dim_stride];                                              \
        }                                                                                                            \
    }                                                                                                                \
    kernel void gather_w##W(device const TYPE* src [[buffer(0)]], device const long* ids [[buffer(1)]],               \
                            device TYPE* out [[buffer(2)]], constant int* meta [[buffer(3)]],                        \
                            constant long& n [[buffer(4)]], constant long& dim_stride [[buffer(5)]],                 \
                            constant long& dim_size [[buffer(6)]], GRID_ARGS) {                                      \
        GRID_LOOP(i, n) { out[i] = src[strided_offset(meta, 0, i) + wrap_index(ids[i], dim_size) * dim_stride]; }   \
    }
INDEX_BY_WIDTH(1, uchar)
INDEX_BY_WIDTH(2, ushort)
INDEX_BY_WIDTH(4, uint)
INDEX_BY_WIDTH(8, ulong)

#define SCATTER(NAME, TYPE, ATOMIC)                                                                                  \
    kernel void scatter_add_##NAME(device TYPE* out [[buffer(0)]], device const long* ids [[buffer(1)]],             \
                                   device const TYPE* src [[buffer(2)]], constant int* meta [[buffer(3)]],           \
                                   constant long& n [[buffer(4)]], constant long& dim_stride [[buffer(5)]],          \
                                   constant long& dim_size [[buffer(6)]], GRID_ARGS) {                               \
        GRID_LOOP(i, n) {                                                                                            \
            long o = strided_offset(meta, 1, i) + wrap_index(ids[i], dim_size) * dim_stride;                         \
            atomic_fetch_add_explicit((device ATOMIC*)(out + o), src[strided_offset(meta, 0, i)], memory_order_relaxed); \
        }                                                                                                            \
    }
SCATTER(f32, float, atomic_float)
SCATTER(i32, int, atomic_int)
SCATTER(u32, uint, atomic_uint)

template <class T>
inline void rope_impl(device const typename T::S* x, device const typename T::S* cs, device const typename T::S* sn,
                      device typename T::S* out, constant int* meta, long rows, long t, long d, int interleaved,
                      uint gid, uint gsize) {
    long half_d = d / 2;
    GRID_LOOP(i, rows * t * half_d) {
        long j = i % half_d;
        long p = (i / half_d) % t;
        long base = (i / half_d) * d;
        long e1 = interleaved ? 2 * j : j;
        long e2 = interleaved ? 2 * j + 1 : j + half_d;
        float x1 = T::load(x[strided_offset(meta, 0, base + e1)]);
        float x2 = T::load(x[strided_offset(meta, 0, base + e2)]);
        float c = T::load(cs[p * half_d + j]), s = T::load(sn[p * half_d + j]);
        out[base + e1] = T::store(x1 * c - x2 * s);
        out[base + e2] = T::store(x1 * s + x2 * c);
    }
}

template <class T>
inline void im2col_impl(device const typename T::S* x, device typename T::S* cols, long n, int cin, int h, int w,
                        int kh, int kw, int oh, int ow, int sy, int sx, int py, int px, int dy, int dx,
                        uint gid, uint gsize) {
    GRID_LOOP(i, n) {
        long r = i;
        int ox = r % ow; r /= ow;
        int oy = r % oh; r /= oh;
        int kx = r % kw; r /= kw;
        int ky = r % kh; r /= kh;
        int c = r % cin;
        long b = r / cin;
        int iy = oy * sy - py + ky * dy;
        int ix = ox * sx - px + kx * dx;
        bool inside = iy >= 0 && iy < h && ix >= 0 && ix < w;
        cols[i] = inside ? x[((b * cin + c) * h + iy) * w + ix] : T::store(0.0f);
    }
}

#define ROPE_IM2COL(NAME)                                                                                            \
    kernel void rope_##NAME(device const T_##NAME::S* x [[buffer(0)]], device const T_##NAME::S* cs [[buffer(1)]],    \
                            device const T_##NAME::S* sn [[buffer(2)]], device T_##NAME::S* out [[buffer(3)]],       \
                            constant int* meta [[buffer(4)]], constant long& rows [[buffer(5)]],                     \
                            constant long& t [[buffer(6)]], constant long& d [[buffer(7)]],                          \
                            constant int& interleaved [[buffer(8)]], GRID_ARGS) {                                    \
        rope_impl<T_##NAME>(x, cs, sn, out, meta, rows, t, d, interleaved, gid, gsize);                              \
    }                                                                                                                \
    kernel void im2col_##NAME(device const T_##NAME::S* x [[buffer(0)]], device T_##NAME::S* cols [[buffer(1)]],     \
                              constant long& n [[buffer(2)]], constant int& cin [[buffer(3)]],                       \
                              constant int& h [[buffer(4)]], constant int& w [[buffer(5)]],                          \
                              constant int& kh [[buffer(6)]], constant int& kw [[buffer(7)]],                        \
                              constant int& oh [[buffer(8)]], constant int& ow [[buffer(9)]],                        \
                              constant int& sy [[buffer(10)]], constant int& sx [[buffer(11)]],                      \
                              constant int& py [[buffer(12)]], constant int& px [[buffer(13)]],                      \
                              constant int& dy [[buffer(14)]], constant int& dx [[buffer(15)]], GRID_ARGS) {         \
        im2col_impl<T_##NAME>(x, cols, n, cin, h, w, kh, kw, oh, ow, sy, sx, py, px, dy, dx, gid, gsize);            \
    }
FOR_EACH_FLOAT(ROPE_IM2COL)
