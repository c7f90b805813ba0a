// Decode attention over a paged KV cache: one query token per sequence, G = Hq / Hk query heads per
// KV head, head dim D. Two launches (split-KV, as flash-decoding):
//
//   partial: grid (num_splits, Hk, B), block 4 warps, dynamic shared memory
//     max(G * S, 4 * G * D) floats. A block owns S = tokens_per_split consecutive KV positions of
//     one (sequence, KV head) and all G query heads that share it, so every K and V row is read
//     from its page once. Three phases, each warp taking chunks of CHUNK tokens in turn:
//       1. scores: a chunk's K rows are loaded together (lane l holds dims l*E .. l*E+E-1,
//          E = D / 32) and its V rows prefetched into L2; the SUB * G partial dot products of SUB
//          tokens are summed over the warp by a reduce-scatter (about one shuffle per score
//          instead of five) and stored to shared memory as scores[g][t].
//       2. softmax: one warp per head takes the max m and p = exp(s - m), l = sum p, over the
//          block's tokens (no running rescale: all scores are known before any V is read).
//       3. values: acc[g] += p[g][t] * V[t] per warp, then the 4 warps' accumulators are summed
//          in shared memory and written as the split's partial, with m and l.
//   combine: grid (Hq, B, D / 32), 256 threads: 32 groups of 8 threads walk the live splits, each
//     thread 4 dims (float4), weighting split s by exp(m_s - max m); the groups are summed in
//     shared memory and divided by sum_s exp(m_s - max m) * l_s.
//
// Quantized KV (template KF / VF, the codes of kv_quant/kv_codec.cu, which is compiled ahead of
// this file): each lane dequantizes its E dims of a row in registers as it loads them (int8 / fp8:
// code * row scale; nvfp4: e2m1 code * e4m3 block scale * row scale, in software: Hopper has no
// fp4 instructions), so a row is read from its page once, in its stored width.
//
// Positions past a sequence's length are never read: a split starting past it exits, and the last
// chunk's surplus tokens re-read the last live row with a score of -inf (p = 0). Lengths are
// clamped to the table's capacity; the combine derives the live splits from kv_lens itself.

constexpr int PDA_WARPS = 4;
constexpr int PDA_SUB = 4;  // tokens per score reduction

__device__ __forceinline__ float pda_warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Max over the whole block (blockDim.x a multiple of 32); every thread gets it.
__device__ __forceinline__ float pda_block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = pda_warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  return pda_warp_max(lane < num_warps ? partial[lane] : __int_as_float(0xff800000));
}

// Phase 2 of both partial kernels: softmax over a block's scores [G][S] (shared memory), one warp
// per head, no running rescale (every score is known before any V is read). p = exp(s - m) for
// t < n_valid and 0 from there up to n_end (what phase 3 reads); (m, l) of head g goes to
// ml[g * ml_stride], ml[g * ml_stride + 1].
template <int G>
__device__ __forceinline__ void pda_softmax(float* sc, int S, int n_valid, int n_end,
                                            float* __restrict__ ml, long long ml_stride, int warp,
                                            int lane) {
  for (int g = warp; g < G; g += PDA_WARPS) {
    float* sg = sc + g * S;
    float m = __int_as_float(0xff800000);
    for (int t = lane; t < n_valid; t += 32) m = fmaxf(m, sg[t]);
    m = pda_warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < n_end; t += 32) {
      const float p = t < n_valid ? __expf(sg[t] - m) : 0.0f;
      sg[t] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ml[g * ml_stride] = m;
      ml[g * ml_stride + 1] = l;
    }
  }
}

// The row index (page slot * Hk + head, see kv_codec.cu) of KV head kh of token t of a sequence
// whose page table row is `pages`.
__device__ __forceinline__ long long kv_row(const long long* __restrict__ pages, int t,
                                            int page_size, int num_kv_heads, int kh) {
  const long long page = pages[t / page_size];
  return (page * page_size + t % page_size) * num_kv_heads + kh;
}

// Row indices of KV head kh of tokens first .. first + C - 1, each clamped to last (a live
// position) so that surplus tokens of a chunk read valid memory.
template <int C>
__device__ __forceinline__ void token_rows(long long (&rows)[C], const long long* __restrict__ pages,
                                           int first, int last, int page_size, int num_kv_heads,
                                           int kh) {
#pragma unroll
  for (int u = 0; u < C; ++u) {
    rows[u] = kv_row(pages, min(first + u, last), page_size, num_kv_heads, kh);
  }
}

