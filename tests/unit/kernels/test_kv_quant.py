"""KV-cache formats on the CPU: round-trip error bounds per format (the bounds stated in
kernels/kv_quant/reference.py), the byte layout, quantize-on-store into page slots, and attention
over quantized pages equal to attention over the dequantized rows stored as plain pages."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.options import KV_DTYPES as OPTION_KV_DTYPES
from ninfer.kernels.kv_quant import formats
from ninfer.kernels.kv_quant import reference as ref
from ninfer.kernels.kv_quant.formats import KV_DTYPES, QuantPages
from ninfer.kernels.paged_decode_attention.reference import paged_decode_attention
from ninfer.model.layers import gated_attention as attn
from ninfer.model.layers.gated_attention import AttentionMetadata

FMTS = ["int8", "fp8", "nvfp4"]


def _rows(seed: int, n: int = 96, d: int = 64) -> torch.Tensor:
    """Rows of very different magnitudes (1e-3 .. 1e3), one all-zero row, a few outliers."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.logspace(-3, 3, n)[:, None]
    x[0] = 0.0
    x[5, 7] *= 50.0  # an outlier dominates its row (and its nvfp4 block)
    return x


@pytest.mark.parametrize("fmt", FMTS)
def test_round_trip_within_the_stated_bound(fmt: str) -> None:
    x = _rows(1)
    y = ref.dequantize(*ref.quantize(x, fmt), fmt)
    amax = x.abs().amax(-1, keepdim=True)
    err = (y - x).abs()
    if fmt == "int8":
        bound = amax * ref.INT8_ROW_ERROR * (1 + 1e-5)
    elif fmt == "fp8":
        bound = ref.FP8_REL_ERROR * x.abs() + 2.0**-10 * amax / 448 * (1 + 1e-5)
    else:
        bamax = x.abs().unflatten(-1, (-1, 16)).amax(-1).repeat_interleave(16, -1)
        # plus half the e4m3 subnormal step of a tiny block's scale
        bound = ref.NVFP4_BLOCK_ERROR * bamax * (1 + 1e-5) + 2.0**-10 * 6 * amax / 2688
    assert bool((err <= bound).all()), (err - bound).max()
    assert torch.equal(y[0], torch.zeros_like(y[0]))  # a zero row stays zero (scale 1, not NaN)
    # and typical accuracy on Gaussian rows, far inside the worst case
    g = torch.randn(256, 256, generator=torch.Generator().manual_seed(2))
    rel = (ref.dequantize(*ref.quantize(g, fmt), fmt) - g).norm() / g.norm()
    assert rel < {"int8": 0.01, "fp8": 0.035, "nvfp4": 0.12}[fmt], rel


def test_e2m1_rounds_to_nearest_even_and_packs_low_nibble_first() -> None:
    v = torch.tensor([0.25, 0.26, 0.75, 1.25, 1.3, 1.75, 2.5, 2.6, 3.5, 5.0, 5.1, 9.0, -0.5, -6.0])
    want = [0.0, 0.5, 1.0, 1.0, 1.5, 2.0, 2.0, 3.0, 4.0, 4.0, 6.0, 6.0, -0.5, -6.0]
    assert ref.e2m1_values(ref.e2m1_codes(v)).tolist() == want
    # a row whose amax 6 * 448 * s makes every block scale exact: codes are the values themselves
    row = torch.tensor([6.0, -1.0, 0.5, 0.0] * 4 + [3.0] * 16) * 0.01
    values, scale, blocks = ref.quantize(row, "nvfp4")
    assert values.shape == (16,) and blocks.shape == (2,) and scale.shape == ()
    assert values[0].item() == (7 | (0xA << 4))  # 6.0 low nibble, -1.0 (code 2 | sign) high
    torch.testing.assert_close(ref.dequantize(values, scale, blocks, "nvfp4"), row)


def test_formats_and_bytes_per_token() -> None:
    assert tuple(KV_DTYPES) == OPTION_KV_DTYPES
    with pytest.raises(formats.KvDtypeError, match="bf16|int8|fp8|nvfp4|k8v4"):
        formats.kv_formats("fp4")
    # the 27B: 16 full-attention layers x 4 KV heads x D 256
    per_token = {k: 16 * formats.bytes_per_token(k, 4, 256, torch.bfloat16) for k in KV_DTYPES}
    assert per_token == {
        "bf16": 65536,  # 64 KiB (FACTS.md)
        "int8": 16 * 4 * 2 * 260,
        "fp8": 16 * 4 * 2 * 260,
        "nvfp4": 16 * 4 * 2 * (128 + 16 + 4),
        "k8v4": 16 * 4 * (260 + 148),
    }
    with pytest.raises(formats.KvDtypeError, match="multiple of 16"):
        formats.allocate("nvfp4", (2, 4, 1, 24), dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("fmt", FMTS)
def test_store_writes_quantized_rows_into_their_slots_only(fmt: str) -> None:
    pages = formats.allocate(fmt, (5, 4, 2, 32), dtype=torch.float32, device="cpu")
    assert isinstance(pages, QuantPages) and pages.shape == (5, 4, 2, 32)
    x = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(3))
    slots = torch.tensor([17, 3, 4, 9, 0, 19])  # page * 4 + offset, scattered
    ref.store_kv(x, pages, slots)
    page, offset = slots // 4, slots % 4
    got = ref.read_pages(pages, (page, offset), torch.float32)
    assert torch.equal(got, ref.dequantize(*ref.quantize(x, fmt), fmt))
    untouched = torch.ones(5, 4, dtype=torch.bool)
    untouched[page, offset] = False
    assert all(bool((t[untouched] == 0).all()) for t in pages.tensors())


