// bf16_mma_gemv: a tensor-core "skinny GEMM" for decode-sized dense projections, y = x @ W^T with
// x: bf16 [M, K] (M = 1..64 rows: decode batches, speculative verify steps), W: bf16 [N, K]
// contiguous, K % 8 == 0; fp32 accumulation, one rounding of each output to bf16 (out: [M, N]).
// The dense analogue of expert_group_mma (expert_gemv.cu): one "expert" and all M rows of x as the
// mma's B operand. Compile-checked only; not routed until measured (launch.py: ROUTE_ROWS).
//
// Why. At M = 64 cuBLAS streams the 27B's weights at ~3.55 TB/s where the device copies at ~4.2;
// the products are ~64 flop per weight byte, far under the tensor cores' rate, so a kernel whose
// lanes do nothing per weight but load it and feed mma.sync should sit at the load bound.
//
// Layout. Grid (row tiles, K splits), 8 warps. Warp w of row tile b owns MT m-tiles of 16 weight
// rows, row0_i = 128 MT b + 16 (MT w + i), as the mma's A (M = 16 rows), and all x rows as B:
// x row m is column m % 8 of n-tile m / 8 (NT = ceil(M / 8) n-tiles, accumulators 4 NT MT floats
// per lane). Block (b, z) takes the K range of split z: chunks [z C, (z + 1) C) of kChunk = 128
// (C = split_chunks), cut at K. With one split the block rounds and stores its outputs; with more
// it stores fp32 partials [splits, M, N] and the last block of the row tile to finish (a counter
// per tile, atomicInc, which leaves it at zero again) adds the partials in split order 0, 1, ...
// and stores the bf16 result, so the sum does not depend on which block finishes last.
//
// Staging. x is too large for shared memory at 64 rows (K = 5,120: 640 KiB), so it is staged one
// chunk of 128 k at a time, double buffered: rows of kChunk + kPad bf16 (320 bytes, 64 mod 128, so
// the two rows a quarter-warp's 16-byte loads touch fall on distinct banks), 8 NT rows per buffer,
// 2 buffers = 5 NT KiB (40 KiB at NT = 8, within the 48 KiB a launch gets without opting in).
// cp.async (16 bytes per thread and piece, no registers) fetches chunk c + 1 while chunk c is
// multiplied; one barrier per chunk. Only the M real rows and the k below K are staged: columns
// >= M of the last n-tile read whatever the buffer holds (mma columns are independent, and those
// are never stored), and k >= K is zeroed in the registers (below).
//
// Fragment mapping (lane = 4 g + t), the one expert_group_mma documents: in step s (32 k from
// kb + 32 s) lane (g, t) reads 16 contiguous bytes, elements kb + 32 s + 8 t .. + 7, of
//   weight row row0_i + g      -> words w0..w3   (ld_stream16: read once, not kept in L1)
//   weight row row0_i + g + 8  -> words v0..v3
//   staged x row 8 nt + g      -> words x0..x3   (shared memory, element 32 (s % 4) + 8 t)
// and runs two mma per (m-tile, n-tile), h = 0, 1: a0 = w[2h], a1 = v[2h], a2 = w[2h + 1],
// a3 = v[2h + 1], b0 = x[2h], b1 = x[2h + 1] (k slot 2t + e is k 8t + 4h + e, slot 2t + 8 + e is
// 8t + 4h + 2 + e: A and B agree, and the two mma take each of the step's 32 k once). A lane's
// 8 elements are in range iff kb + 32 s + 8 t < ke (K % 8 == 0); out of range A and B are both
// zero (no NaN * 0 from an unstaged buffer). Rows past N re-read row N - 1 (computed, never
// stored). The x fragment of an n-tile is loaded once and used by all MT m-tiles.
// tests/unit/kernels/test_bf16_mma_gemv.py replays this lane by lane on the CPU.
//
// Loads. A ring of D steps: step s + D is issued into step s's slot right after s is multiplied,
// so between D - 1 and D steps (2 MT loads of 16 bytes each) are in flight per lane; the first D
// steps go out before the first chunk of x is staged. D divides the 4 steps of a chunk, so a
// step's ring slot is a compile-time index.
//
// Output. Accumulator c0, c1 of (m-tile i, n-tile nt) is row row0_i + g of x rows 8 nt + 2 t and
// + 1, c2, c3 the same for row + 8: 2-byte stores (4-byte fp32 partials), 8 consecutive outputs
// per x row and instruction. The output is M / K of the weight bytes (at most 3 % at M = 64,
// K >= 2,048), so it is not staged in shared memory for wider stores.

