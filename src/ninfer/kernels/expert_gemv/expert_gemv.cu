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

// SwiGLU of 16 bytes of gate and the matching 16 bytes of up, element by element (common.cu's
// swiglu, rounded like silu_mul).
template <typename T>
__device__ __forceinline__ uint4 swiglu16(const uint4& gq, const uint4& uq) {
  constexpr int V = 16 / sizeof(T);
  const T* ge = reinterpret_cast<const T*>(&gq);
  const T* ue = reinterpret_cast<const T*>(&uq);
  uint4 val;
  T* he = reinterpret_cast<T*>(&val);
#pragma unroll
  for (int j = 0; j < V; ++j) he[j] = swiglu(ge[j], ue[j]);
  return val;
}

// The shared-expert combine, op by op in T (the twin's `routed + torch.sigmoid(gate) * shared`):
// routed is the routed sum already rounded to T, shared the shared expert's output (a T value),
// z its gate logit.
template <typename T>
__device__ __forceinline__ T combine_shared(float routed, float shared, float z) {
  const float sig = to_float(from_float<T>(sigmoid(z)));
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
  pdl_begin();
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
  pdl_begin();
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
      for (int i = 0; i < V; ++i) h[i] = to_float(swiglu(ge[i], ue[i]));
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
  pdl_begin();
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
        val = swiglu16<T>(gq, uq);
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

// ================================================================================================
// expert_group_mma: expert_group_gemv's products on tensor cores (bf16 models, sm_80+; fp32 models
// keep the kernel above, whose products are exact in fp32).
//
// Why. At 64 decode rows the kernel above streams the touched experts at ~2.8 TB/s where the
// device copies at ~4.2: every weight costs a conversion and MAXM fp32 FMAs, and every (row,
// input) pair a warp reduction, so the SM issue rate binds, not the loads. Here the products run
// on mma.m16n8k16 (bf16 in, fp32 accumulate) and a lane's only per-weight work is its share of
// the loads, so the kernel is load-bound: run U3 measured the layer at 64 rows at 388 µs (3.70
// TB/s) against 498 on CUDA cores (docs/perf.md).
//
// Layout. Grid (row tiles of 128, experts), 8 warps; an expert with no assignment returns at
// once. The block takes the expert's assignments (sorted, as above) in passes of up to 8 NT and
// stages their inputs in shared memory as bf16 (SWIGLU: silu(gate) * up rounded like silu_mul),
// rows k + kPad apart. Warp w owns weight rows [row0, row0 + 16), row0 = 128 tile + 16 w, as the
// mma's A (M = 16 rows) and the pass's inputs as B: input m is column m of n-tile 0 (m < 8) or
// column m - 8 of n-tile 1 (NT = 2, passes of more than 8 inputs only). Columns >= count read a
// duplicate of the last staged row instead of zeros (no stores needed): mma columns are
// independent, and those columns are never stored.
//
// Fragment mapping (lane = 4 g + t; PTX's m16n8k16 layout: a0 = A[g][2t, 2t+1], a1 = A[g+8][2t,
// 2t+1], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][2t+8, 2t+9]; b0 = B[2t, 2t+1][g], b1 = B[2t+8,
// 2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][2t, 2t+1]). Inside one mma the k order is
// free as long as A and B agree, so the warp covers k in steps of 32 and in step s (k0 = 32 s)
// lane (g, t) reads 16 contiguous bytes, elements k0 + 8t .. k0 + 8t + 7, of
//   weight row row0 + g        -> words w0..w3 (global, ld_stream16: read once, not kept in L1)
//   weight row row0 + g + 8    -> words v0..v3
//   staged input g (+ 8 nt)    -> words x0..x3 (shared memory)
// (word i = elements 2i (low half) and 2i + 1) and runs two mma, h = 0, 1:
//   a0 = w[2h], a1 = v[2h], a2 = w[2h + 1], a3 = v[2h + 1], b0 = x[2h], b1 = x[2h + 1].
// So in mma h, k slot 2t + e stands for k0 + 8t + 4h + e and slot 2t + 8 + e for k0 + 8t + 4h +
// 2 + e (e = 0, 1), for A and B alike (the slot's meaning depends on t and h only): the two mma
// together take each of the step's 32 k exactly once. A lane's chunk is in range iff k0 + 8t < k
// (K % 8 == 0: all 8 elements or none); out of range A and B are zero, so K needs only to be a
// multiple of 8. tests/unit/kernels/test_expert_group_mma.py emulates this mapping on the CPU.
//
// Loads. A lane streams its two rows 16 bytes per step each (a row's 4 lanes read 64 contiguous
// bytes per step) through a ring of D + 1 steps: step s + D is issued before step s is
// multiplied, so 2 D loads per lane stay in flight. The first D steps of a pass go out before
// the inputs are staged, so the staging and its barriers hide under the weight latency; the
// staging itself issues kStageLoads 16-byte input loads per thread before it converts and stores
// any (one L2 round trip, not several).
// Shared memory: staged rows are k + kPad = k + 32 bf16 apart, 64 bytes mod 128, so the two rows
// a quarter-warp's 16-byte loads touch (g = 2i, 2i + 1, 64 bytes each) fall on distinct banks.
// fp32 accumulation in the mma for the whole row, one rounding to bf16; results go to each
// assignment's own output row (assignment order, as above). Summation order differs from the
// CUDA-core kernel (and the tensor core's internal adds are not IEEE round-to-nearest), so the two
// agree to bf16 rounding, not bit for bit.
// ================================================================================================

namespace egmma {
constexpr int kWarps = 8;        // 256 threads: 8 warps x 16 rows = 128 rows per block
constexpr int kPad = 32;         // bf16 past k per staged row (64 bytes: no bank conflicts)
constexpr int kStageLoads = 4;   // staging: 16-byte input loads per thread issued together

// Step s of the lane's two rows (`lo` and `hi` already at the lane's byte offset 16 t): 16 bytes
// each, zeros where the lane's chunk is past k (`left` = k - 8 t; in range iff 32 s < left).
__device__ __forceinline__ void load_step(uint4 (&a)[2], const unsigned char* lo,
                                          const unsigned char* hi, int s, int left) {
  const bool ok = 32 * s < left;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  a[0] = ok ? ld_stream16(lo + 64 * s) : zero;
  a[1] = ok ? ld_stream16(hi + 64 * s) : zero;
}

// Two mma for one step: A from the lane's row g (w) and row g + 8 (v) words, B from the staged
// input's words (the mapping in the header).
__device__ __forceinline__ void mma_step(float (&acc)[4], const uint4& w, const uint4& v,
                                         const uint4& xq) {
  mma_16816<false>(acc, w.x, v.x, w.y, v.y, xq.x, xq.y);
  mma_16816<false>(acc, w.z, v.z, w.w, v.w, xq.z, xq.w);
}

// Step s's products: n-tile 0, and n-tile 1 when `two` (warp-uniform: the pass has more than 8
// inputs); `x_lo` / `x_hi` are the lane's staged inputs of the two n-tiles at element 8 t.
template <int NT>
__device__ __forceinline__ void mma_inputs(float (&acc)[NT][4], const uint4 (&a)[2],
                                           const bf16* x_lo, const bf16* x_hi, bool two, int s,
                                           int left) {
  const bool ok = 32 * s < left;  // else A is zero and B must be too (no NaN * 0)
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const uint4 xq = ok ? *reinterpret_cast<const uint4*>(x_lo + 32 * s) : zero;
  mma_step(acc[0], a[0], a[1], xq);
  if (NT == 2 && two) {
    const uint4 xq1 = ok ? *reinterpret_cast<const uint4*>(x_hi + 32 * s) : zero;
    mma_step(acc[NT - 1], a[0], a[1], xq1);
  }
}

// Stage `count` inputs in shared memory, row m at xs + m * stride: x row order[m] / x_div, or
// with SWIGLU the SwiGLU of its gate and up halves. kStageLoads 16-byte loads per thread (S
// chunks, two loads each with SWIGLU) are issued before any is converted or stored; S is halved
// with SWIGLU so that the gate and up values fit beside the weight batch already in flight.
template <bool SWIGLU>
__device__ __forceinline__ void stage_inputs(bf16* xs, int stride, const bf16* x,
                                             long long x_stride, const long long* order,
                                             int count, int x_div, int k) {
  constexpr int V = 8;  // bf16 per 16-byte load
  constexpr int S = SWIGLU ? kStageLoads / 2 : kStageLoads;
  const int chunks = k / V;
  const int total = count * chunks;
  for (int i0 = threadIdx.x; i0 < total; i0 += S * blockDim.x) {
    uint4 gq[S], uq[S];
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i < total) {
        const int m = i / chunks;
        const bf16* xr = x + (order[m] / x_div) * x_stride + (i - m * chunks) * V;
        gq[u] = *reinterpret_cast<const uint4*>(xr);
        if (SWIGLU) uq[u] = *reinterpret_cast<const uint4*>(xr + k);
      }
    }
#pragma unroll
    for (int u = 0; u < S; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i < total) {
        const int m = i / chunks;
        const uint4 val = SWIGLU ? swiglu16<bf16>(gq[u], uq[u]) : gq[u];
        *reinterpret_cast<uint4*>(xs + m * stride + (i - m * chunks) * V) = val;
      }
    }
  }
}