template <typename T, int D, int G, int KF, int VF>
__global__ void __launch_bounds__(PDA_WARPS * 32, G * D <= 48 * 32 ? 4 : 3) paged_decode_partial(
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const T* __restrict__ q,
    const void* __restrict__ k_values, const float* __restrict__ k_scale,
    const unsigned char* __restrict__ k_blocks, const void* __restrict__ v_values,
    const float* __restrict__ v_scale, const unsigned char* __restrict__ v_blocks,
    const long long* __restrict__ page_table, long long table_stride,
    const long long* __restrict__ kv_lens, int num_kv_heads, int page_size, int table_width,
    int num_splits, int tokens_per_split, float scale) {
  pdl_begin();
  constexpr int E = D / 32;
  // tokens whose rows a warp loads together: 8, or 4 where a lane's part of a plain row is > 16
  // bytes or holds more than 8 quantized values (quantized rows wait in flight as raw bytes,
  // KvRowBuf, and are decoded 4 at a time)
  constexpr int CHUNK = (KF == KV_PLAIN && VF == KV_PLAIN)
                            ? (sizeof(T) * E > 16 ? PDA_SUB : 2 * PDA_SUB)
                            : (E > 8 ? PDA_SUB : 2 * PDA_SUB);
  const KvSrc ksrc{k_values, k_scale, k_blocks};
  const KvSrc vsrc{v_values, v_scale, v_blocks};
  constexpr int NR = PDA_SUB * G;                // scores per reduction
  constexpr int NF = ScatterCount<NR, 16>::value;
  extern __shared__ float4 pda_smem4[];
  float* smem = reinterpret_cast<float*>(pda_smem4);  // scores [G][S], then partials [W][G][D]

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int split = blockIdx.x;
  const int kh = blockIdx.y;
  const long long b = blockIdx.z;
  const int S = tokens_per_split;
  const long long capacity = static_cast<long long>(table_width) * page_size;
  const int len = static_cast<int>(max(0LL, min(kv_lens[b], capacity)));
  const int start = split * S;
  if (start >= len) return;  // the whole block: the combine never reads this split
  const int n_valid = min(S, len - start);
  const int last = start + n_valid - 1;
  const long long* pages = page_table + b * table_stride;
  const int num_q_heads = num_kv_heads * G;
  const long long head0 = b * num_q_heads + static_cast<long long>(kh) * G;  // first q head row

  // 1. scores
  {
    float qv[G][E];
#pragma unroll
    for (int g = 0; g < G; ++g) {
      load_row<T, E>(q + (head0 + g) * D + lane * E, qv[g]);
#pragma unroll
      for (int j = 0; j < E; ++j) qv[g][j] *= scale;
    }
    for (int c0 = warp * CHUNK; c0 < n_valid; c0 += PDA_WARPS * CHUNK) {
      long long rows[CHUNK];
      token_rows<CHUNK>(rows, pages, start + c0, last, page_size, num_kv_heads, kh);
      KvRowBuf<T, KF, E> kb[CHUNK];
#pragma unroll
      for (int u = 0; u < CHUNK; ++u) kvq_fetch<T, KF, E>(ksrc, rows[u], lane, kb[u]);
#pragma unroll
      for (int u = 0; u < CHUNK; ++u) prefetch_l2(kvq_row_ptr<T, VF, E>(vsrc, rows[u], lane));
#pragma unroll
      for (int sub = 0; sub < CHUNK; sub += PDA_SUB) {
        float dots[NR];
#pragma unroll
        for (int u = 0; u < PDA_SUB; ++u) {
          float kr[E];
          kvq_decode<T, KF, E>(kb[sub + u], lane, kr);
#pragma unroll
          for (int g = 0; g < G; ++g) {
            float d = 0.0f;
#pragma unroll
            for (int j = 0; j < E; ++j) d += qv[g][j] * kr[j];
            dots[u * G + g] = d;
          }
        }
        int base = 0;
        bool owner = true;
        reduce_scatter<NR, 16, NR>(dots, lane, base, owner);
        if (owner) {
#pragma unroll
          for (int i = 0; i < NF; ++i) {
            const int idx = base + i;  // = u * G + g
            const int u = idx / G;
            const int g = idx - u * G;
            const int t = c0 + sub + u;
            smem[g * S + t] = t < n_valid ? dots[i] : __int_as_float(0xff800000);
          }
        }
      }
    }
  }
  __syncthreads();

  // 2. softmax over the block's tokens, one warp per head
  const int n_chunked = min(S, (n_valid + CHUNK - 1) / CHUNK * CHUNK);  // positions phase 1 wrote
  pda_softmax<G>(smem, S, n_valid, n_chunked, ws_ml + ((head0 * num_splits) + split) * 2,
                 2 * num_splits, warp, lane);
  __syncthreads();

  // 3. values
  float acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int j = 0; j < E; ++j) acc[g][j] = 0.0f;
  }
  for (int c0 = warp * CHUNK; c0 < n_valid; c0 += PDA_WARPS * CHUNK) {
    long long rows[CHUNK];
    token_rows<CHUNK>(rows, pages, start + c0, last, page_size, num_kv_heads, kh);
    KvRowBuf<T, VF, E> vb[CHUNK];
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) kvq_fetch<T, VF, E>(vsrc, rows[u], lane, vb[u]);
#pragma unroll
    for (int u = 0; u < CHUNK; ++u) {
      float vr[E];
      kvq_decode<T, VF, E>(vb[u], lane, vr);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = smem[g * S + c0 + u];
#pragma unroll
        for (int j = 0; j < E; ++j) acc[g][j] += p * vr[j];
      }
    }
  }
  __syncthreads();  // every warp is done with the scores; the space now takes the partials
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int j = 0; j < E; ++j) smem[(warp * G + g) * D + lane * E + j] = acc[g][j];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * D; i += PDA_WARPS * 32) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < PDA_WARPS; ++w) sum += smem[w * G * D + i];
    const int g = i / D;
    ws_acc[((head0 + g) * num_splits + split) * D + (i - g * D)] = sum;
  }
}

