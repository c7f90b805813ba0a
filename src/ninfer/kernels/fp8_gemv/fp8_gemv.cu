// Two weight-only fp8 GEMVs for decode: `fp8_gemv` (CUDA cores, sm_89+, the fallback) and, below,
// `fp8_tc_gemv` (tensor cores, sm_90, what dispatch runs first; see its own header).
//
// fp8_gemv: out[m, :] = (W * scale) @ x[m] for M <= 8 rows of x, W: [N, K]
// e4m3 with one f32 scale per 128x128 block. Each warp owns ROWS output rows and reads each of
// them 16 bytes (16 weights, one block column) per lane per step, ROWS loads in flight; the
// weights are dequantized in registers (PTX cvt e4m3x2 -> f16x2, sm_89+), multiplied by the x
// values (read through the read-only cache: x is a few KiB and every warp shares it), the 16-term
// partial sum is scaled by its block's scale, and the warp reduces each row at the end. fp32
// accumulation, one rounding to T.

// 16 consecutive x values of one row as fp32 (the row is 16-byte aligned, k0 a multiple of 16).
__device__ __forceinline__ void load_x16(const float* p, float* xv) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
    xv[4 * i] = f.x;
    xv[4 * i + 1] = f.y;
    xv[4 * i + 2] = f.z;
    xv[4 * i + 3] = f.w;
  }
}

