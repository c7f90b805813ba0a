// One recurrent step of the gated delta rule for a batch, updating fp32 state slots in place.
//
// For sequence b, value head h (key head h / (Hv / Hk)) and state S = state[slot_b, h] ([DK, Dv]):
//   S <- e^g S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = scale * S^T q
// Block (32, 4) owns 32 value columns of one head: thread (tx, ty) keeps rows ty*DK/4 .. +DK/4 of
// column tx in registers, so S is read once and written once (the byte floor); the two dot
// products over DK are reduced across the 4 row groups through shared memory. A warp reads 32
// consecutive columns of one row: 128-byte coalesced transactions.
template <typename TQ, typename TV, int DK>
__global__ void __launch_bounds__(128) gated_delta_decode(
    float* __restrict__ out, float* __restrict__ state, const TQ* __restrict__ q,
    const TQ* __restrict__ k, const TV* __restrict__ v, const float* __restrict__ g,
    const float* __restrict__ beta, const long long* __restrict__ slots, int num_k_heads,
    int num_v_heads, int dv, long long q_stride, long long k_stride, long long v_stride,
    float scale) {
  pdl_begin();
  constexpr int ROW_GROUPS = 4;
  constexpr int ROWS = DK / ROW_GROUPS;
  __shared__ float partial[ROW_GROUPS][32];
  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * 32 + tx;
  const bool active = col < dv;
  const int kh = h / (num_v_heads / num_k_heads);
  const TQ* qh = q + b * q_stride + static_cast<long long>(kh) * DK;
  const TQ* kh_ptr = k + b * k_stride + static_cast<long long>(kh) * DK;
  float* s = state + (slots[b] * num_v_heads + h) * static_cast<long long>(DK) * dv;
  const float decay = __expf(g[b * num_v_heads + h]);
  const float bt = beta[b * num_v_heads + h];

  float sreg[ROWS];
  float kreg[ROWS];
  float pred = 0.0f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    kreg[r] = to_float(kh_ptr[i]);
    sreg[r] = active ? s[static_cast<long long>(i) * dv + col] * decay : 0.0f;
    pred += sreg[r] * kreg[r];
  }
  partial[ty][tx] = pred;
  __syncthreads();
  pred = partial[0][tx] + partial[1][tx] + partial[2][tx] + partial[3][tx];
  const float vj = active ? to_float(v[b * v_stride + static_cast<long long>(h) * dv + col]) : 0.0f;
  const float delta = bt * (vj - pred);
  float o = 0.0f;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    sreg[r] += kreg[r] * delta;
    if (active) s[static_cast<long long>(i) * dv + col] = sreg[r];
    o += sreg[r] * to_float(qh[i]);
  }
  __syncthreads();  // everyone has read partial[] above
  partial[ty][tx] = o;
  __syncthreads();
  if (ty == 0 && active) {
    const float total = partial[0][tx] + partial[1][tx] + partial[2][tx] + partial[3][tx];
    out[(static_cast<long long>(b) * num_v_heads + h) * dv + col] = scale * total;
  }
}

// The same step for wide batches, value dim a multiple of 128: block (32, 8) owns 128 value
// columns of one head, each lane 4 adjacent columns as float4 and DK/8 rows of them. Per thread
// DK/8 16-byte loads are in flight before the first use (the narrow kernel above issues 4-byte
// loads), which is what the state stream needs at many rows per step; with few rows the narrow
// kernel's 4x more blocks cover the SMs better (launch.py picks).
__device__ __forceinline__ float4 fma4(float4 acc, float4 a, float b) {
  return make_float4(acc.x + a.x * b, acc.y + a.y * b, acc.z + a.z * b, acc.w + a.w * b);
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <typename TQ, typename TV, int DK>
__global__ void __launch_bounds__(256) gated_delta_decode_wide(
    float* __restrict__ out, float* __restrict__ state, const TQ* __restrict__ q,
    const TQ* __restrict__ k, const TV* __restrict__ v, const float* __restrict__ g,
    const float* __restrict__ beta, const long long* __restrict__ slots, int num_k_heads,
    int num_v_heads, int dv, long long q_stride, long long k_stride, long long v_stride,
    float scale) {
  pdl_begin();
  constexpr int ROW_GROUPS = 8;
  constexpr int ROWS = DK / ROW_GROUPS;
  __shared__ float4 partial[ROW_GROUPS][32];
  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * 128 + tx * 4;
  const int row_stride = dv / 4;  // float4 per state row
  const int kh = h / (num_v_heads / num_k_heads);
  const TQ* qh = q + b * q_stride + static_cast<long long>(kh) * DK;
  const TQ* kh_ptr = k + b * k_stride + static_cast<long long>(kh) * DK;
  float4* s = reinterpret_cast<float4*>(
      state + (slots[b] * num_v_heads + h) * static_cast<long long>(DK) * dv + col);
  const float decay = __expf(g[b * num_v_heads + h]);
  const float bt = beta[b * num_v_heads + h];

  float4 sreg[ROWS];
  float kreg[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    sreg[r] = s[static_cast<long long>(i) * row_stride];
    kreg[r] = to_float(kh_ptr[i]);
  }
  float4 pred = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    sreg[r] = make_float4(sreg[r].x * decay, sreg[r].y * decay, sreg[r].z * decay,
                          sreg[r].w * decay);
    pred = fma4(pred, sreg[r], kreg[r]);
  }
  partial[ty][tx] = pred;
  __syncthreads();
  pred = partial[0][tx];
#pragma unroll
  for (int j = 1; j < ROW_GROUPS; ++j) pred = add4(pred, partial[j][tx]);
  const TV* vh = v + b * v_stride + static_cast<long long>(h) * dv + col;
  const float4 delta = make_float4(bt * (to_float(vh[0]) - pred.x), bt * (to_float(vh[1]) - pred.y),
                                   bt * (to_float(vh[2]) - pred.z), bt * (to_float(vh[3]) - pred.w));
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int i = ty * ROWS + r;
    sreg[r] = make_float4(sreg[r].x + kreg[r] * delta.x, sreg[r].y + kreg[r] * delta.y,
                          sreg[r].z + kreg[r] * delta.z, sreg[r].w + kreg[r] * delta.w);
    s[static_cast<long long>(i) * row_stride] = sreg[r];
    o = fma4(o, sreg[r], to_float(qh[i]));
  }
  __syncthreads();  // everyone has read partial[] above
  partial[ty][tx] = o;
  __syncthreads();
  if (ty == 0) {
    float4 total = partial[0][tx];
#pragma unroll
    for (int j = 1; j < ROW_GROUPS; ++j) total = add4(total, partial[j][tx]);
    total = make_float4(scale * total.x, scale * total.y, scale * total.z, scale * total.w);
    *reinterpret_cast<float4*>(out + (static_cast<long long>(b) * num_v_heads + h) * dv + col) =
        total;
  }
}
