"""Weight-only fp8 (e4m3, 128x128 block scales) GEMV for decode (CUDA launcher and torch twin)."""
