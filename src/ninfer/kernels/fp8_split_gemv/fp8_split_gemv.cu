// fp8_split_gemv: the CUDA-core fp8 GEMV laid out like bf16_gemv (bf16_gemv.cu), for one or two
// bf16 x rows, where the tensor-core fp8_tc_gemv (fp8_gemv.cu) streams 3.1-3.5 TB/s and bf16_gemv
// ~3.8-4.0. Compiled after bf16_gemv.cu and fp8_gemv.cu (launch.py's HEADERS): their helpers.
//
// Why a second CUDA-core kernel. At one x row the mma does 1/8 useful work and its 128-row block
// reads 128 bytes of every row per k block; bf16_gemv's warps each read R contiguous 512-byte
// spans per step, split K across the warps of a block, and issue their first loads before the
// dependency wait. Here the same grid, with 16 e4m3 weights per 16-byte load.
// - Decode without conversion instructions: fp8tc::e4m3x2_to_f16x2 (3 integer ops per 2 weights,
//   the e4m3 value times 2^-8 exactly, subnormals included), then each f16 to fp32 (exact; f16
//   subnormals become fp32 normals, so fast-math flushing loses nothing).
// - Lane l of warp s in a group reads chunks c = 32 s + l + 32 ks step of its R rows (chunk c:
//   weights 16c .. 16c + 15, all in k block c / 8); per (x row, weight row) the 16 products are
//   summed in fp32 and added times the block's scale * 2^8 (one more FMA per 16 weights).
// - x is read through the read-only path as in bf16_gemv (bf16 -> fp32 is a shift or a mask),
//   in its three input forms (INPUT: plain, SwiGLU of a gate-up row, the attention's sigmoid
//   output gate), which fold the elementwise op before a projection into the x loads;
//   the scales are weights too: one per step (a group's rows share their 128-row block), loaded
//   with the weights (L1/L2 hits after the first group of a row block).
// - Reduction: bf16_gemv's reduce-scatter and fixed warp order (deterministic).
// Cost model (estimate): per weight 1.5 integer ops + 1 widening + M FMAs, ~3.5 ops per byte at
// M = 1: about half the issue rate at 4 TB/s; M >= 3 would be issue-bound (the mma kernel then).

// An f16x2 word as two fp32 values (exact widening; lo from bits 0-15).
__device__ __forceinline__ void f16x2_to_float2(unsigned int h2, float& lo, float& hi) {
  asm("{ .reg .f16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
      : "=f"(lo), "=f"(hi)
      : "r"(h2));
}

// One 16-byte piece (8 values) of x row m for chunk piece q (16-byte index into the row), in the
// INPUT form of bf16_gemv.cu: plain, SwiGLU of [gate | up] (up K further on), or o * sigmoid(g)
// with g a strided per-head view (a piece never spans heads: head_dim % 8 == 0).
template <int INPUT>
__device__ __forceinline__ uint4 fp8_split_x16(const bf16* x, long long q, int k,
                                               const bf16* gate, long long gate_stride_m,
                                               long long gate_head_stride, int head_dim) {
  uint4 v = __ldg(reinterpret_cast<const uint4*>(x) + q);
  if constexpr (INPUT == BF16_GEMV_SWIGLU) {
    const uint4 up = __ldg(reinterpret_cast<const uint4*>(x + k) + q);
    v = make_uint4(swiglu_bf16x2(v.x, up.x), swiglu_bf16x2(v.y, up.y), swiglu_bf16x2(v.z, up.z),
                   swiglu_bf16x2(v.w, up.w));
  } else if constexpr (INPUT == BF16_GEMV_SIGMOID_GATE) {
    const long long e = 8 * q;
    const long long h = e / head_dim;
    const uint4 g = __ldg(reinterpret_cast<const uint4*>(gate + gate_stride_m +
                                                         h * gate_head_stride + (e - h * head_dim)));
    v = make_uint4(sigmoid_gate_bf16x2(v.x, g.x), sigmoid_gate_bf16x2(v.y, g.y),
                   sigmoid_gate_bf16x2(v.z, g.z), sigmoid_gate_bf16x2(v.w, g.w));
  }
  return v;
}

// Launch bounds: 64 registers (4 blocks an SM) where that holds U = 2 steps of loads without
// spilling (one x row, plain or SwiGLU input), else 80 (3 blocks; nvcc -Xptxas -v, sm_90).
template <int M, int INPUT>
constexpr int fp8_split_blocks_per_sm() {
  return M == 1 && INPUT != BF16_GEMV_SIGMOID_GATE ? 4 : 3;
}

