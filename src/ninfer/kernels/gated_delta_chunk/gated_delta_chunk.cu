// The gated delta rule over prefill tokens in 64-token chunks (WY / UT-transform form), on the
// tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulation), in two launches.
//
// Chunks start at each sequence's first token (the last one may be partial). Within a chunk,
// with S0 the fp32 state [DK, Dv] at its start, G_t the cumulative log decay from the chunk's
// start (g = -e^{A_log} softplus(a + dt_bias)), beta = sigmoid(b), n_t = |k_t| and m_t = |q_t|
// (L2 norms with eps) of the raw conv-output rows:
//   A[t,s]   = beta_t e^{G_t-G_s} k_t.k_s / (n_t n_s)   (s < t),  Tb = (I + A)^{-1} diag(beta)
//   attn[t,s]= scale e^{G_t-G_s} q_t.k_s / (m_t n_s)    (s <= t)
//   R = V - diag(e^{G}/n) K S0;  U = Tb R;  O = diag(scale e^{G}/m) Q S0 + attn U
//   S = e^{G_last} S0 + K^T diag(e^{G_last-G}/n) U
// (the chunked form of: S <- e^g S + k beta (v - e^g S^T k)^T, o = scale S^T q, q and k
// L2-normalised). Norms and decays are row scales applied in fp32 around the products, so q and k
// enter the tensor cores as the raw bf16 rows, read in place.
//
// gdc_prepare (grid: chunk, key head, sequence; 4 warps): everything that does not depend on the
// state, for the value heads of one key head: k.k and q.k by mma, then per value head the gates,
// A, its inverse by 16x16 blocks in fp32 (diagonal blocks by substitution, then three rounds of
// block products), and the stores: attn and Tb as bf16 rows [T, Hv, 64], the row scales
// (scale e^G/m, e^G/n, e^{G_last-G}/n, and e^{G_last} on a chunk's first row) as [T, Hv, 4].
// gdc_recur (grid: 16*WARPS value columns, value head, sequence): walks the sequence's chunks with
// S^T in registers (each warp owns 16 value columns: S^T is the A operand of its products, and
// each product's fp32 result is rearranged in registers into the next one's A operand), while the
// next chunk's q, k, v, attn, Tb and scales stream into the other half of a double-buffered shared
// memory stage (cp.async). Per chunk and warp: 64 + 64 mma for K S0 and Q S0, at most 32 + 32 for
// Tb R and attn U (lower triangular: blocks above the diagonal are skipped), 64 for the update.

constexpr int GDC_CHUNK = 64;
constexpr int GDC_PREP_THREADS = 128;

// --- ptx helpers begin (the host emulation used in development replaces this section) ---------

__device__ __forceinline__ unsigned gdc_smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, asynchronous; zero-filled when !ok (src must still be a valid address)
__device__ __forceinline__ void gdc_cp16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(gdc_smem_addr(dst)), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void gdc_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void gdc_cp_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

// Four 8x8 bf16 matrices; lane l gives the address of row l % 8 of matrix l / 8.
__device__ __forceinline__ void gdc_ldsm4(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(gdc_smem_addr(row)));
}

__device__ __forceinline__ void gdc_ldsm4_trans(unsigned (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(gdc_smem_addr(row)));
}

// d += A (16x16 bf16, row) * B (16x8 bf16, col), fp32 accumulate (a fragment array)
__device__ __forceinline__ void gdc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                        unsigned b1) {
  mma_16816<false>(d, a[0], a[1], a[2], a[3], b0, b1);
}

// --- ptx helpers end ---------------------------------------------------------------------------

// Fragment positions (lane = 4 * gid + tig): an m16n8 accumulator holds rows gid, gid + 8 and
// columns 2 tig, 2 tig + 1 (c[0], c[1] on row gid; c[2], c[3] on row gid + 8); the A operand of a
// k16 step holds the same rows with columns 2 tig.. (a[0], a[1]) and 8 + 2 tig.. (a[2], a[3]), so
// the accumulators of n-tiles 2j and 2j+1 pack into the A operand of k-step j.
__device__ __forceinline__ void gdc_acc_to_a(unsigned (&a)[4], const float (&c0)[4],
                                             const float (&c1)[4]) {
  a[0] = pack_pair<false>(c0[0], c0[1]);
  a[1] = pack_pair<false>(c0[2], c0[3]);
  a[2] = pack_pair<false>(c1[0], c1[1]);
  a[3] = pack_pair<false>(c1[2], c1[3]);
}

