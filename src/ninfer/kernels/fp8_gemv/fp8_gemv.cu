// Weight-only fp8 GEMV for decode: out[m, :] = (W * scale) @ x[m] for M <= 8 rows of x, W: [N, K]
// e4m3 with one f32 scale per 128x128 block. Each warp owns ROWS output rows and reads each of
// them 16 bytes (16 weights, one block column) per lane per step, ROWS loads in flight; the
// weights are dequantized in registers (PTX cvt e4m3x2 -> f16x2, sm_89+), multiplied by the x
// values (read through the read-only cache: x is a few KiB and every warp shares it), the 16-term
// partial sum is scaled by its block's scale, and the warp reduces each row at the end. fp32
// accumulation, one rounding to T.

__device__ __forceinline__ void fp8x2_to_float2(unsigned short v, float& lo, float& hi) {
  unsigned int h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
  const unsigned short l = static_cast<unsigned short>(h2 & 0xffffu);
  const unsigned short h = static_cast<unsigned short>(h2 >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
}

// 16 consecutive x values of one row as fp32 (the row is 16-byte aligned, k0 a multiple of 16).
__device__ __forceinline__ void load_x16(const float* p, float* xv) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
    xv[4 * i] = f.x;
    xv[4 * i + 1] = f.y;
    xv[4 * i + 2] = f.z;
    xv[4 * i + 3] = f.w;
  }
}

__device__ __forceinline__ void load_x16(const bf16* p, float* xv) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + i);
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      xv[8 * i + 2 * j] = __uint_as_float(w[j] << 16);
      xv[8 * i + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  }
}

template <typename T, int M, int ROWS>
__global__ void __launch_bounds__(128) fp8_gemv(
    T* __restrict__ out, const T* __restrict__ x, long long x_stride,
    const unsigned char* __restrict__ w, const float* __restrict__ scale, int n, int k,
    int k_blocks) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  if (row0 >= n) return;
  float acc[M][ROWS];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[m][r] = 0.0f;
  const int chunks = k >> 4;  // 16 weights per 16-byte load
  for (int c = lane; c < chunks; c += 32) {
    const int k0 = c << 4;
    uint4 u[ROWS];
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = row0 + r < n ? row0 + r : n - 1;  // past n: computed, never stored
      u[r] = __ldg(reinterpret_cast<const uint4*>(w + static_cast<long long>(row) * k + k0));
      s[r] = __ldg(scale + (row >> 7) * k_blocks + (k0 >> 7));
    }
    float wf[ROWS][16];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const unsigned int words[4] = {u[r].x, u[r].y, u[r].z, u[r].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        fp8x2_to_float2(static_cast<unsigned short>(words[j] & 0xffffu), wf[r][4 * j],
                        wf[r][4 * j + 1]);
        fp8x2_to_float2(static_cast<unsigned short>(words[j] >> 16), wf[r][4 * j + 2],
                        wf[r][4 * j + 3]);
      }
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xv[16];
      load_x16(x + m * x_stride + k0, xv);
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float part = 0.0f;
#pragma unroll
        for (int j = 0; j < 16; ++j) part += wf[r][j] * xv[j];
        acc[m][r] += part * s[r];
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float total = warp_sum(acc[m][r]);
      if (lane == 0 && row0 + r < n)
        out[static_cast<long long>(m) * n + row0 + r] = from_float<T>(total);
    }
}
