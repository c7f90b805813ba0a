// The Gated DeltaNet layers of a speculative verify step, and the fold that later commits the
// kept columns. Every sequence feeds W tokens (columns); the engine keeps a prefix of them,
// known only after the step, so the verify leaves the slots' conv and delta-rule state as they
// were and the fold replays the kept columns into them once the round lands.
//
// gdn_verify_front: the decode front (gdn_decode_front.cu) for W columns per sequence in one
// launch: a thread walks its channel's conv window over the columns in registers (the state is
//   read, never written) and each column's q, k, v, g, beta land in row b * W + j.
// gated_delta_verify: the narrow decode step (gated_delta_decode.cu) for W columns: the block
//   loads its 32 state columns once and applies the W steps in registers, one output row per
//   column, and writes no state. Each step is the decode kernel's arithmetic, op for op, so its
//   outputs equal W decode launches on a working copy bit for bit.
// gated_delta_fold / conv_fold: every linear layer of a model in one launch (per-layer pointer
//   arrays): slot slots[i] advances over the first ncols[i] columns of its verify row rows[i],
//   the delta-rule state with the same per-step arithmetic, the conv state taking the last K-1
//   inputs of [its history, the kept columns].

#define GDV_MAX_TAPS 8

template <typename TX, typename TS, typename TW>
__global__ void gdn_verify_front(
    float* __restrict__ q_out, float* __restrict__ k_out, TX* __restrict__ v_out,
    float* __restrict__ g_out, float* __restrict__ beta_out, const TS* __restrict__ conv_state,
    const TX* __restrict__ qkv, long long qkv_stride, const TX* __restrict__ a, long long a_stride,
    const TX* __restrict__ b_in, long long b_stride, const TW* __restrict__ conv_w,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const long long* __restrict__ slots, int width, int num_k_heads, int dk, int num_v_heads,
    int dv, int taps, float eps) {
  pdl_begin();
  const int group = blockIdx.x;
  const long long seq = blockIdx.y;
  const int t = threadIdx.x;
  const int key_groups = 2 * num_k_heads;
  const int key_channels = key_groups * dk;
  const int num_channels = key_channels + num_v_heads * dv;
  const int value_groups = (num_v_heads * dv + blockDim.x - 1) / blockDim.x;

  if (group == key_groups + value_groups) {  // g and beta of every column
    for (int i = t; i < width * num_v_heads; i += blockDim.x) {
      const long long row = seq * width + i / num_v_heads;
      const int h = i % num_v_heads;
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
  const int hist = taps - 1;
  TS window[GDV_MAX_TAPS];  // the channel's history, then the columns so far
  const TW* wc = conv_w + static_cast<long long>(active ? c : 0) * taps;
  if (active) {
    const TS* st = conv_state + (slots[seq] * num_channels + c) * static_cast<long long>(hist);
    for (int j = 0; j < hist; ++j) window[j] = st[j];
  }
  for (int col = 0; col < width; ++col) {
    const long long row = seq * width + col;
    float y = 0.0f;
    if (active) {
      const TS x_new = from_float<TS>(to_float(qkv[row * qkv_stride + c]));
      y = to_float(window[0]) * to_float(wc[0]);
      for (int j = 1; j < hist; ++j) y += to_float(window[j]) * to_float(wc[j]);
      y += to_float(x_new) * to_float(wc[hist]);
      for (int j = 1; j < hist; ++j) window[j - 1] = window[j];
      window[hist - 1] = x_new;
      y = to_float(from_float<TX>(silu(y)));  // rounded as the model does
    }
    if (group < key_groups) {
      const float inv = rsqrtf(block_sum(active ? y * y : 0.0f) + eps);
      if (active) {
        const int head = group < num_k_heads ? group : group - num_k_heads;
        float* dst = group < num_k_heads ? q_out : k_out;
        dst[(row * num_k_heads + head) * dk + t] = y * inv;
      }
    } else if (active) {
      v_out[row * (static_cast<long long>(num_v_heads) * dv) + (c - key_channels)] =
          from_float<TX>(y);
    }
  }
}

// One step of the narrow decode kernel on registers: sreg (this thread's rows of its column)
// decays, takes the delta-rule update and, with q, returns the block's output for the column in
// thread row 0. `partial` is reused: callers sync between steps (the last __syncthreads here).
template <typename TQ, typename TV, int ROWS, bool OUTPUT>
__device__ __forceinline__ float gdv_step(float (&sreg)[ROWS], float (&partial)[4][32],
                                          const TQ* qh, const TQ* kh, const TV* vcol, bool active,
                                          float decay, float bt) {
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  float kreg[ROWS];
  float pred = 0.0f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    kreg[r] = to_float(kh[i]);
    sreg[r] = active ? sreg[r] * decay : 0.0f;
    pred += sreg[r] * kreg[r];
  }
  partial[ty][tx] = pred;
  __syncthreads();
  pred = partial[0][tx] + partial[1][tx] + partial[2][tx] + partial[3][tx];
  const float vj = active ? to_float(*vcol) : 0.0f;
  const float delta = bt * (vj - pred);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    sreg[r] += kreg[r] * delta;
    if (OUTPUT) o += sreg[r] * to_float(qh[i]);
  }
  __syncthreads();  // everyone has read partial[] above
  float total = 0.0f;
  if (OUTPUT) {
    partial[ty][tx] = o;
    __syncthreads();
    total = partial[0][tx] + partial[1][tx] + partial[2][tx] + partial[3][tx];
    __syncthreads();  // partial[] is free for the next step
  }
  return total;
}

