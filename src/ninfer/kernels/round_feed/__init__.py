"""What a speculative round leaves per slot for a chained successor, and how that successor takes
it (CUDA launcher and torch twin)."""
