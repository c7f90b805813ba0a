"""Typed artifact errors.

Every problem with a `.ninfer` file or a conversion source is one of these exceptions, with a
one-line message that names the file and the problem; the CLI prints it and exits with code 2.
"""

from __future__ import annotations

from pathlib import Path


class ArtifactError(Exception):
    """Base class: a `.ninfer` file (or conversion source) cannot be used as asked."""

    code = "artifact_error"

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class BadMagicError(ArtifactError):
    code = "bad_magic"


class UnsupportedVersionError(ArtifactError):
    code = "unsupported_version"


class TruncatedError(ArtifactError):
    code = "truncated"


class CorruptHeaderError(ArtifactError):
    code = "corrupt_header"


class TensorRangeError(ArtifactError):
    code = "tensor_out_of_range"


class ChecksumError(ArtifactError):
    code = "checksum_mismatch"


class MissingTensorError(ArtifactError):
    code = "missing_tensor"


class ShapeMismatchError(ArtifactError):
    code = "shape_mismatch"


class UnknownWeightFormatError(ArtifactError):
    code = "unknown_weight_format"


class MissingComponentError(ArtifactError):
    code = "missing_component"


class ConversionError(ArtifactError):
    """The Hugging Face source cannot be converted (unsupported architecture, missing tensor...)."""

    code = "conversion_error"
