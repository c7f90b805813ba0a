// Gated RMSNorm of the Gated DeltaNet output:
//
//   out = x * rsqrt(mean(x^2) + eps) * w * silu(gate)      (fp32 maths, rounded to TO once)
//
// x is the fp32 delta-rule output, gate the projection z (model dtype), w the norm weight; the
// output dtype TO is chosen by the caller so the following cast to the model dtype is fused.
// gate row r starts at (r / gate_inner) * gate_outer_stride + (r % gate_inner) * n, so z can be
// read in place as a column slice of the fused projection ([T, Hv, n] with a wider token stride).
//
// gated_rms_norm_warp (the launcher's choice for n = 32 * PER_LANE, i.e. the 128-wide heads, with
// every pointer and the gate stride aligned to a lane's chunk): one warp per row, each lane holds
// PER_LANE consecutive elements in registers (one vector load each of x, gate and w; one vector
// store), the sum is a warp shuffle, and a block carries several rows: no barrier, no re-read.
// gated_rms_norm: any n and alignment, one block per row (the row is read twice).

template <typename T, int N>
struct alignas(N * sizeof(T)) Chunk {
  T v[N];
};

template <typename TX, typename TG, typename TW, typename TO, int PER_LANE>
__global__ void __launch_bounds__(256)
    gated_rms_norm_warp(TO* __restrict__ out, const TX* __restrict__ x,
                        const TG* __restrict__ gate, const TW* __restrict__ weight, int num_rows,
                        float eps, int gate_inner, long long gate_outer_stride) {
  pdl_begin();
  constexpr int n = 32 * PER_LANE;
  using XC = Chunk<TX, PER_LANE>;
  using GC = Chunk<TG, PER_LANE>;
  using WC = Chunk<TW, PER_LANE>;
  using OC = Chunk<TO, PER_LANE>;
  const long long row =
      static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= num_rows) return;  // the whole warp leaves together, so the shuffles stay full
  const int col = (threadIdx.x & 31) * PER_LANE;
  const long long gate_off = (row / gate_inner) * gate_outer_stride + (row % gate_inner) * n;
  const XC xc = *reinterpret_cast<const XC*>(x + row * n + col);
  const GC gc = *reinterpret_cast<const GC*>(gate + gate_off + col);
  const WC wc = *reinterpret_cast<const WC*>(weight + col);
  float xv[PER_LANE];
  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    xv[j] = to_float(xc.v[j]);
    sq += xv[j] * xv[j];
  }
  const float inv = rsqrtf(warp_sum(sq) / static_cast<float>(n) + eps);
  OC oc;
#pragma unroll
  for (int j = 0; j < PER_LANE; ++j) {
    oc.v[j] = from_float<TO>((xv[j] * inv) * to_float(wc.v[j]) * silu(to_float(gc.v[j])));
  }
  *reinterpret_cast<OC*>(out + row * n + col) = oc;
}

template <typename TX, typename TG, typename TW, typename TO>
__global__ void gated_rms_norm(TO* __restrict__ out, const TX* __restrict__ x,
                               const TG* __restrict__ gate, const TW* __restrict__ weight, int n,
                               float eps, int gate_inner, long long gate_outer_stride) {
  pdl_begin();
  const long long row = blockIdx.x;
  const TX* xr = x + row * n;
  const TG* gr = gate + (row / gate_inner) * gate_outer_stride + (row % gate_inner) * n;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = to_float(xr[i]);
    sq += v * v;
  }
  const float inv = rsqrtf(block_sum(sq) / static_cast<float>(n) + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float act = silu(to_float(gr[i]));
    out[row * n + i] = from_float<TO>((to_float(xr[i]) * inv) * to_float(weight[i]) * act);
  }
}
