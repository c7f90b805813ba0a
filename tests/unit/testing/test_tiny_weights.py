"""The tensor inventory, checked at the real model sizes against published checkpoint facts.

Expected numbers are public facts, not this code's output: the Qwen3.6-27B tensor list (1,199
tensors, shapes below), the Qwen3.5-35B-A3B vision tower (333 tensors) and MTP head (785 tensors,
per-expert keys), and the Qwen3.5-35B-A3B fp8 checkpoint (31,746 fp8 weights, 64,197 tensors).
"""

from __future__ import annotations

import torch

from ninfer.testing import TinySpec
from ninfer.testing.tiny_weights import Init, TensorSpec, make_tensor, tensor_specs

REAL_27B = TinySpec(
    hidden_size=5120,
    num_layers=64,
    num_attention_heads=24,
    num_kv_heads=4,
    head_dim=256,
    mrope_section=(11, 11, 10),
    num_linear_key_heads=16,
    num_linear_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    intermediate_size=17408,
    vision_depth=27,
    vision_hidden_size=1152,
    vision_intermediate_size=4304,
    vision_num_heads=16,
    vision_num_position_embeddings=2304,
)
REAL_35B_A3B = TinySpec(
    kind="moe",
    hidden_size=2048,
    num_layers=40,
    num_attention_heads=16,
    num_kv_heads=2,
    head_dim=256,
    mrope_section=(11, 11, 10),
    num_linear_key_heads=16,
    num_linear_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    num_experts=256,
    num_experts_per_token=8,
    moe_intermediate_size=512,
    shared_expert_intermediate_size=512,
    vision_depth=27,
    vision_hidden_size=1152,
    vision_intermediate_size=4304,
    vision_num_heads=16,
    vision_num_position_embeddings=2304,
)

# From the published Qwen3.6-27B tensor list (name: shape).
PUBLISHED_27B_SHAPES = {
    "lm_head.weight": (248320, 5120),
    "model.language_model.embed_tokens.weight": (248320, 5120),
    "model.language_model.layers.0.linear_attn.A_log": (48,),
    "model.language_model.layers.0.linear_attn.conv1d.weight": (10240, 1, 4),
    "model.language_model.layers.0.linear_attn.dt_bias": (48,),
    "model.language_model.layers.0.linear_attn.in_proj_a.weight": (48, 5120),
    "model.language_model.layers.0.linear_attn.in_proj_b.weight": (48, 5120),
    "model.language_model.layers.0.linear_attn.in_proj_qkv.weight": (10240, 5120),
    "model.language_model.layers.0.linear_attn.in_proj_z.weight": (6144, 5120),
    "model.language_model.layers.0.linear_attn.norm.weight": (128,),
    "model.language_model.layers.0.linear_attn.out_proj.weight": (5120, 6144),
    "model.language_model.layers.63.input_layernorm.weight": (5120,),
    "model.language_model.layers.63.mlp.down_proj.weight": (5120, 17408),
    "model.language_model.layers.63.mlp.gate_proj.weight": (17408, 5120),
    "model.language_model.layers.63.post_attention_layernorm.weight": (5120,),
    "model.language_model.layers.63.self_attn.k_norm.weight": (256,),
    "model.language_model.layers.63.self_attn.k_proj.weight": (1024, 5120),
    "model.language_model.layers.63.self_attn.o_proj.weight": (5120, 6144),
    "model.language_model.layers.63.self_attn.q_proj.weight": (12288, 5120),
    "model.language_model.layers.63.self_attn.v_proj.weight": (1024, 5120),
    "model.language_model.norm.weight": (5120,),
    "model.visual.blocks.26.attn.qkv.weight": (3456, 1152),
    "model.visual.blocks.26.attn.qkv.bias": (3456,),
    "model.visual.blocks.26.mlp.linear_fc2.weight": (1152, 4304),
    "model.visual.merger.linear_fc1.weight": (4608, 4608),
    "model.visual.merger.linear_fc2.weight": (5120, 4608),
    "model.visual.merger.norm.bias": (1152,),
    "model.visual.patch_embed.proj.weight": (1152, 3, 2, 16, 16),
    "model.visual.pos_embed.weight": (2304, 1152),
    "mtp.fc.weight": (5120, 10240),
    "mtp.layers.0.input_layernorm.weight": (5120,),
    "mtp.layers.0.mlp.down_proj.weight": (5120, 17408),
    "mtp.layers.0.self_attn.k_norm.weight": (256,),
    "mtp.layers.0.self_attn.q_proj.weight": (12288, 5120),
    "mtp.layers.0.self_attn.o_proj.weight": (5120, 6144),
    "mtp.norm.weight": (5120,),
    "mtp.pre_fc_norm_embedding.weight": (5120,),
    "mtp.pre_fc_norm_hidden.weight": (5120,),
}


