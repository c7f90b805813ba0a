"""Weight bytes pulled into L2 ahead of the GEMV that reads them (CUDA only: a hint, no twin)."""
