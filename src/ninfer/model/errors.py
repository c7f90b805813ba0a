"""Typed errors of the model package.

Each names the offending field, weight or batch member in a one-line message. They subclass
ValueError so callers that only know "bad input" can still catch them. Imports nothing of ninfer.
"""

from __future__ import annotations


class ModelError(ValueError):
    """Base class: the model cannot be built or run with what it was given."""


class ConfigError(ModelError):
    """A config field is missing, has the wrong type, or contradicts another field."""


class WeightError(ModelError):
    """A weight is missing or has the wrong shape for the config."""


class BatchError(ModelError):
    """A ForwardBatch is inconsistent (shapes, lengths) or does not fit the cache."""
