"""Recurrent gated delta rule decode step for a batch (CUDA launcher and torch twin)."""
