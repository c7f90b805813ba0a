"""`--compare hf`'s binding: HF transformers over the ninfer model's own tensors, on the CPU.

HF's logits equal to ninfer's CPU reference (fp32) prove the name and shape mapping; storage
pointers prove that HF holds views, not copies; greedy tokens prove the decode driver (cache
keyword, positions) feeds HF correctly.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("transformers")

from ninfer.bench.hf_compare import (  # noqa: E402
    HfBench,
    HfCompareError,
    build_hf_model,
    compare_logits,
    require_hf,
    run_hf_compare,
)
from ninfer.bench.synthetic import random_weights, synthetic_config, synthetic_hf_config  # noqa: E402
from ninfer.model.batch import ForwardBatch  # noqa: E402
from ninfer.model.cache import ModelCache  # noqa: E402
from ninfer.model.qwen3_5 import Qwen3_5Model  # noqa: E402

PAGE = 16


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Tiny ops on a busy 2-core machine: OpenMP spin-waiting slows them many times over."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _model(name: str, seed: int = 3) -> Qwen3_5Model:
    """The CPU reference with merged projections, so HF must take row-slice views of them."""
    weights = random_weights(name, device="cpu", dtype=torch.float32, seed=seed)
    return Qwen3_5Model(
        synthetic_config(name), weights, dtype=torch.float32, device="cpu", fuse_projections=True
    )


def _ninfer_all_logits(model: Qwen3_5Model, ids: list[int]) -> torch.Tensor:
    num_pages = -(-len(ids) // PAGE)
    cache = ModelCache.allocate(
        model.config, num_pages=num_pages, num_slots=1, page_size=PAGE, dtype=torch.float32
    )
    batch = ForwardBatch.prefill(ids, num_computed=0, page_ids=list(range(num_pages)), state_slot=0)
    return model.forward(batch, cache, all_logits=True)  # [T, vocab]


def _ninfer_greedy(
    model: Qwen3_5Model, prompts: list[list[int]], num_steps: int
) -> list[list[int]]:
    """Prefill each row into its own slot and pages, then batched greedy decode steps."""
    context = len(prompts[0])
    pages_per_row = -(-(context + num_steps + 1) // PAGE)
    cache = ModelCache.allocate(
        model.config,
        num_pages=pages_per_row * len(prompts),
        num_slots=len(prompts),
        page_size=PAGE,
        dtype=torch.float32,
    )
    tables = [list(range(r * pages_per_row, (r + 1) * pages_per_row)) for r in range(len(prompts))]
    out = []
    for row, ids in enumerate(prompts):
        batch = ForwardBatch.prefill(ids, num_computed=0, page_ids=tables[row], state_slot=row)
        out.append([int(model.forward(batch, cache).argmax(-1)[0])])
    for step in range(num_steps):
        batch = ForwardBatch.decode(
            [r[-1] for r in out],
            num_computed=[context + step] * len(prompts),
            page_tables=tables,
            state_slots=list(range(len(prompts))),
        )
        for r, t in zip(out, model.forward(batch, cache).argmax(-1).tolist(), strict=True):
            r.append(t)
    return out


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_hf_logits_equal_ninfer_cpu_logits(name: str) -> None:
    model = _model(name)
    hf = build_hf_model(model, synthetic_hf_config(name))
    bench = HfBench(hf, seed=1)
    ids = bench.token_ids(1, 37)  # not a page multiple
    expected = _ninfer_all_logits(model, ids[0].tolist())
    got = bench.forward(ids, bench.new_cache(), 0, 0)[0]  # keep 0: every position
    assert got.shape == expected.shape == (37, 4096)
    scale = expected.abs().max()
    assert scale > 1.0  # O(1) activations: a wrong weight would show
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(scale))


def _storages(model: Qwen3_5Model) -> set[int]:
    """Storage addresses of every tensor the model holds, found by walking its dataclasses
    (independently of the name mapping under test)."""
    found = {t.untyped_storage().data_ptr() for t in (model.embed_tokens, model.norm)}
    found.add(model.lm_head.untyped_storage().data_ptr())
    for layer in model.layers:
        for part in (layer, layer.mixer, layer.ffn):
            for f in dataclasses.fields(part):
                value = getattr(part, f.name)
                if isinstance(value, torch.Tensor):
                    found.add(value.untyped_storage().data_ptr())
    return found


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_hf_parameters_are_views_of_the_ninfer_tensors(name: str) -> None:
    model = _model(name)
    hf = build_hf_model(model, synthetic_hf_config(name))
    ninfer = _storages(model)
    params = dict(hf.named_parameters())
    assert params and all(p.untyped_storage().data_ptr() in ninfer for p in params.values())
    assert all(not p.requires_grad for p in params.values())
    # merged projections: HF's separate matrices are row slices of the one merged matrix
    attn = model.layers[3].mixer
    assert attn.qkv_fused is not None
    q = params["model.layers.3.self_attn.q_proj.weight"]
    k = params["model.layers.3.self_attn.k_proj.weight"]
    assert q.data_ptr() == attn.qkv_fused.data_ptr()
    assert k.data_ptr() == attn.qkv_fused[q.shape[0] :].data_ptr()
    # and a write through ninfer is seen by HF (no copy anywhere)
    model.layers[0].input_layernorm.add_(0.5)
    assert torch.equal(
        params["model.layers.0.input_layernorm.weight"], model.layers[0].input_layernorm
    )


def test_hf_greedy_decode_matches_ninfer_greedy() -> None:
    model = _model("tiny-dense", seed=5)
    bench = HfBench(build_hf_model(model, synthetic_hf_config("tiny-dense")), seed=2)
    ids = bench.token_ids(2, 21)
    tokens, times = bench.greedy(ids, 6)
    assert len(times) == 6 and all(t > 0 for t in times)
    assert tokens == _ninfer_greedy(model, ids.tolist(), 6)


def test_prefill_and_decode_results_are_consistent() -> None:
    model = _model("tiny-moe")
    bench = HfBench(build_hf_model(model, synthetic_hf_config("tiny-moe")))
    p = bench.prefill(40, repeats=1)
    assert (p.num_tokens, p.chunk) == (40, 40)
    assert p.tok_per_s == pytest.approx(40 / p.seconds) and p.ttft_ms == pytest.approx(
        p.seconds * 1e3
    )
    d = bench.decode(3, 17, steps=2)
    assert (d.batch, d.context, d.graphs) == (3, 17, False)
    assert d.tok_per_s == pytest.approx(3 / (d.step_ms / 1e3))


def test_fp8_weights_cannot_be_shared() -> None:
    weights = random_weights("tiny-dense", device="cpu", dtype=torch.float32, fp8=True)
    model = Qwen3_5Model(
        synthetic_config("tiny-dense"), weights, dtype=torch.float32, fp8_weights=True
    )
    with pytest.raises(HfCompareError, match="--weights bf16"):
        build_hf_model(model, synthetic_hf_config("tiny-dense"))


def test_a_shape_mismatch_is_a_typed_error() -> None:
    model = _model("tiny-dense")
    config = synthetic_hf_config("tiny-dense") | {"intermediate_size": 384}
    with pytest.raises(HfCompareError, match=r"mlp\.(gate|up|down)_proj\.weight' is \[.*384"):
        build_hf_model(model, config)


def test_missing_transformers_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    with pytest.raises(HfCompareError, match=r"`--compare hf` needs HF transformers"):
        require_hf()


def test_transformers_without_qwen3_5_names_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", None)
    with pytest.raises(HfCompareError, match=r"Qwen3_5MoeForCausalLM.*transformers \S+ lacks"):
        require_hf(moe=True)
    require_hf(moe=False)  # the dense one is still there


def test_compare_logits_measures_against_hf() -> None:
    hf = torch.tensor([[1.0, 3.0, -2.0], [0.0, 2.0, 1.0]])
    ninfer = torch.tensor([[1.5, 3.0, -2.0], [0.0, 1.0, 1.5]])
    check = compare_logits(ninfer, hf, num_tokens=9)
    assert (check.num_tokens, check.num_positions) == (9, 2)
    assert check.max_abs_diff == pytest.approx(1.0)
    assert check.max_abs_logit == pytest.approx(3.0)
    # ||(0.5, 0, 0, 0, -1, 0.5)|| / ||(1, 3, -2, 0, 2, 1)|| = sqrt(1.5) / sqrt(19)
    assert check.rel_l2 == pytest.approx((1.5 / 19) ** 0.5)
    assert check.argmax_agree == pytest.approx(0.5)  # row 0 agrees (3.0); row 1: 1.5 vs 2.0


def test_run_hf_compare_on_the_cpu_reference() -> None:
    """The whole HF part (what run_bench calls after ninfer's matrix), minus the GPU: in fp32 the
    logit check must find the two models equal, and every cell must be timed."""
    messages: list[str] = []
    result = run_hf_compare(
        _model("tiny-dense"),
        synthetic_hf_config("tiny-dense"),
        prefill_sizes=(48, 24),
        decode_batches=(1, 2),
        decode_context=20,
        decode_steps=2,
        on_progress=messages.append,
    )
    assert [p.num_tokens for p in result.prefill] == [48, 24]
    assert [(d.batch, d.context) for d in result.decode] == [(1, 20), (2, 20)]
    check = result.logit_check
    assert check is not None and (check.num_tokens, check.num_positions) == (48, 16)
    assert check.rel_l2 < 1e-5 and check.argmax_agree == 1.0
    assert result.attn_implementation == "sdpa" and result.decode_steps == 2
    assert messages[0].startswith("HF transformers ") and "HF decode batch 2" in messages[-1]
