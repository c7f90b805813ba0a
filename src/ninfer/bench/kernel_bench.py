"""Each CUDA kernel against its torch twin at the real decode shapes, replayed in CUDA graphs.

Imports torch, kernels/ and bench.results. Both sides are captured (20 calls per graph) so the
comparison is of GPU time, not of Python launch cost; inputs are random (never zeros), and the
kernel's result on those inputs is checked against the twin before its time is reported.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ninfer.bench.results import KernelTiming
from ninfer.kernels.add_rms_norm import launch as add_norm_cuda
from ninfer.kernels.add_rms_norm import reference as add_norm_ref
from ninfer.kernels.gated_delta_decode import launch as delta_cuda
from ninfer.kernels.gated_delta_decode import reference as delta_ref
from ninfer.kernels.gated_rms_norm import launch as gated_cuda
from ninfer.kernels.gated_rms_norm import reference as gated_ref
from ninfer.kernels.gdn_decode_front import launch as front_cuda
from ninfer.kernels.gdn_decode_front import reference as front_ref
from ninfer.kernels.silu_mul import launch as silu_mul_cuda
from ninfer.kernels.silu_mul import reference as silu_mul_ref

CALLS_PER_GRAPH = 20


def _graph_us(fn: Callable[[], object], replays: int = 10) -> float:
    """Median GPU microseconds per call of `fn`, captured CALLS_PER_GRAPH times in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up: compilation, allocator
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / CALLS_PER_GRAPH)
    times.sort()
    return times[len(times) // 2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench_kernels(device: torch.device, batches: tuple[int, ...] = (1, 8)) -> list[KernelTiming]:
    """27B decode shapes: hidden 5120, 48 value heads x 128, 16 key heads x 128."""
    out = []
    bf16 = torch.bfloat16
    for b in batches:
        x = torch.randn(b, 5120, dtype=bf16, device=device)
        r = torch.randn_like(x)
        w = torch.randn(5120, dtype=bf16, device=device) * 0.1
        err = _rel(
            add_norm_cuda.add_rms_norm(x, r, w, 1e-6)[0],
            add_norm_ref.add_rms_norm(x, r, w, 1e-6)[0],
        )
        out.append(
            KernelTiming(
                "add_rms_norm",
                f"[{b}, 5120] bf16",
                _graph_us(lambda x=x, r=r, w=w: add_norm_ref.add_rms_norm(x, r, w, 1e-6)),
                _graph_us(lambda x=x, r=r, w=w: add_norm_cuda.add_rms_norm(x, r, w, 1e-6)),
                err,
            )
        )
        o = torch.randn(b * 48, 128, device=device)
        z = torch.randn(b * 48, 128, dtype=bf16, device=device)
        nw = torch.randn(128, dtype=bf16, device=device)
        err = _rel(
            gated_cuda.gated_rms_norm(o, z, nw, 1e-6, bf16),
            gated_ref.gated_rms_norm(o, z, nw, 1e-6, bf16),
        )
        out.append(
            KernelTiming(
                "gated_rms_norm",
                f"[{b * 48}, 128] fp32 -> bf16",
                _graph_us(lambda o=o, z=z, nw=nw: gated_ref.gated_rms_norm(o, z, nw, 1e-6, bf16)),
                _graph_us(lambda o=o, z=z, nw=nw: gated_cuda.gated_rms_norm(o, z, nw, 1e-6, bf16)),
                err,
            )
        )
        q = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
        v = torch.randn(b, 48, 128, dtype=bf16, device=device)
        g = -torch.rand(b, 48, device=device)
        beta = torch.rand(b, 48, device=device)
        state = torch.randn(b + 1, 48, 128, 128, device=device) * 0.1
        slots = torch.arange(1, b + 1, device=device)
        ref_state = state.clone()
        want = delta_ref.gated_delta_rule_decode(
            q, k, v, g, beta, ref_state, slots, scale=128**-0.5
        )
        got = delta_cuda.gated_delta_rule_decode(q, k, v, g, beta, state, slots, scale=128**-0.5)
        err = max(_rel(got, want), _rel(state, ref_state))
        args = (q, k, v, g, beta, state, slots)
        out.append(
            KernelTiming(
                "gated_delta_decode",
                f"B={b}, 48 heads, 128x128 fp32 state",
                _graph_us(lambda a=args: delta_ref.gated_delta_rule_decode(*a, scale=0.088)),
                _graph_us(lambda a=args: delta_cuda.gated_delta_rule_decode(*a, scale=0.088)),
                err,
            )
        )
        out.append(_front_timing(b, device))
        gate_up = torch.randn(b, 2 * 17408, dtype=bf16, device=device)
        err = _rel(silu_mul_cuda.silu_mul(gate_up), silu_mul_ref.silu_mul(gate_up))
        out.append(
            KernelTiming(
                "silu_mul",
                f"[{b}, 2 x 17408] bf16",
                _graph_us(lambda gu=gate_up: silu_mul_ref.silu_mul(gu)),
                _graph_us(lambda gu=gate_up: silu_mul_cuda.silu_mul(gu)),
                err,
            )
        )
    return out


def _front_timing(b: int, device: torch.device) -> KernelTiming:
    """The DeltaNet decode front at 27B shapes: 16 key heads, 48 value heads, 128 dims."""
    bf16 = torch.bfloat16
    channels = 2 * 16 * 128 + 48 * 128
    qkv = torch.randn(b, channels, dtype=bf16, device=device)
    a = torch.randn(b, 48, dtype=bf16, device=device)
    bb = torch.randn(b, 48, dtype=bf16, device=device)
    conv_w = torch.randn(channels, 4, dtype=bf16, device=device) * 0.5
    a_log = torch.randn(48, device=device)
    dt_bias = torch.randn(48, device=device)
    state = torch.randn(b + 1, channels, 3, dtype=bf16, device=device)
    slots = torch.arange(1, b + 1, device=device)
    kw = {"num_k_heads": 16, "head_k_dim": 128}
    weights = (qkv, a, bb, conv_w, a_log, dt_bias)
    want = front_ref.gdn_decode_front(*weights, state.clone(), slots, **kw)
    got = front_cuda.gdn_decode_front(*weights, state, slots, **kw)
    err = max(_rel(x, y) for x, y in zip(got, want, strict=True))
    args = (qkv, a, bb, conv_w, a_log, dt_bias, state, slots)
    return KernelTiming(
        "gdn_decode_front",
        f"B={b}, 10240 conv channels, 48 heads",
        _graph_us(lambda a=args: front_ref.gdn_decode_front(*a, **kw)),
        _graph_us(lambda a=args: front_cuda.gdn_decode_front(*a, **kw)),
        err,
    )
