"""SwiGLU activation `silu(gate) * up` over a fused gate-up row (CUDA launcher and torch twin)."""
