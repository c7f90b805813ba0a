// norm_row: add_rms_norm_vec's arithmetic for one bf16 row, run by a block of BLOCK threads on
// behalf of the VT threads add_rms_norm_vec would launch for that row (BLOCK and VT multiples of
// 32, VT <= 2 * BLOCK). A kernel that norms rows as one step of its own (mtp_front) calls it
// instead of leaving the rows to more launches, and gets that launch's bits: virtual thread t
// sums the squares of the same vectors in the same order (c * VT + t, c < CHUNKS, then the 8
// elements), each virtual warp's butterfly sees the same 32 values, and the warp totals meet in
// shared memory and one more butterfly exactly as block_sum's do.
//
// y: the row (read at L2, __ldcg: it may have been written by another block of the caller);
// residual / summed_out only with HAS_RESIDUAL (summed = y + residual, rounded to bf16 as torch's
// add); out = summed * rsqrt(mean(summed^2) + eps) * (1 + w). n % 8 == 0, every pointer 16-byte
// aligned (the caller's launcher checks). Called by every thread of the block.
//
// Also tried (stop 40): the bf16 GEMV's last block running it for the norm after a projection
// (one launch per norm fewer). On an H100 the 27B batch-1 step took 1.025x and the 35B-A3B's
// 1.011x: the fence, the completion count and this serial tail cost more than the kernel
// boundary they saved (docs/perf.md, run S40B), so that form was removed.

template <int BLOCK, bool HAS_RESIDUAL, int CHUNKS, int VT>
__device__ __forceinline__ void add_rms_norm_row(bf16* __restrict__ out, bf16* __restrict__ summed_out,
                                              const bf16* y, const bf16* __restrict__ residual,
                                              const bf16* __restrict__ weight, int n, float eps) {
  static_assert(BLOCK % 32 == 0 && VT % 32 == 0 && VT <= 2 * BLOCK, "whole warps, two per thread");
  constexpr int PER = (VT + BLOCK - 1) / BLOCK;  // virtual threads per thread
  constexpr int V = 8;                           // bf16 per 16-byte vector
  __shared__ float warp_totals[32];
  const int num_vecs = n / V;
  const int lane = threadIdx.x & 31;
  // the summed value of vector idx, element j (recomputed in the second pass: the same bits)
  auto summed = [&](int idx, float (&s)[V], bool store) {
    const uint4 yu = __ldcg(reinterpret_cast<const uint4*>(y) + idx);
    const bf16* ye = reinterpret_cast<const bf16*>(&yu);
    if constexpr (HAS_RESIDUAL) {
      const uint4 ru = reinterpret_cast<const uint4*>(residual)[idx];
      const bf16* re = reinterpret_cast<const bf16*>(&ru);
      uint4 su;
      bf16* se = reinterpret_cast<bf16*>(&su);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        se[j] = from_float<bf16>(to_float(ye[j]) + to_float(re[j]));  // rounded as torch's add
        s[j] = to_float(se[j]);
      }
      if (store) reinterpret_cast<uint4*>(summed_out)[idx] = su;
    } else {
#pragma unroll
      for (int j = 0; j < V; ++j) s[j] = to_float(ye[j]);
    }
  };
  __syncthreads();  // warp_totals may still be read for the previous row
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const int vt = p * BLOCK + threadIdx.x;
    if (vt < VT) {  // whole warps: VT and BLOCK are multiples of 32
      float sq = 0.0f;
#pragma unroll
      for (int c = 0; c < CHUNKS; ++c) {
        const int idx = c * VT + vt;
        if (idx < num_vecs) {
          float s[V];
          summed(idx, s, true);
#pragma unroll
          for (int j = 0; j < V; ++j) sq += s[j] * s[j];
        }
      }
      sq = warp_sum(sq);
      if (lane == 0) warp_totals[vt >> 5] = sq;
    }
  }
  __syncthreads();
  const float total = warp_sum(lane < VT / 32 ? warp_totals[lane] : 0.0f);
  const float inv = rsqrtf(total / static_cast<float>(n) + eps);
  const uint4* wr = reinterpret_cast<const uint4*>(weight);
#pragma unroll
  for (int p = 0; p < PER; ++p) {
    const int vt = p * BLOCK + threadIdx.x;
    if (vt >= VT) continue;
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) {
      const int idx = c * VT + vt;
      if (idx < num_vecs) {
        float s[V];
        summed(idx, s, false);
        const uint4 wu = wr[idx];
        const bf16* we = reinterpret_cast<const bf16*>(&wu);
        uint4 ou;
        bf16* oe = reinterpret_cast<bf16*>(&ou);
#pragma unroll
        for (int j = 0; j < V; ++j) oe[j] = from_float<bf16>((s[j] * inv) * (1.0f + to_float(we[j])));
        reinterpret_cast<uint4*>(out)[idx] = ou;
      }
    }
  }
}