// Where lane t's bytes of weight row `row` of expert e begin (rows past n re-read row n - 1:
// computed, never stored).
__device__ __forceinline__ const unsigned char* lane_row(const bf16* w, int e, int n, int k,
                                                         int row, int t) {
  const long long r = static_cast<long long>(e) * n + min(row, n - 1);
  return reinterpret_cast<const unsigned char*>(w + r * k + 8 * t);
}

// A pass's results, each rounded once to bf16 into its assignment's own output row: c0, c1 are
// row g with inputs 8 nt + 2t, 2t + 1 of the pass; c2, c3 row g + 8.
template <int NT>
__device__ __forceinline__ void store_pass(bf16* __restrict__ out, const float (&acc)[NT][4],
                                           const long long* order, int count, int n, int row0,
                                           int g, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int m = 8 * nt + 2 * t + c;
      if (m < count) {
        bf16* o = out + order[m] * n + row0 + g;
        if (row0 + g < n) o[0] = from_float<bf16>(acc[nt][c]);
        if (row0 + g + 8 < n) o[8] = from_float<bf16>(acc[nt][2 + c]);
      }
    }
  }
}
}  // namespace egmma

// D: 32-wide k steps in flight per lane (2 D loads of 16 bytes); NT: n-tiles (8 inputs each) per
// pass; SWIGLU as above. Dynamic shared memory: 8 NT (k + kPad) bf16. Launch bounds: D = 2 fits
// 80 registers (3 blocks per SM); deeper rings spill there, so they get 128 (2 blocks per SM).
// nvcc sm_90: D = 4 108 (NT = 1) / 116 (NT = 2) registers, D = 2 75-78, no spills.
//
// CP (dispatch's default; `NINFER_KERNELS_OFF=group_mma_cp` runs the register ring): the ring of
// D + 1 steps in shared memory, filled by cp.async, instead of registers. Each lane copies its two
// rows' 16-byte pieces of step s into its own slot (ring[slot][0 / 1][thread]) and reads back only
// what it copied, so the ring needs cp.async.wait_group, not barriers, and D steps stay in flight
// a lane without holding registers: D = 7 keeps 7 KiB a warp in flight, 112 KiB an SM at two
// blocks, against the register ring's 4 KiB a warp (D = 4). Alone the two are even; inside the
// 35B-A3B's 64-row step the loads wait longer and the CP form makes the step 0.917x (run S42A,
// H100). The same mma in the same order, so the same bits. Dynamic shared memory: the ring
// ((D + 1) * 2 * 256 * 16 bytes) before the staged inputs. nvcc sm_90, D = 7: 128 registers
// (NT = 1) and 86 (NT = 2, SwiGLU), no spills.
template <int D, int NT, bool SWIGLU, bool CP = false>
__global__ void __launch_bounds__(256, !CP && D <= 2 ? 3 : 2) expert_group_mma(
    bf16* __restrict__ out, const bf16* __restrict__ x, long long x_stride,
    const bf16* __restrict__ w, const long long* __restrict__ order, const int* __restrict__ ends,
    int x_div, int n, int k) {
  pdl_begin();
  using namespace egmma;
  static_assert(NT == 1 || NT == 2, "one or two n-tiles of 8 inputs");
  constexpr int R = D + 1;  // ring slots: step s + D is loaded while step s is multiplied
  extern __shared__ __align__(16) unsigned char group_smem[];
  uint4* ring = reinterpret_cast<uint4*>(group_smem);  // CP: [R][2][256]
  bf16* xs = reinterpret_cast<bf16*>(group_smem + (CP ? R * 2 * 256 * 16 : 0));  // [8 NT][k + kPad]
  constexpr int MAXM = 8 * NT;
  const int e = blockIdx.y;
  const int start = e == 0 ? 0 : ends[e - 1];
  const int end = ends[e];
  if (start >= end) return;  // the whole block leaves together
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = (blockIdx.x * kWarps + warp) * 16;
  const bool has_rows = row0 < n;
  const int stride = k + kPad;
  const int left = k - 8 * t;
  const int steps = (k + 31) / 32;
  const unsigned char* w_lo = lane_row(w, e, n, k, row0 + g, t);
  const unsigned char* w_hi = lane_row(w, e, n, k, row0 + g + 8, t);
  // CP: step s of the lane's two rows into ring slot s % R (zeros past k, as load_step's)
  auto issue = [&](int s) {
    if (s >= steps) return;  // nothing to copy; the caller still commits (an empty group)
    uint4* slot = ring + (s % R) * 2 * 256 + threadIdx.x;
    const bool ok = 32 * s < left;
    cp_async16(slot, w_lo + (ok ? 64 * s : 0), ok);
    cp_async16(slot + 256, w_hi + (ok ? 64 * s : 0), ok);
  };
  for (int base = start; base < end; base += MAXM) {
    const int count = min(MAXM, end - base);
    uint4 a[R][2];  // the register ring (not with CP)
    if (has_rows) {
#pragma unroll
      for (int p = 0; p < D; ++p) {
        if constexpr (CP) {
          issue(p);
          cp_commit();  // one group a step, empty past the steps: the wait count stays uniform
        } else if (p < steps) {
          load_step(a[p], w_lo, w_hi, p, left);
        }
      }
    }
    __syncthreads();  // the previous pass's inputs are no longer read
    stage_inputs<SWIGLU>(xs, stride, x, x_stride, order + base, count, x_div, k);
    __syncthreads();
    if (!has_rows) continue;  // still takes part in the next pass's barriers
    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[nt][i] = 0.0f;
    const bf16* x_lo = xs + min(g, count - 1) * stride + 8 * t;
    const bf16* x_hi = xs + min(8 + g, count - 1) * stride + 8 * t;
    const bool two = NT == 2 && count > 8;
    if constexpr (CP) {
      for (int s = 0; s < steps; ++s) {
        issue(s + D);  // into the slot read at step s - 1 (by this thread: done)
        cp_commit();
        cp_wait<D>();  // this thread's copies of step s have landed
        const uint4* slot = ring + (s % R) * 2 * 256 + threadIdx.x;
        const uint4 piece[2] = {slot[0], slot[256]};
        mma_inputs<NT>(acc, piece, x_lo, x_hi, two, s, left);
      }
      cp_wait<0>();  // nothing of this pass still lands in the ring the next pass fills
    } else {
      for (int s0 = 0; s0 < steps; s0 += R) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
          const int s = s0 + u;
          if (s >= steps) break;  // warp-uniform
          if (s + D < steps) load_step(a[(u + D) % R], w_lo, w_hi, s + D, left);
          mma_inputs<NT>(acc, a[u], x_lo, x_hi, two, s, left);
        }
      }
    }
    store_pass<NT>(out, acc, order + base, count, n, row0, g, t);
  }
}

