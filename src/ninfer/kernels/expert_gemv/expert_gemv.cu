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

// The shared-expert combine, op by op in T (the twin's `routed + torch.sigmoid(gate) * shared`):
// routed is the routed sum already rounded to T, shared the shared expert's output (a T value),
// z its gate logit.
template <typename T>
__device__ __forceinline__ T combine_shared(float routed, float shared, float z) {
  const float sig = to_float(from_float<T>(1.0f / (1.0f + __expf(-z))));
  return from_float<T>(routed + to_float(from_float<T>(sig * shared)));
}

// A MoE output element: the routed sum (fp32) to T, plus sigmoid(shared_gate[gate_at]) *
// shared[shared_at] op by op in T when the shared expert's output is given.
template <typename T>
__device__ __forceinline__ T moe_output(float routed_sum, const T* shared, long long shared_at,
                                        const T* shared_gate, long long gate_at) {
  const float y = to_float(from_float<T>(routed_sum));
  if (shared == nullptr) return from_float<T>(y);
  return combine_shared<T>(y, to_float(shared[shared_at]), to_float(shared_gate[gate_at]));
}

// UNROLL steps (chunks c0, c0 + 32, ...) of ROWS rows from row0: all ROWS * UNROLL 16-byte loads
// issued before any is used. Chunks at or past `chunks` are not loaded (nor used by the caller);
// the caller guarantees c0 < chunks.
template <typename T, int ROWS, int UNROLL>
__device__ __forceinline__ void load_steps(uint4 (&u)[UNROLL][ROWS], const T* we, int row0, int n,
                                           int k, int c0, int chunks) {
#pragma unroll
  for (int q = 0; q < UNROLL; ++q) {
    const int c = c0 + 32 * q;
    if (q == 0 || c < chunks) load_rows<T, ROWS>(u[q], we, row0, n, k, c);
  }
}

// expert_gemv: out[a, :] = W_a @ x[t], W: [E, N, K], one launch for every (token, expert)
// assignment, reading each chosen expert's rows in place (no gathered copy of the weights).
// Token t has `per_input` routed assignments, W_a = W[ids[t per_input + j]] for slot j, plus,
// when `shared_w` ([N, K], the MoE shared expert) is given, one more slot j = per_input with
// W_a = shared_w: the shared expert's gate-up rides in the same launch as the routed ones instead
// of a cuBLAS GEMV of its own (out row a = t (per_input + 1) + j; the routing ids stay [T, k]).
// Grid (row tiles, assignments); each warp owns ROWS output rows and reads them 16 bytes per
// lane per step. Memory-level parallelism is what this kernel lives on (at batch 1, 8 experts x
// 4 MB of gate-up is a pure stream): a lane issues ROWS x UNROLL independent loads (UNROLL steps
// of ROWS rows) before using any, and the first batch of them goes out before the block stages
// its x row (16-byte loads, so x rows must be 16-byte aligned) in shared memory as fp32, so that
// the staging and its barrier hide under the weight latency. Each lane still accumulates its
// chunks in the order lane, lane + 32, ..., so the result does not depend on UNROLL (nor differs
// from the kernel before the unroll). fp32 accumulation, the warp reduces each row, one rounding
// to T.
template <typename T, int ROWS, int UNROLL>
__global__ void __launch_bounds__(256) expert_gemv(
    T* __restrict__ out, const T* __restrict__ x, long long x_stride, const T* __restrict__ w,
    const long long* __restrict__ ids, const T* __restrict__ shared_w, int per_input, int n,
    int k) {
  extern __shared__ __align__(16) float xs[];  // [k]
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const int slots = per_input + (shared_w != nullptr ? 1 : 0);
  const int a = blockIdx.y;
  const int t = a / slots;
  const int j = a - t * slots;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int row0 = (blockIdx.x * (blockDim.x >> 5) + warp) * ROWS;
  const int chunks = k / V;
  const bool has_rows = row0 < n;
  const T* we = nullptr;
  uint4 u[UNROLL][ROWS];
  if (has_rows) {
    we = j == per_input
             ? shared_w
             : w + ids[static_cast<long long>(t) * per_input + j] * static_cast<long long>(n) * k;
    if (lane < chunks) load_steps<T, ROWS, UNROLL>(u, we, row0, n, k, lane, chunks);
  }
  // x staged 16 bytes per thread (one pass for K <= 256 V): an element-wise loop would be K / 256
  // dependent L2 round trips (8 at K = 2048) before the first FMA.
  const T* xr = x + static_cast<long long>(t) * x_stride;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const uint4 v = *reinterpret_cast<const uint4*>(xr + c * V);
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int i = 0; i < V; i += 4) {
      *reinterpret_cast<float4*>(xs + c * V + i) =
          make_float4(to_float(e[i]), to_float(e[i + 1]), to_float(e[i + 2]), to_float(e[i + 3]));
    }
  }
  __syncthreads();
  if (!has_rows) return;
  float acc[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
  for (int c0 = lane; c0 < chunks;) {
#pragma unroll
    for (int q = 0; q < UNROLL; ++q) {
      const int c = c0 + 32 * q;
      if (q == 0 || c < chunks) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          const T* e = reinterpret_cast<const T*>(&u[q][r]);
#pragma unroll
          for (int i = 0; i < V; ++i) acc[r] += to_float(e[i]) * xs[c * V + i];
        }
      }
    }
    c0 += 32 * UNROLL;
    if (c0 < chunks) load_steps<T, ROWS, UNROLL>(u, we, row0, n, k, c0, chunks);
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float total = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < n) out[static_cast<long long>(a) * n + row0 + r] = from_float<T>(total);
  }
}

