"""fp8 artifacts bind into the model: dequantized at load on the CPU, kept fp8 (twin) on request.

A tiny checkpoint converted with `--weights fp8` must give exactly the logits of the same model
built from its independently dequantized weights (`artifact.quantize.dequantize_fp8_block`), and
fusion must merge fp8 projections only where their rows stay on the 128-row block grid.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer.artifact.quantize import dequantize_fp8_block, quantize_fp8_block
from ninfer.artifact.reader import Artifact
from ninfer.kernels.fp8_gemv.reference import Fp8Weight, dequantize
from ninfer.model import ForwardBatch, ModelCache, Qwen3_5Model, TextConfig
from ninfer.model.errors import WeightError
from ninfer.model.qwen3_5 import _fuse_rows
from support.tiny_artifacts import FP8_VARIANTS, convert_tiny, variant_spec

VOCAB = 512


@pytest.fixture(scope="module", params=FP8_VARIANTS)
def fp8_artifact(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp(f"fp8-{request.param}")
    spec = variant_spec(request.param, VOCAB)
    return convert_tiny(tmp, spec, seed=5, name="tiny-fp8", weights="fp8")[1]


def _dequantized(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in weights.items():
        if name.endswith("_scale_inv"):
            continue
        if t.dtype == torch.float8_e4m3fn:
            t = dequantize_fp8_block(t, weights[name + "_scale_inv"], torch.float32)
        out[name] = t
    return out


def _logits(model: Qwen3_5Model, config: TextConfig) -> torch.Tensor:
    cache = ModelCache.allocate(config, num_pages=8, num_slots=1, page_size=16, dtype=model.dtype)
    ids = torch.randint(0, VOCAB, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    pages = list(range(8))
    prefill = model.forward(
        ForwardBatch.prefill(ids, num_computed=0, page_ids=pages, state_slot=0),
        cache,
        all_logits=True,
    )
    decode = model.forward(
        ForwardBatch.decode([3], num_computed=[37], page_tables=[pages], state_slots=[0]), cache
    )
    return torch.cat([prefill, decode])


def test_fp8_artifact_gives_the_dequantized_models_logits(fp8_artifact: Path) -> None:
    with Artifact(fp8_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        weights = art.load("text")
        num_fp8 = sum(t.dtype == torch.float8_e4m3fn for t in weights.values())
        assert num_fp8 > 0  # the converter did store fp8 (else this test proves nothing)
        model = Qwen3_5Model(config, weights, dtype=torch.float32)  # strict: scales are used
        reference = Qwen3_5Model(config, _dequantized(weights), dtype=torch.float32)
    assert torch.equal(_logits(model, config), _logits(reference, config))


def test_kept_fp8_fused_runs_the_twin_to_the_same_logits(fp8_artifact: Path) -> None:
    with Artifact(fp8_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        weights = art.load("text")
        kept = Qwen3_5Model(
            config, weights, dtype=torch.float32, fp8_weights=True, fuse_projections=True
        )
        reference = Qwen3_5Model(config, _dequantized(weights), dtype=torch.float32)
    layer = kept.layers[0]
    mixer_weights = [
        getattr(layer.mixer, f) for f in ("out_proj", "o_proj") if hasattr(layer.mixer, f)
    ]
    assert mixer_weights and all(isinstance(w, Fp8Weight) for w in mixer_weights)
    if not config.is_moe:  # gate and up are 128 rows each: fp8 fusion applies
        assert isinstance(layer.ffn.gate_up, Fp8Weight)
    if config.conv_dim % 128 == 0:  # qkv and z merge in fp8, b and a in the compute dtype
        assert isinstance(layer.mixer.in_proj_qkvz, Fp8Weight)
        assert isinstance(layer.mixer.in_proj_ba, torch.Tensor)
    torch.testing.assert_close(
        _logits(kept, config), _logits(reference, config), rtol=1e-4, atol=1e-4
    )


def test_a_missing_scale_is_a_weight_error(fp8_artifact: Path) -> None:
    with Artifact(fp8_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        weights = dict(art.load("text"))
        name = next(n for n, t in weights.items() if t.dtype == torch.float8_e4m3fn)
        del weights[name + "_scale_inv"]
        with pytest.raises(WeightError, match="_scale_inv"):
            Qwen3_5Model(config, weights, dtype=torch.float32)


def _fp8(n: int, k: int, seed: int) -> Fp8Weight:
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return Fp8Weight(*quantize_fp8_block(w))


def test_fp8_fusion_merges_aligned_rows_and_scales() -> None:
    parts = [_fp8(256, 192, 1), _fp8(128, 192, 2), _fp8(70, 192, 3)]
    merged = _fuse_rows(parts)
    assert merged is not None
    fused, views = merged
    assert isinstance(fused, Fp8Weight) and fused.shape == (454, 192)
    assert fused.scale_inv.shape == (4, 2)
    want = torch.cat([dequantize(p.weight, p.scale_inv, torch.float32) for p in parts])
    assert torch.equal(dequantize(fused.weight, fused.scale_inv, torch.float32), want)
    for view, part in zip(views, parts, strict=True):
        assert torch.equal(view.weight.float(), part.weight.float())
        assert torch.equal(view.scale_inv, part.scale_inv)
        assert view.weight.data_ptr() >= fused.weight.data_ptr()  # views, not copies


def test_fp8_fusion_refuses_misaligned_or_mixed_parts() -> None:
    assert _fuse_rows([_fp8(100, 64, 1), _fp8(128, 64, 2)]) is None  # first part ends mid-block
    assert _fuse_rows([_fp8(128, 64, 1), torch.randn(48, 64)]) is None  # fp8 and plain mixed


def test_mtp_head_binds_its_layer_as_the_target_binds_one(fp8_artifact: Path) -> None:
    """The MTP head keeps fp8 and fuses its projections exactly where the target does for a
    full-attention layer of the same shapes (it did neither, reading twice the bytes of an fp8
    head three times a round), and gives the dequantized, unfused head's logits."""
    from ninfer.model.config import LayerType
    from ninfer.model.mtp import MtpHead

    with Artifact(fp8_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        text, mtp = art.load("text"), art.load("mtp")
        assert any(t.dtype == torch.float8_e4m3fn for t in mtp.values())
        kept = Qwen3_5Model(
            config, text, dtype=torch.float32, fp8_weights=True, fuse_projections=True
        )
        plain = Qwen3_5Model(config, _dequantized(text), dtype=torch.float32)
        head = MtpHead(kept, mtp)
        reference = MtpHead(plain, _dequantized(mtp))
    full = next(lay for lay in kept.layers if lay.layer_type is LayerType.FULL)
    for mine, theirs in ((head.attention, full.mixer), (head.ffn, full.ffn)):
        for field in ("o_proj", "qkv_fused", "gate_up", "down_proj", "router_and_gate",
                      "router_gate_shared", "shared_down_proj"):  # fmt: skip
            if hasattr(theirs, field):
                assert type(getattr(mine, field)) is type(getattr(theirs, field)), field
    assert isinstance(head.attention.o_proj, Fp8Weight)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(0, VOCAB, (11,), generator=g)
    hidden = torch.randn((11, config.hidden_size), generator=g)
    logits = []
    for h in (head, reference):
        cache = ModelCache.allocate(
            config, num_pages=2, num_slots=1, page_size=16, dtype=torch.float32,
            extra_attention_layers=1,
        )  # fmt: skip
        batch = ForwardBatch.prefill(ids, num_computed=0, page_ids=[1, 0], state_slot=0)
        logits.append(h.compute_logits(h.forward_hidden(batch, cache, hidden)))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
