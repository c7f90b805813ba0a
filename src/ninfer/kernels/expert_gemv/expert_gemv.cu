// Grouped GEMVs for MoE decode, reading each chosen expert's matrix in place by id, and the
// device helpers the kernels of this file share.

// Step c (16 bytes per lane) of ROWS consecutive weight rows from row0, all loads issued before
// any is used; rows past n re-read row n - 1 (computed, never stored).
template <typename T, int ROWS>
__device__ __forceinline__ void load_rows(uint4 (&u)[ROWS], const T* we, int row0, int n, int k,
                                          int c) {
  constexpr int V = 16 / sizeof(T);
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const int row = row0 + r < n ? row0 + r : n - 1;
    u[r] = *reinterpret_cast<const uint4*>(we + static_cast<long long>(row) * k + c * V);
  }
}

// SwiGLU of one gate and up element, rounded like silu_mul: silu(g) to T, then the product to T.
template <typename T>
__device__ __forceinline__ T swiglu_rounded(T gate, T up) {
  const float g = to_float(gate);
  const float act = to_float(from_float<T>(g / (1.0f + __expf(-g))));
  return from_float<T>(act * to_float(up));
}

// A MoE output element: the routed sum (fp32) to T, plus sigmoid(shared_gate[gate_at]) *
// shared[shared_at] op by op in T when the shared expert is given (the twin's
// `routed + torch.sigmoid(gate) * shared`).
template <typename T>
__device__ __forceinline__ T moe_output(float routed_sum, const T* shared, long long shared_at,
                                        const T* shared_gate, long long gate_at) {
  float y = to_float(from_float<T>(routed_sum));
  if (shared != nullptr) {
    const float z = to_float(shared_gate[gate_at]);
    const float sig = to_float(from_float<T>(1.0f / (1.0f + __expf(-z))));
    y += to_float(from_float<T>(sig * to_float(shared[shared_at])));
  }
  return from_float<T>(y);
}

// expert_gemv: out[a, :] = W[ids[a]] @ x[a / x_div], W: [E, N, K], one launch for
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
    load_rows<T, ROWS>(u, we, row0, n, k, c);
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

// MoE decode tail, one launch: out[t] = sum_j w[t, j] * (D[ids[t, j]] @ swiglu(gu[t k + j])), plus
// optionally sigmoid(g[t]) * shared[t] (the shared expert), D: [E, N, K], gu: [T k, 2K] rows of
// gate then up. Block = (a tile of rows, one token t); its warps take (assignment j, group of ROWS
// rows) units, `groups` row groups per block so that small k still fills the 8 warps. A lane reads
// 16 bytes of ROWS rows per step (a 1 KB row of 512 bf16 is two steps, so all 8 rows' loads are in
// flight together), applies SwiGLU to its slice of gu on the fly, and the warp reduces each row.
// Per-(j, row) results meet in shared memory and are summed over j in order 0..k-1. Rounded like
// the twin: SwiGLU as silu_mul, each expert output to T, the weighted sum in fp32 then to T, and
// the shared-expert combine op by op in T (sigmoid, product, sum).
template <typename T, int ROWS>
__global__ void __launch_bounds__(256) expert_down_sum(
    T* __restrict__ out, const T* __restrict__ gate_up, long long gu_stride,
    const T* __restrict__ w, const long long* __restrict__ ids, const float* __restrict__ route_w,
    const T* __restrict__ shared, long long shared_stride, const T* __restrict__ shared_gate,
    long long gate_stride, int top_k, int groups, int n, int k) {
  __shared__ float part[32 * ROWS];  // [unit][ROWS], units = top_k * groups <= 32
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const int t = blockIdx.y;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int block_rows = ROWS * groups;
  const int block_row0 = blockIdx.x * block_rows;
  const int units = top_k * groups;
  const int chunks = k / V;
  for (int u = warp; u < units; u += blockDim.x >> 5) {
    const int j = u % top_k;
    const int row0 = block_row0 + (u / top_k) * ROWS;
    const long long a = static_cast<long long>(t) * top_k + j;
    const T* gr = gate_up + a * gu_stride;
    const T* we = w + ids[a] * static_cast<long long>(n) * k;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    for (int c = lane; c < chunks; c += 32) {
      uint4 q[ROWS];
      load_rows<T, ROWS>(q, we, row0, n, k, c);
      const uint4 gq = *reinterpret_cast<const uint4*>(gr + c * V);
      const uint4 uq = *reinterpret_cast<const uint4*>(gr + k + c * V);
      const T* ge = reinterpret_cast<const T*>(&gq);
      const T* ue = reinterpret_cast<const T*>(&uq);
      float h[V];
#pragma unroll
      for (int i = 0; i < V; ++i) h[i] = to_float(swiglu_rounded(ge[i], ue[i]));
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const T* e = reinterpret_cast<const T*>(&q[r]);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[r] += to_float(e[i]) * h[i];
      }
    }
    const float weight = route_w[a];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float total = warp_sum(acc[r]);
      if (lane == 0) part[u * ROWS + r] = to_float(from_float<T>(total)) * weight;
    }
  }
  __syncthreads();
  const int i = threadIdx.x;
  const int row = block_row0 + i;
  if (i >= block_rows || row >= n) return;
  const int g = i / ROWS;
  const int r = i - g * ROWS;
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) sum += part[(g * top_k + j) * ROWS + r];
  out[static_cast<long long>(t) * n + row] = moe_output(
      sum, shared, t * shared_stride + row, shared_gate, t * gate_stride);
}