template <int DK>
struct GdcPrepSmem {
  union {
    struct {
      bf16 q[GDC_CHUNK][DK + 8];  // +8: rows 16 bytes apart in bank terms (conflict-free ldmatrix)
      bf16 k[GDC_CHUNK][DK + 8];
    } in;
    struct {
      float a[GDC_CHUNK][GDC_CHUNK + 1];    // A (strictly lower)
      float inv[GDC_CHUNK][GDC_CHUNK + 1];  // (I + A)^{-1}, lower triangle and diagonal only
    } mat;
  } u;
  float y[3][16][17];  // block products of one inversion round
  float inv_q[GDC_CHUNK];
  float inv_k[GDC_CHUNK];
  float cum[GDC_CHUNK];
  float beta[GDC_CHUNK];
};

template <typename T, int DK>
__global__ void __launch_bounds__(GDC_PREP_THREADS) gdc_prepare(
    bf16* __restrict__ attn_out, bf16* __restrict__ tb_out, float* __restrict__ scal_out,
    const bf16* __restrict__ q, long long q_stride, const bf16* __restrict__ k, long long k_stride,
    const T* __restrict__ a, long long a_stride, const T* __restrict__ b_in, long long b_stride,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias,
    const long long* __restrict__ cu_seqlens, int num_k_heads, int num_v_heads, float scale,
    float eps) {
  pdl_begin();
  static_assert(DK % 16 == 0 && DK >= 16, "key dim must be a multiple of 16");
  constexpr int PIECES = DK / 8;  // 16-byte pieces of a q/k row
  __shared__ __align__(16) GdcPrepSmem<DK> sm;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int gid = lane >> 2;
  const int tig = lane & 3;
  const int kh = blockIdx.y;
  const long long start = cu_seqlens[blockIdx.z];
  const long long end = cu_seqlens[blockIdx.z + 1];
  const long long c0 = start + static_cast<long long>(blockIdx.x) * GDC_CHUNK;
  if (c0 >= end) return;  // block-uniform: this sequence has fewer chunks
  const int n = static_cast<int>(min(static_cast<long long>(GDC_CHUNK), end - c0));

  // q and k rows of the chunk; rows past the sequence are zeros
  for (int idx = tid; idx < GDC_CHUNK * PIECES; idx += GDC_PREP_THREADS) {
    const int t = idx / PIECES;
    const int p = idx % PIECES;
    const long long row = c0 + (t < n ? t : 0);
    const long long col = static_cast<long long>(kh) * DK + p * 8;
    gdc_cp16(&sm.u.in.q[t][p * 8], q + row * q_stride + col, t < n);
    gdc_cp16(&sm.u.in.k[t][p * 8], k + row * k_stride + col, t < n);
  }
  gdc_cp_commit();
  gdc_cp_wait_all();
  __syncthreads();

  // 1 / norms, fp32 from the bf16 rows: warp w takes tokens 16w .. 16w + 15
  for (int i = 0; i < 16; ++i) {
    const int t = warp * 16 + i;
    float qq = 0.0f, kk = 0.0f;
    for (int d = lane; d < DK; d += 32) {
      const float x = to_float(sm.u.in.q[t][d]);
      const float y = to_float(sm.u.in.k[t][d]);
      qq += x * x;
      kk += y * y;
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    if (lane == 0) {
      sm.inv_q[t] = rsqrtf(qq + eps);
      sm.inv_k[t] = rsqrtf(kk + eps);
    }
  }

  // raw k_t.k_s and q_t.k_s: warp w takes rows t in [16w, 16w + 16), all 64 columns s
  float kk_acc[8][4];
  float qk_acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      kk_acc[j][c] = 0.0f;
      qk_acc[j][c] = 0.0f;
    }
  }
