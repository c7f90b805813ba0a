"""TextConfig: the shape of a Qwen3.5 text model (dense or MoE), parsed from an HF config dict.

Imports nothing of ninfer but model.errors. The dataclass is frozen and validated once at
construction, so every layer can trust its numbers; `from_hf` accepts a full multimodal config
(fields under `text_config`) or a flat text config, and follows transformers' defaults where the
family's configs leave a field out (RoPE theta, partial rotary factor, MRoPE sections).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from ninfer.model.errors import ConfigError


class LayerType(enum.StrEnum):
    """The token mixer of a decoder layer; values are the HF `layer_types` spellings."""

    LINEAR = "linear_attention"
    FULL = "full_attention"


@dataclass(frozen=True)
class TextConfig:
    """Everything the text model needs to know about its shapes; MoE iff `num_experts > 0`."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[LayerType, ...]
    # Gated full attention.
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    # Gated DeltaNet.
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    # Dense FFN (0 for MoE).
    intermediate_size: int = 0
    # MoE FFN (num_experts 0 for dense).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    # Norms and positions.
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mrope_interleaved: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        _validate(self)

    # Derived sizes, named as the layers use them.
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q, k and v of the DeltaNet, concatenated."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.FULL)

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t is LayerType.LINEAR)

    @classmethod
    def from_hf(cls, d: Mapping[str, Any]) -> TextConfig:
        """Build from an HF `config.json` dict (nested `text_config` or flat text config)."""
        if not isinstance(d, Mapping):
            raise ConfigError(f"config must be a mapping, got {type(d).__name__}")
        nested = d.get("text_config")
        if nested is not None and not isinstance(nested, Mapping):
            raise ConfigError("field 'text_config' must be a mapping")
        text = _Fields(nested if nested is not None else d)
        _reject_unsupported(text.d)

        tie = text.get("tie_word_embeddings")
        if tie is None and nested is not None:
            tie = d.get("tie_word_embeddings")
        kwargs: dict[str, Any] = {name: text.get(name, required=True) for name in _REQUIRED_INTS}
        kwargs.update(
            layer_types=_layer_types(text, kwargs["num_hidden_layers"]),
            linear_conv_kernel_dim=text.get("linear_conv_kernel_dim", 4),
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            tie_word_embeddings=bool(tie) if tie is not None else False,
            max_position_embeddings=text.get("max_position_embeddings", 32768),
            **_rope_fields(text),
        )
        model_type = str(text.get("model_type", ""))
        if _as_int("num_experts", text.get("num_experts", 0)) > 0 or "moe" in model_type:
            for name in (
                "num_experts",
                "num_experts_per_tok",
                "moe_intermediate_size",
                "shared_expert_intermediate_size",
            ):
                kwargs[name] = text.get(name, required=True)
            kwargs["norm_topk_prob"] = text.get("norm_topk_prob", True)
        else:
            kwargs["intermediate_size"] = text.get("intermediate_size", required=True)
        return cls(**kwargs)


class _Fields:
    """A config dict read field by field; None counts as absent (HF writes nulls)."""

    def __init__(self, d: Mapping[str, Any]) -> None:
        self.d = d

    def get(self, name: str, default: Any = None, *, required: bool = False) -> Any:
        if self.d.get(name) is not None:
            return self.d[name]
        if required:
            raise ConfigError(f"missing field '{name}'")
        return default


def _layer_types(text: _Fields, num_layers: Any) -> Any:
    """Explicit `layer_types`, else every `full_attention_interval`-th layer is full attention."""
    explicit = text.get("layer_types")
    if explicit is not None:
        return explicit
    num_layers = _as_int("num_hidden_layers", num_layers)
    interval = _as_int("full_attention_interval", text.get("full_attention_interval", 4))
    if interval <= 0:
        raise ConfigError(f"field 'full_attention_interval' must be > 0, got {interval}")
    return [
        LayerType.FULL if (i + 1) % interval == 0 else LayerType.LINEAR for i in range(num_layers)
    ]


