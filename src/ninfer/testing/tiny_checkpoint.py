"""Write a tiny random Hugging Face-format Qwen3.5 checkpoint directory from a seed.

Owns `make_tiny_checkpoint`: layout (nested / flat keys), expert fusion, fp8 encoding, sharding and
the files. Must not import `transformers`: the demo artifact is built from it at runtime on user
machines (torch, safetensors and json only). Output is a pure function of (spec, seed, options),
so the same call always writes byte-identical files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ninfer.testing.fp8_blocks import fp8_quantization_config, quantize_fp8_blocks
from ninfer.testing.tiny_config import (
    Layout,
    dtype_name,
    tiny_config,
    tiny_generation_config,
    tiny_preprocessor_configs,
)
from ninfer.testing.tiny_spec import TinySpec
from ninfer.testing.tiny_weights import TEXT_PREFIX, VISION_PREFIX, make_tensor, tensor_specs

DEFAULT_SPEC = TinySpec()
_EXPERT_KEY = re.compile(r"^(?P<prefix>.+\.mlp\.experts\.)(?P<expert>\d+)\.(?P<proj>\w+)\.weight$")


class TinyCheckpointError(ValueError):
    """Options of `make_tiny_checkpoint` that cannot describe a checkpoint."""


def make_tiny_checkpoint(
    out_dir: str | Path,
    spec: TinySpec = DEFAULT_SPEC,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
    layout: Layout = "nested",
    num_shards: int = 1,
    fp8: bool = False,
    fused_experts: bool = False,
    fp8_scale_dtype: torch.dtype = torch.float32,
) -> Path:
    """Write config.json, generation_config.json and the safetensors file(s) into `out_dir`,
    plus the image / video preprocessor configs when the checkpoint has a vision tower.

    Args:
        out_dir: created if missing; must be empty, so stale shards can never mix in.
        spec: model sizes; `spec.with_vision` is ignored for `layout="flat"` (text-only by
            definition: flat checkpoints load as `*ForCausalLM`, keys `model.*`).
        seed: every tensor's values follow from (seed, its nested-layout name), so variants of
            one seed (fp8, flat, fused, sharded) hold the same underlying weights.
        dtype: dtype of every tensor not stored as fp8 (bfloat16, float16 or float32).
        layout: "nested" (`model.language_model.*`, `model.visual.*`, multimodal architecture)
            or "flat" (`model.*`, text-only config).
        num_shards: > 1 writes `model-0000k-of-0000n.safetensors` plus
            `model.safetensors.index.json`; 1 writes `model.safetensors`.
        fp8: store Linear weights as float8_e4m3fn with `weight_scale_inv` per 128 x 128 block
            and a `quantization_config`; embeddings, lm_head, DeltaNet in_proj_a/b, routers,
            shared-expert gates and the vision tower stay in `dtype`.
        fused_experts: MoE experts as `experts.gate_up_proj` [E, 2I, H] (gate rows first) and
            `experts.down_proj` [E, H, I], as the real bf16 35B-A3B checkpoint stores them, instead
            of per-expert keys (what `save_pretrained` and the real fp8 checkpoints write).
        fp8_scale_dtype: dtype of the `*_scale_inv` tensors (float32 as DeepSeek-V3-style
            checkpoints; published Qwen3.6 fp8 checkpoints are reported to use bfloat16).

    Returns:
        The checkpoint directory.
    """
    _check_options(spec, dtype, layout, num_shards, fused_experts, fp8_scale_dtype)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise TinyCheckpointError(f"checkpoint directory {out} is not empty")

    specs = [t for t in tensor_specs(spec) if layout == "nested" or not _is_vision(t.name)]
    values = {t.name: make_tensor(t, seed) for t in specs}
    fp8_names = {t.name for t in specs if t.is_fp8} if fp8 else set()
    if fused_experts:
        values, fp8_names = _fuse_experts(values, fp8_names)
    tensors = _encode(values, fp8_names, dtype, fp8_scale_dtype)
    tensors = {_rename(name, layout): tensor for name, tensor in tensors.items()}

    config = tiny_config(spec, layout=layout, dtype=dtype)
    if fp8:
        unconverted = [_rename(t.module, layout) for t in specs if t.is_linear and not t.is_fp8]
        config["quantization_config"] = fp8_quantization_config(unconverted)
    _write_json(out / "config.json", config)
    _write_json(out / "generation_config.json", tiny_generation_config())
    if layout == "nested" and spec.with_vision:
        for filename, settings in tiny_preprocessor_configs(spec).items():
            _write_json(out / filename, settings)
    _write_safetensors(out, tensors, num_shards)
    return out


def _check_options(
    spec: TinySpec,
    dtype: torch.dtype,
    layout: str,
    num_shards: int,
    fused_experts: bool,
    fp8_scale_dtype: torch.dtype,
) -> None:
    try:
        dtype_name(dtype)
    except ValueError as exc:
        raise TinyCheckpointError(str(exc)) from exc
    if layout not in ("nested", "flat"):
        raise TinyCheckpointError(f"layout must be 'nested' or 'flat', got {layout!r}")
    if num_shards < 1:
        raise TinyCheckpointError(f"num_shards must be >= 1, got {num_shards}")
    if fused_experts and spec.kind != "moe":
        raise TinyCheckpointError("fused_experts needs a MoE spec (kind='moe')")
    if fp8_scale_dtype not in (torch.float32, torch.bfloat16):
        raise TinyCheckpointError(
            f"fp8_scale_dtype must be float32 or bfloat16, got {fp8_scale_dtype}"
        )


def _is_vision(name: str) -> bool:
    return name.startswith(VISION_PREFIX)


def _rename(name: str, layout: str) -> str:
    if layout == "flat" and name.startswith(TEXT_PREFIX):
        return "model." + name.removeprefix(TEXT_PREFIX)
    return name


def _fuse_experts(
    values: dict[str, torch.Tensor], fp8_names: set[str]
) -> tuple[dict[str, torch.Tensor], set[str]]:
    """Replace per-expert keys by `gate_up_proj` / `down_proj` stacks at the first expert's spot."""
    experts: dict[str, dict[str, dict[int, torch.Tensor]]] = {}
    for name, tensor in values.items():
        match = _EXPERT_KEY.match(name)
        if match:
            by_proj = experts.setdefault(match["prefix"], {})
            by_proj.setdefault(match["proj"], {})[int(match["expert"])] = tensor
    fused: dict[str, torch.Tensor] = {}
    fused_fp8 = {name for name in fp8_names if not _EXPERT_KEY.match(name)}
    for name, tensor in values.items():
        match = _EXPERT_KEY.match(name)
        if not match:
            fused[name] = tensor
            continue
        prefix = match["prefix"]
        if f"{prefix}gate_up_proj" in fused:
            continue
        projs = experts[prefix]
        num_experts = len(projs["gate_proj"])
        # [I, H] gate and up per expert -> [E, 2I, H], gate rows first.
        fused[f"{prefix}gate_up_proj"] = torch.stack(
            [torch.cat([projs["gate_proj"][e], projs["up_proj"][e]]) for e in range(num_experts)]
        )
        fused[f"{prefix}down_proj"] = torch.stack(
            [projs["down_proj"][e] for e in range(num_experts)]
        )
        if name in fp8_names:
            fused_fp8 |= {f"{prefix}gate_up_proj", f"{prefix}down_proj"}
    return fused, fused_fp8


