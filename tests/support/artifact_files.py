"""Test support: small artifacts written without the converter, and header surgery."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ninfer.artifact import schema
from ninfer.artifact.format import PREAMBLE_SIZE, Header, pack_preamble, sha256
from ninfer.artifact.writer import ArtifactWriter, TensorPlan

TEXT_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_5_text",
    "vocab_size": 96,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 2,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "intermediate_size": 48,
}


def make_header(config: dict[str, Any] | None = None) -> Header:
    return Header(
        metadata={"name": "unit", "architecture": "qwen3_5", "producer": "test"},
        config={"text": config or dict(TEXT_CONFIG), "mtp": None, "vision": None, "dflash": None},
        tokenizer={"format": "hf-tokenizers", "json": "{}"},
        chat_templates={"default": "{{ 1 }}"},
        default_chat_template="default",
        generation={"eos_token_ids": [1]},
    )


def write_artifact(
    path: Path, *, drop: str | None = None, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Write a complete tiny text artifact; returns the tensors written (by artifact name)."""
    g = torch.Generator().manual_seed(seed)
    header = make_header()
    shapes = schema.component_tensors(header.config, "text")
    tensors = {
        f"text.{rel}": torch.randn(shape, generator=g).to(torch.bfloat16)
        for rel, shape in shapes.items()
        if rel != drop
    }
    plans = [TensorPlan(n, "text", "bf16", tuple(t.shape)) for n, t in tensors.items()]
    with ArtifactWriter(path, header, plans) as w:
        for n, t in reversed(list(tensors.items())):  # any order works
            w.write(n, t)
    return tensors


def rewrite_header(
    path: Path, edit: Callable[[dict[str, Any]], None], *, fix_sha: bool = True
) -> None:
    """Edit the JSON header in place, keeping the data where it is."""
    raw = path.read_bytes()
    _, version, _, hlen, data_offset, sha = struct.unpack_from("<8sIIQQ32s", raw)
    doc = json.loads(raw[PREAMBLE_SIZE : PREAMBLE_SIZE + hlen])
    edit(doc)
    new = json.dumps(doc, separators=(",", ":")).encode()
    assert PREAMBLE_SIZE + len(new) <= data_offset
    pre = pack_preamble(len(new), data_offset, sha256(new) if fix_sha else sha)
    body = pre + new + b"\0" * (data_offset - PREAMBLE_SIZE - len(new)) + raw[data_offset:]
    path.write_bytes(body)