template <typename TQ, typename TV, int DK>
__global__ void __launch_bounds__(128) gated_delta_verify(
    float* __restrict__ out, const float* __restrict__ state, const TQ* __restrict__ q,
    const TQ* __restrict__ k, const TV* __restrict__ v, const float* __restrict__ g,
    const float* __restrict__ beta, const long long* __restrict__ slots, int width,
    int num_k_heads, int num_v_heads, int dv, long long q_stride, long long k_stride,
    long long v_stride, float scale) {
  pdl_begin();
  constexpr int ROWS = DK / 4;
  __shared__ float partial[4][32];
  const int seq = blockIdx.z;
  const int h = blockIdx.y;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * 32 + tx;
  const bool active = col < dv;
  const int kh = h / (num_v_heads / num_k_heads);
  const float* s = state + (slots[seq] * num_v_heads + h) * static_cast<long long>(DK) * dv;
  float sreg[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    sreg[r] = active ? s[static_cast<long long>(i) * dv + col] : 0.0f;
  }
  for (int j = 0; j < width; ++j) {
    const long long row = static_cast<long long>(seq) * width + j;
    const float total = gdv_step<TQ, TV, ROWS, true>(
        sreg, partial, q + row * q_stride + static_cast<long long>(kh) * DK,
        k + row * k_stride + static_cast<long long>(kh) * DK,
        v + row * v_stride + static_cast<long long>(h) * dv + (active ? col : 0), active,
        __expf(g[row * num_v_heads + h]), beta[row * num_v_heads + h]);
    if (ty == 0 && active) out[(row * num_v_heads + h) * dv + col] = scale * total;
  }
}

// Records of one verify step, layer by layer (pointer arrays, one entry per linear layer):
// k [R, W, Hk, DK] fp32, v [R, W, Hv, dv], g and beta [R, W, Hv] fp32, all contiguous.
template <typename TV, int DK>
__global__ void __launch_bounds__(128) gated_delta_fold(
    const long long* __restrict__ state_ptrs, const long long* __restrict__ k_ptrs,
    const long long* __restrict__ v_ptrs, const long long* __restrict__ g_ptrs,
    const long long* __restrict__ beta_ptrs, const long long* __restrict__ slots,
    const long long* __restrict__ rows, const long long* __restrict__ ncols, int num,
    int width, int num_k_heads, int num_v_heads, int dv) {
  pdl_begin();
  constexpr int ROWS = DK / 4;
  __shared__ float partial[4][32];
  const int i = blockIdx.z % num;
  const int layer = blockIdx.z / num;
  const int h = blockIdx.y;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * 32 + tx;
  const bool active = col < dv;
  const long long n = ncols[i];
  if (n <= 0) return;
  const int kh = h / (num_v_heads / num_k_heads);
  float* s = reinterpret_cast<float*>(state_ptrs[layer]) +
             (slots[i] * num_v_heads + h) * static_cast<long long>(DK) * dv;
  const float* rk = reinterpret_cast<const float*>(k_ptrs[layer]);
  const TV* rv = reinterpret_cast<const TV*>(v_ptrs[layer]);
  const float* rg = reinterpret_cast<const float*>(g_ptrs[layer]);
  const float* rb = reinterpret_cast<const float*>(beta_ptrs[layer]);
  float sreg[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int e = ty * ROWS + r;
    sreg[r] = active ? s[static_cast<long long>(e) * dv + col] : 0.0f;
  }
  for (long long c = 0; c < n && c < width; ++c) {
    const long long row = rows[i] * width + c;
    gdv_step<float, TV, ROWS, false>(
        sreg, partial, nullptr, rk + (row * num_k_heads + kh) * DK,
        rv + (row * num_v_heads + h) * static_cast<long long>(dv) + (active ? col : 0), active,
        __expf(rg[row * num_v_heads + h]), rb[row * num_v_heads + h]);
  }
  if (active) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r) s[static_cast<long long>(ty * ROWS + r) * dv + col] = sreg[r];
  }
}

// conv state [S, C, K-1] per layer; records qkv [R, W, C] (row stride qkv_stride per column).
template <typename TS>
__global__ void conv_fold(const long long* __restrict__ conv_ptrs,
                          const long long* __restrict__ qkv_ptrs, long long qkv_stride,
                          const long long* __restrict__ slots, const long long* __restrict__ rows,
                          const long long* __restrict__ ncols, int num, int width,
                          int num_channels, int taps) {
  pdl_begin();
  const int i = blockIdx.y % num;
  const int layer = blockIdx.y / num;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const long long n = ncols[i] < width ? ncols[i] : width;
  if (c >= num_channels || n <= 0) return;
  const int hist = taps - 1;
  TS* st = reinterpret_cast<TS*>(conv_ptrs[layer]) +
           (slots[i] * num_channels + c) * static_cast<long long>(hist);
  const TS* x = reinterpret_cast<const TS*>(qkv_ptrs[layer]) + rows[i] * width * qkv_stride + c;
  TS window[2 * GDV_MAX_TAPS];
  for (int j = 0; j < hist; ++j) window[j] = st[j];
  // only the last `hist` of [history, n columns] survive: columns before n - hist are not read
  const long long first = n > hist ? n - hist : 0;
  for (long long j = first; j < n; ++j) window[hist + (j - first)] = x[j * qkv_stride];
  const long long kept = n - first;  // columns held after the history
  for (int j = 0; j < hist; ++j) st[j] = window[kept + j];
}
