"""Quantized KV-cache pages: formats, quantize-on-store and dequantizing reads (CUDA + torch twin)."""