template <int M, int R, int U, int INPUT = BF16_GEMV_PLAIN>
__global__ void __launch_bounds__(256, fp8_split_blocks_per_sm<M, INPUT>()) fp8_split_gemv(
    bf16* __restrict__ out, const bf16* __restrict__ x, long long x_stride,
    const unsigned char* __restrict__ w, const float* __restrict__ scale, int n, int k,
    int k_blocks, int ks_log2, const bf16* __restrict__ gate, long long gate_stride,
    long long gate_head_stride, int head_dim, int options) {
  pdl_trigger();
  constexpr int V = M * R;  // sums per lane, index m * R + r
  constexpr int P = bf16_gemv_pow2(V);
  static_assert(V <= 32, "M * R sums must fit one per lane of a warp");
  __shared__ float part[BF16_GEMV_WARPS][32];

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int ks = 1 << ks_log2;  // warps splitting K in a group
  const int groups = BF16_GEMV_WARPS >> ks_log2;
  const int group = warp >> ks_log2;
  const int slice = warp & (ks - 1);
  const int row0 = (blockIdx.x * groups + group) * R;
  const int chunks = k >> 4;  // 16-byte chunks (16 weights) per row
  const int step = 32 * ks;   // chunks a group covers per step

  float acc[P];
#pragma unroll
  for (int i = 0; i < P; ++i) acc[i] = 0.0f;

  // A group's R rows are consecutive and R divides 128, so they share one row of block scales
  // (a row past N re-reads row N - 1: computed, never stored).
  const float* srow = scale + static_cast<long long>(min(row0, n - 1) >> 7) * k_blocks;
  uint4 wv[U][R];
  float wscale[U];
  // U steps of this lane's weight and scale loads from chunk c0 (past K: zeros, never read)
  auto load_steps = [&](int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + u * step;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const long long row = min(row0 + r, n - 1);
        wv[u][r] = c < chunks ? ld_weight16(w + row * k + 16ll * c) : bf16_gemv_zero16();
      }
      wscale[u] = c < chunks ? ld_weight_scale(srow + (c >> 3)) : 0.0f;
    }
  };
  const int c_first = slice * 32 + lane;
  const bool early = (options & BF16_GEMV_EARLY_LOADS) != 0 && row0 < n;
  if (early) load_steps(c_first);
  pdl_wait();

  if (row0 < n) {  // a group past N still takes part in the block's reduction below
    for (int c0 = c_first; c0 < chunks; c0 += U * step) {
      if (!early || c0 != c_first) load_steps(c0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + u * step;
        uint4 xq[M][2];  // the chunk's 16 x values of each row, bf16
#pragma unroll
        for (int m = 0; m < M; ++m) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            xq[m][h] = c < chunks ? fp8_split_x16<INPUT>(x + m * x_stride, 2ll * c + h, k, gate,
                                                         m * gate_stride, gate_head_stride,
                                                         head_dim)
                                  : bf16_gemv_zero16();
          }
        }
        float sum[M * R];  // this chunk's 16-term sums, index m * R + r
#pragma unroll
        for (int i = 0; i < M * R; ++i) sum[i] = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // weight word j: k = 16c + 4j .. 16c + 4j + 3
          float xf[M][4];
#pragma unroll
          for (int m = 0; m < M; ++m) {
            const unsigned int lo = bf16_gemv_word(xq[m][j >> 1], 2 * (j & 1));
            const unsigned int hi = bf16_gemv_word(xq[m][j >> 1], 2 * (j & 1) + 1);
            xf[m][0] = __uint_as_float(lo << 16);
            xf[m][1] = __uint_as_float(lo & 0xffff0000u);
            xf[m][2] = __uint_as_float(hi << 16);
            xf[m][3] = __uint_as_float(hi & 0xffff0000u);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const unsigned int ww = bf16_gemv_word(wv[u][r], j);
            float wf[4];
            f16x2_to_float2(fp8tc::e4m3x2_to_f16x2<0xA280u>(ww), wf[0], wf[2]);  // bytes 0, 2
            f16x2_to_float2(fp8tc::e4m3x2_to_f16x2<0xB391u>(ww), wf[1], wf[3]);  // bytes 1, 3
#pragma unroll
            for (int m = 0; m < M; ++m) {
#pragma unroll
              for (int i = 0; i < 4; ++i) sum[m * R + r] = fmaf(wf[i], xf[m][i], sum[m * R + r]);
            }
          }
        }
        const float s = wscale[u] * 256.0f;  // the decode's 2^-8 back
#pragma unroll
        for (int i = 0; i < M * R; ++i) acc[i] = fmaf(sum[i], s, acc[i]);
      }
    }
  }

  int base = 0;  // afterwards acc[0] is the warp total of sum `base` = lane / (32 / P)
  bool owner = true;  // on exactly one lane per sum
  reduce_scatter<P, 16, P>(acc, lane, base, owner);
  if (owner) part[warp][base] = acc[0];
  __syncthreads();

  const int t = threadIdx.x;
  if (t < groups * V) {
    const int g = t / V;
    const int i = t - g * V;
    const int m = i / R;
    const int r = i - m * R;
    const int row = (blockIdx.x * groups + g) * R + r;
    if (row < n) {
      float total = 0.0f;
      for (int s = 0; s < ks; ++s) total += part[g * ks + s][i];
      out[static_cast<long long>(m) * n + row] = from_float<bf16>(total);
    }
  }
}
