"""Split-KV paged decode attention with grouped KV heads (CUDA launcher and torch twin)."""
