// KV-cache codecs shared by the store / gather kernels (kv_quant.cu) and the paged decode
// attention: runtime.get_kernel prepends this file to their sources (after common.cu).
//
// Formats (kernels/kv_quant/formats.py): KV_PLAIN rows in the model dtype; KV_INT8 int8 * fp32
// row scale; KV_FP8 e4m3 * fp32 row scale; KV_NVFP4 packed e2m1 nibbles (element 2i low) * e4m3
// scale per 16 values * fp32 row scale. Conversions are integer bit operations, exact and with
// the rounding of the torch twin (round to nearest even; e4m3 saturates at 448), so a stored
// byte is the twin's byte. Divisions use __fdiv_rn: --use_fast_math would approximate `/`.

#define KV_PLAIN 0
#define KV_INT8 1
#define KV_FP8 2
#define KV_NVFP4 3

// E values of type T from p as fp32 (16-byte loads where the row part allows).
template <typename T, int E>
__device__ __forceinline__ void load_row(const T* __restrict__ p, float (&out)[E]) {
  if constexpr (sizeof(T) * E % 16 == 0) {
#pragma unroll
    for (int c = 0; c < static_cast<int>(sizeof(T) * E / 16); ++c) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[c];
      const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < static_cast<int>(16 / sizeof(T)); ++j) {
        out[c * (16 / sizeof(T)) + j] = to_float(e[j]);
      }
    }
  } else if constexpr (sizeof(T) * E == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = to_float(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = to_float(p[j]);
  }
}

// e2m1 code (sign in bit 3) to fp32: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
__device__ __forceinline__ float kvq_e2m1_to_float(unsigned int code) {
  const unsigned int m = code & 7u;
  const float mag = m < 4u ? 0.5f * static_cast<float>(m)
                           : ((m & 2u) ? 4.0f : 2.0f) * ((m & 1u) ? 1.5f : 1.0f);
  return (code & 8u) ? -mag : mag;
}

// fp32 (already divided by its scale) to the nearest e2m1 code, ties to the even code; the
// thresholds are those of reference.e2m1_codes.
__device__ __forceinline__ unsigned int kvq_float_to_e2m1(float v) {
  const float a = fabsf(v);
  const unsigned int c = static_cast<unsigned int>(a > 0.25f) + (a >= 0.75f) + (a > 1.25f) +
                         (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return c | (v < 0.0f ? 8u : 0u);
}

// N bytes from p (16-, 8-, 4- or 2-byte loads where N and the address allow), into b[0..N).
template <int N>
__device__ __forceinline__ void kvq_load_bytes(const unsigned char* __restrict__ p,
                                               unsigned char (&b)[N]) {
  if constexpr (N % 16 == 0) {
#pragma unroll
    for (int c = 0; c < N / 16; ++c) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[c];
      const unsigned char* e = reinterpret_cast<const unsigned char*>(&u);
#pragma unroll
      for (int j = 0; j < 16; ++j) b[c * 16 + j] = e[j];
    }
  } else if constexpr (N == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const unsigned char* e = reinterpret_cast<const unsigned char*>(&u);
#pragma unroll
    for (int j = 0; j < 8; ++j) b[j] = e[j];
  } else if constexpr (N == 4) {
    const unsigned int u = *reinterpret_cast<const unsigned int*>(p);
#pragma unroll
    for (int j = 0; j < 4; ++j) b[j] = static_cast<unsigned char>(u >> (8 * j));
  } else if constexpr (N == 2) {
    const unsigned short u = *reinterpret_cast<const unsigned short*>(p);
    b[0] = static_cast<unsigned char>(u & 0xffu);
    b[1] = static_cast<unsigned char>(u >> 8);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) b[j] = p[j];
  }
}

// One K or V source: values (model dtype T for KV_PLAIN, else bytes), the fp32 row scales and the
// nvfp4 block scales. A row is one (token slot, KV head): row = (page * P + offset) * Hk + head.
struct KvSrc {
  const void* values;
  const float* scale;
  const unsigned char* blocks;
};

// A lane's part of one row as loaded, what a warp keeps in flight while more rows load: plain
// rows converted to fp32 at load (as load_row always did), quantized rows kept as their raw bytes
// and scales (a quarter of the registers of fp32 values) and decoded just before use, so the
// decode attention keeps 8 rows per warp in flight without spilling.
template <typename T, int FMT, int E>
struct KvRowBuf {
  static constexpr int NB = FMT == KV_NVFP4 ? (E + 1) / 2 : E;  // stored bytes of E values
  unsigned char b[NB];
  float scale;         // the row's fp32 scale
  unsigned int block;  // nvfp4: the e4m3 byte of the lane's 16-value block
};

