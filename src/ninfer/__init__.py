"""ninfer: a library-first inference engine and server for the Qwen3.5 hybrid model family."""

__version__ = "0.1.0"
__all__ = ["__version__"]
