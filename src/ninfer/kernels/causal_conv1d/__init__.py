"""Prefill depthwise causal conv1d + SiLU over varlen sequences (CUDA launcher and torch twin)."""
