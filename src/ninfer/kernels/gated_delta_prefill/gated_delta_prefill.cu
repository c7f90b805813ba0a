// The gated delta rule over the prefill tokens of several sequences, fused with its front ops.
//
// For sequence b (tokens cu_seqlens[b] .. cu_seqlens[b+1]), value head h (key head h / (Hv/Hk))
// and the fp32 state S = state[slot_b, h] ([DK, Dv]), token by token:
//   q, k <- L2-normalised (fp32, eps);  q <- scale q;  d = exp(g), g = -exp(A_log) softplus(a + dt)
//   beta = sigmoid(b);  delta = beta (v - d S^T k);  o = d S^T q + (k.q) delta;  S <- d S + k delta^T
// (o is S_new^T q rewritten on the old state, so both dot products of a token are independent and
// reduce together). S is kept as sigma * s with the decays in the scalar sigma (folded into s only
// when sigma would underflow), so a token costs 3 FMAs per state element, not 4.
// Block = 16 value columns x 8 threads per column; thread j of a column keeps
// DK/8 rows of it in registers for the whole sequence, so the state is read and written once per
// sequence and the serial per-token chain is FMAs plus 3 xor-shuffles. Tokens are staged through
// shared memory in chunks of 32 by the whole block: q and k normalised once per token (a warp per
// 4 tokens at a time, coalesced reads of the strided conv output), v for the block's columns, d, beta and k.q.
// Grid: (Dv / 16 column tiles, Hv, B); columns past Dv are computed on zeros and never stored.

constexpr int GDP_COLS = 16;     // value columns per block
constexpr int GDP_LANES = 8;     // threads per column (the shuffle group)
constexpr int GDP_CHUNK = 32;    // tokens staged per pass
constexpr int GDP_BATCH = 4;     // tokens a warp normalises at once while staging
constexpr int GDP_THREADS = GDP_COLS * GDP_LANES;
constexpr float GDP_MIN_SIGMA = 1e-18f;  // fold the lazy decay into the state below this

// Thread j of a column holds rows j * VEC + 8 * VEC * m + i (m < R / VEC, i < VEC): per token the
// 8 threads read 8 consecutive VEC-float pieces of a staged row (conflict-free vector loads).
template <int VEC>
__device__ __forceinline__ void load_vec(const float* src, float* dst) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(src);
    dst[0] = t.x;
    dst[1] = t.y;
    dst[2] = t.z;
    dst[3] = t.w;
  } else if constexpr (VEC == 2) {
    const float2 t = *reinterpret_cast<const float2*>(src);
    dst[0] = t.x;
    dst[1] = t.y;
  } else {
    dst[0] = src[0];
  }
}