// expert_group_gemv: the same products as expert_gemv (out[a] = W[ids[a]] @ x[a / x_div]) with
// each expert's matrix read once per group of up to MAXM of its assignments instead of once per
// assignment: at 64 decode rows x top-8 most of the 256 experts are chosen about twice, and the
// per-assignment kernel streams the weights twice over. Assignments come sorted by expert
// (`order`, with `ends[e]` the end of expert e's run); grid (row tiles, experts), an expert with
// no assignment returns at once. The block stages its group's inputs in shared memory in T, with
// SWIGLU the input row is [gate | up] of width 2k and the staged row is silu(gate) * up rounded
// like silu_mul. Each warp owns ROWS output rows, a lane reads 16 bytes of each per step and
// multiplies them into every staged input; fp32 accumulation, one rounding to T, and the result
// goes to the assignment's own row of `out` (assignment order, as expert_gemv).
template <typename T, int ROWS, int MAXM, bool SWIGLU>
__global__ void __launch_bounds__(256) expert_group_gemv(
    T* __restrict__ out, const T* __restrict__ x, long long x_stride, const T* __restrict__ w,
    const long long* __restrict__ order, const int* __restrict__ ends, int x_div, int n, int k) {
  extern __shared__ __align__(16) unsigned char group_smem[];
  T* xs = reinterpret_cast<T*>(group_smem);  // [MAXM][k]
  constexpr int V = 16 / sizeof(T);           // elements per 16-byte load
  const int e = blockIdx.y;
  const int start = e == 0 ? 0 : ends[e - 1];
  const int end = ends[e];
  if (start >= end) return;  // the whole block leaves together
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  const T* we = w + static_cast<long long>(e) * n * k;
  const int chunks = k / V;
  for (int base = start; base < end; base += MAXM) {
    const int count = min(MAXM, end - base);
    __syncthreads();  // the previous group's inputs are no longer read
    for (int i = threadIdx.x; i < count * chunks; i += blockDim.x) {
      const int m = i / chunks;
      const int c = i - m * chunks;
      const T* xr = x + (order[base + m] / x_div) * x_stride;
      uint4 val;
      if (SWIGLU) {
        const uint4 gq = *reinterpret_cast<const uint4*>(xr + c * V);
        const uint4 uq = *reinterpret_cast<const uint4*>(xr + k + c * V);
        const T* ge = reinterpret_cast<const T*>(&gq);
        const T* ue = reinterpret_cast<const T*>(&uq);
        T* he = reinterpret_cast<T*>(&val);
#pragma unroll
        for (int j = 0; j < V; ++j) he[j] = swiglu_rounded(ge[j], ue[j]);
      } else {
        val = *reinterpret_cast<const uint4*>(xr + c * V);
      }
      *reinterpret_cast<uint4*>(xs + m * k + c * V) = val;
    }
    __syncthreads();
    if (row0 < n) {
      float acc[ROWS][MAXM];
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int m = 0; m < MAXM; ++m) acc[r][m] = 0.0f;
      for (int c = lane; c < chunks; c += 32) {
        uint4 u[ROWS];
        load_rows<T, ROWS>(u, we, row0, n, k, c);
#pragma unroll
        for (int m = 0; m < MAXM; ++m) {
          if (m < count) {
            const uint4 xq = *reinterpret_cast<const uint4*>(xs + m * k + c * V);
            const T* xe = reinterpret_cast<const T*>(&xq);
            float xf[V];
#pragma unroll
            for (int j = 0; j < V; ++j) xf[j] = to_float(xe[j]);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
              const T* el = reinterpret_cast<const T*>(&u[r]);
#pragma unroll
              for (int j = 0; j < V; ++j) acc[r][m] += to_float(el[j]) * xf[j];
            }
          }
        }
      }
#pragma unroll
      for (int m = 0; m < MAXM; ++m) {
        if (m < count) {
          const long long a = order[base + m];
#pragma unroll
          for (int r = 0; r < ROWS; ++r) {
            const float total = warp_sum(acc[r][m]);
            if (lane == 0 && row0 + r < n) out[a * n + row0 + r] = from_float<T>(total);
          }
        }
      }
    }
  }
}

// moe_combine: out[t] = sum_j w[t, j] * y[t k + j] (+ sigmoid(g[t]) * shared[t]), the tail of the
// grouped path in one launch instead of five elementwise ones. Rounded as expert_down_sum's tail:
// the sum in fp32 in order j = 0..k-1, then to T; the shared-expert combine op by op in T.
template <typename T>
__global__ void __launch_bounds__(256) moe_combine(
    T* __restrict__ out, const T* __restrict__ y, const float* __restrict__ route_w,
    const T* __restrict__ shared, long long shared_stride, const T* __restrict__ shared_gate,
    long long gate_stride, int top_k, int n) {
  const int t = blockIdx.y;
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  const long long a0 = static_cast<long long>(t) * top_k;
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) sum += to_float(y[(a0 + j) * n + row]) * route_w[a0 + j];
  out[static_cast<long long>(t) * n + row] = moe_output(
      sum, shared, t * shared_stride + row, shared_gate, t * gate_stride);
}