namespace bmg {
constexpr int kWarps = 8;                   // 256 threads
constexpr int kChunk = 128;                 // k per staged chunk of x
constexpr int kSteps = kChunk / 32;         // mma steps per chunk
constexpr int kPad = 32;                    // bf16 past kChunk per staged row
constexpr int kStride = kChunk + kPad;      // staged row: 320 bytes, 64 mod 128
constexpr int kPieces = kChunk / 8;         // 16-byte pieces per staged row

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, asynchronous (sm_80+), through L2 only.
__device__ __forceinline__ void cp16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src)
               : "memory");
}

// An fp32 another block wrote in this launch: from L2 (ld.global.cg), never a stale L1 line.
__device__ __forceinline__ float ld_l2(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// Chunk `c` of the block's K range (k from kc = kb + kChunk c, below ke) of the m rows of x into
// buffer `xs` ([8 NT][kStride]): piece (row, j) is 8 bf16 at kc + 8 j; pieces at or past ke are
// not copied.
__device__ __forceinline__ void stage_chunk(bf16* xs, const bf16* x, long long x_stride, int m,
                                            int kc, int ke) {
  for (int i = threadIdx.x; i < m * kPieces; i += kWarps * 32) {
    const int row = i / kPieces;
    const int j = i - row * kPieces;
    const int col = kc + 8 * j;
    if (col < ke) cp16(xs + row * kStride + 8 * j, x + row * x_stride + col);
  }
}

// Step s of the lane's MT m-tiles: 16 bytes of rows g and g + 8 each, zeros where the lane's
// elements are past the K range (`left` = ke - kb - 8 t; in range iff 32 s < left).
template <int MT>
__device__ __forceinline__ void load_step(uint4 (&a)[MT][2], const unsigned char* const (&lo)[MT],
                                          const unsigned char* const (&hi)[MT], int s, int left) {
  const bool ok = 32 * s < left;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    a[i][0] = ok ? ld_stream16(lo[i] + 64 * s) : zero;
    a[i][1] = ok ? ld_stream16(hi[i] + 64 * s) : zero;
  }
}
}  // namespace bmg

