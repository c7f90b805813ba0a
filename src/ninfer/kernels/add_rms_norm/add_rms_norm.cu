// Fused residual add + zero-centred RMSNorm, one block per row.
//
//   summed = x + residual          (rounded to T, as torch's add in T)
//   out    = summed * rsqrt(mean(summed^2) + eps) * (1 + w)   (fp32 maths, rounded to T once)
//
// HAS_RESIDUAL=false is the plain norm (summed = x, nothing stored).
//
// add_rms_norm_vec (the decode path): the row stays in registers, so it is read once. Each thread
// owns CHUNKS 16-byte vectors (8 bf16 or 4 fp32), vector c of the row at c = i * blockDim.x + tid
// (so every load instruction of a warp is one contiguous 512-byte span); at most 512 threads, so
// 128 registers a thread fit. The launcher picks it when n is a multiple of the vector, the row
// fits 512 x CHUNKS vectors (CHUNKS <= 8) and every pointer is 16-byte aligned.
// add_rms_norm_rows: any n and alignment; the row is read twice (the second read hits L1/L2).

template <typename T, bool HAS_RESIDUAL, int CHUNKS>
__global__ void __launch_bounds__(512)
    add_rms_norm_vec(T* __restrict__ out, T* __restrict__ summed_out, const T* __restrict__ x,
                     const T* __restrict__ residual, const T* __restrict__ weight, int n,
                     float eps) {
  pdl_begin();
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte vector
  const long long row_off = static_cast<long long>(blockIdx.x) * n;
  const int num_vecs = n / V;
  const uint4* xr = reinterpret_cast<const uint4*>(x + row_off);
  const uint4* rr = HAS_RESIDUAL ? reinterpret_cast<const uint4*>(residual + row_off) : nullptr;
  uint4* sr = HAS_RESIDUAL ? reinterpret_cast<uint4*>(summed_out + row_off) : nullptr;

  const uint4* wr = reinterpret_cast<const uint4*>(weight);
  float s[CHUNKS][V];
  uint4 wu[CHUNKS];  // loaded with the row, so the barrier below is the only wait after it
  float sq = 0.0f;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int idx = c * blockDim.x + threadIdx.x;
#pragma unroll
    for (int j = 0; j < V; ++j) s[c][j] = 0.0f;
    if (idx < num_vecs) {
      wu[c] = wr[idx];
      const uint4 xu = xr[idx];
      const T* xe = reinterpret_cast<const T*>(&xu);
      if constexpr (HAS_RESIDUAL) {
        const uint4 ru = rr[idx];
        const T* re = reinterpret_cast<const T*>(&ru);
        uint4 su;
        T* se = reinterpret_cast<T*>(&su);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          se[j] = from_float<T>(to_float(xe[j]) + to_float(re[j]));  // rounded as torch's add
          s[c][j] = to_float(se[j]);
        }
        sr[idx] = su;
      } else {
#pragma unroll
        for (int j = 0; j < V; ++j) s[c][j] = to_float(xe[j]);
      }
#pragma unroll
      for (int j = 0; j < V; ++j) sq += s[c][j] * s[c][j];
    }
  }
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(n) + eps);
  uint4* outr = reinterpret_cast<uint4*>(out + row_off);
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int idx = c * blockDim.x + threadIdx.x;
    if (idx < num_vecs) {
      const T* we = reinterpret_cast<const T*>(&wu[c]);
      uint4 ou;
      T* oe = reinterpret_cast<T*>(&ou);
#pragma unroll
      for (int j = 0; j < V; ++j) oe[j] = from_float<T>((s[c][j] * inv) * (1.0f + to_float(we[j])));
      outr[idx] = ou;
    }
  }
}

template <typename T, bool HAS_RESIDUAL>
__global__ void add_rms_norm_rows(T* __restrict__ out, T* __restrict__ summed_out,
                                  const T* __restrict__ x, const T* __restrict__ residual,
                                  const T* __restrict__ weight, int n, float eps) {
  pdl_begin();
  const long long row = blockIdx.x;
  const T* xr = x + row * n;
  const T* rr = HAS_RESIDUAL ? residual + row * n : nullptr;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float s = to_float(xr[i]);
    if (HAS_RESIDUAL) {
      const T rounded = from_float<T>(s + to_float(rr[i]));
      summed_out[row * n + i] = rounded;
      s = to_float(rounded);
    }
    sq += s * s;
  }
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    float s = to_float(xr[i]);
    if (HAS_RESIDUAL) s = to_float(from_float<T>(s + to_float(rr[i])));
    out[row * n + i] = from_float<T>((s * inv) * (1.0f + to_float(weight[i])));
  }
}
