"""Read a Hugging Face Qwen3.5 checkpoint directory tensor by tensor.

Knows the key spellings exporters use (`model.language_model.*`, `language_model.model.*`, flat
`model.*`; `model.visual.*`; `mtp.*`), per-expert and fused MoE tensors, and FP8 block-quantized
weights (`weight` + `weight_scale_inv`). Nothing is loaded until asked for, so a 54 GB checkpoint
is read with one tensor (or one layer's experts) in memory at a time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ninfer.artifact.errors import ConversionError
from ninfer.artifact.format import FP8_BLOCK
from ninfer.artifact.quantize import dequantize_fp8_block

SUPPORTED_MODEL_TYPES = {
    "qwen3_5": "qwen3_5",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe": "qwen3_5_moe",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
_PREFIXES = {
    "text": ("model.language_model.", "language_model.model.", "model."),
    "vision": ("model.visual.", "visual.", "model.vision_tower."),
    "mtp": ("mtp.", "model.mtp."),
}
_LM_HEAD = ("lm_head.weight", "language_model.lm_head.weight", "model.lm_head.weight")
_FUSED_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")


@dataclass
class SourceTensor:
    """A tensor as stored in the source: values, plus the f32 block scales when FP8."""

    values: torch.Tensor
    scale: torch.Tensor | None = None

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        if self.scale is None:
            return self.values
        return dequantize_fp8_block(self.values, self.scale, dtype)


class HFCheckpoint:
    """A checkpoint directory: config, model type, and lazy access by canonical tensor name."""

    def __init__(self, hf_dir: str | Path) -> None:
        self.dir = Path(hf_dir)
        cfg_path = self.dir / "config.json"
        if not cfg_path.is_file():
            raise ConversionError(
                self.dir, "no config.json: not a Hugging Face checkpoint directory"
            )
        try:
            self.raw_config: dict[str, Any] = json.loads(cfg_path.read_text())
        except json.JSONDecodeError as e:
            raise ConversionError(cfg_path, f"config.json is not valid JSON ({e.msg})") from e
        model_type = str(self.raw_config.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            archs = self.raw_config.get("architectures")
            raise ConversionError(
                self.dir,
                f"unsupported architecture: model_type {model_type!r} ({archs}); ninfer converts "
                "qwen3_5 and qwen3_5_moe checkpoints",
            )
        self.architecture = SUPPORTED_MODEL_TYPES[model_type]
        self.text_config: dict[str, Any] = dict(
            self.raw_config.get("text_config") or self.raw_config
        )
        self.text_config.pop("text_config", None)
        self.vision_config: dict[str, Any] | None = self.raw_config.get("vision_config")
        self._handles: dict[Path, Any] = {}
        self._key_file = self._index()

    # -- files -------------------------------------------------------------------------------
    def _index(self) -> dict[str, Path]:
        index = self.dir / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ConversionError(index, "not a valid safetensors index (no weight_map)") from e
            out = {k: self.dir / f for k, f in weight_map.items()}
            for f in set(out.values()):
                if not f.is_file():
                    raise ConversionError(self.dir, f"shard {f.name} named by the index is missing")
            return out
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise ConversionError(self.dir, "no *.safetensors files")
        out = {}
        for f in files:
            for k in self._handle(f).keys():  # noqa: SIM118  (safe_open handles are not mappings)
                out[k] = f
        return out

    def _handle(self, f: Path) -> Any:
        if f not in self._handles:
            try:
                self._handles[f] = safe_open(f, "pt")
            except SafetensorError as e:  # truncated or damaged: the header does not fit the file
                raise ConversionError(f, f"not a complete safetensors file ({e})") from e
            except OSError as e:
                raise ConversionError(f, f"cannot read: {(e.strerror or str(e)).lower()}") from e
        return self._handles[f]

    def has_key(self, key: str) -> bool:
        return key in self._key_file

    def read_key(self, key: str) -> torch.Tensor:
        try:
            return self._handle(self._key_file[key]).get_tensor(key)
        except SafetensorError as e:
            raise ConversionError(self._key_file[key], f"cannot read tensor {key}: {e}") from e

    def key_dtype(self, key: str) -> str:
        return str(self._handle(self._key_file[key]).get_slice(key).get_dtype())

    def key_shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle(self._key_file[key]).get_slice(key).get_shape())

    def keys(self) -> list[str]:
        return list(self._key_file)

    # -- canonical names ----------------------------------------------------------------------
    def source_key(self, component: str, rel: str) -> str | None:
        """The source key holding canonical tensor `component.rel`, if stored as one tensor."""
        if component == "text" and rel == "lm_head.weight":
            candidates: tuple[str, ...] = _LM_HEAD
        else:
            candidates = tuple(p + rel for p in _PREFIXES[component])
        for key in candidates:
            if key in self._key_file and not (
                component == "text" and key.startswith(("model.visual.", "model.mtp."))
            ):
                return key
        return None

    def has_component(self, component: str) -> bool:
        prefixes = _PREFIXES[component]
        if component == "text":
            return self.source_key("text", "embed_tokens.weight") is not None
        return any(k.startswith(prefixes) for k in self._key_file)

    def source_dtype(self, component: str, rel: str) -> str | None:
        key = self.source_key(component, rel)
        return self.key_dtype(key) if key is not None else None

    def read(self, component: str, rel: str) -> SourceTensor:
        """Canonical tensor `component.rel`: fuses per-expert MoE tensors, keeps FP8 scales."""
        key = self.source_key(component, rel)
        if key is not None:
            return self._read_one(key)
        m = _FUSED_EXPERT.match(rel)
        if m:
            return self._read_experts(component, m.group(1), m.group(2))
        raise ConversionError(
            self.dir, f"missing tensor {component}.{rel} (no matching source key)"
        )

    def _read_one(self, key: str) -> SourceTensor:
        values = self.read_key(key)
        scale_key = key + "_scale_inv"
        if values.dtype == torch.float8_e4m3fn:
            if scale_key not in self._key_file:
                raise ConversionError(self.dir, f"FP8 tensor {key} has no {scale_key}")
            return SourceTensor(values, self.read_key(scale_key).float())
        return SourceTensor(values)

    def _read_experts(self, component: str, base: str, which: str) -> SourceTensor:
        num_experts = int(self.text_config["num_experts"])
        parts = ("gate_proj", "up_proj") if which == "gate_up_proj" else ("down_proj",)
        rows: list[SourceTensor] = []
        for j in range(num_experts):
            pieces = []
            for p in parts:
                key = self.source_key(component, f"{base}.{j}.{p}.weight")
                if key is None:
                    raise ConversionError(
                        self.dir, f"missing tensor {component}.{base}.{j}.{p}.weight"
                    )
                pieces.append(self._read_one(key))
            rows.append(_concat_rows(pieces))
        if all(r.scale is not None for r in rows):
            return SourceTensor(
                torch.stack([r.values for r in rows]),
                torch.stack([r.scale for r in rows if r.scale is not None]),
            )
        return SourceTensor(torch.stack([r.dequantized() for r in rows]))


def _concat_rows(pieces: list[SourceTensor]) -> SourceTensor:
    """Stack gate and up rows; FP8 blocks stay FP8 only where rows align with 128-row blocks."""
    if len(pieces) == 1:
        return pieces[0]
    if all(p.scale is not None for p in pieces) and all(
        p.values.shape[0] % FP8_BLOCK == 0 for p in pieces[:-1]
    ):
        return SourceTensor(
            torch.cat([p.values for p in pieces]),
            torch.cat([p.scale for p in pieces if p.scale is not None]),
        )
    return SourceTensor(torch.cat([p.dequantized() for p in pieces]))
