"""make_tiny_checkpoint: transformers loads every variant with no missing or unexpected keys, the
loaded weights equal the files, forward passes give finite logits, and files are reproducible."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from ninfer.testing import TinyCheckpointError, TinySpec, make_tiny_checkpoint

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

SMALL_VOCAB = 1024
EXPERT_KEY = re.compile(r"^(.+\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, following the shard index when there is one."""
    index = path / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    tensors: dict[str, torch.Tensor] = {}
    for filename in files:
        with safe_open(str(path / filename), "pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[name] = f.get_tensor(name)
    return tensors


def _expected_parameters(
    tensors: dict[str, torch.Tensor], *, drop_mtp: bool = True
) -> dict[str, torch.Tensor]:
    """What transformers should hold: MTP dropped, per-expert keys stacked into its fused
    `gate_up_proj` [E, 2I, H] (gate rows first) and `down_proj` [E, H, I] parameters."""
    expected: dict[str, torch.Tensor] = {}
    experts: dict[tuple[str, str], dict[int, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if drop_mtp and name.startswith("mtp."):
            continue
        match = EXPERT_KEY.match(name)
        if match:
            experts.setdefault((match[1], match[3]), {})[int(match[2])] = tensor
        else:
            expected[name] = tensor
    for (prefix, proj), by_expert in experts.items():
        stacked = torch.stack([by_expert[e] for e in sorted(by_expert)])
        if proj == "down":
            expected[f"{prefix}down_proj"] = stacked
        elif proj == "gate":
            up = torch.stack([experts[(prefix, "up")][e] for e in sorted(by_expert)])
            expected[f"{prefix}gate_up_proj"] = torch.cat([stacked, up], dim=1)
    return expected


def _model_class(kind: str, layout: str) -> type:
    name = {
        ("dense", "nested"): "Qwen3_5ForConditionalGeneration",
        ("moe", "nested"): "Qwen3_5MoeForConditionalGeneration",
        ("dense", "flat"): "Qwen3_5ForCausalLM",
        ("moe", "flat"): "Qwen3_5MoeForCausalLM",
    }[(kind, layout)]
    return getattr(transformers, name)


def _load(path: Path, kind: str, layout: str) -> torch.nn.Module:
    model, info = _model_class(kind, layout).from_pretrained(
        path, output_loading_info=True, dtype=torch.float32
    )
    assert not info["missing_keys"]
    assert all(key.startswith("mtp.") for key in info["unexpected_keys"])
    assert not info["mismatched_keys"]
    return model.eval()


def _assert_finite_varied_logits(logits: torch.Tensor) -> None:
    assert torch.isfinite(logits).all()
    assert logits.std().item() > 0.1
    assert logits.argmax(-1).unique().numel() > 1  # not one token everywhere


@pytest.mark.parametrize(
    ("kind", "layout", "num_shards", "fused"),
    [
        pytest.param("dense", "nested", 1, False, id="dense-nested"),
        pytest.param("moe", "nested", 1, False, id="moe-nested"),
        pytest.param("moe", "nested", 1, True, id="moe-nested-fused"),
        pytest.param("dense", "flat", 1, False, id="dense-flat"),
        pytest.param("moe", "flat", 1, False, id="moe-flat"),
        pytest.param("dense", "nested", 3, False, id="dense-nested-3-shards"),
        pytest.param("moe", "flat", 2, True, id="moe-flat-fused-2-shards"),
    ],
)
def test_transformers_loads_exactly_the_files(
    tmp_path: Path, kind: str, layout: str, num_shards: int, fused: bool
) -> None:
    spec = TinySpec(kind=kind, vocab_size=SMALL_VOCAB)
    path = make_tiny_checkpoint(
        tmp_path / "ckpt", spec, seed=3, layout=layout, num_shards=num_shards, fused_experts=fused
    )
    tensors = _read_tensors(path)
    assert any(name.startswith("mtp.") for name in tensors)
    model = _load(path, kind, layout)

    expected = _expected_parameters(tensors)
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(state[name], tensor.float()), name

    input_ids = torch.randint(0, SMALL_VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _assert_finite_varied_logits(model(input_ids=input_ids).logits)


def test_real_vocabulary_checkpoint_runs_text_and_image(tmp_path: Path) -> None:
    spec = TinySpec()  # real 248320 vocabulary, so the real image-pad id is a valid token
    path = make_tiny_checkpoint(tmp_path / "ckpt", spec, seed=1)
    model = _load(path, "dense", "nested")
    assert model.lm_head.weight.shape == (248320, spec.hidden_size)

    # One image of 4 x 4 patches -> 2 x 2 merged tokens between vision start / end.
    input_ids = torch.tensor([[248045, 872, 248053, *[248056] * 4, 248054, 1000, 2000]])
    mm_token_type_ids = (input_ids == 248056).int()
    grid = torch.tensor([[1, 4, 4]])
    patch_dim = 3 * spec.vision_temporal_patch_size * spec.vision_patch_size**2
    pixels = torch.randn(16, patch_dim, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [
            model(
                input_ids=input_ids,
                pixel_values=p,
                image_grid_thw=grid,
                mm_token_type_ids=mm_token_type_ids,
            ).logits
            for p in (pixels, -pixels)
        ]
    _assert_finite_varied_logits(logits[0])
    # The image reaches the text: the vision tower's weights are wired, not ignored.
    assert (logits[0][0, -1] - logits[1][0, -1]).abs().max().item() > 1e-3


def test_same_seed_gives_byte_identical_files(tmp_path: Path) -> None:
    spec = TinySpec(kind="moe", vocab_size=SMALL_VOCAB)
    first = make_tiny_checkpoint(tmp_path / "a", spec, seed=5, num_shards=2, fp8=True)
    second = make_tiny_checkpoint(tmp_path / "b", spec, seed=5, num_shards=2, fp8=True)
    other = make_tiny_checkpoint(tmp_path / "c", spec, seed=6, num_shards=2, fp8=True)
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"config.json", "generation_config.json", "model.safetensors.index.json"} <= set(names)
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    shard = "model-00002-of-00002.safetensors"
    assert (first / shard).read_bytes() != (other / shard).read_bytes()


def test_variants_of_one_seed_hold_the_same_weights(tmp_path: Path) -> None:
    spec = TinySpec(kind="moe", vocab_size=SMALL_VOCAB)
    nested = _read_tensors(make_tiny_checkpoint(tmp_path / "nested", spec, seed=2))
    flat = _read_tensors(make_tiny_checkpoint(tmp_path / "flat", spec, seed=2, layout="flat"))
    fused = _read_tensors(
        make_tiny_checkpoint(tmp_path / "fused", spec, seed=2, fused_experts=True, num_shards=4)
    )
    text_only = {n: t for n, t in nested.items() if not n.startswith("model.visual.")}
    assert set(flat) == {n.replace("model.language_model.", "model.") for n in text_only}
    for name, tensor in text_only.items():
        assert torch.equal(flat[name.replace("model.language_model.", "model.")], tensor)
    restacked = _expected_parameters(nested, drop_mtp=False)
    assert set(fused) == set(restacked)
    assert "mtp.layers.0.mlp.experts.gate_up_proj" in fused
    for name, tensor in restacked.items():
        assert torch.equal(fused[name], tensor), name


def test_shard_index_covers_every_tensor_once(tmp_path: Path) -> None:
    spec = TinySpec(vocab_size=SMALL_VOCAB)
    path = make_tiny_checkpoint(tmp_path / "ckpt", spec, num_shards=3)
    index = json.loads((path / "model.safetensors.index.json").read_text())
    shard_names = [f"model-0000{k}-of-00003.safetensors" for k in (1, 2, 3)]
    assert sorted(set(index["weight_map"].values())) == shard_names
    assert not (path / "model.safetensors").exists()
    total = 0
    for shard in shard_names:
        with safe_open(str(path / shard), "pt") as f:
            keys = list(f.keys())
            assert keys, shard
            assert all(index["weight_map"][k] == shard for k in keys)
            total += sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in keys)
    assert index["metadata"]["total_size"] == total
    single = _read_tensors(make_tiny_checkpoint(tmp_path / "single", spec))
    sharded = _read_tensors(path)
    assert set(single) == set(sharded) == set(index["weight_map"])
    assert all(torch.equal(single[n], sharded[n]) for n in single)


def test_generation_config_and_dtype_are_written(tmp_path: Path) -> None:
    spec = TinySpec(vocab_size=SMALL_VOCAB, with_vision=False)
    path = make_tiny_checkpoint(tmp_path / "ckpt", spec, dtype=torch.float32)
    generation = transformers.GenerationConfig.from_pretrained(path)
    assert generation.eos_token_id == [248046, 248044]
    config = json.loads((path / "config.json").read_text())
    assert config["text_config"]["dtype"] == "float32"
    assert config["language_model_only"] is True
    tensors = _read_tensors(path)
    assert {t.dtype for t in tensors.values()} == {torch.float32}
    assert not [n for n in tensors if n.startswith("model.visual.")]


def _dequantize_blocks(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """Reference dequantiser: every 128 x 128 block of the last two dims times its scale."""
    out = torch.empty(q.shape)
    n, k = q.shape[-2:]
    for bi in range(scale_inv.shape[-2]):
        for bj in range(scale_inv.shape[-1]):
            rows = slice(bi * 128, min(bi * 128 + 128, n))
            cols = slice(bj * 128, min(bj * 128 + 128, k))
            scale = scale_inv[..., bi, bj].float()[..., None, None]
            out[..., rows, cols] = q[..., rows, cols].float() * scale
    return out


def _assert_close_to_reference(
    name: str, q: torch.Tensor, scale_inv: torch.Tensor, ref: torch.Tensor
) -> None:
    """e4m3 round-to-nearest: 2^-4 relative (normals), 2^-10 x scale absolute (subnormals);
    the bf16 reference adds 2^-9 relative."""
    assert q.dtype == torch.float8_e4m3fn, name
    deq = _dequantize_blocks(q, scale_inv)
    scale_full = _dequantize_blocks(torch.ones(q.shape), scale_inv)
    ref = ref.float()
    bound = (2.0**-4 + 2.0**-8) * ref.abs() + 2.0**-10 * scale_full + 1e-6
    assert torch.all((deq - ref).abs() <= bound), name


def test_fp8_checkpoint_dequantises_close_to_the_bf16_one(tmp_path: Path) -> None:
    # hidden 160 gives partial and multiple 128-blocks (q_proj [256, 160], mtp.fc [160, 320]).
    spec = TinySpec(kind="moe", vocab_size=SMALL_VOCAB, hidden_size=160)
    fp8 = _read_tensors(make_tiny_checkpoint(tmp_path / "fp8", spec, seed=4, fp8=True))
    ref_path = make_tiny_checkpoint(tmp_path / "bf16", spec, seed=4)
    ref = _read_tensors(ref_path)

    quantized = set()
    for name, tensor in ref.items():
        scale_key = f"{name}_scale_inv"
        if scale_key in fp8:
            assert fp8[scale_key].dtype == torch.float32
            _assert_close_to_reference(name, fp8[name], fp8[scale_key], tensor)
            quantized.add(name.removesuffix(".weight"))
        else:
            assert torch.equal(fp8[name], tensor), name
    assert set(fp8) == set(ref) | {f"{m}.weight_scale_inv" for m in quantized}
    assert "mtp.fc" in quantized
    assert "model.language_model.layers.0.mlp.experts.7.down_proj" in quantized

    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    quant = config["quantization_config"]
    assert (quant["quant_method"], quant["fmt"], quant["weight_block_size"]) == (
        "fp8",
        "e4m3",
        [128, 128],
    )
    not_converted = set(quant["modules_to_not_convert"])
    assert not not_converted & quantized
    assert all(f"{m}.weight" in ref for m in not_converted)
    # Every Linear / Embedding / patch Conv module transformers builds is accounted for.
    model = _load(ref_path, "moe", "nested")
    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv3d)
    modules = {n for n, m in model.named_modules() if isinstance(m, kinds)}
    assert modules <= quantized | not_converted
    assert {"lm_head", "model.language_model.embed_tokens"} <= not_converted
    assert "model.language_model.layers.0.linear_attn.in_proj_a" in not_converted
    assert "model.language_model.layers.0.linear_attn.in_proj_qkv" in quantized


def test_fp8_fused_experts_carry_per_expert_block_scales(tmp_path: Path) -> None:
    spec = TinySpec(kind="moe", vocab_size=SMALL_VOCAB, moe_intermediate_size=80)
    fp8 = _read_tensors(
        make_tiny_checkpoint(
            tmp_path / "fp8",
            spec,
            fp8=True,
            fused_experts=True,
            fp8_scale_dtype=torch.bfloat16,
            layout="flat",
        )
    )
    ref = _read_tensors(
        make_tiny_checkpoint(tmp_path / "bf16", spec, fused_experts=True, layout="flat")
    )
    for prefix in ("model.layers.1.mlp.experts.", "mtp.layers.0.mlp.experts."):
        gate_up, down = f"{prefix}gate_up_proj", f"{prefix}down_proj"
        # [E, 2I=160, H=64] -> scales [E, 2, 1]; [E, H=64, I=80] -> scales [E, 1, 1].
        assert fp8[f"{gate_up}_scale_inv"].shape == (8, 2, 1)
        assert fp8[f"{down}_scale_inv"].shape == (8, 1, 1)
        assert fp8[f"{gate_up}_scale_inv"].dtype == torch.bfloat16
        _assert_close_to_reference(gate_up, fp8[gate_up], fp8[f"{gate_up}_scale_inv"], ref[gate_up])
        _assert_close_to_reference(down, fp8[down], fp8[f"{down}_scale_inv"], ref[down])


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"fused_experts": True}, id="fused-dense"),
        pytest.param({"num_shards": 0}, id="no-shards"),
        pytest.param({"num_shards": 10_000}, id="more-shards-than-tensors"),
        pytest.param({"dtype": torch.int8}, id="int-dtype"),
        pytest.param({"layout": "sideways"}, id="layout"),
        pytest.param({"fp8": True, "fp8_scale_dtype": torch.float16}, id="scale-dtype"),
    ],
)
def test_impossible_options_are_rejected(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(TinyCheckpointError):
        make_tiny_checkpoint(tmp_path / "ckpt", TinySpec(vocab_size=SMALL_VOCAB), **kwargs)


def test_non_empty_directory_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"stale")
    with pytest.raises(TinyCheckpointError, match="not empty"):
        make_tiny_checkpoint(tmp_path, TinySpec(vocab_size=SMALL_VOCAB))


def test_builder_does_not_import_transformers() -> None:
    """The demo artifact is built on user machines, where transformers is not installed."""
    import ninfer.testing

    package = Path(ninfer.testing.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                roots = {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert "transformers" not in roots, source.name
