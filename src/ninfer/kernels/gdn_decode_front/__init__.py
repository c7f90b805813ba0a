"""Gated DeltaNet decode front: conv update, SiLU, q/k L2 norm, g and beta (launcher and twin)."""
