// Shared device helpers for ninfer kernels, prepended to every op source before NVRTC compiles it
// (a .cu so the package data glob ships it): bf16 storage without cuda_bf16.h, and reductions.
//
// bf16 is carried as raw 16-bit storage so that NVRTC needs no CUDA toolkit headers; conversion
// to float is exact and back to bf16 rounds to nearest even, exactly as torch's .to(bfloat16).


struct bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __uint_as_float(static_cast<unsigned int>(v.bits) << 16);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);

template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }

template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  unsigned int u = __float_as_uint(v);
  bf16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
    out.bits = 0x7fc0;
    return out;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  out.bits = static_cast<unsigned short>(u >> 16);
  return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  float total = lane < num_warps ? partial[lane] : 0.0f;
  return warp_sum(total);
}
