// Shared device helpers for ninfer kernels, prepended to every op source before NVRTC compiles it
// (a .cu so the package data glob ships it): bf16 storage without cuda_bf16.h, and reductions.
//
// bf16 is carried as raw 16-bit storage so that NVRTC needs no CUDA toolkit headers; conversion
// to float is exact and back to bf16 rounds to nearest even, exactly as torch's .to(bfloat16).


struct bf16 {
  unsigned short bits;
};

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) {
  return __uint_as_float(static_cast<unsigned int>(v.bits) << 16);
}

template <typename T>
__device__ __forceinline__ T from_float(float v);

template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }

template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  unsigned int u = __float_as_uint(v);
  bf16 out;
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays a (quiet) NaN
    out.bits = 0x7fc0;
    return out;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  out.bits = static_cast<unsigned short>(u >> 16);
  return out;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // partial[] may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = (blockDim.x + 31) >> 5;
  float total = lane < num_warps ? partial[lane] : 0.0f;
  return warp_sum(total);
}

// How many values each lane holds after reduce_scatter<N, OFFSET>.
template <int N, int OFFSET>
struct ScatterCount {
  static constexpr int value = ScatterCount<N % 2 == 0 ? N / 2 : N, OFFSET / 2>::value;
};
template <int N>
struct ScatterCount<N, 0> {
  static constexpr int value = N;
};

// Sums v[0..N) over the lanes of a warp (call with OFFSET = 16). While N is even, each step keeps
// half of the values, the half chosen by the lane's OFFSET bit, and adds the partner lane's copy
// of that half (N / 2 shuffles); once N is odd the rest is a plain butterfly. Afterwards v[i],
// i < ScatterCount<N, 16>::value, is the warp total of entry base + i, and `owner` is true on
// exactly one lane for each entry. Serves the paged attention's score sums and the bf16 GEMV's
// row sums.
template <int N, int OFFSET, int M>
__device__ __forceinline__ void reduce_scatter(float (&v)[M], int lane, int& base, bool& owner) {
  if constexpr (OFFSET > 0) {
    if constexpr (N % 2 == 0) {
      constexpr int H = N / 2;
      const bool hi = (lane & OFFSET) != 0;
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float send = hi ? v[i] : v[i + H];
        const float keep = hi ? v[i + H] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
      }
      if (hi) base += H;
      reduce_scatter<H, OFFSET / 2, M>(v, lane, base, owner);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += __shfl_xor_sync(0xffffffffu, v[i], OFFSET);
      if (lane & OFFSET) owner = false;
      reduce_scatter<N, OFFSET / 2, M>(v, lane, base, owner);
    }
  }
}

// Two fp32 values rounded to nearest even and packed, lo in the low half (the lower column of an
// mma fragment): bf16x2, or f16x2 when F16. One sm_80+ instruction; bf16 rounds exactly as
// from_float<bf16> (NaN bits aside), which older targets fall back to.
template <bool F16>
__device__ __forceinline__ unsigned int pack_pair(float lo, float hi) {
  unsigned int r;
  if constexpr (F16) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#else
    r = from_float<bf16>(lo).bits | (static_cast<unsigned int>(from_float<bf16>(hi).bits) << 16);
#endif
  }
  return r;
}

