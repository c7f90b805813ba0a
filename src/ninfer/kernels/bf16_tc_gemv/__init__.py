"""bf16 GEMV on tensor cores for 1..8 decode rows (the bf16 twin of fp8_tc_gemv's ring form): the
CUDA launcher (launch.py); its torch twin is `bf16_gemv.reference.bf16_linear` (`F.linear`)."""
