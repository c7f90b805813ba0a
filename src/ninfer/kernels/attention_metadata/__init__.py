"""The gated attention's per-step index maths in one launch (CUDA launcher and torch twin)."""
