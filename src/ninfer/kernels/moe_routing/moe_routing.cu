// MoE routing: router logits [T, E] -> top-k expert ids (int64) and their softmax weights (fp32),
// optionally renormalised over the k. One warp per row; lane l holds experts l, l + 32, ... in
// registers (VALS per lane, E <= 32 * VALS). Each of the k rounds takes the largest logit not yet
// taken, ties to the lower expert id (the twin's stable sort): for bf16 logits by a lane-local max
// and one warp max over (logit, id) packed in 32 bits, else by a lane-local scan and a warp
// butterfly over (logit, id); lane r keeps the r-th choice. Choosing on the logits, not on the
// exponentials, makes the choice independent of exp rounding, so kernel and twin agree exactly.
// The softmax runs in fp32 with IEEE division and an exp accurate to a few ulp (--use_fast_math
// would otherwise turn expf and '/' into approximations). NaN logits: the choice is unspecified.

#define ROUTE_NONE 0x7fffffff

// exp(x) for x <= 0: 2^(x log2 e) with the product's rounding error carried as a first-order term.
__device__ __forceinline__ float route_exp(float x) {
  if (x < -88.0f) return 0.0f;  // below fp32's normal range (and -inf, whose lo would be NaN)
  const float log2e_hi = 1.44269502162933349609375f;  // fp32 nearest to log2(e)
  const float log2e_lo = 1.925963033500011079e-8f;    // log2(e) - log2e_hi
  const float hi = x * log2e_hi;
  const float lo = fmaf(x, log2e_hi, -hi) + x * log2e_lo;
  return exp2f(hi) * fmaf(lo, 0.69314718055994530942f, 1.0f);
}

// A bf16 logit (held as its exact fp32 value) and its expert id as one unsigned key whose order
// is (logit desc, id asc): the logit's bf16 bits made order-preserving (-0 first turned into +0,
// which compares equal to it) in the high half, 0xffff - id in the low half (E <= 1024). Keys are
// distinct and never 0.
__device__ __forceinline__ unsigned int route_key(float v, int id) {
  unsigned int bits = __float_as_uint(v) >> 16;
  if (bits == 0x8000u) bits = 0u;
  bits = (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
  return (bits << 16) | (0xffffu - static_cast<unsigned int>(id));
}

// The largest key of the warp in one instruction (redux.sync, sm_80+), else a butterfly.
__device__ __forceinline__ unsigned int warp_max_key(unsigned int key) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  unsigned int out;
  asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(out) : "r"(key));
  return out;
#else
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    key = max(key, __shfl_xor_sync(0xffffffffu, key, offset));
  }
  return key;
#endif
}

// bf16 rows choose by key: each of the k rounds is a lane-local max over VALS keys and one warp
// max, where the generic path's (logit, id) butterfly is five dependent shuffle pairs and
// compares a round (ncu, H100, 35B-A3B shapes: ~8 us for one row, its one warp issue-bound).
// Same choices: the key order is the twin's (logit desc, id asc) on logits exact in fp32.
template <int VALS>
__device__ __forceinline__ void choose_by_key(const float (&v)[VALS], unsigned int taken,
                                              int lane, int top_k, float& chosen_v,
                                              int& chosen_id) {
  unsigned int key[VALS];
#pragma unroll
  for (int j = 0; j < VALS; ++j) key[j] = ((taken >> j) & 1u) ? 0u : route_key(v[j], lane + 32 * j);
  unsigned int mine = 0u;  // lane r < top_k: the r-th choice's key
  for (int r = 0; r < top_k; ++r) {
    unsigned int best = key[0];
#pragma unroll
    for (int j = 1; j < VALS; ++j) best = max(best, key[j]);
    best = warp_max_key(best);
#pragma unroll
    for (int j = 0; j < VALS; ++j) key[j] = key[j] == best ? 0u : key[j];
    if (lane == r) mine = best;
  }
  chosen_id = static_cast<int>(0xffffu - (mine & 0xffffu));
  unsigned int bits = mine >> 16;
  bits = (bits & 0x8000u) ? (bits & 0x7fffu) : (~bits & 0xffffu);
  chosen_v = __uint_as_float(bits << 16);
}

