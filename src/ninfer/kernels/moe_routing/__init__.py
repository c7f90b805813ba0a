"""MoE router: softmax over experts, top-k with lowest-id tie-breaking (CUDA launcher and twin)."""
