// Shared by the tensor-core GEMVs (fp8_gemv.cu's fp8_tc_gemv and bf16_tc_gemv.cu), compiled
// between common.cu and the op's source: the 8-warp, 128-row block's cluster reduction of its
// k splits through distributed shared memory, and the cp.async weight ring's copies.
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

// The same copy from a weight packed by fp8_gemv/tiles.py: k block kb of the row block is one
// contiguous 16 KiB tile laid out as the ring slot itself ([j][tid] 16-byte pieces), so a warp's
// copy reads 512 consecutive bytes and a block streams one contiguous run of tiles (the row-major
// copy reads 128 bytes of each of 128 rows a k block, K bytes apart). Rows past N and bytes past
// the row were zero-filled by the packing, so nothing is checked here.
__device__ __forceinline__ void issue_packed(uint4* slot, int tid, const unsigned char* tiles,
                                             int kb) {
  const uint4* tile = reinterpret_cast<const uint4*>(tiles + static_cast<long long>(kb) * 16384);
#pragma unroll
  for (int j = 0; j < 4; ++j) cp_async16(slot + j * kThreads + tid, tile + j * kThreads + tid, true);
}
}  // namespace tcg
