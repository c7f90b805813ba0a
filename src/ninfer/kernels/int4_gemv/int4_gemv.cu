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

// A weight scale through the no-allocate path (a weight load: allowed before pdl_wait, test_pdl.py).
__device__ __forceinline__ float ld_weight_scale_nc(const float* p) {
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

// Chunk c (32 weights: half of one scale group) of ROWS rows into acc: per (x row, row) the 32
// products q * x summed in fp32, then scaled once by the group's scale (the two halves of a
// group, on lanes 2i and 2i + 1, each scale their own half).
template <typename T, int M, int ROWS>
__device__ __forceinline__ void int4_chunk(float (&acc)[M][ROWS], const uint4 (&u)[ROWS],
                                           const float (&s)[ROWS], const T* __restrict__ x,
                                           long long x_stride, int c) {
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

// The warp's sums of acc to out [M, rows]: lane r writes row row0 + r (rows past R: not stored).
template <int M, int ROWS>
__device__ __forceinline__ void int4_store(float* __restrict__ out, float (&acc)[M][ROWS],
                                           int lane, int row0, int rows) {
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

// Each of a warp's ROWS rows' packed bytes and scales (rows past R re-read row R - 1: computed,
// never stored).
template <int ROWS>
__device__ __forceinline__ void int4_rows(const unsigned char* (&wrow)[ROWS],
                                          const float* (&wscale)[ROWS],
                                          const unsigned char* packed, const float* scale,
                                          int row0, int rows, int hidden) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = row0 + r < rows ? row0 + r : rows - 1;
    wrow[r] = packed + static_cast<long long>(row) * (hidden >> 1);
    wscale[r] = scale + static_cast<long long>(row) * (hidden >> 6);
  }
}

// Grid: ceil(R / (4 * ROWS)) blocks of 128 threads (4 warps, ROWS rows each).
template <typename T, int M, int ROWS>
__global__ void __launch_bounds__(128) int4_gemv(
    float* __restrict__ out, const T* __restrict__ x, long long x_stride,
    const unsigned char* __restrict__ packed, const float* __restrict__ scale, int rows,
    int hidden) {
  pdl_begin();
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  if (row0 >= rows) return;
  const int chunks = hidden >> 5;  // 16-byte chunks (32 weights) per row
  const unsigned char* wrow[ROWS];
  const float* srow[ROWS];
  int4_rows<ROWS>(wrow, srow, packed, scale, row0, rows, hidden);
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
      s[r] = ld_weight_scale_nc(srow[r] + (c >> 1));
    }
    int4_chunk<T, M, ROWS>(acc, u, s, x, x_stride, c);
  }
  int4_store<M, ROWS>(out, acc, lane, row0, rows);
}

// ================================================================================================
// int4_mma: the same product on tensor cores for bf16 x, 1..64 rows (GPU tests and timings: run
// V1 in docs/perf.md). out[m, r] as above, fp32 [M, R]; x bf16 [M, H] with dense 16-byte-aligned
// rows. Grid: ceil(R / 128) blocks of 8 warps; warp w owns weight rows [16w, 16w + 16) of its
// block and runs mma.m16n8k16 (bf16 in, fp32 accumulate) with those rows as A and NT n-tiles of
// 8 x rows as B (NT = ceil(M / 8); B columns >= M are zeros in shared memory, never stored).
//
// Operands. q = n - 8 in -8..7 is exact in bf16, and so is bf16 x, so every product is exact; a
// zeroed fragment takes the four mma of one 64-wide scale group, then acc += frag * scale in fp32
// (the fixup, per group as the twin). Nibbles to bf16 without conversion instructions: or-ing a
// nibble n into the mantissa of bf16 128 (0x4300) gives 128 + n exactly, and one bf16x2 fma
// (* 1 - 136) gives n - 8 exactly. A word of 8 packed weights (nibble j = weight j) yields the
// pairs (0, 4), (1, 5), (2, 6), (3, 7) as bf16x2 with one shift and one lop3 each (mask 0x000f000f).
//
// k permutation. Inside one mma the k order is free as long as A and B agree, and each mma must
// stay inside one scale group, so lane (g, t) loads 8 contiguous bytes (16 weights: k = 16t ..
// 16t + 15 of the group) of each of its rows g and g + 8 per group (4 lanes: one 32-byte sector
// per row). mma i (0..3) of a group takes word u = i / 2 of those bytes and the pairs (p0, p1) =
// (0, 1) for even i, (2, 3) for odd i: a0 / a1 = pair p0 of rows g / g + 8, a2 / a3 = pair p1.
// So B register b0 of lane (n, t) must hold x[16t + 8u + p0], x[16t + 8u + p0 + 4] and b1 the same
// for p1: x is staged per 8 values in the order 0 4 1 5 2 6 3 7 (two prmt per 8 values), and a
// lane reads its 16 staged values of a group and n-tile with two 16-byte shared loads.
//
// Shared memory: x is staged in chunks of KC groups (KC * NT <= 32: 32 KiB at most, static), two
// __syncthreads per chunk; a staged row is KC * 128 + 16 bytes so that the 8 lanes of one
// 16-byte-load phase (g = 0, 1; t = 0..3) hit distinct banks. Weights stream through a register
// ring of D + 1 groups (16 bytes + 2 scales per lane per group), D groups loaded ahead.
//
// Cost model (estimate, not measured), 131,072 x 5120: the stream is 377 MB as for int4_gemv;
// per group and warp ~1.4 integer/bf16 ops per weight to decode once, then per n-tile 4 mma,
// 4 FMA and 2 LDS.128. M <= 8 should run at the memory bound like int4_gemv at M = 1; M = 64
// (NT = 8) is bounded by shared-memory loads and mma issue, ~100-170 us, against ~335 us for
// F.linear over the 1.34 GB of bf16 rows. The fragment mapping, the nibble decode and the
// staging order are emulated on the CPU in tests/unit/kernels/test_int4_mma_layout.py.
// ================================================================================================