#pragma unroll
  for (int ks = 0; ks < DK / 16; ++ks) {
    unsigned ak[4], aq[4];
    gdc_ldsm4(ak, &sm.u.in.k[16 * warp + (lane & 15)][16 * ks + (lane >> 4) * 8]);
    gdc_ldsm4(aq, &sm.u.in.q[16 * warp + (lane & 15)][16 * ks + (lane >> 4) * 8]);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      unsigned bk[4];  // k rows s in [16 np, 16 np + 16) as B (n = s, k = key dim)
      gdc_ldsm4(bk, &sm.u.in.k[16 * np + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
      gdc_mma(kk_acc[2 * np], ak, bk[0], bk[1]);
      gdc_mma(kk_acc[2 * np + 1], ak, bk[2], bk[3]);
      gdc_mma(qk_acc[2 * np], aq, bk[0], bk[1]);
      gdc_mma(qk_acc[2 * np + 1], aq, bk[2], bk[3]);
    }
  }
  __syncthreads();  // q/k rows are dead from here (their space becomes the matrices); norms visible

  // normalise: kk by 1/(n_t n_s), qk by scale/(m_t n_s)
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int t = 16 * warp + gid + (c >> 1) * 8;
      const int s = 8 * j + 2 * tig + (c & 1);
      kk_acc[j][c] *= sm.inv_k[t] * sm.inv_k[s];
      qk_acc[j][c] *= scale * sm.inv_q[t] * sm.inv_k[s];
    }
  }

  const int group = num_v_heads / num_k_heads;
  for (int i = 0; i < group; ++i) {
    const int hv = kh * group + i;
    // gates and their inclusive cumulative sum: warp 0, tokens 2 lane and 2 lane + 1
    if (warp == 0) {
      const float neg_a = -__expf(a_log[hv]);
      const float bias = dt_bias[hv];
      float gl[2], bl[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * lane + e;
        gl[e] = 0.0f;  // padded tokens: no decay, no write
        bl[e] = 0.0f;
        if (t < n) {
          const long long row = c0 + t;
          const float av = to_float(a[row * a_stride + hv]) + bias;
          const float softplus = av > 20.0f ? av : log1pf(__expf(av));
          gl[e] = neg_a * softplus;
          bl[e] = sigmoid(to_float(b_in[row * b_stride + hv]));
        }
      }
      const float pair = gl[0] + gl[1];
      float incl = pair;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, off);
        if (lane >= off) incl += y;
      }
      sm.cum[2 * lane] = incl - pair + gl[0];
      sm.cum[2 * lane + 1] = incl;
      sm.beta[2 * lane] = bl[0];
      sm.beta[2 * lane + 1] = bl[1];
    }
    __syncthreads();

    // A into shared memory (fp32), attn to global (bf16 rows of real tokens)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int t = 16 * warp + gid + h2 * 8;
        const int s = 8 * j + 2 * tig;
        const float ct = sm.cum[t];
        const float d0 = s <= t ? __expf(ct - sm.cum[s]) : 0.0f;
        const float d1 = s + 1 <= t ? __expf(ct - sm.cum[s + 1]) : 0.0f;
        const float bt = sm.beta[t];
        sm.u.mat.a[t][s] = s < t ? bt * d0 * kk_acc[j][2 * h2] : 0.0f;
        sm.u.mat.a[t][s + 1] = s + 1 < t ? bt * d1 * kk_acc[j][2 * h2 + 1] : 0.0f;
        if (t < n) {
          const long long o = ((c0 + t) * num_v_heads + hv) * GDC_CHUNK + s;
          *reinterpret_cast<unsigned*>(attn_out + o) =
              pack_pair<false>(d0 * qk_acc[j][2 * h2], d1 * qk_acc[j][2 * h2 + 1]);
        }
      }
    }
    __syncthreads();

    // (I + A)^{-1}: the four diagonal 16x16 blocks by substitution, one column per thread
    if (tid < 64) {
      const int base = (tid >> 4) * 16;
      const int col = tid & 15;
      float x[16];
#pragma unroll
      for (int r = 0; r < 16; ++r) {
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < r; ++s) sum += sm.u.mat.a[base + r][base + s] * x[s];
        x[r] = r == col ? 1.0f : (r < col ? 0.0f : -sum);
        sm.u.mat.inv[base + r][base + col] = x[r];
      }
    }
    __syncthreads();
    // then block (bi, bj) = -X_ii sum_{m=bj}^{bi-1} A_im X_mj, by distance d = bi - bj
    for (int d = 1; d < 4; ++d) {
      const int blocks = 4 - d;
      for (int idx = tid; idx < blocks * 256; idx += GDC_PREP_THREADS) {
        const int bi = d + (idx >> 8);
        const int bj = bi - d;
        const int r = (idx >> 4) & 15;
        const int c = idx & 15;
        float sum = 0.0f;
        for (int m = bj; m < bi; ++m) {
#pragma unroll
          for (int s = 0; s < 16; ++s) {
            sum += sm.u.mat.a[16 * bi + r][16 * m + s] * sm.u.mat.inv[16 * m + s][16 * bj + c];
          }
        }
        sm.y[idx >> 8][r][c] = sum;
      }
      __syncthreads();
      for (int idx = tid; idx < blocks * 256; idx += GDC_PREP_THREADS) {
        const int bi = d + (idx >> 8);
        const int bj = bi - d;
        const int r = (idx >> 4) & 15;
        const int c = idx & 15;
        float sum = 0.0f;
#pragma unroll
        for (int s = 0; s < 16; ++s) sum += sm.u.mat.inv[16 * bi + r][16 * bi + s] * sm.y[idx >> 8][s][c];
        sm.u.mat.inv[16 * bi + r][16 * bj + c] = -sum;
      }
      __syncthreads();
    }

    // Tb = (I + A)^{-1} diag(beta), bf16 rows of real tokens (zeros above the diagonal)
    for (int idx = tid; idx < GDC_CHUNK * 32; idx += GDC_PREP_THREADS) {
      const int t = idx >> 5;
      const int s = (idx & 31) * 2;
      if (t < n) {
        const float v0 = s <= t ? sm.u.mat.inv[t][s] * sm.beta[s] : 0.0f;
        const float v1 = s + 1 <= t ? sm.u.mat.inv[t][s + 1] * sm.beta[s + 1] : 0.0f;
        const long long o = ((c0 + t) * num_v_heads + hv) * GDC_CHUNK + s;
        *reinterpret_cast<unsigned*>(tb_out + o) = pack_pair<false>(v0, v1);
      }
    }
    // row scales of real tokens
    if (tid < n) {
      const int t = tid;
      const float last = sm.cum[n - 1];
      const float et = __expf(sm.cum[t]);
      float4 sc;
      sc.x = scale * et * sm.inv_q[t];
      sc.y = et * sm.inv_k[t];
      sc.z = __expf(last - sm.cum[t]) * sm.inv_k[t];
      sc.w = t == 0 ? __expf(last) : 0.0f;
      *reinterpret_cast<float4*>(scal_out + ((c0 + t) * num_v_heads + hv) * 4) = sc;
    }
    __syncthreads();  // the next value head rewrites cum, beta and the matrices
  }
}

