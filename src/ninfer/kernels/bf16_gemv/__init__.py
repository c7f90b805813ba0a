"""bf16 GEMV for decode-sized plain projections with few output rows (K split across the warps of
a block): torch twin (reference.py) and the CUDA launcher (launch.py)."""