def _rope_fields(text: _Fields) -> dict[str, Any]:
    """RoPE fields: `rope_parameters` (or legacy `rope_scaling`), then top level, then defaults."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    if not isinstance(rope, Mapping):
        raise ConfigError("field 'rope_parameters' must be a mapping")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ConfigError(f"field 'rope_parameters.rope_type' {rope_type!r} is not supported")
    defaults = {
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": (11, 11, 10),
        "mrope_interleaved": True,
    }
    return {
        name: rope[name] if rope.get(name) is not None else text.get(name, default)
        for name, default in defaults.items()
    }


def _reject_unsupported(text: Mapping[str, Any]) -> None:
    """Fields whose non-default values would change the maths this model implements."""
    if text.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"field 'hidden_act' must be 'silu', got {text['hidden_act']!r}")
    if text.get("attn_output_gate", True) is not True:
        raise ConfigError("field 'attn_output_gate' must be true (Qwen3.5 gates attention)")
    if text.get("attention_bias", False):
        raise ConfigError("field 'attention_bias' must be false")
    if text.get("mlp_only_layers"):
        raise ConfigError("field 'mlp_only_layers' must be empty")
    if text.get("decoder_sparse_step", 1) != 1:
        raise ConfigError("field 'decoder_sparse_step' must be 1")


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"field '{name}' must be an integer, got {value!r}")
    return value


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"field '{name}' must be a number, got {value!r}")
    return float(value)


# Shape fields every text config must state (no default could be right for them).
_REQUIRED_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
)
_POSITIVE_INTS = (*_REQUIRED_INTS, "linear_conv_kernel_dim", "max_position_embeddings")
_NON_NEGATIVE_INTS = (
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
)


def _validate(c: TextConfig) -> None:
    # Normalise container and number types first (the dataclass is frozen, hence setattr).
    for f in fields(c):
        value = getattr(c, f.name)
        if f.name in _POSITIVE_INTS or f.name in _NON_NEGATIVE_INTS:
            _as_int(f.name, value)
        elif f.name in ("rms_norm_eps", "rope_theta", "partial_rotary_factor"):
            object.__setattr__(c, f.name, _as_float(f.name, value))
        elif f.name in ("norm_topk_prob", "mrope_interleaved", "tie_word_embeddings") and not (
            isinstance(value, bool)
        ):
            raise ConfigError(f"field '{f.name}' must be a boolean, got {value!r}")
    try:
        layer_types = tuple(LayerType(t) for t in c.layer_types)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"field 'layer_types' has an unknown entry: {exc}") from None
    object.__setattr__(c, "layer_types", layer_types)
    if not isinstance(c.mrope_section, list | tuple) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in c.mrope_section
    ):
        raise ConfigError(f"field 'mrope_section' must be non-negative integers: {c.mrope_section}")
    object.__setattr__(c, "mrope_section", tuple(c.mrope_section))

    for name in _POSITIVE_INTS:
        if getattr(c, name) <= 0:
            raise ConfigError(f"field '{name}' must be > 0, got {getattr(c, name)}")
    for name in _NON_NEGATIVE_INTS:
        if getattr(c, name) < 0:
            raise ConfigError(f"field '{name}' must be >= 0, got {getattr(c, name)}")
    if len(c.layer_types) != c.num_hidden_layers:
        raise ConfigError(
            f"field 'layer_types' has {len(c.layer_types)} entries for "
            f"num_hidden_layers={c.num_hidden_layers}"
        )
    if c.num_attention_heads % c.num_key_value_heads:
        raise ConfigError(
            f"field 'num_attention_heads' ({c.num_attention_heads}) must be a multiple of "
            f"num_key_value_heads ({c.num_key_value_heads})"
        )
    if c.linear_num_value_heads % c.linear_num_key_heads:
        raise ConfigError(
            f"field 'linear_num_value_heads' ({c.linear_num_value_heads}) must be a multiple of "
            f"linear_num_key_heads ({c.linear_num_key_heads})"
        )
    if c.rms_norm_eps <= 0 or c.rope_theta <= 0:
        raise ConfigError("fields 'rms_norm_eps' and 'rope_theta' must be > 0")
    if not 0 < c.partial_rotary_factor <= 1:
        raise ConfigError(
            f"field 'partial_rotary_factor' must be in (0, 1], got {c.partial_rotary_factor}"
        )
    if c.rotary_dim % 2 or c.rotary_dim == 0:
        raise ConfigError(
            f"rotary dim {c.rotary_dim} (head_dim x partial_rotary_factor) must be even"
        )
    if len(c.mrope_section) != 3 or sum(c.mrope_section) != c.rotary_dim // 2:
        raise ConfigError(
            f"field 'mrope_section' {list(c.mrope_section)} must have 3 entries summing to "
            f"rotary_dim/2 = {c.rotary_dim // 2}"
        )
    if c.is_moe:
        if not 0 < c.num_experts_per_tok <= c.num_experts:
            raise ConfigError(
                f"field 'num_experts_per_tok' must be in 1..{c.num_experts}, got "
                f"{c.num_experts_per_tok}"
            )
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(c, name) <= 0:
                raise ConfigError(f"field '{name}' must be > 0 for an MoE model")
    elif c.intermediate_size <= 0:
        raise ConfigError("field 'intermediate_size' must be > 0 for a dense model")
