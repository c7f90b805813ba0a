// Sampling one token per logits row, repeating reference.py's rounding step by step.
//   sampling_topk<T>: grid (num_splits, B). Each block takes one column range of one row, applies
//     the presence/frequency penalties and keeps its 20 best (logit desc, id asc): every thread
//     holds a sorted register list, and 20 block-wide argmax rounds pop the heads.
//   sampling_draw: one warp per row. Merges the splits' lists (candidate r lands in lane r), then
//     temperature, top-k, top-p, min-p and the exponential race keyed by Philox4x32-10.
//   sampling_candidates: one warp per row, the merge alone (reference.top_candidates).
// The runtime compiles with --use_fast_math, so every float/double op whose rounding matters is an
// _rn intrinsic (never fused into an FMA, never approximated); exp and log are double precision.

#define SAMPLING_TOP_K 20
#define SAMPLING_MAX_SPLITS 32
#define SAMPLING_NO_ID 0x7fffffff  // ranks after every real (logit, id), -inf logits included
#define SAMPLING_NUM_REALS 5       // RowParams.reals: temperature, top_p, min_p, presence, freq
#define SAMPLING_NUM_INTS 4        // RowParams.ints: top_k, greedy, seed, step
#define SAMPLING_INF_F __int_as_float(0x7f800000)  // no math.h under NVRTC: +inf by its bits
#define SAMPLING_INF_D __longlong_as_double(0x7ff0000000000000LL)

// (az, aid) ranks before (bz, bid): larger logit first, then the lower id.
__device__ __forceinline__ bool ranks_before(float az, int aid, float bz, int bid) {
  return az > bz || (az == bz && aid < bid);
}

