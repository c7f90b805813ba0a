"""Fused residual add + zero-centred RMSNorm (CUDA launcher and torch twin)."""