// Generic rows (fp32) choose by a (logit, id) butterfly each round: the largest logit not yet
// taken, ties to the lower expert id; `taken` bit j: expert lane + 32 j is chosen or absent.
template <int VALS>
__device__ __forceinline__ void choose_by_butterfly(const float (&v)[VALS], unsigned int taken,
                                                    int lane, int top_k, float& chosen_v,
                                                    int& chosen_id) {
  for (int r = 0; r < top_k; ++r) {
    float best_v = 0.0f;
    int best_id = ROUTE_NONE;
#pragma unroll
    for (int j = 0; j < VALS; ++j) {  // ascending ids: '>' keeps the lowest id among equals
      if (!((taken >> j) & 1u) && (best_id == ROUTE_NONE || v[j] > best_v)) {
        best_v = v[j];
        best_id = lane + 32 * j;
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float other_v = __shfl_xor_sync(0xffffffffu, best_v, offset);
      const int other_id = __shfl_xor_sync(0xffffffffu, best_id, offset);
      if (other_id != ROUTE_NONE &&
          (best_id == ROUTE_NONE || other_v > best_v || (other_v == best_v && other_id < best_id))) {
        best_v = other_v;
        best_id = other_id;
      }
    }
    if (best_id != ROUTE_NONE && (best_id & 31) == lane) taken |= 1u << (best_id >> 5);
    if (lane == r) {
      chosen_v = best_v;
      chosen_id = best_id;
    }
  }
}

template <typename T, int VALS, bool KEYS>
__global__ void __launch_bounds__(128) moe_routing(
    float* __restrict__ weights, long long* __restrict__ ids, const T* __restrict__ logits,
    long long row_stride, int num_rows, int num_experts, int top_k, int normalize) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const long long row = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= num_rows) return;  // warp-uniform: the whole warp leaves together
  const T* src = logits + row * row_stride;
  float v[VALS];
  unsigned int taken = 0u;  // bit j: expert lane + 32 j is chosen already or does not exist
#pragma unroll
  for (int j = 0; j < VALS; ++j) {
    const int e = lane + 32 * j;
    if (e < num_experts) {
      v[j] = to_float(src[e]);
    } else {
      v[j] = 0.0f;
      taken |= 1u << j;
    }
  }
  float chosen_v = 0.0f;  // lane r < top_k: the r-th choice
  int chosen_id = 0;
  if constexpr (KEYS) {  // bf16 logits only: the key holds the logit's 16 bits
    choose_by_key<VALS>(v, taken, lane, top_k, chosen_v, chosen_id);
  } else {
    choose_by_butterfly<VALS>(v, taken, lane, top_k, chosen_v, chosen_id);
  }
  const float top = __shfl_sync(0xffffffffu, chosen_v, 0);  // the largest logit of the row
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < VALS; ++j) {
    if (lane + 32 * j < num_experts) total += route_exp(v[j] - top);
  }
  total = warp_sum(total);
  float p = lane < top_k ? __fdiv_rn(route_exp(chosen_v - top), total) : 0.0f;
  if (normalize) p = __fdiv_rn(p, warp_sum(p));
  if (lane < top_k) {
    weights[row * top_k + lane] = p;
    ids[row * top_k + lane] = static_cast<long long>(chosen_id);
  }
}

// expert_sort: the grouped MoE path's sort of A assignments by expert in one launch, where torch
// spends a radix sort (several kernels) and a searchsorted: ~27 µs per 35B layer at 512
// assignments (run K's profile: 1.08 ms per batch-64 step). One block, a stable counting sort:
// - the ids go to shared memory;
// - TABLE (the default where [ceil(A / 32)][E] ints fit shared memory; launch.py): each warp-sized
//   chunk of 32 assignments counts its experts with __match_any_sync into table[chunk][e]; one
//   thread per expert turns its column into exclusive prefixes over the chunks (its total is the
//   expert's count); assignment i then ranks at table[i / 32][e] + (lanes below it in its chunk
//   with the same expert). O(A / 32) steps per expert instead of O(A) per assignment;
// - else (the loop): a shared histogram by atomics, and the rank as a count over the ids in
//   shared memory, every thread reading the same j at once (a broadcast): O(A^2 / blockDim);
// - the counts become the inclusive ends: with TABLE by a block-wide scan (warp shuffles), else
//   by one thread's loop over the experts; assignment i lands at (start of its expert) + rank, so
//   the order within an expert is the assignment order, as `torch.sort(stable=True)` gives.
//   Integer counts: both forms write the same order and ends.
// The launcher keeps A <= SORT_MAX_ASSIGNMENTS and E <= blockDim. ids outside [0, E) are skipped
// (the router never makes them): they are counted in no run and written nowhere, and the
// consumers read `order` only inside the runs.

