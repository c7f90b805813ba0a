"""Tiny random Qwen3.5 models (dense and MoE) built with transformers, the test oracle.

The HF models are built once per session with weights re-drawn at scales that keep activations
O(1) (HF's default init makes near-uniform logits, which would hide errors), and their state dicts
are mapped to ninfer's names (the `model.` prefix dropped).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch

transformers = pytest.importorskip("transformers")

ROPE = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [2, 1, 1],  # rotary_dim 8 -> 4 frequencies
    "mrope_interleaved": True,
}
COMMON: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,  # 3 linear + 1 full
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "rope_parameters": ROPE,
}
MOE: dict[str, Any] = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
}


@pytest.fixture(autouse=True, scope="module")
def _one_intra_op_thread() -> Iterator[None]:
    """Tiny ops on a busy 2-core machine: OpenMP spin-waiting made HF decode steps 30x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


class TinyModel(NamedTuple):
    hf: Any  # transformers *ForCausalLM, eval mode, fp32
    hf_config: dict[str, Any]  # its config as a dict (what config.json would hold)
    weights: dict[str, torch.Tensor]  # ninfer names


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Weights with O(1) activations; decays spread from long to short memory."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.05, 2.0, generator=gen).log())
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen))
            elif "norm" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
            elif name.endswith("conv1d.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)


def _build(moe: bool, seed: int) -> TinyModel:
    torch.manual_seed(seed)
    if moe:
        config = transformers.Qwen3_5MoeTextConfig(**COMMON, **MOE)
        hf = transformers.Qwen3_5MoeForCausalLM(config)
    else:
        config = transformers.Qwen3_5TextConfig(**COMMON, intermediate_size=128)
        hf = transformers.Qwen3_5ForCausalLM(config)
    randomize_(hf, seed)
    # NOTE: on the CPU build, F.linear with a requires_grad weight costs milliseconds even under
    # no_grad; the oracle never trains, so freeze it.
    hf.eval().requires_grad_(False)
    weights = {k.removeprefix("model."): v.clone() for k, v in hf.state_dict().items()}
    return TinyModel(hf=hf, hf_config=config.to_dict(), weights=weights)


@pytest.fixture(scope="session")
def tiny_dense() -> TinyModel:
    return _build(moe=False, seed=1234)


@pytest.fixture(scope="session")
def tiny_moe() -> TinyModel:
    return _build(moe=True, seed=4321)


@pytest.fixture(scope="session", params=["dense", "moe"])
def tiny(request: pytest.FixtureRequest) -> TinyModel:
    return request.getfixturevalue(f"tiny_{request.param}")
