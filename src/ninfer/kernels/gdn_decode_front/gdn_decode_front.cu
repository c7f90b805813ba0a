// The Gated DeltaNet decode step before the recurrence, for a batch of one token per sequence:
//   window = [conv_state[slot, c, :], x[c]];  y = silu(sum_j window_j * w[c, j]);  state <- window[1:]
//   q, k per key head: y (rounded to T) * rsqrt(sum y^2 + eps)   (fp32 out)
//   v: y rounded to T;   beta = sigmoid(b);   g = -exp(A_log) * softplus(a + dt_bias)
// Grid (groups, B): groups 0..2Hk-1 are the q then k heads (one block, one channel per thread, so
// the head's L2 norm is one block sum); then blocks of blockDim v channels; the last group does g
// and beta. Every conv channel is read and written by exactly one thread: no races on the state.
template <typename TX, typename TS, typename TW>
__global__ void gdn_decode_front(
    float* __restrict__ q_out, float* __restrict__ k_out, TX* __restrict__ v_out,
    float* __restrict__ g_out, float* __restrict__ beta_out, TS* __restrict__ conv_state,
    const TX* __restrict__ qkv, long long qkv_stride, const TX* __restrict__ a, long long a_stride,
    const TX* __restrict__ b_in, long long b_stride, const TW* __restrict__ conv_w,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const long long* __restrict__ slots, int num_k_heads, int dk, int num_v_heads, int dv,
    int taps, float eps) {
  pdl_begin();
  const int group = blockIdx.x;
  const long long row = blockIdx.y;
  const int t = threadIdx.x;
  const int key_groups = 2 * num_k_heads;
  const int key_channels = key_groups * dk;
  const int num_channels = key_channels + num_v_heads * dv;
  const int value_groups = (num_v_heads * dv + blockDim.x - 1) / blockDim.x;

  if (group == key_groups + value_groups) {  // g and beta
    for (int h = t; h < num_v_heads; h += blockDim.x) {
      const float av = to_float(a[row * a_stride + h]) + dt_bias[h];
      const float softplus = av > 20.0f ? av : log1pf(__expf(av));
      g_out[row * num_v_heads + h] = -__expf(a_log[h]) * softplus;
      const float bv = to_float(b_in[row * b_stride + h]);
      beta_out[row * num_v_heads + h] = sigmoid(bv);
    }
    return;
  }

  int c;
  bool active;
  if (group < key_groups) {
    c = group * dk + t;
    active = t < dk;
  } else {
    c = key_channels + (group - key_groups) * blockDim.x + t;
    active = c < num_channels;
  }
  float y = 0.0f;
  if (active) {
    const int hist = taps - 1;
    TS* st = conv_state + (slots[row] * num_channels + c) * static_cast<long long>(hist);
    const TW* wc = conv_w + static_cast<long long>(c) * taps;
    const TS x_new = from_float<TS>(to_float(qkv[row * qkv_stride + c]));
    float prev = to_float(st[0]);
    y = prev * to_float(wc[0]);
    for (int j = 1; j < hist; ++j) {  // shift the history left by one as it is read
      const float cur = to_float(st[j]);
      y += cur * to_float(wc[j]);
      st[j - 1] = from_float<TS>(cur);
    }
    y += to_float(x_new) * to_float(wc[hist]);
    st[hist - 1] = x_new;
    y = to_float(from_float<TX>(silu(y)));  // rounded as the model does
  }
  if (group < key_groups) {
    const float inv = rsqrtf(block_sum(active ? y * y : 0.0f) + eps);
    if (!active) return;
    const int head = group < num_k_heads ? group : group - num_k_heads;
    float* dst = group < num_k_heads ? q_out : k_out;
    dst[(row * num_k_heads + head) * dk + t] = y * inv;
  } else if (active) {
    v_out[row * (static_cast<long long>(num_v_heads) * dv) + (c - key_channels)] = from_float<TX>(y);
  }
}