def _case(fmt_k: str, fmt_v: str, seed: int):
    """Quantized pages over three sequences (stale rows everywhere else) and their dequantized
    copy as plain fp32 pages."""
    g = torch.Generator().manual_seed(seed)
    num_pages, page_size, hk, d = 12, 4, 2, 32
    shape = (num_pages, page_size, hk, d)
    k_pages = formats.allocate(fmt_k, shape, dtype=torch.float32, device="cpu")
    v_pages = formats.allocate(fmt_v, shape, dtype=torch.float32, device="cpu")
    all_slots = torch.arange(num_pages * page_size)
    for pages in (k_pages, v_pages):
        ref.store_kv(torch.randn(len(all_slots), hk, d, generator=g) * 2, pages, all_slots)
    every = torch.arange(num_pages)
    plain = [ref.gather_pages(p, every, torch.float32) for p in (k_pages, v_pages)]
    return k_pages, v_pages, plain


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8", "nvfp4", "k8v4"])
def test_attention_over_quantized_pages_equals_it_over_the_dequantized_rows(kv_dtype) -> None:
    k_pages, v_pages, (k_plain, v_plain) = _case(*KV_DTYPES[kv_dtype], seed=4)
    g = torch.Generator().manual_seed(5)
    table = torch.tensor([[3, 7, 1], [0, 11, 5], [9, 2, 6]])
    kv_lens = torch.tensor([9, 1, 12])
    q = torch.randn(3, 4, 32, generator=g)
    got = paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.3)
    want = paged_decode_attention(q, k_plain, v_plain, table, kv_lens, scale=0.3)
    assert torch.equal(got, want)  # the same fp32 rows, the same arithmetic
    # the model's prefill/decode path (gather + SDPA) agrees with the decode twin
    num_new = torch.tensor([3, 1, 2])
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(6, dtype=torch.int64),  # unused by paged_attention
        seq_idx=torch.tensor([0, 0, 0, 1, 2, 2]),
        local_idx=torch.tensor([0, 1, 2, 0, 0, 1]),
        num_computed=kv_lens - num_new,
        kv_lens=kv_lens,
        page_table=table,
        max_query_len=3,
        max_kv_len=12,
    )
    q6 = torch.randn(6, 4, 32, generator=g)
    got = attn.paged_attention(q6, k_pages, v_pages, meta, scale=0.3)
    want = attn.paged_attention(q6, k_plain, v_plain, meta, scale=0.3)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    last = torch.tensor([2, 3, 5])  # each sequence's last token sees its whole KV
    torch.testing.assert_close(
        got[last], paged_decode_attention(q6[last], k_pages, v_pages, table, kv_lens, scale=0.3)
    )


def test_cuda_launchers_say_which_formats_and_shapes_they_take() -> None:
    """Host-side checks only (CPU tensors): what `supports` accepts decides kernel vs twin."""
    from ninfer.kernels.kv_quant import launch as kv_launch
    from ninfer.kernels.paged_decode_attention import launch as paged_launch

    q = torch.empty(2, 24, 256, dtype=torch.bfloat16)

    def pages(fmt: str, d: int = 256) -> formats.KvPages:
        return formats.allocate(fmt, (3, 64, 4, d), dtype=torch.bfloat16, device="cpu")

    for kv_dtype, (k_fmt, v_fmt) in KV_DTYPES.items():
        assert paged_launch.supports(q, pages(k_fmt), pages(v_fmt)), kv_dtype
    assert not paged_launch.supports(q, pages("fp8"), pages("nvfp4", 128))  # K / V shapes differ
    q96 = torch.empty(2, 24, 96, dtype=torch.bfloat16)
    assert paged_launch.supports(q96, pages("int8", 96), pages("fp8", 96))
    # nvfp4 with D = 96: a lane's 3 dims would straddle two 16-value blocks
    assert not paged_launch.supports(q96, pages("nvfp4", 96), pages("nvfp4", 96))
    assert not kv_launch.supports_gather(pages("nvfp4", 96), torch.bfloat16)
    x = torch.empty(5, 4, 256, dtype=torch.bfloat16)
    assert all(kv_launch.supports_store(x, pages(f)) for f in FMTS)
    assert kv_launch.supports_store(x[:, :, :128], pages("int8", 128))  # token/head strides
    assert not kv_launch.supports_store(x[:, :, ::2], pages("int8", 128))  # strided in D
