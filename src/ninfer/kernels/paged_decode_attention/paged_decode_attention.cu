// Decode attention over a paged KV cache: one query token per sequence, G = Hq / Hk query heads per
// KV head, head dim D. Two launches (split-KV, as flash-decoding):
//   partial: grid (ceil(splits / 4), Hk, B), block 4 warps; each warp owns `tokens_per_split`
//     consecutive KV positions of one (sequence, KV head) and all G query heads that share it, so
//     every K and V row is read from its page once. Lane l holds dims l*E .. l*E+E-1 (E = D / 32);
//     the running max m, sum l and weighted V sum are kept per query head (online softmax).
//   combine: grid (Hq, B), block D threads; rescales each split's partial to the global max.
// Splits past a sequence's length leave m = -inf, l = 0 and are skipped by the combine.

template <typename T, int E>
__device__ __forceinline__ void load_row(const T* __restrict__ p, float (&out)[E]) {
  if constexpr (sizeof(T) * E == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int j = 0; j < E; ++j) out[j] = to_float(e[j]);
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

template <typename T, int D, int G>
__global__ void __launch_bounds__(128) paged_decode_partial(
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const T* __restrict__ q,
    const T* __restrict__ k_pages, const T* __restrict__ v_pages,
    const long long* __restrict__ page_table, const long long* __restrict__ kv_lens,
    int num_kv_heads, int page_size, int table_width, int num_splits, int tokens_per_split,
    float scale) {
  constexpr int E = D / 32;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int split = blockIdx.x * 4 + warp;
  const int kh = blockIdx.y;
  const long long b = blockIdx.z;
  if (split >= num_splits) return;
  const int num_q_heads = num_kv_heads * G;

  float qv[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    load_row<T, E>(q + (b * num_q_heads + kh * G + g) * D + lane * E, qv[g]);
#pragma unroll
    for (int j = 0; j < E; ++j) qv[g][j] *= scale;
  }
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = __int_as_float(0xff800000);
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < E; ++j) acc[g][j] = 0.0f;
  }
  const long long len = kv_lens[b];
  const long long start = static_cast<long long>(split) * tokens_per_split;
  const long long stop = start + tokens_per_split;
  const long long end = stop < len ? stop : len;
  const long long* pages = page_table + b * table_width;
  for (long long t = start; t < end; ++t) {
    const long long page = pages[t / page_size];
    const long long row = ((page * page_size + t % page_size) * num_kv_heads + kh) * D + lane * E;
    float kr[E], vr[E];
    load_row<T, E>(k_pages + row, kr);
    load_row<T, E>(v_pages + row, vr);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < E; ++j) dot += qv[g][j] * kr[j];
      const float s = warp_sum(dot);
      const float m_new = fmaxf(m[g], s);
      const float alpha = __expf(m[g] - m_new);
      const float p = __expf(s - m_new);
      l[g] = l[g] * alpha + p;
#pragma unroll
      for (int j = 0; j < E; ++j) acc[g][j] = acc[g][j] * alpha + p * vr[j];
      m[g] = m_new;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const long long idx = (b * num_q_heads + kh * G + g) * num_splits + split;
#pragma unroll
    for (int j = 0; j < E; ++j) ws_acc[idx * D + lane * E + j] = acc[g][j];
    if (lane == 0) {
      ws_ml[idx * 2] = m[g];
      ws_ml[idx * 2 + 1] = l[g];
    }
  }
}

template <typename T>
__global__ void paged_decode_combine(T* __restrict__ out, const float* __restrict__ ws_acc,
                                     const float* __restrict__ ws_ml, int num_splits, int d) {
  const long long row = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;  // b*Hq + h
  const float* ml = ws_ml + row * num_splits * 2;
  float top = __int_as_float(0xff800000);
  for (int s = 0; s < num_splits; ++s) top = fmaxf(top, ml[2 * s]);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float num = 0.0f;
    float den = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float ls = ml[2 * s + 1];
      if (ls > 0.0f) {
        const float w = __expf(ml[2 * s] - top);
        num += w * ws_acc[(row * num_splits + s) * d + i];
        den += w * ls;
      }
    }
    out[row * d + i] = from_float<T>(num / den);
  }
}