__device__ __forceinline__ void load_x16(const bf16* p, float* xv) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      xv[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
      xv[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
}

template <typename T, int M, int ROWS>
__global__ void __launch_bounds__(128) fp8_gemv(
    T* __restrict__ out, const T* __restrict__ x, long long x_stride,
    const unsigned char* __restrict__ w, const float* __restrict__ scale, int n, int k,
    int k_blocks) {
  pdl_begin();
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  if (row0 >= n) return;
  float acc[M][ROWS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;
  const int chunks = k >> 4;  // 16 weights per 16-byte load
  for (int c = lane; c < chunks; c += 32) {
    const int k0 = c << 4;
    uint4 u[ROWS];
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = row0 + r < n ? row0 + r : n - 1;  // past n: computed, never stored
      u[r] = __ldg(reinterpret_cast<const uint4*>(w + static_cast<long long>(row) * k + k0));
      s[r] = __ldg(scale + (row >> 7) * k_blocks + (k0 >> 7));
    }
    float wf[ROWS][16];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const unsigned int words[4] = {u[r].x, u[r].y, u[r].z, u[r].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        fp8x2_to_float2(static_cast<unsigned short>(words[j] & 0xffffu), wf[r][4 * j],
                        wf[r][4 * j + 1]);
        fp8x2_to_float2(static_cast<unsigned short>(words[j] >> 16), wf[r][4 * j + 2],
                        wf[r][4 * j + 3]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xv[16];
      load_x16(x + m * x_stride + k0, xv);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) part += wf[r][j] * xv[j];
        acc[m][r] += part * s[r];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float total = warp_sum(acc[m][r]);
      if (lane == 0 && row0 + r < n)
        out[static_cast<long long>(m) * n + row0 + r] = from_float<T>(total);
    }
}

// ================================================================================================
// fp8_tc_gemv: the same product on tensor cores (sm_90), what dispatch runs for decode.
//
// Grid: one block of 8 warps per (128-row block, k split); the S splits of a row block form one
// thread-block cluster and add their partial sums through distributed shared memory (no global
// workspace, no counters, deterministic order). Warp w owns rows [16w, 16w + 16) of the row block
// and runs mma.m16n8k16 (f16 in, f32 accumulate) with the weight rows as A (M = 16) and the <= 8
// x rows as B (n = 8). Inside one mma the k order is free as long as A and B agree, so each lane
// streams 16 contiguous bytes of its two rows (g, g + 8) per 16-byte load and x is staged in the
// matching order: lane (g, t) holds bytes [4i, 4i + 4) of its chunk as (b0, b2) in the "k = 2t,
// 2t + 1" register and (b1, b3) in the "k = 2t + 8, 2t + 9" register.
//
// e4m3 -> f16 without conversion instructions: f16 bits ((b & 0x7f) << 7) | ((b & 0x80) << 8)
// are the e4m3 value times 2^-8, exactly, subnormals included (both formats put the subnormal
// boundary at exponent field 0 and the bias differs by 8). Per 32-bit word: a prmt that
// sign-extends bytes (b0, b2) [or (b1, b3)] into the two 16-bit lanes, a shift by 7 and a mask
// (3 integer ops per 2 weights). The 2^8 is folded into the fp32 block scale.
//
// x as f16: bf16 reaches 3e38, f16 only 65,504. When a block stages x into shared memory, each
// (x row, 128-wide k block) gets a power-of-two factor 2^s that puts its largest |x| in
// [2^14, 2^15): bf16 values then convert exactly (down to 2^-28 of the block's maximum, below
// which f16 subnormals round), fp32 x rounds to f16's 11 bits. 2^-s joins the weight's block
// scale in the per-k-block fp32 fixup: acc += mma_result * scale * 2^8 * 2^-s.
//
// Cost model (estimate, not measured): 1 B of weight per weight, read once with 16-byte
// ld.global.nc (the next k block in flight per lane, 64 B, plus the L2::256B prefetch hint; <= 80
// registers, so 3 blocks = 48 KiB of loads in flight per SM); ~1.5 integer ops per weight, 8 mma
// and 4 FMA per 128 x 16 weight tile; x staging costs ~7 ops per x value per 128 rows (~+25%
// issue at M=8, ~3% at M=1), hidden behind memory. Target at >= 3.5 TB/s of weight bytes, M = 1:
// 27B gate-up 34816 x 5120 (178 MB) ~51 us, down 5120 x 17408 (89 MB) ~25 us, DeltaNet in_proj
// 16480 x 5120 (84 MB) ~24 us, qkv 14336 x 5120 (73 MB) ~21 us, out_proj 5120 x 6144 (31 MB)
// ~9 us: 24.3 GB per decode step in ~7 ms (9.5 ms today); M = 8 within ~10% of M = 1.
// The fragment and byte-order claims are emulated on the CPU in tests/unit/kernels/test_fp8_tc*.
// ================================================================================================

namespace fp8tc {
using namespace tcg;  // kThreads: 8 warps x 16 rows = one 128-row scale block
constexpr int kChunk = 16;                      // k blocks of x staged in shared memory at a time
constexpr int kRowHalves = kChunk * 128 + 8;    // f16 per staged x row; +16 B: no bank conflicts
constexpr int kDepth = 1;                       // k blocks loaded ahead of the one computed
constexpr int kRingChunkMax = 40;  // the ring form's largest staged chunk (launch_tc.FIT_CHUNK_MAX)

// Two e4m3 bytes of w (bytes 0 and 2 for SEL 0xA280, 1 and 3 for 0xB391) as f16x2 times 2^-8.
template <unsigned int SEL>
__device__ __forceinline__ unsigned int e4m3x2_to_f16x2(unsigned int w) {
  unsigned int e;  // each byte sign-extended into its 16-bit lane
  asm("prmt.b32 %0, %1, %1, %2;" : "=r"(e) : "r"(w), "n"(SEL));
  return (e << 7) & 0xbf80bf80u;  // sign at bit 15, exponent/mantissa at bits 13..7
}

__device__ __forceinline__ unsigned int f16_bits(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}

// 4 consecutive x values (16-byte aligned rows, k0 a multiple of 4); zeros past the row's end.
__device__ __forceinline__ void load_x4(const float* p, bool in_range, float (&v)[4]) {
  const float4 f = in_range ? __ldg(reinterpret_cast<const float4*>(p)) : make_float4(0, 0, 0, 0);
  v[0] = f.x;
  v[1] = f.y;
  v[2] = f.z;
  v[3] = f.w;
}

__device__ __forceinline__ void load_x4(const bf16* p, bool in_range, float (&v)[4]) {
  const uint2 u = in_range ? __ldg(reinterpret_cast<const uint2*>(p)) : make_uint2(0, 0);
  v[0] = __uint_as_float(u.x << 16);
  v[1] = __uint_as_float(u.x & 0xffff0000u);
  v[2] = __uint_as_float(u.y << 16);
  v[3] = __uint_as_float(u.y & 0xffff0000u);
}

// x's input forms: the plain rows, or (bf16 only) a dense MLP's [gate | up] rows of width 2K with
// x = swiglu(gate, up) rounded to bf16 as silu_mul writes it (common.cu's swiglu_bf16x2), so the
// down projection reads its gate-up output with silu_mul's very bits and one launch fewer.
constexpr int kInputPlain = 0;
constexpr int kInputSwiglu = 1;

__device__ __forceinline__ void load_x4_swiglu(const bf16* p, int k, bool in_range,
                                               float (&v)[4]) {
  const uint2 g = in_range ? __ldg(reinterpret_cast<const uint2*>(p)) : make_uint2(0, 0);
  const uint2 u = in_range ? __ldg(reinterpret_cast<const uint2*>(p + k)) : make_uint2(0, 0);
  const unsigned int a = swiglu_bf16x2(g.x, u.x);
  const unsigned int b = swiglu_bf16x2(g.y, u.y);
  v[0] = __uint_as_float(a << 16);
  v[1] = __uint_as_float(a & 0xffff0000u);
  v[2] = __uint_as_float(b << 16);
  v[3] = __uint_as_float(b & 0xffff0000u);
}

// Stage x[:, k blocks kb0 .. kb0 + num_kb) as f16 (per-(row, k block) power-of-two scaled, each
// group of 4 stored as x0 x2 x1 x3) and comb[j][m] = weight scale * 2^8 * 2^-s. One warp per
// (row, k block): lane holds 4 values, the warp reduces their largest magnitude. A warp issues
// the loads of kStagePairs pairs before reducing any (one L2 round trip per batch, not per pair;
// 2 for fp32 x, whose values take twice the registers, to stay within 80 without spills).
template <typename T, int M, int INPUT = kInputPlain, int ROW = kRowHalves>
__device__ __forceinline__ void stage_x(unsigned short* xs, float* comb, const T* x,
                                        long long x_stride, int k, int kb0, int num_kb,
                                        const float* row_scales, int warp, int lane) {
  constexpr int kWarps = kThreads / 32;
  constexpr int kStagePairs = sizeof(T) == 2 ? 4 : 2;
  const int num_pairs = M * num_kb;
  for (int p0 = warp; p0 < num_pairs; p0 += kWarps * kStagePairs) {
    float v[kStagePairs][4];
    float wscale[kStagePairs];
#pragma unroll
    for (int u = 0; u < kStagePairs; ++u) {
      const int p = p0 + u * kWarps;
      const int j = p / M;
      const int m = p - j * M;
      const int k0 = (kb0 + j) * 128 + 4 * lane;
      // K % 16 == 0: a lane's 4 values are all in or all out
      if constexpr (INPUT == kInputSwiglu) {
        load_x4_swiglu(x + m * x_stride + k0, k, p < num_pairs && k0 < k, v[u]);
      } else {
        load_x4(x + m * x_stride + k0, p < num_pairs && k0 < k, v[u]);
      }
      wscale[u] = p < num_pairs ? __ldg(row_scales + kb0 + j) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kStagePairs; ++u) {
      const int p = p0 + u * kWarps;
      if (p >= num_pairs) break;  // warp-uniform
      const int j = p / M;
      const int m = p - j * M;
      unsigned int amax = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) amax = max(amax, __float_as_uint(v[u][i]) & 0x7fffffffu);
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
      // amax < 2^(e - 126), so amax * 2^(141 - e) < 2^15. Clamped for zero and tiny blocks
      // (max |x| < 2^-86 keeps f16 subnormals there) so that 2^-s times the weight scale stays
      // a normal fp32 under --use_fast_math's flush to zero.
      const int s = min(141 - static_cast<int>(amax >> 23), 100);  // in [-114, 100]
      const float up = __uint_as_float(static_cast<unsigned int>(127 + s) << 23);
      uint2 packed;
      packed.x = f16_bits(v[u][0] * up) | (f16_bits(v[u][2] * up) << 16);
      packed.y = f16_bits(v[u][1] * up) | (f16_bits(v[u][3] * up) << 16);
      *reinterpret_cast<uint2*>(xs + m * ROW + j * 128 + 4 * lane) = packed;
      if (lane == 0) {
        const float down = __uint_as_float(static_cast<unsigned int>(127 - s) << 23);
        comb[j * 8 + m] = wscale[u] * 256.0f * down;
      }
    }
  }
}

// The 64 bytes lane (g, t) reads of k block kb: rows g and g + 8, 16 bytes at 16t and 64 + 16t.
__device__ __forceinline__ void load_tile(uint4 (&b)[4], const unsigned char* w_g,
                                          const unsigned char* w_g8, bool ok_g, bool ok_g8,
                                          int kb, int t, int k) {
  const int off0 = kb * 128 + 16 * t;
  const int off1 = off0 + 64;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  b[0] = ok_g && off0 < k ? ld_stream16(w_g + off0) : zero;
  b[1] = ok_g && off1 < k ? ld_stream16(w_g + off1) : zero;
  b[2] = ok_g8 && off0 < k ? ld_stream16(w_g8 + off0) : zero;
  b[3] = ok_g8 && off1 < k ? ld_stream16(w_g8 + off1) : zero;
}

// One 128-wide k block of the warp's 16 rows: 8 mma into a zeroed fragment, then the fixup.
__device__ __forceinline__ void compute_tile(float (&acc)[4], const uint4 (&b)[4],
                                             const unsigned short* x_row, const float* comb_kb,
                                             int t) {
  float frag[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint4 xa = *reinterpret_cast<const uint4*>(x_row + 64 * h);      // words i = 0, 1
    const uint4 xb = *reinterpret_cast<const uint4*>(x_row + 64 * h + 8);  // words i = 2, 3
    const unsigned int xw[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
    const unsigned int wg[4] = {b[h].x, b[h].y, b[h].z, b[h].w};
    const unsigned int wg8[4] = {b[2 + h].x, b[2 + h].y, b[2 + h].z, b[2 + h].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      mma_16816<true>(frag, e4m3x2_to_f16x2<0xA280u>(wg[i]), e4m3x2_to_f16x2<0xA280u>(wg8[i]),
              e4m3x2_to_f16x2<0xB391u>(wg[i]), e4m3x2_to_f16x2<0xB391u>(wg8[i]), xw[2 * i],
              xw[2 * i + 1]);
    }
  }
  const float2 c = *reinterpret_cast<const float2*>(comb_kb + 2 * t);  // x rows 2t, 2t + 1
  acc[0] += frag[0] * c.x;
  acc[1] += frag[1] * c.y;
  acc[2] += frag[2] * c.x;
  acc[3] += frag[3] * c.y;
}

}  // namespace fp8tc

// out[m, n] = sum_k x[m, k] * W[n, k] * scale[n / 128, k / 128] for m < M (1..8); S = k splits
// per row block = cluster size (1, 2, 4 or 8). Grid: ceil(N / 128) * S blocks of 256 threads.
template <typename T, int M, int S>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(fp8tc::kThreads, 3)
    fp8_tc_gemv(T* __restrict__ out, const T* __restrict__ x, long long x_stride,
                const unsigned char* __restrict__ w, const float* __restrict__ scale, int n,
                int k, int k_blocks) {
  pdl_begin();
  using namespace fp8tc;
  constexpr int D = kDepth;
  __shared__ __align__(16) unsigned short xs[M * kRowHalves];
  __shared__ __align__(16) float comb[kChunk * 8];
  __shared__ __align__(16) float red[8 * tcg::kRedStride];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int rb = blockIdx.x / S;
  const int split = S == 1 ? 0 : static_cast<int>(cluster_rank());
  const int kb_begin = static_cast<int>(static_cast<long long>(split) * k_blocks / S);
  const int kb_end = static_cast<int>(static_cast<long long>(split + 1) * k_blocks / S);
  const int row_g = rb * 128 + warp * 16 + g;
  const bool ok_g = row_g < n;
  const bool ok_g8 = row_g + 8 < n;
  const unsigned char* w_g = w + static_cast<long long>(ok_g ? row_g : 0) * k;
  const unsigned char* w_g8 = w + static_cast<long long>(ok_g8 ? row_g + 8 : 0) * k;
  const float* row_scales = scale + static_cast<long long>(rb) * k_blocks;
  // B column g is x row g; columns >= M compute from a duplicate row and are never stored
  const unsigned short* x_lane = xs + (g < M ? g : M - 1) * kRowHalves + 16 * t;

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  uint4 buf[D + 1][4];
#pragma unroll
  for (int p = 0; p < D; ++p)
    if (kb_begin + p < kb_end) load_tile(buf[p], w_g, w_g8, ok_g, ok_g8, kb_begin + p, t, k);
  for (int kb = kb_begin; kb < kb_end; kb += D + 1) {
#pragma unroll
    for (int u = 0; u <= D; ++u) {
      const int kc = kb + u;
      if (kc >= kb_end) break;
      if (kc + D < kb_end) load_tile(buf[(u + D) % (D + 1)], w_g, w_g8, ok_g, ok_g8, kc + D, t, k);
      const int kbl = (kc - kb_begin) % kChunk;
      if (kbl == 0) {  // block-uniform: a new chunk of x
        __syncthreads();  // every warp is done with the previous chunk
        stage_x<T, M>(xs, comb, x, x_stride, k, kc, min(kChunk, kb_end - kc), row_scales, warp,
                      lane);
        __syncthreads();
      }
      compute_tile(acc, buf[u], x_lane + kbl * 128, comb + kbl * 8, t);
    }
  }

  tcg::reduce_store<T, M, S>(out, red, acc, rb, split, n, warp, g, t);
}

// fp8_tc_gemv_ring: fp8_tc_gemv with the weight loads in a shared-memory ring of STAGES k blocks
// (cp.async, STAGES - 1 in flight per thread) instead of one k block ahead in registers: each
// thread reads back only the bytes it copied itself, so a stage needs cp.async.wait_group and no
// barrier. The weights do not depend on the previous kernel, so the first STAGES - 1 copies are
// issued before pdl_wait(): they overlap the predecessor's tail. Same grid, partial sums, cluster
// reduction and bits as fp8_tc_gemv (the same mma in the same order). Dynamic shared memory:
// STAGES * 16 KiB of ring (the reduction tile reuses it), M staged x rows, the chunk's scales.
// INPUT: kInputPlain, or kInputSwiglu (bf16 [gate | up] rows of width 2K, x_stride apart).
// PACKED: w is the row-major [N, K] e4m3 weight (false) or its tiles (true; fp8_gemv/tiles.py:
// [row block][k block] contiguous 16 KiB tiles in the ring's own order, zero-padded), the same
// bytes in the same ring slots: the same bits.
// CHUNK: k blocks of x staged at a time (kChunk, or 8: half the staged rows, which leaves room
// for a deeper ring at three blocks an SM from 3 x rows; or, from launch_tc.fit_chunk, as many
// as the split holds where they fit: one staging; the same values staged, the same bits).
template <typename T, int M, int S, int STAGES, int INPUT, int CHUNK, bool PACKED>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(fp8tc::kThreads, 3)
    fp8_tc_gemv_ring(T* __restrict__ out, const T* __restrict__ x, long long x_stride,
                     const unsigned char* __restrict__ w, const float* __restrict__ scale, int n,
                     int k, int k_blocks) {
  pdl_trigger();
  using namespace fp8tc;
  constexpr int ROW = CHUNK * 128 + 8;  // f16 per staged x row (kRowHalves at CHUNK = kChunk)
  static_assert(CHUNK >= 1 && CHUNK <= kRingChunkMax, "staged chunk");
  static_assert(STAGES >= 2 && STAGES * 4 * kThreads * 16 >= 8 * kRedStride * 4, "ring size");
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
  unsigned short* xs = reinterpret_cast<unsigned short*>(ring + STAGES * 4 * kThreads);
  float* comb = reinterpret_cast<float*>(xs + M * ROW);
  float* red = reinterpret_cast<float*>(smem);  // after the main loop only
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int rb = blockIdx.x / S;
  const int split = S == 1 ? 0 : static_cast<int>(cluster_rank());
  const int kb_begin = static_cast<int>(static_cast<long long>(split) * k_blocks / S);
  const int kb_end = static_cast<int>(static_cast<long long>(split + 1) * k_blocks / S);
  const int num_kb = kb_end - kb_begin;
  const int row_g = rb * 128 + warp * 16 + g;
  const bool ok_g = row_g < n;
  const bool ok_g8 = row_g + 8 < n;
  const unsigned char* w_g = w + static_cast<long long>(ok_g ? row_g : 0) * k;
  const unsigned char* w_g8 = w + static_cast<long long>(ok_g8 ? row_g + 8 : 0) * k;
  const float* row_scales = scale + static_cast<long long>(rb) * k_blocks;
  const unsigned short* x_lane = xs + (g < M ? g : M - 1) * ROW + 16 * t;
  const unsigned char* tiles = w + static_cast<long long>(rb) * k_blocks * 16384;  // PACKED
  auto issue = [&](int slot, int kb) {
    if constexpr (PACKED) {
      issue_packed(ring + slot * 4 * kThreads, tid, tiles, kb);
    } else {
      issue_tile(ring + slot * 4 * kThreads, tid, w_g, w_g8, ok_g, ok_g8, kb, t, k);
    }
  };

#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < num_kb) issue(p, kb_begin + p);
    cp_commit();  // empty groups keep the wait count uniform
  }
  pdl_wait();

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < num_kb; ++i) {
    const int ahead = i + STAGES - 1;  // into the slot read at i - 1 (by this thread, done)
    if (ahead < num_kb) issue(ahead % STAGES, kb_begin + ahead);
    cp_commit();
    const int kbl = i % CHUNK;
    if (kbl == 0) {  // block-uniform: a new chunk of x
      __syncthreads();  // every warp is done with the previous chunk
      stage_x<T, M, INPUT, ROW>(xs, comb, x, x_stride, k, kb_begin + i, min(CHUNK, num_kb - i),
                           row_scales, warp, lane);
      __syncthreads();
    }
    cp_wait<STAGES - 1>();  // this thread's copies of k block i have landed
    const uint4* slot = ring + (i % STAGES) * 4 * kThreads + tid;
    const uint4 b[4] = {slot[0], slot[kThreads], slot[2 * kThreads], slot[3 * kThreads]};
    compute_tile(acc, b, x_lane + kbl * 128, comb + kbl * 8, t);
  }
  cp_wait<0>();
  __syncthreads();  // the ring is free: the reduction tile may overwrite it
  reduce_store<T, M, S>(out, red, acc, rb, split, n, warp, g, t);
}
