// int4_gemv: the `--lm-head-draft` shortlist head's logits straight from its packed 4-bit rows.
//
// out[m, r] = sum_g scale[r, g] * (sum_{h in group g} q[r, h] * float(x[m, h])), fp32 out [M, R],
// for M = 1..8 rows of x (fp32 or bf16, converted to fp32 in registers). W: packed uint8 [R, H/2],
// weight 2i in the low nibble of byte i and 2i + 1 in the high one, each stored as q + 8 (q in
// -8..7); scale: fp32 [R, H/64], one per symmetric group of 64 along H. H % 64 == 0.
//
// Layout and why. The op is a stream over R * H / 2 bytes of nibbles plus R * H / 16 bytes of
// scales (131,072 x 5120: 335 MB + 42 MB) that no other warp reads, against an x of at most
// 8 x 5120 values that every warp reads; so the weights go through 16-byte non-allocating loads
// (ld.global.nc.L1::no_allocate: read once, kept out of L1, where x lives) and x through __ldg.
// - A warp owns ROWS consecutive rows. Per step lane l loads 16 bytes (32 weights: half of one
//   scale group) of each of its rows, chunk c = l + 32 * step, plus the 4-byte scale of that
//   chunk's group; all ROWS weight and scale loads are issued before any is used, so a lane has
//   ROWS * 20 bytes in flight and a warp reads ROWS contiguous 512-byte spans (coalesced).
// - Nibble k (bits 4k..4k+3) of a 32-bit word is weight k of the word's 8. It is decoded exactly
//   to fp32 without conversion instructions: or-ing it (masked in place, k <= 3) into the
//   exponent of 2^23 gives the float 2^23 + n * 16^k exactly, and one FMA by 16^-k minus
//   (2^(23 - 4k) + 8) gives n - 8 = q exactly (one shift per word brings nibbles 4..7 down):
//   ~2.1 integer/fp32 ops per weight, where I2F would run at a quarter of the FMA rate.
// - Each 32-term partial sum q * x per (row, x row) is accumulated in fp32 and multiplied by the
//   group's scale once (the two halves of a group, on lanes 2i and 2i + 1, each scale their own
//   half); the warp reduces each (row, x row) sum at the end and lanes 0..ROWS-1 write them.
// Cost model (estimate, not measured): per weight ~2.1 decode ops + M FMAs + M/16 x loads
// (fp32 x). M = 1: ~3.2 issue slots per weight, under the ~90 us the 377 MB take at ~4.2 TB/s,
// so the kernel should run at close to the device bandwidth. M = 8: ~10.6 slots per weight,
// FMA-bound (~200 us on an H200), x traffic from L1 (1 KiB per lane-step of fp32 x against 64 B
// of weights) close to the L1 limit as well: a tensor-core variant is what would take M = 8 (and
// more rows per launch) back to the memory bound.

__device__ __forceinline__ float int4_ld_scale(const float* p) {
  float v;
  asm("ld.global.nc.L1::no_allocate.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

// The 8 weights of one 32-bit word of packed nibbles as exact fp32 values q = n - 8.
__device__ __forceinline__ void int4_decode8(unsigned int w, float (&q)[8]) {
  const unsigned int hi = w >> 16;  // nibbles 4..7 at bits 0..15
  const unsigned int halves[2] = {w, hi};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned int v = halves[h];
    // 2^23 + n * 16^k (exact: n * 16^k < 2^16), then * 16^-k - (2^(23 - 4k) + 8) = n - 8
    q[4 * h + 0] = __uint_as_float((v & 0x000fu) | 0x4b000000u) - 8388616.0f;
    q[4 * h + 1] = fmaf(__uint_as_float((v & 0x00f0u) | 0x4b000000u), 0.0625f, -524296.0f);
    q[4 * h + 2] = fmaf(__uint_as_float((v & 0x0f00u) | 0x4b000000u), 0.00390625f, -32776.0f);
    q[4 * h + 3] = fmaf(__uint_as_float((v & 0xf000u) | 0x4b000000u), 0.000244140625f, -2056.0f);
  }
}

// 8 consecutive x values as fp32 (rows 16-byte aligned, h0 a multiple of 8).
__device__ __forceinline__ void int4_load_x8(const float* p, float (&xv)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p) + 1);
  xv[0] = a.x;
  xv[1] = a.y;
  xv[2] = a.z;
  xv[3] = a.w;
  xv[4] = b.x;
  xv[5] = b.y;
  xv[6] = b.z;
  xv[7] = b.w;
}

__device__ __forceinline__ void int4_load_x8(const bf16* p, float (&xv)[8]) {
  const uint4 u = __ldg(reinterpret_cast<const uint4*>(p));
  const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    xv[2 * j] = __uint_as_float(w[j] << 16);
    xv[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
  }
}

__device__ __forceinline__ unsigned int int4_word(const uint4& u, int j) {
  return j == 0 ? u.x : j == 1 ? u.y : j == 2 ? u.z : u.w;
}

// Grid: ceil(R / (4 * ROWS)) blocks of 128 threads (4 warps, ROWS rows each).
template <typename T, int M, int ROWS>
__global__ void __launch_bounds__(128) int4_gemv(
    float* __restrict__ out, const T* __restrict__ x, long long x_stride,
    const unsigned char* __restrict__ packed, const float* __restrict__ scale, int rows,
    int hidden) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  if (row0 >= rows) return;
  const int chunks = hidden >> 5;  // 16-byte chunks (32 weights) per row
  const int groups = hidden >> 6;
  const unsigned char* wrow[ROWS];
  const float* srow[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = row0 + r < rows ? row0 + r : rows - 1;  // past R: computed, never stored
    wrow[r] = packed + static_cast<long long>(row) * (hidden >> 1);
    srow[r] = scale + static_cast<long long>(row) * groups;
  }
  float acc[M][ROWS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;

  for (int c = lane; c < chunks; c += 32) {
    uint4 u[ROWS];
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      u[r] = ld_stream16(wrow[r] + 16 * c);
      s[r] = int4_ld_scale(srow[r] + (c >> 1));
    }
    float part[M][ROWS];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) part[m][r] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // word j: weights 32c + 8j .. 32c + 8j + 7
      float q[ROWS][8];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) int4_decode8(int4_word(u[r], j), q[r]);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float xv[8];
        int4_load_x8(x + m * x_stride + 32 * c + 8 * j, xv);
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) part[m][r] = fmaf(q[r][i], xv[i], part[m][r]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[m][r] = fmaf(part[m][r], s[r], acc[m][r]);
  }

#pragma unroll
  for (int m = 0; m < M; ++m) {
    float mine = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float total = warp_sum(acc[m][r]);
      if (lane == r) mine = total;
    }
    if (lane < ROWS && row0 + lane < rows) out[static_cast<long long>(m) * rows + row0 + lane] = mine;
  }
}