// moe_combine: out[t] = sum_j w[t, j] * y[t k + j] (+ sigmoid(g[t]) * shared[t]), the tail of the
// grouped path in one launch instead of five elementwise ones. Rounded as expert_down_sum's tail:
// the sum in fp32 in order j = 0..k-1, then to T; the shared-expert combine op by op in T.
// PRELOAD (k <= kCombineMaxK): a thread issues all its loads (k expert outputs, k weights, the
// shared output and its gate) before it adds any, then adds in the same order: one memory round
// trip instead of k + 1, as the loop over a runtime k waits for each load before issuing the next
// (the H100 profile had this kernel at ~9 µs a 35B layer for 2 MB at 64 rows). The same bits.
// On by default (launch.py: COMBINE_PRELOAD); bit-equal to the loop on the GPU (run S39B).
constexpr int kCombineMaxK = 16;

template <typename T, bool PRELOAD>
__global__ void __launch_bounds__(256) moe_combine(
    T* __restrict__ out, const T* __restrict__ y, const float* __restrict__ route_w,
    const T* __restrict__ shared, long long shared_stride, const T* __restrict__ shared_gate,
    long long gate_stride, int top_k, int n) {
  pdl_begin();
  const int t = blockIdx.y;
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= n) return;
  const long long a0 = static_cast<long long>(t) * top_k;
  const long long at = static_cast<long long>(t) * n + row;
  if (PRELOAD && top_k <= kCombineMaxK) {
    float yv[kCombineMaxK], wv[kCombineMaxK];
#pragma unroll
    for (int j = 0; j < kCombineMaxK; ++j) {
      if (j < top_k) {
        yv[j] = to_float(y[(a0 + j) * n + row]);
        wv[j] = route_w[a0 + j];
      }
    }
    const bool has_shared = shared != nullptr;
    const float sv = has_shared ? to_float(shared[t * shared_stride + row]) : 0.0f;
    const float gv = has_shared ? to_float(shared_gate[t * gate_stride]) : 0.0f;
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kCombineMaxK; ++j)
      if (j < top_k) sum += yv[j] * wv[j];
    const float routed = to_float(from_float<T>(sum));
    out[at] = has_shared ? combine_shared<T>(routed, sv, gv) : from_float<T>(routed);
    return;
  }
  float sum = 0.0f;
  for (int j = 0; j < top_k; ++j) sum += to_float(y[(a0 + j) * n + row]) * route_w[a0 + j];
  out[at] = moe_output(sum, shared, t * shared_stride + row, shared_gate, t * gate_stride);
}
