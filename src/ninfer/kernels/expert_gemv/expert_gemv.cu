// Grouped GEMV for MoE decode: out[a, :] = W[ids[a]] @ x[a / x_div], W: [E, N, K], one launch for
// every (token, expert) assignment a, reading each chosen expert's rows in place (no gathered
// copy of the weights). Grid (row tiles, assignments); the block stages its x row in shared memory
// as fp32; each warp owns ROWS output rows and reads them 16 bytes per lane per step, ROWS loads in
// flight at once, then reduces each row across the warp. fp32 accumulation, one rounding to T.
template <typename T, int ROWS>
__global__ void __launch_bounds__(256) expert_gemv(
    T* __restrict__ out, const T* __restrict__ x, long long x_stride, const T* __restrict__ w,
    const long long* __restrict__ ids, int x_div, int n, int k) {
  extern __shared__ float xs[];  // [k]
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const int a = blockIdx.y;
  const T* xr = x + static_cast<long long>(a / x_div) * x_stride;
  for (int i = threadIdx.x; i < k; i += blockDim.x) xs[i] = to_float(xr[i]);
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  if (row0 >= n) return;
  const T* we = w + ids[a] * static_cast<long long>(n) * k;
  const int chunks = k / V;
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  for (int c = lane; c < chunks; c += 32) {
    uint4 u[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const int row = row0 + r < n ? row0 + r : n - 1;  // past n: computed, never stored
      u[r] = *reinterpret_cast<const uint4*>(we + static_cast<long long>(row) * k + c * V);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const T* e = reinterpret_cast<const T*>(&u[r]);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[r] += to_float(e[j]) * xs[c * V + j];
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float total = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < n) out[static_cast<long long>(a) * n + row0 + r] = from_float<T>(total);
  }
}