// Both combines take an optional output gate (the gated attention's `o * sigmoid(gate)`, opt-in
// `gate_in_combine`): gate[b, h, :] at b * gate_row + h * gate_head; null writes o itself. The
// gated element is common.cu's sigmoid_gated of the rounded o: the bits of sigmoid_gate after.
template <typename T>
__global__ void __launch_bounds__(256) paged_decode_combine(
    T* __restrict__ out, const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
    const long long* __restrict__ kv_lens, int num_splits, int tokens_per_split, int table_width,
    int page_size, int d, const T* __restrict__ gate, long long gate_row, long long gate_head) {
  pdl_begin();
  constexpr int GROUPS = 32;  // split groups; 8 threads x 4 dims each cover the block's 32 dims
  __shared__ float4 part[GROUPS][8];
  const long long row = static_cast<long long>(blockIdx.y) * gridDim.x + blockIdx.x;  // b*Hq + h
  const int d0 = blockIdx.z * 32;
  const long long capacity = static_cast<long long>(table_width) * page_size;
  const long long len = max(0LL, min(kv_lens[blockIdx.y], capacity));
  const int num_live = static_cast<int>(
      min(static_cast<long long>(num_splits), (len + tokens_per_split - 1) / tokens_per_split));
  const float* ml = ws_ml + row * num_splits * 2;

  float top = __int_as_float(0xff800000);
  for (int s = threadIdx.x; s < num_live; s += blockDim.x) top = fmaxf(top, ml[2 * s]);
  top = pda_block_max(top);
  float den = 0.0f;
  for (int s = threadIdx.x; s < num_live; s += blockDim.x) {
    den += __expf(ml[2 * s] - top) * ml[2 * s + 1];
  }
  den = block_sum(den);

  const int quad = threadIdx.x & 7;
  const int group = threadIdx.x >> 3;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float* base = ws_acc + row * num_splits * d + d0 + quad * 4;
#pragma unroll 4
  for (int s = group; s < num_live; s += GROUPS) {
    const float w = __expf(ml[2 * s] - top);
    const float4 a = *reinterpret_cast<const float4*>(base + static_cast<long long>(s) * d);
    acc.x += w * a.x;
    acc.y += w * a.y;
    acc.z += w * a.z;
    acc.w += w * a.w;
  }
  part[group][quad] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    const float* flat = reinterpret_cast<const float*>(part);  // [GROUPS][32 dims]
    float sum = 0.0f;
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) sum += flat[g * 32 + threadIdx.x];
    const T o = from_float<T>(den > 0.0f ? sum / den : 0.0f);
    out[row * d + d0 + threadIdx.x] =
        gate == nullptr ? o
                        : sigmoid_gated<T>(o, gate[blockIdx.y * gate_row + blockIdx.x * gate_head +
                                                   d0 + threadIdx.x]);
  }
}

