// SwiGLU activation over a fused gate-up projection: out[r, i] = silu(x[r, i]) * x[r, I + i].
// Rounded as torch's `F.silu(gate) * up` in T: silu rounded to T, then the product rounded to T.
// Rows of x are `x_stride` elements apart (a slice of a wider GEMM output).
//
// silu_mul_vec (prefill and decode, whenever inter, x_stride and x are 16-byte aligned): each
// thread owns one 16-byte vector (8 bf16 or 4 fp32) of an output row, so gate, up and out each
// move as one 16-byte access and a warp's access is one contiguous 512-byte span. Grid x runs
// over the vectors of a row, grid y over rows (looping by gridDim.y past 65,535 rows): no index
// division. silu_mul: any alignment, one thread per output element (the launcher's fallback).
// Both round as common.cu's swiglu() does, so they agree bit for bit.

template <typename T>
__global__ void __launch_bounds__(256)
    silu_mul_vec(T* __restrict__ out, const T* __restrict__ x, long long x_stride, int inter,
                 int num_rows) {
  pdl_begin();
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (col >= inter) return;
  for (long long row = blockIdx.y; row < num_rows; row += gridDim.y) {
    const T* xr = x + row * x_stride + col;
    const uint4 gu = *reinterpret_cast<const uint4*>(xr);
    const uint4 uu = *reinterpret_cast<const uint4*>(xr + inter);
    uint4 ou;
    if constexpr (sizeof(T) == 2) {
      ou.x = swiglu_bf16x2(gu.x, uu.x);
      ou.y = swiglu_bf16x2(gu.y, uu.y);
      ou.z = swiglu_bf16x2(gu.z, uu.z);
      ou.w = swiglu_bf16x2(gu.w, uu.w);
    } else {
      const T* ge = reinterpret_cast<const T*>(&gu);
      const T* ue = reinterpret_cast<const T*>(&uu);
      T* oe = reinterpret_cast<T*>(&ou);
#pragma unroll
      for (int j = 0; j < V; ++j) oe[j] = swiglu(ge[j], ue[j]);
    }
    *reinterpret_cast<uint4*>(out + row * inter + col) = ou;
  }
}

template <typename T>
__global__ void silu_mul(T* __restrict__ out, const T* __restrict__ x, long long x_stride,
                         int inter, long long total) {
  pdl_begin();
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const long long row = idx / inter;
  const int i = static_cast<int>(idx - row * inter);
  out[idx] = swiglu(x[row * x_stride + i], x[row * x_stride + inter + i]);
}