template <typename T, int DK>
__global__ void __launch_bounds__(GDP_THREADS) gated_delta_prefill(
    float* __restrict__ out, float* __restrict__ state, const T* __restrict__ q,
    long long q_stride, const T* __restrict__ k, long long k_stride, const T* __restrict__ v,
    long long v_stride, const T* __restrict__ a, long long a_stride, const T* __restrict__ b_in,
    long long b_stride, const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const long long* __restrict__ slots, const long long* __restrict__ cu_seqlens,
    int num_k_heads, int num_v_heads, int dv, float scale, float eps) {
  pdl_begin();
  static_assert(DK % GDP_LANES == 0 && DK >= 16, "key dim must be a multiple of 8, >= 16");
  constexpr int R = DK / GDP_LANES;         // state rows per thread
  constexpr int VEC = R >= 4 ? 4 : R;       // floats per shared-memory vector load
  constexpr int M = R / VEC;                // vector loads per staged row
  constexpr int ACC = R >= 4 ? 4 : R;       // independent partial sums per dot product
  constexpr int PER_LANE = (DK + 31) / 32;  // elements per lane when a warp normalises a row

  __shared__ __align__(16) float q_s[GDP_CHUNK][DK];
  __shared__ __align__(16) float k_s[GDP_CHUNK][DK];
  __shared__ float v_s[GDP_CHUNK][GDP_COLS];
  __shared__ float decay_s[GDP_CHUNK];
  __shared__ float beta_s[GDP_CHUNK];
  __shared__ float kq_s[GDP_CHUNK];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int c = tid / GDP_LANES;  // local column
  const int j = tid % GDP_LANES;  // row group within the column
  const int h = blockIdx.y;
  const int seq = blockIdx.z;
  const int col = blockIdx.x * GDP_COLS + c;
  const bool active = col < dv;
  const int kh = h / (num_v_heads / num_k_heads);
  const long long start = cu_seqlens[seq];
  const long long end = cu_seqlens[seq + 1];
  const long long out_stride = static_cast<long long>(num_v_heads) * dv;
  const float neg_a = -__expf(a_log[h]);
  const float bias = dt_bias[h];

  float* s_ptr = state + (slots[seq] * num_v_heads + h) * static_cast<long long>(DK) * dv + col;
  float s[R];
  float sigma = 1.0f;  // the state is sigma * s (the sequence's decays so far, folded lazily)
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int row = j * VEC + GDP_LANES * VEC * m + i;
      s[m * VEC + i] = active ? s_ptr[static_cast<long long>(row) * dv] : 0.0f;
    }
  }

  for (long long t0 = start; t0 < end; t0 += GDP_CHUNK) {
    const int n = static_cast<int>(min(static_cast<long long>(GDP_CHUNK), end - t0));
    __syncthreads();  // the previous chunk is no longer read

    // Gates of this head: one token per thread.
    if (tid < n) {
      const long long t = t0 + tid;
      const float av = to_float(a[t * a_stride + h]) + bias;
      const float softplus = av > 20.0f ? av : log1pf(__expf(av));
      decay_s[tid] = __expf(neg_a * softplus);
      const float bv = to_float(b_in[t * b_stride + h]);
      beta_s[tid] = sigmoid(bv);
    }
    // v for the block's columns (zeros past Dv).
    for (int idx = tid; idx < n * GDP_COLS; idx += GDP_THREADS) {
      const int tt = idx / GDP_COLS;
      const int cc = idx % GDP_COLS;
      const int vc = blockIdx.x * GDP_COLS + cc;
      v_s[tt][cc] = vc < dv ? to_float(v[(t0 + tt) * v_stride + static_cast<long long>(h) * dv + vc])
                            : 0.0f;
    }
    // q and k of the key head, normalised once per token by one warp; k.q on the way. A warp
    // takes GDP_BATCH tokens at a time and issues all their loads before any reduction, so the
    // chunk's staging waits on a few L2 round trips instead of one per token.
    for (int t_base = warp * GDP_BATCH; t_base < n; t_base += (GDP_THREADS / 32) * GDP_BATCH) {
      float qv[GDP_BATCH][PER_LANE];
      float kv[GDP_BATCH][PER_LANE];
#pragma unroll
      for (int u = 0; u < GDP_BATCH; ++u) {
        const int tt = t_base + u;  // warp-uniform
        const T* qrow = q + (t0 + tt) * q_stride + static_cast<long long>(kh) * DK;
        const T* krow = k + (t0 + tt) * k_stride + static_cast<long long>(kh) * DK;
#pragma unroll
        for (int p = 0; p < PER_LANE; ++p) {
          const int i = lane + 32 * p;
          const bool ok = tt < n && i < DK;
          qv[u][p] = ok ? to_float(qrow[i]) : 0.0f;
          kv[u][p] = ok ? to_float(krow[i]) : 0.0f;
        }
      }
#pragma unroll
      for (int u = 0; u < GDP_BATCH; ++u) {
        const int tt = t_base + u;
        float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
        for (int p = 0; p < PER_LANE; ++p) {
          qq += qv[u][p] * qv[u][p];
          kk += kv[u][p] * kv[u][p];
          qk += qv[u][p] * kv[u][p];
        }
        qq = warp_sum(qq);  // every lane of the warp takes part (tt is warp-uniform)
        kk = warp_sum(kk);
        qk = warp_sum(qk);
        if (tt < n) {
          const float q_mul = rsqrtf(qq + eps) * scale;
          const float k_mul = rsqrtf(kk + eps);
#pragma unroll
          for (int p = 0; p < PER_LANE; ++p) {
            const int i = lane + 32 * p;
            if (i < DK) {
              q_s[tt][i] = qv[u][p] * q_mul;
              k_s[tt][i] = kv[u][p] * k_mul;
            }
          }
          if (lane == 0) kq_s[tt] = qk * q_mul * k_mul;
        }
      }
    }
    __syncthreads();

    // The serial chain: per token two partial dot products, 3 shuffles, a rank-1 update.
    float* o_ptr = out + t0 * out_stride + static_cast<long long>(h) * dv + col;
#pragma unroll 2
    for (int tt = 0; tt < n; ++tt) {
      float kr[R];
      float qr[R];
#pragma unroll
      for (int m = 0; m < M; ++m) {
        load_vec<VEC>(&k_s[tt][j * VEC + GDP_LANES * VEC * m], &kr[m * VEC]);
        load_vec<VEC>(&q_s[tt][j * VEC + GDP_LANES * VEC * m], &qr[m * VEC]);
      }
      float sk[ACC];
      float sq[ACC];
#pragma unroll
      for (int r = 0; r < ACC; ++r) {
        sk[r] = s[r] * kr[r];
        sq[r] = s[r] * qr[r];
      }
#pragma unroll
      for (int r = ACC; r < R; ++r) {
        sk[r % ACC] += s[r] * kr[r];
        sq[r % ACC] += s[r] * qr[r];
      }
#pragma unroll
      for (int r = 1; r < ACC; ++r) {
        sk[0] += sk[r];
        sq[0] += sq[r];
      }
      float dot_k = sk[0];
      float dot_q = sq[0];
#pragma unroll
      for (int offset = GDP_LANES / 2; offset > 0; offset >>= 1) {
        dot_k += __shfl_xor_sync(0xffffffffu, dot_k, offset);
        dot_q += __shfl_xor_sync(0xffffffffu, dot_q, offset);
      }
      // The state is sigma * s: decay goes into the scalar, so the update is one FMA per row.
      float sigma_new = sigma * decay_s[tt];
      const float pred = sigma_new * dot_k;
      const float o_old = sigma_new * dot_q;
      if (sigma_new < GDP_MIN_SIGMA) {  // block-uniform: fold the scale back before it underflows
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] *= sigma_new;
        sigma_new = 1.0f;
      }
      const float delta = beta_s[tt] * (v_s[tt][c] - pred);
      const float o = o_old + kq_s[tt] * delta;
      const float step = delta / sigma_new;
#pragma unroll
      for (int r = 0; r < R; ++r) s[r] = fmaf(kr[r], step, s[r]);
      sigma = sigma_new;
      if (j == 0 && active) o_ptr[tt * out_stride] = o;
    }
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      const int row = j * VEC + GDP_LANES * VEC * m + i;
      if (active) s_ptr[static_cast<long long>(row) * dv] = sigma * s[m * VEC + i];
    }
  }
}
