"""The CUDA-core fp8 GEMV with bf16_gemv's layout (K split across warps) for 1-2 decode rows."""
