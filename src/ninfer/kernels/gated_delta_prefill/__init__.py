"""Gated delta rule over the prefill tokens of several sequences (CUDA launcher and torch twin)."""