// MoE decode tail, one launch: out[t] = sum_j w[t, j] * (D[ids[t, j]] @ swiglu(gu[t s + j])) plus
// the shared expert, D: [E, N, K], gu: rows of gate then up (2K wide), s rows per token. The
// shared expert comes one of two ways. Its output `shared` [T, N] (computed elsewhere): s = k,
// out[t] += sigmoid(g[t]) * shared[t]. Or its down matrix `shared_w` [N, K], with expert_gemv
// having written its gate-up as each token's last row (s = k + 1): the kernel runs it as one more
// slot j = k, D_k = shared_w, unweighted, and combines it like the given output -- rounded to T,
// then sigmoid(g) * it op by op in T; it never enters the fp32 routed sum, so both ways round
// alike. Block = (a tile of rows, one token t); its warps take (slot j, group of ROWS rows)
// units, `groups` row groups per block so that small k still fills the warps (the launcher gives
// the block one warp per unit up to 16 warps, so k = 8 plus the shared slot is 9 warps, not 8
// warps with one doing two units). A lane reads 16 bytes of ROWS rows per step (a 1 KB row of
// 512 bf16 is two steps, so all 8 rows' loads are in flight together), applies SwiGLU to its
// slice of gu on the fly, and the warp reduces each row. Per-(j, row) results meet in shared
// memory and are summed over j in order 0..k-1. Rounded like the twin: SwiGLU as silu_mul, each
// expert output to T, the weighted sum in fp32 then to T, and the shared-expert combine op by op
// in T (sigmoid, product, sum).
template <typename T, int ROWS>
__global__ void __launch_bounds__(512) expert_down_sum(
    T* __restrict__ out, const T* __restrict__ gate_up, long long gu_stride,
    const T* __restrict__ w, const long long* __restrict__ ids, const float* __restrict__ route_w,
    const T* __restrict__ shared, long long shared_stride, const T* __restrict__ shared_gate,
    long long gate_stride, const T* __restrict__ shared_w, int top_k, int groups, int n, int k) {
  __shared__ float part[32 * ROWS];  // [unit][ROWS], units = slots * groups <= 32
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte load
  const int slots = top_k + (shared_w != nullptr ? 1 : 0);
  const int t = blockIdx.y;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int block_rows = ROWS * groups;
  const int block_row0 = blockIdx.x * block_rows;
  const int units = slots * groups;
  const int chunks = k / V;
  for (int u = warp; u < units; u += blockDim.x >> 5) {
    const int j = u % slots;
    const int row0 = block_row0 + (u / slots) * ROWS;
    const bool is_shared = j == top_k;  // only with shared_w
    const long long a = static_cast<long long>(t) * top_k + j;  // routing index (routed slots)
    const T* gr = gate_up + (static_cast<long long>(t) * slots + j) * gu_stride;
    const T* we = is_shared ? shared_w : w + ids[a] * static_cast<long long>(n) * k;
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
    const float weight = is_shared ? 1.0f : route_w[a];
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
  for (int j = 0; j < top_k; ++j) sum += part[(g * slots + j) * ROWS + r];
  T y;
  if (shared_w != nullptr) {
    y = combine_shared<T>(to_float(from_float<T>(sum)), part[(g * slots + top_k) * ROWS + r],
                          to_float(shared_gate[t * gate_stride]));
  } else {
    y = moe_output(sum, shared, t * shared_stride + row, shared_gate, t * gate_stride);
  }
  out[static_cast<long long>(t) * n + row] = y;
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