// NT: n-tiles of 8 x rows (M <= 8 NT); MT: m-tiles of 16 weight rows per warp (1 or 2); D: steps
// in the load ring (1, 2 or 4). Dynamic shared memory: 2 * 8 NT * kStride bf16 = 5 NT KiB.
// `partial`/`counters` are read only with more than one split (gridDim.y > 1): partial is fp32
// [gridDim.y, m, n], counters one int per row tile, zero before the launch and zero after it.
// Launch bounds: MT = 1 gets 128 registers (2 blocks per SM), MT = 2 255 (1 block per SM).
template <int NT, int MT, int D>
__global__ void __launch_bounds__(256, MT == 1 ? 2 : 1) bf16_mma_gemv(
    bf16* __restrict__ out, float* __restrict__ partial, unsigned int* __restrict__ counters,
    const bf16* __restrict__ x, long long x_stride, const bf16* __restrict__ w, int m, int n,
    int k, int split_chunks) {
  pdl_begin();
  using namespace bmg;
  static_assert(NT >= 1 && NT <= 8, "1..8 n-tiles of 8 x rows");
  static_assert(MT == 1 || MT == 2, "one or two m-tiles of 16 weight rows per warp");
  static_assert(D == 1 || D == 2 || D == 4, "the ring depth divides a chunk's 4 steps");
  extern __shared__ __align__(16) unsigned char mma_gemv_smem[];
  bf16* xs = reinterpret_cast<bf16*>(mma_gemv_smem);  // [2][8 NT][kStride]
  constexpr int kBuffer = 8 * NT * kStride;
  __shared__ int last_block;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int block_rows = kWarps * 16 * MT;
  const int warp_row0 = blockIdx.x * block_rows + warp * 16 * MT;
  const bool has_rows = warp_row0 < n;
  const int kb = blockIdx.y * split_chunks * kChunk;
  const int ke = min(kb + split_chunks * kChunk, k);
  const int steps = (ke - kb + 31) / 32;
  const int chunks = (ke - kb + kChunk - 1) / kChunk;
  const int left = ke - kb - 8 * t;

  const unsigned char* lo[MT];
  const unsigned char* hi[MT];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    const int r = warp_row0 + 16 * i + g;
    lo[i] = reinterpret_cast<const unsigned char*>(w + static_cast<long long>(min(r, n - 1)) * k +
                                                   kb + 8 * t);
    hi[i] = reinterpret_cast<const unsigned char*>(
        w + static_cast<long long>(min(r + 8, n - 1)) * k + kb + 8 * t);
  }
  uint4 a[D][MT][2];
  if (has_rows) {
#pragma unroll
    for (int p = 0; p < D; ++p)
      if (p < steps) load_step<MT>(a[p], lo, hi, p, left);
  }
  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][nt][c] = 0.0f;

  stage_chunk(xs, x, x_stride, m, kb, ke);
  cp_commit();
  for (int c = 0; c < chunks; ++c) {
    cp_wait<0>();  // cp_commit / cp_wait: common.cu
    __syncthreads();  // chunk c is staged; every warp is done with chunk c - 1's buffer
    if (c + 1 < chunks) {
      stage_chunk(xs + ((c + 1) & 1) * kBuffer, x, x_stride, m, kb + (c + 1) * kChunk, ke);
      cp_commit();
    }
    if (!has_rows) continue;  // still takes part in the barriers
    const bf16* xb = xs + (c & 1) * kBuffer + g * kStride + 8 * t;
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int s = c * kSteps + u;
      if (s >= steps) break;  // block-uniform
      const int slot = u % D;
      const bool ok = 32 * s < left;  // else A is zero and B must be too
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 xq = ok ? *reinterpret_cast<const uint4*>(xb + nt * 8 * kStride + 32 * u)
                            : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const uint4& wv = a[slot][i][0];
          const uint4& vv = a[slot][i][1];
          mma_16816<false>(acc[i][nt], wv.x, vv.x, wv.y, vv.y, xq.x, xq.y);
          mma_16816<false>(acc[i][nt], wv.z, vv.z, wv.w, vv.w, xq.z, xq.w);
        }
      }
      if (s + D < steps) load_step<MT>(a[slot], lo, hi, s + D, left);
    }
  }

  const bool split = gridDim.y > 1;
  if (has_rows) {
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      const int row = warp_row0 + 16 * i + g;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int mm = 8 * nt + 2 * t + e;
          if (mm >= m) continue;
          if (split) {
            float* p = partial + (static_cast<long long>(blockIdx.y) * m + mm) * n + row;
            if (row < n) p[0] = acc[i][nt][e];
            if (row + 8 < n) p[8] = acc[i][nt][2 + e];
          } else {
            bf16* o = out + static_cast<long long>(mm) * n + row;
            if (row < n) o[0] = from_float<bf16>(acc[i][nt][e]);
            if (row + 8 < n) o[8] = from_float<bf16>(acc[i][nt][2 + e]);
          }
        }
      }
    }
  }
  if (!split) return;
  // The last block of the row tile adds the splits' partials in split order (deterministic).
  __threadfence();  // this block's partials are visible device-wide before it is counted
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned int splits = gridDim.y;
    last_block = atomicInc(counters + blockIdx.x, splits - 1) == splits - 1;  // wraps to 0
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  const int row0 = blockIdx.x * block_rows;
  const int rows = min(block_rows, n - row0);
  for (int i = threadIdx.x; i < m * rows; i += kWarps * 32) {
    const int mm = i / rows;
    const int row = row0 + (i - mm * rows);
    float sum = 0.0f;
    for (int z = 0; z < static_cast<int>(gridDim.y); ++z)
      sum += ld_l2(partial + (static_cast<long long>(z) * m + mm) * n + row);
    out[static_cast<long long>(mm) * n + row] = from_float<bf16>(sum);
  }
}