// paged_decode_combine_warp: the combine of a plan of at most 32 splits, one warp per (sequence,
// query head) where paged_decode_combine spends D / 32 blocks of 256 threads, each with two
// block-wide reductions, on 32 dims (at 64 rows x 16 heads x 8 dim blocks that is 8,192 short
// blocks per layer). Lane s holds split s's (m, l); lane i owns dims i V .. i V + V - 1 (V = D /
// 32, a multiple of 4) and walks the live splits in order. Same bits as paged_decode_combine: at
// most 32 splits, that kernel's groups hold one split each (acc = w a, the product rounded once)
// and it adds them in split order; its max and its denominator's sum (one term per lane of warp
// 0, zeros elsewhere) reduce as this warp does.
template <typename T, int D>
__global__ void __launch_bounds__(256) paged_decode_combine_warp(
    T* __restrict__ out, const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
    const long long* __restrict__ kv_lens, long long num_rows, int num_q_heads, int num_splits,
    int tokens_per_split, int table_width, int page_size, const T* __restrict__ gate,
    long long gate_row, long long gate_head) {
  pdl_begin();
  static_assert(D % 128 == 0, "a lane's dims are whole float4s");
  constexpr int V = D / 32;
  const long long row = static_cast<long long>(blockIdx.x) * 8 + (threadIdx.x >> 5);  // b Hq + h
  if (row >= num_rows) return;  // the whole warp leaves together
  const int lane = threadIdx.x & 31;
  const long long capacity = static_cast<long long>(table_width) * page_size;
  const long long len = max(0LL, min(kv_lens[row / num_q_heads], capacity));
  const int num_live = static_cast<int>(
      min(static_cast<long long>(num_splits), (len + tokens_per_split - 1) / tokens_per_split));
  const float* ml = ws_ml + row * num_splits * 2;
  const float m = lane < num_live ? ml[2 * lane] : __int_as_float(0xff800000);
  const float top = pda_warp_max(m);
  float den = 0.0f;
  if (lane < num_live) den += __expf(ml[2 * lane] - top) * ml[2 * lane + 1];
  den = warp_sum(den);
  const float w_lane = lane < num_live ? __expf(ml[2 * lane] - top) : 0.0f;
  float acc[V];
#pragma unroll
  for (int i = 0; i < V; ++i) acc[i] = 0.0f;
  const float* base = ws_acc + row * num_splits * D + lane * V;
#pragma unroll 4
  for (int s = 0; s < num_live; ++s) {
    const float w = __shfl_sync(0xffffffffu, w_lane, s);
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      const float4 a = *reinterpret_cast<const float4*>(base + static_cast<long long>(s) * D + i);
      acc[i] = __fadd_rn(acc[i], __fmul_rn(w, a.x));
      acc[i + 1] = __fadd_rn(acc[i + 1], __fmul_rn(w, a.y));
      acc[i + 2] = __fadd_rn(acc[i + 2], __fmul_rn(w, a.z));
      acc[i + 3] = __fadd_rn(acc[i + 3], __fmul_rn(w, a.w));
    }
  }
  T* o = out + row * D + lane * V;
  const T* g = gate == nullptr ? nullptr
                               : gate + (row / num_q_heads) * gate_row +
                                     (row % num_q_heads) * gate_head + lane * V;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const T v = from_float<T>(den > 0.0f ? acc[i] / den : 0.0f);
    o[i] = g == nullptr ? v : sigmoid_gated<T>(v, g[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// paged_decode_mma: the partial launch on tensor cores, for a bf16 model with K and V both plain
// bf16, both int8 or both fp8 (FMT), G <= 8 query heads per KV head, D a multiple of 64. Same
// grid, split plan, outputs (ws_acc, ws_ml) and combine as paged_decode_partial; what changes is
// the arithmetic. The CUDA-core kernel above spends ~100 fp32 FMAs and a reduce-scatter per token
// and lane and is bound by issue and latency, not bytes (an fp8 cache read half the bytes in the
// same time). Here both products are mma.sync m16n8k16 with the G heads as the M rows (rows G..15
// are zero padding: cheap on tensor cores) and fp32 accumulation:
//   1. scores, per warp 8-token tiles: S[g][t] = q_g . k_t. Lane (gq = lane / 4, tq = lane % 4)
//      loads token t0 + gq's dims (c * 4 + tq) * 8 .. + 8 for c < D / 32; word 2 kk and 2 kk + 1
//      of that slice are its B fragment of k-step kk, and q is loaded with the same map (the dot
//      product does not care which dims meet in which k-step, only that q and k agree).
//   2. softmax over the block's tokens as paged_decode_partial (one warp per head); p = 0 past
//      the live tokens up to the next multiple of 16.
//   3. values, per warp a quarter of the dims, every 16-token k-step: O[g][n] += P[g][t] V[t][n]
//      with P from shared memory as the A fragment (rounded to the operand type, as flash
//      attention does) and lane (gq, tq) loading D / 32 consecutive dims of its four tokens
//      2tq, 2tq + 1, 2tq + 8, 2tq + 9 (B fragments: the same element of two tokens, one byte
//      permute each).
// Quantized codes are exact in f16 (e4m3 by the PTX cvt, int8 by an integer cvt), so the mma
// runs on f16 codes with q rounded to f16; the per-(token, head) scales go onto the score (K)
// and onto p (V) in fp32, not onto each value.

// N consecutive codes (1 byte each) of an 8-bit row -> N / 2 f16x2 words, exact
template <int FMT, int N>
__device__ __forceinline__ void pdm_codes_to_f16(const unsigned (&raw)[N / 4],
                                                 unsigned (&w)[N / 2]) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const unsigned pair = (raw[i / 2] >> (16 * (i % 2))) & 0xffffu;
    if constexpr (FMT == KV_FP8) {
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(w[i]) : "h"(static_cast<unsigned short>(pair)));
    } else {
      unsigned short lo, hi;
      const int a = static_cast<signed char>(pair & 0xffu);
      const int b = static_cast<signed char>(pair >> 8);
      asm("cvt.rn.f16.s32 %0, %1;" : "=h"(lo) : "r"(a));
      asm("cvt.rn.f16.s32 %0, %1;" : "=h"(hi) : "r"(b));
      w[i] = static_cast<unsigned>(lo) | (static_cast<unsigned>(hi) << 16);
    }
  }
}

