"""ninfer.model: the Qwen3.5 text model over bound weights, its step descriptor and device buffers.

Never imports engine/, server/, protocol/ or sanic. The model is stateless code: what a step does
is a ForwardBatch, where it reads and writes is a ModelCache, so scheduling stays in engine/.
"""

from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import LayerType, TextConfig
from ninfer.model.errors import BatchError, ConfigError, ModelError, WeightError
from ninfer.model.qwen3_5 import Qwen3_5Model

__all__ = [
    "BatchError",
    "ConfigError",
    "ForwardBatch",
    "LayerType",
    "ModelCache",
    "ModelError",
    "Qwen3_5Model",
    "TextConfig",
    "WeightError",
]
