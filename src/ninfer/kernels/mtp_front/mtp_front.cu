// mtp_front: the MTP head's input, out[t] = [rms_norm(embed[ids[t]]) | rms_norm(hidden[t])], one
// block per (row, half), in one launch where the twin (reference.py) runs four: the embedding
// gather, two add_rms_norm launches and a concatenation. Each half is add_rms_norm_row
// (add_rms_norm/norm_row.cu) with the add_rms_norm launch's own shape for H (CHUNKS vectors for
// each of VT virtual threads), so the halves carry that launch's bits. bf16 rows of H % 8 == 0
// elements, 16-byte aligned (the launcher checks); ids in [0, V) (the caller's token ids).

template <int CHUNKS, int VT>
__global__ void __launch_bounds__(256)
    mtp_front(bf16* __restrict__ out, const long long* __restrict__ ids,
              const bf16* __restrict__ embed, const bf16* __restrict__ hidden,
              long long hidden_stride, const bf16* __restrict__ embed_norm,
              const bf16* __restrict__ hidden_norm, int n, float eps) {
  pdl_begin();
  const long long t = blockIdx.x;
  const bool first = blockIdx.y == 0;
  const bf16* row = first ? embed + ids[t] * n : hidden + t * hidden_stride;
  add_rms_norm_row<256, false, CHUNKS, VT>(out + t * 2 * n + (first ? 0 : n), nullptr, row, nullptr,
                                        first ? embed_norm : hidden_norm, n, eps);
}
