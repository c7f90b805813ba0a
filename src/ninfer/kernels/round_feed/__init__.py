"""A speculative round's bookkeeping: what it keeps after its verify (`round_commit`), what it
leaves per slot for a chained successor, and how that successor takes it (CUDA launcher and
torch twin)."""
