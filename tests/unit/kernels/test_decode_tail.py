"""Host-side launch plans of the decode-tail kernels (add_rms_norm, paged decode attention).

The kernels themselves run only on a GPU (test_decode_tail_gpu.py); what is checked here is the
arithmetic the launchers do on the host: every element or KV position is covered, the limits the
kernels are compiled for hold, and the split plan reads nothing but host facts.
"""

from __future__ import annotations

import pytest
import torch
from tests.support.kernel_sources import parameter_count

from ninfer.kernels.add_rms_norm import launch as add_norm_launch
from ninfer.kernels.paged_decode_attention import launch as paged_launch


@pytest.mark.parametrize("element_size", [2, 4])
@pytest.mark.parametrize("n", [8, 48, 256, 2048, 5120, 4096 + 8, 17408, 16384, 32768])
def test_vec_plan_covers_the_row_within_the_kernel_limits(element_size: int, n: int) -> None:
    plan = add_norm_launch.vec_plan(n, element_size)
    num_vecs = n * element_size // 16
    if num_vecs > 512 * 8:
        assert plan is None  # beyond 512 threads x 8 vectors: the two-pass row kernel
        return
    assert plan is not None
    assert plan.chunks in add_norm_launch.CHUNK_CHOICES
    assert plan.num_threads % 32 == 0 and 32 <= plan.num_threads <= 512
    assert plan.chunks * plan.num_threads >= num_vecs  # every vector has a thread
    assert plan.chunks * (plan.num_threads - 32) < num_vecs  # no whole idle warp


def test_vec_plan_declines_rows_off_the_vector_grid() -> None:
    assert add_norm_launch.vec_plan(5124, 2) is None  # 5124 bf16 is not a whole number of 16 B
    assert add_norm_launch.vec_plan(6, 4) is None
    assert add_norm_launch.vec_plan(0, 2) is None
    assert add_norm_launch.vec_plan(5124, 4) is not None  # 5124 fp32 is 1281 vectors


def test_vec_plan_at_the_decode_rows() -> None:
    """27B rows: 640 bf16 vectors as 320 threads x 2; 35B rows: 256 threads x 1."""
    assert add_norm_launch.vec_plan(5120, 2) == (2, 320)
    assert add_norm_launch.vec_plan(2048, 2) == (1, 256)
    assert add_norm_launch.vec_plan(5120, 4) == (4, 320)


