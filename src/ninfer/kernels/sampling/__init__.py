"""Token sampling from a logits row (CUDA launcher and torch twin), and the counter-based RNG."""
