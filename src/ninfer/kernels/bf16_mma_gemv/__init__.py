"""Tensor-core bf16 skinny GEMM for decode-sized dense projections with up to 64 x rows: torch
twin (reference.py) and the CUDA launcher (launch.py)."""
