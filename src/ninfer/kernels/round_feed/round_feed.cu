// round_feed: a speculative round's bookkeeping for the round chained after it, one thread per
// row (B <= 64), in two launches where the torch twin (reference.py) runs about 30 small kernels
// inside the round's CUDA graph. Integer arithmetic only: the twin's values exactly.
//
// round_take_feed: rows with chain != 0 take t0, position and step from their slot's feeds
//   ([4][S]: token, position, step, columns) and count each of the slot's committed tokens
//   (feed_committed [S][W], -1 for none) once more in counts [S][V] (atomic: the twin's
//   index_add_).
// round_leave_feed: each row writes its slot's four feeds and committed tokens: the token
//   committed last (committed[b][a]), position + a + 1, step + a + 1, the kept columns + 1
//   (min(a, the 1-based column of the first committed token equal to a stop id)), and the
//   committed tokens with -1 past column a.
// The [B] inputs may be strided columns of the round's staged integer block (`*_stride`).

__global__ void round_take_feed(long long* __restrict__ t0, long long t0_stride,
                                long long* __restrict__ position, long long position_stride,
                                long long* __restrict__ step, long long step_stride,
                                const long long* __restrict__ chain, long long chain_stride,
                                const long long* __restrict__ slots, long long slots_stride,
                                const long long* __restrict__ feeds,
                                const long long* __restrict__ feed_committed,
                                int* __restrict__ counts, int num_rows, int num_slots, int width,
                                int vocab) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= num_rows || chain[b * chain_stride] == 0) return;
  const long long slot = slots[b * slots_stride];
  t0[b * t0_stride] = feeds[slot];
  position[b * position_stride] = feeds[num_slots + slot];
  step[b * step_stride] = feeds[2LL * num_slots + slot];
  for (int j = 0; j < width; ++j) {
    const long long token = feed_committed[slot * width + j];
    if (token >= 0 && token < vocab) atomicAdd(counts + slot * vocab + token, 1);
  }
}

__global__ void round_leave_feed(long long* __restrict__ feeds,
                                 long long* __restrict__ feed_committed,
                                 const long long* __restrict__ slots, long long slots_stride,
                                 const long long* __restrict__ position, long long position_stride,
                                 const long long* __restrict__ step, long long step_stride,
                                 const long long* __restrict__ stops, long long stops_stride,
                                 int num_stops, const long long* __restrict__ accepted,
                                 const long long* __restrict__ committed, int num_rows,
                                 int num_slots, int width) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= num_rows) return;
  const long long a = min(accepted[b], static_cast<long long>(width - 1));  // <= k by design
  const long long* row = committed + static_cast<long long>(b) * width;
  long long first = width + 1;
  for (int j = width - 1; j >= 0; --j) {
    bool hit = false;
    for (int s = 0; s < num_stops; ++s) hit |= row[j] == stops[b * stops_stride + s];
    if (hit) first = j + 1;
  }
  const long long slot = slots[b * slots_stride];
  feeds[slot] = row[a];
  feeds[num_slots + slot] = position[b * position_stride] + (a + 1);
  feeds[2LL * num_slots + slot] = step[b * step_stride] + (a + 1);
  feeds[3LL * num_slots + slot] = min(a, first) + 1;
  for (int j = 0; j < width; ++j) feed_committed[slot * width + j] = j <= a ? row[j] : -1;
}

// round_commit: a round's bookkeeping after its verify, one thread per row (reference.py's
// round_commit). With target (greedy rounds) a = the count of leading columns j < W - 1 whose
// target token equals draft j + 1 (ids[b][j + 1]) and committed[b][j] = target[b][j] for j <= a,
// else 0, both written; without, committed and accepted are the verify's, read. Then next_ids
// (d1..dk, t0 with column a the last committed token), the result row (a + 1, a, committed,
// zeros to result_width), gather = b * W + a and draft_position = position + a.
__global__ void round_commit(const long long* __restrict__ target, long long* __restrict__ committed,
                             long long* __restrict__ accepted, const long long* __restrict__ ids,
                             const long long* __restrict__ position, long long position_stride,
                             long long* __restrict__ next_ids, long long* __restrict__ result,
                             long long* __restrict__ gather, long long* __restrict__ draft_position,
                             int num_rows, int width, int header, int result_width) {
  pdl_begin();
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= num_rows) return;
  const long long row0 = static_cast<long long>(b) * width;
  const long long* id = ids + row0;
  long long* c = committed + row0;
  long long a = 0;
  if (target != nullptr) {
    const long long* t = target + row0;
    while (a < width - 1 && t[a] == id[a + 1]) ++a;
    for (int j = 0; j < width; ++j) c[j] = j <= a ? t[j] : 0;
    accepted[b] = a;
  } else {
    a = accepted[b];
  }
  for (int j = 0; j < width; ++j) next_ids[row0 + j] = j == a ? c[a] : j + 1 < width ? id[j + 1] : id[0];
  long long* r = result + static_cast<long long>(b) * result_width;
  for (int j = 0; j < result_width; ++j) r[j] = 0;
  r[0] = a + 1;
  r[1] = a;
  for (int j = 0; j < width; ++j) r[header + j] = c[j];
  gather[b] = row0 + a;
  draft_position[b] = position[b * position_stride] + a;
}