// Lane's W = 2 * N / 2 ... : N elements (bf16 or 8-bit codes) at p as N / 2 operand words.
template <int FMT, int N>
__device__ __forceinline__ void pdm_load_words(const unsigned char* p, unsigned (&w)[N / 2]) {
  if constexpr (FMT == KV_PLAIN) {  // N bf16 = 2N bytes
    if constexpr (N % 8 == 0) {
#pragma unroll
      for (int c = 0; c < N / 8; ++c) {
        const uint4 u = reinterpret_cast<const uint4*>(p)[c];
        w[4 * c] = u.x, w[4 * c + 1] = u.y, w[4 * c + 2] = u.z, w[4 * c + 3] = u.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) w[i] = reinterpret_cast<const unsigned*>(p)[i];
    }
  } else {  // N codes = N bytes
    unsigned raw[N / 4];
    if constexpr (N % 8 == 0) {
#pragma unroll
      for (int c = 0; c < N / 8; ++c) {
        const uint2 u = reinterpret_cast<const uint2*>(p)[c];
        raw[2 * c] = u.x, raw[2 * c + 1] = u.y;
      }
    } else {
#pragma unroll
      for (int i = 0; i < N / 4; ++i) raw[i] = reinterpret_cast<const unsigned*>(p)[i];
    }
    pdm_codes_to_f16<FMT, N>(raw, w);
  }
}