// Every lane ends with the warp's first-ranked (z, id).
__device__ __forceinline__ void warp_first(float& z, int& id) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_z = __shfl_xor_sync(0xffffffffu, z, offset);
    const int other_id = __shfl_xor_sync(0xffffffffu, id, offset);
    if (ranks_before(other_z, other_id, z, id)) {
      z = other_z;
      id = other_id;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(256)
    sampling_topk(float* __restrict__ cand_z, int* __restrict__ cand_ids,
                  const T* __restrict__ logits, long long logits_stride,
                  const int* __restrict__ counts, long long counts_stride,
                  const long long* __restrict__ count_rows, const double* __restrict__ reals,
                  int num_sampleable, int chunk) {
  pdl_begin();
  const int row = blockIdx.y;
  const int split = blockIdx.x;
  const long long begin_ll = static_cast<long long>(split) * chunk;
  const int begin = static_cast<int>(begin_ll < num_sampleable ? begin_ll : num_sampleable);
  const int end = static_cast<int>(min(static_cast<long long>(num_sampleable), begin_ll + chunk));
  const T* x = logits + static_cast<long long>(row) * logits_stride;

  // reals are read only with counts (sampling_candidates passes neither)
  float presence = 0.0f;
  float frequency = 0.0f;
  const int* c = nullptr;
  if (counts != nullptr) {
    presence = static_cast<float>(reals[row * SAMPLING_NUM_REALS + 3]);
    frequency = static_cast<float>(reals[row * SAMPLING_NUM_REALS + 4]);
    if (presence != 0.0f || frequency != 0.0f) {
      const long long count_row = count_rows != nullptr ? count_rows[row] : row;
      c = counts + count_row * counts_stride;
    }
  }

  float list_z[SAMPLING_TOP_K];
  int list_id[SAMPLING_TOP_K];
#pragma unroll
  for (int j = 0; j < SAMPLING_TOP_K; ++j) {
    list_z[j] = -SAMPLING_INF_F;
    list_id[j] = SAMPLING_NO_ID;
  }

  constexpr int kUnroll = 4;  // loads in flight per thread before the (branchy) insertions
  const int stride = blockDim.x;
  for (int base = begin + threadIdx.x; base < end; base += kUnroll * stride) {
    float v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = base + u * stride;
      v[u] = -SAMPLING_INF_F;
      if (col < end) {
        float z = to_float(x[col]);
        if (c != nullptr) {
          // reference: z - presence * [n > 0] - frequency * n, each op rounded to float32
          const int n = c[col];
          z = __fsub_rn(z, __fmul_rn(presence, n > 0 ? 1.0f : 0.0f));
          z = __fsub_rn(z, __fmul_rn(frequency, static_cast<float>(n)));
        }
        v[u] = z;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int col = base + u * stride;
      if (col < end && ranks_before(v[u], col, list_z[SAMPLING_TOP_K - 1],
                                    list_id[SAMPLING_TOP_K - 1])) {
        float carry_z = v[u];
        int carry_id = col;
#pragma unroll
        for (int j = 0; j < SAMPLING_TOP_K; ++j) {  // insertion: the list stays sorted
          if (ranks_before(carry_z, carry_id, list_z[j], list_id[j])) {
            const float tz = list_z[j];
            const int tid = list_id[j];
            list_z[j] = carry_z;
            list_id[j] = carry_id;
            carry_z = tz;
            carry_id = tid;
          }
        }
      }
    }
  }

  __shared__ float warp_z[32];
  __shared__ int warp_id[32];
  __shared__ int winner_id;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  const long long out_base = (static_cast<long long>(row) * gridDim.x + split) * SAMPLING_TOP_K;
  for (int r = 0; r < SAMPLING_TOP_K; ++r) {
    float z = list_z[0];
    int id = list_id[0];
    warp_first(z, id);
    if (lane == 0) {
      warp_z[warp] = z;
      warp_id[warp] = id;
    }
    __syncthreads();
    if (warp == 0) {
      z = lane < num_warps ? warp_z[lane] : -SAMPLING_INF_F;
      id = lane < num_warps ? warp_id[lane] : SAMPLING_NO_ID;
      warp_first(z, id);
      if (lane == 0) {
        winner_id = id;
        cand_z[out_base + r] = z;
        cand_ids[out_base + r] = id;
      }
    }
    __syncthreads();
    // ids are unique, so only the winner pops (NO_ID fillers popping is harmless)
    if (list_id[0] == winner_id) {
#pragma unroll
      for (int j = 0; j < SAMPLING_TOP_K - 1; ++j) {
        list_z[j] = list_z[j + 1];
        list_id[j] = list_id[j + 1];
      }
      list_z[SAMPLING_TOP_K - 1] = -SAMPLING_INF_F;
      list_id[SAMPLING_TOP_K - 1] = SAMPLING_NO_ID;
    }
  }
}

// Philox4x32-10 (rng.py): counter (c0..c3) and key (k0, k1) in, the four output words out
// (in place). The draw kernel and the test hook `sampling_philox` both run this one function.
__device__ __forceinline__ void philox4x32_10(unsigned int& c0, unsigned int& c1,
                                              unsigned int& c2, unsigned int& c3,
                                              unsigned int k0, unsigned int k1) {
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned int hi0 = __umulhi(0xD2511F53u, c0);
    const unsigned int lo0 = 0xD2511F53u * c0;
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c2);
    const unsigned int lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
}

// Word 0 of Philox4x32-10: what the sampler's uniforms use.
__device__ __forceinline__ unsigned int philox_word0(unsigned int c0, unsigned int c1,
                                                     unsigned int c2, unsigned int c3,
                                                     unsigned int k0, unsigned int k1) {
  philox4x32_10(c0, c1, c2, c3, k0, k1);
  return c0;
}

