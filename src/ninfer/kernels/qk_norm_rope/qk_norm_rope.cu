// Zero-centred RMSNorm of every q and k head, then rotate-half RoPE on its first R dims, in one
// launch for a step: grid (Hq + Hk, T), one block per (token, head), one thread per dim (D threads).
// Rounded as the torch ops it replaces: the norm's result rounded to T once, RoPE computed in fp32
// from those rounded values and rounded to T again; dims past R pass through. q and k may be
// strided views (q is every other D-slice of the gated q projection): token and head strides.
template <typename T>
__global__ void qk_norm_rope(T* __restrict__ q_out, T* __restrict__ k_out,
                             const T* __restrict__ q, long long q_tok_stride, long long q_head_stride,
                             const T* __restrict__ k, long long k_tok_stride, long long k_head_stride,
                             const T* __restrict__ q_w, const T* __restrict__ k_w,
                             const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                             int num_q_heads, int num_k_heads, int d, int rotary, float eps) {
  pdl_begin();
  __shared__ float row[1024];
  const long long t = blockIdx.y;
  const bool is_q = blockIdx.x < num_q_heads;
  const int head = is_q ? blockIdx.x : blockIdx.x - num_q_heads;
  const T* src = is_q ? q + t * q_tok_stride + head * q_head_stride
                      : k + t * k_tok_stride + head * k_head_stride;
  const T* w = is_q ? q_w : k_w;
  const int i = threadIdx.x;
  const float x = i < d ? to_float(src[i]) : 0.0f;
  const float inv = rsqrtf(block_sum(x * x) / static_cast<float>(d) + eps);
  const float normed = i < d ? to_float(from_float<T>((x * inv) * (1.0f + to_float(w[i])))) : 0.0f;
  row[i] = normed;
  __syncthreads();
  if (i >= d) return;
  float out = normed;
  if (i < rotary) {
    const int half = rotary / 2;
    const float partner = i < half ? -row[i + half] : row[i - half];
    out = normed * cos_t[t * rotary + i] + partner * sin_t[t * rotary + i];
  }
  T* dst = is_q ? q_out + (t * num_q_heads + head) * d : k_out + (t * num_k_heads + head) * d;
  dst[i] = from_float<T>(out);
}

// qk_norm_rope_warp: the same per-head results with one warp per (token, head) instead of a
// block: 8 rows per block of 256 threads, grid (ceil((Hq + Hk) / 8), T). Lane l holds dims
// l * E .. l * E + E - 1 (E = D / 32); the sum of squares is a warp shuffle sum, and rotate-half's
// partner dim i +- R/2 sits on lane l +- R / (2E) at the same slot (R / 2 a multiple of E, the
// launcher checks), one shuffle per slot. Why: a prefill launches T * (Hq + Hk) rows (2,048 x 28
// for the 27B), and the block version spent each 256-thread block on two barriers and a
// shared-memory round trip for 256 values (~0.3 TB/s in the 2k prefill profile).
//
// The warp form's body for one head row (lane l: dims l * E .. l * E + E - 1): norm + RoPE into
// dst and, when cache_dst is not null, the same values into cache_dst (the row's KV page slot).
template <typename T, int E>
__device__ __forceinline__ void qk_warp_row(T* __restrict__ dst, T* __restrict__ cache_dst,
                                            const T* __restrict__ src, const T* __restrict__ w,
                                            const float* __restrict__ cos_t,
                                            const float* __restrict__ sin_t, long long t,
                                            int rotary, float eps, int lane) {
  constexpr int D = 32 * E;
  float x[E];
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    x[j] = to_float(src[lane * E + j]);
    sq += x[j] * x[j];
  }
  const float inv = rsqrtf(warp_sum(sq) / static_cast<float>(D) + eps);
  const int half = rotary / 2;
  const int first = lane * E;  // this lane's first dim
  const int partner_lane = first < half ? lane + half / E : (first < rotary ? lane - half / E : lane);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const int i = first + j;
    const float normed = to_float(from_float<T>((x[j] * inv) * (1.0f + to_float(w[i]))));
    const float other = __shfl_sync(0xffffffffu, normed, partner_lane);
    float out = normed;
    if (i < rotary) {
      const float partner = i < half ? -other : other;
      out = normed * cos_t[t * rotary + i] + partner * sin_t[t * rotary + i];
    }
    const T r = from_float<T>(out);
    dst[i] = r;
    if (cache_dst != nullptr) cache_dst[i] = r;
  }
}

