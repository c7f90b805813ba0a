"""Quantized KV-cache pages: formats, quantize-on-store, dequantizing reads (CUDA + torch twin)."""