// Row blockIdx.x's split lists (num_splits of SAMPLING_TOP_K) merged by one warp: the lists are
// staged in shared memory, then round r finds the best entry ranked after round r-1's pick and
// lane r keeps it in (my_z, my_id); lanes past num_candidates (<= 32) keep (-inf, NO_ID).
__device__ __forceinline__ void merged_candidate(const float* __restrict__ cand_z,
                                                 const int* __restrict__ cand_ids,
                                                 int num_splits, int num_candidates, float& my_z,
                                                 int& my_id) {
  __shared__ float all_z[SAMPLING_MAX_SPLITS * SAMPLING_TOP_K];
  __shared__ int all_id[SAMPLING_MAX_SPLITS * SAMPLING_TOP_K];
  const int lane = threadIdx.x;
  const int num_listed = num_splits * SAMPLING_TOP_K;
  const long long in_base = static_cast<long long>(blockIdx.x) * num_listed;
  for (int i = lane; i < num_listed; i += 32) {
    all_z[i] = cand_z[in_base + i];
    all_id[i] = cand_ids[in_base + i];
  }
  __syncwarp();
  my_z = -SAMPLING_INF_F;
  my_id = SAMPLING_NO_ID;
  float prev_z = SAMPLING_INF_F;
  int prev_id = -1;
  for (int r = 0; r < num_candidates; ++r) {
    float z = -SAMPLING_INF_F;
    int id = SAMPLING_NO_ID;
    for (int i = lane; i < num_listed; i += 32) {
      const float zi = all_z[i];
      const int idi = all_id[i];
      if (ranks_before(prev_z, prev_id, zi, idi) && ranks_before(zi, idi, z, id)) {
        z = zi;
        id = idi;
      }
    }
    warp_first(z, id);
    if (lane == r) {
      my_z = z;
      my_id = id;
    }
    prev_z = z;
    prev_id = id;
  }
}

// sampling_candidates: one warp per row, the row's first num_candidates (logit, id) in rank
// order from sampling_topk's split lists (run without counts): what `reference.top_candidates`
// returns, for the speculative acceptance's survivors.
__global__ void __launch_bounds__(32)
    sampling_candidates(float* __restrict__ out_z, long long* __restrict__ out_ids,
                        const float* __restrict__ cand_z, const int* __restrict__ cand_ids,
                        int num_splits, int num_candidates) {
  pdl_begin();
  float z;
  int id;
  merged_candidate(cand_z, cand_ids, num_splits, num_candidates, z, id);
  if (threadIdx.x < num_candidates) {
    const long long at = static_cast<long long>(blockIdx.x) * num_candidates + threadIdx.x;
    out_z[at] = z;
    out_ids[at] = id;
  }
}

__global__ void __launch_bounds__(32)
    sampling_draw(long long* __restrict__ out, const float* __restrict__ cand_z,
                  const int* __restrict__ cand_ids, int num_splits, int num_candidates,
                  const double* __restrict__ reals, const long long* __restrict__ ints) {
  pdl_begin();
  const int row = blockIdx.x;
  const int lane = threadIdx.x;
  float my_z;
  int my_id;
  merged_candidate(cand_z, cand_ids, num_splits, num_candidates, my_z, my_id);

  const double* row_reals = reals + static_cast<long long>(row) * SAMPLING_NUM_REALS;
  const long long* row_ints = ints + static_cast<long long>(row) * SAMPLING_NUM_INTS;
  const long long top_k = row_ints[0];
  const bool greedy = row_ints[1] != 0;
  const unsigned long long seed = static_cast<unsigned long long>(row_ints[2]);
  const unsigned long long step = static_cast<unsigned long long>(row_ints[3]);
  const float temperature = greedy ? 1.0f : static_cast<float>(row_reals[0]);
  const double top_p = row_reals[1];
  const double min_p = row_reals[2];

  const bool in_top_k = lane < num_candidates && lane < top_k;
  const float scaled = in_top_k ? __fdiv_rn(my_z, temperature) : -SAMPLING_INF_F;
  const float scaled_first = __shfl_sync(0xffffffffu, scaled, 0);
  const double log_ratio = __dsub_rn(static_cast<double>(scaled), static_cast<double>(scaled_first));
  const double weight = exp(log_ratio);  // exp(-inf) = 0 outside the top k

  // Inclusive prefix sum in torch's CUDA order for a short innermost dim (Sklansky).
  double cumulative = weight;
#pragma unroll
  for (int m = 0; m < 5; ++m) {
    const int half = 1 << m;
    const int source = ((lane >> (m + 1)) << (m + 1)) + half - 1;
    const double other = __shfl_sync(0xffffffffu, cumulative, source);
    if (lane & half) cumulative = __dadd_rn(cumulative, other);
  }
  const double total = __shfl_sync(0xffffffffu, cumulative, num_candidates - 1);
  const double mass_before = __dsub_rn(cumulative, weight);
  bool keep = in_top_k && (top_p >= 1.0 || mass_before < __dmul_rn(top_p, total));
  keep = keep && log_ratio >= log(min_p);
  keep = keep || lane == 0;

  double race = -SAMPLING_INF_D;
  if (keep) {
    const unsigned int word = philox_word0(
        static_cast<unsigned int>(my_id), static_cast<unsigned int>(step),
        static_cast<unsigned int>(step >> 32), 0u,  // purpose RngPurpose.SAMPLE
        static_cast<unsigned int>(seed), static_cast<unsigned int>(seed >> 32));
    const double u = __dmul_rn(__dadd_rn(static_cast<double>(word), 0.5), 0x1p-32);
    race = __dsub_rn(log_ratio, log(-log(u)));
  }
  int best_lane = lane;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {  // argmax, the lowest lane on ties
    const double other = __shfl_xor_sync(0xffffffffu, race, offset);
    const int other_lane = __shfl_xor_sync(0xffffffffu, best_lane, offset);
    if (other > race || (other == race && other_lane < best_lane)) {
      race = other;
      best_lane = other_lane;
    }
  }
  const int drawn = __shfl_sync(0xffffffffu, my_id, best_lane);
  const int first = __shfl_sync(0xffffffffu, my_id, 0);
  if (lane == 0) out[row] = greedy ? first : drawn;
}

