"""ninfer: a library-first inference engine and server for the Qwen3.5 hybrid model family.

`from ninfer import Engine` is the entry point. Exports resolve lazily so that importing a light
subpackage (`ninfer.chat`, `ninfer.protocol`) never pulls in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Engine", "EngineEvent", "GenerationRequest", "SamplingParams", "__version__"]

if TYPE_CHECKING:
    from ninfer.api import Engine
    from ninfer.engine.request import EngineEvent, GenerationRequest
    from ninfer.engine.sampling import SamplingParams

_LAZY = {
    "Engine": "ninfer.api",
    "EngineEvent": "ninfer.engine.request",
    "GenerationRequest": "ninfer.engine.request",
    "SamplingParams": "ninfer.engine.sampling",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ninfer' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