// d += A (16 x 16, row-major fragment a0..a3) * B (16 x 8, col-major fragment b0, b1) with fp32
// accumulation, one mma.sync m16n8k16 (sm_80+): f16 operands when F16, else bf16. The one copy of
// the instruction the tensor-core kernels (chunked delta rule, fp8 GEMV, paged attention) use.
template <bool F16>
__device__ __forceinline__ void mma_16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2,
                                          unsigned a3, unsigned b0, unsigned b1) {
  if constexpr (F16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// SwiGLU of one gate and up element as torch's `F.silu(gate) * up` in T: silu rounded to T, then
// the product rounded to T. silu_mul's kernels and the bf16 GEMV's SwiGLU input share it, so a
// fused GEMV sees the very bits silu_mul would have written.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + __expf(-g)); }

// The logistic function with the fast exp, as every kernel here computes it (beta = sigmoid(b),
// the attention and shared-expert gates).
__device__ __forceinline__ float sigmoid(float v) { return 1.0f / (1.0f + __expf(-v)); }

template <typename T>
__device__ __forceinline__ T swiglu(T gate, T up) {
  const float g = to_float(gate);
  const float act = to_float(from_float<T>(silu(g)));
  return from_float<T>(act * to_float(up));
}

// swiglu() on the two bf16 packed in each of a gate word and an up word.
__device__ __forceinline__ unsigned int swiglu_bf16x2(unsigned int gate, unsigned int up) {
  const unsigned int act = pack_pair<false>(silu(__uint_as_float(gate << 16)),
                                            silu(__uint_as_float(gate & 0xffff0000u)));
  return pack_pair<false>(__uint_as_float(act << 16) * __uint_as_float(up << 16),
                          __uint_as_float(act & 0xffff0000u) * __uint_as_float(up & 0xffff0000u));
}

// o * sigmoid(g) on the two bf16 packed in each of an o word and a g word, rounded as torch's
// bf16 `o * torch.sigmoid(g)`: the sigmoid to bf16, then the product to bf16 (the fast exp, as
// every kernel here). The gated attention's output gate: sigmoid_gate and the bf16 GEMV's
// sigmoid-gate input form share it.
__device__ __forceinline__ unsigned int sigmoid_gate_bf16x2(unsigned int o, unsigned int g) {
  const unsigned int s = pack_pair<false>(sigmoid(__uint_as_float(g << 16)),
                                          sigmoid(__uint_as_float(g & 0xffff0000u)));
  return pack_pair<false>(__uint_as_float(o << 16) * __uint_as_float(s << 16),
                          __uint_as_float(o & 0xffff0000u) * __uint_as_float(s & 0xffff0000u));
}

// The same gate on one element: o * sigmoid(g), the sigmoid rounded to T, then the product (for
// bf16 the very bits of sigmoid_gate_bf16x2). The paged decode attention's gated combine.
template <typename T>
__device__ __forceinline__ T sigmoid_gated(T o, T g) {
  const float s = to_float(from_float<T>(sigmoid(to_float(g))));
  return from_float<T>(to_float(o) * s);
}

// 16 bytes of a read-once weight stream: not allocated in L1, 256-byte L2 prefetch (sm_80+).
__device__ __forceinline__ uint4 ld_stream16(const unsigned char* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// ld_stream16 of model weights, which no kernel writes: the one load a kernel may issue before
// pdl_wait() besides L2 prefetches and cp.async weight copies (tests/unit/kernels/test_pdl.py
// allows it there by this name), so its first loads overlap the previous kernel's tail.
__device__ __forceinline__ uint4 ld_weight16(const unsigned char* p) { return ld_stream16(p); }

// A weight's fp32 block scale (also never written by a kernel), through the read-only path: the
// other load allowed before pdl_wait() (test_pdl.py: names beginning ld_weight).
__device__ __forceinline__ float ld_weight_scale(const float* p) { return __ldg(p); }

// e4m3 (fn: no infinities, S.1111.111 is NaN) to fp32, exact.
__device__ __forceinline__ float e4m3_to_float(unsigned int v) {
  const unsigned int sign = (v & 0x80u) << 24;
  const unsigned int mag = v & 0x7fu;
  float f;
  if (mag == 0x7fu) {
    f = __uint_as_float(0x7fc00000u);
  } else if (mag >= 8u) {  // normal: exponent e - 7 -> fp32 exponent e + 120
    f = __uint_as_float((mag << 20) + (120u << 23));
  } else {  // subnormal: mantissa * 2^-9
    f = static_cast<float>(mag) * 0.001953125f;
  }
  return __uint_as_float(__float_as_uint(f) | sign);
}

// Two e4m3 bytes (lo in bits 0-7) to fp32, exact, NaN kept: one PTX cvt to f16x2 (sm_89+) and
// two widenings, where `e4m3_to_float` above spends about eight integer ops per byte.
__device__ __forceinline__ void fp8x2_to_float2(unsigned short v, float& lo, float& hi) {
  unsigned int h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
  const unsigned short l = static_cast<unsigned short>(h2 & 0xffffu);
  const unsigned short h = static_cast<unsigned short>(h2 >> 16);
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(l));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(h));
}

// fp32 to e4m3, round to nearest even, saturating at 448 (NaN stays NaN).
__device__ __forceinline__ unsigned int float_to_e4m3(float v) {
  const unsigned int sign = (__float_as_uint(v) >> 24) & 0x80u;
  if (v != v) return sign | 0x7fu;
  const float a = fminf(fabsf(v), 448.0f);
  if (a < 0.015625f) {  // below the smallest normal 2^-6: multiples of 2^-9 (8 rounds to 2^-6)
    return sign | static_cast<unsigned int>(__float2int_rn(a * 512.0f));
  }
  unsigned int u = __float_as_uint(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, ties to even
  return sign | ((u >> 20) - (120u << 3));
}

// Programmatic dependent launch (kernels/pdl.py): the first statement of every ninfer kernel is
// pdl_begin(), or pdl_trigger() with pdl_wait() before the kernel's first access to memory an
// earlier kernel may write or read (only L2 prefetches of constant weights may precede it).
// pdl_trigger: the next PDL-launched kernel's blocks may be scheduled once every block of this
// grid has started. pdl_wait: returns once the previous grid in the stream has completed and
// its writes are visible. Both are no-ops for a launch without the attribute; absent below sm_90.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_begin() {
  pdl_trigger();
  pdl_wait();
}

// cp.async of 16 bytes into shared memory, bypassing L1 (zero-filled when !ok; src stays a
// valid address either way): the tensor-core GEMVs' and the grouped expert mma's weight rings.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  const unsigned int d = static_cast<unsigned int>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(d), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// A hint to bring one line of constant data (weights) into L2 while a kernel waits on its
// predecessor (L2 is the point of coherence, so a prefetch can never expose stale data).
__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