def _by_name(specs: list[TensorSpec]) -> dict[str, TensorSpec]:
    return {t.name: t for t in specs}


def test_real_27b_sizes_reproduce_the_published_tensor_list() -> None:
    specs = tensor_specs(REAL_27B)
    assert len(specs) == 1199
    by_name = _by_name(specs)
    assert len(by_name) == len(specs)
    for name, shape in PUBLISHED_27B_SHAPES.items():
        assert by_name[name].shape == shape, name
    assert "model.language_model.layers.3.linear_attn.A_log" not in by_name  # full attention
    assert "model.language_model.layers.2.self_attn.q_proj.weight" not in by_name


def test_real_35b_sizes_reproduce_published_counts() -> None:
    specs = tensor_specs(REAL_35B_A3B)
    vision = [t for t in specs if t.name.startswith("model.visual.")]
    mtp = [t for t in specs if t.name.startswith("mtp.")]
    assert (len(vision), len(mtp)) == (333, 785)
    by_name = _by_name(specs)
    assert by_name["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"].shape == (
        8192,
        2048,
    )
    assert by_name["model.language_model.layers.0.mlp.gate.weight"].shape == (256, 2048)
    assert by_name["model.language_model.layers.0.mlp.experts.255.down_proj.weight"].shape == (
        2048,
        512,
    )
    assert by_name["mtp.layers.0.mlp.shared_expert_gate.weight"].shape == (1, 2048)


def test_fp8_selection_reproduces_the_published_35b_fp8_checkpoint() -> None:
    specs = tensor_specs(REAL_35B_A3B)
    num_fp8 = sum(t.is_fp8 for t in specs)
    assert num_fp8 == 31746
    assert len(specs) + num_fp8 == 64197  # each fp8 weight adds its weight_scale_inv
    kept = {t.name.rsplit(".", 2)[-2] for t in specs if t.is_linear and not t.is_fp8}
    assert kept == {
        "embed_tokens",
        "lm_head",
        "in_proj_a",
        "in_proj_b",
        "gate",
        "shared_expert_gate",
        "proj",  # vision patch_embed.proj and attn.proj
        "pos_embed",
        "qkv",
        "linear_fc1",
        "linear_fc2",
    }


def test_mtp_layer_is_a_full_attention_layer_with_the_main_ffn() -> None:
    for spec in (TinySpec(), TinySpec(kind="moe")):
        specs = _by_name(tensor_specs(spec))
        main = {n.split("layers.3.", 1)[1]: t.shape for n, t in specs.items() if ".layers.3." in n}
        mtp = {
            n.split("layers.0.", 1)[1]: t.shape for n, t in specs.items() if "mtp.layers.0." in n
        }
        assert mtp == main
        assert specs["mtp.fc.weight"].shape == (spec.hidden_size, 2 * spec.hidden_size)


def test_optional_components_can_be_left_out() -> None:
    names = [t.name for t in tensor_specs(TinySpec(with_mtp=False, with_vision=False))]
    assert not [n for n in names if n.startswith(("mtp.", "model.visual."))]


def test_values_depend_only_on_seed_and_name() -> None:
    tensor = TensorSpec("model.language_model.layers.0.mlp.up_proj.weight", (128, 64), Init.LINEAR)
    same = make_tensor(tensor, seed=7)
    assert torch.equal(same, make_tensor(tensor, seed=7))
    assert not torch.equal(same, make_tensor(tensor, seed=8))
    renamed = TensorSpec("model.language_model.layers.1.mlp.up_proj.weight", (128, 64), Init.LINEAR)
    assert not torch.equal(same, make_tensor(renamed, seed=7))


def test_value_scales_keep_the_model_well_conditioned() -> None:
    def draw(init: Init, shape: tuple[int, ...] = (256, 64)) -> torch.Tensor:
        return make_tensor(TensorSpec("x", shape, init), seed=0)

    assert abs(draw(Init.LINEAR).std().item() - 64**-0.5) < 0.01
    assert abs(draw(Init.EMBEDDING).std().item() - 1.0) < 0.05
    assert draw(Init.NORM_ZERO_CENTRED).abs().mean().item() < 0.15
    assert abs(draw(Init.NORM_UNIT).mean().item() - 1.0) < 0.01
    a = draw(Init.A_LOG, (4096,)).exp()
    assert a.min().item() >= 0.1 - 1e-6 and a.max().item() <= 4.0 + 1e-6
