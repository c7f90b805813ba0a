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

// How many values each lane holds after reduce_scatter<N, OFFSET>.
template <int N, int OFFSET>
struct ScatterCount {
  static constexpr int value = ScatterCount<N % 2 == 0 ? N / 2 : N, OFFSET / 2>::value;
};
template <int N>
struct ScatterCount<N, 0> {
  static constexpr int value = N;
};

// Sums v[0..N) over the lanes of a warp (call with OFFSET = 16). While N is even, each step keeps
// half of the values, the half chosen by the lane's OFFSET bit, and adds the partner lane's copy
// of that half (N / 2 shuffles); once N is odd the rest is a plain butterfly. Afterwards v[i],
// i < ScatterCount<N, 16>::value, is the warp total of entry base + i, and `owner` is true on exactly
// one lane for each entry.
template <int N, int OFFSET, int M>
__device__ __forceinline__ void reduce_scatter(float (&v)[M], int lane, int& base, bool& owner) {
  if constexpr (OFFSET > 0) {
    if constexpr (N % 2 == 0) {
      constexpr int H = N / 2;
      const bool hi = (lane & OFFSET) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = hi ? v[i] : v[i + H];
        const float keep = hi ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
      }
      if (hi) base += H;
      reduce_scatter<H, OFFSET / 2, M>(v, lane, base, owner);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], OFFSET);
      if (lane & OFFSET) owner = false;
      reduce_scatter<N, OFFSET / 2, M>(v, lane, base, owner);
    }
  }
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Row indices (page slot * Hk + head, see kv_codec.cu) of the K/V rows of KV head kh of tokens
// first .. first + C - 1, each clamped to last (a live position) so that surplus tokens of a chunk
// read valid memory.
template <int C>
__device__ __forceinline__ void token_rows(long long (&rows)[C], const long long* __restrict__ pages,
                                           int first, int last, int page_size, int num_kv_heads,
                                           int kh) {
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int t = min(first + u, last);
    const long long page = pages[t / page_size];
    rows[u] = (page * page_size + t % page_size) * num_kv_heads + kh;
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
  for (int g = warp; g < G; g += PDA_WARPS) {
    float* sg = smem + g * S;
    float m = __int_as_float(0xff800000);
    for (int t = lane; t < n_valid; t += 32) m = fmaxf(m, sg[t]);
    m = pda_warp_max(m);
    float l = 0.0f;
    for (int t = lane; t < n_chunked; t += 32) {
      const float p = __expf(sg[t] - m);  // surplus tokens: exp(-inf) = 0
      sg[t] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      const long long idx = (head0 + g) * num_splits + split;
      ws_ml[idx * 2] = m;
      ws_ml[idx * 2 + 1] = l;
    }
  }
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

template <typename T>
__global__ void __launch_bounds__(256) paged_decode_combine(
    T* __restrict__ out, const float* __restrict__ ws_acc, const float* __restrict__ ws_ml,
    const long long* __restrict__ kv_lens, int num_splits, int tokens_per_split, int table_width,
    int page_size, int d) {
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
    out[row * d + d0 + threadIdx.x] = from_float<T>(den > 0.0f ? sum / den : 0.0f);
  }
}