def _encode(
    values: dict[str, torch.Tensor],
    fp8_names: set[str],
    dtype: torch.dtype,
    scale_dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for name, value in values.items():
        if name not in fp8_names:
            tensors[name] = value.to(dtype).contiguous()
            continue
        q, scale_inv = quantize_fp8_blocks(value, scale_dtype=scale_dtype)
        tensors[name] = q
        # `x.weight` -> `x.weight_scale_inv`; fused `experts.gate_up_proj` -> `..._scale_inv`.
        tensors[f"{name}_scale_inv"] = scale_inv.contiguous()
    return tensors


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def _write_safetensors(out: Path, tensors: dict[str, torch.Tensor], num_shards: int) -> None:
    metadata = {"format": "pt"}
    if num_shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata=metadata)
        return
    shards = _split_shards(tensors, num_shards)
    weight_map: dict[str, str] = {}
    for k, names in enumerate(shards, start=1):
        filename = f"model-{k:05d}-of-{num_shards:05d}.safetensors"
        save_file({n: tensors[n] for n in names}, str(out / filename), metadata=metadata)
        weight_map.update(dict.fromkeys(names, filename))
    total_size = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    _write_json(out / "model.safetensors.index.json", index)


def _split_shards(tensors: dict[str, torch.Tensor], num_shards: int) -> list[list[str]]:
    """Contiguous runs of tensors balanced by bytes; every shard gets at least one tensor."""
    names = list(tensors)
    if num_shards > len(names):
        raise TinyCheckpointError(f"num_shards={num_shards} exceeds the {len(names)} tensors")
    sizes = [tensors[n].numel() * tensors[n].element_size() for n in names]
    total = sum(sizes)
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    k, written = 0, 0
    for i, (name, size) in enumerate(zip(names, sizes, strict=True)):
        must_advance = len(names) - i <= num_shards - 1 - k  # later shards need one tensor each
        full = written >= total * (k + 1) / num_shards
        if shards[k] and k < num_shards - 1 and (full or must_advance):
            k += 1
        shards[k].append(name)
        written += size
    return shards
