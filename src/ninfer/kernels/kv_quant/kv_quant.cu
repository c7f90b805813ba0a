// KV-cache store (quantize on append) and gather (dequantize pages for prefill attention), for the
// int8, fp8 and nvfp4 formats of kv_codec.cu (compiled ahead of this file).
//
//   kv_store<T, FMT, E>: one warp per new (token, head) row of D = 32 * E values, 4 rows per
//     block. Lane l holds dims l*E .. l*E+E-1; the row amax is a warp max, an nvfp4 block amax a
//     max over the 16 / E lanes of the block. The row goes to flat slot slot_mapping[t] (page * P
//     + offset), i.e. row slot * Hk + h of the page-major tensors. x is read through its token
//     and head strides (V is a view into the fused projection).
//   kv_gather<T, FMT, E>: one warp per output row of the gathered [n, P, Hk, D]: row r reads row
//     page_ids[r / (P * Hk)] * P * Hk + r % (P * Hk) and writes it dequantized in T.
//
// Rounding is the torch twin's (reference.py), so stored bytes and gathered values are bit-equal
// to it: scales amax / 127, amax / 448, amax / 2688 (correctly rounded divisions), nvfp4 block
// scale e4m3(bamax / (row scale * 6)), values rounded to nearest even.

constexpr int KVQ_WARPS = 4;

__device__ __forceinline__ float kvq_warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

template <typename T, int FMT, int E>
__global__ void __launch_bounds__(KVQ_WARPS * 32) kv_store(
    unsigned char* __restrict__ values, float* __restrict__ scales,
    unsigned char* __restrict__ blocks, const T* __restrict__ x, long long x_tok_stride,
    long long x_head_stride, const long long* __restrict__ slot_mapping, int num_tokens,
    int num_heads) {
  pdl_begin();
  constexpr int D = 32 * E;
  const int lane = threadIdx.x & 31;
  const long long r = static_cast<long long>(blockIdx.x) * KVQ_WARPS + (threadIdx.x >> 5);
  if (r >= static_cast<long long>(num_tokens) * num_heads) return;  // whole warps leave
  const long long t = r / num_heads;
  const int h = static_cast<int>(r - t * num_heads);
  const T* src = x + t * x_tok_stride + h * x_head_stride + lane * E;
  float v[E];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    v[j] = to_float(src[j]);
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = kvq_warp_max(amax);
  const long long row = slot_mapping[t] * num_heads + h;
  if constexpr (FMT == KV_INT8 || FMT == KV_FP8) {
    const float top = FMT == KV_INT8 ? 127.0f : 448.0f;
    const float scale = amax > 0.0f ? __fdiv_rn(amax, top) : 1.0f;
    unsigned char* dst = values + row * D + lane * E;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const float s = __fdiv_rn(v[j], scale);
      if constexpr (FMT == KV_INT8) {
        const int q = max(-127, min(127, __float2int_rn(s)));
        dst[j] = static_cast<unsigned char>(static_cast<signed char>(q));
      } else {
        dst[j] = static_cast<unsigned char>(float_to_e4m3(s));
      }
    }
    if (lane == 0) scales[row] = scale;
  } else {
    static_assert(16 % E == 0, "nvfp4 rows need E dividing 16");
    constexpr int LANES = 16 / E;  // lanes per 16-value block
    const float g = amax > 0.0f ? __fdiv_rn(amax, 2688.0f) : 1.0f;
    float bamax = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) bamax = fmaxf(bamax, fabsf(v[j]));
#pragma unroll
    for (int offset = 1; offset < LANES; offset <<= 1) {
      bamax = fmaxf(bamax, __shfl_xor_sync(0xffffffffu, bamax, offset));
    }
    const unsigned int bs = float_to_e4m3(__fdiv_rn(bamax, g * 6.0f));
    const float eff = e4m3_to_float(bs) * g;
    unsigned int codes[E];
#pragma unroll
    for (int j = 0; j < E; ++j) {
      codes[j] = kvq_float_to_e2m1(eff > 0.0f ? __fdiv_rn(v[j], eff) : 0.0f);
    }
    unsigned char* dst = values + row * (D / 2);
    if constexpr (E == 1) {
      const unsigned int hi = __shfl_xor_sync(0xffffffffu, codes[0], 1);
      if ((lane & 1) == 0) dst[lane >> 1] = static_cast<unsigned char>(codes[0] | (hi << 4));
    } else {
#pragma unroll
      for (int j = 0; j < E / 2; ++j) {
        dst[lane * (E / 2) + j] = static_cast<unsigned char>(codes[2 * j] | (codes[2 * j + 1] << 4));
      }
    }
    if ((lane * E) % 16 == 0) blocks[row * (D / 16) + lane * E / 16] = static_cast<unsigned char>(bs);
    if (lane == 0) scales[row] = g;
  }
}

template <typename T, int FMT, int E>
__global__ void __launch_bounds__(KVQ_WARPS * 32) kv_gather(
    T* __restrict__ out, const unsigned char* __restrict__ values, const float* __restrict__ scales,
    const unsigned char* __restrict__ blocks, const long long* __restrict__ page_ids,
    long long num_rows, int rows_per_page) {
  pdl_begin();
  constexpr int D = 32 * E;
  const int lane = threadIdx.x & 31;
  const long long r = static_cast<long long>(blockIdx.x) * KVQ_WARPS + (threadIdx.x >> 5);
  if (r >= num_rows) return;
  const long long i = r / rows_per_page;
  const long long src_row = page_ids[i] * rows_per_page + (r - i * rows_per_page);
  const KvSrc s{values, scales, blocks};
  float v[E];
  kvq_load_row<T, FMT, E>(s, src_row, lane, v);
  T* dst = out + r * D + lane * E;
#pragma unroll
  for (int j = 0; j < E; ++j) dst[j] = from_float<T>(v[j]);
}