// sampling_uniforms: rng.counter_uniforms in one launch, out[b, n] = (word 0 of Philox with
// counter (lanes[b, n], step lo, step hi, purpose) and key (seed lo, seed hi)) + 0.5) * 2**-32
// in float64 (exact), where the torch form stacks counters and keys in a dozen small kernels
// around the Philox launch. seeds and steps are read with element strides (columns of the
// row ints), lanes [B, N] with a row stride; lane ids are below 2**32.
__global__ void __launch_bounds__(128)
    sampling_uniforms(double* __restrict__ out, const long long* __restrict__ seeds,
                      long long seeds_stride, const long long* __restrict__ steps,
                      long long steps_stride, const long long* __restrict__ lanes,
                      long long lanes_stride, int num_rows, int num_lanes,
                      unsigned int purpose) {
  pdl_begin();
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<long long>(num_rows) * num_lanes) return;
  const int b = static_cast<int>(i / num_lanes);
  const int n = static_cast<int>(i - static_cast<long long>(b) * num_lanes);
  const unsigned long long seed = static_cast<unsigned long long>(seeds[b * seeds_stride]);
  const unsigned long long step = static_cast<unsigned long long>(steps[b * steps_stride]);
  const unsigned int lane = static_cast<unsigned int>(lanes[b * lanes_stride + n]);
  const unsigned int word = philox_word0(lane, static_cast<unsigned int>(step),
                                         static_cast<unsigned int>(step >> 32), purpose,
                                         static_cast<unsigned int>(seed),
                                         static_cast<unsigned int>(seed >> 32));
  out[i] = __dmul_rn(__dadd_rn(static_cast<double>(word), 0.5), 0x1p-32);
}

// Philox4x32-10 words for n (counter, key) pairs, so the GPU tests can pin the kernel's RNG to
// Random123's known answers and to rng.py.
__global__ void sampling_philox(unsigned int* __restrict__ out,
                                const unsigned int* __restrict__ counters,
                                const unsigned int* __restrict__ keys, int n) {
  pdl_begin();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned int c0 = counters[4 * i], c1 = counters[4 * i + 1];
  unsigned int c2 = counters[4 * i + 2], c3 = counters[4 * i + 3];
  philox4x32_10(c0, c1, c2, c3, keys[2 * i], keys[2 * i + 1]);
  out[4 * i] = c0;
  out[4 * i + 1] = c1;
  out[4 * i + 2] = c2;
  out[4 * i + 3] = c3;
}
