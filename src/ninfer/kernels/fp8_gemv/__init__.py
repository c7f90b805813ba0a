"""Weight-only fp8 (e4m3, 128x128 block scales) GEMV for decode: torch twin and two CUDA launchers.

`launch_tc` (tensor cores, sm_90) is what dispatch runs first; `launch` (CUDA cores, sm_89+) is the
fallback where it does not apply or `NINFER_KERNELS_OFF=fp8_tc` switches it off.
"""