// PFV: phase 1 prefetches each tile's V rows into L2 (a block's V is read in phase 3, after its
// softmax). With many blocks in flight their prefetched V can outgrow the L2 before it is used
// (64 rows x 2k tokens: ~500 blocks x 128 KiB of V); PFV = false leaves V to phase 3's loads.
template <int D, int G, int FMT, int TILES, bool PFV>
__global__ void __launch_bounds__(PDA_WARPS * 32, TILES == 1 ? 4 : 2) paged_decode_mma(
    float* __restrict__ ws_acc, float* __restrict__ ws_ml, const bf16* __restrict__ q,
    const void* __restrict__ k_values, const float* __restrict__ k_scale,
    const unsigned char* __restrict__ k_blocks, const void* __restrict__ v_values,
    const float* __restrict__ v_scale, const unsigned char* __restrict__ v_blocks,
    const long long* __restrict__ page_table, long long table_stride,
    const long long* __restrict__ kv_lens, int num_kv_heads, int page_size, int table_width,
    int num_splits, int tokens_per_split, float scale) {
  pdl_begin();
  static_assert(D % 64 == 0 && G >= 1 && G <= 8, "D a multiple of 64, at most 8 heads per KV head");
  constexpr bool F16 = FMT != KV_PLAIN;
  constexpr int EB = F16 ? 1 : 2;  // stored bytes per element
  constexpr int CH = D / 32;       // phase 1: a lane's chunks of 8 dims (2 k-steps each)
  constexpr int NT = D / 32;       // phase 3: n-tiles per warp = a lane's dims per token
  extern __shared__ float4 pda_smem4[];
  float* sc = reinterpret_cast<float*>(pda_smem4);  // [G][S] scores, then p

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int gq = lane >> 2;
  const int tq = lane & 3;
  const int split = blockIdx.x;
  const int kh = blockIdx.y;
  const long long b = blockIdx.z;
  const int S = tokens_per_split;
  const long long capacity = static_cast<long long>(table_width) * page_size;
  const int len = static_cast<int>(max(0LL, min(kv_lens[b], capacity)));
  const int start = split * S;
  if (start >= len) return;
  const int n_valid = min(S, len - start);
  const int last = start + n_valid - 1;
  const long long* pages = page_table + b * table_stride;
  const int num_q_heads = num_kv_heads * G;
  const long long head0 = b * num_q_heads + static_cast<long long>(kh) * G;
  const unsigned char* kv_k = static_cast<const unsigned char*>(k_values);
  const unsigned char* kv_v = static_cast<const unsigned char*>(v_values);

  // 1. scores
  {
    unsigned qa[CH * 4];  // words 2 kk, 2 kk + 1 = the A fragment's a0, a2 of k-step kk
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      const int d0 = (c * 4 + tq) * 8;
      if (gq < G) {
        const uint4 u = *reinterpret_cast<const uint4*>(q + (head0 + gq) * D + d0);
        const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (F16) {  // bf16 q -> f16, clamped to its finite range
            const float lo = fminf(fmaxf(__uint_as_float(w[i] << 16), -65504.0f), 65504.0f);
            const float hi = fminf(fmaxf(__uint_as_float(w[i] & 0xffff0000u), -65504.0f), 65504.0f);
            qa[4 * c + i] = pack_pair<true>(lo, hi);
          } else {
            qa[4 * c + i] = w[i];
          }
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) qa[4 * c + i] = 0u;
      }
    }
    for (int t00 = warp * 8 * TILES; t00 < n_valid; t00 += PDA_WARPS * 8 * TILES) {
      long long rows[TILES];
      unsigned kw[TILES][CH * 4];
#pragma unroll
      for (int u = 0; u < TILES; ++u) {  // every tile's loads in flight before any mma
        rows[u] = kv_row(pages, min(start + t00 + 8 * u + gq, last), page_size, num_kv_heads, kh);
#pragma unroll
        for (int c = 0; c < CH; ++c) {
          unsigned w4[4];
          pdm_load_words<FMT, 8>(kv_k + (rows[u] * D + (c * 4 + tq) * 8) * EB, w4);
#pragma unroll
          for (int i = 0; i < 4; ++i) kw[u][4 * c + i] = w4[i];
        }
        if (PFV && tq < (D * EB) / 128) prefetch_l2(kv_v + rows[u] * D * EB + tq * 128);
      }
#pragma unroll
      for (int u = 0; u < TILES; ++u) {
        const int t0 = t00 + 8 * u;
        if (t0 >= n_valid) break;  // warp-uniform
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kk = 0; kk < 2 * CH; ++kk) {
          // rows G..15 of A are padding: a1 = a3 = 0
          mma_16816<F16>(acc, qa[2 * kk], 0u, qa[2 * kk + 1], 0u, kw[u][2 * kk],
                         kw[u][2 * kk + 1]);
        }
        float s0 = acc[0] * scale, s1 = acc[1] * scale;  // tokens t0 + 2tq, t0 + 2tq + 1
        if constexpr (F16) {
          const float ks = k_scale[rows[u]];  // lane's token gq; c0 / c1: tokens 2tq, 2tq + 1
          s0 *= __shfl_sync(0xffffffffu, ks, 8 * tq);
          s1 *= __shfl_sync(0xffffffffu, ks, 8 * tq + 4);
        }
        if (gq < G) {
          const int ta = t0 + 2 * tq;
          sc[gq * S + ta] = ta < n_valid ? s0 : __int_as_float(0xff800000);
          sc[gq * S + ta + 1] = ta + 1 < n_valid ? s1 : __int_as_float(0xff800000);
        }
      }
    }
  }
  __syncthreads();

  // 2. softmax, one warp per head; p = 0 from the last live token to the next multiple of 16
  const int n16 = min(S, (n_valid + 15) / 16 * 16);
  pda_softmax<G>(sc, S, n_valid, n16, ws_ml + ((head0 * num_splits) + split) * 2,
                 2 * num_splits, warp, lane);
  __syncthreads();

  // 3. values: warp w owns dims w * D / 4 ..; n-tile j's column gq is dim base + gq * NT + j
  const int base = warp * (D / 4);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  const float* sp = sc + min(gq, G - 1) * S;
  for (int k00 = 0; k00 < n16; k00 += 16 * TILES) {
    unsigned vw[TILES][4][NT / 2];  // tokens k0 + 2tq, + 1, + 8, + 9: NT dims each, as pairs
    float vs[TILES][4];
#pragma unroll
    for (int u = 0; u < TILES; ++u) {  // every k-step's loads in flight before any mma
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int t = min(start + k00 + 16 * u + 2 * tq + (r & 1) + 8 * (r >> 1), last);
        const long long row = kv_row(pages, t, page_size, num_kv_heads, kh);
        pdm_load_words<FMT, NT>(kv_v + (row * D + base + gq * NT) * EB, vw[u][r]);
        if constexpr (F16) vs[u][r] = v_scale[row];
      }
    }
