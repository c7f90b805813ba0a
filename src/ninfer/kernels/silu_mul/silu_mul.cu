// SwiGLU activation over a fused gate-up projection: out[r, i] = silu(x[r, i]) * x[r, I + i].
// Rounded as torch's `F.silu(gate) * up` in T: silu rounded to T, then the product rounded to T.
// One thread per output element; rows of x are `x_stride` apart (a slice of a wider GEMM output).
template <typename T>
__global__ void silu_mul(T* __restrict__ out, const T* __restrict__ x, long long x_stride,
                         int inter, long long total) {
  const long long idx = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const long long row = idx / inter;
  const int i = static_cast<int>(idx - row * inter);
  const float gate = to_float(x[row * x_stride + i]);
  const float up = to_float(x[row * x_stride + inter + i]);
  const float act = to_float(from_float<T>(gate / (1.0f + __expf(-gate))));
  out[idx] = from_float<T>(act * up);
}
