"""Grouped GEMV over MoE experts read in place by id (CUDA launcher and torch twin)."""
