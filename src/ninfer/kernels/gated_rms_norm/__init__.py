"""Gated RMSNorm of the Gated DeltaNet output (CUDA launcher and torch twin)."""
