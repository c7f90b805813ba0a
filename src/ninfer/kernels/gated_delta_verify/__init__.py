"""Speculative verify and fold kernels of the Gated DeltaNet layers (see launch.py)."""