// Inclusive sum of v over the block's threads in thread order (every thread must call it).
__device__ __forceinline__ int block_inclusive_scan(int v, int* warp_total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  if (lane == 31) warp_total[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const int num_warps = blockDim.x >> 5;
    int w = lane < num_warps ? warp_total[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += up;
    }
    warp_total[lane] = w;
  }
  __syncthreads();
  return warp > 0 ? v + warp_total[warp - 1] : v;
}

__global__ void __launch_bounds__(1024) expert_sort(long long* __restrict__ order,
                                                    int* __restrict__ ends,
                                                    const long long* __restrict__ ids, int count,
                                                    int num_experts, int table) {
  pdl_begin();
  extern __shared__ int sort_smem[];
  __shared__ int warp_total[32];
  int* sid = sort_smem;              // [count]
  int* run_end = sort_smem + count;  // [num_experts]: counts, then inclusive ends
  int* tab = run_end + num_experts;  // TABLE: [chunks][num_experts]
  const int chunks = (count + 31) >> 5;
  const int lane = threadIdx.x & 31;
  const unsigned int below = (1u << lane) - 1u;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const long long e = ids[i];
    sid[i] = e >= 0 && e < num_experts ? static_cast<int>(e) : -1;
  }
  if (table) {
    for (int i = threadIdx.x; i < chunks * num_experts; i += blockDim.x) tab[i] = 0;
    __syncthreads();
    for (int i0 = 0; i0 < count; i0 += blockDim.x) {  // whole warps: blockDim % 32 == 0
      const int i = i0 + threadIdx.x;
      const int e = i < count ? sid[i] : -1;
      const unsigned int same = __match_any_sync(0xffffffffu, e);
      if (e >= 0 && (same & below) == 0) tab[(i >> 5) * num_experts + e] = __popc(same);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
      int run = 0;
      for (int c = 0; c < chunks; ++c) {
        const int n = tab[c * num_experts + e];
        tab[c * num_experts + e] = run;
        run += n;
      }
      run_end[e] = run;
    }
  } else {
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) run_end[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      if (sid[i] >= 0) atomicAdd(&run_end[sid[i]], 1);
    }
  }
  __syncthreads();
  if (table) {  // E <= blockDim: thread e scans expert e's count (`table` is uniform)
    const int mine = threadIdx.x < num_experts ? run_end[threadIdx.x] : 0;
    const int end = block_inclusive_scan(mine, warp_total);
    if (threadIdx.x < num_experts) run_end[threadIdx.x] = end;
  } else if (threadIdx.x == 0) {
    int total = 0;
    for (int e = 0; e < num_experts; ++e) {
      total += run_end[e];
      run_end[e] = total;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < num_experts; e += blockDim.x) ends[e] = run_end[e];
  if (table) {
    for (int i0 = 0; i0 < count; i0 += blockDim.x) {
      const int i = i0 + threadIdx.x;
      const int e = i < count ? sid[i] : -1;
      const unsigned int same = __match_any_sync(0xffffffffu, e);
      if (e < 0) continue;
      const int rank = tab[(i >> 5) * num_experts + e] + __popc(same & below);
      order[(e == 0 ? 0 : run_end[e - 1]) + rank] = i;
    }
  } else {
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
      const int e = sid[i];
      if (e < 0) continue;
      int rank = 0;
      for (int j = 0; j < i; ++j) rank += sid[j] == e;
      order[(e == 0 ? 0 : run_end[e - 1]) + rank] = i;
    }
  }
}
