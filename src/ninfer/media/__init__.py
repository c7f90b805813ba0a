"""ninfer.media: image and video input for the vision tower.

Acquisition (data URIs, safe http(s) fetches, local files), decoding with pillow and av, the
Qwen3.5 preprocessing (smart resize, normalization, temporal patching, frame sampling) driven by
the artifact's settings, the prompt layout of media tokens with their MRoPE positions, and the
prepared-payload cache. Never imports the engine, the model or the protocol layer.
"""

from ninfer.media.errors import MediaError
from ninfer.media.prepared import PreparedMedia
from ninfer.media.settings import ImageSettings, MediaSettings, VideoSettings

__all__ = ["ImageSettings", "MediaError", "MediaSettings", "PreparedMedia", "VideoSettings"]