template <typename T, int E>
struct KvRowBuf<T, KV_PLAIN, E> {
  float v[E];
};

// Load lane `lane`'s E consecutive values (dims lane*E ..) of row `row` of a D = 32 * E row.
// nvfp4 needs E to divide 16 (a lane's dims inside one block); E == 1 loads the byte it shares
// with its neighbour lane.
template <typename T, int FMT, int E>
__device__ __forceinline__ void kvq_fetch(const KvSrc& s, long long row, int lane,
                                          KvRowBuf<T, FMT, E>& r) {
  constexpr int D = 32 * E;
  if constexpr (FMT == KV_PLAIN) {
    load_row<T, E>(static_cast<const T*>(s.values) + row * D + lane * E, r.v);
  } else if constexpr (FMT == KV_INT8 || FMT == KV_FP8) {
    kvq_load_bytes<E>(static_cast<const unsigned char*>(s.values) + row * D + lane * E, r.b);
    r.scale = s.scale[row];
  } else {
    static_assert(16 % E == 0, "nvfp4 rows need E dividing 16");
    const unsigned char* vals = static_cast<const unsigned char*>(s.values) + row * (D / 2);
    if constexpr (E == 1) {
      r.b[0] = vals[lane >> 1];
    } else {
      kvq_load_bytes<E / 2>(vals + lane * (E / 2), r.b);
    }
    r.scale = s.scale[row];
    r.block = s.blocks[row * (D / 16) + lane * E / 16];
  }
}

// The fp32 values of a fetched row part, with the twin's rounding (code * scale; nvfp4: code *
// (block scale * row scale)).
template <typename T, int FMT, int E>
__device__ __forceinline__ void kvq_decode(const KvRowBuf<T, FMT, E>& r, int lane,
                                           float (&out)[E]) {
  if constexpr (FMT == KV_PLAIN) {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = r.v[j];
  } else if constexpr (FMT == KV_INT8) {
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = static_cast<float>(static_cast<signed char>(r.b[j])) * r.scale;
  } else if constexpr (FMT == KV_FP8) {
#pragma unroll
    for (int j = 0; j + 1 < E; j += 2) {  // pairs through the hardware cvt: same exact values
      float lo, hi;
      fp8x2_to_float2(static_cast<unsigned short>(r.b[j] | (r.b[j + 1] << 8)), lo, hi);
      out[j] = lo * r.scale;
      out[j + 1] = hi * r.scale;
    }
    if constexpr (E % 2) out[E - 1] = e4m3_to_float(r.b[E - 1]) * r.scale;
  } else {
    const float eff = e4m3_to_float(r.block) * r.scale;
    if constexpr (E == 1) {
      const unsigned int byte = r.b[0];
      out[0] = kvq_e2m1_to_float((lane & 1) ? (byte >> 4) : (byte & 15u)) * eff;
    } else {
#pragma unroll
      for (int j = 0; j < E / 2; ++j) {
        out[2 * j] = kvq_e2m1_to_float(r.b[j] & 15u) * eff;
        out[2 * j + 1] = kvq_e2m1_to_float(r.b[j] >> 4) * eff;
      }
    }
  }
}

// Fetch and decode in one (the gather kernel's row).
template <typename T, int FMT, int E>
__device__ __forceinline__ void kvq_load_row(const KvSrc& s, long long row, int lane,
                                             float (&out)[E]) {
  KvRowBuf<T, FMT, E> r;
  kvq_fetch<T, FMT, E>(s, row, lane, r);
  kvq_decode<T, FMT, E>(r, lane, out);
}

// The address of lane's part of a row (for an L2 prefetch).
template <typename T, int FMT, int E>
__device__ __forceinline__ const void* kvq_row_ptr(const KvSrc& s, long long row, int lane) {
  constexpr int D = 32 * E;
  if constexpr (FMT == KV_PLAIN) return static_cast<const T*>(s.values) + row * D + lane * E;
  if constexpr (FMT == KV_NVFP4) {
    return static_cast<const unsigned char*>(s.values) + row * (D / 2) + (lane * E) / 2;
  }
  return static_cast<const unsigned char*>(s.values) + row * D + lane * E;
}
