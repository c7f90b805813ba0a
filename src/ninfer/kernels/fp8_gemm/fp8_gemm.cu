// fp8 prefill GEMM helpers: (1) quantize activations to e4m3 with one fp32 scale per row and
// 128-column group (the 1x128 operand of a block-scaled torch._scaled_mm), (2) dequantize a
// 128x128 block-scaled e4m3 weight into a bf16/fp32 scratch copy for cuBLAS where that GEMM is
// not available. e4m3 <-> fp32 conversions are common.cu's integer bit operations rather than the
// sm_89 cvt instructions, so both kernels are exact and portable, and their rounding (round to
// nearest even, after a clamp to +-448) matches torch's .to(float8_e4m3fn) bit for bit. Divisions
// use __fdiv_rn so --use_fast_math does not turn them into approximations.

// NaN-propagating max (as torch's amax): once a NaN is seen it stays.
__device__ __forceinline__ float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

__device__ __forceinline__ void load4(const float* p, float* v) {
  const float4 f = *reinterpret_cast<const float4*>(p);
  v[0] = f.x;
  v[1] = f.y;
  v[2] = f.z;
  v[3] = f.w;
}

__device__ __forceinline__ void load4(const bf16* p, float* v) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  v[0] = __uint_as_float(u.x << 16);
  v[1] = __uint_as_float(u.x & 0xffff0000u);
  v[2] = __uint_as_float(u.y << 16);
  v[3] = __uint_as_float(u.y & 0xffff0000u);
}

// One warp per (row, 128-column group): lane l holds columns 4l..4l+3 of the group. Rows in
// [num_rows, padded_rows) are padding: written as zeros with scale 1. VEC: K % 4 == 0 and x rows
// aligned for 4-element loads, so a lane's 4 columns are all inside K or all outside.
// q: [padded_rows, k] e4m3; scales: [k_groups, padded_rows] fp32 (group-major, i.e. the
// [padded_rows, k_groups] tensor with strides (1, padded_rows) that _scaled_mm wants).
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) quantize_1x128(
    unsigned char* __restrict__ q, float* __restrict__ scales, const T* __restrict__ x,
    long long x_stride, int num_rows, int padded_rows, int k, int k_groups) {
  pdl_begin();
  const long long warp_id =
      static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (warp_id >= static_cast<long long>(padded_rows) * k_groups) return;  // whole warps leave
  const int row = static_cast<int>(warp_id / k_groups);
  const int group = static_cast<int>(warp_id - static_cast<long long>(row) * k_groups);
  const int k0 = group * 128 + lane * 4;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (row < num_rows) {
    const T* src = x + static_cast<long long>(row) * x_stride + k0;
    if (VEC) {
      if (k0 < k) load4(src, v);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (k0 + j < k) v[j] = to_float(src[j]);
    }
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) amax = nan_max(amax, fabsf(v[j]));
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float scale = amax > 0.0f ? __fdiv_rn(amax, 448.0f) : 1.0f;
  unsigned int bytes[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) bytes[j] = float_to_e4m3(__fdiv_rn(v[j], scale));
  unsigned char* dst = q + static_cast<long long>(row) * k + k0;
  if (VEC) {
    if (k0 < k)
      *reinterpret_cast<unsigned int*>(dst) =
          bytes[0] | (bytes[1] << 8) | (bytes[2] << 16) | (bytes[3] << 24);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (k0 + j < k) dst[j] = static_cast<unsigned char>(bytes[j]);
  }
  if (lane == 0) scales[static_cast<long long>(group) * padded_rows + row] = scale;
}

__device__ __forceinline__ void store16(float* p, const float* v) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    reinterpret_cast<float4*>(p)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2],
                                                  v[4 * i + 3]);
}

__device__ __forceinline__ void store16(bf16* p, const float* v) {
  unsigned int w[8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
    w[i] = static_cast<unsigned int>(from_float<bf16>(v[2 * i]).bits) |
           (static_cast<unsigned int>(from_float<bf16>(v[2 * i + 1]).bits) << 16);
  reinterpret_cast<uint4*>(p)[0] = make_uint4(w[0], w[1], w[2], w[3]);
  reinterpret_cast<uint4*>(p)[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// out[N, K] = w[N, K] (e4m3, dense rows) * scale[row / 128, col / 128], rounded once to T.
// VEC (K % 16 == 0, 16-byte aligned w and out): a thread converts 16 weights of one row and one
// 128-column block per step (one 16-byte load, 32 or 64 bytes stored); otherwise one weight per
// step. Grid-stride loops with 64-bit indices (a 27B projection has up to 178 M weights).
template <typename T, bool VEC>
__global__ void __launch_bounds__(256) dequantize_128x128(
    T* __restrict__ out, const unsigned char* __restrict__ w, const float* __restrict__ scale,
    int n, int k, int k_blocks) {
  pdl_begin();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  const long long first = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (VEC) {
    const long long chunks_per_row = k >> 4;
    const long long num_chunks = static_cast<long long>(n) * chunks_per_row;
    for (long long c = first; c < num_chunks; c += stride) {
      const int row = static_cast<int>(c / chunks_per_row);
      const int k0 = static_cast<int>(c - row * chunks_per_row) << 4;
      const float s = __ldg(scale + (row >> 7) * k_blocks + (k0 >> 7));
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(w) + c);
      const unsigned int words[4] = {u.x, u.y, u.z, u.w};
      float v[16];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) v[4 * i + j] = e4m3_to_float((words[i] >> (8 * j)) & 0xffu) * s;
      store16(out + (c << 4), v);
    }
  } else {
    const long long total = static_cast<long long>(n) * k;
    for (long long i = first; i < total; i += stride) {
      const int row = static_cast<int>(i / k);
      const int col = static_cast<int>(i - static_cast<long long>(row) * k);
      const float s = __ldg(scale + (row >> 7) * k_blocks + (col >> 7));
      out[i] = from_float<T>(e4m3_to_float(w[i]) * s);
    }
  }
}