template <typename T, int E>
__global__ void __launch_bounds__(256) qk_norm_rope_warp(
    T* __restrict__ q_out, T* __restrict__ k_out, const T* __restrict__ q, long long q_tok_stride,
    long long q_head_stride, const T* __restrict__ k, long long k_tok_stride,
    long long k_head_stride, const T* __restrict__ q_w, const T* __restrict__ k_w,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, int num_q_heads,
    int num_k_heads, int rotary, float eps) {
  pdl_begin();
  constexpr int D = 32 * E;
  const int lane = threadIdx.x & 31;
  const int head_row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (head_row >= num_q_heads + num_k_heads) return;  // warp-uniform
  const long long t = blockIdx.y;
  const bool is_q = head_row < num_q_heads;
  const int head = is_q ? head_row : head_row - num_q_heads;
  const T* src = is_q ? q + t * q_tok_stride + head * q_head_stride
                      : k + t * k_tok_stride + head * k_head_stride;
  T* dst = is_q ? q_out + (t * num_q_heads + head) * D : k_out + (t * num_k_heads + head) * D;
  qk_warp_row<T, E>(dst, nullptr, src, is_q ? q_w : k_w, cos_t, sin_t, t, rotary, eps, lane);
}

// qk_norm_rope_store: qk_norm_rope_warp and the step's KV store in one launch (plain pages in T,
// [pages, P, Hk, D] contiguous, token t's slot = slots[t] = page * P + offset). k rows go to
// k_out and to their page slot; Hk more warps per token copy the v rows to theirs unchanged.
// Grid (ceil((Hq + 2 Hk) / 8), T). Why: the store was two index_copy launches per attention layer
// (32 per 27B step, 20 per 35B-A3B step) between this kernel and the attention; the values are
// the ones index_copy would write (k_out's bits; v as given).
template <typename T, int E>
__global__ void __launch_bounds__(256) qk_norm_rope_store(
    T* __restrict__ q_out, T* __restrict__ k_out, T* __restrict__ k_cache, T* __restrict__ v_cache,
    const T* __restrict__ q, long long q_tok_stride, long long q_head_stride,
    const T* __restrict__ k, long long k_tok_stride, long long k_head_stride,
    const T* __restrict__ v, long long v_tok_stride, long long v_head_stride,
    const long long* __restrict__ slots, const T* __restrict__ q_w, const T* __restrict__ k_w,
    const float* __restrict__ cos_t, const float* __restrict__ sin_t, int num_q_heads,
    int num_k_heads, int rotary, float eps) {
  pdl_begin();
  constexpr int D = 32 * E;
  const int lane = threadIdx.x & 31;
  const int head_row = blockIdx.x * 8 + (threadIdx.x >> 5);
  if (head_row >= num_q_heads + 2 * num_k_heads) return;  // warp-uniform
  const long long t = blockIdx.y;
  const long long slot = slots[t];
  if (head_row >= num_q_heads + num_k_heads) {  // a v row: copied to its slot as is
    const int head = head_row - num_q_heads - num_k_heads;
    const T* src = v + t * v_tok_stride + head * v_head_stride;
    T* dst = v_cache + (slot * num_k_heads + head) * D;
#pragma unroll
    for (int j = 0; j < E; ++j) dst[lane * E + j] = src[lane * E + j];
    return;
  }
  const bool is_q = head_row < num_q_heads;
  const int head = is_q ? head_row : head_row - num_q_heads;
  const T* src = is_q ? q + t * q_tok_stride + head * q_head_stride
                      : k + t * k_tok_stride + head * k_head_stride;
  T* dst = is_q ? q_out + (t * num_q_heads + head) * D : k_out + (t * num_k_heads + head) * D;
  T* cache_dst = is_q ? nullptr : k_cache + (slot * num_k_heads + head) * D;
  qk_warp_row<T, E>(dst, cache_dst, src, is_q ? q_w : k_w, cos_t, sin_t, t, rotary, eps, lane);
}
