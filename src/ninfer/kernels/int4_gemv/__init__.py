"""Weight-only int4 GEMV (packed nibbles, fp32 scales per group of 64) for the shortlist draft
head (`--lm-head-draft`): torch twin (reference.py) and the CUDA launcher (launch.py)."""