@pytest.mark.parametrize("num_seqs", [1, 2, 8, 64])
@pytest.mark.parametrize("num_kv_heads,group", [(4, 6), (2, 8), (1, 1), (8, 16)])
@pytest.mark.parametrize("capacity", [1, 64, 1024, 1088, 2048, 32960, 65536, 262144, 1 << 20])
def test_split_plan_covers_the_capacity(num_seqs, num_kv_heads, group, capacity) -> None:
    plan = paged_launch.plan_splits(num_seqs, num_kv_heads, group, capacity)
    size = plan.tokens_per_split
    assert size >= 32 and size & (size - 1) == 0  # whole chunks of 8 tokens for each warp
    assert plan.num_splits * size >= capacity > (plan.num_splits - 1) * size
    assert group * size <= paged_launch.SCORE_FLOATS
    blocks = num_seqs * num_kv_heads * plan.num_splits
    if blocks > paged_launch.MAX_BLOCKS:  # only where the split is at its shared-memory cap
        assert group * size * 2 > paged_launch.SCORE_FLOATS
    if size > 32:  # the smallest split that keeps within MAX_BLOCKS
        assert num_seqs * num_kv_heads * -(-capacity // (size // 2)) > paged_launch.MAX_BLOCKS


def test_split_plan_at_the_27b_decode_shapes() -> None:
    """Batch 1, 4 KV heads of 6 q heads: 1k splits of 32 tokens (~1 block per SM), 32k of 128."""
    assert paged_launch.plan_splits(1, 4, 6, 1088) == (32, 34)
    assert paged_launch.plan_splits(1, 4, 6, 2048) == (32, 64)
    assert paged_launch.plan_splits(1, 4, 6, 32960) == (128, 258)
    assert paged_launch.plan_splits(8, 4, 6, 2048) == (32, 64)  # 2,048 blocks
    assert paged_launch.plan_splits(8, 4, 6, 4096) == (64, 64)
    # the tensor-core partial's plan: about two blocks per SM (docs/perf.md run T2) over the
    # live tokens, half of a graph table's power-of-two capacity at least
    mma = paged_launch.MMA_MAX_BLOCKS
    assert paged_launch.plan_splits(1, 4, 6, 1088, mma) == (32, 34)
    assert paged_launch.plan_splits(8, 4, 6, 1088, mma) == (128, 9)
    assert paged_launch.plan_splits(8, 4, 6, 32832, mma) == (1024, 33)
    assert paged_launch.plan_splits(1, 4, 6, 65536, mma, 32768) == (512, 128)  # 32k in 64k
    assert paged_launch.plan_splits(1, 4, 6, 16384, mma, 8192) == (128, 128)  # 8k in 16k
    assert paged_launch.plan_splits(8, 4, 6, 2048, mma, 1024) == (128, 16)  # 1k in 2k, 8 rows
    assert paged_launch.plan_splits(1, 4, 6, 2048, mma, 1024) == (32, 64)


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256, 512])
@pytest.mark.parametrize("group", [1, 2, 6, 8, 16])
def test_partial_shared_memory_fits_the_default_limit(head_dim: int, group: int) -> None:
    """Every supported shape stays under the 48 KiB a launch gets without an opt-in."""
    q = torch.empty(1, group * 2, head_dim)
    k_pages = torch.empty(1, 16, 2, head_dim)
    if not paged_launch.supports(q, k_pages):
        assert group * head_dim // 32 > paged_launch.MAX_REGS_PER_LANE
        return
    for capacity in (32, 4096, 1 << 20):
        plan = paged_launch.plan_splits(1, 1, group, capacity)
        assert paged_launch.partial_smem_bytes(group, head_dim, plan.tokens_per_split) <= 48 * 1024


def test_supports_the_model_shapes_and_declines_the_rest() -> None:
    bf16 = torch.bfloat16
    pages = torch.empty(2, 64, 4, 256, dtype=bf16)
    assert paged_launch.supports(torch.empty(1, 24, 256, dtype=bf16), pages)  # 27B
    pages_35b = torch.empty(2, 64, 2, 256, dtype=bf16)
    assert paged_launch.supports(torch.empty(8, 16, 256, dtype=bf16), pages_35b)  # 35B-A3B
    assert not paged_launch.supports(torch.empty(1, 24, 256), pages)  # dtype mismatch
    assert not paged_launch.supports(torch.empty(1, 6, 48), torch.empty(2, 16, 2, 48))  # D % 32
    assert not paged_launch.supports(torch.empty(1, 64, 32), torch.empty(2, 16, 2, 32))  # G 32
    assert not paged_launch.supports(torch.empty(1, 2, 1024), torch.empty(2, 16, 2, 1024))
    assert not paged_launch.supports(torch.empty(1, 5, 64), torch.empty(2, 16, 2, 64))  # 5 % 2


@pytest.mark.parametrize("on,want", [("", paged_launch.MMA_TILES), ("paged_mma_tiles2", 2)])
def test_dispatch_passes_the_tiles_switch_to_the_kernel(
    monkeypatch: pytest.MonkeyPatch, on: str, want: int
) -> None:
    """As on a GPU (support stubbed): `NINFER_KERNELS_ON=paged_mma_tiles2` reaches the launcher
    as mma_tiles=2 (a model A/B of the two-tile form); without it the launcher's default."""
    from ninfer.kernels import dispatch

    seen: list[int] = []
    monkeypatch.setenv("NINFER_KERNELS_ON", on)
    monkeypatch.setattr(dispatch, "paged_decode_supported", lambda *a: True)
    monkeypatch.setattr(
        paged_launch, "paged_decode_attention", lambda *a, **kw: seen.append(kw["mma_tiles"])
    )
    q = torch.zeros(1, 8, 64)
    dispatch.paged_decode_attention(q, q, q, q, q, scale=1.0)
    assert seen == [want]