namespace int4mma {
constexpr int kThreads = 256;  // 8 warps x 16 rows

// 8 bytes of a read-once stream (one sector per 4 lanes), no L1 allocation, 256-byte L2 prefetch.
__device__ __forceinline__ uint2 ld_stream8(const unsigned char* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];"
      : "=r"(v.x), "=r"(v.y)
      : "l"(p));
  return v;
}

// Nibbles P and P + 4 of w (weights P, P + 4 of the word) as exact bf16x2 q = n - 8.
template <int P>
__device__ __forceinline__ unsigned int nibble_pair(unsigned int w) {
  unsigned int v;
  // (w >> 4P) & 0x000f000f | 0x43004300: bf16 128 + n in each half (lop3: (a & b) | c)
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(w >> (4 * P)), "r"(0x000f000fu),
      "r"(0x43004300u));
  unsigned int q;  // (128 + n) * 1 - 136
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(q) : "r"(v), "r"(0x3f803f80u), "r"(0xc308c308u));
  return q;
}

// One group's raw operands for lane (g, t): 8 bytes of rows g and g + 8, and their two scales.
struct Group {
  uint2 wg, wg8;
  float sg, sg8;
};

// L1S: the scales through L1 (__ldg). A warp's scale load touches 8 rows, one 32-byte sector
// each for 4 bytes, where the sector holds the next 7 groups' scales too: without L1 every group
// fetches those sectors from L2 again (as many sector requests as the weights make), with L1
// the next 7 groups hit. The same values either way. On by default (launch.py); run S41A (H100,
// the 27B shortlist, 131,072 x 5,120) had int4_mma at 162 against 187 µs for 1-2 x rows and 179
// against 199 for 8 with it; `NINFER_KERNELS_OFF=int4_mma_l1_scales` keeps the L2-only loads.
template <bool L1S>
__device__ __forceinline__ void load_group(Group& b, const unsigned char* w_g,
                                           const unsigned char* w_g8, const float* s_g,
                                           const float* s_g8, int kg, int t) {
  b.wg = ld_stream8(w_g + 32 * kg + 8 * t);
  b.wg8 = ld_stream8(w_g8 + 32 * kg + 8 * t);
  b.sg = L1S ? ld_weight_scale(s_g + kg) : ld_weight_scale_nc(s_g + kg);
  b.sg8 = L1S ? ld_weight_scale(s_g8 + kg) : ld_weight_scale_nc(s_g8 + kg);
}

// Stage x[:, groups kg0 .. kg0 + num) as bf16, each 8 values as 0 4 1 5 2 6 3 7; rows M .. 8 NT
// as zeros. One thread per 8 values (a 16-byte __ldg, two prmt pairs, a 16-byte shared store).
template <int NT, int KC>
__device__ __forceinline__ void stage_x(unsigned short* xs, const bf16* x, long long x_stride,
                                        int num_x, int kg0, int num) {
  constexpr int kRow = KC * 64 + 8;  // bf16 per staged row
  const int per_row = num * 8;       // 8-value pieces per row of the chunk
  for (int i = threadIdx.x; i < 8 * NT * per_row; i += kThreads) {
    const int m = i / per_row;
    const int piece = i - m * per_row;
    uint4 o = make_uint4(0, 0, 0, 0);
    if (m < num_x) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(x + m * x_stride + kg0 * 64) + piece);
      asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(o.x) : "r"(u.x), "r"(u.z));  // x0 x4
      asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(o.y) : "r"(u.x), "r"(u.z));  // x1 x5
      asm("prmt.b32 %0, %1, %2, 0x5410;" : "=r"(o.z) : "r"(u.y), "r"(u.w));  // x2 x6
      asm("prmt.b32 %0, %1, %2, 0x7632;" : "=r"(o.w) : "r"(u.y), "r"(u.w));  // x3 x7
    }
    *reinterpret_cast<uint4*>(xs + m * kRow + 8 * piece) = o;
  }
}

