// Shared by the tensor-core GEMVs (fp8_gemv.cu's fp8_tc_gemv and bf16_tc_gemv.cu), compiled
// between common.cu and the op's source: the 8-warp, 128-row block's reduction of its k splits
// (through a cluster's distributed shared memory, or in the flat form through an fp32 workspace),
// and the cp.async weight ring's copies.
//
// Both kernels give each thread block 128 weight rows (warp w: rows 16w .. 16w + 15, lane (g, t)
// = (lane / 4, lane % 4) on rows g and g + 8) and each k block 128 bytes of every row, which lane
// (g, t) reads as 16 bytes at 16t and at 64 + 16t of its two rows.

namespace tcg {
constexpr int kThreads = 256;    // 8 warps x 16 rows
constexpr int kRedStride = 132;  // floats per column of the partial-sum tile

__device__ __forceinline__ unsigned int cluster_rank() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// A float in the shared memory of cluster block `rank`, at the same offset as `p` here.
__device__ __forceinline__ float ld_cluster(const float* p, unsigned int rank) {
  unsigned int local, remote;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(local) : "l"(p));
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

// The block's partial sums [x row][row in block] into `red`; then split r adds slice r of all S
// splits of its cluster (fixed order: deterministic) and stores it. Every block of the cluster
// must call it (it holds two cluster barriers for S > 1).
template <typename T, int M, int S>
__device__ __forceinline__ void reduce_store(T* __restrict__ out, float* red, const float (&acc)[4],
                                             int rb, int split, int n, int warp, int g, int t) {
  const int r0 = warp * 16 + g;
  red[(2 * t) * kRedStride + r0] = acc[0];
  red[(2 * t + 1) * kRedStride + r0] = acc[1];
  red[(2 * t) * kRedStride + r0 + 8] = acc[2];
  red[(2 * t + 1) * kRedStride + r0 + 8] = acc[3];
  if constexpr (S == 1) {
    __syncthreads();
  } else {
    cluster_sync();
  }
  constexpr int kSlice = 128 / S;
  for (int i = threadIdx.x; i < M * kSlice; i += kThreads) {
    const int col = i / kSlice;
    const int rl = split * kSlice + (i - col * kSlice);
    const float* cell = red + col * kRedStride + rl;
    float total;
    if constexpr (S == 1) {
      total = *cell;
    } else {
      total = 0.0f;
#pragma unroll
      for (int q = 0; q < S; ++q) total += ld_cluster(cell, q);
    }
    const int row = rb * 128 + rl;
    if (row < n) out[static_cast<long long>(col) * n + row] = from_float<T>(total);
  }
  if constexpr (S > 1) cluster_sync();  // no block leaves while its partials are being read
}

// The flat form of reduce_store (no cluster; S > 1): the S splits of a row block are plain blocks
// of one grid. Each writes its partial sums [x row][128 rows] to its own slot of `partials` (fp32,
// through L2) and counts itself into counters[rb]; the last to arrive adds the S slots in split
// order (the order, hence the bits, of reduce_store's cluster read), stores the row block and sets
// the counter back to zero for the next launch. One workspace serves launches that do not overlap:
// a PDL-chained launch reaches this only after pdl_wait (its predecessor grid has completed).
template <typename T, int M, int S>
__device__ __forceinline__ void reduce_store_flat(T* __restrict__ out, float* __restrict__ partials,
                                                  int* __restrict__ counters, const float (&acc)[4],
                                                  int rb, int split, int n, int warp, int g, int t) {
  static_assert(S > 1, "one split stores through reduce_store<T, M, 1>");
  constexpr int kSlot = M * 128;
  __shared__ int last;
  float* mine = partials + (static_cast<long long>(rb) * S + split) * kSlot;
  const int r0 = warp * 16 + g;
  const int c0 = 2 * t, c1 = 2 * t + 1;  // the fragment's x rows; columns >= M are duplicates
  if (c0 < M) {
    mine[c0 * 128 + r0] = acc[0];
    mine[c0 * 128 + r0 + 8] = acc[2];
  }
  if (c1 < M) {
    mine[c1 * 128 + r0] = acc[1];
    mine[c1 * 128 + r0 + 8] = acc[3];
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(counters + rb, 1);
    last = arrived == S - 1;
    if (last) counters[rb] = 0;  // every split has counted: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const float* slots = partials + static_cast<long long>(rb) * S * kSlot;
  for (int e = threadIdx.x; e < kSlot; e += kThreads) {
    float total = 0.0f;
#pragma unroll
    for (int q = 0; q < S; ++q) total += __ldcg(slots + q * kSlot + e);
    const int row = rb * 128 + (e & 127);
    if (row < n) out[static_cast<long long>(e >> 7) * n + row] = from_float<T>(total);
  }
}

// The reduction of either form: FLAT (and S > 1) through the workspace, else the cluster's.
template <typename T, int M, int S, bool FLAT>
__device__ __forceinline__ void reduce_store_any(T* __restrict__ out, float* red, float* partials,
                                                 int* counters, const float (&acc)[4], int rb,
                                                 int split, int n, int warp, int g, int t) {
  if constexpr (FLAT && S > 1) {
    reduce_store_flat<T, M, S>(out, partials, counters, acc, rb, split, n, warp, g, t);
  } else {
    reduce_store<T, M, S>(out, red, acc, rb, split, n, warp, g, t);
  }
}

// A block's row block and k split: the cluster form's splits are its cluster ranks, the flat
// form's consecutive blocks.
template <int S, bool FLAT>
__device__ __forceinline__ int split_of_block() {
  if constexpr (S == 1) {
    return 0;
  } else if constexpr (FLAT) {
    return static_cast<int>(blockIdx.x % S);
  } else {
    return static_cast<int>(cluster_rank());
  }
}

// cp.async of 16 bytes into shared memory, bypassing L1 (zero-filled when !ok; src stays a
// valid address either way).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Copy k block kb of lane (g, t)'s rows (w_g, w_g8: row starts; bytes past row_bytes, or a row
// past N, are zero-filled) into its ring slot: uint4 [4][kThreads], thread tid's 64 bytes at
// [j][tid] (a warp's 16-byte accesses are consecutive: no bank conflicts). row_bytes % 16 == 0,
// so a 16-byte piece is all in or all out.
__device__ __forceinline__ void issue_tile(uint4* slot, int tid, const unsigned char* w_g,
                                           const unsigned char* w_g8, bool ok_g, bool ok_g8,
                                           int kb, int t, int row_bytes) {
  const int off0 = kb * 128 + 16 * t;
  const int off1 = off0 + 64;
  const bool in0 = off0 < row_bytes, in1 = off1 < row_bytes;
  cp_async16(slot + tid, w_g + (ok_g && in0 ? off0 : 0), ok_g && in0);
  cp_async16(slot + kThreads + tid, w_g + (ok_g && in1 ? off1 : 0), ok_g && in1);
  cp_async16(slot + 2 * kThreads + tid, w_g8 + (ok_g8 && in0 ? off0 : 0), ok_g8 && in0);
  cp_async16(slot + 3 * kThreads + tid, w_g8 + (ok_g8 && in1 ? off1 : 0), ok_g8 && in1);
}
}  // namespace tcg
