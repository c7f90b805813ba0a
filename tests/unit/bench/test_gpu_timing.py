"""The cold-L2 weight copies the GEMV sweeps cycle through (`bench.gpu_timing`), on the CPU."""

from __future__ import annotations

import torch

from ninfer.bench.gpu_timing import bf16_weight_copies, copies_for, rotating


def test_copies_span_the_rotation_and_stop_at_the_cap() -> None:
    assert copies_for(178 << 20, 256 << 20, 256) == 2  # 27B gate-up in bf16: two copies
    assert copies_for(1 << 20, 256 << 20, 256) == 256
    assert copies_for(1 << 20, 256 << 20, 64) == 64
    assert copies_for(300 << 20, 256 << 20, 64) == 1  # one weight already spans it


def test_bf16_copies_are_distinct_scaled_bf16_weights() -> None:
    weights = bf16_weight_copies(64, 256, torch.device("cpu"), rotate_bytes=1 << 17, max_copies=8)
    assert len(weights) == 4  # 32 KiB each
    assert all(w.shape == (64, 256) and w.dtype == torch.bfloat16 for w in weights)
    assert not torch.equal(weights[0], weights[1])
    assert all(0.02 < w.float().std().item() < 0.1 for w in weights)  # ~256^-0.5 = 0.0625
    seen = []
    call = rotating(lambda w: seen.append(w.data_ptr()), weights)
    for _ in range(5):
        call()
    assert seen == [w.data_ptr() for w in weights] + [weights[0].data_ptr()]
