"""Generation defaults stored in an artifact: stop ids and the sampler presets per mode.

Presets are per architecture (spec: sampling presets; values from the model cards): thinking mode
1.0 / 0.95 / 20 / 0 / presence 0 for dense, presence 1.5 for MoE; non-thinking 0.7 / 0.80 / 20 / 0 /
presence 1.5. Frequency penalty is 0 everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

IM_END_ID = 248046
ENDOFTEXT_ID = 248044


def sampler_presets(architecture: str) -> dict[str, dict[str, float | int]]:
    thinking_presence = 1.5 if architecture == "qwen3_5_moe" else 0.0
    return {
        "thinking": {
            "temperature": 1.0,
            "top_p": 0.95,
            "top_k": 20,
            "min_p": 0.0,
            "presence_penalty": thinking_presence,
            "frequency_penalty": 0.0,
        },
        "non_thinking": {
            "temperature": 0.7,
            "top_p": 0.80,
            "top_k": 20,
            "min_p": 0.0,
            "presence_penalty": 1.5,
            "frequency_penalty": 0.0,
        },
    }


def generation_defaults(architecture: str, hf_dir: Path | None = None) -> dict[str, Any]:
    """Stop ids from the checkpoint's generation_config.json when present, else Qwen's."""
    eos: list[int] = [IM_END_ID, ENDOFTEXT_ID]
    if hf_dir is not None and (hf_dir / "generation_config.json").is_file():
        raw = json.loads((hf_dir / "generation_config.json").read_text()).get("eos_token_id")
        if isinstance(raw, int):
            eos = [raw]
        elif isinstance(raw, list) and raw:
            eos = [int(x) for x in raw]
    return {"eos_token_ids": eos, "presets": sampler_presets(architecture)}