template <int DK, int WARPS>
struct GdcStage {
  bf16 q[GDC_CHUNK][DK + 8];
  bf16 k[GDC_CHUNK][DK + 8];
  bf16 attn[GDC_CHUNK][GDC_CHUNK + 8];
  bf16 tb[GDC_CHUNK][GDC_CHUNK + 8];
  bf16 v[GDC_CHUNK][16 * WARPS + 8];
  float4 scal[GDC_CHUNK];
};

template <int DK, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) gdc_recur(
    float* __restrict__ out, float* __restrict__ state, const bf16* __restrict__ q,
    long long q_stride, const bf16* __restrict__ k, long long k_stride, const bf16* __restrict__ v,
    long long v_stride, const bf16* __restrict__ attn, const bf16* __restrict__ tb,
    const float* __restrict__ scal, const long long* __restrict__ slots,
    const long long* __restrict__ cu_seqlens, int num_k_heads, int num_v_heads, int dv) {
  pdl_begin();
  static_assert(DK % 16 == 0 && DK >= 16, "key dim must be a multiple of 16");
  constexpr int NV = 16 * WARPS;  // value columns per block
  constexpr int THREADS = 32 * WARPS;
  constexpr int KT = DK / 8;  // n8 tiles of S^T over the key dim
  constexpr int PIECES = DK / 8;
  constexpr int V_PIECES = NV / 8;
  extern __shared__ __align__(16) unsigned char gdc_smem[];
  GdcStage<DK, WARPS>* stages = reinterpret_cast<GdcStage<DK, WARPS>*>(gdc_smem);

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int gid = lane >> 2;
  const int tig = lane & 3;
  const int h = blockIdx.y;
  const int kh = h / (num_v_heads / num_k_heads);
  const int col0 = blockIdx.x * NV;     // the block's first value column
  const int wcol = col0 + 16 * warp;    // the warp's first value column
  const bool active = wcol < dv;        // warp-uniform (dv is a multiple of 16)
  const long long start = cu_seqlens[blockIdx.z];
  const long long end = cu_seqlens[blockIdx.z + 1];
  const long long out_stride = static_cast<long long>(num_v_heads) * dv;
  float* s_ptr = state + (slots[blockIdx.z] * num_v_heads + h) * static_cast<long long>(DK) * dv;

  // S^T [16 value columns x DK] as accumulators: st[j][c] is S[8j + 2tig + (c&1)][wcol + gid + 8(c>>1)]
  float st[KT][4];
#pragma unroll
  for (int j = 0; j < KT; ++j) {
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const long long row = 8 * j + 2 * tig + (c & 1);
      st[j][c] = active ? s_ptr[row * dv + wcol + gid + 8 * (c >> 1)] : 0.0f;
    }
  }

  auto load_chunk = [&](GdcStage<DK, WARPS>& sg, long long c, int m) {
    for (int idx = tid; idx < GDC_CHUNK * PIECES; idx += THREADS) {
      const int t = idx / PIECES;
      const int p = idx % PIECES;
      const long long row = c + (t < m ? t : 0);
      const long long col = static_cast<long long>(kh) * DK + p * 8;
      gdc_cp16(&sg.q[t][p * 8], q + row * q_stride + col, t < m);
      gdc_cp16(&sg.k[t][p * 8], k + row * k_stride + col, t < m);
    }
    for (int idx = tid; idx < GDC_CHUNK * 8; idx += THREADS) {
      const int t = idx >> 3;
      const int p = idx & 7;
      const long long o = ((c + (t < m ? t : 0)) * num_v_heads + h) * GDC_CHUNK + p * 8;
      gdc_cp16(&sg.attn[t][p * 8], attn + o, t < m);
      gdc_cp16(&sg.tb[t][p * 8], tb + o, t < m);
    }
    for (int idx = tid; idx < GDC_CHUNK * V_PIECES; idx += THREADS) {
      const int t = idx / V_PIECES;
      const int p = idx % V_PIECES;
      const bool ok = t < m && col0 + p * 8 < dv;
      const long long o = (c + (t < m ? t : 0)) * v_stride + static_cast<long long>(h) * dv +
                          (ok ? col0 + p * 8 : 0);
      gdc_cp16(&sg.v[t][p * 8], v + o, ok);
    }
    for (int t = tid; t < GDC_CHUNK; t += THREADS) {
      gdc_cp16(&sg.scal[t], scal + ((c + (t < m ? t : 0)) * num_v_heads + h) * 4, t < m);
    }
    gdc_cp_commit();
  };

  if (start < end) load_chunk(stages[0], start, static_cast<int>(min(static_cast<long long>(GDC_CHUNK), end - start)));
  int buf = 0;
  for (long long c = start; c < end; c += GDC_CHUNK, buf ^= 1) {
    const int m = static_cast<int>(min(static_cast<long long>(GDC_CHUNK), end - c));
    gdc_cp_wait_all();
    __syncthreads();  // this chunk is in; every warp is done with the other stage
    if (c + GDC_CHUNK < end) {
      load_chunk(stages[buf ^ 1], c + GDC_CHUNK,
                 static_cast<int>(min(static_cast<long long>(GDC_CHUNK), end - c - GDC_CHUNK)));
    }
    if (!active) continue;
    GdcStage<DK, WARPS>& sg = stages[buf];

    // S0^T as bf16 A operands over the key dim
    unsigned sa[DK / 16][4];
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) gdc_acc_to_a(sa[ks], st[2 * ks], st[2 * ks + 1]);

    // P^T = S0^T K^T: [16 columns x 64 tokens], then R^T = V^T - P^T diag(kr) as bf16 A operands
    const int vloc = 16 * warp + gid;  // the block-local value column of c[0], c[1]
    unsigned ra[4][4];
    {
      float p[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) p[j][e] = 0.0f;
      }
