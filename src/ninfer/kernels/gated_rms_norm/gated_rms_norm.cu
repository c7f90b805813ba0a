// Gated RMSNorm of the Gated DeltaNet output, one block per row:
//
//   out = x * rsqrt(mean(x^2) + eps) * w * silu(gate)      (fp32 maths, rounded to TO once)
//
// x is the fp32 delta-rule output, gate the projection z (model dtype), w the norm weight; the
// output dtype TO is chosen by the caller so the following cast to the model dtype is fused.
// gate row r starts at (r / gate_inner) * gate_outer_stride + (r % gate_inner) * n, so z can be
// read in place as a column slice of the fused projection ([T, Hv, n] with a wider token stride).
template <typename TX, typename TG, typename TW, typename TO>
__global__ void gated_rms_norm(TO* __restrict__ out, const TX* __restrict__ x,
                               const TG* __restrict__ gate, const TW* __restrict__ weight, int n,
                               float eps, int gate_inner, long long gate_outer_stride) {
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
    const float g = to_float(gr[i]);
    const float silu = g / (1.0f + __expf(-g));
    out[row * n + i] = from_float<TO>((to_float(xr[i]) * inv) * to_float(weight[i]) * silu);
  }
}