def test_split_cap_keeps_short_plans_and_cuts_long_ones() -> None:
    """`cap_split`: a plan within the cap is unchanged; a longer one becomes splits of the cap
    covering the same capacity, within the block's score memory."""
    cap = paged_launch.MMA_MAX_SPLIT_TOKENS
    assert cap >= paged_launch.MIN_SPLIT_TOKENS and cap & (cap - 1) == 0
    assert cap * paged_launch.MMA_MAX_GROUP <= paged_launch.SCORE_FLOATS
    mma = paged_launch.MMA_MAX_BLOCKS
    short = paged_launch.plan_splits(8, 4, 6, 2048, mma, 1024)  # 27B, 8 rows at 1k
    assert paged_launch.cap_split(short, 2048, cap) == short
    long = paged_launch.plan_splits(64, 2, 8, 4096, mma, 2048)  # 35B, 64 rows at 2k
    assert long == (1024, 4)
    assert paged_launch.cap_split(long, 4096, cap) == (256, 16)
    assert paged_launch.cap_split(long, 4000, cap) == (256, 16)  # the last split partly past


def test_mma_plan_caps_only_many_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's plan: the small batches the block cap was measured on keep their plans
    (1 row at 32k: 512-token splits); 64 rows of the 35B (128 pairs) and of the 27B (256), and
    16 of the 27B (64), get 256-token splits; `NINFER_KERNELS_OFF=paged_split_cap` restores the
    uncapped plan."""
    plan = paged_launch.mma_plan
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    assert plan(1, 4, 6, 65536) == (512, 128)  # 4 pairs: as plan_splits alone
    assert plan(8, 4, 6, 2048) == (128, 16)  # 32 pairs
    assert plan(8, 4, 6, 65536) == paged_launch.plan_splits(8, 4, 6, 65536, 320, 32768)
    assert plan(16, 4, 6, 4096) == (256, 16)  # 64 pairs: capped from (512, 8)
    assert plan(64, 2, 8, 4096) == (256, 16)  # 128 pairs: capped from (1024, 4)
    assert plan(64, 4, 6, 2048) == (256, 8)  # 256 pairs: capped from (1024, 2)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_split_cap")
    assert plan(64, 2, 8, 4096) == (1024, 4)
    assert plan(64, 4, 6, 2048) == (1024, 2)
    assert plan(16, 4, 6, 4096) == (512, 8)


def test_warp_combine_serves_plans_of_at_most_32_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """One warp per (row, head) needs one split per lane and whole float4s per lane."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    use = paged_launch.uses_warp_combine
    assert use(1, 256) and use(32, 256) and use(16, 128) and use(8, 512)
    assert not use(33, 256) and not use(128, 256)
    assert not use(4, 64) and not use(4, 96)  # D / 32 not a multiple of 4
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_combine_warp")
    assert not use(16, 256)


def test_v_prefetch_stops_from_32_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mma partial prefetches V below PREFETCH_MAX_PAIRS (row, KV head) pairs: 8 rows of the
    35B-A3B (16 pairs) do, 8 of the 27B (32) and 16 of the 35B-A3B do not; the two switches
    force either way."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    pf = paged_launch.prefetches_v
    assert paged_launch.PREFETCH_MAX_PAIRS == 32
    assert pf(1, 4) and pf(4, 4) and pf(8, 2) and pf(15, 2)
    assert not pf(8, 4) and not pf(16, 2) and not pf(64, 2) and not pf(64, 4)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_prefetch_rule")
    assert pf(64, 4) and pf(8, 4) and pf(1, 4)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_v_prefetch")
    assert not pf(1, 4) and not pf(64, 4)