#pragma unroll
      for (int ks = 0; ks < DK / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          unsigned bk[4];
          gdc_ldsm4(bk, &sg.k[16 * np + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
          gdc_mma(p[2 * np], sa[ks], bk[0], bk[1]);
          gdc_mma(p[2 * np + 1], sa[ks], bk[2], bk[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 8 * j + 2 * tig + (e & 1);
          p[j][e] = to_float(sg.v[t][vloc + 8 * (e >> 1)]) - sg.scal[t].y * p[j][e];
        }
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) gdc_acc_to_a(ra[ks], p[2 * ks], p[2 * ks + 1]);
    }

    // O^T = S0^T Q^T diag(qs)
    float o[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    }
#pragma unroll
    for (int ks = 0; ks < DK / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        unsigned bq[4];
        gdc_ldsm4(bq, &sg.q[16 * np + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
        gdc_mma(o[2 * np], sa[ks], bq[0], bq[1]);
        gdc_mma(o[2 * np + 1], sa[ks], bq[2], bq[3]);
      }
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] *= sg.scal[8 * j + 2 * tig + (e & 1)].x;
    }

    // U^T = R^T Tb^T (Tb lower triangular: token blocks s > t skipped)
    float u[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) u[j][e] = 0.0f;
    }
#pragma unroll
    for (int np = 0; np < 4; ++np) {
#pragma unroll
      for (int ks = 0; ks <= np; ++ks) {
        unsigned bt[4];
        gdc_ldsm4(bt, &sg.tb[16 * np + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
        gdc_mma(u[2 * np], ra[ks], bt[0], bt[1]);
        gdc_mma(u[2 * np + 1], ra[ks], bt[2], bt[3]);
      }
    }

    // O^T += U^T attn^T, then store the chunk's real rows
    unsigned ua[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) gdc_acc_to_a(ua[ks], u[2 * ks], u[2 * ks + 1]);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
#pragma unroll
      for (int ks = 0; ks <= np; ++ks) {
        unsigned ba[4];
        gdc_ldsm4(ba, &sg.attn[16 * np + (lane & 7) + (lane >> 4) * 8][16 * ks + ((lane >> 3) & 1) * 8]);
        gdc_mma(o[2 * np], ua[ks], ba[0], ba[1]);
        gdc_mma(o[2 * np + 1], ua[ks], ba[2], ba[3]);
      }
    }
    float* o_ptr = out + c * out_stride + static_cast<long long>(h) * dv + wcol + gid;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * j + 2 * tig + (e & 1);
        if (t < m) o_ptr[t * out_stride + 8 * (e >> 1)] = o[j][e];
      }
    }

    // S^T <- gamma S0^T + (U^T diag(kw)) K
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) u[j][e] *= sg.scal[8 * j + 2 * tig + (e & 1)].z;
    }
    unsigned uw[4][4];
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) gdc_acc_to_a(uw[ks], u[2 * ks], u[2 * ks + 1]);
    const float gamma = sg.scal[0].w;
#pragma unroll
    for (int j = 0; j < KT; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[j][e] *= gamma;
    }
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
#pragma unroll
      for (int np = 0; np < KT / 2; ++np) {
        unsigned bk[4];  // K [token][key dim] as B (k = token, n = key dim): transposed load
        gdc_ldsm4_trans(bk, &sg.k[16 * ks + (lane & 15)][16 * np + (lane >> 4) * 8]);
        gdc_mma(st[2 * np], uw[ks], bk[0], bk[1]);
        gdc_mma(st[2 * np + 1], uw[ks], bk[2], bk[3]);
      }
    }
  }

  if (active) {
#pragma unroll
    for (int j = 0; j < KT; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const long long row = 8 * j + 2 * tig + (c & 1);
        s_ptr[row * dv + wcol + gid + 8 * (c >> 1)] = st[j][c];
      }
    }
  }
}
