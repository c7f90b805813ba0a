"""fp8 prefill GEMM: 1x128 activation quantisation + block-scaled `_scaled_mm` (or dequantize)."""
