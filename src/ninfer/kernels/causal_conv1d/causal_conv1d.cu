// Prefill depthwise causal conv1d + SiLU over varlen sequences packed back to back.
//
// Sequence b (tokens cu_seqlens[b] .. cu_seqlens[b+1]) continues conv_state[slot_b] ([C, K-1],
// oldest first): with ext = [state, x_b], y_t = silu(sum_j w[c, j] ext[t + j]) in fp32, rounded
// to x's type. Two launches on one stream, so no thread overwrites a state slot another still
// reads: `causal_conv1d_fwd` (a thread per channel walks CONV_TOKENS tokens, the window in
// registers, finding its sequence by binary search over cu_seqlens; CONV_BATCH tokens of one
// sequence load together; V channels per thread) reads the old states, then
// `causal_conv1d_state` (a thread per channel and sequence) writes each slot's last K-1 inputs,
// mixing old state and new inputs for sequences shorter than K-1. x rows may be strided (a column
// slice of the fused projection); a warp reads 32 consecutive channels of a row.

constexpr int CONV_TOKENS = 32;  // tokens per thread in causal_conv1d_fwd
constexpr int CONV_BATCH = 8;    // of them loaded together where one sequence covers all 8

// Input at flat token p for the sequence starting at `seq_start` (earlier: its state slot).
template <typename TX, typename TS, int K>
__device__ __forceinline__ float conv_input(const TX* __restrict__ x, long long x_stride,
                                            const TS* __restrict__ st, long long p,
                                            long long seq_start, int c) {
  if (p >= seq_start) return to_float(x[p * x_stride + c]);
  return to_float(st[(K - 1) - static_cast<int>(seq_start - p)]);
}

// V consecutive channels of one row as one load or store (V * sizeof(T) bytes, aligned to it).
template <int BYTES>
struct ConvRaw;
template <>
struct ConvRaw<2> {
  using type = unsigned short;
};
template <>
struct ConvRaw<4> {
  using type = unsigned int;
};
template <>
struct ConvRaw<8> {
  using type = uint2;
};
template <>
struct ConvRaw<16> {
  using type = uint4;
};

template <typename T, int V>
__device__ __forceinline__ void conv_load(const T* __restrict__ p, float (&v)[V]) {
  using R = typename ConvRaw<sizeof(T) * V>::type;
  alignas(sizeof(T) * V) T e[V];
  *reinterpret_cast<R*>(e) = *reinterpret_cast<const R*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) v[i] = to_float(e[i]);
}

template <typename T, int V>
__device__ __forceinline__ void conv_store(T* __restrict__ p, const float (&v)[V]) {
  using R = typename ConvRaw<sizeof(T) * V>::type;
  alignas(sizeof(T) * V) T e[V];
#pragma unroll
  for (int i = 0; i < V; ++i) e[i] = from_float<T>(v[i]);
  *reinterpret_cast<R*>(p) = *reinterpret_cast<const R*>(e);
}

// A thread owns V consecutive channels (the launcher's V: 4 where the channel count and x's
// rows allow aligned V-wide accesses, else 1): one V * sizeof(TX)-byte load per token and
// CONV_BATCH of them in flight, where one element per thread kept ~16 bytes in flight and a
// warp's row read to 64 bytes (the 8k prefill profile, run U3: 7.4 ms for 48 calls, ~2x the
// bytes' time). Each channel's products and sums are the V = 1 ones, in the same order.
template <typename TX, typename TS, typename TW, int K, int V>
__global__ void __launch_bounds__(128) causal_conv1d_fwd(
    TX* __restrict__ out, const TX* __restrict__ x, long long x_stride,
    const TS* __restrict__ conv_state, const TW* __restrict__ weight,
    const long long* __restrict__ slots, const long long* __restrict__ cu_seqlens, int num_seqs,
    long long num_tokens, int channels) {
  pdl_begin();
  const int c0 = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (c0 >= channels) return;  // the launcher's V divides the channel count
  const long long t_begin = static_cast<long long>(blockIdx.y) * CONV_TOKENS;
  const long long t_end = min(t_begin + CONV_TOKENS, num_tokens);
  // The last sequence starting at or before t_begin (skips empty sequences).
  int lo = 0;
  int hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (cu_seqlens[mid] <= t_begin) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int b = lo;
  long long seq_start = cu_seqlens[b];
  long long seq_end = cu_seqlens[b + 1];
  const TS* st = conv_state + (slots[b] * channels + c0) * static_cast<long long>(K - 1);

  float w[V][K];
  float hist[V][K - 1];  // hist[v][K-2] is channel c0 + v's newest input before token t
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int i = 0; i < K; ++i) w[v][i] = to_float(weight[static_cast<long long>(c0 + v) * K + i]);
#pragma unroll
    for (int i = 0; i < K - 1; ++i) {
      hist[v][i] = conv_input<TX, TS, K>(x, x_stride, st + v * (K - 1),
                                         t_begin - (K - 1) + i, seq_start, c0 + v);
    }
  }

  for (long long t = t_begin; t < t_end;) {
    if (t >= seq_end) {  // the next non-empty sequence starts here: its history is its state
      while (cu_seqlens[b + 1] <= t) ++b;
      seq_start = cu_seqlens[b];
      seq_end = cu_seqlens[b + 1];
      st = conv_state + (slots[b] * channels + c0) * static_cast<long long>(K - 1);
#pragma unroll
      for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int i = 0; i < K - 1; ++i) hist[v][i] = to_float(st[v * (K - 1) + i]);
      }
    }
    // CONV_BATCH tokens of one sequence: their loads all issued before the first product (the
    // one-token loop waited for each load in turn); same products in the same order per token.
    const int n = t + CONV_BATCH <= min(t_end, seq_end) ? CONV_BATCH : 1;
    float xt[CONV_BATCH][V];
#pragma unroll
    for (int u = 0; u < CONV_BATCH; ++u) {
      if (u < n) conv_load<TX, V>(x + (t + u) * x_stride + c0, xt[u]);
    }
#pragma unroll
    for (int u = 0; u < CONV_BATCH; ++u) {
      if (u < n) {
        float y[V];
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float acc = 0.0f;
#pragma unroll
          for (int i = 0; i < K - 1; ++i) acc += hist[v][i] * w[v][i];
          acc += xt[u][v] * w[v][K - 1];
#pragma unroll
          for (int i = 0; i < K - 2; ++i) hist[v][i] = hist[v][i + 1];
          hist[v][K - 2] = xt[u][v];
          y[v] = silu(acc);
        }
        conv_store<TX, V>(out + (t + u) * channels + c0, y);
      }
    }
    t += n;
  }
}

template <typename TX, typename TS, int K>
__global__ void __launch_bounds__(128) causal_conv1d_state(
    TS* __restrict__ conv_state, const TX* __restrict__ x, long long x_stride,
    const long long* __restrict__ slots, const long long* __restrict__ cu_seqlens, int channels) {
  pdl_begin();
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int b = blockIdx.y;
  const long long seq_start = cu_seqlens[b];
  const long long seq_end = cu_seqlens[b + 1];
  TS* st = conv_state + (slots[b] * channels + c) * static_cast<long long>(K - 1);
  TS keep[K - 1];
#pragma unroll
  for (int i = 0; i < K - 1; ++i) {
    const long long p = seq_end - (K - 1) + i;
    keep[i] = p >= seq_start ? from_float<TS>(to_float(x[p * x_stride + c]))
                             : st[(K - 1) - static_cast<int>(seq_start - p)];
  }
#pragma unroll
  for (int i = 0; i < K - 1; ++i) st[i] = keep[i];
}
