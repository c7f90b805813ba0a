"""A plain-data summary of an open artifact, shared by `inspect-artifact` (table and --json)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ninfer.artifact import schema
from ninfer.artifact.reader import Artifact


def summarize(art: Artifact) -> dict[str, Any]:
    text = art.config["text"]
    types = schema.layer_types(text)
    groups: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for e in art.entries():
        fmt = e.format if e.format != "plain" else e.dtype
        g = groups[(e.component, fmt)]
        g[0] += 1
        g[1] += e.nbytes
    config: dict[str, Any] = {
        "architecture": art.metadata.get("architecture"),
        "hidden_size": text["hidden_size"],
        "num_layers": len(types),
        "num_full_attention": types.count("full_attention"),
        "num_linear_attention": types.count("linear_attention"),
        "vocab_size": text["vocab_size"],
        "attention_heads": f"{text['num_attention_heads']} q / {text['num_key_value_heads']} kv "
        f"x {text.get('head_dim')}",
        "linear_heads": f"{text['linear_num_key_heads']} k x {text['linear_key_head_dim']} / "
        f"{text['linear_num_value_heads']} v x {text['linear_value_head_dim']}",
    }
    if schema.is_moe(text):
        config["experts"] = (
            f"{text['num_experts']} x {text['moe_intermediate_size']}, top "
            f"{text['num_experts_per_tok']}, "
            f"shared {text.get('shared_expert_intermediate_size', 0)}"
        )
    else:
        config["intermediate_size"] = text["intermediate_size"]
    templates = {
        name: {"chars": len(src), "default": name == art.header.default_chat_template}
        for name, src in art.header.chat_templates.items()
    }
    vision = art.config.get("vision")
    media = art.config.get("media")
    return {
        "path": str(art.path),
        "file_bytes": art.file_size,
        "metadata": art.metadata,
        "components": art.components,
        "config": config,
        "tensors": [
            {"component": c, "format": f, "count": n, "bytes": b}
            for (c, f), (n, b) in sorted(groups.items())
        ],
        "num_tensors": len(art.header.tensors),
        "chat_templates": templates,
        "tokenizer": {
            "format": art.header.tokenizer.get("format"),
            "source": art.metadata.get("tokenizer_source"),
        },
        "generation": art.header.generation,
        "vision": _vision_summary(vision) if vision else None,
        "media": media,
    }


def _vision_summary(v: dict[str, Any]) -> dict[str, Any]:
    return {
        "depth": v.get("depth"),
        "hidden_size": v.get("hidden_size"),
        "heads": v.get("num_heads"),
        "intermediate_size": v.get("intermediate_size"),
        "patch": f"{v.get('patch_size')} px, temporal {v.get('temporal_patch_size')}, "
        f"merge {v.get('spatial_merge_size')}",
        "position_table": v.get("num_position_embeddings"),
        "out_hidden_size": v.get("out_hidden_size"),
        "rope_theta": v.get("rope_theta"),
    }
