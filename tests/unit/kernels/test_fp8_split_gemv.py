"""fp8_split_gemv's launch plan and operand checks (CPU; the kernel: test_fp8_split_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.bf16_gemv import launch as bf16_launch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.fp8_split_gemv import launch as split


def _plan(rows: int, n: int, k: int, form: int = split.PLAIN) -> bf16_launch.Plan:
    unroll = {rows: split.UNROLL[rows, form]}
    return bf16_launch.plan(rows, n, k, 132, chunk=split.CHUNK, unroll=unroll)


def test_plan_counts_16_weights_a_load() -> None:
    # K = 5120 is 320 chunks of 16: all 8 warps split K (256 chunks a step); 4 rows a group
    p = _plan(1, 34816, 5120)
    assert (p.ks_log2, p.rows_per_group, p.unroll, p.blocks) == (3, 4, 2, 8704)
    # K = 2048 is 128 chunks: 4 warps a group (the bf16 plan, counting 8 a load, would give 8)
    assert _plan(1, 2048, 2048).ks_log2 == 2
    assert bf16_launch.plan(1, 2048, 2048, 132).ks_log2 == 3
    # two plain rows take one step of loads at a time (registers), two SwiGLU rows two
    assert _plan(2, 5120, 17408).unroll == 1
    assert _plan(2, 5120, 17408, bf16_launch.INPUT_SWIGLU).unroll == 2
    # a short N halves the rows per group until the grid has 2 blocks an SM
    assert _plan(1, 1000, 272).rows_per_group == 1


def _operands(rows: int, n: int, k: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, Fp8Weight]:
    w = torch.zeros(n, k).to(torch.float8_e4m3fn)
    scales = torch.ones(-(-n // 128), -(-k // 128))
    return torch.zeros(rows, k, dtype=dtype), Fp8Weight(w, scales)


@pytest.mark.parametrize(
    "rows,n,k,dtype,message",
    [
        (3, 256, 256, torch.bfloat16, "x has 3 rows"),
        (1, 256, 256, torch.float32, "x must be bfloat16"),
        (1, 256, 72, torch.bfloat16, "positive multiple of 16"),
        (1, 256, 256, torch.bfloat16, "one CUDA device"),  # every operand check passed
    ],
)
def test_problem_names_the_operand(rows: int, n: int, k: int, dtype, message: str) -> None:
    x, w = _operands(rows, n, k, dtype)
    assert message in split.problem(x, w)
    assert not split.supports(x, w)


def test_scales_of_the_wrong_shape_are_named() -> None:
    x, w = _operands(1, 256, 256)
    bad = Fp8Weight(w.weight, torch.ones(1, 2))
    assert "scales (1, 2) do not match" in split.problem(x, bad)