@pytest.mark.parametrize(
    ("rows", "width", "kw", "partial", "combine"),
    [
        (64, 64, {}, "paged_decode_mma<256, 8, 0, 1, false>", "warp"),  # (256, 16): 16 splits
        (64, 64, {"prefetch_v": True}, "paged_decode_mma<256, 8, 0, 1, true>", "warp"),
        (64, 64, {"warp_combine": False}, "paged_decode_mma<256, 8, 0, 1, false>", "block"),
        (1, 512, {}, "paged_decode_mma<256, 8, 0, 1, true>", "block"),  # 32k: (512, 64)
        (8, 64, {"mma_tiles": 2}, "paged_decode_mma<256, 8, 0, 2, true>", "warp"),
    ],
    ids=["35b-b64", "prefetch", "block-combine", "35b-b1-32k", "35b-b8-tiles2"],
)
def test_paged_attention_launches_on_mocked_kernels(
    monkeypatch: pytest.MonkeyPatch, rows: int, width: int, kw: dict, partial: str, combine: str
) -> None:
    """The launcher with the device checks and launches stubbed (35B-A3B heads, bf16): the
    instances and grids it picks, and as many arguments as each kernel has parameters."""
    from ninfer.kernels import runtime as rt

    calls: list[tuple] = []
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
    monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device, headers=(): instance)
    monkeypatch.setattr(rt, "launch", lambda *a, **kw: calls.append(a))
    page, hq, hk, d = 64, 16, 2, 256
    q = torch.zeros(rows, hq, d, dtype=torch.bfloat16)
    pages = torch.zeros(rows * width, page, hk, d, dtype=torch.bfloat16)
    table = torch.arange(rows * width, dtype=torch.int32).view(rows, width)
    lens = torch.full((rows,), width * page // 2 + 1)
    out = paged_launch.paged_decode_attention(q, pages, pages, table, lens, scale=0.0625, **kw)
    assert out.shape == q.shape and out.dtype == q.dtype
    (k1, grid1, block1, args1), (k2, grid2, block2, args2) = (c[:4] for c in calls)
    plan = paged_launch.mma_plan(rows, hk, hq // hk, width * page)
    assert (k1, grid1, block1) == (partial, (plan.num_splits, hk, rows), (128,))
    assert len(args1) == parameter_count("paged_decode_attention", "paged_decode_mma")
    if combine == "warp":
        assert (k2, grid2) == ("paged_decode_combine_warp<bf16, 256>", (-(-rows * hq // 8), 1, 1))
        assert len(args2) == parameter_count("paged_decode_attention", "paged_decode_combine_warp")
    else:
        assert (k2, grid2) == ("paged_decode_combine<bf16>", (hq, rows, d // 32))
        assert len(args2) == parameter_count("paged_decode_attention", "paged_decode_combine")
    assert block2 == (256,)


@pytest.mark.parametrize("warp_combine", [True, False], ids=["warp", "block"])
def test_gated_combine_passes_the_gate_view(monkeypatch: pytest.MonkeyPatch, warp_combine) -> None:
    """With an output gate (a strided [B, Hq, 2, D] slice, as the model passes it) the combine's
    last three arguments are its address, row stride and head stride; without, null and zeros;
    as many arguments as the kernel has parameters either way."""
    from ninfer.kernels import runtime as rt

    calls: list[tuple] = []
    monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
    monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device, headers=(): instance)
    monkeypatch.setattr(rt, "launch", lambda *a, **kw: calls.append(a))
    rows, page, hq, hk, d = 8, 64, 24, 4, 256
    q = torch.zeros(rows, hq, d, dtype=torch.bfloat16)
    qg = torch.zeros(rows, hq, 2, d, dtype=torch.bfloat16)
    gate = qg[:, :, 1]
    pages = torch.zeros(rows * 16, page, hk, d, dtype=torch.bfloat16)
    table = torch.arange(rows * 16, dtype=torch.int32).view(rows, 16)
    lens = torch.full((rows,), 700)
    for g in (gate, None):
        calls.clear()
        paged_launch.paged_decode_attention(
            q, pages, pages, table, lens, scale=0.0625, warp_combine=warp_combine, gate=g
        )
        kernel, _, _, args = calls[1][:4]
        name = kernel.split("<")[0]
        assert len(args) == parameter_count("paged_decode_attention", name)
        want = (gate.data_ptr(), hq * 2 * d, 2 * d) if g is not None else (0, 0, 0)
        assert tuple(int(a) for a in args[-3:]) == want
