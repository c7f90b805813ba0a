"""Quantized KV-cache kernels against their torch twins, and the model with each KV dtype (GPU).

GPU only; fresh random inputs each run (`gen` draws a new seed). Stated tolerances:
- kv_store: stored bytes, row scales and nvfp4 block scales bit-equal to the twin's (both round
  to nearest even from the same correctly rounded divisions).
- kv_gather: dequantized pages bit-equal to the twin's (code * scale in fp32, rounded once).
- paged decode over quantized pages: ||got - want|| / ||want|| per row < 1e-4 with fp32 q and
  < 1e-2 with bf16 q (the twin dequantizes to fp32 exactly as the kernel does; they differ in
  summation order and the fast exp), as for plain pages. Rows the kernel must not read have NaN
  scales, so reading one shows up as NaN.
- the tiny model (fp32) with CUDA kernels vs with the kv kernels switched off (torch twins on
  the same GPU): logits within 1e-4 relative per row; each KV dtype vs the bf16 cache within the
  CPU test's tolerances (tests/unit/model/test_kv_dtype.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer.artifact.reader import Artifact
from ninfer.kernels.kv_quant import formats
from ninfer.kernels.kv_quant import launch as kv_cuda
from ninfer.kernels.kv_quant import reference as kv_ref
from ninfer.kernels.kv_quant.formats import KV_DTYPES, QuantPages
from ninfer.kernels.paged_decode_attention import launch as paged_cuda
from ninfer.kernels.paged_decode_attention import reference as paged_ref
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model
from support.gpu_checks import capture_graph, rel

pytestmark = pytest.mark.gpu
FMTS = ["int8", "fp8", "nvfp4"]
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
QUANT_KV = ["int8", "fp8", "nvfp4", "k8v4"]


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator("cuda").manual_seed(torch.seed() % 2**31)


def _clone(pages: QuantPages) -> QuantPages:
    block = None if pages.block_scale is None else pages.block_scale.clone()
    return QuantPages(pages.fmt, pages.values.clone(), pages.scale.clone(), block)


# -- store -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize(
    "num_tokens,heads,d",
    [(1, 4, 256), (7, 4, 256), (300, 2, 256), (5, 2, 32), (9, 3, 64), (33, 1, 128), (4, 2, 512)],
    ids=["27b-decode", "27b-odd", "35b-prefill", "tiny-d32", "d64", "d128", "d512"],
)
def test_store_is_bit_equal_to_the_twin(dtype, fmt, num_tokens, heads, d, gen) -> None:
    page = 16
    num_pages = max(12, -(-num_tokens // page) + 2)  # room for every row, and unused slots
    pages = formats.allocate(fmt, (num_pages, page, heads, d), dtype=dtype, device="cuda")
    assert isinstance(pages, QuantPages)
    # V is a strided view into the fused projection: read through token and head strides
    proj = torch.randn(num_tokens, heads * d + 40, device="cuda", generator=gen).to(dtype)
    proj *= torch.logspace(-2, 2, num_tokens, device="cuda")[:, None].to(dtype)
    x = proj[:, 40:].view(num_tokens, heads, d)
    assert num_tokens == 1 or not x.is_contiguous()  # (one row of a view is contiguous)
    slots = torch.randperm(num_pages * page, device="cuda", generator=gen)[:num_tokens]
    twin = _clone(pages)
    assert kv_cuda.supports_store(x, pages)
    kv_cuda.store_kv(x, pages, slots)
    kv_ref.store_kv(x, twin, slots)
    for got, want in zip(pages.tensors(), twin.tensors(), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("fmt", FMTS)
def test_store_in_a_graph_equals_eager(fmt, gen) -> None:
    pages = formats.allocate(fmt, (8, 64, 4, 256), dtype=torch.bfloat16, device="cuda")
    x = torch.randn(3, 4, 256, device="cuda", generator=gen).to(torch.bfloat16)
    slots = torch.tensor([5, 130, 511], device="cuda")
    graph, _ = capture_graph(lambda: kv_cuda.store_kv(x, pages, slots))
    twin = _clone(pages)
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
    slots.copy_(torch.tensor([0, 64, 300]))
    graph.replay()
    kv_ref.store_kv(x, twin, slots)
    assert all(torch.equal(a, b) for a, b in zip(pages.tensors(), twin.tensors(), strict=True))


# -- gather ------------------------------------------------------------------------------------


def _random_pages(fmt, shape, gen, *, dtype=torch.bfloat16):
    pages = formats.allocate(fmt, shape, dtype=dtype, device="cuda")
    n, p, h, d = shape
    rows = torch.randn(n * p, h, d, device="cuda", generator=gen) * 3
    kv_ref.store_kv(rows, pages, torch.arange(n * p, device="cuda"))
    return pages


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("shape", [(20, 64, 4, 256), (9, 16, 2, 32), (7, 1, 3, 128)])
def test_gather_is_bit_equal_to_the_twin(dtype, fmt, shape, gen) -> None:
    pages = _random_pages(fmt, shape, gen)
    ids = torch.randint(0, shape[0], (2, 5), device="cuda", generator=gen)  # [B, n] like a table
    got = kv_cuda.gather_pages(pages, ids, dtype)
    want = kv_ref.gather_pages(pages, ids, dtype)
    assert got.shape == (2, 5, *shape[1:]) and got.dtype == dtype
    assert torch.equal(got, want)


# -- paged decode over quantized pages ---------------------------------------------------------


def _quant_case(gen, dtype, kv_dtype, lens, hq, hk, d, page):
    """Shuffled pages, tables wider than the lengths (padded with a live page), quantized K and
    V whose unread rows carry NaN scales."""
    num_seqs = len(lens)
    width = -(-max(lens) // page) + 2
    num_pages = num_seqs * width + 2
    k_fmt, v_fmt = KV_DTYPES[kv_dtype]
    k_pages = _random_pages(k_fmt, (num_pages, page, hk, d), gen)
    v_pages = _random_pages(v_fmt, (num_pages, page, hk, d), gen)
    order = torch.randperm(num_pages, device="cuda", generator=gen)
    table = order[: num_seqs * width].view(num_seqs, width).clone()
    live = torch.zeros(num_pages, page, dtype=torch.bool, device="cuda")
    for b, n in enumerate(lens):
        table[b, -(-n // page) :] = table[b, 0]
        pos = torch.arange(n, device="cuda")
        live[table[b, pos // page], pos % page] = True
    k_pages.scale[~live] = float("nan")
    v_pages.scale[~live] = float("nan")
    q = torch.randn(num_seqs, hq, d, device="cuda", generator=gen).to(dtype)
    return q, k_pages, v_pages, table, torch.tensor(lens, device="cuda")


MIXED = (1, 17, 1000, 4096, 32768, 63, 2049, 64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kv_dtype", QUANT_KV)
@pytest.mark.parametrize(
    "lens,hq,hk,d,page",
    [
        ((1000,), 24, 4, 256, 64),
        ((32768,), 24, 4, 256, 64),
        (MIXED, 24, 4, 256, 64),
        ((1, 300, 4097), 16, 2, 256, 64),
        ((5, 70), 4, 2, 32, 16),
        ((129, 3), 8, 2, 128, 1),
    ],
    ids=["27b-b1-1000", "27b-b1-32k", "27b-b8-mixed", "35b-b3", "tiny-d32", "d128-page1"],
)
def test_paged_decode_over_quantized_pages_matches_the_twin(
    dtype, kv_dtype, lens, hq, hk, d, page, gen
) -> None:
    q, k_pages, v_pages, table, kv_lens = _quant_case(gen, dtype, kv_dtype, lens, hq, hk, d, page)
    assert paged_cuda.supports(q, k_pages, v_pages)
    got = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    assert not want.isnan().any()
    for b in range(len(lens)):
        assert rel(got[b], want[b]) < TOL[dtype], f"row {b} (len {lens[b]})"


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8"])
@pytest.mark.parametrize(
    "lens,hq,hk,d,page",
    [((32768,), 24, 4, 256, 64), (MIXED, 24, 4, 256, 64), ((1, 300, 4097), 16, 2, 256, 64),
     ((129, 3), 8, 2, 128, 1)],
    ids=["27b-b1-32k", "27b-b8-mixed", "35b-b3", "d128-page1"],
)  # fmt: skip
def test_tensor_core_partial_equals_the_cuda_core_one(kv_dtype, lens, hq, hk, d, page, gen):
    """The mma partial (f16 codes, scales on the scores and on p, p rounded to f16) against the
    CUDA-core partial (fp32 throughout) on the same bf16 q and quantized pages: per row < 1e-2,
    the bf16 tolerance of both against the twin; it must serve these shapes, or the test says
    nothing."""
    q, k_pages, v_pages, table, kv_lens = _quant_case(
        gen, torch.bfloat16, kv_dtype, lens, hq, hk, d, page
    )
    code = paged_cuda.FORMAT_CODES[k_pages.fmt]
    assert paged_cuda.uses_tensor_cores(q, hq // hk, code, code)
    got = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    core = paged_cuda.paged_decode_attention(
        q, k_pages, v_pages, table, kv_lens, scale=d**-0.5, tensor_cores=False
    )
    assert not got.isnan().any()
    for b in range(len(lens)):
        assert rel(got[b], core[b]) < 1e-2, f"row {b} (len {lens[b]})"
    two = paged_cuda.paged_decode_attention(
        q, k_pages, v_pages, table, kv_lens, scale=d**-0.5, mma_tiles=2
    )
    assert torch.equal(two, got)  # two tiles per warp iteration: same products, same order


def test_paged_decode_over_quantized_pages_replays_in_a_graph(gen) -> None:
    q, k_pages, v_pages, table, kv_lens = _quant_case(
        gen, torch.bfloat16, "k8v4", (900, 17, 2048), 24, 4, 256, 64
    )
    graph, out = capture_graph(
        lambda: paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    )
    kv_lens.copy_(torch.tensor([1, 2048, 33]))  # row 1 now reads rows that were NaN-scaled
    q.copy_(torch.randn(q.shape, device="cuda", generator=gen))
    for pages in (k_pages, v_pages):
        pages.scale.copy_(torch.rand(pages.scale.shape, device="cuda", generator=gen) + 0.5)
    graph.replay()
    eager = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    assert torch.equal(out, eager)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    assert rel(out, want) < 1e-2


# -- the model ---------------------------------------------------------------------------------


def _run(path: Path, kv_dtype: str, prompt: list[int], steps: int) -> torch.Tensor:
    with Artifact(path) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(config, art.load("text"), dtype=torch.float32, device="cuda:0")
    cache = ModelCache.allocate(
        config, num_pages=16, num_slots=2, page_size=16, dtype=torch.float32, device="cuda:0",
        kv_dtype=kv_dtype,
    )  # fmt: skip
    pages = [5, 2, 9, 0, 12, 7]
    rows = []
    first = 40  # a fresh prefill, then a continued chunk, then decode steps
    for start, stop in ((0, first), (first, len(prompt) - steps)):
        batch = ForwardBatch.prefill(
            prompt[start:stop], num_computed=start, page_ids=pages, state_slot=1, device="cuda:0"
        )
        rows.append(model.forward(batch, cache, all_logits=True))
    for pos in range(len(prompt) - steps, len(prompt)):
        batch = ForwardBatch.decode(
            prompt[pos : pos + 1], num_computed=[pos], page_tables=[pages], state_slots=[1],
            device="cuda:0",
        )  # fmt: skip
        rows.append(model.forward(batch, cache))
    return torch.cat(rows).cpu()


def _prompt(n: int) -> list[int]:
    return torch.randint(0, 8192, (n,), generator=torch.Generator().manual_seed(21)).tolist()


@pytest.mark.parametrize("kv_dtype", QUANT_KV)
def test_model_with_kv_kernels_equals_the_twins_on_the_gpu(
    dense_artifact: Path, kv_dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = _prompt(70)
    got = _run(dense_artifact, kv_dtype, prompt, steps=6)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "kv_store,kv_gather,paged_decode_attention")
    want = _run(dense_artifact, kv_dtype, prompt, steps=6)
    errs = (got - want).abs().amax(-1) / want.abs().amax(-1)
    assert errs.max().item() < 1e-4, errs
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    plain = _run(dense_artifact, "bf16", prompt, steps=6)
    tol = {"int8": 4e-3, "fp8": 2e-2, "nvfp4": 5e-2, "k8v4": 5e-2}[kv_dtype]
    assert ((got - plain).abs().max() / plain.abs().max()).item() < tol
