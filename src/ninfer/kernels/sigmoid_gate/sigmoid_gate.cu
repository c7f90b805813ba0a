// sigmoid_gate: the gated attention's output gate as one kernel, x[t, h D + d] = o[t, h, d] *
// sigmoid(g[t, h, d]), bf16, rounded as torch's eager `o * torch.sigmoid(g)` (common.cu's
// sigmoid_gate_bf16x2) into a dense [T, H D] row ready for o_proj.
//
// Why. Eagerly this is two elementwise kernels and an intermediate (sigmoid, then the product),
// and o (the attention output, head-major from SDPA) and g (a strided slice of the q projection)
// are both strided views: at an 8k prefill of the 27B the pair took 7.9 ms over 16 layers (run
// U3); one pass reads o and g once and writes x once.
//
// Layout: grid x over the 16-byte vectors of a row (8 elements; a vector never spans two heads,
// head_dim % 8 == 0), grid y over rows (looping past 65,535). o and g are addressed as (row, head,
// element) with their own row and head strides; x is dense.

__global__ void __launch_bounds__(256) sigmoid_gate(
    bf16* __restrict__ x, const bf16* __restrict__ o, long long o_row, long long o_head,
    const bf16* __restrict__ g, long long g_row, long long g_head, int head_dim, int width,
    int num_rows) {
  pdl_begin();
  const int e = (blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (e >= width) return;
  const int h = e / head_dim;
  const int d = e - h * head_dim;
  for (long long t = blockIdx.y; t < num_rows; t += gridDim.y) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o + t * o_row + h * o_head + d);
    const uint4 gv = *reinterpret_cast<const uint4*>(g + t * g_row + h * g_head + d);
    *reinterpret_cast<uint4*>(x + t * width + e) =
        make_uint4(sigmoid_gate_bf16x2(ov.x, gv.x), sigmoid_gate_bf16x2(ov.y, gv.y),
                   sigmoid_gate_bf16x2(ov.z, gv.z), sigmoid_gate_bf16x2(ov.w, gv.w));
  }
}
