"""Attention q/k RMSNorm + partial rotate-half RoPE in one launch (CUDA launcher and torch twin)."""