#pragma unroll
    for (int u = 0; u < TILES; ++u) {
      const int k0 = k00 + 16 * u;
      if (k0 >= n16) break;  // warp-uniform; k-steps stay in order, as with TILES = 1
      const float2 pa = *reinterpret_cast<const float2*>(sp + k0 + 2 * tq);
      const float2 pb = *reinterpret_cast<const float2*>(sp + k0 + 2 * tq + 8);
      unsigned a0, a2;
      if constexpr (F16) {
        a0 = pack_pair<true>(pa.x * vs[u][0], pa.y * vs[u][1]);
        a2 = pack_pair<true>(pb.x * vs[u][2], pb.y * vs[u][3]);
      } else {
        a0 = pack_pair<false>(pa.x, pa.y);
        a2 = pack_pair<false>(pb.x, pb.y);
      }
      if (gq >= G) a0 = a2 = 0u;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const unsigned sel = (j & 1) ? 0x7632u : 0x5410u;  // element j of two tokens' words
        const unsigned b0 = __byte_perm(vw[u][0][j / 2], vw[u][1][j / 2], sel);
        const unsigned b1 = __byte_perm(vw[u][2][j / 2], vw[u][3][j / 2], sel);
        mma_16816<F16>(acc[j], a0, 0u, a2, 0u, b0, b1);
      }
    }
  }
  if (gq < G) {
    float* out = ws_acc + ((head0 + gq) * num_splits + split) * D + base;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      out[(2 * tq) * NT + j] = acc[j][0];
      out[(2 * tq + 1) * NT + j] = acc[j][1];
    }
  }
}
