// attention_metadata: the index maths gated attention shares across its layers in one step, in
// one launch (the torch twin, reference.py, is a dozen small kernels: in a CUDA graph each costs
// a launch and a dependency of ~2 µs, and a speculative round builds these indices four times).
//
// Thread i (grid-stride) does, where it applies:
// - i < num_tokens: token i's sequence b (the number of cu[1..B] <= i, as torch.searchsorted
//   with right=True), its index i - cu[b] among the sequence's new tokens, its KV index
//   kv = num_computed[b] + that, and its flat KV slot table[b, kv / P] * P + kv % P;
// - i < num_seqs: kv_lens[b] = num_computed[b] + cu[b + 1] - cu[b];
// - i < num_seqs * width, when table_out is given (an int32 table): the table widened to int64.
// The engine's page tables cover every new token's KV index; a column past the table's width
// reads its last column instead of memory past the row (where torch's gather would assert).

template <typename TC, typename TP>
__global__ void attention_metadata(long long* __restrict__ slot_mapping,
                                   long long* __restrict__ seq_idx,
                                   long long* __restrict__ local_idx,
                                   long long* __restrict__ kv_lens,
                                   long long* __restrict__ table_out, const TC* __restrict__ cu,
                                   const long long* __restrict__ num_computed, long long nc_stride,
                                   const TP* __restrict__ table, long long table_stride,
                                   int width, int num_seqs, int num_tokens, int page_size) {
  pdl_begin();
  const int total = max(max(num_tokens, num_seqs), table_out ? num_seqs * width : 0);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    if (i < num_tokens) {
      int lo = 0, hi = num_seqs;  // the first b with cu[b + 1] > i
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (static_cast<long long>(cu[mid + 1]) <= i) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      const int b = min(lo, num_seqs - 1);  // cu[B] == num_tokens: only a bad cu_seqlens clamps
      const long long local = i - static_cast<long long>(cu[b]);
      const long long kv = num_computed[b * nc_stride] + local;
      const long long col = min(kv / page_size, static_cast<long long>(width - 1));
      const long long page = static_cast<long long>(table[b * table_stride + col]);
      slot_mapping[i] = page * page_size + kv % page_size;
      seq_idx[i] = b;
      local_idx[i] = local;
    }
    if (i < num_seqs) {
      kv_lens[i] = num_computed[i * nc_stride] + (static_cast<long long>(cu[i + 1]) - cu[i]);
    }
    if (table_out != nullptr && i < num_seqs * width) {
      const int b = i / width;
      table_out[i] = static_cast<long long>(table[b * table_stride + (i - b * width)]);
    }
  }
}
