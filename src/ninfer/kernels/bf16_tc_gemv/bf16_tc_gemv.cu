// bf16_tc_gemv: out[m, n] = sum_k x[m, k] * W[n, k] for M = 1..8 bf16 x rows against a bf16
// W [N, K] (K % 8 == 0), fp32 accumulation, one rounding of each output to bf16. The bf16 twin of
// fp8_tc_gemv_ring (fp8_gemv.cu), compiled after fp8_gemv/tc_common.cu.
//
// Why: the decode GEMVs are bound by the weight stream; cuBLAS keeps the 27B's projections at
// 3.4-4.1 TB/s and launches without programmatic dependent launch, so its kernels neither
// overlap their predecessor's tail nor let the next kernel overlap theirs. Here every weight byte
// goes DRAM -> shared memory by cp.async (STAGES - 1 k blocks in flight per thread, no registers
// held, the first ones issued before pdl_wait) and feeds mma.m16n8k16 (bf16 in, fp32 accumulate)
// straight from the bytes each lane loaded, with no conversion.
//
// Layout: grid ceil(N / 128) * S blocks of 256 threads; the S k splits of a 128-row block form a
// cluster and add their partials through distributed shared memory (tcg::reduce_store:
// deterministic). A k block is 64 k = 128 bytes of a row; lane (g, t) of warp w copies 16 bytes
// at 16t and at 64 + 16t of rows 16w + g and 16w + g + 8 (tcg::issue_tile), i.e. k [8t, 8t + 8)
// and [32 + 8t, 40 + 8t) of the block. Inside one mma the k order is free as long as A and B
// agree, so mma h of a piece takes words (2h, 2h + 1) of the row-g and row-g+8 loads as A
// (k slots 2t, 2t + 1 <- real k 8t + 4h, +1; slots 2t + 8, 2t + 9 <- 8t + 4h + 2, +3) and the
// same words of x row g as B: x is read in its natural order, 16 bytes per lane and piece,
// through the read-only cache (a few KiB shared by every warp), so nothing is staged and there
// is no barrier in the main loop. Columns g >= M of B repeat row M - 1 (never stored). Bytes past
// K and rows past N are zero-filled by the copies, x past K is zero.
// tests/unit/kernels/test_bf16_tc_gemv_layout.py replays the lane mapping on the CPU.

// One k block of the lane's two rows: x's pieces at k0 and k0 + 32 (its row g, through the
// read-only cache; zero past K) loaded while the ring's copies land, then the lane's 64 bytes of
// its ring slot (row g pieces 0, 1; row g + 8 pieces 0, 1) fed to four mma as the header says.
template <int STAGES>
__device__ __forceinline__ void tile_mma(float (&acc)[4], const uint4* slot, const bf16* x_row,
                                         int k0, int k) {
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4 xa = k0 < k ? __ldg(reinterpret_cast<const uint4*>(x_row + k0)) : zero;
  const uint4 xb = k0 + 32 < k ? __ldg(reinterpret_cast<const uint4*>(x_row + k0 + 32)) : zero;
  cp_wait<STAGES - 1>();  // this thread's copies of this k block have landed
  const uint4 wg0 = slot[0], wg1 = slot[tcg::kThreads], wh0 = slot[2 * tcg::kThreads],
              wh1 = slot[3 * tcg::kThreads];
  mma_16816<false>(acc, wg0.x, wh0.x, wg0.y, wh0.y, xa.x, xa.y);
  mma_16816<false>(acc, wg0.z, wh0.z, wg0.w, wh0.w, xa.z, xa.w);
  mma_16816<false>(acc, wg1.x, wh1.x, wg1.y, wh1.y, xb.x, xb.y);
  mma_16816<false>(acc, wg1.z, wh1.z, wg1.w, wh1.w, xb.z, xb.w);
}

// PACKED: w is the row-major weight (false) or its tiles (true; fp8_gemv/tiles.py: each k block
// of a row block one contiguous 16 KiB run in the ring slot's order, zero-padded): the same bytes
// in the same ring slots, the same bits.
template <int M, int S, int STAGES, bool PACKED>
__global__ void __cluster_dims__(S, 1, 1) __launch_bounds__(tcg::kThreads, 3)
    bf16_tc_gemv(bf16* __restrict__ out, const bf16* __restrict__ x, long long x_stride,
                 const bf16* __restrict__ w, int n, int k, int k_blocks) {
  pdl_trigger();
  using namespace tcg;
  static_assert(STAGES >= 2 && STAGES * 4 * kThreads * 16 >= 8 * kRedStride * 4, "ring size");
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* ring = reinterpret_cast<uint4*>(smem);
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
  const int row_bytes = 2 * k;
  const unsigned char* w_g =
      reinterpret_cast<const unsigned char*>(w + static_cast<long long>(ok_g ? row_g : 0) * k);
  const unsigned char* w_g8 =
      reinterpret_cast<const unsigned char*>(w + static_cast<long long>(ok_g8 ? row_g + 8 : 0) * k);
  const bf16* x_row = x + static_cast<long long>(g < M ? g : M - 1) * x_stride;
  const unsigned char* tiles =
      reinterpret_cast<const unsigned char*>(w) + static_cast<long long>(rb) * k_blocks * 16384;
  auto issue = [&](int slot, int kb) {
    if constexpr (PACKED) {
      issue_packed(ring + slot * 4 * kThreads, tid, tiles, kb);
    } else {
      issue_tile(ring + slot * 4 * kThreads, tid, w_g, w_g8, ok_g, ok_g8, kb, t, row_bytes);
    }
  };

#pragma unroll
  for (int p = 0; p < STAGES - 1; ++p) {
    if (p < num_kb) issue(p, kb_begin + p);
    cp_commit();  // empty groups keep the wait count uniform
  }
  pdl_wait();  // x is the previous kernel's output

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < num_kb; ++i) {
    const int ahead = i + STAGES - 1;  // into the slot read at i - 1 (by this thread, done)
    if (ahead < num_kb) issue(ahead % STAGES, kb_begin + ahead);
    cp_commit();
    tile_mma<STAGES>(acc, ring + (i % STAGES) * 4 * kThreads + tid, x_row,
                     (kb_begin + i) * 64 + 8 * t, k);
  }
  cp_wait<0>();
  __syncthreads();  // the ring is free: the reduction tile may overwrite it
  reduce_store<bf16, M, S>(out, red, acc, rb, split, n, warp, g, t);
}
