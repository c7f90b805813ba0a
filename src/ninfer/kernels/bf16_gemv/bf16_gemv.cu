// bf16_gemv: decode-sized plain bf16 projections with few output rows, y = x @ W^T.
//
// y[m, n] = sum_k x[m, k] * W[n, k] for M = 1..8 rows of x, x: bf16 [M, K] (dense rows, 16-byte
// aligned), W: bf16 [N, K] contiguous, K % 8 == 0; fp32 products and sums, one rounding of each
// output to bf16 (out: [M, N] contiguous). Two more input forms fold the elementwise op before a
// projection into its x loads (one launch and one intermediate fewer per layer):
// - BF16_GEMV_SWIGLU: x's rows are [gate | up] of width 2K and x[m, k] = swiglu(gate, up)
//   (common.cu, rounded as silu_mul writes it): a dense MLP's down projection reads its gate-up
//   output directly, with the very bits of silu_mul then the GEMV.
// - BF16_GEMV_SIGMOID_GATE: x[m, k] = o[m, k] * sigmoid(g[m, h, d]) with k = h * head_dim + d, both
//   rounded to bf16 as torch's `o * torch.sigmoid(g)` rounds (sigmoid to bf16, then the
//   product): the gated attention's output gate before o_proj, g a strided per-head view (rows
//   `gate_stride`, heads `gate_head_stride` elements apart).
// And one output form (SWIGLU_OUT): W is a dense MLP's gate-up [2I, K] (gate rows, then up rows)
// and out[m, j] = swiglu(y[m, j], y[m, I + j]) [M, I], each sum rounded to bf16 first, as silu_mul
// reads the gate-up output: a warp group takes R / 2 gate rows and their R / 2 up rows, so the
// down projection then runs the plain form, not the SwiGLU input form that recomputes the SiLU in
// every block (3.59 against 4.01 TB/s in the H200 batch-1 profile, run S36F). Each sum adds the
// same products in the same order as the plain launch of the same R (the reduce-scatter's tree is
// one butterfly for every entry): the very bits of the plain GEMV, then silu_mul.
//
// Why. At batch 1 the op streams N * K * 2 bytes of weights that no other block reads. cuBLAS
// tiles such a GEMV over the output rows only, so with N = 2048 (the 35B model's out_proj and
// o_proj, K = 4096) it has too few rows to keep enough loads in flight on 132 SMs and reads ~1.3
// TB/s where the device copies at ~4.2. Here K is split across the warps of a block as well.
//
// Layout. A block is 8 warps; `1 << ks_log2` of them (a group) share R output rows and split K
// between them, so a block owns (8 >> ks_log2) * R rows (the launcher picks the split: 8 warps
// per group where K has at least 8 * 32 16-byte chunks, fewer for short rows so no lane idles,
// and R = 4, 2 or 1 so that the grid still has a few blocks per SM when N is small).
// - Lane l of warp s in a group reads chunks c = 32 s + l + 32 * ks * step of each of its R rows:
//   one 16-byte non-allocating load (8 weights; read once, kept out of L1 where x lives) per row
//   and step, U steps' loads (U * R) issued before any is used, so a lane has U * R * 16 bytes in
//   flight and a warp reads R contiguous 512-byte spans per step (coalesced).
// - x goes through the read-only path (__ldg, cached in L1: every block reads the same M * K * 2
//   bytes); bf16 -> fp32 is a shift or a mask, done once per weight and once per x value and
//   step, and each product goes into one of M * R fp32 accumulators held in registers (M and R
//   are template arguments).
// - Reduction: each warp reduce-scatters (common.cu's reduce_scatter) its M * R sums (padded to
//   P, a power of two <= 32)
//   with P - 1 + log2(32 / P) shuffles (not M * R * 5) so that lane l ends with the warp total
//   of sum l / (32 / P); the group's warps meet in shared memory and one thread per (x row,
//   output row) adds the ks partials in warp order (deterministic) and writes the bf16 result.
// Rows past N re-read row N - 1 (computed, never stored); chunks past K are neither read nor
// added. Cost model (estimate, not measured): per weight one conversion op and M FMAs plus the
// x loads (M * 16 bytes from L1 per R * 16 bytes of weights), so M = 1..4 should sit at the
// memory bound; M = 8 needs ~60% of the FP32 issue rate at full bandwidth (a tensor-core variant
// would take it back to the memory bound, as fp8_tc_gemv does for fp8 weights).

constexpr int BF16_GEMV_WARPS = 8;
constexpr int BF16_GEMV_PLAIN = 0;
constexpr int BF16_GEMV_SWIGLU = 1;
constexpr int BF16_GEMV_SIGMOID_GATE = 2;