// One group of the warp's 16 rows against NT n-tiles: decode once, 4 mma per n-tile into a zeroed
// fragment, then the fixup with the rows' scales.
template <int NT, int KC>
__device__ __forceinline__ void compute_group(float (&acc)[NT][4], const Group& b,
                                              const unsigned short* x_lane) {
  constexpr int kRow = KC * 64 + 8;
  unsigned int a[4][4];
  const unsigned int wg[2] = {b.wg.x, b.wg.y};
  const unsigned int wg8[2] = {b.wg8.x, b.wg8.y};
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    a[2 * u][0] = nibble_pair<0>(wg[u]);
    a[2 * u][1] = nibble_pair<0>(wg8[u]);
    a[2 * u][2] = nibble_pair<1>(wg[u]);
    a[2 * u][3] = nibble_pair<1>(wg8[u]);
    a[2 * u + 1][0] = nibble_pair<2>(wg[u]);
    a[2 * u + 1][1] = nibble_pair<2>(wg8[u]);
    a[2 * u + 1][2] = nibble_pair<3>(wg[u]);
    a[2 * u + 1][3] = nibble_pair<3>(wg8[u]);
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const uint4 x0 = *reinterpret_cast<const uint4*>(x_lane + nt * 8 * kRow);      // mma 0, 1
    const uint4 x1 = *reinterpret_cast<const uint4*>(x_lane + nt * 8 * kRow + 8);  // mma 2, 3
    const unsigned int xb[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float frag[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      mma_16816<false>(frag, a[i][0], a[i][1], a[i][2], a[i][3], xb[2 * i], xb[2 * i + 1]);
    acc[nt][0] = fmaf(frag[0], b.sg, acc[nt][0]);
    acc[nt][1] = fmaf(frag[1], b.sg, acc[nt][1]);
    acc[nt][2] = fmaf(frag[2], b.sg8, acc[nt][2]);
    acc[nt][3] = fmaf(frag[3], b.sg8, acc[nt][3]);
  }
}
}  // namespace int4mma

// NT = ceil(num_x / 8) n-tiles (1..8), D groups loaded ahead, L1S as load_group's. Grid:
// ceil(R / 128) blocks of 256.
template <int NT, int D, bool L1S = false>
__global__ void __launch_bounds__(int4mma::kThreads) int4_mma(
    float* __restrict__ out, const bf16* __restrict__ x, long long x_stride, int num_x,
    const unsigned char* __restrict__ packed, const float* __restrict__ scale, int rows,
    int hidden) {
  pdl_begin();
  using namespace int4mma;
  constexpr int KC = 32 / NT;  // groups of x staged per chunk
  constexpr int kRow = KC * 64 + 8;
  __shared__ __align__(16) unsigned short xs[8 * NT * kRow];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int groups = hidden >> 6;
  const int row_g = blockIdx.x * 128 + warp * 16 + g;
  const int rg = row_g < rows ? row_g : rows - 1;  // past R: computed, never stored
  const int rg8 = row_g + 8 < rows ? row_g + 8 : rows - 1;
  const unsigned char* w_g = packed + static_cast<long long>(rg) * (hidden >> 1);
  const unsigned char* w_g8 = packed + static_cast<long long>(rg8) * (hidden >> 1);
  const float* s_g = scale + static_cast<long long>(rg) * groups;
  const float* s_g8 = scale + static_cast<long long>(rg8) * groups;
  // B column g of n-tile nt is x row 8 nt + g; lane t's 16 staged values of a group at 16t
  const unsigned short* x_lane = xs + g * kRow + 16 * t;

  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;

  Group buf[D + 1];
#pragma unroll
  for (int p = 0; p < D; ++p)
    if (p < groups) load_group<L1S>(buf[p], w_g, w_g8, s_g, s_g8, p, t);
  for (int kg = 0; kg < groups; kg += D + 1) {
#pragma unroll
    for (int u = 0; u <= D; ++u) {
      const int kc = kg + u;
      if (kc >= groups) break;
      if (kc + D < groups) load_group<L1S>(buf[(u + D) % (D + 1)], w_g, w_g8, s_g, s_g8, kc + D, t);
      const int kl = kc % KC;
      if (kl == 0) {  // block-uniform: a new chunk of x
        __syncthreads();  // every warp is done with the previous chunk
        stage_x<NT, KC>(xs, x, x_stride, num_x, kc, min(KC, groups - kc));
        __syncthreads();
      }
      compute_group<NT, KC>(acc, buf[u], x_lane + kl * 64);
    }
  }

  // c0 / c1: row g, x rows 8 nt + 2t, + 1; c2 / c3: row g + 8
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int m0 = 8 * nt + 2 * t;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (m0 + e >= num_x) continue;
      float* o = out + static_cast<long long>(m0 + e) * rows;
      if (row_g < rows) o[row_g] = acc[nt][e];
      if (row_g + 8 < rows) o[row_g + 8] = acc[nt][2 + e];
    }
  }
}
