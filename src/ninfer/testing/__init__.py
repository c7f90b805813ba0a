"""Tiny random Hugging Face-format Qwen3.5 checkpoints, built deterministically from a seed.

Used by converter tests, model-vs-transformers parity tests and to build the demo artifact on
first use, so nothing here imports `transformers` (torch, safetensors and json only).
"""

from ninfer.testing.tiny_checkpoint import TinyCheckpointError, make_tiny_checkpoint
from ninfer.testing.tiny_config import (
    tiny_config,
    tiny_generation_config,
    tiny_preprocessor_configs,
)
from ninfer.testing.tiny_spec import TinySpec, TinySpecError

__all__ = [
    "TinyCheckpointError",
    "TinySpec",
    "TinySpecError",
    "make_tiny_checkpoint",
    "tiny_config",
    "tiny_generation_config",
    "tiny_preprocessor_configs",
]