__device__ __forceinline__ uint4 bf16_gemv_zero16() { return make_uint4(0u, 0u, 0u, 0u); }

__device__ __forceinline__ unsigned int bf16_gemv_word(const uint4& u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

// The smallest power of two >= v (v in 1..32): the reduce-scatter's padded width.
__host__ __device__ constexpr int bf16_gemv_pow2(int v) {
  return v <= 1 ? 1 : v <= 2 ? 2 : v <= 4 ? 4 : v <= 8 ? 8 : v <= 16 ? 16 : 32;
}

// Grid: ceil(N / ((8 >> ks_log2) * R)) blocks of 256 threads. M: rows of x; R: output rows per
// warp group; U: steps of 16-byte loads per lane issued together. The launch bounds set the
// register budget per thread: 64 (4 blocks per SM) for 1-2 rows of x, 80 (3) for 3-4 and 128 (2)
// above, where the M * R accumulators need the room; with the launcher's U (2 up to 4 rows of x,
// else 1) no instance spills (nvcc -Xptxas -v, sm_90). The launcher's opt-in one-row plan
// (`wide_rows`) takes R = 8 with U = 1: 61-64 registers in the three input forms, no spills.
// INPUT: BF16_GEMV_PLAIN, _SWIGLU or _SIGMOID_GATE (gate, gate_stride, gate_head_stride and
// head_dim are read only by the last). options: bit 0 (BF16_GEMV_L2_PREFETCH) hints this lane's
// first weight lines into L2 before pdl_wait; bit 1 (BF16_GEMV_EARLY_LOADS) issues its first U
// steps of weight loads into registers before pdl_wait (the weights do not depend on the
// previous kernel; x is read only after the wait), so they overlap the predecessor's tail. The
// same loads in the same order either way: the results do not change.
constexpr int BF16_GEMV_L2_PREFETCH = 1;
constexpr int BF16_GEMV_EARLY_LOADS = 2;

template <int M, int R, int U, int INPUT = BF16_GEMV_PLAIN, bool SWIGLU_OUT = false>
__global__ void __launch_bounds__(256, M <= 2 ? 4 : M <= 4 ? 3 : 2) bf16_gemv(
    bf16* __restrict__ out, const bf16* __restrict__ x, long long x_stride,
    const bf16* __restrict__ w, int n, int k, int ks_log2, const bf16* __restrict__ gate,
    long long gate_stride, long long gate_head_stride, int head_dim, int options) {
  pdl_trigger();
  constexpr int V = M * R;  // sums per lane, index m * R + r
  constexpr int P = bf16_gemv_pow2(V);
  static_assert(V <= 32, "M * R sums must fit one per lane of a warp");
  static_assert(!SWIGLU_OUT || (R % 2 == 0 && INPUT == BF16_GEMV_PLAIN), "pairs of plain rows");
  constexpr int RO = SWIGLU_OUT ? R / 2 : R;  // outputs per group: rows, or (gate, up) pairs
  __shared__ float part[BF16_GEMV_WARPS][32];

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int ks = 1 << ks_log2;          // warps splitting K in a group
  const int groups = BF16_GEMV_WARPS >> ks_log2;
  const int group = warp >> ks_log2;
  const int slice = warp & (ks - 1);
  const int units = SWIGLU_OUT ? n / 2 : n;  // outputs: rows of W, or gate-up pairs
  const int unit0 = (blockIdx.x * groups + group) * RO;
  const bool active = unit0 < units;
  // W row of the group's sum r; past the end: computed, never stored
  auto weight_row = [&](int r) -> int {
    const int u = unit0 + (r < RO ? r : r - RO);
    const int uc = u < units ? u : units - 1;
    return SWIGLU_OUT && r >= RO ? units + uc : uc;
  };
  const int chunks = k >> 3;            // 16-byte chunks (8 weights) per row
  const int step = 32 * ks;             // chunks a group covers per step

  float acc[P];
#pragma unroll
  for (int i = 0; i < P; ++i) acc[i] = 0.0f;

  // While the previous kernel drains: the lines this lane loads first, into L2.
  if ((options & BF16_GEMV_L2_PREFETCH) && active) {
    const int c = slice * 32 + lane;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = weight_row(r);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int cu = c + u * step;
        if (cu < chunks) prefetch_l2(w + static_cast<long long>(row) * k + 8ll * cu);
      }
    }
  }
  const unsigned char* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int row = weight_row(r);
    wrow[r] = reinterpret_cast<const unsigned char*>(w + static_cast<long long>(row) * k);
  }
  uint4 wv[U][R];
  // U steps of this lane's weight loads from chunk c0 (past K: zeros, never read)
  auto load_steps = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * step;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        wv[u][r] = c < chunks ? ld_weight16(wrow[r] + 16ll * c) : bf16_gemv_zero16();
      }
    }
  };
  const int c_first = slice * 32 + lane;
  const bool early = (options & BF16_GEMV_EARLY_LOADS) != 0 && active;
  if (early) load_steps(c_first);
  pdl_wait();

  if (active) {  // a group past N still takes part in the block's reduction below
    for (int c0 = c_first; c0 < chunks; c0 += U * step) {
      if (!early || c0 != c_first) load_steps(c0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * step;
        uint4 xv[M];
#pragma unroll
        for (int m = 0; m < M; ++m) {
          xv[m] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(x + m * x_stride) + c)
                             : bf16_gemv_zero16();
          if constexpr (INPUT == BF16_GEMV_SWIGLU) {  // xv: the gate; up starts K further on
            const uint4 up = c < chunks
                                 ? __ldg(reinterpret_cast<const uint4*>(x + m * x_stride + k) + c)
                                 : bf16_gemv_zero16();
            xv[m] = make_uint4(swiglu_bf16x2(xv[m].x, up.x), swiglu_bf16x2(xv[m].y, up.y),
                               swiglu_bf16x2(xv[m].z, up.z), swiglu_bf16x2(xv[m].w, up.w));
          } else if constexpr (INPUT == BF16_GEMV_SIGMOID_GATE) {  // a chunk never spans heads
            const int e = 8 * c;
            const int h = e / head_dim;
            const uint4 g = c < chunks ? __ldg(reinterpret_cast<const uint4*>(
                                             gate + m * gate_stride + h * gate_head_stride +
                                             (e - h * head_dim)))
                                       : bf16_gemv_zero16();
            xv[m] = make_uint4(sigmoid_gate_bf16x2(xv[m].x, g.x), sigmoid_gate_bf16x2(xv[m].y, g.y),
                               sigmoid_gate_bf16x2(xv[m].z, g.z), sigmoid_gate_bf16x2(xv[m].w, g.w));
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // word j: weights 8c + 2j (low half) and 8c + 2j + 1
          float xlo[M], xhi[M];
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const unsigned int xw = bf16_gemv_word(xv[m], j);
            xlo[m] = __uint_as_float(xw << 16);
            xhi[m] = __uint_as_float(xw & 0xffff0000u);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const unsigned int ww = bf16_gemv_word(wv[u][r], j);
            const float wlo = __uint_as_float(ww << 16);
            const float whi = __uint_as_float(ww & 0xffff0000u);
#pragma unroll
            for (int m = 0; m < M; ++m) {
              acc[m * R + r] = fmaf(wlo, xlo[m], acc[m * R + r]);
              acc[m * R + r] = fmaf(whi, xhi[m], acc[m * R + r]);
            }
          }
        }
      }
    }
  }

  int base = 0;  // afterwards acc[0] is the warp total of sum `base` = lane / (32 / P)
  bool owner = true;  // on exactly one lane per sum
  reduce_scatter<P, 16, P>(acc, lane, base, owner);
  if (owner) part[warp][base] = acc[0];
  __syncthreads();

  const int t = threadIdx.x;
  if constexpr (SWIGLU_OUT) {  // one thread per (x row, pair): sum i = m * R + r, its up at + RO
    if (t < groups * M * RO) {
      const int g = t / (M * RO);
      const int i = t - g * M * RO;
      const int m = i / RO;
      const int r = i - m * RO;
      const int pair = (blockIdx.x * groups + g) * RO + r;
      if (pair < units) {
        float gate_sum = 0.0f, up_sum = 0.0f;
        for (int s = 0; s < ks; ++s) {
          gate_sum += part[g * ks + s][m * R + r];
          up_sum += part[g * ks + s][m * R + RO + r];
        }
        out[static_cast<long long>(m) * units + pair] =
            swiglu<bf16>(from_float<bf16>(gate_sum), from_float<bf16>(up_sum));
      }
    }
  } else if (t < groups * V) {
    const int g = t / V;
    const int i = t - g * V;
    const int m = i / R;
    const int r = i - m * R;
    const int row = (blockIdx.x * groups + g) * R + r;
    if (row < n) {
      float sum = 0.0f;
      for (int s = 0; s < ks; ++s) sum += part[g * ks + s][i];
      out[static_cast<long long>(m) * n + row] = from_float<bf16>(sum);
    }
  }
}
