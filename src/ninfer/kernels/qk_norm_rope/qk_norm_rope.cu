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
