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
