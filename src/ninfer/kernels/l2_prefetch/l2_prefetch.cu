// l2_prefetch: pulls a constant weight's bytes into L2 with Hopper's bulk prefetch
// (cp.async.bulk.prefetch.L2, one instruction per PIECE bytes, no data through the SM), so a GEMV
// launched a few kernels later finds them there. Launched on a side stream while the decode
// step's small latency-bound kernels (the DeltaNet front, the delta rule, attention) leave DRAM
// idle. Nothing is written; the weights are never a kernel's output, so the prefetches may run
// before pdl_wait() (test_pdl.py), which only keeps the PDL contract.
// bytes and the base address are multiples of 16 (the launcher checks): every piece is too.

__device__ __forceinline__ void prefetch_bulk_l2(const unsigned char* p, unsigned int n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
#endif
}

__global__ void __launch_bounds__(32) l2_prefetch(const unsigned char* __restrict__ p,
                                                  long long bytes, int piece) {
  pdl_trigger();
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x * piece;
  for (long long off = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) * piece;
       off < bytes; off += stride) {
    const long long n = min(static_cast<long long>(piece), bytes - off);
    prefetch_bulk_l2(p + off, static_cast<unsigned int>(n));
  }
  pdl_wait();
}
