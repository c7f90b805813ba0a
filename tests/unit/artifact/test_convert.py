"""`ninfer convert` on checkpoints saved by transformers itself (the independent reference)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ninfer.artifact.convert import convert
from ninfer.artifact.errors import ConversionError
from ninfer.artifact.quantize import E4M3_MAX
from ninfer.artifact.reader import Artifact

transformers = pytest.importorskip("transformers")

TEXT = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "intermediate_size": 160,
}
MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
}
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}


def _save(tmp: Path, kind: str) -> Path:
    torch.manual_seed(0)
    if kind == "moe":
        cfg = transformers.Qwen3_5MoeConfig(text_config=TEXT | MOE, vision_config=VISION)
        model = transformers.Qwen3_5MoeForConditionalGeneration(cfg)
    else:
        cfg = transformers.Qwen3_5Config(text_config=TEXT, vision_config=VISION)
        model = transformers.Qwen3_5ForConditionalGeneration(cfg)
    with torch.no_grad():
        for p in model.parameters():  # non-trivial values everywhere, including norms
            p.normal_(0, 0.05)
    out = tmp / f"hf-{kind}"
    model.to(torch.bfloat16).save_pretrained(out)
    return out


@pytest.fixture(scope="module", params=["dense", "moe"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _save(tmp_path_factory.mktemp(request.param), request.param)


def _source_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in ckpt.glob("*.safetensors"):
        with safe_open(f, "pt") as h:
            for k in h.keys():  # noqa: SIM118
                out[k] = h.get_tensor(k)
    return out


def _expected(src: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """What the artifact must hold, derived from the HF keys independently of the converter."""
    exp: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for k, t in src.items():
        if k == "lm_head.weight":
            exp["text.lm_head.weight"] = t
        elif k.startswith("model.language_model."):
            rel = k.removeprefix("model.language_model.")
            if ".mlp.experts." in rel:
                base, rest = rel.split(".mlp.experts.")
                j, proj, _ = rest.split(".")
                experts.setdefault((base, proj), {})[int(j)] = t
            else:
                exp[f"text.{rel}"] = t
        elif k.startswith("model.visual."):
            exp[f"vision.{k.removeprefix('model.visual.')}"] = t
    for (base, proj), by_j in list(experts.items()):
        if proj == "gate_proj":
            up = experts[(base, "up_proj")]
            exp[f"text.{base}.mlp.experts.gate_up_proj"] = torch.stack(
                [torch.cat([by_j[j], up[j]]) for j in range(num_experts)]
            )
        elif proj == "down_proj":
            exp[f"text.{base}.mlp.experts.down_proj"] = torch.stack(
                [by_j[j] for j in range(num_experts)]
            )
    return exp


def test_bf16_conversion_is_bit_exact(checkpoint: Path, tmp_path: Path) -> None:
    out = convert(checkpoint, tmp_path / "m.ninfer", name="tiny/test")
    src = _source_tensors(checkpoint)
    expected = _expected(src, 4)
    with Artifact(out.path) as art:
        assert art.metadata["name"] == "tiny/test"
        assert art.components == ["text", "vision"]
        assert set(art.header.tensors) == set(expected)
        for name, want in expected.items():
            got = art.tensor(name)
            assert got.dtype == torch.bfloat16 and got.shape == want.shape, name
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), name


def test_fp8_conversion_within_e4m3_error(checkpoint: Path, tmp_path: Path) -> None:
    out = convert(checkpoint, tmp_path / "m8.ninfer", weights="fp8")
    expected = _expected(_source_tensors(checkpoint), 4)
    num_fp8 = 0
    with Artifact(out.path) as art:
        for e in art.entries():
            if e.format != "fp8_block128":
                continue
            num_fp8 += 1
            q = art.tensor(e.name).float()
            scale = art.tensor(e.scale)
            full = scale.repeat_interleave(128, -2).repeat_interleave(128, -1)
            full = full[..., : q.shape[-2], : q.shape[-1]]
            want = expected[e.name].float()
            err = (q * full - want).abs()
            # round-to-nearest e4m3: 3 mantissa bits -> relative 2^-4; subnormals: 2^-9 of scale
            bound = want.abs() * 2**-4 + full * 2**-9 + 1e-12
            assert torch.all(err <= bound), e.name
            assert torch.all(q.abs() <= E4M3_MAX)
        assert art.header.tensors["text.lm_head.weight"].dtype == "bf16"
        assert art.header.tensors["text.embed_tokens.weight"].dtype == "bf16"
    assert num_fp8 >= 10


def test_component_selection(checkpoint: Path, tmp_path: Path) -> None:
    out = convert(checkpoint, tmp_path / "t.ninfer", components=["text"])
    with Artifact(out.path) as art:
        assert art.components == ["text"]
        assert not [e for e in art.entries() if e.component == "vision"]
    with pytest.raises(ConversionError, match="'mtp' requested but the checkpoint has none"):
        convert(checkpoint, tmp_path / "x.ninfer", components=["text", "mtp"])


def test_refuses_unsupported_architecture(checkpoint: Path, tmp_path: Path) -> None:
    bad = tmp_path / "llama"
    bad.mkdir()
    cfg = json.loads((checkpoint / "config.json").read_text())
    cfg["model_type"] = "llama"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match="unsupported architecture.*llama"):
        convert(bad, tmp_path / "x.ninfer")


def test_refuses_missing_tensor_before_writing(checkpoint: Path, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    src = _source_tensors(checkpoint)
    victim = "model.language_model.layers.1.linear_attn.in_proj_z.weight"
    del src[victim]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((checkpoint / "config.json").read_text())
    save_file(src, broken / "model.safetensors")
    with pytest.raises(ConversionError, match="missing tensor text.layers.1.linear_attn.in_proj_z"):
        convert(broken, tmp_path / "x.ninfer")
    assert not (tmp_path / "x.ninfer").exists()


def test_cli_convert_and_inspect(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "cli.ninfer"
    run = [sys.executable, "-m", "ninfer.cli.app"]
    r = subprocess.run(
        [*run, "convert", str(checkpoint), str(out), "--weights", "fp8"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [*run, "inspect-artifact", str(out), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["metadata"]["weights"] == "fp8"
    assert any(t["format"] == "fp8_block128" and t["count"] > 0 for t in info["tensors"])
    r = subprocess.run(
        [
            *run,
            "convert",
            str(checkpoint),
            str(tmp_path / "y.ninfer"),
            "--components",
            "text,vision,audio",
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert "unknown component 'audio'" in r.stderr and "Traceback" not in r.stderr


# -- checkpoint layouts: every variant of one seed holds the same weights -------------------------
from ninfer.testing import TinySpec, make_tiny_checkpoint  # noqa: E402

VARIANT_SPEC = TinySpec(kind="moe", vocab_size=1024, hidden_size=160)


@pytest.fixture(scope="module")
def reference_artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("variants")
    ckpt = make_tiny_checkpoint(tmp / "nested", VARIANT_SPEC, seed=7)
    return convert(ckpt, tmp / "nested.ninfer").path


@pytest.mark.parametrize(
    "variant",
    [{"num_shards": 3}, {"layout": "flat"}, {"fused_experts": True}],
    ids=["sharded", "flat", "fused-experts"],
)
def test_layout_variants_convert_to_identical_text_weights(
    variant: dict, reference_artifact: Path, tmp_path: Path
) -> None:
    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", VARIANT_SPEC, seed=7, **variant)
    if variant.get("num_shards"):
        assert (ckpt / "model.safetensors.index.json").is_file()
    out = convert(ckpt, tmp_path / "v.ninfer").path
    with Artifact(out) as art, Artifact(reference_artifact) as ref:
        names = [e.name for e in ref.entries("text")]
        assert sorted(names) == sorted(e.name for e in art.entries("text"))
        for name in names:
            assert torch.equal(
                art.tensor(name).view(torch.int16), ref.tensor(name).view(torch.int16)
            )
        assert ("mtp" in art.components) == ("mtp" in ref.components)


@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_hf_fp8_checkpoint_passes_through_or_dequantizes(
    scale_dtype: torch.dtype, reference_artifact: Path, tmp_path: Path
) -> None:
    ckpt = make_tiny_checkpoint(
        tmp_path / "fp8", VARIANT_SPEC, seed=7, fp8=True, fp8_scale_dtype=scale_dtype
    )
    src = _source_tensors(ckpt)
    key = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight"
    assert src[key].dtype == torch.float8_e4m3fn
    # --weights fp8 keeps the checkpoint's own e4m3 bytes and scales
    out8 = convert(ckpt, tmp_path / "fp8.ninfer", weights="fp8").path
    with Artifact(out8) as art:
        name = "text.layers.0.linear_attn.in_proj_qkv.weight"
        assert art.header.tensors[name].format == "fp8_block128"
        assert torch.equal(art.tensor(name).view(torch.uint8), src[key].view(torch.uint8))
        scale = art.tensor(art.header.tensors[name].scale)
        assert torch.equal(scale, src[key + "_scale_inv"].float())
    # --weights bf16 dequantizes: close to the bf16 checkpoint of the same seed
    out16 = convert(ckpt, tmp_path / "bf16.ninfer").path
    with Artifact(out16) as art, Artifact(reference_artifact) as ref:
        for e in ref.entries("text"):
            got, want = art.tensor(e.name).float(), ref.tensor(e.name).float()
            assert art.header.tensors[e.name].dtype == e.dtype
            assert torch.allclose(got, want, rtol=2**-4, atol=want.abs().max().item() * 2**-8)


def test_convert_chat_template_option_becomes_the_default(
    reference_artifact: Path, tmp_path: Path
) -> None:
    ckpt = make_tiny_checkpoint(tmp_path / "c", VARIANT_SPEC, seed=7)
    tpl = tmp_path / "mine.jinja"
    tpl.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    out = convert(ckpt, tmp_path / "t.ninfer", chat_template=tpl).path
    with Artifact(out) as art:
        assert art.header.default_chat_template == "custom"
        assert art.chat_template() == tpl.read_text()
        assert "ninfer-qwen3_5" in art.header.chat_templates
